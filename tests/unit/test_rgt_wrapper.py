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


def test_next_attempt_goes_on_from_the_attempts_a_moved_run_had_before():
    assert w.next_attempt([], rl.attempts_before({"env": {"RGT_ATTEMPTS_BEFORE": "3"}})) == 4
    assert w.next_attempt([{"attempt": 4, "started_at": "t"}], 3) == 5
    assert rl.attempts_before({"env": {"RGT_ATTEMPTS_BEFORE": "x"}}) == 0 and rl.attempts_before({}) == 0


def test_unfinished_attempts_are_starts_without_an_end():
    records = [{"attempt": 1, "started_at": "t"}, {"attempt": 1, "ended_at": "t"},
               {"attempt": 2, "started_at": "t"}]
    assert w.unfinished_attempts(records) == [2]
    assert w.unfinished_attempts(records + [{"attempt": 2, "ended_at": None}]) == []


# ---------------------------------------------------------------- classification

@pytest.mark.parametrize("rc, stop, requested, expected", [
    (0, None, False, ("finished", None)),
    (1, None, False, ("failed", None)),
    (3, None, False, ("failed", None)),
    (137, None, False, ("killed", 9)),         # bash runs the command: 128+9 is how it reports a SIGKILLed command
    (139, None, False, ("killed", 11)),        # a segfault
    (-9, None, False, ("killed", 9)),          # OOM killer / SIGKILL
    (200, None, False, ("failed", None)),      # beyond 128+64: an exit code
    (143, "SIGTERM", False, ("preempted", 15)),  # the command died of the forwarded TERM
    (0, "SIGTERM", True, ("preempted", None)),   # the job checkpointed and exited 0 on the forwarded TERM
    (1, "SIGHUP", True, ("preempted", None)),
    (-9, "SIGTERM", True, ("preempted", 9)),   # SIGKILLed after the grace window: still a preemption
    # only the job's own processes got the stop signal (a container stop, `kill` of its pid): the job died of it,
    # or caught it, checkpointed and exited 128+n as the convention says
    (143, None, False, ("preempted", 15)),
    (130, None, False, ("preempted", 2)),
    (129, None, False, ("preempted", 1)),
    (-15, None, False, ("preempted", 15)),
    (-2, None, False, ("preempted", 2)),
    # RGT_PREEMPT_FILE appeared (a platform hook, the user): a stop was asked for, whatever the job did then
    (0, None, True, ("preempted", None)),
    (1, None, True, ("preempted", None)),
    (137, None, True, ("preempted", 9)),
])
def test_classify(rc, stop, requested, expected):
    assert w.classify(rc, stop, requested) == expected


def test_the_budget_marker_with_the_preempt_file_is_budget_stopped_and_alone_is_nothing():
    assert w.classify(0, None, True, budget_stop=True) == ("budget_stopped", None)
    assert w.classify(143, "SIGTERM", True, budget_stop=True) == ("budget_stopped", 15)
    assert w.classify(0, None, False, budget_stop=True) == ("finished", None)  # no stop was asked of the job
    assert w.container_exit("budget_stopped", 0, None) == 143


def test_a_stop_of_the_job_alone_exits_the_container_with_its_signal():
    assert w.container_exit("preempted", 143, 15) == 143
    assert w.container_exit("preempted", 130, 2) == 130
    assert w.container_exit("preempted", 0, None) == 143  # RGT_PREEMPT_FILE: SIGTERM's code
    assert w.container_exit("preempted", 0, None, "SIGINT") == 130


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


def _venv(root):
    """A directory that reads as a virtual environment (a pyvenv.cfg at its top), with a bin/ dir."""
    (root / "bin").mkdir(parents=True)
    (root / "pyvenv.cfg").write_text("home = /usr/bin\n")
    return root


def test_the_job_env_carries_nothing_of_rgts_own_and_the_declared_interpreter_comes_first(paths, tmp_path):
    rgt = _venv(tmp_path / "rgt-venv")
    declared = _venv(tmp_path / "proj-env") / "bin" / "python"
    base = {"PATH": os.pathsep.join([str(rgt / "bin"), "/usr/local/bin", str(declared.parent), "/usr/bin"]),
            "VIRTUAL_ENV": str(rgt), "PYTHONPATH": os.pathsep.join([str(rgt / "lib"), "/opt/mine"]),
            "PYTHONHOME": str(rgt), "ANSIBLE_CONFIG": "/x/ansible.cfg", "ANSIBLE_FORCE_COLOR": "0",
            "AWX_ISOLATED_DATA_DIR": "/tmp/a", "RUNNER_OMIT_EVENTS": "False", "RGT_RUNNER_PREFIX": str(rgt),
            "TMUX": "/tmp/tmux-0/default,1,0", "HOME": "/root", "LANG": "C.UTF-8"}
    job = {"python": str(declared), "rgt_prefixes": [str(rgt)], "env": {"ANSIBLE_NOCOLOR": "1"}}
    env = w.build_env(job, paths, 1, None, base)
    assert env["PATH"].split(os.pathsep) == [str(declared.parent), "/usr/local/bin", "/usr/bin"]
    assert env["PYTHONPATH"] == "/opt/mine"
    for name in ("VIRTUAL_ENV", "PYTHONHOME", "ANSIBLE_CONFIG", "ANSIBLE_FORCE_COLOR", "AWX_ISOLATED_DATA_DIR",
                 "RUNNER_OMIT_EVENTS", "RGT_RUNNER_PREFIX", "TMUX"):
        assert name not in env, name
    assert env["HOME"] == "/root" and env["LANG"] == "C.UTF-8"
    assert env["ANSIBLE_NOCOLOR"] == "1"  # the job's own env may name one
    assert base["ANSIBLE_CONFIG"]  # the caller's dict is not modified


def test_a_declared_interpreter_inside_rgts_own_venv_keeps_it(paths, tmp_path):
    """The local demo runs the job with rgt's own interpreter, declared: its venv is then the job's."""
    rgt = _venv(tmp_path / "rgt-venv")
    base = {"PATH": os.pathsep.join(["/usr/bin", str(rgt / "bin")]), "VIRTUAL_ENV": str(rgt)}
    env = w.build_env({"python": str(rgt / "bin" / "python"), "rgt_prefixes": [str(rgt)]}, paths, 1, None, base)
    assert env["PATH"].split(os.pathsep) == [str(rgt / "bin"), "/usr/bin"] and env["VIRTUAL_ENV"] == str(rgt)


def test_a_system_interpreter_is_never_rgts_own(tmp_path, monkeypatch):
    """rgt's own prefixes are virtual environments only: a system prefix named by mistake strips nothing."""
    rgt = _venv(tmp_path / "rgt-venv")
    monkeypatch.setattr(rl.sys, "prefix", "/usr")
    assert rl.own_prefixes({rl.RUNNER_PREFIX_ENV: "/usr"}) == []
    assert rl.own_prefixes({rl.RUNNER_PREFIX_ENV: str(rgt)}) == [str(rgt)]
    monkeypatch.setattr(rl.sys, "prefix", str(rgt))
    assert rl.own_prefixes({}) == [str(rgt)]
    env = rl.job_base_env({"PATH": "/usr/bin:/bin"}, "/usr/bin/python3", rl.own_prefixes({}))
    assert env["PATH"] == "/usr/bin:/bin"


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
    from ansible_collections.rgt.remote_gpu.plugins.module_utils import rgt_launchplan as m

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


# ---------------------------------------------------------------- a stop that reaches the job alone

STOPPABLE_JOB = r"""
import os, signal, sys, time
def save(rc):
    with open(os.path.join(os.environ["RGT_CKPT_DIR"], "step_3.ckpt"), "w") as handle:
        handle.write("3")
    sys.exit(rc)
signal.signal(signal.SIGTERM, lambda *_: save(143))  # checkpoint, then exit 128+15 as the convention says
print("ready", sys.executable, flush=True)
for _ in range(600):
    if os.path.exists(os.environ["RGT_PREEMPT_FILE"]):
        save(0)
    time.sleep(0.05)
sys.exit(1)
"""


def _start_wrapper(paths):
    code = Path(paths.run_dir) / "code"
    code.mkdir()
    (code / "job.py").write_text(STOPPABLE_JOB)
    rl.atomic_write_json(paths.job, {"schema": 1, "run_id": paths.run_id, "project": paths.project,
                                     "run_dir": paths.run_dir, "command": "python job.py", "python": sys.executable,
                                     "code_dir": str(code), "env": {}, "grace_s": 5, "heartbeat_interval_s": 1})
    env = {k: v for k, v in os.environ.items() if k != w.CONTAINER_ENV}
    env["PYTHONPATH"] = str(REPO / ".collections")
    proc = subprocess.Popen([sys.executable, str(WRAPPER), paths.run_dir], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env=env)
    deadline = time.time() + 20
    while "ready" not in (Path(paths.log).read_text() if os.path.exists(paths.log) else ""):
        assert time.time() < deadline and proc.poll() is None, "the job never started"
        time.sleep(0.05)
    return proc


def test_a_job_that_checkpoints_and_exits_143_on_its_own_sigterm_is_preempted(paths):
    """Only the job's processes get SIGTERM (not the wrapper): the job saves and exits 143; that is a stop."""
    proc = _start_wrapper(paths)
    os.killpg(rl.read_json(paths.pid)["pgid"], signal.SIGTERM)
    proc.communicate(timeout=30)
    done = rl.read_json(paths.exit)
    assert (done["reason"], done["rc"], done["signal"], done["stop_signal"]) == ("preempted", 143, 15, None)
    assert os.path.exists(os.path.join(paths.ckpt, "step_3.ckpt"))
    assert rl.last_state(rl.read_jsonl(paths.attempts), done) == "preempted" and rl.may_start("preempted")
    # `python` in the command is the declared interpreter
    assert "ready %s" % sys.executable in Path(paths.log).read_text()


def test_a_job_that_stops_when_the_preempt_file_appears_is_preempted_not_finished(paths):
    proc = _start_wrapper(paths)
    Path(paths.preempt).write_text("spot notice\n")  # a platform hook asks the job to stop
    proc.communicate(timeout=30)
    done = rl.read_json(paths.exit)
    assert (done["reason"], done["rc"], done["stop_signal"]) == ("preempted", 0, None)
    assert "reason=preempted rc=0" in Path(paths.log).read_text()


@pytest.mark.parametrize("state, retry, starts", [
    ("never", False, True), ("preempted", False, True), ("dead", False, True),
    ("failed", False, False), ("killed", False, False), ("failed", True, True), ("killed", True, True),
    ("finished", False, False), ("finished", True, False),
])
def test_what_starts_a_run_again_is_one_rule(state, retry, starts):
    """A failed or killed run (status: failed) starts again only on a retry; preempted and dead ones always."""
    assert rl.may_start(state, retry) is starts


# ---------------------------------------------------------------- the launch module refuses before it writes

def _launch(tmp_path, job, **params):
    """rgt_launch run as Ansible runs it (its arguments in a file), on this machine; (rc, its JSON result)."""
    import json

    args = tmp_path / "args.json"
    args.write_text(json.dumps({"ANSIBLE_MODULE_ARGS": {
        "durable_root": str(tmp_path / "durable"), "project": "proj", "run_id": "run-1",
        "job": {"command": "true", "python": sys.executable, **job}, "code_dir": str(tmp_path), **params}}))
    proc = subprocess.run([sys.executable, str(REPO / "plugins" / "modules" / "rgt_launch.py"), str(args)],
                          capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PYTHONPATH": str(REPO / ".collections")})
    return proc.returncode, json.loads(proc.stdout)


def test_the_launch_refuses_a_slurm_extra_option_rgt_passes_before_anything_is_written(tmp_path):
    rc, result = _launch(tmp_path, {"slurm": {"extra": ["--constraint=a100", "-J", "mine"]}}, detach="nohup")
    assert rc != 0 and result["rc_hint"] == 2 and result["field"] == "rgt_job.slurm.extra[1]"
    assert "--job-name (-J)" in result["msg"] and "nothing was submitted" in result["msg"]
    assert not (tmp_path / "durable").exists()


def test_the_launch_never_starts_a_sweep_cells_run_dir_alone(tmp_path):
    meta = tmp_path / "durable" / "proj" / "active" / "run-1" / ".rgt"
    meta.mkdir(parents=True)
    (meta / "sweep.json").write_text('{"sweep": "abl", "sweep_dir": "/x"}')
    rc, result = _launch(tmp_path, {}, detach="nohup")
    assert rc != 0 and result["rc_hint"] == 2 and "is a cell of sweep abl" in result["msg"]
    assert sorted(p.name for p in meta.iterdir()) == ["sweep.json"]
