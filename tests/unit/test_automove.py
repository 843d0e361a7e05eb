"""watch's automatic move (runner/rgt/automove.py, docs/move.md "Moved by watch"): when a box counts as gone (the
pure decision), which spare a run goes to, and the tick over a real ledger with the move itself stubbed: the clock of
"first unreachable" survives a restarted watcher, a run moves once, a watcher stopped mid-move goes on to the same
spare, a failed move tries the next spare, and no free spare is said once per outage."""

import argparse
import json
import os
from types import SimpleNamespace

import pytest

from rgt import automove, errors, memory, paths

OFFLOAD = {"to": "s3:b/p", "spares": ["sp1", "sp2"], "move_after_s": 300}
JOB = {"name": "r1", "command": "true", "offload": OFFLOAD}


@pytest.mark.parametrize(("reachable", "platform", "first", "now", "after", "gone"), [
    (True, "gone", 0.0, 1000.0, 300, False),  # a box that answers is never gone, whatever the API says
    (False, "gone", 990.0, 1000.0, 300, True),  # the platform's word moves at once
    (False, "terminated", None, 1000.0, None, True),
    (False, "unavailable", 990.0, 1000.0, None, True),
    (False, "running", 990.0, 1000.0, 300, False),  # unreachable 10 s, the API says running: wait
    (False, None, 700.0, 1000.0, 300, True),  # unreachable for move_after_s
    (False, None, 701.0, 1000.0, 300, False),
    (False, None, 0.0, 1000.0, None, False),  # no move_after_s: only the platform's word moves it
])
def test_a_box_is_gone_when_the_platform_says_so_or_it_stays_unreachable_move_after_s(reachable, platform, first, now,
                                                                                      after, gone):
    assert (automove.decide(reachable, platform, first, now, after) is not None) is gone


def test_the_first_free_spare_in_the_jobs_order_never_the_runs_own_host():
    assert automove.first_free(["a", "b", "c"], "a", set()) == "b"
    assert automove.first_free(["a", "b", "c"], "x", {"a"}) == "b"
    assert automove.first_free(["a"], "x", {"a"}) is None


def test_only_a_job_with_spares_and_an_rclone_target_opted_in():
    assert automove.opted_in(JOB) == {"spares": ["sp1", "sp2"], "move_after_s": 300.0}
    assert automove.opted_in({"offload": {"to": "controller", "spares": ["sp1"]}}) is None
    assert automove.opted_in({"offload": {"to": "s3:b"}}) is None and automove.opted_in(None) is None


@pytest.mark.parametrize(("answer", "floor", "words"), [
    ({"root": "/d", "measured": "/d", "writable": True, "free_gib": 5.0}, 1.0, None),
    ({"root": "/d", "measured": "/d", "writable": True, "free_gib": 5.0}, 0, None),  # 0: no floor (the disk gate's)
    ({"root": "/d", "measured": "/", "writable": True, "free_gib": 0.4}, 1.0,
     "0.4 GiB free on /, below the job's disk floor of 1 GiB"),
    ({"root": "/d", "writable": False, "why": "/d: Read-only file system"}, 1.0,
     "its durable root /d is not writable (/d: Read-only file system)"),
    (None, 1.0, "it does not answer (Connection refused)"),
])
def test_a_spare_that_does_not_answer_cannot_write_its_durable_root_or_lacks_the_disk_floor_is_a_problem(
        answer, floor, words):
    assert automove.spare_problem(answer, floor, "Connection refused") == words


def test_the_spare_look_writes_and_measures_the_durable_root_or_its_nearest_parent(tmp_path):
    layout = paths.module_util("rgt_runlayout")
    got = layout.spare_check(str(tmp_path / "not" / "made"))
    assert got["writable"] and got["measured"] == str(tmp_path) and got["free_gib"] > 0
    assert list(tmp_path.iterdir()) == []  # the file it made is gone
    tmp_path.chmod(0o500)
    try:
        assert os.geteuid() == 0 or not layout.spare_check(str(tmp_path))["writable"]
    finally:
        tmp_path.chmod(0o700)


def _host(name):
    return SimpleNamespace(name=name, project="rgt", instance_id=f"i-{name}", profile={}, vars={}, overlay={})


@pytest.fixture
def world(tmp_path, monkeypatch):
    ledger = tmp_path / "ledger"
    memory.record_launch(ledger, "old", "i-old", "rgt", JOB, {"action": "launch", "attempt": 1, "state": "running"})
    old = _host("old")
    memory.act_on(old, memory.host_runs(ledger, old))
    inventory = {n: _host(n) for n in ("old", "sp1", "sp2")}
    moves, platform = [], {"state": None}

    def fake_move(args, console):
        moves.append(args.to)
        code = world_codes.pop(0) if world_codes else errors.OK
        if code == errors.OK:
            memory.record_launch(ledger, args.to, f"i-{args.to}", "rgt", JOB, {"action": "launch", "attempt": 2})
            memory.record_move(ledger, "old", args.to, "rgt", "r1", 2, {"at": "now", **supersede})
        return code

    world_codes: list[int] = []
    supersede = {}  # the move's record's `superseded` (a move back to a box an older generation ran on)
    spares = {}  # spare: its look (rgt_runlayout.spare_check), None for one that does not answer; default healthy
    looked = []

    def fake_look(inventory, host, extravars=None):
        looked.append(host.name)
        answer = spares.get(host.name, {"root": "/d", "measured": "/d", "writable": True, "free_gib": 50.0})
        return answer, "" if answer else "ssh: connect to host sp1 port 22: Connection refused"

    monkeypatch.setattr(automove.move, "cmd_move", fake_move)
    monkeypatch.setattr(automove, "look_at_spare", fake_look)
    monkeypatch.setattr(automove, "platform_state", lambda host: platform["state"])
    monkeypatch.setattr(automove.Watcher, "_hosts", lambda self: inventory)

    def watcher():
        args = argparse.Namespace(inventory="inv", ledger=str(ledger), verbose=0, json=False)
        return automove.Watcher(args, SimpleNamespace(print=lambda *a, **k: None), ledger, None,
                                tmp_path / "events.jsonl")

    return SimpleNamespace(ledger=ledger, old=old, moves=moves, platform=platform, codes=world_codes,
                           watcher=watcher, inventory=inventory, spares=spares, looked=looked, events=tmp_path /
                           "events.jsonl", supersede=supersede)


def test_an_unreachable_box_is_counted_across_watcher_restarts_and_its_run_moves_once(world, monkeypatch):
    clock = {"t": 1000.0}
    monkeypatch.setattr(automove.time, "time", lambda: clock["t"])
    down = {"old": {"host": "old", "state": "unreachable"}}
    assert world.watcher().tick(down, {"old": world.old}) == []  # first seen unreachable now
    clock["t"] = 1200.0
    assert world.watcher().tick(down, {"old": world.old}) == []  # a new watcher: 200 s of 300
    clock["t"] = 1301.0
    w = world.watcher()
    assert w.tick(down, {"old": world.old}) == [{"run_id": "r1", "from": "old", "to": "sp1", "gone": False}]
    assert world.moves == ["sp1"] and "old" in w.left
    clock["t"] = 1400.0
    assert world.watcher().tick(down, {"old": world.old}) == [] and world.moves == ["sp1"]  # once


def test_an_answer_resets_the_clock(world, monkeypatch):
    clock = {"t": 1000.0}
    monkeypatch.setattr(automove.time, "time", lambda: clock["t"])
    w = world.watcher()
    w.tick({"old": {"state": "unreachable"}}, {"old": world.old})
    clock["t"] = 1200.0
    w.tick({"old": {"state": "running"}}, {"old": world.old})
    clock["t"] = 1400.0
    assert w.tick({"old": {"state": "unreachable"}}, {"old": world.old}) == []  # 0 s of this outage


def test_the_platforms_word_moves_at_once_and_a_busy_spare_is_passed_over(world):
    memory.record_launch(world.ledger, "sp1", "i-sp1", "rgt", {"name": "other", "command": "true"},
                         {"action": "launch", "attempt": 1})
    world.platform["state"] = "gone"
    done = world.watcher().tick({"old": {"state": "unreachable"}}, {"old": world.old})
    assert done == [{"run_id": "r1", "from": "old", "to": "sp2", "gone": True}]


def test_a_failed_move_tries_the_next_spare_and_a_watcher_stopped_mid_move_goes_on_to_the_same_spare(world):
    world.platform["state"] = "gone"
    world.codes.append(errors.FAILED)
    assert world.watcher().tick({"old": {"state": "unreachable"}}, {"old": world.old}) == []
    assert world.watcher().tick({"old": {"state": "unreachable"}}, {"old": world.old})[0]["to"] == "sp2"
    assert world.moves == ["sp1", "sp2"]


def test_mid_move_resume_and_no_free_spare_reminds_once(world, tmp_path):
    world.platform["state"] = "gone"
    w = world.watcher()
    state = w._load("old")
    state["runs"]["r1"] = {"state": "moving", "to": "sp2", "at": 1.0}
    w._save("old", state)
    assert w.tick({"old": {"state": "unreachable"}}, {"old": world.old})[0]["to"] == "sp2"  # never a second spare

    # a second run on another gone box, with both spares taken now: said each tick, notified once
    job = {**JOB, "name": "r2", "offload": {**OFFLOAD, "spares": ["sp2"]}}
    memory.record_launch(world.ledger, "b", "i-b", "rgt", job, {"action": "launch", "attempt": 1})
    b = _host("b")
    memory.act_on(b, memory.host_runs(world.ledger, b))
    sent = []
    w2 = world.watcher()
    w2.notifier = SimpleNamespace(queue=lambda host, kind, event_id, view, detail: sent.append((host, kind)))
    for _ in range(2):
        assert w2.tick({"b": {"state": "unreachable"}}, {"b": b}) == []
    assert sent == [("b", "moved")] and world.moves == ["sp2"]


def test_a_spare_that_fails_its_look_is_skipped_this_tick_said_and_notified_once_and_the_next_is_tried(world):
    world.platform["state"] = "gone"
    world.spares["sp1"] = None  # down
    sent = []
    w = world.watcher()
    w.notifier = SimpleNamespace(queue=lambda host, kind, event_id, view, detail: sent.append((kind, detail)))
    assert w.tick({"old": {"state": "unreachable"}}, {"old": world.old})[0]["to"] == "sp2"
    assert world.looked == ["sp1", "sp2"] and world.moves == ["sp2"]
    events = [json.loads(line) for line in world.events.read_text().splitlines()]
    assert [(e["event"], e.get("spare")) for e in events] == [("spare_skipped", "sp1"), ("moved", None)]
    assert events[0]["reason"].startswith("it does not answer (ssh: connect to host sp1")
    assert [k for k, _d in sent] == ["moved", "moved"] and "the spare sp1 was skipped" in sent[0][1]
    state = w._load("old")
    assert "sp1" not in (state["runs"]["r1"].get("tried") or [])  # skipped for that tick only, never counted tried


def test_spares_that_all_fail_their_look_are_said_each_tick_and_notified_once_per_outage(world):
    world.platform["state"] = "gone"
    world.spares.update(sp1=None, sp2={"root": "/d", "writable": True, "free_gib": 0.01})
    sent = []
    w = world.watcher()
    w.notifier = SimpleNamespace(queue=lambda host, kind, event_id, view, detail: sent.append(detail))
    for _ in range(2):
        assert w.tick({"old": {"state": "unreachable"}}, {"old": world.old}) == []
    assert world.moves == [] and world.looked == ["sp1", "sp2", "sp1", "sp2"]
    events = [json.loads(line) for line in world.events.read_text().splitlines()]
    assert [e["spare"] for e in events if e["event"] == "spare_skipped"] == ["sp1", "sp2", "sp1", "sp2"]
    assert len(sent) == 3 and "no spare is free" in sent[2]  # sp1, sp2 and the reminder, once


def test_an_automatic_move_back_says_in_its_event_what_it_set_aside_there(world):
    """The `moved` event carries the move's record's `superseded` (docs/move.md "Moved by watch"); a plain move's
    event has none."""
    world.platform["state"] = "gone"
    aside = {"generation": 1, "set_aside": "/d/rgt/active/r1/superseded/gen1-20261203T000000Z",
             "moved": ["ckpt", "offload.jsonl"]}
    world.supersede["superseded"] = aside
    assert world.watcher().tick({"old": {"state": "unreachable"}}, {"old": world.old})[0]["to"] == "sp1"
    events = [json.loads(line) for line in world.events.read_text().splitlines()]
    assert [(e["event"], e["to"], e.get("superseded")) for e in events] == [("moved", "sp1", aside)]


def test_a_plain_automatic_move_event_names_nothing_set_aside(world):
    world.platform["state"] = "gone"
    assert world.watcher().tick({"old": {"state": "unreachable"}}, {"old": world.old})[0]["to"] == "sp1"
    events = [json.loads(line) for line in world.events.read_text().splitlines()]
    assert [e["event"] for e in events] == ["moved"] and "superseded" not in events[0]
