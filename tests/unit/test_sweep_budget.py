"""A sweep held at its budget (docs/unattended.md "Budgets and idle meters"): watch at 100% of a sweep's budget_usd
holds the sweep on each of its boxes before it stops the running cells (<sweep_dir>/.rgt/BUDGET_STOP, once per
host; pending Slurm array tasks scancelled), the box's queue then starts no cell, status shows the cells it holds
budget_stopped (stop_reason budget_held) and the tally counts them so, and only a launch with budget_resume (`rgt-run
retry` with a higher budget) lifts the hold and retries the budget_stopped cells."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import time
from types import SimpleNamespace

import pytest
from rich.console import Console
from test_sweep_queue import Sweep, command

from rgt import budget, engines, errors, paths, sshround, sweeps

rl = paths.module_util("rgt_runlayout")
rc = paths.module_util("rgt_reconcile")
slurm = paths.module_util("rgt_slurm")
ls = paths.module_util("rgt_launchsweep")
S = paths.module_util("rgt_states")


# ---------------------------------------------------------------- the box: the marker, the queue, the status

def test_the_hold_is_written_atomically_only_where_the_sweep_lives_and_a_release_removes_it(tmp_path):
    sweep_dir = str(tmp_path / "proj" / "sweeps" / "abl")
    assert rl.hold_sweep(sweep_dir, {"budget_usd": 4.0}) is False and rl.budget_held(sweep_dir) is None
    os.makedirs(sweep_dir)
    assert rl.hold_sweep(sweep_dir, {"budget_usd": 4.0, "spent_usd": 4.2}) is True
    assert rl.budget_held(sweep_dir) == {"budget_usd": 4.0, "spent_usd": 4.2}
    assert os.listdir(os.path.join(sweep_dir, ".rgt")) == ["BUDGET_STOP"]  # no temporary file left beside it
    assert rl.release_sweep(sweep_dir) is True and rl.release_sweep(sweep_dir) is False
    assert rl.budget_held(sweep_dir) is None


def test_a_held_queue_starts_nothing_and_says_which_cells_it_holds(tmp_path):
    sweep = Sweep(tmp_path, {"abl--seed=0": command(0), "abl--seed=1": command(0)}, ["0"])
    rl.hold_sweep(str(sweep.dir), {"budget_usd": 1.0, "spent_usd": 1.1})
    code, out = sweep.run_queue()
    assert code == 0, out + sweep.log()
    assert sweep.starts("abl--seed=0") == [] and sweep.starts("abl--seed=1") == []
    state = sweep.queue_state()
    assert state["ended"] and state["pending"] == [] and state["held"] == ["abl--seed=0", "abl--seed=1"]
    assert "the sweep's budget is spent" in sweep.log()


def test_a_hold_written_while_a_cell_runs_keeps_its_freed_slot_empty(tmp_path):
    sweep = Sweep(tmp_path, {"abl--seed=0": command(0, sleep=2), "abl--seed=1": command(0, sleep=0)}, ["0"])
    proc = subprocess.Popen([sys.executable, str(sweep.meta / "queue.py"), str(sweep.dir)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.time() + 30
        while not sweep.starts("abl--seed=0") and time.time() < deadline:
            time.sleep(0.05)
        assert sweep.starts("abl--seed=0"), sweep.log()
        rl.hold_sweep(str(sweep.dir), {"budget_usd": 1.0})
        assert proc.wait(timeout=60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
    assert sweep.state("abl--seed=0") == "finished" and sweep.starts("abl--seed=1") == []
    assert sweep.queue_state()["held"] == ["abl--seed=1"]


def test_sweep_queue_carries_the_hold_and_status_shows_held_cells_budget_stopped(tmp_path):
    cell = rl.RunPaths(str(tmp_path), "proj", "abl--seed=1")
    os.makedirs(cell.meta)
    sweep_dir = cell.sweep_dir("abl")
    os.makedirs(os.path.join(sweep_dir, ".rgt"))
    rl.atomic_write_json(os.path.join(cell.meta, "sweep.json"), {"sweep": "abl", "sweep_dir": sweep_dir})
    assert rl.sweep_queue(cell)["held"] is None
    rl.hold_sweep(sweep_dir, {"budget_usd": 4.0, "spent_usd": 4.5})
    queue = rl.sweep_queue(cell)
    assert queue["held"] == {"budget_usd": 4.0, "spent_usd": 4.5}
    for state in ("not_started", "preempted", "dead"):
        doc = rc.with_budget_hold({"state": state, "run_id": cell.run_id}, queue)
        assert doc["state"] == "budget_stopped" and doc["stop_reason"] == "budget_held"
        assert "$4.50 of $4.00" in doc["queue_reason"] and "`rgt-run retry abl`" in doc["queue_reason"]
    for state in ("running", "finished", "failed", "queued", "budget_stopped"):  # what runs or ended stays so
        assert rc.with_budget_hold({"state": state}, queue) == {"state": state}
    assert rc.with_budget_hold({"state": "not_started"}, {**queue, "held": None}) == {"state": "not_started"}


def test_the_tally_counts_held_and_stopped_cells_budget_stopped_and_names_them():
    roster = {"sweep": "abl", "cells": [{"id": f"abl--seed={i}", "host": "box"} for i in range(3)]}
    runs = [{"host": "box", "run_id": "abl--seed=0", "state": "finished"},
            {"host": "box", "run_id": "abl--seed=1", "state": "budget_stopped"},
            {"host": "box", "run_id": "abl--seed=2", "state": "budget_stopped", "stop_reason": "budget_held"}]
    t = sweeps.tally(roster, runs)
    assert t["counts"] == {"finished": 1, "budget_stopped": 2}
    assert sweeps.tally_line(t) == "sweep abl: 1/3 finished, 2 budget_stopped (abl--seed=1, abl--seed=2)"
    assert S.cell_state("budget_stopped") == "budget_stopped" and "budget_stopped" in S.CELL_BAD


# ---------------------------------------------------------------- Slurm: the pending array tasks

def test_a_hold_scancels_the_pending_array_tasks_only(tmp_path):
    metas = []
    for i, job_id in enumerate(["70_0", "70_1", "70_2", None]):
        meta = tmp_path / f"c{i}"
        meta.mkdir()
        if job_id:
            (meta / slurm.RECORD).write_text(json.dumps({"job_id": job_id}))
        metas.append(str(meta))
    states = {"70_0": "RUNNING", "70_1": "PENDING", "70_2": "COMPLETED"}
    calls = []

    def run(argv, timeout=None, env=None):
        calls.append(argv)
        if argv[0] == "scontrol":
            return 0, "JobId=%s JobName=abl JobState=%s Reason=None" % (argv[-1], states[argv[-1]]), ""
        return 0, "", ""

    assert slurm.cancel_pending(metas, run=run) == {"cancelled": ["70_1"], "errors": []}
    assert [a for a in calls if a[0] == "scancel"] == [["scancel", "70_1"]]

    def down(argv, timeout=None, env=None):
        return 1, "", "slurm_load_jobs error: Unable to contact slurm controller"

    out = slurm.cancel_pending(metas[:1], run=down)
    assert out["cancelled"] == [] and out["errors"][0].startswith("70_0: ")


# ---------------------------------------------------------------- the launch: held, or resumed

class Module:
    def __init__(self, sweep, check_mode=False):
        self.params = {"sweep": sweep}
        self.check_mode = check_mode


def _views(tmp_path, states):
    share = SimpleNamespace(dir=str(tmp_path / "sweeps" / "abl"), retry=set())
    os.makedirs(share.dir)
    views = [({"id": f"abl--seed={i}"}, None, st, 1 if st != "never" else 0) for i, st in enumerate(states)]
    return share, views


def test_a_held_launch_starts_no_cell_and_a_budget_resume_lifts_the_hold_and_retries_the_stopped(tmp_path):
    share, views = _views(tmp_path, ["finished", "budget_stopped", "never", "failed"])
    rl.hold_sweep(share.dir, {"budget_usd": 4.0})
    result = {}
    assert ls.budget_hold(Module({"name": "abl"}), share, views, result) == []
    assert result["budget_held"] == {"budget_usd": 4.0} and rl.budget_held(share.dir) is not None
    result = {}
    started = ls.budget_hold(Module({"name": "abl", "budget_resume": True}, check_mode=True), share, views, result)
    assert rl.budget_held(share.dir) is not None  # check mode writes nothing
    result = {}
    started = ls.budget_hold(Module({"name": "abl", "budget_resume": True}), share, views, result)
    assert result == {"budget_released": True} and rl.budget_held(share.dir) is None
    assert [c["id"] for c, _p, _s, _a in started] == ["abl--seed=1", "abl--seed=2"]  # never a failed one


# ---------------------------------------------------------------- the watcher

def cell(run_id, host, state="running", elapsed=25.0):
    return {"host": host, "run_id": run_id, "state": state, "attempt": 1, "elapsed_s": elapsed,
            "price_per_hour": 360.0, "budget_usd": 4.0, "sweep": "abl"}


@pytest.fixture
def rounds(monkeypatch):
    """The status round the watcher calls (op budget_hold, budget_stop), recorded; each answers as a box would."""
    sent = []

    def run_cached(target, data):
        request = json.loads(data)
        sent.append(request)
        answer = {"budget_hold": {"held": True, "cancelled": [], "errors": []},
                  "budget_stop": {"stopped": True}}[request["op"]]
        return SimpleNamespace(rc=0, stdout=(json.dumps(answer) + "\n").encode(), stderr=b"")

    monkeypatch.setattr(sshround, "can_round", lambda *a: True)
    monkeypatch.setattr(sshround, "status_params", lambda host: {"durable_root": "/d", "project": "proj"})
    monkeypatch.setattr(sshround, "target_for", lambda *a: None)
    monkeypatch.setattr(sshround, "run_cached", run_cached)
    monkeypatch.setattr(engines, "engine_of", lambda profile: SimpleNamespace(over_ssh=True))
    return sent


def watcher(ledger, hosts):
    out = io.StringIO()
    w = budget.Watcher(SimpleNamespace(inventory="inv", runs_dir=None), Console(file=out, width=300), ledger,
                       [SimpleNamespace(name=n, vars={}, profile={}) for n in hosts], {}, None)
    return w, out


def test_at_100_percent_each_host_of_the_sweep_is_held_once_before_its_running_cells_are_stopped(tmp_path, rounds):
    w, out = watcher(tmp_path, ["a", "b"])
    latest = {"a": {**cell("abl--seed=0", "a"), "other_runs": [cell("abl--seed=2", "a", state="queued", elapsed=0.0)]},
              "b": cell("abl--seed=1", "b", elapsed=10.0)}  # $2.50 + $1.00 of $4: 87.5%
    w.tick(latest)
    assert rounds == []
    latest["b"] = cell("abl--seed=1", "b", elapsed=16.0)  # $4.10: 102.5%
    w.tick(latest)
    ops = [(r["op"], r.get("sweep") or r.get("run_id")) for r in rounds]
    assert ops == [("budget_hold", "abl"), ("budget_hold", "abl"), ("budget_stop", "abl--seed=0"),
                   ("budget_stop", "abl--seed=1")]
    hold = rounds[0]
    assert hold["cells"] == ["abl--seed=0", "abl--seed=2"] and hold["marker"]["scope"] == "sweep"
    assert hold["marker"]["budget_usd"] == 4.0 and hold["marker"]["spent_usd"] >= 4.0
    w.tick(latest)  # once per host and run: nothing sent again, also by a watch started again
    watcher(tmp_path, ["a", "b"])[0].tick(latest)
    assert len(rounds) == 4
    assert "budget: held sweep a:abl: its queue starts no more cells" in out.getvalue()
    assert budget.stopped(tmp_path, "abl")
    with pytest.raises(errors.GateRefused):
        budget.check_retry(tmp_path, "", "abl", {"budget_usd": 4.0}, "abl")
    budget.check_retry(tmp_path, "", "abl", {"budget_usd": 8.0}, "abl")


def test_a_hold_the_box_refuses_is_tried_again_next_tick(tmp_path, rounds, monkeypatch):
    w, out = watcher(tmp_path, ["a"])
    answers = iter([{"failed": True, "msg": "run id: bad"}, {"held": True}])
    real = sshround.run_cached

    def flaky(target, data):
        if json.loads(data)["op"] == "budget_hold":
            rounds.append(json.loads(data))
            return SimpleNamespace(rc=1, stdout=(json.dumps(next(answers)) + "\n").encode(), stderr=b"")
        return real(target, data)

    monkeypatch.setattr(sshround, "run_cached", flaky)
    latest = {"a": cell("abl--seed=0", "a", elapsed=50.0)}
    w.tick(latest)
    w.tick(latest)
    assert [r["op"] for r in rounds].count("budget_hold") == 2
    assert "could not hold sweep a:abl (run id: bad); trying again next tick" in out.getvalue()
