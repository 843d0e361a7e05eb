"""The steps of rgt_launch without Ansible (plugins/module_utils/rgt_launchplan.py, rgt_launchsweep.py, rgt_detach.py):
bad input is refused before the box is touched, the records decide whether a run starts (and with which code and
threads), the layout writes the run's files, and the primitives start a wrapper that outlives its parent. The whole
module, as Ansible runs it, is driven by tests/integration/test_launch_local.py and test_sweep_run.py."""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
from pathlib import Path

import pytest

from ansible_collections.rgt.remote_gpu.plugins.module_utils import rgt_detach
from ansible_collections.rgt.remote_gpu.plugins.module_utils import rgt_launchplan as lp
from ansible_collections.rgt.remote_gpu.plugins.module_utils import rgt_launchsweep as ls
from ansible_collections.rgt.remote_gpu.plugins.module_utils import rgt_runlayout as rl


class Ended(Exception):
    """The module ended (fail_json or exit_json) with `fields`."""

    def __init__(self, failed: bool, fields: dict):
        super().__init__(fields.get("msg"))
        self.failed = failed
        self.fields = fields


class FakeModule:
    """What the steps use of AnsibleModule: params (the module's defaults), check_mode, warn, fail/exit_json."""

    def __init__(self, check_mode: bool = False, **params):
        self.params = dict(project="proj", run_id="run-1", durable_root="/nonexistent", job={}, code_dir=None,
                           use_new_code=True, secrets_file=None, proxy_hook=None, network_env={}, grace_s=30,
                           omp_num_threads=None, disk_floor_gib=1.0, detach="auto", detach_fallback=None,
                           wrapper_src=None, wrapper_bundle=None, relaunch=True,
                           relaunch_failed=False, first_heartbeat_timeout_s=30, sweep=None, queue_bundle=None)
        self.params.update(params)
        self.check_mode = check_mode
        self.warnings: list[str] = []

    def warn(self, msg: str) -> None:
        self.warnings.append(msg)

    def fail_json(self, **fields):
        raise Ended(True, fields)

    def exit_json(self, **fields):
        raise Ended(False, fields)


def job(**extra) -> dict:
    return {"command": "python train.py", "python": sys.executable, **extra}


def refused(module: FakeModule, step, *args) -> dict:
    with pytest.raises(Ended) as info:
        step(module, *args)
    assert info.value.failed
    return info.value.fields


# ---------------------------------------------------------------- 1. validate

@pytest.mark.parametrize("params, field, words", [
    ({"detach": "vast-onstart"}, "detach.primitive", "not built yet"),
    ({"detach": "screen"}, "detach.primitive", "'screen' is not a registered detach primitive"),
    ({"detach": "tmux", "detach_fallback": "vast-onstart"}, "detach.fallback", "not built yet"),
    ({"detach": "k8s-job"}, "detach.primitive", "started from the controller"),
    ({"job": job(slurm=["x"])}, "rgt_job.slurm", "must be a mapping"),
    ({"job": job(slurm={"extra": ["--output=x"]})}, "rgt_job.slurm.extra[0]", "nothing was submitted"),
])
def test_a_bad_primitive_or_slurm_block_is_refused_naming_the_field_before_the_box_is_touched(tmp_path, params,
                                                                                              field, words):
    root = tmp_path / "durable"
    fields = refused(FakeModule(**{"job": job(), "durable_root": str(root), **params}), lp.validate)
    assert fields["field"] == field and fields["rc_hint"] == 2 and fields["changed"] is False
    assert words in fields["msg"]
    assert not root.exists()


@pytest.mark.parametrize("params, words", [
    ({"run_id": "../x"}, "nothing launched: run id '../x'"),
    ({"job": job(env={"BAD-NAME": "1"})}, "nothing launched: rgt_job.env:"),
    ({"network_env": {"1X": "y"}}, "nothing launched: network_env:"),
    ({"job": {"python": sys.executable}}, "rgt_job.command is required"),
    ({"job": job(python="python3")}, "rgt_job.python must be the absolute path"),
])
def test_bad_job_input_is_refused_with_one_message(tmp_path, params, words):
    root = tmp_path / "durable"
    fields = refused(FakeModule(**{"job": job(), "durable_root": str(root), **params}), lp.validate)
    assert fields["msg"].startswith(words), fields["msg"]
    assert not root.exists()


def test_valid_input_gives_the_run_paths_and_the_interpreter(tmp_path):
    root, paths, python = lp.validate(FakeModule(job=job(), durable_root=str(tmp_path)))
    assert root == str(tmp_path) and python == sys.executable
    assert paths.run_dir == str(tmp_path / "proj" / "active" / "run-1")
    assert list(tmp_path.iterdir()) == []  # validating writes nothing


def test_a_sweep_cells_run_dir_is_never_started_alone(tmp_path):
    paths = rl.RunPaths(str(tmp_path), "proj", "abl--lr=1")
    os.makedirs(paths.meta)
    rl.atomic_write_json(os.path.join(paths.meta, "sweep.json"), {"sweep": "abl", "sweep_dir": "/x"})
    fields = refused(FakeModule(), lp.refuse_sweep_cell, paths)
    assert fields["rc_hint"] == 2 and "is a cell of sweep abl" in fields["msg"]
    assert "rgt-run retry -i INVENTORY abl--lr=1" in fields["msg"]
    lp.refuse_sweep_cell(FakeModule(), rl.RunPaths(str(tmp_path), "proj", "plain"))  # no marker: goes on


# ---------------------------------------------------------------- 2. decide

def runpaths(tmp_path: Path, run_id: str = "run-1"):
    paths = rl.RunPaths(str(tmp_path), "proj", run_id)
    for directory in (paths.meta, paths.logs):
        os.makedirs(directory, exist_ok=True)
    return paths


def test_a_finished_run_is_reported_and_a_failed_one_waits_for_a_retry(tmp_path):
    paths = runpaths(tmp_path)
    finished = lp.not_started(paths, "finished", {"attempt": 2}, True, True)
    assert finished["state"] == "finished" and "pass a new rgt_job.run_id" in finished["msg"]
    failed = lp.not_started(paths, "failed", {"attempt": 1, "rc": 3}, True, False)
    assert failed["state"] == "failed" and "failed (attempt 1, rc 3)" in failed["msg"]
    assert "rgt-run retry -i INVENTORY run-1" in failed["msg"]
    killed = lp.not_started(paths, "killed", {"attempt": 1, "rc": 137, "signal": 9}, True, False)
    assert killed["state"] == "failed" and "was killed (attempt 1, SIGKILL (rc 137))" in killed["msg"]
    off = lp.not_started(paths, "preempted", {}, False, False)
    assert off == {"state": "preempted", "msg": "run run-1 is preempted; relaunch is off: nothing started"}
    # what may start: never launched, preempted or dead with relaunch on, failed or killed on a retry
    assert lp.not_started(paths, "never", {}, False, False) is None
    assert lp.not_started(paths, "dead", {}, True, False) is None
    assert lp.not_started(paths, "killed", {"rc": 1}, True, True) is None
    # stopped at its budget: train and watch leave it; a retry (relaunch_failed) starts it
    capped = lp.not_started(paths, "budget_stopped", {"attempt": 1}, True, False)
    assert capped["state"] == "budget_stopped" and "with a higher rgt_job.budget_usd resumes it" in capped["msg"]
    assert lp.not_started(paths, "budget_stopped", {"attempt": 1}, False, True) is None


def test_the_end_line_stands_in_for_a_missing_exit_json_with_a_warning(tmp_path):
    paths = runpaths(tmp_path)
    rl.append_jsonl(paths.attempts, {"attempt": 1, "started_at": "t"})
    rl.append_jsonl(paths.attempts, {"attempt": 1, "ended_at": "u", "rc": 1, "reason": "failed"})
    records = lp.Records(paths)
    end = rl.last_end(records.attempts, records.exit)
    assert records.started() == 1 and end["rc"] == 1
    assert "exit.json of attempt 1 is missing" in lp.missing_exit(paths, records, end)
    rl.atomic_write_json(paths.exit, {"attempt": 1, "rc": 1, "reason": "failed"})
    records = lp.Records(paths)
    assert lp.missing_exit(paths, records, rl.last_end(records.attempts, records.exit)) is None


def test_the_first_result_says_what_the_records_say(tmp_path):
    paths = runpaths(tmp_path)
    rl.atomic_write_json(paths.job, {"code_dir": "/c", "omp_num_threads": 4})
    rl.append_jsonl(paths.attempts, {"attempt": 1, "started_at": "t"})
    result = lp.first_result(paths, lp.Records(paths))
    assert result == {"changed": False, "run_dir": paths.run_dir, "session": "rgt-proj/run-1", "detach": None,
                      "exit": None, "code_dir": "/c", "omp_num_threads": 4, "attempt": 1, "action": "none"}
    rl.atomic_write_json(paths.pid, {"attempt": 1, "wrapper_pid": 42})
    assert lp.running(paths, lp.Records(paths), 1) == {
        "state": "running", "attempt": 1, "pid": 42, "msg": "live run run-1 (attempt 1) is running: not started twice"}


def test_a_relaunch_keeps_its_code_unless_new_code_is_given(tmp_path):
    old, new = tmp_path / "code-old", tmp_path / "code-new"
    old.mkdir()
    new.mkdir()
    params = {"run_id": "run-1", "code_dir": None, "use_new_code": True}
    assert lp.code_dir_of("never", {}, params) == (
        None, "code_dir is required for the first launch of run-1 (the code-<hash8> dir upload_resume shipped)")
    assert lp.code_dir_of("dead", {"code_dir": str(old)}, params) == (str(old), None)
    assert lp.code_dir_of("dead", {"code_dir": str(old)}, dict(params, code_dir=str(new))) == (str(new), None)
    kept = dict(params, code_dir=str(new), use_new_code=False)
    assert lp.code_dir_of("dead", {"code_dir": str(old)}, kept) == (str(old), None)
    assert lp.code_dir_of("never", {"code_dir": str(old)}, kept) == (str(new), None)  # a first launch: no old code
    gone = str(tmp_path / "code-gone")
    assert lp.code_dir_of("never", {}, dict(params, code_dir=gone)) == (
        None, "code_dir %s does not exist on the box (run upload_resume first)" % gone)


def test_omp_threads_come_from_the_option_the_quota_or_the_schedulers_allocation():
    quota = lambda: (250000, 100000)  # noqa: E731 (2.5 CPUs)
    none = lambda: (None, None)  # noqa: E731
    assert lp.omp_threads(None, {}, False, quota=quota) == 2
    assert lp.omp_threads(None, {}, False, quota=none) is None
    assert lp.omp_threads(6, {}, False, quota=quota) == 6
    assert lp.omp_threads(0, {}, False, quota=quota) is None and lp.omp_threads(-1, {}, False) is None
    # a sweep's cells share the box's CPUs, at least one each
    assert lp.omp_threads(8, {}, False, slots=3) == 2 and lp.omp_threads(2, {}, False, slots=4) == 1
    # a scheduler's job: the login node says nothing, the allocation does
    assert lp.omp_threads(6, {"slurm": {"cpus_per_task": 16}}, True, slots=4, quota=quota) == 16
    assert lp.omp_threads(6, {}, True, quota=quota) is None


def test_the_preflight_refuses_a_missing_secrets_file_a_bad_interpreter_and_a_full_disk(tmp_path):
    result = {"run_dir": "r"}
    missing = refused(FakeModule(secrets_file=str(tmp_path / "nope")), lp.preflight, str(tmp_path), sys.executable,
                      result)
    assert missing["msg"].startswith("secrets file") and missing["run_dir"] == "r"
    bad = refused(FakeModule(), lp.preflight, str(tmp_path), str(tmp_path / "python"), result)
    assert "does not exist or is not executable" in bad["msg"]
    full = refused(FakeModule(disk_floor_gib=1e9), lp.preflight, str(tmp_path / "not" / "yet"), sys.executable,
                   result)
    assert full["rc_hint"] == 3 and full["msg"].startswith("DISK_GATE:") and "on %s " % tmp_path in full["msg"]
    secrets = tmp_path / "secrets.env"
    secrets.write_text("A=1\n")
    assert lp.preflight(FakeModule(secrets_file=str(secrets), disk_floor_gib=1e9), str(tmp_path), sys.executable,
                        result, disk_gate=False) == str(secrets)


# ---------------------------------------------------------------- 3. lay out, 4. start, 5. wait

WRAPPER = """import json, os, sys, time
run_dir = sys.argv[1]
meta = os.path.join(run_dir, ".rgt")
job = json.load(open(os.path.join(meta, "job.json")))
with open(os.path.join(meta, "heartbeat"), "w") as f:
    json.dump({"attempt": 1, "ppid": os.getppid(), "sid": os.getsid(0), "pid": os.getpid()}, f)
with open(os.path.join(meta, "pid"), "w") as f:
    json.dump({"attempt": 1, "wrapper_pid": os.getpid()}, f)
with open(os.path.join(meta, "attempts.jsonl"), "a") as f:
    f.write(json.dumps({"attempt": 1, "started_at": "t", "resume_from": "ckpt/step-10"}) + "\\n")
print("wrapper of", job["run_id"], "in", os.getcwd(), flush=True)
"""


def bundle(wrapper):
    """A wrapper bundle as the lookup rgt.remote_gpu.rgt_bundle gives it: the entry and a module_util beside it."""
    return {"name": "wrapper", "entry": "wrapper.py",
            "files": {"wrapper.py": wrapper, "rgt_runlayout.py": "# layout\n"}}


def test_the_layout_installs_the_box_files_and_a_private_job_json(tmp_path):
    paths = rl.RunPaths(str(tmp_path), "proj", "run-1")
    module = FakeModule(job=job(env={"A": "1"}), network_env={"HOME_DIR": "~/x"}, wrapper_bundle=bundle(WRAPPER),
                        proxy_hook="export HTTPS_PROXY=x")
    wrapper = lp.lay_out(module, paths, str(tmp_path), 3, sys.executable, None, {})
    assert wrapper == paths.wrapper and Path(wrapper).read_text() == WRAPPER
    assert os.stat(wrapper).st_mode & 0o777 == 0o755
    assert (Path(paths.meta) / "rgt_runlayout.py").read_text() == "# layout\n"
    for directory in (paths.ckpt, paths.out, paths.logs):
        assert os.path.isdir(directory)
    doc = json.loads(Path(paths.job).read_text())
    assert os.stat(paths.job).st_mode & 0o777 == 0o600  # the proxy hook may carry credentials
    assert doc["env"] == {"HOME_DIR": os.path.expanduser("~/x"), "A": "1"} and doc["omp_num_threads"] == 3
    assert doc["code_dir"] == str(tmp_path) and "rgt_prefixes" in doc
    # without wrapper_bundle or an existing wrapper_src there is nothing to run
    other = rl.RunPaths(str(tmp_path), "proj", "run-2")
    fields = refused(FakeModule(job=job()), lp.lay_out, other, str(tmp_path), None, sys.executable, None, {})
    assert fields["msg"] == "no wrapper at %s (pass wrapper_bundle or wrapper_src)" % other.wrapper


def test_nohup_starts_the_wrapper_in_a_session_of_its_own_and_the_wait_sees_its_heartbeat(tmp_path):
    paths = rl.RunPaths(str(tmp_path), "proj", "run-1")
    module = FakeModule(job=job(), wrapper_bundle=bundle(WRAPPER), first_heartbeat_timeout_s=20)
    wrapper = lp.lay_out(module, paths, str(tmp_path), None, sys.executable, None, {})
    nohup = rgt_detach.get("nohup")
    proc = nohup.start(module, paths, sys.executable, wrapper, {})
    assert proc is not None
    nohup.wait(module, paths, 1, {})  # no queue to wait for: it returns
    lp.wait_first_heartbeat(module, paths, 1, proc, {})
    proc.wait(timeout=20)
    beat = json.loads(Path(paths.heartbeat).read_text())
    assert beat["sid"] == beat["pid"]  # setsid: a session of its own, no hangup reaches it
    assert (Path(paths.logs) / "wrapper.log").read_text() == "wrapper of run-1 in %s\n" % paths.run_dir
    result = lp.started(paths, 1, "relaunch", "nohup")
    assert result["state"] == "running" and result["resume_from"] == "ckpt/step-10"
    assert result["msg"] == "relaunched run-1: attempt 1 under nohup (session -), resuming from ckpt/step-10"


def test_the_wait_fails_soon_with_the_logs_when_the_wrapper_dies_without_a_heartbeat(tmp_path):
    paths = rl.RunPaths(str(tmp_path), "proj", "run-1")
    module = FakeModule(job=job(), wrapper_bundle=bundle("import sys\nprint('boom')\nsys.exit(1)\n"),
                        first_heartbeat_timeout_s=60)
    wrapper = lp.lay_out(module, paths, str(tmp_path), None, sys.executable, None, {})
    proc = rgt_detach.get("nohup").start(module, paths, sys.executable, wrapper, {})
    began = time.time()
    fields = refused(module, lp.wait_first_heartbeat, paths, 1, proc, {"run_dir": paths.run_dir})
    assert time.time() - began < 30  # our own child exited: no need to wait the whole minute
    assert "did not report attempt 1 within 60s" in fields["msg"] and "wrapper.log tail:\nboom" in fields["msg"]


@pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed")
def test_tmux_leaves_a_session_it_did_not_start_alone(tmp_path):
    tmux = shutil.which("tmux")
    session = "rgt-test-%d" % os.getpid()
    env = rgt_detach.tmux_env()
    os.system("%s new-session -d -s %s sleep 60" % (tmux, session))
    try:
        fields = refused(FakeModule(), rgt_detach.get("tmux").spawn, ["true"], str(tmp_path), session, None,
                         "this run's", {"run_dir": "r"})
        assert "already exists and is not this run's (it was not started by rgt)" in fields["msg"]
        assert rgt_detach.tmux_has(tmux, session)  # left alone
    finally:
        os.system("%s kill-session -t =%s" % (tmux, session))
    assert env.get("TMUX") is None


def test_the_primitive_is_chosen_by_what_the_box_has(monkeypatch):
    monkeypatch.setattr(rgt_detach.shutil, "which", lambda name: None)  # no tmux on this box
    module = FakeModule()
    chosen = rgt_detach.choose(module, "auto", None, {})
    assert isinstance(chosen, rgt_detach.Nohup) and "tmux is not installed on the box" in module.warnings[0]
    fields = refused(module, rgt_detach.choose, "tmux", None, {"run_dir": "r"})
    assert fields["msg"].startswith("detach tmux but tmux is not on PATH and the profile names no fallback")
    assert isinstance(rgt_detach.choose(module, "nohup", None, {}), rgt_detach.Nohup)


def test_the_controller_started_primitive_starts_nothing_on_a_box(tmp_path):
    k8s = rgt_detach.get("k8s-job")
    assert k8s.started_by == "rgt.k8s_run.start_k8s_job" and not k8s.scheduler
    with pytest.raises(NotImplementedError):
        k8s.start(FakeModule(), rl.RunPaths(str(tmp_path), "proj", "run-1"), sys.executable, "w", {})
    assert rgt_detach.get("sbatch").scheduler and rgt_detach.get("sbatch").entry.binaries[0] == "sbatch"


# ---------------------------------------------------------------- the sweep's share

def sweep_module(tmp_path: Path, **sweep) -> FakeModule:
    cells = [{"id": "abl--lr=%d" % i, "command": "python train.py --lr %d" % i, "params": {"lr": i}} for i in (1, 2)]
    share = {"name": "abl", "cells": cells, "slots": ["0", "1"], **sweep}
    return FakeModule(job=job(), durable_root=str(tmp_path), sweep=share, detach="nohup")


def test_a_sweep_share_without_cells_or_with_a_bad_name_is_refused(tmp_path):
    fields = refused(sweep_module(tmp_path, name="../x"), ls.Sweep, str(tmp_path))
    assert fields["field"] == "rgt_job.name" and fields["rc_hint"] == 2
    fields = refused(sweep_module(tmp_path, slots=[]), ls.Sweep, str(tmp_path))
    assert fields["msg"] == "nothing launched: sweep abl gives this host no cells or no slots"
    module = sweep_module(tmp_path, retry=["abl--lr=9"])
    sweep = ls.Sweep(module, str(tmp_path))
    assert sweep.dir == str(tmp_path / "proj" / "sweeps" / "abl") and sweep.session == "rgt-proj/abl--queue"
    fields = refused(module, ls.refuse, sweep, ls.first_result(sweep))
    assert fields["field"] == "cell" and "retry names abl--lr=9" in fields["msg"]
    module.params["detach"] = "k8s-job"
    fields = refused(module, ls.refuse, sweep, ls.first_result(sweep))
    assert fields["field"] == "rgt_job.sweep" and "does not run sweeps" in fields["msg"]
    assert list(tmp_path.iterdir()) == []


def test_only_cells_that_may_start_are_laid_out(tmp_path):
    module = sweep_module(tmp_path, retry=[])
    sweep = ls.Sweep(module, str(tmp_path))
    done = rl.RunPaths(str(tmp_path), "proj", "abl--lr=2")
    os.makedirs(done.meta)
    rl.append_jsonl(done.attempts, {"attempt": 1, "started_at": "t"})
    rl.atomic_write_json(done.exit, {"attempt": 1, "rc": 0, "reason": "finished"})
    views = ls.cell_views(module, str(tmp_path), sweep, False, rl.incarnation(), {})
    assert [(c["id"], st, at) for c, _p, st, at in views] == [("abl--lr=1", "never", 0), ("abl--lr=2", "finished", 1)]
    to_write = ls.to_start(views, sweep.retry)
    assert [c["id"] for c, *_ in to_write] == ["abl--lr=1"]
    would = ls.would(sweep, views, to_write, ls.first_result(sweep))
    assert would["msg"] == "would queue 1 cell(s) of sweep abl" and would["state"] == "not_started"
    ls.lay_out(module, sweep, to_write, str(tmp_path), 2, sys.executable, None, {})
    cell = rl.RunPaths(str(tmp_path), "proj", "abl--lr=1")
    doc = json.loads(Path(cell.job).read_text())
    assert doc["sweep"] == {"name": "abl", "dir": sweep.dir, "params": {"lr": 1}} and doc["omp_num_threads"] == 2
    assert doc["command"] == "python train.py --lr 1" and doc["run_id"] == "abl--lr=1"
    assert json.loads((Path(cell.meta) / "sweep.json").read_text()) == {"sweep": "abl", "sweep_dir": sweep.dir}
    assert not os.path.exists(done.job)  # a finished cell is never touched
    assert ls.sweep_state({"finished": 2}, 2, True) == "finished"
    assert ls.sweep_state({"finished": 1, "queued": 1}, 2, False) == "running"
    assert ls.sweep_state({"finished": 1, "dead": 1}, 2, True) == "dead"


def test_a_sweep_cell_moved_away_is_never_started_by_this_boxs_launch(tmp_path):
    views = []
    for cell_id in ("abl--seed=1", "abl--seed=2"):
        paths = rl.RunPaths(str(tmp_path), "proj", cell_id)
        os.makedirs(paths.meta)
        rl.atomic_write_json(paths.job, {"command": "true", "env": {}})
        views.append(({"id": cell_id}, paths, "preempted", 1))
    rl.atomic_write_json(os.path.join(views[0][1].meta, rl.MOVED_MARK), {"moved_to": "b", "generation": 2})
    assert [c["id"] for c, _p, _s, _a in ls.to_start(views, set())] == ["abl--seed=2"]
