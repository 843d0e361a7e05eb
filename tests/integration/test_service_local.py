"""Watch as a service, on the local profile (every host is this machine): one watcher per ledger, detached (the
fallback where systemd's user manager is absent, as on this test machine), killed and started again.

A run laid out preempted with auto_resume (as the wrapper leaves it) is due for a relaunch, and a notify rule
(a local command) records each message it gets; a second host's run stays live (a `sleep` stands in for its
wrapper), so the watcher keeps watching until it is stopped.
"""

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from clihelp import wait_for, write_inventory

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / ".collections"))
from ansible_collections.rgt.remote_gpu.plugins.module_utils import rgt_runlayout  # noqa: E402

pytestmark = pytest.mark.skipif(not (REPO / ".venv" / "bin" / "ansible-inventory").exists(),
                                reason="needs .venv with ansible-core")


def lay_out(durable: Path, run_id: str, *, live_pid: int | None = None) -> None:
    """A run with auto_resume whose attempt 1 was preempted, or (live_pid) one still running."""
    p = rgt_runlayout.RunPaths(str(durable), "rgt", run_id)
    for d in (p.meta, p.logs, p.ckpt, p.out):
        os.makedirs(d, exist_ok=True)
    rgt_runlayout.atomic_write_json(p.job, {
        "schema": 1, "run_id": run_id, "project": "rgt", "run_dir": p.run_dir, "outputs": [], "log_patterns": {},
        "price_per_hour": 1.0, "heartbeat_interval_s": 5, "stall_after_s": 600,
        "attempt_policy": {"auto_resume": True}})
    now = time.time()
    inc = rgt_runlayout.incarnation()
    pid = live_pid or 999999
    rgt_runlayout.atomic_write_json(p.pid, {"wrapper_pid": pid, "job_pid": pid, "pgid": pid, "attempt": 1,
                                            "incarnation": inc})
    rgt_runlayout.atomic_write_json(p.heartbeat, {"ts": now, "attempt": 1, "job_alive": bool(live_pid)})
    rgt_runlayout.append_jsonl(p.attempts, {"attempt": 1, "started_at": now - 600, "code_dir": p.code_dir("abcd1234"),
                                            "resume_from": "", "incarnation": inc, "detach": "nohup"})
    with open(p.log, "w") as fh:
        fh.write("== rgt attempt 1 started 2026-12-01T00:00:00Z resume_from=none\nstep=1 loss=0.9\n")
    if live_pid:
        return
    rgt_runlayout.append_jsonl(p.attempts, {"attempt": 1, "ended_at": now - 10, "rc": None, "signal": "SIGTERM",
                                            "reason": "preempted"})
    rgt_runlayout.atomic_write_json(p.exit, {"attempt": 1, "rc": None, "signal": "SIGTERM", "reason": "preempted",
                                             "ended_at": now - 10, "stop_signal": "SIGTERM"})


def host(durable: Path, run_id: str, notify: list) -> dict:
    return {"ansible_connection": "local", "ansible_python_interpreter": sys.executable, "rgt_profile": "local",
            "rgt_instance_id": "localhost", "rgt_durable_root": str(durable), "rgt_shared_volume": True,
            "rgt_job": {"name": run_id, "notify": notify}}


def relaunches(ledger: Path) -> list[dict]:
    """Every relaunch any watcher of this ledger started (the events each watch writes)."""
    return [e for f in sorted((ledger / "events").glob("*-watch-*.jsonl")) for e in map(json.loads, f.read_text()
            .splitlines()) if e.get("event") == "relaunch"]


def test_one_watcher_per_ledger_detached_killed_and_started_again(tmp_path, rgt):
    durable = tmp_path / "durable"
    sleeper = subprocess.Popen(["sleep", "600"])
    got = tmp_path / "messages.txt"
    rule = [{"command": f"printf '%s\\n' \"$RGT_NOTIFY_TEXT\" | head -n 1 >> {got}", "on": ["preempted"]}]
    lay_out(durable, "run-pre")
    lay_out(durable, "run-live", live_pid=sleeper.pid)
    inv = write_inventory(tmp_path / "inv", {"pre": host(durable, "run-pre", rule),
                                             "live": host(durable, "run-live", [])})
    env = {"RGT_SERVICE_NO_TMUX": "1"}  # the nohup/setsid fallback (tmux is its own test in spirit: same lock)
    watcher = None
    try:
        start = rgt("service", "install", "--detached", "-i", inv, "--interval", "1", "--max-ticks", "500",
                    "--json", env=env, timeout=120)
        assert start.rc == 0, start.stderr
        watcher = start.doc["holder"]["pid"]
        assert start.doc["service"]["kind"] == "detached" and start.doc["service"]["via"] == "nohup"
        assert json.loads((rgt.ledger / "service.json").read_text())["pid"] == watcher
        wait_for(lambda: relaunches(rgt.ledger) and got.exists(), 120, what="the watcher's relaunch and message")
        wait_for(lambda: (json.loads((rgt.ledger / "service" / "tick.json").read_text())
                          if (rgt.ledger / "service" / "tick.json").exists() else {}).get("tick", 0) >= 2, 60,
                 what="two ticks after the relaunch")

        # a second watcher of the same ledger is refused, naming the holder; --follow looks along, acts on nothing
        second = rgt("watch", "-i", inv, "--interval", "1", "--max-ticks", "1", timeout=120)
        assert second.rc == 3, second.stderr
        assert f"watched already by pid {watcher} on " in second.stderr and "(detached)" in second.stderr
        follow = rgt("watch", "--follow", "-i", inv, "--interval", "1", "--max-ticks", "1", "--json", timeout=120)
        assert follow.rc == 1, follow.stderr  # the preempted run (its relaunch failed: no code-abcd1234 here)
        assert follow.doc["relaunches"] == [] and "relaunching" not in follow.stderr
        assert follow.doc["hosts"]["pre"]["state"] == "preempted"

        status = rgt("service", "status", "--json", timeout=60)
        assert status.rc == 0, status.stderr
        assert status.doc["running"] and status.doc["holder"]["pid"] == watcher
        said = status.stderr  # under --json the human rendering is on stderr
        assert f"running: pid {watcher} on " in said and "last tick: " in said
        assert "live:run-live running" in said and "waiting on: live:run-live (running)" in said
        assert "rgt watch 2 host(s)" in rgt("service", "logs", timeout=60).stdout

        # killed (SIGKILL, its whole group: as a crash or a reboot leaves it), then started again
        os.killpg(watcher, signal.SIGKILL)
        wait_for(lambda: rgt("service", "status", timeout=60).rc == 1, 30, what="status to say not running")
        again = rgt("watch", "-i", inv, "--interval", "1", "--max-ticks", "2", "--json", timeout=120)
        assert again.rc == 1, again.stderr
        assert again.doc["relaunches"] == [] and "1 relaunch(es) remembered" in again.stderr
        assert len(relaunches(rgt.ledger)) == 1
        assert got.read_text().splitlines() == ["rgt: pre run-pre preempted (attempt 1): step 1, loss 0.9, "
                                                "auto_resume: relaunching"]

        # detached again (watch --detach: under tmux where it is installed), then stopped
        start = rgt("watch", "--detach", "-i", inv, "--interval", "1", "--max-ticks", "500", timeout=120)
        assert start.rc == 0 and "watching: pid " in start.stdout, start.stderr
        assert ("(tmux -L rgt-watch-" if shutil.which("tmux") else "(a session of its own") in start.stdout
        watcher = int(start.stdout.split("watching: pid ")[1].split()[0])
        stop = rgt("service", "stop", timeout=60)
        assert stop.rc == 0 and f"stopped the watcher pid {watcher} on " in stop.stdout, stop.stderr
        watcher = None
        assert rgt("service", "status", timeout=60).rc == 1
        assert rgt("service", "stop", timeout=60).stdout.strip() == ("no watcher was running for this ledger: "
                                                                      "nothing to stop")
        assert len(relaunches(rgt.ledger)) == 1 and len(got.read_text().splitlines()) == 1
    finally:
        if watcher:
            try:
                os.killpg(watcher, signal.SIGKILL)
            except OSError:
                pass
        sleeper.kill()
        sleeper.wait()


FAKE_SYSTEMCTL = r"""#!/usr/bin/env python3
# systemctl --user, faked: a user manager that runs a unit's ExecStart in its WorkingDirectory, and stops it
import json, os, shlex, signal, subprocess, sys
from pathlib import Path
state = Path(os.environ["FAKE_SYSTEMCTL_STATE"])
args = sys.argv[1:]
with open(state / "calls.jsonl", "a") as fh:
    fh.write(json.dumps(args) + "\n")
assert args[0] == "--user", args
if args[1:3] == ["enable", "--now"]:
    unit = {}
    config = Path(os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config")
    for line in (config / "systemd/user" / args[3]).read_text().splitlines():
        key, _, value = line.partition("=")
        unit.setdefault(key, value)
    proc = subprocess.Popen(shlex.split(unit["ExecStart"]), cwd=unit["WorkingDirectory"], start_new_session=True,
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    (state / args[3]).write_text(str(proc.pid))
elif args[1:3] == ["disable", "--now"]:
    os.killpg(int((state / args[3]).read_text()), signal.SIGTERM)
"""


def test_service_install_writes_a_systemd_user_unit_and_stop_disables_it(tmp_path, rgt):
    """Where `systemctl --user` works (here a fake user manager on PATH: this machine has no user bus), install
    writes the unit, enables it and returns once its watcher holds the ledger; stop disables it."""
    durable = tmp_path / "durable"
    sleeper = subprocess.Popen(["sleep", "600"])
    lay_out(durable, "run-live", live_pid=sleeper.pid)
    inv = write_inventory(tmp_path / "inv", {"live": host(durable, "run-live", [])})
    bin_dir, state = tmp_path / "bin", tmp_path / "systemd"
    bin_dir.mkdir()
    state.mkdir()
    (bin_dir / "systemctl").write_text(FAKE_SYSTEMCTL)
    (bin_dir / "systemctl").chmod(0o755)
    env = {"PATH": f"{bin_dir}:{os.environ['PATH']}", "FAKE_SYSTEMCTL_STATE": str(state)}
    try:
        start = rgt("service", "install", "-i", inv, "--interval", "1", "--max-ticks", "500", "--json", env=env,
                    timeout=120)
        assert start.rc == 0, start.stderr
        record = start.doc["service"]
        assert record["kind"] == "systemd" and start.doc["holder"]["mode"] == "service"
        unit = Path(record["unit_path"]).read_text()
        assert f"WorkingDirectory={REPO}" in unit and "Restart=on-failure" in unit
        assert f" watch -i {inv} --interval 1 --max-ticks 500 --ledger {rgt.ledger} " in unit
        status = rgt("service", "status", env=env, timeout=60)
        assert status.rc == 0 and "(service)" in status.stdout and record["unit"] in status.stdout, status.stderr
        stop = rgt("service", "stop", env=env, timeout=60)
        assert stop.rc == 0, stop.stderr
        assert f"stopped and disabled the systemd user unit {record['unit']}" in stop.stdout
        assert rgt("service", "status", env=env, timeout=60).rc == 1
        calls = [json.loads(line) for line in (state / "calls.jsonl").read_text().splitlines()]
        assert [c[1:3] for c in calls if c[1] != "show-environment"] == [
            ["daemon-reload"], ["enable", "--now"], ["disable", "--now"]]
    finally:
        pid_file = state / "{}".format((rgt.ledger / "service.json").exists() and json.loads(
            (rgt.ledger / "service.json").read_text()).get("unit"))
        if pid_file.is_file():
            try:
                os.killpg(int(pid_file.read_text()), signal.SIGKILL)
            except OSError:
                pass
        sleeper.kill()
        sleeper.wait()
