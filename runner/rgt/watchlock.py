"""One watcher per ledger: the lock a watcher that acts holds, and who holds it.

A watcher that acts (relaunches, pulls, stops a meter, notifies) holds an exclusive `flock` on
`<ledger>/watch.lock` for as long as it runs; the kernel drops the lock when the process ends, however it ends
(killed, crashed, its machine rebooted), so a stale lock never blocks the next watcher. Who holds it is written
beside it, atomically, in `<ledger>/watch.json` ({pid, hostname, started_at, mode, log}); that file is a note for
people and for `service status`, never the lock itself (a reader asks the lock first: a watch.json whose lock is
free names a watcher that is gone).

A watcher installed as a service (rgt.service) is recorded in `<ledger>/service.json`; `installed(ledger)` reads it.
"""

from __future__ import annotations

import fcntl
import os
import socket
import time
from pathlib import Path

from rgt.ledger import atomic_write_json, read_json

LOCK = "watch.lock"
HOLDER = "watch.json"
SERVICE = "service.json"


class Held(Exception):  # noqa: N818 - it is what happened
    """Another process holds the ledger's watch lock: `holder` is its watch.json ({} when unreadable)."""

    def __init__(self, ledger: Path, holder: dict):
        self.ledger = ledger
        self.holder = holder
        super().__init__(f"the ledger {ledger} is watched by {describe(holder)}")


def describe(holder: dict) -> str:
    """The holder in words: `pid 4242 on laptop since 2026-12-02 03:00:00 UTC (service)`."""
    if not holder:
        return "another process (its watch.json is unreadable)"
    since = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(float(holder.get("started_at") or 0)))
    mode = f" ({holder['mode']})" if holder.get("mode") else ""
    return f"pid {holder.get('pid')} on {holder.get('hostname')} since {since}{mode}"


class WatchLock:
    """The held lock; `release()` (or the end of the process) frees it."""

    def __init__(self, ledger: Path, fd: int, holder: dict):
        self.ledger = ledger
        self.holder = holder
        self._fd: int | None = fd

    def release(self) -> None:
        if self._fd is None:
            return
        try:
            if (read_json(self.ledger / HOLDER) or {}).get("pid") == self.holder["pid"]:
                (self.ledger / HOLDER).unlink(missing_ok=True)
        finally:
            os.close(self._fd)  # closing the descriptor drops the flock
            self._fd = None

    def __enter__(self) -> WatchLock:
        return self

    def __exit__(self, *exc) -> None:
        self.release()


def _open(ledger: Path) -> int:
    ledger.mkdir(parents=True, exist_ok=True)
    return os.open(ledger / LOCK, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)


def acquire(ledger: Path, mode: str = "foreground", log: str | None = None) -> WatchLock:
    """Take the ledger's watch lock without waiting; Held when another process has it."""
    fd = _open(ledger)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise Held(ledger, read_json(ledger / HOLDER) or {}) from None
    holder = {"pid": os.getpid(), "hostname": socket.gethostname(), "started_at": time.time(), "mode": mode,
              "log": log}
    try:
        atomic_write_json(ledger / HOLDER, holder)
    except BaseException:
        os.close(fd)
        raise
    return WatchLock(ledger, fd, holder)


def holder(ledger: Path) -> dict | None:
    """The live watcher of this ledger (its watch.json, {} when unreadable), or None when nobody holds the lock."""
    if not (ledger / LOCK).exists():
        return None
    fd = _open(ledger)
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return read_json(ledger / HOLDER) or {}
    else:
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    finally:
        os.close(fd)


def installed(ledger: Path) -> dict | None:
    """The service installed for this ledger (its service.json), or None."""
    doc = read_json(ledger / SERVICE)
    return doc if isinstance(doc, dict) else None
