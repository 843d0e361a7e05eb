"""Several runs on one box (this machine, connection local): no run hurts another, and the command runs as written.

Each test launches real wrappers under a private tmux server (TMUX_TMPDIR) through `rgt-run playbooks/train.yml
-t upload_resume,launch_detached`, the way a user relaunches on a box already probed, and kills only what it
started (the tmux server by its socket, the wrappers by the pids they recorded).
"""

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from clihelp import REPO, read_json, wait_for, write_inventory

PROJECT = "proj"
TINY = "python train.py --steps {steps} --ckpt-every 5 --sleep {sleep}"


class Box:
    def __init__(self, tmp_path: Path, rgt):
        self.tmp = tmp_path
        self.rgt = rgt
        self.durable = tmp_path / "durable"
        self.tmux_dir = Path(tempfile.mkdtemp(prefix="rgt-tmux-", dir="/tmp"))  # short: a unix socket path
        self.inv = write_inventory(tmp_path / "inv", {"box": {
            "ansible_connection": "local", "ansible_python_interpreter": sys.executable, "rgt_profile": "local",
            "rgt_instance_id": "localhost", "rgt_project": PROJECT, "rgt_durable_root": str(self.durable)}})
        self.env = {"TMUX_TMPDIR": str(self.tmux_dir)}

    def run_dir(self, run_id: str) -> Path:
        return self.durable / PROJECT / "active" / run_id

    def job(self, run_id: str, command: str, **more) -> str:
        return json.dumps({"rgt_job": {"name": run_id, "command": command, "python": sys.executable,
                                       "code_dir": str(REPO / "examples" / "tiny_train"),
                                       "disk_floor_gib": 0, **more}})

    def launch(self, run_id: str, command: str, **more):
        return self.rgt("playbooks/train.yml", "-i", self.inv, "-t", "upload_resume,launch_detached",
                        "-e", self.job(run_id, command, **more), "--json", env=self.env)

    def status(self, run_id: str):
        return self.rgt("status", "-i", self.inv, "-e", self.job(run_id, "true"), "--json", env=self.env)

    def exit_doc(self, run_id: str, timeout: float = 60):
        return wait_for(lambda: read_json(self.run_dir(run_id) / ".rgt" / "exit.json"), timeout,
                        f"{run_id} to end")

    def tmux(self, *args: str) -> subprocess.CompletedProcess:
        return subprocess.run(["tmux", *args], capture_output=True, text=True,
                              env={**os.environ, "TMUX_TMPDIR": str(self.tmux_dir)})

    def sessions(self) -> set[str]:
        return set(self.tmux("list-sessions", "-F", "#{session_name}").stdout.split())

    def cleanup(self):
        for pid_file in self.durable.glob(f"{PROJECT}/active/*/.rgt/pid"):
            doc = read_json(pid_file) or {}
            for key in ("job_pid", "wrapper_pid"):
                try:
                    os.killpg(int(doc[key]), signal.SIGKILL) if key == "job_pid" else os.kill(int(doc[key]), 9)
                except (KeyError, TypeError, ValueError, OSError):
                    pass
        self.tmux("kill-server")


@pytest.fixture
def box(tmp_path, rgt):
    b = Box(tmp_path, rgt)
    yield b
    b.cleanup()


def test_runs_whose_ids_differ_in_dot_and_underscore_do_not_touch_each_other(box):
    first = box.launch("sess.x", TINY.format(steps=4000, sleep=0.05))
    assert first.rc == 0, first.stderr
    second = box.launch("sess_x", TINY.format(steps=4000, sleep=0.05))
    assert second.rc == 0, second.stderr
    assert {f"rgt-{PROJECT}/sess+x", f"rgt-{PROJECT}/sess_x"} <= box.sessions()
    time.sleep(1.5)
    assert not (box.run_dir("sess.x") / ".rgt" / "exit.json").exists(), "the first run was stopped by the second"
    for run_id in ("sess.x", "sess_x"):
        result = box.status(run_id)
        assert result.rc == 0, result.stderr
        doc = result.doc["hosts"]["box"]
        assert doc["state"] == "running" and doc["evidence"]["session_alive"] is True, doc
    box.cleanup()


def test_a_relaunch_never_kills_a_session_that_is_not_its_own(box):
    # somebody's own session, named the way rgt names this run's session, on the same tmux server
    foreign = f"rgt-{PROJECT}/mine"
    assert box.tmux("new-session", "-d", "-s", foreign, "sleep 300").returncode == 0
    result = box.launch("mine", TINY.format(steps=5, sleep=0.01))
    assert result.rc == 1, result.stderr
    assert "is not this run's" in result.stderr and "left alone" in result.stderr
    assert foreign in box.sessions()
    assert not (box.run_dir("mine") / ".rgt" / "attempts.jsonl").exists(), "nothing may start"


COMMANDS = {
    # both parts run: the second writes a file the first never writes
    "both": (TINY.format(steps=5, sleep=0.01) + ' && echo done > "$RGT_OUT_DIR/second.txt"', "finished", 0),
    # the whole line's status: the run failed, even though its first part finished
    "and-false": (TINY.format(steps=5, sleep=0.01) + " && false", "failed", 1),
    # a pipe: pipefail, so a trainer that fails behind `| tee` is not reported finished
    "pipe": ("python train.py --no-such-flag 2>&1 | tee /dev/null", "failed", 2),
}


def test_the_command_runs_as_written_and_its_status_is_the_whole_lines(box):
    # three runs on the one box, one inventory host each (declared as sharing the instance), one launch
    hosts = {name: {"ansible_connection": "local", "ansible_python_interpreter": sys.executable,
                    "rgt_profile": "local", "rgt_instance_id": "localhost", "rgt_shared_volume": True,
                    "rgt_project": PROJECT, "rgt_durable_root": str(box.durable),
                    "rgt_job": json.loads(box.job(name, command))["rgt_job"]}
             for name, (command, _reason, _rc) in COMMANDS.items()}
    inv = write_inventory(box.tmp / "inv3", hosts)
    result = box.rgt("playbooks/train.yml", "-i", inv, "-t", "upload_resume,launch_detached", "--json",
                     env=box.env)
    assert result.rc == 0, result.stderr
    for name, (_command, reason, rc) in COMMANDS.items():
        done = box.exit_doc(name)
        assert (done["reason"], done["rc"]) == (reason, rc), (name, done)
    assert (box.run_dir("both") / "out" / "second.txt").read_text() == "done\n"
    status = box.rgt("status", "-i", inv, "--json", env=box.env)
    assert {h: d["state"] for h, d in status.doc["hosts"].items()} == {n: r for n, (_c, r, _x) in COMMANDS.items()}
    assert status.rc == 1  # two runs failed


def test_a_job_without_auto_resume_is_not_relaunched(box):
    result = box.launch("once", TINY.format(steps=5, sleep=0.01))
    assert result.rc == 0, result.stderr
    box.exit_doc("once")
    job = read_json(box.run_dir("once") / ".rgt" / "job.json")
    assert job["attempt_policy"] == {"auto_resume": False}
