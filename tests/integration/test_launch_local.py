"""The launch_detached role, run for real with ansible-playbook against localhost (connection local).

The job is examples/tiny_train (a deterministic CPU trainer that checkpoints, resumes from $RGT_RESUME_FROM and
stops cleanly on SIGTERM). Each test gets a temp durable root and its own tmux server (TMUX_TMPDIR), and every
wrapper, job and tmux server it started is killed at the end (by pid, never by name).
"""

import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import yaml
from clihelp import end_local_runs, procs_with, read_json, wait_for

from ansible_collections.rgt.remote_gpu.plugins.module_utils import rgt_bundle

REPO = Path(__file__).resolve().parents[2]
COLLECTIONS = REPO / ".collections"
ANSIBLE_PLAYBOOK = REPO / ".venv" / "bin" / "ansible-playbook"
TINY = REPO / "examples" / "tiny_train" / "train.py"
PROJECT = "demo"
SECRET = "abc-secret-123"

pytestmark = [
    pytest.mark.skipif(not ANSIBLE_PLAYBOOK.exists(), reason="needs .venv with ansible-core"),
    pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash"),
]

PLAYBOOK = """
- name: launch_detached on this machine
  hosts: box
  gather_facts: false
  environment: "{{ play_env | default({}) }}"
  tasks:
    - name: Run the role, keep the module's result whatever happens
      block:
        - name: launch_detached
          ansible.builtin.include_role:
            name: rgt.remote_gpu.launch_detached
      always:
        - name: Save the result for the test
          ansible.builtin.copy:
            content: "{{ launch_detached_result | default({}) | to_nice_json }}"
            dest: "{{ report_path }}"
            mode: "0644"
          changed_when: false
          check_mode: false
"""


def tiny_command(steps=40, ckpt_every=10, sleep=0.05, seed=1234):
    return "%s train.py --steps %d --ckpt-every %d --sleep %s --seed %d" % (
        sys.executable, steps, ckpt_every, sleep, seed)


def read_json_lines(path):
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]


class Box:
    """A temp durable root with tiny_train shipped as code-test, a profile, an inventory and the playbook."""

    def __init__(self, root: Path, run_id: str = "tiny-001"):
        self.root = root
        self.run_id = run_id
        self.durable = root / "durable"
        self.run_dir = self.durable / PROJECT / "active" / run_id
        self.meta = self.run_dir / ".rgt"
        self.code_dir = self.run_dir / "code-test"
        self.code_dir.mkdir(parents=True)
        shutil.copy(TINY, self.code_dir / "train.py")
        self.report_path = root / "result.json"
        self.tmux_dir = Path(tempfile.mkdtemp(prefix="rgt-tmux-", dir="/tmp"))  # short: unix socket path
        (root / "inventory.yml").write_text(yaml.safe_dump({"all": {"hosts": {"box": {
            "ansible_connection": "local", "ansible_python_interpreter": sys.executable}}}}))
        (root / "play.yml").write_text(PLAYBOOK)
        self.profile = {
            "name": "local", "title": "test box", "kind": "workstation", "verified": "none",
            "roots": {"durable": str(self.durable), "scratch": str(root / "scratch")},
            "mounts": [], "detach": {"primitive": "tmux", "fallback": "nohup"},
            "spot": {"available": False, "grace_s": 5},
            "network": {"proxy_hook": None, "env": {"HF_HOME": "{scratch_root}/hf"}, "no_proxy": []},
            "secrets": {"dir": str(root / "home")},
        }

    def env(self):
        return {**os.environ, "TMUX_TMPDIR": str(self.tmux_dir)}

    def play(self, job=None, check=False, **extra_vars):
        spec = {"name": self.run_id, "python": sys.executable, "command": tiny_command(),
                "heartbeat_interval_s": 1}
        spec.update(job or {})
        variables = {"launch_detached_profile": self.profile, "rgt_project": PROJECT, "rgt_job": spec,
                     "launch_detached_code_dir": str(self.code_dir), "report_path": str(self.report_path)}
        variables.update(extra_vars)
        vars_file = self.root / "vars.json"
        vars_file.write_text(json.dumps(variables))
        if self.report_path.exists():
            self.report_path.unlink()
        env = self.env()
        env.update({"ANSIBLE_COLLECTIONS_PATH": str(COLLECTIONS), "ANSIBLE_PIPELINING": "True",
                    "ANSIBLE_NOCOLOR": "1", "ANSIBLE_FORCE_COLOR": "0", "ANSIBLE_RETRY_FILES_ENABLED": "False",
                    "ANSIBLE_LOCAL_TEMP": str(self.root / ".ansible-local")})
        if (REPO / "ansible.cfg").exists():
            env["ANSIBLE_CONFIG"] = str(REPO / "ansible.cfg")
        argv = [str(ANSIBLE_PLAYBOOK), "-i", str(self.root / "inventory.yml"), str(self.root / "play.yml"),
                "-e", "@" + str(vars_file), "-v"]
        if check:
            argv.append("--check")
        proc = subprocess.run(argv, capture_output=True, text=True, env=env, cwd=self.root, timeout=120)
        result = read_json(self.report_path) or {}
        return proc, result

    # -- the run's records
    def exit_doc(self):
        return read_json(self.meta / "exit.json")

    def wait_exit(self, attempt=1, timeout=20):
        return wait_for(lambda: (self.exit_doc() or {}).get("attempt") == attempt and self.exit_doc(),
                        timeout, what="exit.json of attempt %d" % attempt)

    def wrappers(self):
        """Wrapper processes of this run: argv[1] is its wrapper.py (the tmux server's argv also names it)."""
        wrapper = str(self.meta / "wrapper.py").encode()
        found = []
        for pid in procs_with(str(self.run_dir)):
            try:
                argv = Path("/proc", str(pid), "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if len(argv) > 2 and argv[1] == wrapper:
                found.append(pid)
        return found

    def tmux(self, *args):
        return subprocess.run(["tmux", *args], capture_output=True, text=True, env=self.env())

    def cleanup(self):
        for pid in self.wrappers():
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        pid_doc = read_json(self.meta / "pid") or {}
        if pid_doc.get("pgid"):
            try:
                os.killpg(pid_doc["pgid"], signal.SIGKILL)
            except OSError:
                pass
        if shutil.which("tmux"):
            self.tmux("kill-server")
        shutil.rmtree(self.tmux_dir, ignore_errors=True)


def recap_changed(stdout: str) -> int:
    line = next(ln for ln in stdout.splitlines() if ln.startswith("box ") and "changed=" in ln)
    return int(line.split("changed=")[1].split()[0])


@pytest.fixture
def box(tmp_path):
    link = COLLECTIONS / "ansible_collections" / "rgt" / "remote_gpu"
    if not link.exists():
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to("../../..")
    b = Box(tmp_path)
    yield b
    b.cleanup()


needs_tmux = pytest.mark.skipif(shutil.which("tmux") is None, reason="needs tmux")


@needs_tmux
def test_launch_returns_at_once_and_the_run_finishes(box):
    proc, result = box.play()
    assert proc.returncode == 0, proc.stdout + proc.stderr
    # the play returned while the job runs (no timed assertion: the exit record comes only after it)
    assert result["state"] == "running" and result["attempt"] == 1 and result["detach"] == "tmux"
    assert result["changed"] is True and recap_changed(proc.stdout) == 1
    assert result["session"] == "rgt-demo/tiny-001"
    job = read_json(box.meta / "job.json")
    assert job["schema"] == 1 and job["run_id"] == "tiny-001" and job["project"] == PROJECT
    assert job["code_dir"] == str(box.code_dir) and job["run_dir"] == str(box.run_dir)
    assert job["grace_s"] == 5 and job["ckpt_glob"] == "*" and job["secrets_file"] is None
    assert job["env"] == {"HF_HOME": str(box.root / "scratch" / "hf")}
    assert job["attempt_policy"] == {"auto_resume": False}  # auto-resume only when the job asks for it
    assert stat.S_IMODE((box.meta / "wrapper.py").stat().st_mode) == 0o755
    shipped = rgt_bundle.build("wrapper").files  # the wrapper and what it imports, as the bundle lays them out
    assert (box.meta / "rgt_runlayout.py").read_text() == shipped["rgt_runlayout.py"]
    assert (box.meta / "rgt_states.py").read_bytes() == (  # what rgt_runlayout imports from its own directory
        REPO / "plugins/module_utils/rgt_states.py").read_bytes()
    done = box.wait_exit()
    assert done["reason"] == "finished" and done["rc"] == 0 and done["stop_signal"] is None
    log = (box.run_dir / "logs" / "job.log").read_text()
    assert "== rgt attempt 1 started" in log and "resume_from=none" in log and "step=40 " in log
    assert (box.run_dir / "out" / "weights.bin").is_file()
    attempts = [json.loads(ln) for ln in (box.meta / "attempts.jsonl").read_text().splitlines()]
    assert [("started_at" in a, a["attempt"]) for a in attempts] == [(True, 1), (False, 1)]
    assert attempts[0]["detach"] == "tmux" and attempts[1]["reason"] == "finished"
    assert read_json(box.meta / "heartbeat")["job_alive"] is False
    # the same job again: a finished run is reported, nothing changes
    again, result = box.play()
    assert again.returncode == 0, again.stdout + again.stderr
    assert recap_changed(again.stdout) == 0
    assert result["state"] == "finished" and "new rgt_job.run_id" in result["msg"]


@needs_tmux
def test_a_live_run_is_never_started_twice(box):
    job = {"command": tiny_command(steps=4000, sleep=0.05)}
    first, result = box.play(job)
    assert first.returncode == 0, first.stdout + first.stderr
    wrappers = box.wrappers()
    assert len(wrappers) == 1
    second, again = box.play(job)
    assert second.returncode == 0, second.stdout + second.stderr
    assert recap_changed(second.stdout) == 0
    assert again["state"] == "running" and again["attempt"] == 1
    assert "not started twice" in again["msg"] and again["pid"] == wrappers[0]
    assert box.wrappers() == wrappers
    assert box.tmux("has-session", "-t", "=rgt-demo/tiny-001").returncode == 0
    # a second wrapper started by hand sees the lock and leaves
    extra = subprocess.run([sys.executable, str(box.meta / "wrapper.py"), str(box.run_dir)],
                           capture_output=True, text=True, timeout=10)
    assert extra.returncode == 0 and "already running" in extra.stdout
    assert len([ln for ln in (box.meta / "attempts.jsonl").read_text().splitlines() if "started_at" in ln]) == 1


@needs_tmux
def test_sigterm_preempts_and_the_relaunch_resumes_to_identical_weights(box, tmp_path):
    # 10 s of training: long enough that a loaded machine still stops it mid-run
    job = {"command": tiny_command(steps=200, ckpt_every=10, sleep=0.05)}
    proc, result = box.play(job)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    wait_for(lambda: list((box.run_dir / "ckpt").glob("step_*.ckpt")), what="a first checkpoint")
    os.kill(result["pid"], signal.SIGTERM)
    done = box.wait_exit()
    assert done["reason"] == "preempted" and done["stop_signal"] == "SIGTERM"
    assert (box.meta / "PREEMPT").exists()
    assert list((box.run_dir / "ckpt").glob("step_*.ckpt"))
    assert not (box.run_dir / "out" / "weights.bin").exists()
    wait_for(lambda: box.tmux("has-session", "-t", "=rgt-demo/tiny-001").returncode != 0, what="the session to end")

    again, result = box.play(job)
    assert again.returncode == 0, again.stdout + again.stderr
    assert result["state"] == "running" and result["attempt"] == 2 and result["action"] == "relaunch"
    assert result["resume_from"] and result["resume_from"].startswith(str(box.run_dir / "ckpt"))
    done = box.wait_exit(attempt=2, timeout=60)
    assert done["reason"] == "finished"
    assert not (box.meta / "PREEMPT").exists()
    log = (box.run_dir / "logs" / "job.log").read_text()
    assert "resumed from " in log and "== rgt attempt 2 started" in log
    attempts = [json.loads(ln) for ln in (box.meta / "attempts.jsonl").read_text().splitlines()]
    assert [a.get("reason") for a in attempts if "ended_at" in a] == ["preempted", "finished"]

    ref = tmp_path / "reference"
    env = {**os.environ, "RGT_CKPT_DIR": str(ref / "ckpt"), "RGT_OUT_DIR": str(ref / "out")}
    for name in ("RGT_RESUME_FROM", "RGT_PREEMPT_FILE"):
        env.pop(name, None)
    subprocess.run([sys.executable, str(TINY), "--steps", "200", "--ckpt-every", "10"], env=env, check=True,
                   capture_output=True, timeout=60)
    assert (box.run_dir / "out" / "weights.bin").read_bytes() == (ref / "out" / "weights.bin").read_bytes()


def test_disk_gate_refuses_and_writes_nothing(box):
    proc, result = box.play(job={"disk_floor_gib": 10 ** 9})
    assert proc.returncode != 0
    assert "DISK_GATE" in proc.stdout
    assert result.get("rc_hint") == 3
    assert not (box.meta / "job.json").exists()
    assert not box.wrappers()


@needs_tmux
def test_secret_reaches_the_job_but_no_argv(box):
    secrets = box.root / "home" / ".rgt-secrets" / "demo.env"
    secrets.parent.mkdir(parents=True)
    secrets.write_text("TOKEN='%s'\n" % SECRET)
    secrets.chmod(0o600)
    command = ("bash -c 'printf %s \"$TOKEN\" | wc -c > \"$RGT_OUT_DIR/token_len\"; "
               "env > \"$RGT_OUT_DIR/env.txt\"; sleep 30'")  # alive while we look, even on a loaded machine
    proc, result = box.play(job={"command": command, "secrets": ["TOKEN"]})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert result["state"] == "running"
    assert read_json(box.meta / "job.json")["secrets_file"] == str(secrets)
    token_len = box.run_dir / "out" / "token_len"
    wait_for(lambda: token_len.exists() and token_len.read_text(), what="the job to write token_len")
    assert token_len.read_text().strip() == str(len(SECRET))
    ps = subprocess.run(["ps", "-eww", "-o", "args"], capture_output=True, text=True).stdout
    assert str(box.run_dir) in ps  # the job is running while we look
    assert SECRET not in ps
    assert SECRET not in proc.stdout + proc.stderr
    assert SECRET not in (box.meta / "job.json").read_text()
    env = dict(line.split("=", 1) for line in (box.run_dir / "out" / "env.txt").read_text().splitlines()
               if "=" in line)
    assert env["TOKEN"] == SECRET and env["RGT_ATTEMPT"] == "1" and env["RGT_RUN_ID"] == "tiny-001"
    assert env["RGT_RESUME_FROM"] == "" and env["PYTHONUNBUFFERED"] == "1"
    assert env["RGT_PREEMPT_FILE"] == str(box.meta / "PREEMPT")
    assert env["RGT_CKPT_DIR"] == str(box.run_dir / "ckpt") and env["RGT_OUT_DIR"] == str(box.run_dir / "out")
    assert env["HF_HOME"] == str(box.root / "scratch" / "hf")
    assert os.path.realpath(env["PWD"]) == os.path.realpath(box.code_dir)


def test_nohup_fallback_when_tmux_is_absent(box):
    nobin = box.root / "bin"
    nobin.mkdir()
    for tool in ("bash", "sh", "env"):
        (nobin / tool).symlink_to(shutil.which(tool))
    proc, result = box.play(play_env={"PATH": str(nobin)}, job={"omp_num_threads": None},
                            launch_detached_omp_num_threads=3)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert result["state"] == "running" and result["detach"] == "nohup"
    assert any("tmux is not installed" in w for w in result.get("warnings", []))
    assert "tmux is not installed" in proc.stdout + proc.stderr
    assert result["omp_num_threads"] == 3
    done = box.wait_exit()
    assert done["reason"] == "finished"
    attempts = [json.loads(ln) for ln in (box.meta / "attempts.jsonl").read_text().splitlines()]
    assert attempts[0]["detach"] == "nohup"
    assert read_json(box.meta / "job.json")["omp_num_threads"] == 3


def test_check_mode_writes_nothing(box):
    proc, result = box.play(check=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert result["changed"] is True and result["action"] == "launch"
    assert not (box.meta / "job.json").exists() and not box.wrappers()


@needs_tmux
def test_a_killed_or_failed_job_is_relaunched_only_on_the_users_word(box):
    """killed (a signal that is no stop signal) and failed are both `failed` to status, and one rule starts them
    again: only relaunch_failed, which `rgt-run retry` passes; a second train reports them and starts nothing."""
    kill = {"command": "bash -c 'echo step=1 loss=0.5; kill -9 $$'"}
    proc, result = box.play(job=kill)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    done = box.wait_exit()
    # bash reports the SIGKILLed command as 128+9
    assert (done["reason"], done["rc"], done["signal"]) == ("killed", 137, 9)

    wait_for(lambda: not box.wrappers(), what="the wrapper to exit")
    again, result = box.play(job=kill)
    assert again.returncode == 0 and recap_changed(again.stdout) == 0
    assert result["state"] == "failed" and "not relaunched" in result["msg"] and "SIGKILL (rc 137)" in result["msg"]
    assert "rgt-run retry -i INVENTORY tiny-001" in result["msg"]

    retry = {"launch_detached_relaunch_failed": True, "launch_detached_relaunch": False}  # what retry passes
    proc, result = box.play(job={"command": "bash -c 'exit 3'"}, **retry)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert result["attempt"] == 2 and result["action"] == "relaunch"
    done = box.wait_exit(attempt=2)
    assert (done["reason"], done["rc"]) == ("failed", 3)

    wait_for(lambda: not box.wrappers(), what="the wrapper to exit")
    again, result = box.play(job={"command": "bash -c 'exit 3'"})
    assert again.returncode == 0 and recap_changed(again.stdout) == 0
    assert result["state"] == "failed" and "not relaunched" in result["msg"] and "rc 3" in result["msg"]


@needs_tmux
def test_a_vanished_wrapper_is_dead_and_relaunched(box):
    job = {"command": tiny_command(steps=400, sleep=0.05)}
    proc, result = box.play(job)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    wait_for(lambda: list((box.run_dir / "ckpt").glob("step_*.ckpt")), what="a first checkpoint")
    pgid = read_json(box.meta / "pid")["pgid"]
    os.kill(result["pid"], signal.SIGKILL)  # a wrapper that vanished without a word (OOM killer, kill -9)
    os.killpg(pgid, signal.SIGKILL)
    wait_for(lambda: not box.wrappers(), what="the wrapper to be gone")
    assert box.exit_doc() is None

    again, result = box.play(job)
    assert again.returncode == 0, again.stdout + again.stderr
    assert result["attempt"] == 2 and result["action"] == "relaunch" and result["resume_from"]
    attempts = [json.loads(ln) for ln in (box.meta / "attempts.jsonl").read_text().splitlines()]
    dead = [a for a in attempts if a.get("reason") == "dead"]
    assert len(dead) == 1 and dead[0]["attempt"] == 1 and dead[0]["ended_at"]
    assert len(box.wrappers()) == 1


@needs_tmux
def test_the_tmux_server_dying_is_a_stop(box):
    """A container stop or a killed tmux server hangs up the panes: the wrapper treats SIGHUP as a stop."""
    proc, result = box.play(job={"command": tiny_command(steps=400, sleep=0.05)})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    wait_for(lambda: list((box.run_dir / "ckpt").glob("step_*.ckpt")), what="a first checkpoint")
    assert box.tmux("kill-server").returncode == 0
    done = box.wait_exit()
    assert done["reason"] == "preempted" and done["stop_signal"] == "SIGHUP" and done["rc"] == 0
    assert "preempted: checkpoint" in (box.run_dir / "logs" / "job.log").read_text()


# ---------------------------------------------------------------- a disk that fills while the job saves

FILL = """
import os, sys, time
ckpt = os.environ["RGT_CKPT_DIR"]
print("step=1 loss=0.5", flush=True)
time.sleep(1.5)  # the launch sees the first heartbeat
try:  # the save fills every byte ...
    with open(os.path.join(ckpt, "model.ckpt.tmp"), "wb", buffering=0) as handle:
        while True:
            handle.write(b"\\1" * 4096)
except OSError:
    pass
shard = 0
try:  # ... and every inode
    while True:
        open(os.path.join(ckpt, "shard-%d.tmp" % shard), "wb").close()
        shard += 1
except OSError:
    pass
os._exit(1)  # the save failed
"""


@pytest.fixture
def small_box(tmp_path, tmpfs):
    """A Box whose durable root is a 2 MiB, 200-inode tmpfs (unmounted at teardown)."""
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("needs root to mount a small tmpfs")
    tmpfs(tmp_path / "durable", "size=2m,nr_inodes=200,mode=0755")
    link = COLLECTIONS / "ansible_collections" / "rgt" / "remote_gpu"
    if not link.exists():
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to("../../..")
    b = Box(tmp_path)
    try:
        yield b
    finally:
        b.cleanup()


@needs_tmux
def test_a_job_that_fills_the_disk_and_exits_1_is_failed_not_dead_and_not_relaunched(small_box, rgt):
    box = small_box
    (box.code_dir / "fill.py").write_text(FILL)
    job = {"command": "%s fill.py" % sys.executable, "disk_floor_gib": 0}
    proc, result = box.play(job)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert result["state"] == "running" and result["attempt"] == 1
    wait_for(lambda: box.exit_doc() or not box.wrappers(), timeout=30, what="the wrapper to end")
    wait_for(lambda: not box.wrappers(), timeout=10, what="the wrapper to exit")
    assert os.statvfs(box.durable).f_ffree == 0  # the disk is still full

    # the wrapper survived and wrote every end record from its reserve
    done = box.exit_doc()
    assert done and (done["attempt"], done["reason"], done["rc"]) == (1, "failed", 1)
    ends = [a for a in (read_json_lines(box.meta / "attempts.jsonl")) if "ended_at" in a]
    assert [(e["attempt"], e["reason"], e["rc"]) for e in ends] == [(1, "failed", 1)]
    assert "== rgt attempt 1 ended" in (box.run_dir / "logs" / "job.log").read_text()
    assert read_json(box.meta / "heartbeat")["job_alive"] is False
    assert not (box.meta / "reserve").exists()

    # status: failed rc 1 (not dead); the full disk is the attention
    inv = box.root / "inv"
    inv.mkdir()
    (inv / "hosts.yml").write_text(yaml.safe_dump({"all": {"hosts": {"box": {
        "ansible_connection": "local", "ansible_python_interpreter": sys.executable, "rgt_profile": "local",
        "rgt_instance_id": "localhost", "rgt_durable_root": str(box.durable), "rgt_project": PROJECT,
        "rgt_job": {"name": box.run_id}}}}}))
    status = rgt("status", "-i", inv, "--json", env={"TMUX_TMPDIR": str(box.tmux_dir)}, timeout=180)
    doc = status.doc["hosts"]["box"]
    assert doc["state"] == "failed", status.stderr
    assert (doc["evidence"]["exit"]["reason"], doc["evidence"]["exit"]["rc"]) == ("failed", 1)
    assert [a["id"] for a in doc["attention"]] == ["disk_full"] and status.rc == 5
    assert " failed " in status.stderr and "dead" not in status.stderr

    # a second launch reports it failed and starts nothing
    again, result = box.play(job)
    assert again.returncode == 0, again.stdout + again.stderr
    assert recap_changed(again.stdout) == 0
    assert result["state"] == "failed" and "not relaunched" in result["msg"] and "rc 1" in result["msg"]
    assert not box.wrappers()
    starts = [a for a in read_json_lines(box.meta / "attempts.jsonl") if "started_at" in a]
    assert len(starts) == 1


def test_launch_reports_failed_from_the_end_line_when_exit_json_is_missing(box):
    """A wrapper that could not write exit.json (an older wrapper on a full disk) left the end line: the run failed
    rc 1 and is not relaunched; a wrapper that left neither is dead and relaunched."""
    box.meta.mkdir(parents=True)
    (box.meta / "attempts.jsonl").write_text(
        json.dumps({"attempt": 1, "started_at": "2027-01-01T00:00:00Z", "incarnation": "x"}) + "\n"
        + json.dumps({"attempt": 1, "ended_at": "2027-01-01T01:00:00Z", "rc": 1, "signal": None,
                      "reason": "failed"}) + "\n")
    proc, result = box.play(check=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert result["state"] == "failed" and result["changed"] is False and "rc 1" in result["msg"]
    assert result["exit"]["rc"] == 1
    assert any("exit.json of attempt 1 is missing" in w for w in result.get("warnings", []))


# ---------------------------------------------------------------- the job runs as declared, through rgt-run

DECLARED_JOB = r"""
import json, os, signal, sys, time
attempt = int(os.environ["RGT_ATTEMPT"])
print("python", sys.executable, os.environ.get("VIRTUAL_ENV"), flush=True)
with open(os.path.join(os.environ["RGT_OUT_DIR"], "env-%d.json" % attempt), "w") as handle:
    json.dump(dict(os.environ), handle)
if attempt == 2:  # resumed by watch: this attempt fails
    print("step=2 loss=1.0", flush=True)
    sys.exit(3)
if attempt == 3:  # retried: it finishes
    open(os.path.join(os.environ["RGT_OUT_DIR"], "weights.bin"), "w").write("w")
    sys.exit(0)

def stop(*_):  # checkpoint, then exit 128+15: only this process got the signal
    open(os.path.join(os.environ["RGT_CKPT_DIR"], "step_1.ckpt"), "w").write("1")
    sys.exit(143)

signal.signal(signal.SIGTERM, stop)
print("step=1 loss=2.0 ready", flush=True)
time.sleep(120)
"""


@pytest.fixture
def project(tmp_path):
    """A user's project on this machine: a declared interpreter of its own (not rgt's venv), the job, an inventory
    (local profile) and a private tmux server; every wrapper and job it started is killed at the end, by pid."""
    declared = tmp_path / "proj-env" / "bin" / "python"
    declared.parent.mkdir(parents=True)
    declared.symlink_to(os.path.realpath(sys.executable))  # the same binary, another installation's path
    (tmp_path / "code").mkdir()
    (tmp_path / "code" / "job.py").write_text(DECLARED_JOB)
    durable = tmp_path / "durable"
    (tmp_path / "inv").mkdir()
    (tmp_path / "inv" / "hosts.yml").write_text(yaml.safe_dump({"all": {"hosts": {"box": {
        "ansible_connection": "local", "ansible_python_interpreter": sys.executable, "rgt_profile": "local",
        "rgt_instance_id": "localhost", "rgt_durable_root": str(durable), "rgt_project": PROJECT}}}}))
    (tmp_path / "job.yml").write_text(yaml.safe_dump({"rgt_job": {
        "name": "decl", "command": "python job.py", "python": str(declared), "code_dir": "code",
        "checkpoint": {"glob": "step_*.ckpt"}, "outputs": ["weights.bin"], "auto_resume": True,
        "disk_floor_gib": 0.01}}))
    tmux_dir = Path(tempfile.mkdtemp(prefix="rgt-tmux-", dir="/tmp"))
    run_dir = durable / PROJECT / "active" / "decl"
    # rgt-run from its venv, activated: neither its bin dir nor VIRTUAL_ENV may reach the job
    env = {"TMUX_TMPDIR": str(tmux_dir), "VIRTUAL_ENV": str(REPO / ".venv"),
           "PATH": os.pathsep.join([str(REPO / ".venv" / "bin"), os.environ.get("PATH", "")])}
    yield {"root": tmp_path, "declared": declared, "run_dir": run_dir, "env": env}
    end_local_runs(run_dir, tmux_dir)


@needs_tmux
def test_the_job_runs_as_declared_a_stop_of_its_own_is_preempted_and_a_failure_waits_for_retry(rgt, project):
    root, run_dir, env = project["root"], project["run_dir"], project["env"]
    meta = run_dir / ".rgt"

    def exit_of(attempt):
        return wait_for(lambda: (read_json(meta / "exit.json") or {}).get("attempt") == attempt
                        and read_json(meta / "exit.json"), 60, what=f"exit.json of attempt {attempt}")

    train = rgt("train", "-i", "inv", "-e", "@job.yml", env=env, cwd=root, timeout=300)
    assert train.rc == 0, train.stderr[-3000:]
    wait_for(lambda: "ready" in (run_dir / "logs" / "job.log").read_text(), 30, what="the job to start")

    # 1. the job runs the declared interpreter, in an environment without rgt's venv or Ansible's variables
    log = (run_dir / "logs" / "job.log").read_text()
    assert f"python {project['declared']} None" in log, log
    job_env = read_json(run_dir / "out" / "env-1.json")
    entries = job_env["PATH"].split(os.pathsep)
    assert entries[0] == str(project["declared"].parent)
    assert not [e for e in entries if os.path.realpath(e).startswith(os.path.realpath(REPO / ".venv"))], entries
    assert "VIRTUAL_ENV" not in job_env and "RGT_RUNNER_PREFIX" not in job_env
    assert not [k for k in job_env if k.startswith("ANSIBLE_") or k in ("AWX_ISOLATED_DATA_DIR", "TMUX")]
    assert read_json(meta / "job.json")["rgt_prefixes"] == [str(REPO / ".venv")]

    # 2. SIGTERM to the job's processes only (not the wrapper): it checkpoints and exits 143, a preemption
    os.killpg(read_json(meta / "pid")["pgid"], signal.SIGTERM)
    done = exit_of(1)
    assert (done["reason"], done["rc"], done["signal"], done["stop_signal"]) == ("preempted", 143, 15, None)
    status = rgt("status", "-i", "inv", "-e", "@job.yml", "--json", env=env, cwd=root, timeout=120)
    doc = status.doc["hosts"]["box"]
    assert status.rc == 1 and doc["state"] == "preempted", status.stderr[-2000:]
    assert "the job ended by SIGTERM (rc 143)" in status.stderr and "rgt-run watch -i inv" in doc["next"]

    # watch resumes it (auto_resume) from that checkpoint; attempt 2 fails and is left alone
    watch = rgt("watch", "-i", "inv", "-e", "@job.yml", "--interval", "1", "--max-ticks", "30", "--json", env=env,
                cwd=root, timeout=300)
    assert watch.rc == 1, watch.stderr[-3000:]
    assert [r["attempt"] for r in watch.doc["relaunches"]] == [1]
    assert watch.doc["hosts"]["box"]["state"] == "failed" and exit_of(2)["rc"] == 3
    starts = [r for r in read_json_lines(meta / "attempts.jsonl") if "started_at" in r]
    assert starts[1]["resume_from"] == str(run_dir / "ckpt" / "step_1.ckpt")

    # 3. a failed single run starts again only on the user's word
    retry = rgt("retry", "-i", "inv", "-e", "@job.yml", "decl", "--json", env=env, cwd=root, timeout=300)
    assert retry.rc == 0, retry.stderr[-3000:]
    assert retry.doc["state"] == "running" and retry.doc["sweep"] is None
    assert exit_of(3)["reason"] == "finished" and (run_dir / "out" / "weights.bin").is_file()
    nothing = rgt("retry", "-i", "inv", "-e", "@job.yml", "nope", "--json", env=env, cwd=root, timeout=120)
    assert nothing.rc == 2 and nothing.doc["field"] == "cell"
