"""tiny_train is the job every lifecycle test runs: its resume contract must hold exactly."""

import json
import os
import subprocess
import sys
from pathlib import Path

TRAIN = Path(__file__).resolve().parents[2] / "examples" / "tiny_train" / "train.py"


def run(tmp: Path, *args: str, resume: str = "") -> subprocess.CompletedProcess:
    env = {**os.environ, "RGT_CKPT_DIR": str(tmp / "ckpt"), "RGT_OUT_DIR": str(tmp / "out"),
           "RGT_RESUME_FROM": resume, "RGT_PREEMPT_FILE": str(tmp / "PREEMPT")}
    return subprocess.run([sys.executable, str(TRAIN), "--steps", "50", "--ckpt-every", "10", *args],
                          env=env, capture_output=True, text=True, timeout=60)


def test_resumed_run_gives_byte_identical_weights(tmp_path):
    whole, split = tmp_path / "whole", tmp_path / "split"
    assert run(whole).returncode == 0
    env_first = run(split, "--nan-at", "-1")
    assert env_first.returncode == 0
    # interrupt: remove the final outputs and resume from a mid-run checkpoint
    (split / "out" / "weights.bin").unlink()
    resumed = run(split, resume=str(split / "ckpt" / "step_00000030.ckpt"))
    assert "resumed from" in resumed.stdout and "step=31 " in resumed.stdout
    assert (whole / "out" / "weights.bin").read_bytes() == (split / "out" / "weights.bin").read_bytes()


def test_preempt_file_checkpoints_and_exits(tmp_path):
    (tmp_path / "PREEMPT").touch()
    proc = run(tmp_path)
    assert proc.returncode == 0
    assert "preempted: checkpoint" in proc.stdout
    assert (tmp_path / "ckpt" / "step_00000001.ckpt").exists()
    assert not (tmp_path / "out" / "weights.bin").exists()


def test_nan_at_step_stops_with_nonzero_exit(tmp_path):
    proc = run(tmp_path, "--nan-at", "7")
    assert proc.returncode == 3
    assert "step=7 loss=nan" in proc.stdout



def test_a_run_resumed_from_its_last_checkpoint_finishes_with_a_finite_loss_and_the_same_weights(tmp_path):
    # a stop between the last checkpoint and the exit (a requeue on a slow cluster) resumes with nothing left
    assert run(tmp_path).returncode == 0
    weights = (tmp_path / "out" / "weights.bin").read_bytes()
    last = sorted((tmp_path / "ckpt").glob("step_*.ckpt"))[-1]
    proc = run(tmp_path, resume=str(last))
    assert "loss=nan" not in proc.stdout and "done step=50 loss=" in proc.stdout, proc.stdout
    assert (tmp_path / "out" / "weights.bin").read_bytes() == weights
    assert json.loads((tmp_path / "out" / "metrics.json").read_text())["steps"] == 50
