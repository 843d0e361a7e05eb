"""`offload: {to: controller}` through `rgt-run watch` on the local profile (the box is this machine, the same
rsync and status round as a box): while examples/tiny_train runs, watch copies its newest complete checkpoint into
runs/<run>/<host>.offload/, each verified against the box's manifest, `keep` honoured; when the job ends, watch
pulls the sealed export (a normal verified pull: PULL_VERIFIED); status shows the newest verified copy."""

import hashlib
import json
import os
import sys
from pathlib import Path

import pytest
import yaml
from clihelp import read_json
from test_budget_local import project  # noqa: F401 - the local-profile fixture (inventory, tmux, cleanup)

pytestmark = [pytest.mark.slow]


def test_watch_offloads_to_the_controller_during_the_run_and_pulls_the_export_at_the_end(rgt, project):  # noqa: F811
    root, run_dir, env = project["root"], project["run_dir"], project["env"]
    (root / "job.yml").write_text(yaml.safe_dump({"rgt_job": {
        "name": "capped", "python": sys.executable, "code_dir": "code",
        "command": "python train.py --steps 160 --ckpt-every 10 --sleep 0.1",
        "checkpoint": {"glob": "step_*.ckpt"}, "disk_floor_gib": 0.01,
        "offload": {"to": "controller", "every": 5, "keep": 2}}}))
    train = rgt("train", "-i", "inv", "-e", "@job.yml", env=env, cwd=root, timeout=300)
    assert train.rc == 0, train.stderr[-3000:]
    watch = rgt("watch", "-i", "inv", "-e", "@job.yml", "--interval", "1", "--max-ticks", "120", "--json", env=env,
                cwd=root, timeout=400)
    assert watch.rc == 0 and watch.doc["hosts"]["box"]["state"] == "finished", watch.stderr[-3000:]
    runs = Path(os.environ["RGT_RUNS_DIR"]) / "capped"
    folder = runs / "box.offload"
    records = [json.loads(line) for line in (folder / "offload.jsonl").read_text().splitlines()]
    copies = [r for r in records if r["kind"] == "checkpoint" and r["ok"] and r["verified"]]
    ended = (run_dir / ".rgt" / "exit.json").stat().st_mtime
    assert len(copies) >= 2, records
    assert all(r["ts_epoch"] < ended for r in copies[:2]), "copies made while the job ran"
    steps = [r["step"] for r in copies]
    assert steps == sorted(steps) and len(set(steps)) == len(steps), steps
    kept = sorted(p.name for p in (folder / "checkpoints").iterdir())
    assert kept == sorted(r["name"] for r in copies[-2:]), (kept, records)
    for name in kept:  # the bytes the box wrote, and the manifest made there
        sha, rel = (folder / "checkpoints" / name / "MANIFEST.sha256").read_text().split()
        assert rel == name
        assert hashlib.sha256((folder / "checkpoints" / name / name).read_bytes()).hexdigest() == sha
    assert "pulling its sealed export" in watch.stderr
    assert read_json(runs / "box.PULL_VERIFIED.json"), "the export is home, verified"
    assert (runs / "box").is_dir()
    status = rgt("status", "-i", "inv", "-e", "@job.yml", "--json", env=env, cwd=root, timeout=120)
    shown = status.doc["hosts"]["box"]["offload"]
    assert shown["to"] == "controller" and shown["newest"]["step"] == copies[-1]["step"], shown
    assert "offload: step" in status.stderr + status.stdout
