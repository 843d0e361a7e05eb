"""rgt.service's parts that need no watcher running: the systemd unit as text, the log's size cap, the command
a detached or service watcher runs (the watcher itself: tests/integration/test_service_local.py)."""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

from rgt import service


def test_the_unit_runs_this_watch_in_the_project_dir_and_restarts_only_a_watcher_that_died(tmp_path):
    ledger = tmp_path / "my ledger"
    argv = [sys.executable, "-m", "rgt.cli", "watch", "-i", "inventories/mine", "-e", "lr=1%",
            "-e", '{"a": "$HOME"}', "--ledger", str(ledger)]
    text = service.unit_text(ledger, argv, tmp_path / "proj", env_file="/home/me/.rgt-env")
    lines = text.splitlines()
    assert lines[0] == "[Unit]" and "[Service]" in lines and lines[-2:] == ["[Install]", "WantedBy=default.target"]
    assert f"WorkingDirectory={tmp_path / 'proj'}" in lines
    exec_start = next(line for line in lines if line.startswith("ExecStart="))
    # systemd's quoting: % and $ doubled (no specifier, no variable), an argument with a space or quote quoted
    assert exec_start == (f"ExecStart={sys.executable} -m rgt.cli watch -i inventories/mine -e \"lr=1%%\" "
                          f"-e \"{{\\\"a\\\": \\\"$$HOME\\\"}}\" --ledger \"{ledger}\"")
    for line in ("Restart=on-failure", "SuccessExitStatus=1 4 5", "RestartPreventExitStatus=2 3",
                 "EnvironmentFile=/home/me/.rgt-env"):
        assert line in lines
    assert "EnvironmentFile" not in service.unit_text(ledger, argv, tmp_path)


def test_the_service_watch_is_the_same_watch_with_the_ledger_by_its_path_and_its_log(tmp_path):
    args = argparse.Namespace(inventory="inv", extra_vars=["@job.yml"], limit="box", interval=30.0, max_ticks=None,
                              verbose=2)
    argv = service.watch_argv(args, tmp_path, "service")
    assert argv[:3] == [sys.executable, "-m", "rgt.cli"]
    assert argv[3:] == ["watch", "-i", "inv", "-e", "@job.yml", "-l", "box", "--interval", "30", "-vv",
                        "--ledger", str(tmp_path), "--service-log", str(tmp_path / "service" / "watch.log"),
                        "--service-mode", "service"]
    assert service.unit_name(tmp_path) == service.unit_name(tmp_path) != service.unit_name(tmp_path / "other")


ROTATE = """
import sys
from pathlib import Path
from rgt import service
log = Path(sys.argv[1])
service.redirect(log)
for n in range(7):
    print("x" * 99, flush=True)
    service.rotate(log, cap=250)
print("last", flush=True)
"""


def test_the_log_is_rotated_at_its_cap_keeping_two_old_ones(tmp_path):
    log = tmp_path / "service" / "watch.log"
    done = subprocess.run([sys.executable, "-c", ROTATE, str(log)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stdout == "", done.stderr
    assert sorted(p.name for p in log.parent.iterdir()) == ["watch.log", "watch.log.1", "watch.log.2"]
    assert log.read_text() == "x" * 99 + "\nlast\n"  # a new file after each rotation, written by the same process
    assert all(Path(f"{log}.{n}").stat().st_size == 300 for n in (1, 2))


def test_the_relaunches_remembered_are_the_instances_and_survive_a_damaged_record(tmp_path):
    path = tmp_path / "relaunched.json"
    remembered = service.Relaunched(path, {"box": "pod-1"})
    key = ("box", (("run-1", 1), ("run-2", None)))
    remembered.add(key)
    assert key in service.Relaunched(path, {"box": "pod-1"})
    assert key not in service.Relaunched(path, {"box": "pod-2"})  # a new box under the host's name: its own runs
    path.write_text("{not json")
    assert len(service.Relaunched(path)) == 0
