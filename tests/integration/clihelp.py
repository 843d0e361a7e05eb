"""Helpers shared by integration tests (import as `from clihelp import ...`)."""

import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]


def write_inventory(path: Path, hosts: dict, group_vars: dict | None = None) -> Path:
    """Write a YAML inventory directory (hosts.yml + group_vars/all.yml)."""
    path.mkdir(parents=True, exist_ok=True)
    (path / "hosts.yml").write_text(yaml.safe_dump({"all": {"hosts": hosts}}))
    if group_vars:
        (path / "group_vars").mkdir(exist_ok=True)
        (path / "group_vars" / "all.yml").write_text(yaml.safe_dump(group_vars))
    return path


def wait_for(predicate, timeout: float = 15.0, what: str = "condition", interval: float = 0.1):
    """The predicate's first truthy value, polled every `interval` s; AssertionError naming `what` after
    `timeout` s."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def read_json(path):
    """The JSON document at path, or None when it is missing or not (yet) whole."""
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None


def kubectl_binary() -> str | None:
    """The kubectl rgt would run (rgt.k8s_engine.find_kubectl), or None when there is none."""
    from rgt import k8s_engine
    from rgt.errors import RgtError

    try:
        return k8s_engine.find_kubectl()
    except RgtError:
        return None


def procs_with(text: str) -> list[int]:
    """pids whose argv contains text (from /proc, so the test's own commands never match; zombies left out)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            argv = Path("/proc", entry, "cmdline").read_bytes().split(b"\0")
            state = Path("/proc", entry, "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state != "Z" and any(text.encode() in a for a in argv):
            found.append(int(entry))
    return found


def end_local_runs(run_dir: Path, tmux_dir: Path) -> None:
    """After a test that ran jobs here (the local profile): kill what still runs in `run_dir`, the tmux server of
    `tmux_dir` (the test's TMUX_TMPDIR), and remove that directory."""
    for pid in procs_with(str(run_dir)):
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    subprocess.run(["tmux", "kill-server"], capture_output=True, env={**os.environ, "TMUX_TMPDIR": str(tmux_dir)})
    shutil.rmtree(tmux_dir, ignore_errors=True)
