"""The box stops its own meter (plugins/module_utils/rgt_inbox.py) over real run dirs in a temp durable root: it
stops only with an intact, unexpired authorisation naming its own id, every run on the box covered, none live, each
export sealed and offloaded and verified; every hostile case is a `refused` record and the command never runs."""

import hashlib
import json
import os
import stat
import time

import pytest

from ansible_collections.rgt.remote_gpu.plugins.module_utils import rgt_inbox
from ansible_collections.rgt.remote_gpu.plugins.module_utils import rgt_runlayout as rl
from rgt import unattended

IID = "adl-7f3e"
ENV = "AutoDLContainerUUID"


def make_run(durable, run_id, project="proj", state="finished", sealed=True, offloaded=True):
    """A run as the wrapper leaves it: attempt records and exit.json, its export sealed (manifest beside it) and
    OFFLOAD_VERIFIED.json binding that manifest's SHA-256."""
    paths = rl.RunPaths(str(durable), project, run_id)
    os.makedirs(paths.meta)
    with open(paths.attempts, "w") as handle:
        handle.write(json.dumps({"attempt": 1, "started_at": "2026-01-01T00:00:00Z"}) + "\n")
        if state != "dead":
            handle.write(json.dumps({"attempt": 1, "ended_at": "2026-01-01T00:10:00Z", "rc": 0, "reason": state})
                         + "\n")
    if state != "dead":
        rl.atomic_write_json(paths.exit, {"attempt": 1, "rc": 0, "signal": None, "reason": state})
    if sealed:
        os.makedirs(os.path.join(paths.export_dir, run_id, "out"))
        with open(os.path.join(paths.export_dir, run_id, "out", "model.bin"), "wb") as handle:
            handle.write(b"weights")
        raw = json.dumps({"run_id": run_id, "files": [], "totals": {"files": 1, "bytes": 7}}).encode()
        with open(os.path.join(paths.export_dir, run_id + ".manifest.json"), "wb") as handle:
            handle.write(raw)
        if offloaded:
            rl.atomic_write_json(os.path.join(paths.run_dir, "OFFLOAD_VERIFIED.json"), {
                "schema": "rgt/offload-verified/v1", "run_id": run_id, "target": "s3:b/p/%s/export" % run_id,
                "manifest_sha256": hashlib.sha256(raw).hexdigest()})
    return paths


def authorisation(names, instance_id=IID, expires_in=3600.0, in_box=True, **edit):
    now = time.time()
    runs = [{"project": "proj", "run_id": r, "host": "box"} for r in names]
    doc = {"schema": unattended.SCHEMA, "instance_id": instance_id, "hosts": ["box"], "profile": "autodl",
           "verb": "power_off", "label": "关机", "runs": runs,
           "created_at": "then", "created_ts": now - 60, "expires_at": "soon", "expires_ts": now + expires_in,
           "in_box": in_box}
    doc["sha256"] = unattended.digest(doc)
    doc.update(edit)  # as a hand would: the SHA-256 left as it was
    return doc


@pytest.fixture
def box(tmp_path):
    calls = tmp_path / "shutdown-calls"
    script = tmp_path / "shutdown"
    script.write_text("#!/bin/sh\necho \"shutdown $*\" >> %s\n" % calls)
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    return {"durable": tmp_path / "durable", "calls": calls, "command": [str(script)],
            "proc": str(tmp_path / "no-proc-environ")}


def job_of(box, doc, stop_box=True):
    return {"offload": {"to": "s3:b/p", "stop_box": stop_box},
            "inbox_stop": {"authorisation": doc, "command": box["command"], "self_id_env": ENV}}


def carry(box, paths, job, environ=None, **kw):
    environ = {ENV: IID} if environ is None else environ
    return rgt_inbox.carry_out(paths, job, environ=environ, proc_environ=box["proc"], **kw)


def calls(box):
    return box["calls"].read_text().splitlines() if box["calls"].exists() else []


def on_record(paths):
    return json.loads(open(os.path.join(paths.meta, "inbox_stop.json")).read())


def test_the_box_stops_its_own_meter_when_everything_holds_and_says_why(box):
    other = make_run(box["durable"], "cell-a")
    own = make_run(box["durable"], "cell-b")
    record = carry(box, own, job_of(box, authorisation(["cell-a", "cell-b"])))
    assert calls(box) == ["shutdown "]
    assert record["action"] == "stop" and record["rc"] == 0 and record == on_record(own)
    assert "every run on the box (proj/cell-a, proj/cell-b) is covered" in record["reason"]
    assert record["instance_id"] == record["own_id"] == IID
    assert rgt_inbox.describe(record).startswith("box stopped its own meter at ")
    assert not os.path.exists(os.path.join(other.meta, "inbox_stop.json"))


def test_its_own_run_still_holding_its_lock_is_not_taken_for_live_but_another_live_run_refuses(box):
    own = make_run(box["durable"], "r1")
    held = rl.take_lock(own.lock)  # the wrapper calling the rule holds its own lock
    try:
        record = carry(box, own, job_of(box, authorisation(["r1", "r2"])))
        assert record["action"] == "refused" and "run proj/r2/ (authorised)" not in record["reason"]
        live = make_run(box["durable"], "r2", state="dead", sealed=False)
        other = rl.take_lock(live.lock)
        try:
            record = carry(box, own, job_of(box, authorisation(["r1", "r2"])))
        finally:
            other.close()
        assert "run proj/r2 is still live" in record["reason"], record
        assert calls(box) == []
        assert carry(box, own, job_of(box, authorisation(["r1"])))["reasons"] == [
            "run proj/r2 is on the box and the authorisation does not cover it"]
    finally:
        held.close()


@pytest.mark.parametrize(("doc", "environ", "said"), [
    (authorisation(["r1"], instance_id="adl-other"), None, "names instance 'adl-other', not this box's 'adl-7f3e'"),
    (authorisation(["r1"], expires_in=-1), None, "the authorisation expired at soon"),
    (authorisation(["r1"], expires_in=-1, expires_ts=time.time() + 86400), None, "SHA-256 does not match"),
    (authorisation(["r1"], runs=[{"project": "proj", "run_id": "r1"}, {"project": "proj", "run_id": "r9"}]), None,
     "SHA-256 does not match"),
    (authorisation(["r1"], in_box=False), None, "does not let the box stop its own meter"),
    (authorisation(["r1"]), {}, "the box cannot tell its own instance id"),
    (authorisation(["r1"]), {ENV: "adl-other"}, "names instance 'adl-7f3e', not this box's 'adl-other'"),
    (None, None, "no authorisation came with the launch"),
])
def test_a_hostile_authorisation_never_stops_the_meter(box, doc, environ, said):
    own = make_run(box["durable"], "r1")
    record = carry(box, own, job_of(box, doc), environ=environ)
    assert record["action"] == "refused" and said in record["reason"], record
    assert on_record(own)["action"] == "refused" and calls(box) == []


@pytest.mark.parametrize(("other", "said"), [
    ({"run_id": "stray"}, "run proj/stray is on the box and the authorisation does not cover it"),
    ({"run_id": "stray", "project": "elsewhere"}, "run elsewhere/stray is on the box and the authorisation does not"),
    ({"run_id": "r2", "offloaded": False}, "run proj/r2 (finished): its sealed export is not offloaded and verified"),
    ({"run_id": "r2", "sealed": False}, "run proj/r2 (finished): its export is not sealed on the box"),
    ({"run_id": "r2", "state": "failed", "sealed": False}, "run proj/r2 (failed): its export is not sealed"),
])
def test_an_unexpected_or_unverified_run_on_the_box_never_stops_the_meter(box, other, said):
    own = make_run(box["durable"], "r1")
    make_run(box["durable"], **other)
    record = carry(box, own, job_of(box, authorisation(["r1", "r2"])))
    assert record["action"] == "refused" and said in record["reason"], record
    assert calls(box) == []


def test_a_manifest_changed_after_the_offload_or_a_missing_run_refuses(box):
    own = make_run(box["durable"], "r1")
    with open(os.path.join(own.export_dir, "r1.manifest.json"), "ab") as handle:
        handle.write(b" ")
    record = carry(box, own, job_of(box, authorisation(["r1", "gone"])))
    assert "does not match the manifest now on the box" in record["reason"]
    assert "run proj/gone (authorised) is not on the box" in record["reason"]
    os.makedirs(os.path.join(str(box["durable"]), "proj", "active", "not a run"))
    assert "is on the box and is not an rgt run" in carry(box, own, job_of(box, authorisation(["r1"])))["reason"]
    assert calls(box) == []


def test_no_stop_box_no_copy_or_an_unfinished_own_run_does_nothing_or_refuses(box):
    own = make_run(box["durable"], "r1")
    assert carry(box, own, job_of(box, authorisation(["r1"]), stop_box=False)) is None
    assert carry(box, own, {"offload": {"to": "s3:b/p", "stop_box": True}}) is None
    assert not os.path.exists(os.path.join(own.meta, "inbox_stop.json"))
    failed = make_run(box["durable"], "r2", state="preempted", sealed=False)
    record = carry(box, failed, job_of(box, authorisation(["r2", "r1"])))
    assert "run proj/r2 (preempted): its export is not sealed" in record["reason"] and calls(box) == []


def test_a_command_that_fails_is_on_record_as_such(box):
    own = make_run(box["durable"], "r1")
    job = job_of(box, authorisation(["r1"]))
    job["inbox_stop"]["command"] = [str(box["durable"] / "no-such-shutdown")]
    record = carry(box, own, job)
    assert record["action"] == "stop_failed" and "failed (rc None)" in record["reason"]
    assert "No such file" in record["reason"]
    seen = []
    record = carry(box, own, job_of(box, authorisation(["r1"])), run=lambda argv, t: (seen.append(
        on_record(own)["action"]) or (1, "refused by init")))
    assert seen == ["stop"]  # on record before the command ran
    assert record["action"] == "stop_failed" and "(rc 1): refused by init" in record["reason"]


def test_the_own_id_comes_from_the_environment_else_the_containers_own(tmp_path):
    proc = tmp_path / "environ"
    proc.write_bytes(b"PATH=/bin\0AutoDLContainerUUID=adl-from-pid1\0")
    assert rgt_inbox.own_id_of(ENV, {ENV: "adl-env"}, str(proc)) == "adl-env"
    assert rgt_inbox.own_id_of(ENV, {}, str(proc)) == "adl-from-pid1"
    assert rgt_inbox.own_id_of(ENV, {}, str(tmp_path / "none")) is None
    assert rgt_inbox.own_id_of(None, {ENV: "x"}, str(proc)) is None


def test_the_ledger_and_the_box_check_the_same_digest():
    doc = authorisation(["r1"])
    assert unattended.digest(doc) == rgt_inbox.digest(doc) == doc["sha256"]


def _wrapper_end(box, run_id, doc, barrier, results):
    """One run's wrapper at its end, in a process of its own: it holds its run lock, as the wrapper does, and calls
    the rule the instant the other does."""
    paths = rl.RunPaths(str(box["durable"]), "proj", run_id)
    held = rl.take_lock(paths.lock)
    try:
        barrier.wait(timeout=30)
        results.put((run_id, carry(box, paths, job_of(box, doc))))
    finally:
        held.close()


def test_two_runs_that_end_in_the_same_instant_stop_the_meter_once_not_never(box):
    import multiprocessing

    ctx = multiprocessing.get_context("fork")
    names = ["r1", "r2"]
    for name in names:
        make_run(box["durable"], name)
    doc = authorisation(names)  # the copy both runs of one --down launch carry
    for _ in range(3):  # the same race, thrice (which run wins varies; the outcome may not)
        for name in names:
            record = os.path.join(rl.RunPaths(str(box["durable"]), "proj", name).meta, "inbox_stop.json")
            if os.path.exists(record):
                os.remove(record)
        box["calls"].unlink(missing_ok=True)
        barrier, results = ctx.Barrier(2), ctx.Queue()
        procs = [ctx.Process(target=_wrapper_end, args=(box, n, doc, barrier, results)) for n in names]
        for proc in procs:
            proc.start()
        got = dict(results.get(timeout=60) for _ in procs)
        for proc in procs:
            proc.join(30)
        assert calls(box) == ["shutdown "], got
        actions = sorted(r["action"] for r in got.values())
        assert actions == ["refused", "stop"], got
        winner = next(n for n, r in got.items() if r["action"] == "stop")
        refused = next(r for r in got.values() if r["action"] == "refused")
        assert refused["reasons"] == ["the box's meter stop was already made by run proj/%s at %s"
                                      % (winner, got[winner]["at"])], refused


def test_a_run_waits_for_the_box_lock_and_refuses_when_it_stays_held(box):
    own = make_run(box["durable"], "r1")
    lock = os.path.join(str(box["durable"]), ".rgt", "inbox.lock")
    os.makedirs(os.path.dirname(lock), exist_ok=True)
    held = rl.take_lock(lock)
    try:
        record = carry(box, own, job_of(box, authorisation(["r1"])), lock_wait_s=0.2)
    finally:
        held.close()
    assert record["action"] == "refused" and "held the box lock" in record["reasons"][0] and calls(box) == []
    assert carry(box, own, job_of(box, authorisation(["r1"])))["action"] == "stop"
