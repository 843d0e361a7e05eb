"""Pure parts of the job wrapper (roles/launch_detached/files/rgt_wrapper.py) and of the rgt_launch module:
attempt numbering, exit reason classification, the job environment and script, resume selection."""

import errno
import importlib.util
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
WRAPPER = REPO / "roles" / "launch_detached" / "files" / "rgt_wrapper.py"


def _load():
    spec = importlib.util.spec_from_file_location("rgt_wrapper", WRAPPER)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


w = _load()
rl = w.rl


@pytest.fixture
def paths(tmp_path):
    p = w.paths_for(str(tmp_path / "durable" / "proj" / "active" / "run-1"))
    for d in (p.meta, p.ckpt, p.out, p.logs):
        os.makedirs(d)
    return p


# ---------------------------------------------------------------- attempts

def test_paths_for_recovers_root_project_and_run_id(tmp_path):
    p = w.paths_for(str(tmp_path / "d" / "proj" / "active" / "r.1"))
    assert (p.durable_root, p.project, p.run_id) == (str(tmp_path / "d"), "proj", "r.1")
    assert p.lock.endswith("/.rgt/lock") and p.session() == "rgt-proj/r+1"


def test_sessions_map_one_to_one_to_runs(tmp_path):
    """tmux turns '.' into '_': `sess.x` and `sess_x` (and the same id in two projects) get distinct sessions."""
    names = {w.paths_for(str(tmp_path / "d" / proj / "active" / rid)).session()
             for proj in ("p", "p.q", "p_q") for rid in ("sess.x", "sess_x", "sess-x")}
    assert len(names) == 9 and not any("." in n or ":" in n for n in names)


@pytest.mark.parametrize("run_id", [".", "..", "a\n", ".partial", "-x", "x" * 129])
def test_run_dirs_with_a_bad_run_id_are_refused(tmp_path, run_id):
    with pytest.raises(ValueError, match="run id"):
        w.paths_for(str(tmp_path / "d" / "proj" / "active") + "/" + run_id)


def test_next_attempt_counts_start_lines_only():
    assert w.next_attempt([]) == 1
    records = [{"attempt": 1, "started_at": "t"}, {"attempt": 1, "ended_at": "t", "reason": "preempted"},
               {"attempt": 2, "started_at": "t"}]
    assert w.next_attempt(records) == 3
    assert w.next_attempt([{"attempt": 1, "ended_at": "t"}]) == 1


def test_unfinished_attempts_are_starts_without_an_end():
    records = [{"attempt": 1, "started_at": "t"}, {"attempt": 1, "ended_at": "t"},
               {"attempt": 2, "started_at": "t"}]
    assert w.unfinished_attempts(records) == [2]
    assert w.unfinished_attempts(records + [{"attempt": 2, "ended_at": None}]) == []


# ---------------------------------------------------------------- classification

@pytest.mark.parametrize("rc, stop, expected", [
    (0, None, ("finished", None)),
    (1, None, ("failed", None)),
    (3, None, ("failed", None)),
    (137, None, ("killed", 9)),          # bash runs the command: 128+9 is how it reports a SIGKILLed command
    (143, "SIGTERM", ("preempted", 15)),  # the command died of the forwarded TERM
    (200, None, ("failed", None)),       # beyond 128+64: an exit code
    (-9, None, ("killed", 9)),           # OOM killer / SIGKILL
    (-15, None, ("killed", 15)),
    (0, "SIGTERM", ("preempted", None)),  # the job checkpointed and exited 0 on the forwarded TERM
    (1, "SIGHUP", ("preempted", None)),
    (-9, "SIGTERM", ("preempted", 9)),   # SIGKILLed after the grace window: still a preemption
])
def test_classify(rc, stop, expected):
    assert w.classify(rc, stop) == expected


def test_signal_name():
    assert w.signal_name(signal.SIGTERM) == "SIGTERM" and w.signal_name(signal.SIGHUP) == "SIGHUP"


# ---------------------------------------------------------------- environment and script

def test_build_env_sets_the_contract_and_rgt_vars_win(paths):
    job = {"run_id": "run-1", "omp_num_threads": 4,
           "env": {"HF_HOME": "/scratch/hf", "RGT_ATTEMPT": "999", "PYTHONUNBUFFERED": "0", "EMPTY": None}}
    base = {"PATH": "/usr/bin", "TMUX": "/tmp/tmux-0/default,1,0", "TMUX_PANE": "%1"}
    env = w.build_env(job, paths, 2, "/x/ckpt/step_10.ckpt", base)
    assert env["RGT_RUN_ID"] == "run-1" and env["RGT_ATTEMPT"] == "2"
    assert env["RGT_RUN_DIR"] == paths.run_dir and env["RGT_CKPT_DIR"] == paths.ckpt
    assert env["RGT_OUT_DIR"] == paths.out and env["RGT_PREEMPT_FILE"] == paths.preempt
    assert env["RGT_RESUME_FROM"] == "/x/ckpt/step_10.ckpt"
    assert env["OMP_NUM_THREADS"] == "4" and env["HF_HOME"] == "/scratch/hf" and env["EMPTY"] == ""
    assert env["PYTHONUNBUFFERED"] == "0"  # the job's own env may override the defaults, never RGT_*
    assert env["PATH"] == "/usr/bin" and "TMUX" not in env and "TMUX_PANE" not in env
    assert base["TMUX"]  # the caller's dict is not modified


def test_build_env_without_resume_or_threads(paths):
    env = w.build_env({}, paths, 1, None, {})
    assert env["RGT_RESUME_FROM"] == "" and "OMP_NUM_THREADS" not in env
    assert env["RGT_RUN_ID"] == "run-1" and env["PYTHONUNBUFFERED"] == "1"


def test_build_script_skips_null_parts_and_quotes_paths():
    tail = ["set -o pipefail", "trap 'exit $?' TERM INT HUP"]
    assert w.build_script({"command": "python train.py"}).splitlines() == tail + ["python train.py"]
    script = w.build_script({"command": "python train.py --x 1", "proxy_hook": "source /etc/network_turbo",
                             "secrets_file": "/root/my secrets/p.env", "code_dir": "/d/code-abc"})
    assert script.splitlines() == ["source /etc/network_turbo",
                                   "set -a; . '/root/my secrets/p.env' || exit 98; set +a",
                                   "cd /d/code-abc || exit 97", *tail, "python train.py --x 1"]


@pytest.mark.parametrize("command, rc, out", [
    ("echo a && echo b", 0, "a\nb\n"),
    ("echo a; false", 1, "a\n"),
    ("false; echo after", 0, "after\n"),
    ("false | cat", 1, ""),                      # pipefail: a failing trainer piped into tee is not finished
    ("echo one\necho two\nexit 3", 3, "one\ntwo\n"),
])
def test_the_command_runs_whole_and_its_status_is_the_lines(tmp_path, command, rc, out):
    proc = subprocess.run(["bash", "-c", w.build_script({"command": command, "code_dir": str(tmp_path)})],
                          capture_output=True, text=True)
    assert (proc.returncode, proc.stdout) == (rc, out)


def test_script_sources_secrets_without_putting_values_in_argv(tmp_path):
    secrets = tmp_path / "s.env"
    secrets.write_text("TOKEN='abc-secret-123'\n")
    script = w.build_script({"command": "printenv TOKEN", "secrets_file": str(secrets), "code_dir": str(tmp_path)})
    assert "abc-secret-123" not in script
    out = subprocess.run(["bash", "-c", script], capture_output=True, text=True, env={"PATH": os.environ["PATH"]})
    assert out.stdout.strip() == "abc-secret-123"


def test_script_stops_when_the_secrets_file_or_code_dir_is_missing(tmp_path):
    missing = w.build_script({"command": "true", "secrets_file": str(tmp_path / "nope.env")})
    assert subprocess.run(["bash", "-c", missing], capture_output=True).returncode == 98
    nodir = w.build_script({"command": "true", "code_dir": str(tmp_path / "nodir")})
    assert subprocess.run(["bash", "-c", nodir], capture_output=True).returncode == 97


# ---------------------------------------------------------------- resume selection

def _touch(path, mtime):
    Path(path).write_bytes(b"x")
    os.utime(path, (mtime, mtime))


def test_select_resume_newest_complete_matching_checkpoint(paths):
    now = time.time()
    assert w.select_resume({}, paths) is None
    _touch(os.path.join(paths.ckpt, "step_10.ckpt"), now - 30)
    _touch(os.path.join(paths.ckpt, "step_20.ckpt"), now - 20)
    _touch(os.path.join(paths.ckpt, "step_30.ckpt.tmp"), now - 1)   # being written: never complete
    _touch(os.path.join(paths.ckpt, ".step_40.ckpt"), now)          # hidden: never complete
    _touch(os.path.join(paths.ckpt, "notes.txt"), now - 5)
    assert w.select_resume({"ckpt_glob": "*.ckpt"}, paths).endswith("step_20.ckpt")
    assert w.select_resume({}, paths).endswith("notes.txt")  # default glob "*"
    _touch(os.path.join(paths.ckpt, "step_05.ckpt"), now - 20)      # same mtime: the name breaks the tie
    assert w.select_resume({"ckpt_glob": "step_*"}, paths).endswith("step_20.ckpt")


def test_gpu_rows_keep_well_formed_lines():
    text = "0, 97, 40000, 81920, 65\n1, 0, 3, 81920, 33\n\nNo devices were found\n"
    assert w.gpu_rows(text, 100.4) == ["100,0,97,40000,81920,65", "100,1,0,3,81920,33"]
    assert w.gpu_rows("", 1) == []


# ---------------------------------------------------------------- previous attempt bookkeeping

def test_close_previous_folds_exit_json_and_marks_vanished_attempts(paths):
    from ansible_collections.rgt.remote_gpu.plugins.module_utils import rgt_runlayout as rl

    rl.append_jsonl(paths.attempts, {"attempt": 1, "started_at": "a"})
    rl.append_jsonl(paths.attempts, {"attempt": 2, "started_at": "b"})
    rl.atomic_write_json(paths.exit, {"attempt": 2, "rc": 0, "signal": None, "reason": "preempted",
                                      "ended_at": "c", "stop_signal": "SIGTERM"})
    Path(paths.preempt).write_text("SIGTERM\n")
    rl.atomic_write_json(paths.heartbeat, {"ts": 86400.0, "attempt": 1, "job_alive": True})
    wrapper = w.Wrapper(paths.run_dir)
    wrapper.close_previous(rl.read_jsonl(paths.attempts))
    ends = [r for r in rl.read_jsonl(paths.attempts) if "ended_at" in r]
    assert sorted((r["attempt"], r["reason"]) for r in ends) == [(1, "dead"), (2, "preempted")]
    assert [r["ended_at"] for r in ends if r["attempt"] == 1] == ["1970-01-02T00:00:00Z"]  # last heartbeat
    assert not os.path.exists(paths.exit) and not os.path.exists(paths.preempt)
    assert w.next_attempt(rl.read_jsonl(paths.attempts)) == 3


def test_wrapper_refuses_a_second_instance(paths):
    first = w.Wrapper(paths.run_dir)
    assert first.take_lock() is True
    out = subprocess.run([sys.executable, str(WRAPPER), paths.run_dir], capture_output=True, text=True,
                         timeout=10, env={**os.environ, "PYTHONPATH": str(REPO / ".collections")})
    assert out.returncode == 0 and "already running" in out.stdout
    first.lock_handle.close()


# ---------------------------------------------------------------- the module's pure helpers

def test_module_helpers():
    from ansible_collections.rgt.remote_gpu.plugins.modules import rgt_launch as m

    assert m.omp_from_quota(None, 100000) is None
    assert m.omp_from_quota(250000, 100000) == 2
    assert m.omp_from_quota(50000, 100000) == 1
    assert m.expand_env({"A": "~/x", "B": None, "C": "a~b"}) == {"A": os.path.expanduser("~/x"), "B": "",
                                                                   "C": "a~b"}


# ---------------------------------------------------------------- how a run that is not live ended (launch)

def test_last_state_from_the_exit_record():
    assert rl.last_state([], None) == "never"
    starts = [{"attempt": 1, "started_at": "t"}]
    assert rl.last_state(starts, None) == "dead"
    assert rl.last_state(starts, {"attempt": 1, "reason": "finished"}) == "finished"
    assert rl.last_state(starts + [{"attempt": 2, "started_at": "t"}], {"attempt": 1, "reason": "preempted"}) == "dead"


def test_last_state_falls_back_to_the_attempts_end_line_when_exit_json_is_missing():
    """A wrapper on a full disk wrote the end line but not exit.json: the run failed (never relaunched without the
    user's word), it did not vanish."""
    records = [{"attempt": 1, "started_at": "t"},
               {"attempt": 1, "ended_at": "u", "rc": 1, "signal": None, "reason": "failed"}]
    assert rl.last_state(records, None) == "failed"
    assert rl.last_end(records, None)["rc"] == 1
    # exit.json of an older attempt: the newer attempt's end line decides
    older = {"attempt": 1, "rc": 0, "reason": "preempted"}
    records2 = [{"attempt": 1, "started_at": "t"}, {"attempt": 1, "ended_at": "u", "reason": "preempted"},
                {"attempt": 2, "started_at": "v"}, {"attempt": 2, "ended_at": "w", "rc": 0, "reason": "finished"}]
    assert rl.last_state(records2, older) == "finished"
    # the end line of an older attempt says nothing about the last one: it vanished
    assert rl.last_state(records2[:3], older) == "dead" and rl.last_end(records2[:3], older) is None
    # a `dead` note written by a later wrapper stays dead (relaunched)
    noted = [{"attempt": 1, "started_at": "t"}, {"attempt": 1, "ended_at": None, "reason": "dead"}]
    assert rl.last_state(noted, None) == "dead"


# ---------------------------------------------------------------- a full disk never kills the wrapper

def test_guarded_write_releases_the_reserve_once_and_never_raises(paths):
    wrapper = w.Wrapper(paths.run_dir)
    assert wrapper.make_reserve() and os.path.getsize(wrapper.reserve) == w.RESERVE_BYTES
    calls = []

    def full_then_ok():
        calls.append(os.path.exists(wrapper.reserve))
        if len(calls) == 1:
            raise OSError(errno.ENOSPC, "No space left on device")

    assert wrapper.guarded("exit.json", full_then_ok) is True
    assert calls == [True, False]  # the retry ran after the reserve was released

    def always_full():
        raise OSError(errno.EDQUOT, "Disk quota exceeded")

    assert wrapper.guarded("exit.json", always_full) is False  # no reserve left: named, not raised


def test_end_lines_start_on_a_line_of_their_own(paths):
    wrapper = w.Wrapper(paths.run_dir)
    Path(paths.log).write_bytes(b"step=3 loss=0.5\r50%|#####")  # a progress bar without a newline
    wrapper.append_line(paths.log, "== rgt attempt 1 ended x reason=failed rc=1\n")
    assert Path(paths.log).read_bytes().endswith(b"#####\n== rgt attempt 1 ended x reason=failed rc=1\n")
    Path(paths.attempts).write_text('{"attempt": 1, "started_at": "t"}\n{"attempt": 1, "ende')  # torn
    wrapper.append_record({"attempt": 1, "ended_at": "u", "rc": 1, "signal": None, "reason": "failed"})
    assert rl.read_jsonl(paths.attempts)[-1]["reason"] == "failed"


# ---------------------------------------------------------------- a container's entrypoint (Kubernetes Job)

def test_the_container_variable_is_the_one_the_job_manifest_sets():
    from ansible_collections.rgt.remote_gpu.plugins.module_utils import rgt_k8s

    assert w.CONTAINER_ENV == rgt_k8s.ENTRYPOINT_ENV


def _container_run(paths, command, stop_after=None):
    code = Path(paths.run_dir) / "code"
    code.mkdir(exist_ok=True)
    rl.atomic_write_json(paths.job, {"schema": 1, "run_id": paths.run_id, "project": paths.project,
                                     "run_dir": paths.run_dir, "command": command, "python": sys.executable,
                                     "code_dir": str(code), "env": {}, "grace_s": 5, "heartbeat_interval_s": 1})
    proc = subprocess.Popen([sys.executable, str(WRAPPER), paths.run_dir], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE,
                            env={**os.environ, w.CONTAINER_ENV: "1", "PYTHONPATH": str(REPO / ".collections")})
    if stop_after is not None:
        deadline = time.time() + 10
        while not os.path.exists(paths.pid) and time.time() < deadline:
            time.sleep(0.05)
        time.sleep(stop_after)
        proc.send_signal(signal.SIGTERM)  # the kubelet's stop: SIGTERM to PID 1, then the grace period
    out, err = proc.communicate(timeout=30)
    return proc.returncode, out.decode(), err.decode()


@pytest.mark.parametrize("command, rc, reason", [("echo hello; echo world", 0, "finished"),
                                                 ("echo hello; echo world; exit 3", 3, "failed")])
def test_as_a_container_entrypoint_the_log_goes_to_stdout_and_the_exit_code_is_the_outcome(paths, command, rc,
                                                                                            reason):
    code, out, err = _container_run(paths, command)
    assert code == rc, err
    lines = out.splitlines()
    assert lines[0].startswith("== rgt attempt 1 started") and lines[1:3] == ["hello", "world"]
    assert lines[-1].startswith("== rgt attempt 1 ended") and f"reason={reason}" in lines[-1]
    assert rl.read_json(paths.exit)["reason"] == reason


def test_a_stopped_container_entrypoint_exits_128_plus_the_signal_even_when_the_job_exits_cleanly(paths):
    code, out, err = _container_run(paths, "trap 'echo saving; exit 0' TERM; echo started; sleep 30 & wait", 0.5)
    assert code == 128 + signal.SIGTERM, err
    assert "started" in out and "saving" in out and "reason=preempted" in out
    assert rl.read_json(paths.exit)["reason"] == "preempted"


def test_without_the_container_variable_the_wrapper_prints_no_log_and_exits_0(paths):
    code = Path(paths.run_dir) / "code"
    code.mkdir()
    rl.atomic_write_json(paths.job, {"schema": 1, "run_id": paths.run_id, "project": paths.project,
                                     "run_dir": paths.run_dir, "command": "echo hello; exit 3",
                                     "python": sys.executable, "code_dir": str(code), "env": {}})
    env = {k: v for k, v in os.environ.items() if k != w.CONTAINER_ENV}
    env["PYTHONPATH"] = str(REPO / ".collections")
    out = subprocess.run([sys.executable, str(WRAPPER), paths.run_dir], capture_output=True, text=True, env=env,
                         timeout=30)
    assert out.returncode == 0 and "hello" not in out.stdout
