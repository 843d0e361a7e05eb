"""The whole lifecycle on a stub, in one command: train.yml -> watch -> pull -> a confirmed teardown against a
fake RunPod. This is what `scripts/demo` runs on the local profile, here over pinned SSH and a control plane."""

import json
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from conftest import STUB_LAYOUTS, stub_inventory

from tests.fakes.control_planes import RunPodV2

pytestmark = [pytest.mark.stubs, pytest.mark.slow]
REPO = Path(__file__).resolve().parents[2]
TOKEN = "rp-lifecycle-token"
INSTANCE = STUB_LAYOUTS["rp"]["instance_id"]


def test_whole_lifecycle_from_train_to_confirmed_teardown(stub_fleet, tmp_path):
    fake = RunPodV2(token=TOKEN).start()
    fake.add_pod(INSTANCE)
    project = "life-" + uuid.uuid4().hex[:6]
    job = {"name": "life", "python": "/usr/bin/python3", "code_dir": str(REPO / "examples" / "tiny_train"),
           "command": "python3 train.py --steps 60 --ckpt-every 10 --sleep 0.05",
           "smoke_command": "python train.py --steps 2 --ckpt-every 1",
           "checkpoint": {"glob": "step_*.ckpt", "declared": ["step_00000060.ckpt"]},
           "outputs": ["weights.bin", "metrics.json"], "auto_resume": True, "disk_floor_gib": 0.05}
    inv = stub_inventory(stub_fleet, ["rp"])
    runs = tmp_path / "runs"
    env = {"PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin", "HOME": str(Path.home()),
           "RUNPOD_API_URL": fake.url, "RUNPOD_API_KEY": TOKEN, "RGT_LEDGER": str(tmp_path / "ledger")}
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "rgt.cli", "lifecycle", "-i", str(inv),
             # its own durable root: the teardown gate looks at every run under it, and other tests leave
             # sealed runs of their own in the shared stub's /workspace
             "-e", json.dumps({"rgt_job": job, "rgt_project": project, "rgt_durable_root": f"/workspace/{project}",
                               "teardown_poll_interval_s": 1}),
             "--interval", "2", "--runs-dir", str(runs), "--confirm", INSTANCE, "--json"],
            capture_output=True, text=True, env=env, cwd=REPO, timeout=900, stdin=subprocess.DEVNULL)
    finally:
        fake.stop()
    assert proc.returncode == 0, proc.stderr[-4000:]
    doc = json.loads(proc.stdout)
    assert [p["phase"] for p in doc["phases"]] == ["train", "watch", "pull", "teardown"]
    assert all(p["exit_code"] == 0 for p in doc["phases"])
    verified = json.loads((runs / "life" / "rp.PULL_VERIFIED.json").read_text())
    assert verified["run_id"] == "life" and verified["files"] >= 3
    assert (runs / "life" / "rp" / "out" / "weights.bin").exists()
    terminate = [c for c in fake.calls() if c["method"] != "GET"]
    assert len(terminate) == 1, terminate
    record = json.loads((tmp_path / "ledger" / "teardown" / "rp.json").read_text())
    assert record["final_state"] == "gone"
