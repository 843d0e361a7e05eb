"""rgt.budget: the spend arithmetic (the report's rule: price x the attempts' wall time), a sweep's budget summed
over its cells, the thresholds notified once each across watches (the ledger's budget.json), the retry gate, and
the idle meter (nothing live, everything verified, no authorisation)."""

from __future__ import annotations

import io
import json
import time
from types import SimpleNamespace

import pytest
from rich.console import Console

from rgt import budget, errors, paths, unattended

rl = paths.module_util("rgt_runlayout")


def run(run_id="r1", host="box", state="running", elapsed=20.0, price=360.0, limit=4.0, **extra):
    return {"host": host, "run_id": run_id, "state": state, "attempt": 1, "elapsed_s": elapsed,
            "price_per_hour": price, "budget_usd": limit, **extra}


class Notes:
    def __init__(self):
        self.sent = []

    def queue(self, host, kind, event_id, view, detail, summary=""):
        self.sent.append((host, kind, event_id))


def watcher(ledger, notes=None, hosts=("box",), clock=time.time):
    out = io.StringIO()
    w = budget.Watcher(SimpleNamespace(inventory="inv", runs_dir=None), Console(file=out, width=200), ledger,
                       [SimpleNamespace(name=n, vars={"rgt_instance_id": f"i-{n}"}) for n in hosts], {}, notes,
                       clock=clock)
    return w, out


def test_spend_is_price_times_the_attempts_wall_time():
    assert budget.spend(run(elapsed=20.0, price=360.0)) == pytest.approx(2.0)
    assert budget.spend(run(price=None)) is None
    entry = budget.tally([run(elapsed=10.0, limit=4.0)])["run:box:r1"]
    assert (entry["spent_usd"], entry["pct"], entry["scope"]) == (1.0, 25.0, "run")


def test_a_sweep_budget_sums_its_cells_and_a_run_without_a_budget_or_price_counts_for_none():
    cells = [run("c1", sweep="abl", elapsed=10.0), run("c2", host="b2", sweep="abl", elapsed=20.0),
             run("solo", limit=None), run("free", price=None), run("gone", state="unreachable")]
    tallied = budget.annotate(cells)
    assert sorted(tallied) == ["sweep:abl"]
    assert tallied["sweep:abl"]["spent_usd"] == pytest.approx(3.0) and tallied["sweep:abl"]["pct"] == 75.0
    assert cells[0]["budget"] == cells[1]["budget"] and "budget" not in cells[2]
    assert budget.column(cells[0]) == "$3.00/$4.00 sweep (75%)" and budget.column(cells[2]) == "-"


def test_thresholds_are_notified_once_each_across_watches_and_start_over_with_a_new_budget(tmp_path):
    notes = Notes()
    w, out = watcher(tmp_path, notes)
    w.tick({"box": run(elapsed=21.0, state="failed")})  # 52.5%
    w.tick({"box": run(elapsed=21.5, state="failed")})
    assert [e for _h, _k, e in notes.sent] == ["budget:run:box:r1:4.0:50"]
    w2, _ = watcher(tmp_path, notes)  # a restarted watcher
    w2.tick({"box": run(elapsed=41.0, state="budget_stopped")})  # 102.5%: 80 and 100 now, 50 not again
    w2.tick({"box": run(elapsed=41.0, state="budget_stopped")})
    assert [e.rsplit(":", 1)[1] for _h, _k, e in notes.sent] == ["50", "80", "100"]
    assert {k for _h, k, _e in notes.sent} == {"budget"}
    record = json.loads((tmp_path / "budget.json").read_text())["budgets"]["run:box:r1"]
    assert record["notified"] == [50, 80, 100] and record["stopped"] is True
    w2.tick({"box": run(elapsed=41.0, limit=10.0, state="running")})  # a retry with a higher budget: 41%
    assert len(notes.sent) == 3
    assert "budget 50%" in out.getvalue()


def test_a_retry_of_a_budget_stopped_run_needs_a_higher_budget(tmp_path):
    budget.check_retry(tmp_path, "box", "r1", {"budget_usd": 1.0})  # nothing recorded: not refused
    w, _ = watcher(tmp_path)
    w.tick({"box": run(elapsed=41.0, state="budget_stopped")})
    for job in ({"budget_usd": 4.0}, {"budget_usd": 4.1}):
        with pytest.raises(errors.GateRefused) as refused:
            budget.check_retry(tmp_path, "box", "r1", job)
        assert refused.value.exit_code == errors.REFUSED and "above 4.10" in str(refused.value)
    budget.check_retry(tmp_path, "box", "r1", {"budget_usd": 5.0})
    budget.check_retry(tmp_path, "box", "other", {"budget_usd": 1.0})


def test_budget_stopped_starts_again_only_on_a_retry():
    assert not rl.may_start("budget_stopped") and rl.may_start("budget_stopped", retry=True)


def test_an_idle_meter_is_said_with_its_cost_then_every_half_hour_and_never_with_an_authorisation(tmp_path,
                                                                                                  monkeypatch):
    runs = tmp_path / "runs"
    monkeypatch.setenv("RGT_RUNS_DIR", str(runs))
    (runs / "r1").mkdir(parents=True)
    (runs / "r1" / "box.PULL_VERIFIED.json").write_text(json.dumps({"run_id": "r1"}))
    now = [1_000_000.0]
    notes = Notes()
    w, out = watcher(tmp_path, notes, clock=lambda: now[0])
    history = {"attempts": [{"attempt": 1, "started_at": now[0] - 4200}, {"attempt": 1, "ended_at": now[0] - 600,
                                                                           "reason": "finished", "rc": 0}]}
    ended = {"box": run(state="finished", limit=None, history=history)}  # $360/h, ended 10 min ago: $60
    w.tick(ended)
    w.tick(ended)
    said = [line for line in out.getvalue().splitlines() if "idle meter" in line]
    assert len(said) == 1 and "billing for 10 min since its last run ended: $60.00 so far" in said[0], said
    assert [k for _h, k, _e in notes.sent] == ["idle_meter"]
    now[0] += budget.IDLE_EVERY_S + 1
    w.tick(ended)
    assert len(notes.sent) == 2
    auth = {"schema": unattended.SCHEMA, "instance_id": "i-box", "expires_ts": now[0] + 10}  # expires soon
    auth["sha256"] = unattended.digest(auth)
    (tmp_path / "authorisations").mkdir()
    (tmp_path / "authorisations" / "i-box.json").write_text(json.dumps(auth))
    now[0] += 1
    w.tick(ended)  # its meter stop is authorised: the watcher's to stop, no idle meter
    now[0] += budget.IDLE_EVERY_S
    w.tick(ended)  # the authorisation expired: an idle meter again
    assert len(notes.sent) == 3


def test_a_box_with_a_live_or_unverified_run_is_no_idle_meter(tmp_path, monkeypatch):
    monkeypatch.setenv("RGT_RUNS_DIR", str(tmp_path / "runs"))
    notes = Notes()
    w, out = watcher(tmp_path, notes)
    w.tick({"box": run(state="finished", limit=None)})  # not pulled
    w.tick({"box": run(state="running", limit=None)})
    assert notes.sent == [] and "idle meter" not in out.getvalue()


def test_a_run_over_budget_that_cannot_be_stopped_from_here_is_said_once(tmp_path):
    w, out = watcher(tmp_path, hosts=())  # its host is no host of this watch: no SSH round to it
    w.tick({"box": run(elapsed=41.0)})
    w.tick({"box": run(elapsed=42.0)})
    assert out.getvalue().count("cannot stop box:r1 from here") == 1
    assert out.getvalue().count("budget 100%") == 1
