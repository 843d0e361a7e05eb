"""`rgt-run move` of a sweep cell on two stub boxes (docs/move.md "A sweep cell"): a sweep of two cells runs on one
box, each cell offloading checkpoints to a real S3 server on the controller (`rclone serve s3`, tests/fakes/s3.py);
the box freezes mid-run (`podman pause`); `move` takes one cell to the second box, where it resumes from its newest
verified copy as attempt 2 (the numbering goes on across boxes) and finishes with the weights of an uninterrupted
run; the roster places the cell on the new box; the old box comes back with both cells' attempts alive: watch stops
the moved cell's stale attempt there (only it), the old box's queue never starts it again, and the other cell
finishes where it was. logs says where the cell came from. One run, several assertions."""

import hashlib
import json
import os
import subprocess
import sys
import time

import pytest
from clihelp import wait_for
from conftest import stub_inventory
from test_move import NEW_RUNS
from test_offload import _gateway, _records
from test_run_spine import RUNS, TRAIN, box, job, wrappers

from tests.fakes.s3 import S3Server, rclone_binary
from tests.harness import stubhost as sh

pytestmark = [pytest.mark.stubs, pytest.mark.slow]
STEPS = 400  # the other cell (and so the old box's queue) must outlive the ~15 s from the box's return to the fence
QUEUE_SPEC = "/workspace/rgt/sweeps/mc/.rgt/queue.json"
MOVED, STAYS = "mc--seed=1", "mc--seed=2"


def reference_weights(tmp_path, seed) -> str:
    """sha256 of weights.bin from an uninterrupted local run of the cell."""
    out = tmp_path / f"ref-{seed}"
    env = {**os.environ, "RGT_CKPT_DIR": str(out / "ckpt"), "RGT_OUT_DIR": str(out / "out"), "RGT_RESUME_FROM": ""}
    subprocess.run([sys.executable, str(TRAIN), "--steps", str(STEPS), "--ckpt-every", "10", "--seed", str(seed)],
                   env=env, check=True, capture_output=True, timeout=120)
    return hashlib.sha256((out / "out" / "weights.bin").read_bytes()).hexdigest()


def starts(stub, root, run_id) -> list[dict]:
    text = box(stub, f"cat {root}/{run_id}/.rgt/attempts.jsonl 2>/dev/null || true")
    return [r for r in (json.loads(line) for line in text.splitlines() if line.strip()) if "started_at" in r]


def finished(stub, root, run_id):
    text = box(stub, f"cat {root}/{run_id}/.rgt/exit.json 2>/dev/null || true").strip()
    return json.loads(text) if text and json.loads(text).get("reason") == "finished" else None


@pytest.fixture
def boxes(stub_fleet):
    rp, adl = stub_fleet["stubs"]["rp"], stub_fleet["stubs"]["adl"]
    yield rp, adl
    sh.podman("unpause", rp.container, check=False)
    for stub in (rp, adl):
        stub.exec(["bash", "-c", "pkill -f '[r]gt/sweeps/mc' ; pkill -f '[r]gt/active/' ; "
                   "tmux kill-server 2>/dev/null ; true"])


def test_a_sweep_cell_moves_to_another_box_its_attempts_go_on_and_the_old_queue_never_starts_it_again(
        rgt, stub_fleet, boxes, tmp_path):
    rp, adl = boxes
    sh.podman("cp", rclone_binary(), f"{rp.container}:/usr/local/bin/rclone")
    with S3Server(tmp_path / "s3", bind=_gateway(rp)) as s3:
        env = s3.env("s3c")
        spec = job("mc", steps=STEPS, sleep=0.1, gpu={"count": 2},
                   offload={"to": "s3c:rgt/off", "every": 5, "keep": 2, "credentials": sorted(env)},
                   sweep={"matrix": {"seed": [1, 2]}, "args": "--seed {seed}", "gpus_per_cell": 1})
        inv = stub_inventory(stub_fleet, ["rp", "adl"])
        launched = rgt("playbooks/train.yml", "-i", inv, "-l", "rp", "-e",
                       json.dumps({"rgt_job": spec, "rgt_skip_smoke": True}), "--json", env=env)
        assert launched.rc == 0, launched.stderr
        roster = json.loads((rgt.ledger / "sweeps" / "rgt" / "mc.json").read_text())
        assert {c["id"]: c["host"] for c in roster["cells"]} == {MOVED: "rp", STAYS: "rp"}

        wait_for(lambda: [r for r in _records(rp, MOVED) if r.get("kind") == "checkpoint" and r.get("verified")
                          and r["step"] >= 30], timeout=120, what="a verified offload past step 30", interval=1.0)
        seen = rgt("status", "-i", inv, "-l", "rp", "--json", timeout=240)
        assert json.loads(seen.stdout)["hosts"]["rp"]["run_id"] == MOVED, seen.stdout
        sh.podman("pause", rp.container)  # the box is gone for the controller; both cells frozen, not dead

        moved = rgt("move", "-i", inv, MOVED, "--to", "adl", "--json", env=env, timeout=600)
        assert moved.rc == 0, moved.stderr + moved.stdout
        doc = json.loads(moved.stdout)
        ckpt = doc["checkpoint"]
        assert (doc["sweep"], doc["from"], doc["to"], doc["generation"]) == ("mc", "rp", "adl", 2)
        assert doc["attempts_before"] == 1 and doc["attempt"] == 2, doc

        # the cell resumed on adl as attempt 2 from that checkpoint, and finished with an uninterrupted run's weights
        first = starts(adl, NEW_RUNS, MOVED)[0]
        assert first["attempt"] == 2 and first["resume_from"] == f"{NEW_RUNS}/{MOVED}/ckpt/{ckpt['name']}", first
        env_there = json.loads(box(adl, f"cat {NEW_RUNS}/{MOVED}/.rgt/job.json"))["env"]
        assert env_there["RGT_GENERATION"] == "2" and env_there["RGT_ATTEMPTS_BEFORE"] == "1"
        wait_for(lambda: finished(adl, NEW_RUNS, MOVED), timeout=180, what="the moved cell to finish", interval=1.0)
        assert box(adl, f"sha256sum {NEW_RUNS}/{MOVED}/out/weights.bin").split()[0] == reference_weights(tmp_path, 1)

        # the ledger: the roster places the cell on adl; the move recorded with its sweep
        roster = json.loads((rgt.ledger / "sweeps" / "rgt" / "mc.json").read_text())
        assert {c["id"]: c["host"] for c in roster["cells"]} == {MOVED: "adl", STAYS: "rp"}
        new = json.loads((rgt.ledger / "runs" / "adl.json").read_text())["runs"][f"rgt/{MOVED}"]
        assert new["moved_from"] == "rp" and new["generation"] == 2 and new["sweep"] == "mc"
        moves = [json.loads(line) for line in (rgt.ledger / "moves.jsonl").read_text().splitlines()]
        assert [(m["run_id"], m["sweep"], m["from"], m["to"]) for m in moves] == [(MOVED, "mc", "rp", "adl")]

        # logs follows the cell to adl and says where it came from
        logs = rgt("logs", "-i", inv, "-l", "adl", "--run", MOVED, timeout=240)
        assert f"adl: {MOVED} moved from rp (generation 2, attempt 2, resumed from step {ckpt['step']}" \
            in logs.stderr, logs.stderr

        # the old box comes back, both cells alive: watch stops the moved cell's attempt there, and only it
        sh.podman("unpause", rp.container)
        assert wrappers(rp, MOVED) == 1
        watched = rgt("watch", "-i", inv, "--max-ticks", "1", "--interval", "1", "--json", timeout=300)
        assert f"rp: {MOVED} moved to adl (generation 2): its stale attempt here was stopped" in watched.stderr, \
            watched.stderr
        assert json.loads(box(rp, f"cat {RUNS}/{MOVED}/.rgt/moved.json"))["moved_to"] == "adl"
        assert json.loads(box(rp, f"cat {RUNS}/{MOVED}/.rgt/exit.json"))["reason"] == "preempted"
        # a new generation of the old box's queue.json that still lists the cell (every cell may start once more):
        # the queue, still running the other cell, never starts the fenced one
        assert wrappers(rp, STAYS) == 1
        box(rp, "python3 -c 'import json, os, sys; p = sys.argv[1]; d = json.load(open(p)); d[\"generation\"] += 1; "
                "d[\"cells\"] = sys.argv[2:]; json.dump(d, open(p + \".t\", \"w\")); os.replace(p + \".t\", p)' "
                f"{QUEUE_SPEC} {MOVED} {STAYS}")
        time.sleep(5)  # several polls of the old box's queue: it never starts the fenced cell again
        assert wrappers(rp, MOVED) == 0 and len(starts(rp, RUNS, MOVED)) == 1
        wait_for(lambda: finished(rp, RUNS, STAYS), timeout=180, what="the other cell to finish", interval=1.0)
        assert len(starts(rp, RUNS, MOVED)) == 1
        assert box(rp, f"sha256sum {RUNS}/{STAYS}/out/weights.bin").split()[0] == reference_weights(tmp_path, 2)
        assert finished(adl, NEW_RUNS, MOVED)  # the moved cell itself untouched
