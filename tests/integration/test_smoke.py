"""Cheap checks before paid ones: the smoke command runs on the controller's CPU before anything is uploaded."""

import json

from clihelp import write_inventory

LOCAL = {"ansible_connection": "local", "rgt_profile": "local", "rgt_instance_id": "localhost"}


def job(tmp_path, smoke):
    return {"rgt_job": {"name": "smk", "code_dir": "examples/tiny_train", "smoke_command": smoke,
                        "python": "/usr/bin/python3", "command": "python train.py",
                        "env": {"SMOKE_MARK": str(tmp_path / "ran")}}}


def test_smoke_passes_without_an_inventory(rgt, tmp_path):
    spec = job(tmp_path, 'python train.py --steps 2 --ckpt-every 1 && test -z "$CUDA_VISIBLE_DEVICES" '
                         "&& touch $SMOKE_MARK")
    result = rgt("smoke", "-e", json.dumps(spec), "--json")
    assert result.rc == 0, result.stderr
    assert (tmp_path / "ran").exists()


def test_failing_smoke_exits_1_and_train_stops_before_touching_the_box(rgt, tmp_path):
    spec = job(tmp_path, "python train.py --steps 3 --nan-at 2")
    smoke = rgt("smoke", "-e", json.dumps(spec), "--json")
    assert smoke.rc == 1 and "smoke run failed" in smoke.stderr
    inv = write_inventory(tmp_path / "inv", {"box": {**LOCAL, "rgt_durable_root": str(tmp_path / "durable")}})
    train = rgt("playbooks/train.yml", "-i", inv, "-e", json.dumps(spec), "--json")
    assert train.rc == 1
    assert not (rgt.ledger / "probe" / "box.json").exists(), "no phase may run after a failed smoke"
    assert not (tmp_path / "durable").exists()
