"""One watcher per ledger (rgt.watchlock): the lock is exclusive across processes, says who holds it, and is
free again the moment its holder ends, however it ends."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from rgt import watchlock

HOLD = """
import sys, time
from pathlib import Path
from rgt import watchlock
lock = watchlock.acquire(Path(sys.argv[1]), mode="service", log="/tmp/x.log")
print("held", flush=True)
time.sleep(60)
"""


def _holding(ledger):
    proc = subprocess.Popen([sys.executable, "-c", HOLD, str(ledger)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "held"
    return proc


def test_a_second_watcher_is_refused_naming_the_holder(tmp_path):
    proc = _holding(tmp_path)
    try:
        with pytest.raises(watchlock.Held) as refused:
            watchlock.acquire(tmp_path)
        assert refused.value.holder["pid"] == proc.pid
        assert f"pid {proc.pid}" in str(refused.value) and "(service)" in str(refused.value)
        assert watchlock.holder(tmp_path)["pid"] == proc.pid
    finally:
        proc.kill()
        proc.wait()


def test_a_killed_holder_leaves_the_lock_free(tmp_path):
    proc = _holding(tmp_path)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert watchlock.holder(tmp_path) is None  # its watch.json is still there: the lock says it is gone
    with watchlock.acquire(tmp_path) as lock:
        assert lock.holder["pid"] == os.getpid()
        assert watchlock.holder(tmp_path)["pid"] == os.getpid()
    assert watchlock.holder(tmp_path) is None
    assert not (tmp_path / watchlock.HOLDER).exists()


def test_no_lock_file_means_no_watcher_and_no_service(tmp_path):
    assert watchlock.holder(tmp_path) is None
    assert watchlock.installed(tmp_path) is None
    (tmp_path / watchlock.SERVICE).write_text('{"kind": "systemd"}')
    assert watchlock.installed(tmp_path) == {"kind": "systemd"}
