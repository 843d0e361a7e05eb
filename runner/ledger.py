"""The local ledger under .rgt/: every write is atomic (tmp + fsync + rename + fsync dir)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from rgt import paths

_layout = paths.module_util("rgt_runlayout")


def ledger_dir(explicit: str | None = None, make: bool = True) -> Path:
    """Where the ledger lives: --ledger, then $RGT_LEDGER, then ./.rgt (made when absent, unless `make` is false:
    a command that only reads it, such as a plan, leaves no directory behind)."""
    from rgt.errors import InputError

    source = "--ledger" if explicit else ("$RGT_LEDGER" if os.environ.get("RGT_LEDGER") else "the default ledger")
    raw = explicit or os.environ.get("RGT_LEDGER") or ".rgt"
    path = Path(raw).expanduser().resolve()
    if path.exists() and not path.is_dir():
        raise InputError(f"{source} {path} is a file, not a directory", fix="point --ledger (or $RGT_LEDGER) at a "
                         "directory; rgt makes it when it does not exist", field="--ledger")
    try:
        if make:
            path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise InputError(f"{source} {path} cannot be made: {exc.strerror}",
                         fix="point --ledger (or $RGT_LEDGER) at a writable directory", field="--ledger") from exc
    return path


def runs_dir(explicit: str | None = None) -> Path:
    """Where verified pulls land: --runs-dir, then $RGT_RUNS_DIR, then ./runs (made by the pull when absent)."""
    from rgt.errors import InputError

    raw = explicit or os.environ.get("RGT_RUNS_DIR") or "runs"
    path = Path(raw).expanduser().resolve()
    if path.exists() and not path.is_dir():
        raise InputError(f"the runs dir {path} is a file, not a directory", fix="point --runs-dir (or "
                         "$RGT_RUNS_DIR) at a directory; rgt makes it when it does not exist", field="--runs-dir")
    return path


def atomic_write_bytes(path: Path, data: bytes, mode: int = 0o644) -> None:
    """The box's atomic write (module_utils rgt_runlayout.atomic_write: tmp + fsync + rename + fsync dir), for the
    controller's files; the directory is made when absent."""
    path.parent.mkdir(parents=True, exist_ok=True)
    _layout.atomic_write(str(path), data, mode)


def cache_path(kind: str, name: str) -> Path:
    """`${XDG_CACHE_HOME:-~/.cache}/rgt/<kind>/<name>`: what this controller keeps between processes (parsed
    inventories, the built zipapp); never state: losing it costs the next process the work again."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "rgt" / kind / name


def cache_put(path: Path, data: bytes, keep: int, mode: int = 0o644) -> None:
    """Write a cache file atomically (its directory 0700) and keep the newest `keep` files of its kind. A cache that
    cannot be written is no error."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        atomic_write_bytes(path, data, mode=mode)
        for old in sorted(path.parent.glob("*" + path.suffix), key=lambda p: p.stat().st_mtime, reverse=True)[keep:]:
            old.unlink(missing_ok=True)
    except OSError:
        pass


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
    """The record, or None when it is absent or unreadable (a truncated or corrupt record is not a fact)."""
    try:
        return json.loads(path.read_bytes().decode("utf-8"))
    except (OSError, ValueError):  # UnicodeDecodeError and JSONDecodeError are ValueErrors
        return None


def read_record(path: Path, problem, fix: str) -> Any | None:
    """A record the runner acts on (the runs remembered per host, a sweep's roster): None when absent; refused with
    exit 2 naming the file when it cannot be read, is not JSON (truncated) or `problem(doc)` names what is wrong
    with it: rgt never guesses what a damaged record held."""
    from rgt.errors import InputError

    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise InputError(f"the ledger record {path} cannot be read: {exc.strerror}", fix=fix,
                         field=str(path)) from exc
    try:
        doc = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise InputError(f"the ledger record {path} is damaged: not UTF-8 text (byte {exc.start})", fix=fix,
                         field=str(path)) from exc
    except ValueError as exc:
        why = "empty" if not raw.strip() else f"not JSON, truncated? ({exc})"
        raise InputError(f"the ledger record {path} is damaged: {why}", fix=fix, field=str(path)) from exc
    wrong = problem(doc)
    if wrong:
        raise InputError(f"the ledger record {path} is damaged: {wrong}", fix=fix, field=str(path))
    return doc
