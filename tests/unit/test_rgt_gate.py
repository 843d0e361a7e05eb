"""The box-wide teardown gate (plugins/module_utils/rgt_gate.py) over real listings: the rgt_box_runs module's
list_box() walks a temp durable root laid out the way the wrapper and closeout leave it, and the controller's
verified pulls come from tests/fakes/capsule.py. One rule each: live refuses, finished-unsealed refuses, sealed
needs a verified pull bound to this instance and the manifest now on the box, the rest is listed."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from ansible_collections.rgt.remote_gpu.plugins.module_utils import rgt_gate, rgt_manifest
from ansible_collections.rgt.remote_gpu.plugins.modules import rgt_box_runs
from tests.fakes.capsule import make_pull

IID = "pod-1"
PROFILE = {"name": "runpod", "meter_stop": {"verb": "terminate", "label": "Terminate", "reversible": False}}


class Layout:
    def __init__(self, tmp_path: Path):
        self.durable = tmp_path / "durable"
        self.runs = tmp_path / "runs"
        self.durable.mkdir()
        # runpod-like: the container disk (/) goes with terminate; the volume holding the durable root survives it
        self.mounts = [{"path": "/", "survives": []}, {"path": str(tmp_path), "survives": ["stop", "terminate"]}]

    def attempt(self, project, run_id, reason, attempt=1):
        meta = self.durable / project / "active" / run_id / ".rgt"
        meta.mkdir(parents=True, exist_ok=True)
        (meta / "attempts.jsonl").write_text(json.dumps({"attempt": attempt, "started_at": "t"}) + "\n")
        if reason:
            (meta / "exit.json").write_text(json.dumps({"attempt": attempt, "reason": reason, "rc": 0}))
        return meta

    def sealed(self, project, run_id, host="box", instance_id=IID, active=True):
        if active:
            self.attempt(project, run_id, "finished")
        raw, files = make_pull(self.runs, run_id, host, instance_id)
        export = self.durable / project / "export"
        for rel, data in files.items():
            (export / run_id / rel).parent.mkdir(parents=True, exist_ok=True)
            (export / run_id / rel).write_bytes(data)
        (export / f"{run_id}.manifest.json").write_bytes(raw)
        return export

    def marker(self, run_id, host="box"):
        return self.runs / run_id / f"{host}.PULL_VERIFIED.json"

    def box(self, mounts=None):
        return rgt_box_runs.list_box(str(self.durable), self.mounts if mounts is None else mounts)

    def gate(self, hosts=("box",), listings=None, profile=PROFILE, **kw):
        return rgt_gate.evaluate(IID, list(hosts), listings if listings is not None else [self.box()],
                                 str(self.runs), profile, rgt_manifest, **kw)


@pytest.fixture
def lay(tmp_path):
    return Layout(tmp_path)


def test_a_box_with_no_runs_passes_and_says_so(lay):
    verdict = lay.gate()
    assert verdict["passed"] is True and verdict["runs"] == []
    assert verdict["notes"] == ["no runs on the box (under %s): nothing on it waits for a pull" % lay.durable]


def test_every_verified_run_passes(lay):
    lay.sealed("proj", "a")
    lay.sealed("other", "b")
    verdict = lay.gate()
    assert verdict["passed"] is True, verdict["reasons"]
    assert [(r["project"], r["run_id"], r["state"], r["pull"]) for r in verdict["runs"]] == [
        ("other", "b", "finished", "verified"), ("proj", "a", "finished", "verified")]


def test_a_live_run_refuses_named_with_its_attempt(lay, tmp_path):
    lay.sealed("proj", "a")
    meta = lay.attempt("proj", "b", None, attempt=2)
    hold = ("import fcntl, sys, time\nh = open(sys.argv[1], 'a+')\nfcntl.flock(h.fileno(), fcntl.LOCK_EX)\n"
            "print('held', flush=True)\ntime.sleep(60)\n")
    proc = subprocess.Popen([sys.executable, "-c", hold, str(meta / "lock")], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "held"
        verdict = lay.gate()
    finally:
        proc.kill()
        proc.wait()
    assert verdict["passed"] is False
    assert verdict["reasons"] == ["run proj/b is running (attempt 2)"]
    # the lock file alone (a dead wrapper) is not a live run
    assert lay.gate()["reasons"] == []


def test_a_finished_run_without_a_sealed_export_refuses(lay):
    lay.attempt("proj", "c", "finished")
    assert lay.gate()["reasons"] == ["run proj/c finished but its export is not sealed: run `rgt-run pull`"]


def test_sealed_but_not_pulled_refuses_even_when_the_run_dir_is_gone(lay):
    lay.sealed("proj", "c", active=False)
    lay.marker("c").unlink()
    verdict = lay.gate()
    (row,) = verdict["runs"]
    assert row["state"] == "exported" and row["pull"] == "sealed, not pulled" and row["run_dir"] is None
    assert verdict["reasons"][0].startswith("run proj/c (exported) is sealed, not pulled")


def test_a_local_file_that_changed_since_the_pull_refuses_naming_it(lay):
    lay.sealed("proj", "a")
    pulled = lay.runs / "a" / "box" / "out" / "metrics.json"
    pulled.write_bytes(pulled.read_bytes().replace(b"0.1234", b"0.1235"))
    (reason,) = lay.gate()["reasons"]
    assert reason.startswith("run proj/a (finished) was pulled, but out/metrics.json no longer matches")


def test_a_manifest_that_changed_on_the_box_refuses(lay):
    export = lay.sealed("proj", "a")
    with open(export / "a.manifest.json", "ab") as handle:
        handle.write(b" ")
    (reason,) = lay.gate()["reasons"]
    assert "run proj/a (finished) was pulled, but the manifest on the box changed since" in reason


def test_a_marker_without_instance_id_no_longer_passes(lay):
    lay.sealed("proj", "a")
    doc = json.loads(lay.marker("a").read_text())
    del doc["instance_id"]
    lay.marker("a").write_text(json.dumps(doc))
    (reason,) = lay.gate()["reasons"]
    assert "names no instance (an older marker)" in reason


def test_a_manifest_from_another_instance_refuses_naming_both(lay):
    lay.sealed("proj", "moved", instance_id="pod-elsewhere")
    (reason,) = lay.gate()["reasons"]
    assert reason.startswith("run proj/moved (finished): its manifest was written on instance 'pod-elsewhere', "
                             "not on 'pod-1'")


def test_the_manifest_host_must_be_a_host_of_this_instance(lay):
    lay.sealed("proj", "a", host="stranger")
    (reason,) = lay.gate(hosts=("box",))["reasons"]
    assert "its manifest names host 'stranger', which is not an inventory host of instance 'pod-1' (box)" in reason
    assert lay.gate(hosts=("box", "stranger"))["passed"] is True


def test_failed_and_never_started_runs_do_not_block_and_say_where_their_files_go(lay):
    lay.attempt("proj", "f", "failed", attempt=3)
    (lay.durable / "proj" / "active" / "n").mkdir()
    (lay.durable / "proj" / "active" / "bad name").mkdir()
    verdict = lay.gate()
    assert verdict["passed"] is True
    rows = {r["run_id"]: r for r in verdict["runs"]}
    assert rows["f"]["state"] == "failed" and rows["f"]["attempt"] == 3 and rows["f"]["pull"] == "not pulled"
    assert rows["n"]["state"] == "never"
    # the durable root lies on the profile mount that survives terminate (a network volume)
    assert rows["f"]["note"] == "run proj/f (failed) is not pulled; its files stay on %s, which survives Terminate" \
        % lay.durable.parent
    (other,) = verdict["others"]
    assert other["name"] == "bad name" and "not an rgt run dir" in other["reason"]
    on_root = lay.gate(listings=[lay.box(mounts=[{"path": "/", "survives": []}])])
    assert {r["run_id"]: r for r in on_root["runs"]}["f"]["note"].endswith("its files go with the box: Terminate "
                                                                           "deletes /")


def test_hosts_sharing_the_box_count_each_run_once_and_a_host_that_could_not_look_refuses(lay):
    lay.sealed("proj", "a", host="left")
    lay.sealed("proj", "b", host="right")
    box = lay.box()
    verdict = lay.gate(hosts=("left", "right"), listings=[box, box])
    assert verdict["passed"] is True and [r["run_id"] for r in verdict["runs"]] == ["a", "b"]
    refused = lay.gate(hosts=("left", "right"), listings=[box], unlisted=["right"])
    assert refused["reasons"] == ["host right (instance pod-1) could not list the runs on its box: the gate cannot "
                                  "see the box whole"]
    assert lay.gate(listings=[])["passed"] is False


def test_confirmation_names_the_exact_instance():
    assert rgt_gate.confirmation_problem("pod-1", "pod-1") is None
    assert "does not name this instance" in rgt_gate.confirmation_problem("pod-2", "pod-1")
    assert rgt_gate.confirmation_problem("", "pod-1").startswith("no confirmation")


def test_console_steps_replace_the_call_only_for_a_reversible_verb_without_its_key():
    meter = {"reversible": True, "manual_steps": ["click 关机"], "api": {"client": "autodl_token"}}
    assert rgt_gate.console_instead(meter, key_present=False) is True
    assert rgt_gate.console_instead(meter, key_present=True) is False
    assert rgt_gate.console_instead({**meter, "reversible": False}, key_present=False) is False


def sweep_cell(lay, run_id, reason, sweep="abl", project="p"):
    meta = lay.attempt(project, run_id, reason)
    (meta / "sweep.json").write_text(json.dumps({"sweep": sweep, "sweep_dir": str(lay.durable / project / "sweeps"
                                                                                   / sweep)}))
    return meta


def roster(lay, cells, sweep="abl", project="p"):
    folder = lay.durable / project / "sweeps" / sweep
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "roster.json").write_text(json.dumps({"schema": "rgt/roster/v1", "sweep": sweep,
                                                    "cells": [{"id": c, "host": h} for c, h in cells.items()]}))


def test_a_failed_sweep_cell_is_listed_like_a_failed_run_and_does_not_refuse(lay):
    roster(lay, {"abl--seed=1": "box"})
    sweep_cell(lay, "abl--seed=1", "failed")  # no result to verify (its outputs are missing): listed, not blocking
    gate = lay.gate()
    assert gate["passed"], gate["reasons"]
    (row,) = gate["runs"]
    assert row["state"] == "failed" and row["pull"] == "not pulled" and "is not pulled" in row["note"]


def test_a_cell_its_sweeps_roster_does_not_place_on_this_instance_refuses(lay):
    roster(lay, {"abl--seed=1": "box", "abl--seed=2": "other-box"})
    lay.sealed("p", "abl--seed=1")
    (lay.durable / "p" / "active" / "abl--seed=1" / ".rgt" / "sweep.json").write_text(json.dumps({"sweep": "abl"}))
    assert lay.gate()["passed"], "a verified cell its roster places here passes"
    sweep_cell(lay, "abl--seed=2", None)  # never ran, but on a box the roster does not place it on
    sweep_cell(lay, "abl--seed=9", None)  # no cell of the roster at all
    sweep_cell(lay, "zzz--seed=1", None, sweep="zzz")  # a sweep with no roster on the box
    reasons = " | ".join(lay.gate()["reasons"])
    assert "abl--seed=2 says it is a cell of sweep abl, but the roster places it on host other-box" in reasons
    assert "abl--seed=9 says it is a cell of sweep abl, but the roster" in reasons and "does not name it" in reasons
    assert "zzz--seed=1 says it is a cell of sweep zzz, but that sweep has no roster on the box" in reasons


# ---------------------------------------------------------------- a verified offload of the sealed export

def _offloaded(lay, run_id, target="s3t:b/p/proj/%s/export", sha=None):
    """Run proj/<run_id> sealed, not pulled, with the box's OFFLOAD_VERIFIED.json (rgt_offload.verified_document)."""
    export = lay.sealed("proj", run_id)
    lay.marker(run_id).unlink()
    raw = (export / f"{run_id}.manifest.json").read_bytes()
    doc = {"schema": "rgt/offload-verified/v1", "run_id": run_id, "target": target % run_id, "credentials": [],
           "manifest_sha256": sha or __import__("hashlib").sha256(raw).hexdigest(), "files": 1, "bytes": 1}
    (lay.durable / "proj" / "active" / run_id / "OFFLOAD_VERIFIED.json").write_text(json.dumps(doc))
    return doc


def test_a_verified_offload_of_the_sealed_export_passes_as_a_pull_does_when_the_target_still_holds_it(lay):
    _offloaded(lay, "a")
    lay.sealed("proj", "b")  # pulled and verified
    looked = []
    verdict = lay.gate(offload_check=lambda run: looked.append(run["run_id"]))
    assert verdict["passed"] is True, verdict["reasons"]
    assert looked == ["a"]  # the target is looked at only for the run that is not pulled
    assert {r["run_id"]: r["pull"] for r in verdict["runs"]} == {"a": "export offloaded to s3t:b/p/proj/a/export",
                                                                  "b": "verified"}


def test_an_offload_the_target_no_longer_holds_or_nobody_checked_or_of_another_manifest_refuses(lay):
    _offloaded(lay, "a")
    (reason,) = lay.gate(offload_check=lambda run: "a/out/metrics.json is missing there")["reasons"]
    assert reason == ("run proj/a (finished) is sealed, not pulled (no %s): run `rgt-run pull`; its export offload "
                      "to s3t:b/p/proj/a/export does not hold now: a/out/metrics.json is missing there"
                      % lay.marker("a"))
    (reason,) = lay.gate()["reasons"]
    assert reason.endswith("its export offload to s3t:b/p/proj/a/export was not checked (no rclone on the "
                           "controller)")
    _offloaded(lay, "c", sha="0" * 64)
    reasons = lay.gate(offload_check=lambda run: None)["reasons"]
    assert len(reasons) == 1 and "its export offload to s3t:b/p/proj/c/export is of another manifest" in reasons[0]


def test_checkpoints_offloaded_without_the_export_still_refuse(lay):
    lay.sealed("proj", "a")
    lay.marker("a").unlink()
    (lay.durable / "proj" / "active" / "a" / "offload.jsonl").write_text(json.dumps(
        {"kind": "checkpoint", "name": "step_1", "ok": True, "verified": True}) + "\n")
    verdict = lay.gate(offload_check=lambda run: None)
    assert verdict["passed"] is False and verdict["runs"][0]["pull"] == "sealed, not pulled"


def test_the_teardown_module_rechecks_an_offload_with_the_rclone_it_is_given_and_without_one_refuses(lay,
                                                                                                    monkeypatch):
    from ansible_collections.rgt.remote_gpu.plugins.module_utils import rgt_offload
    from ansible_collections.rgt.remote_gpu.plugins.modules import rgt_teardown

    _offloaded(lay, "a")
    given = []
    monkeypatch.setattr(rgt_offload, "target_check", lambda binary: given.append(binary) or (lambda run: None))
    p = {"confirm": IID, "instance_id": IID, "instance_hosts": ["box"], "host": "box", "box_runs": [lay.box()],
         "runs_dir": str(lay.runs), "profile": PROFILE, "unlisted_hosts": [], "rclone_binary": "/x/rclone"}
    assert rgt_teardown.check_gate(p)["passed"] is True and given == ["/x/rclone"]
    verdict = rgt_teardown.check_gate(dict(p, rclone_binary=None))
    assert verdict["passed"] is False and "was not checked" in verdict["reasons"][0]
