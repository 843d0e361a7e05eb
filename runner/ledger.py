"""The local ledger under .rgt/: every write is atomic (tmp + fsync + rename + fsync dir)."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any


def ledger_dir(explicit: str | None = None) -> Path:
    """Where the ledger lives: --ledger, then $RGT_LEDGER, then ./.rgt."""
    raw = explicit or os.environ.get("RGT_LEDGER") or ".rgt"
    path = Path(raw).expanduser().resolve()
    path.mkdir(parents=True, exist_ok=True)
    return path


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write_bytes(path: Path, data: bytes, mode: int = 0o644) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    _fsync_dir(path.parent)


def atomic_write_json(path: Path, doc: Any) -> None:
    atomic_write_bytes(path, (json.dumps(doc, indent=2, sort_keys=True, default=str) + "\n").encode())


def append_jsonl(path: Path, record: dict) -> None:
    """Append one line and fsync it: an event log must survive the laptop lid closing."""
    path.parent.mkdir(parents=True, exist_ok=True)
    line = json.dumps(record, sort_keys=True, default=str) + "\n"
    with open(path, "a", encoding="utf-8") as fh:
        fh.write(line)
        fh.flush()
        os.fsync(fh.fileno())


def read_json(path: Path) -> Any | None:
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        return None
