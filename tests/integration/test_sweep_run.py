"""A sweep end to end on two stub boxes with two GPUs each: 8 cells of tiny_train through each box's queue (two at
once per box, CUDA_VISIBLE_DEVICES per slot), one box preempted mid-cell and its cells resumed by watch to
byte-identical weights, one cell failing and reported (never retried blindly) until `rgt-run retry` names it, the
teardown gate refusing while a cell is unpulled, and a pull that verifies all 8."""

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from clihelp import wait_for
from conftest import STUB_LAYOUTS, stub_inventory

pytestmark = [pytest.mark.stubs, pytest.mark.slow]
REPO = Path(__file__).resolve().parents[2]
TRAIN = REPO / "examples" / "tiny_train" / "train.py"
STEPS = 160
SEEDS, LRS = (1, 2, 3, 4), ("0.05", "0.02")
FAILING = "swp--seed=4--lr=0.02"
FLAG = "/tmp/rgt-sweep-fail-4-0.02"  # on both boxes: the cell fails wherever it runs while the flag is there


def job():
    return {"name": "swp", "python": "/usr/bin/python3", "code_dir": str(REPO / "examples" / "tiny_train"),
            "command": f'test ! -e "$FAIL_FLAG" || {{ echo "failing on purpose"; exit 1; }}; '
                       f"python3 train.py --steps {STEPS} --ckpt-every 10 --sleep 0.05",
            "checkpoint": {"glob": "step_*.ckpt"}, "outputs": ["weights.bin", "metrics.json"],
            "log_patterns": {"step": r"step=(\d+)"}, "auto_resume": True, "stall_after_s": 120,
            "disk_floor_gib": 0.01, "gpu": {"count": 2},
            "sweep": {"matrix": {"seed": list(SEEDS), "lr": list(LRS)}, "args": "--seed {seed} --lr {lr}",
                      "env": {"FAIL_FLAG": "/tmp/rgt-sweep-fail-{seed}-{lr}"}, "gpus_per_cell": 1}}


def root(name):
    return STUB_LAYOUTS[name]["mounts"][0]["path"] + "/rgt"


def box(stub, cmd) -> str:
    return stub.exec(["bash", "-c", cmd], check=False).stdout


def reference_weights(tmp_path, seed, lr) -> str:
    """sha256 of weights.bin from an uninterrupted local run of the same cell."""
    out = tmp_path / f"ref-{seed}-{lr}"
    env = {**os.environ, "RGT_CKPT_DIR": str(out / "ckpt"), "RGT_OUT_DIR": str(out / "out"), "RGT_RESUME_FROM": ""}
    subprocess.run([sys.executable, str(TRAIN), "--steps", str(STEPS), "--ckpt-every", "10", "--seed", str(seed),
                    "--lr", lr], env=env, check=True, capture_output=True, timeout=120)
    return hashlib.sha256((out / "out" / "weights.bin").read_bytes()).hexdigest()


@pytest.fixture
def boxes(stub_fleet):
    stubs = {name: stub_fleet["stubs"][name] for name in ("adl", "rp")}
    for stub in stubs.values():
        box(stub, f"touch {FLAG}")
    yield stubs
    for stub in stubs.values():
        box(stub, f"rm -f {FLAG}; pkill -f '[r]gt/sweeps/swp' ; pkill -f '[r]gt/active/swp--' ; true")


def test_sweep_of_8_cells_on_2_boxes_queues_resumes_reports_and_pulls_verified(rgt, stub_fleet, boxes, tmp_path):
    spec = job()
    given = ["-e", json.dumps({"rgt_job": spec, "rgt_skip_smoke": True})]
    inv = stub_inventory(stub_fleet, ["adl", "rp"])
    trained = rgt("train", "-i", inv, *given, "--json", timeout=600)
    assert trained.rc == 0, trained.stderr
    roster = json.loads((rgt.ledger / "sweeps" / "rgt" / "swp.json").read_text())
    placed = {c["id"]: c["host"] for c in roster["cells"]}
    assert len(placed) == 8 and sorted(roster["hosts"]) == ["adl", "rp"]
    assert {h: len(ids) for h, ids in roster["hosts"].items()} == {"adl": 4, "rp": 4}

    # each box runs two cells at once, each on its own GPU, the others queued
    rp_cells = roster["hosts"]["rp"]
    first = rp_cells[0]
    wait_for(lambda: "step=20" in box(boxes["rp"], f"cat {root('rp')}/active/{first}/logs/job.log"),
             timeout=120, what=f"{first} at step 20", interval=0.5)
    seen = rgt("status", "-i", inv, *given, "--json", timeout=240)
    runs = [r for doc in seen.doc["hosts"].values() for r in (doc, *(doc.get("other_runs") or []))]
    states = {r["run_id"]: r["state"] for r in runs}
    assert set(states) == set(placed), states
    for host in ("adl", "rp"):
        mine = [states[c] for c in roster["hosts"][host]]
        assert mine.count("running") <= 2 and "queued" in mine, (host, mine)
    devices = {box(boxes["rp"], f"cat {root('rp')}/active/{c}/.rgt/slot.json").strip() for c in rp_cells[:2]}
    assert {json.loads(d)["devices"] for d in devices if d} == {"0", "1"}

    # the rp box is preempted mid-cell (5 s grace); watch resumes its cells through the queue. Which cells the
    # preemption catches depends on how far the box got meanwhile (the status round above takes its time on a loaded
    # machine): they are found afterwards from their attempt records.
    boxes["rp"].preempt(grace_s=5)
    boxes["rp"].start()
    inv = stub_inventory(stub_fleet, ["adl", "rp"])  # the port can change on restart, as on RunPod
    # no -e from here on (but where a test says so): the ledger remembers the sweep's cells on each box
    watch = rgt("watch", "-i", inv, "--interval", "3", "--max-ticks", "120", "--json", timeout=900)
    assert "relaunch" in watch.stderr.lower(), watch.stderr
    assert watch.rc == 1, watch.stderr  # settled: 7 finished, the failing cell failed
    (tally,) = watch.doc["sweeps"]
    assert tally["counts"] == {"finished": 7, "failed": 1}, tally
    assert f"7/8 finished, 1 failed ({FAILING})" in watch.stderr
    # the one-glance line: the sweep's tally with why the cell failed, then the preemptions and compute lost
    assert watch.doc["summary"].startswith(f"sweep swp: 7/8 finished, 1 failed ({FAILING}: exit 1"), watch.doc
    assert "2 preemptions" in watch.doc["summary"] or "1 preemption" in watch.doc["summary"], watch.doc["summary"]
    caught = [c for c in rp_cells if '"reason": "preempted"'
              in box(boxes["rp"], f"cat {root('rp')}/active/{c}/.rgt/attempts.jsonl")]
    assert caught, "the preemption caught a cell mid-run"
    victim = caught[0]
    seed, lr = victim.split("--seed=")[1].split("--lr=")
    weights = box(boxes["rp"], f"sha256sum {root('rp')}/active/{victim}/out/weights.bin").split()[0]
    assert weights == reference_weights(tmp_path, int(seed), lr), "the resumed cell ends byte-identical"
    failing_box = boxes[placed[FAILING]]
    log = box(failing_box, f"cat {root(placed[FAILING])}/active/{FAILING}/logs/job.log")
    assert "failing on purpose" in log
    assert box(failing_box, f"grep -c started_at {root(placed[FAILING])}/active/{FAILING}/.rgt/attempts.jsonl"
               ).strip() == "1", "a failed cell is never retried blindly"

    # finished cells not pulled yet: the gate refuses each box's teardown (-e given: it narrows nothing here)
    look = rgt("teardown", "-i", inv, *given, "--json", timeout=300)
    assert look.rc == 3, look.stderr
    reasons = " ".join(r for item in look.doc["instances"].values() for r in item.get("reasons") or [])
    assert "swp--seed=1--lr=0.05" in reasons and "not sealed" in reasons, reasons

    # the user's word for the failed cell: it runs once more and finishes
    box(failing_box, f"rm -f {FLAG}")
    retried = rgt("retry", "-i", inv, FAILING, "--json", timeout=300)  # the README's form: no -e
    assert retried.rc == 0, retried.stderr
    assert retried.doc["state"] in ("queued", "running")
    done = rgt("watch", "-i", inv, *given, "--interval", "2", "--max-ticks", "60", "--json", timeout=600)
    assert done.rc == 0, done.stderr
    assert done.doc["sweeps"][0]["done"] is True

    pulled = rgt("pull", "-i", inv, "--runs-dir", str(tmp_path / "runs"), "--json", timeout=900)
    assert pulled.rc == 0, pulled.stderr
    cells = {cell: doc for host in pulled.doc["hosts"].values() for cell, doc in host["cells"].items()}
    assert set(cells) == set(placed) and all(doc["verified"] for doc in cells.values())
    for cell, host in placed.items():
        assert (tmp_path / "runs" / cell / f"{host}.PULL_VERIFIED.json").is_file(), cell
        assert "== rgt attempt 1 started" in (tmp_path / "runs" / cell / host / "logs" / "job.log").read_text(), cell
    resumed_log = (tmp_path / "runs" / victim / "rp" / "logs" / "job.log").read_text()
    assert "== rgt attempt 2 started" in resumed_log, "the preempted cell's pulled log holds both attempts"
    for host in ("adl", "rp"):  # one record per box from its roster: every cell verified, each manifest's SHA-256
        record = json.loads((tmp_path / "runs" / "swp" / f"{host}.SWEEP_VERIFIED.json").read_text())
        assert sorted(record["cells"]) == sorted(roster["hosts"][host])
        assert all(len(c["manifest_sha256"]) == 64 for c in record["cells"].values())

    # every cell verified: no cell holds the gate any more (the boxes are shared with other tests' runs, which may)
    look = rgt("teardown", "-i", inv, *given, "--runs-dir", str(tmp_path / "runs"), "--json", timeout=300)
    rows = [row for item in look.doc["instances"].values() for row in item["gate"]["runs"]
            if row["run_id"].startswith("swp--")]
    assert sorted(row["run_id"] for row in rows) == sorted(placed), look.stderr
    assert all(row["pull"] == "verified" and not row["blocks"] for row in rows), look.stderr
