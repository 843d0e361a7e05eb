"""A sweep's budget through `rgt-run`, on a stub box of the runpod profile with one slot: 3 cells of tiny_train
queued one at a time, priced by RunPod's own control plane (a fake on 127.0.0.1 that bills the pod $360/h where the
job configures $36/h, so only the platform's price spends the $2 budget within the watch). At 100% watch holds the
sweep on the box (<sweep_dir>/.rgt/BUDGET_STOP) before it stops the running cell, so the queue starts no cell into
the freed slot: the running cell ends budget_stopped with a checkpoint, the two it never started show
budget_stopped (stop_reason budget_held) in status --json and the tally. `rgt-run retry SWEEP` with the same budget
is refused (exit 3); with a higher one the hold is lifted and the stopped cell resumes from its checkpoint.

No step races a run to its end: a cell runs 3000 steps of 50 ms (150 s and more) and the budget is spent after 20 s
of it."""

import json
from pathlib import Path

import pytest
from clihelp import wait_for
from conftest import STUB_LAYOUTS, stub_inventory

from tests.fakes import control_planes as fk

pytestmark = [pytest.mark.stubs, pytest.mark.slow]
REPO = Path(__file__).resolve().parents[2]
ROOT = STUB_LAYOUTS["rp"]["mounts"][0]["path"] + "/rgt"
SWEEP = "bsw"
CELLS = [f"{SWEEP}--seed={s}" for s in (1, 2, 3)]


def job(budget: float, notes: Path) -> dict:
    return {"name": SWEEP, "python": "/usr/bin/python3", "code_dir": str(REPO / "examples" / "tiny_train"),
            "command": "python3 train.py --steps 3000 --ckpt-every 10 --sleep 0.05",
            "checkpoint": {"glob": "step_*.ckpt"}, "price_per_hour": 36.0, "budget_usd": budget,
            "disk_floor_gib": 0.01, "stall_after_s": 300, "gpu": {"count": 1},
            "sweep": {"matrix": {"seed": [1, 2, 3]}, "args": "--seed {seed}", "gpus_per_cell": 1},
            "notify": [{"command": f"cat >> {notes}; echo >> {notes}", "on": ["budget"]}]}


def box(stub, cmd) -> str:
    return stub.exec(["bash", "-c", cmd], check=False).stdout


@pytest.fixture
def rp(stub_fleet):
    stub = stub_fleet["stubs"]["rp"]
    box(stub, f"rm -rf {ROOT}/sweeps/{SWEEP} {ROOT}/active/{SWEEP}--*")
    yield stub
    box(stub, f"pkill -f '[r]gt/sweeps/{SWEEP}' ; pkill -f '[r]gt/active/{SWEEP}--' ; true")


@pytest.fixture
def runpod():
    """RunPod's control plane: the stub's pod bills $360/h (the job says $36/h)."""
    plane = fk.RunPodV2().start()
    plane.add_pod(STUB_LAYOUTS["rp"]["instance_id"], cost=360.0)
    yield {"RUNPOD_API_KEY": "test-token", "RUNPOD_API_URL": plane.url}
    plane.stop()


def test_a_sweep_over_budget_is_held_its_queue_starts_nothing_and_a_higher_budget_resumes_it(
        rgt, stub_fleet, rp, runpod, tmp_path):
    notes = tmp_path / "notes.jsonl"
    inv = stub_inventory(stub_fleet, ["rp"])

    def given(budget):
        return ["-e", json.dumps({"rgt_job": job(budget, notes), "rgt_skip_smoke": True})]

    trained = rgt("train", "-i", inv, *given(2), "--json", env=runpod, timeout=600)
    assert trained.rc == 0, trained.stderr[-3000:]
    early = rgt("retry", "-i", inv, *given(2), SWEEP, "--json", env=runpod, timeout=300)
    assert early.rc == 2 and "sweep bsw was not stopped at its budget" in early.stderr, early.stderr[-2000:]

    watch = rgt("watch", "-i", inv, *given(2), "--interval", "1", "--max-ticks", "150", "--json", env=runpod,
                timeout=900)
    doc = watch.doc["hosts"]["rp"]
    runs = {r["run_id"]: r for r in (doc, *(doc.get("other_runs") or [])) if r["run_id"] in CELLS}
    assert watch.rc == 1 and {r["state"] for r in runs.values()} == {"budget_stopped"}, watch.stderr[-4000:]
    assert "held sweep rp:bsw: its queue starts no more cells" in watch.stderr
    first = CELLS[0]
    assert "stop_reason" not in runs[first] and runs[first]["budget"]["source"] == "platform"
    assert runs[first]["budget"]["spent_usd"] >= 2.0 and runs[first]["budget"]["scope"] == "sweep"
    for cell in CELLS[1:]:  # never started: held by the sweep's budget, not queued nor not_started
        assert runs[cell]["stop_reason"] == "budget_held" and runs[cell]["attempt"] is None, runs[cell]
        assert "`rgt-run retry bsw`" in runs[cell]["queue_reason"]
        assert "started_at" not in box(rp, f"cat {ROOT}/active/{cell}/.rgt/attempts.jsonl 2>/dev/null")
    exit_doc = json.loads(box(rp, f"cat {ROOT}/active/{first}/.rgt/exit.json"))
    assert exit_doc["reason"] == "budget_stopped", exit_doc
    assert json.loads(box(rp, f"cat {ROOT}/sweeps/{SWEEP}/.rgt/BUDGET_STOP"))["budget_usd"] == 2.0
    assert box(rp, f"ls {ROOT}/active/{first}/ckpt").strip(), "the stopped cell left a checkpoint"
    said = [json.loads(line) for line in notes.read_text().splitlines() if line.strip()]
    assert [m["event"].rsplit(":", 1)[1] for m in said] == ["50", "80", "100"]
    assert all("platform price" in json.dumps(m) for m in said), said

    status = rgt("status", "-i", inv, *given(2), "--json", env=runpod, timeout=300)
    (tally,) = [t for t in status.doc["sweeps"] if t["sweep"] == SWEEP]
    assert tally["counts"] == {"budget_stopped": 3}, tally

    refused = rgt("retry", "-i", inv, *given(2), SWEEP, "--json", env=runpod, timeout=300)
    assert refused.rc == 3 and "retry it with a higher budget" in refused.stderr + refused.stdout, refused.stderr
    retried = rgt("retry", "-i", inv, *given(100), SWEEP, "--json", env=runpod, timeout=600)
    assert retried.rc == 0, retried.stderr[-3000:]
    assert box(rp, f"ls {ROOT}/sweeps/{SWEEP}/.rgt/").split().count("BUDGET_STOP") == 0
    states = {c["run_id"]: c["state"] for c in retried.doc["cells"]}
    assert states[first] == "running" and set(states.values()) <= {"running", "queued"}, states
    starts = [json.loads(ln) for ln in box(rp, f"cat {ROOT}/active/{first}/.rgt/attempts.jsonl").splitlines()
              if "started_at" in ln]
    assert len(starts) == 2 and starts[1]["resume_from"].startswith(f"{ROOT}/active/{first}/ckpt/step_")
    wait_for(lambda: "resumed from" in box(rp, f"cat {ROOT}/active/{first}/logs/job.log"), 60,
             what="the stopped cell to resume", interval=1)
