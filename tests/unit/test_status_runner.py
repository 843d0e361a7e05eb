"""rgt.status without Ansible: exit codes, per-host backoff, the watch loop's stop rules and the auto-resume hook."""

import argparse
import io
import json
from pathlib import Path

import pytest
from rich.console import Console

from rgt import observe, status
from rgt.events import HostOutcome


def console():
    return Console(file=io.StringIO(), width=200)


def test_exit_code_order():
    ok = {"state": "running"}
    assert status.exit_code({"a": ok, "b": {"state": "finished"}}) == 0
    assert status.exit_code({"a": ok, "b": {"state": "unreachable"}}) == 4
    assert status.exit_code({"a": {"state": "dead"}, "b": {"state": "unreachable"}}) == 1
    assert status.exit_code({"a": {"state": "failed"}, "b": {"state": "running", "attention": [{"id": "x"}]}}) == 5
    assert status.exit_code({"a": {"state": "unreachable", "host_key_mismatch": True},
                             "b": {"state": "running", "attention": [{"id": "x"}]}}) == 3


def test_host_doc_never_turns_unreachable_into_a_job_state():
    out = HostOutcome(unreachable=True, messages=["ssh: connect to host x port 22: Connection timed out"])
    doc = observe.host_doc("h", out, 1.0)
    assert doc == {"host": "h", "state": "unreachable", "error": "ssh: connect to host x port 22: Connection timed out"}
    failed = observe.host_doc("h", HostOutcome(failed=True, messages=["boom"]), 1.0)
    assert failed["state"] == "error"
    good = observe.host_doc("h", HostOutcome(results={"monitor_status_report": {"state": "running", "host": "vm"}}),
                            5.0)
    assert good["state"] == "running" and good["host"] == "h" and good["hostname"] == "vm" and good["seen_at"] == 5.0


def test_schedule_backs_off_exponentially_and_caps_at_ten_minutes():
    s = status.Schedule(["a", "b"], 90, start=0.0)
    assert s.due_hosts(0.0) == ["a", "b"]
    assert s.update("a", True, 0.0) == 90
    assert [s.update("b", False, 0.0) for _ in range(4)] == [180, 360, 600, 600]
    assert s.next_due() == 90 and s.due_hosts(90) == ["a"]
    assert s.update("b", True, 700.0) == 90


class FakeWorld:
    """Scripted poll results per host, a fake clock, and a recorded relaunch."""

    def __init__(self, monkeypatch, script, relaunch_rc=0):
        self.script = {h: list(seq) for h, seq in script.items()}
        self.clock = 0.0
        self.polls = []
        self.relaunched = []
        hosts = [argparse.Namespace(name=h) for h in script]
        monkeypatch.setattr(status, "prepare_hosts", lambda args: (hosts, {"rgt_job": {"name": "x"}}))
        monkeypatch.setattr(status, "_monotonic", lambda: self.clock)
        monkeypatch.setattr(status, "_sleep", self.sleep)
        monkeypatch.setattr(status, "poll", self.poll)

        def fake_relaunch(args, con, names, **kw):
            self.relaunched.append((list(names), kw["extravars"]))
            return relaunch_rc

        monkeypatch.setattr(status, "relaunch", fake_relaunch)

    def sleep(self, seconds):
        self.clock += seconds

    def poll(self, args, con, hosts, extravars, ledger):
        names = [h.name for h in hosts]
        self.polls.append((self.clock, names))
        out = {}
        for name in names:
            seq = self.script[name]
            doc = dict(seq.pop(0) if len(seq) > 1 else seq[0])
            doc["host"] = name
            out[name] = doc
        return out


def args(tmp_path, **over):
    base = dict(inventory="inv", limit=None, extra_vars=[], json=True, ledger=str(tmp_path / "ledger"),
                interval=90.0, max_ticks=20, verbose=0)
    base.update(over)
    return argparse.Namespace(**base)


def run_watch(tmp_path, capsys, **over):
    code = status.cmd_watch(args(tmp_path, **over), console())
    return code, json.loads(capsys.readouterr().out)


def test_watch_backs_off_an_unreachable_host_while_polling_the_others(tmp_path, monkeypatch, capsys):
    running = {"state": "running", "step": 1}
    world = FakeWorld(monkeypatch, {"a": [running] * 6 + [{"state": "finished"}],
                                    "b": [{"state": "unreachable", "error": "timeout"}]})
    code, doc = run_watch(tmp_path, capsys, max_ticks=7)
    assert world.polls[:4] == [(0.0, ["a", "b"]), (90.0, ["a"]), (180.0, ["a", "b"]), (270.0, ["a"])]
    # b failed twice: due again 360 s after its second try
    assert (540.0, ["a", "b"]) in world.polls
    assert code == 4 and doc["exit_code"] == 4 and doc["stopped"] == "max_ticks"


def test_watch_stops_once_every_run_is_settled(tmp_path, monkeypatch, capsys):
    world = FakeWorld(monkeypatch, {"a": [{"state": "running"}, {"state": "finished"}],
                                    "b": [{"state": "dead"}]})
    code, doc = run_watch(tmp_path, capsys)
    assert world.polls == [(0.0, ["a", "b"]), (90.0, ["a"])]
    assert code == 1 and doc["ticks"] == 2 and doc["stopped"] == "settled"
    assert world.relaunched == []  # dead is reported, never relaunched


def test_watch_stops_on_attention(tmp_path, monkeypatch, capsys):
    nan = {"state": "running", "attention": [{"id": "nonfinite_loss", "message": "nan at 3"}]}
    FakeWorld(monkeypatch, {"a": [nan]})
    code, doc = run_watch(tmp_path, capsys)
    assert code == 5 and doc["ticks"] == 1


def test_watch_relaunches_a_preempted_auto_resume_run_once(tmp_path, monkeypatch, capsys):
    pre = {"state": "preempted", "attempt": 1, "auto_resume": True}
    world = FakeWorld(monkeypatch, {"a": [pre, {"state": "running", "attempt": 2},
                                          {"state": "finished", "attempt": 2}]})
    code, doc = run_watch(tmp_path, capsys)
    assert world.relaunched == [(["a"], {"rgt_job": {"name": "x"}})]
    assert code == 0 and doc["hosts"]["a"]["state"] == "finished"
    assert doc["relaunches"][0]["host"] == "a" and doc["relaunches"][0]["attempt"] == 1
    events = list((Path(tmp_path) / "ledger" / "events").glob("*-watch-*.jsonl"))
    assert len(events) == 1 and '"relaunch"' in events[0].read_text()


def test_watch_does_not_relaunch_the_same_attempt_twice(tmp_path, monkeypatch, capsys):
    pre = {"state": "preempted", "attempt": 1, "auto_resume": True}
    world = FakeWorld(monkeypatch, {"a": [pre]})
    code, doc = run_watch(tmp_path, capsys)
    assert len(world.relaunched) == 1 and doc["stopped"] == "settled" and code == 1


@pytest.mark.parametrize("doc", [{"state": "preempted", "attempt": 1, "auto_resume": False},
                                 {"state": "preempted", "attempt": 1, "auto_resume": True,
                                  "attention": [{"id": "nonfinite_loss", "message": "nan"}]},
                                 {"state": "failed", "attempt": 1, "auto_resume": True},
                                 {"state": "dead", "attempt": 1, "auto_resume": True}])
def test_watch_never_relaunches_without_auto_resume_or_on_failure(tmp_path, monkeypatch, capsys, doc):
    world = FakeWorld(monkeypatch, {"a": [doc]})
    run_watch(tmp_path, capsys)
    assert world.relaunched == []


def test_failed_relaunch_settles_the_host(tmp_path, monkeypatch, capsys):
    pre = {"state": "preempted", "attempt": 1, "auto_resume": True}
    world = FakeWorld(monkeypatch, {"a": [pre, {"state": "running"}]}, relaunch_rc=1)
    code, doc = run_watch(tmp_path, capsys)
    assert len(world.polls) == 1 and doc["relaunches"][0]["exit_code"] == 1 and code == 1


def test_a_watch_started_again_never_relaunches_an_attempt_an_earlier_one_did(tmp_path, monkeypatch, capsys):
    """The relaunches are in the ledger (rgt.service.Relaunched): a watcher killed and started again, by hand or
    by its service, relaunches each attempt once; a later preemption (attempt 2) is relaunched again."""
    pre = {"state": "preempted", "attempt": 1, "auto_resume": True}
    world = FakeWorld(monkeypatch, {"a": [pre]}, relaunch_rc=1)
    run_watch(tmp_path, capsys)
    code, doc = run_watch(tmp_path, capsys)
    assert len(world.relaunched) == 1 and doc["relaunches"] == [] and code == 1
    world.script["a"] = [{**pre, "attempt": 2}]
    code, doc = run_watch(tmp_path, capsys)
    assert len(world.relaunched) == 2 and doc["relaunches"][0]["attempt"] == 2


def test_follow_looks_without_acting_and_the_watcher_that_acts_writes_its_tick(tmp_path, monkeypatch, capsys):
    pre = {"state": "preempted", "attempt": 1, "auto_resume": True, "run_id": "r1"}
    world = FakeWorld(monkeypatch, {"a": [pre], "b": [{"state": "running", "run_id": "r2"}]})
    tick = Path(tmp_path) / "ledger" / "service" / "tick.json"
    code, doc = run_watch(tmp_path, capsys, follow=True, max_ticks=2)
    assert world.relaunched == [] and doc["relaunches"] == [] and doc["ticks"] == 2 and code == 1
    assert not tick.exists() and not (Path(tmp_path) / "ledger" / "watch.json").exists()
    run_watch(tmp_path, capsys, max_ticks=2)
    written = json.loads(tick.read_text())
    assert written["tick"] == 2 and written["waiting_on"] == ["b:r2 (running)"]
    assert {(r["host"], r["run_id"], r["state"]) for r in written["runs"]} == {("a", "r1", "preempted"),
                                                                               ("b", "r2", "running")}


def test_tick_line_format():
    doc = {"state": "running", "step": 12, "loss": 0.25, "gpu": [{"util_pct": 93}],
           "mounts": [{"bytes_pct": 40, "inodes_pct": 2}, {"bytes_pct": 70, "inodes_pct": 9}],
           "evidence": {"heartbeat_age_s": 3.2}}
    line = status.tick_line("box", doc, 0.0)
    assert line.split(" ", 1)[1] == "box running step=12 loss=0.25 util=93% disk=70% inode=9% hb=3s"
