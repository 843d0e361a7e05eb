"""The local ledger under .rgt/: every write is atomic (tmp + fsync + rename + fsync dir).

A write that the disk refuses (full, over quota, read-only, not permitted, over the file size limit) is one
RgtError naming the file and the fix (exit 1), never a traceback, and leaves nothing half-written: an atomic
write removes its temp file (the old record stays as it was), an append is cut back to where it started.
"""

from __future__ import annotations

import errno
import functools
import hashlib
import importlib.util
import json
import os
import sys
from pathlib import Path
from typing import Any

from rgt import paths
from rgt.errors import InputError, RgtError

_layout = paths.module_util("rgt_runlayout")
_ledgers: set[Path] = set()  # the ledger dirs this process resolved: a refused write there names --ledger

# why the disk refused a write, in the user's words; the others are named by their own strerror
_WHY = {errno.ENOSPC: "the disk is full", errno.EDQUOT: "the disk quota is used up",
        errno.EROFS: "the filesystem is read-only", errno.EACCES: "permission denied",
        errno.EPERM: "the operation is not permitted", errno.EFBIG: "the file size limit of this process is reached"}
_NO_SPACE = (errno.ENOSPC, errno.EDQUOT)


def ledger_dir(explicit: str | None = None, make: bool = True) -> Path:
    """Where the ledger lives: --ledger, then $RGT_LEDGER, then ./.rgt (made when absent, unless `make` is false:
    a command that only reads it, such as a plan, leaves no directory behind)."""
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
    _ledgers.add(path)
    return path


def runs_dir(explicit: str | None = None) -> Path:
    """Where verified pulls land: --runs-dir, then $RGT_RUNS_DIR, then ./runs (made by the pull when absent)."""
    raw = explicit or os.environ.get("RGT_RUNS_DIR") or "runs"
    path = Path(raw).expanduser().resolve()
    if path.exists() and not path.is_dir():
        raise InputError(f"the runs dir {path} is a file, not a directory", fix="point --runs-dir (or "
                         "$RGT_RUNS_DIR) at a directory; rgt makes it when it does not exist", field="--runs-dir")
    return path


def write_refused(path: Path, exc: OSError) -> RgtError:
    """The one message for a write the disk refused: the file, why, and what to do (exit 1)."""
    where = Path(path).parent
    why = _WHY.get(exc.errno) or (exc.strerror or str(exc))
    in_ledger = any(where == root or root in where.parents for root in _ledgers)
    elsewhere = ("point --ledger (or $RGT_LEDGER) at a directory on another disk" if in_ledger
                 else "write it to another directory")
    if exc.errno in _NO_SPACE:
        fix = f"free space on the disk that holds {where} (`df -h {where}`), or {elsewhere}"
    elif exc.errno == errno.EFBIG:
        fix = f"raise the file size limit (`ulimit -f unlimited`), or {elsewhere}"
    else:
        fix = f"make {where} writable for this user, or {elsewhere}"
    return RgtError(f"could not write {path}: {why} ({exc.strerror or exc}); the file is left as it was",
                    fix=f"{fix}; then run the same command again")


def _write(path: Path, data: bytes, mode: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    _layout.atomic_write(str(path), data, mode)


def atomic_write_bytes(path: Path, data: bytes, mode: int = 0o644) -> None:
    """The box's atomic write (module_utils rgt_runlayout.atomic_write: tmp + fsync + rename + fsync dir), for the
    controller's files; the directory is made when absent. A refused write is an RgtError (write_refused)."""
    try:
        _write(path, data, mode)
    except OSError as exc:
        raise write_refused(path, exc) from exc


def cache_path(kind: str, name: str) -> Path:
    """`${XDG_CACHE_HOME:-~/.cache}/rgt/<kind>/<name>`: what this controller keeps between processes (parsed
    inventories, the built zipapp); never state: losing it costs the next process the work again."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "rgt" / kind / name


def cache_put(path: Path, data: bytes, keep: int, mode: int = 0o644) -> None:
    """Write a cache file atomically (its directory 0700) and keep the newest `keep` files of its kind. A cache that
    cannot be written is no error."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        _write(path, data, mode)
        for old in sorted(path.parent.glob("*" + path.suffix), key=lambda p: p.stat().st_mtime, reverse=True)[keep:]:
            old.unlink(missing_ok=True)
    except OSError:
        pass


def plain_json(value: object) -> bool:
    """Does `value` hold only JSON's own types (str keys; str, int, float, bool, None, list, dict), exactly? Then
    its JSON text says all a validator sees: a date, a tuple or an int key would read as a string or a list."""
    kind = type(value)
    if value is None or kind in (str, int, float, bool):
        return True
    if kind is list:
        return all(plain_json(item) for item in value)
    if kind is dict:
        return all(type(key) is str and plain_json(item) for key, item in value.items())
    return False


@functools.cache
def library_identity(name: str) -> str:
    """Where a library is installed and when its files were written: an upgrade (a new jsonschema, whose checks
    may differ) is another identity."""
    try:
        spec = importlib.util.find_spec(name)
        origin = spec.origin if spec else None
        return f"{name}:{origin}:{os.stat(origin).st_mtime_ns}" if origin else f"{name}:absent"
    except (ImportError, OSError, ValueError):
        return f"{name}:unknown"


PASSES_KEEP = 512  # validation passes remembered on disk, newest first


def pass_key(kind: str, doc: object, checker: bytes) -> Path | None:
    """Where a schema validation's pass of `doc` is remembered between processes (`kind`: what was validated;
    `checker`: the bytes that decide the verdict: the schemas and the code that validates). Keyed by the hash of
    the document's canonical JSON, the checker, the Python and the validation libraries' installed files, so an
    edited file, schema, validator or library is validated again. None (validate every time) for a document that
    holds anything but JSON's own types."""
    if not plain_json(doc):
        return None
    digest = hashlib.sha256()
    for part in (kind.encode(), checker, sys.version.encode(), library_identity("jsonschema").encode(),
                 library_identity("referencing").encode(), library_identity("jsonschema_specifications").encode(),
                 json.dumps(doc, sort_keys=True, separators=(",", ":"), allow_nan=True).encode()):
        digest.update(len(part).to_bytes(8, "big") + part)
    return cache_path("passes", f"{digest.hexdigest()[:40]}.ok")


def passed_before(key: Path | None) -> bool:
    """Did this exact document pass this exact validation before (pass_key)? Only a pass is remembered: a
    refusal is validated, and explained, every time."""
    return key is not None and key.is_file()


def remember_pass(key: Path | None) -> None:
    if key is not None:
        cache_put(key, b"", PASSES_KEEP)


def atomic_write_json(path: Path, doc: Any) -> None:
    atomic_write_bytes(path, (json.dumps(doc, indent=2, sort_keys=True, default=str) + "\n").encode())


def append_jsonl(path: Path, record: dict) -> None:
    """Append one line and fsync it: an event log must survive the laptop lid closing. A refused write cuts the
    file back to where it was (no half line) and is an RgtError (write_refused)."""
    line = (json.dumps(record, sort_keys=True, default=str) + "\n").encode("utf-8")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            start = os.lseek(fd, 0, os.SEEK_END)
            try:
                view = memoryview(line)
                while view:  # unbuffered: a short write is followed by the one that fails, nothing held back
                    view = view[os.write(fd, view):]
                os.fsync(fd)
            except OSError:
                _cut(fd, start)
                raise
        finally:
            os.close(fd)
    except OSError as exc:
        raise write_refused(path, exc) from exc


def _cut(fd: int, size: int) -> None:
    """Drop what a failed append left past `size` (a line the disk took only part of)."""
    try:
        os.ftruncate(fd, size)
    except OSError:
        pass  # the file stays as the disk left it: a reader skips a cut last line (rgt_runlayout.read_jsonl)


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
