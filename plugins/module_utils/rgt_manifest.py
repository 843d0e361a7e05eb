# -*- coding: utf-8 -*-
# Copyright: rgt contributors
# SPDX-License-Identifier: Apache-2.0
"""The export manifest (docs/internals.md "Closeout, pull, verification, teardown"): build, validate, compare,
and the checkpoint load checks.

Pure Python 3.6+ stdlib; runs on the box (rgt_closeout) and on the controller (rgt_pull_verify, the runner).
numpy, safetensors and torch are optional: a checkpoint whose loader is not importable is reported with
`ok: None` (no loader), never counted as a failure here. Run as a script (`main`) this file is the checkpoint
loader another interpreter runs (`load_checkpoint_with`: the job's python, where those packages live).

Rules:
- a capsule holds regular files and directories only: a symlink anywhere (file or directory) is refused;
- paths are POSIX, relative to the capsule, sorted, no duplicate, and pass rgt_runlayout.check_relpath (no absolute
  path, no `..`, no empty component, no backslash);
- nothing inside the capsule is ignored (rsync's partial files live in a --partial-dir outside it);
- hashing reads 1 MiB chunks; an empty capsule is refused;
- hash once: a caller that has just hashed a file (the seal while it copies it, the pull's repair pass) hands
  `build_manifest` / `compare` its {path: (stat_key, sha256)}; a hash is taken from it only while the file's
  stat_key (device, inode, size, mtime_ns, ctime_ns) is unchanged, so any write, rename onto, utime or chmod since
  sends the file through sha256_file again.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import hashlib
import json
import os
import re
import stat
import struct
import subprocess
import sys
import time

SCHEMA = "rgt/manifest/v1"
CHUNK = 1 << 20  # a header bound below counts in these
# the one name rule and the one relative-path rule
from ansible_collections.rgt.remote_gpu.plugins.module_utils.rgt_runlayout import (
    check_name,
    check_relpath,
    read_blocks,
)

SHA_RE = re.compile(r"^[0-9a-f]{64}$")


class ManifestError(Exception):
    """A capsule or manifest that must not be trusted; `problems` lists every reason found."""

    def __init__(self, message, problems=None):
        Exception.__init__(self, message)
        self.message = message
        self.problems = list(problems or [message])


def sha256_file(path):
    digest = hashlib.sha256()
    for block in read_blocks(path):
        digest.update(block)
    return digest.hexdigest()


def stat_key(st):
    """What names one version of a file's bytes: [device, inode, size, mtime_ns, ctime_ns]. Writing the file,
    renaming another onto it, truncating it, touching its mtime or mode each change one of them (the ctime is the
    kernel's: no user can set it back)."""
    return [st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns]


def known_sha(known, rel, st):
    """The SHA-256 a caller recorded for rel while its stat_key was st's, else None (hash the file again)."""
    entry = (known or {}).get(rel)
    if entry and list(entry[0]) == stat_key(st) and isinstance(entry[1], str) and SHA_RE.match(entry[1]):
        return entry[1]
    return None


RACY_NS = 2 * 10 ** 9  # a file changed this recently may change again within its timestamps' granularity


def settled(before, after, started_ns):
    """True when a hash read between the stats `before` and `after` may be recorded under before's stat_key: the
    file did not change during the read, and its last change (ctime) is older than the read by RACY_NS, so that a
    later write cannot leave the same mtime_ns and ctime_ns behind (git's "racily clean" rule)."""
    return stat_key(before) == stat_key(after) and before.st_ctime_ns < started_ns - RACY_NS


def sha256_bytes(data):
    return hashlib.sha256(data).hexdigest()


def list_tree(root, refuse_symlinks=True):
    """(files, symlinks, others): sorted POSIX paths of regular files, symlinks and special files under root.

    Never follows a symlink. With refuse_symlinks, raises ManifestError naming every symlink and special file."""
    files, links, others = [], [], []
    root = os.path.abspath(root)
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        rel_dir = os.path.relpath(dirpath, root)
        keep = []
        for name in sorted(dirnames):
            rel = name if rel_dir == "." else rel_dir + "/" + name
            if os.path.islink(os.path.join(dirpath, name)):
                links.append(rel.replace(os.sep, "/"))
            else:
                keep.append(name)
        dirnames[:] = keep
        for name in filenames:
            rel = (name if rel_dir == "." else rel_dir + "/" + name).replace(os.sep, "/")
            mode = os.lstat(os.path.join(dirpath, name)).st_mode
            if stat.S_ISLNK(mode):
                links.append(rel)
            elif stat.S_ISREG(mode):
                files.append(rel)
            else:
                others.append(rel)
    files.sort()
    links.sort()
    others.sort()
    if refuse_symlinks and (links or others):
        problems = ["symlink: %s" % p for p in links] + ["not a regular file: %s" % p for p in others]
        raise ManifestError("the capsule holds symlinks or special files: " + ", ".join(problems[:20]), problems)
    return files, links, others


def build_manifest(root, run_id, host=None, instance_id=None, created_at=None, logs=None, known=None):
    """The manifest document of the capsule at root (one pass, 1 MiB chunks). `logs` (the seal's record of the
    run's logs: {max_bytes, files: [{path, source, source_bytes, bytes, sealed, capped, omitted, reason}]}) is kept
    as the manifest's `logs` when given; the files it seals are in `files` like every other file. `known`
    ({path: (stat_key, sha256)}, the seal's hashes taken while it copied) spares a file's second read while its
    stat_key is unchanged (known_sha)."""
    problem = check_name(run_id, "run id")
    if problem:
        raise ManifestError(problem)
    if os.path.islink(root):
        raise ManifestError("the capsule %s is a symlink" % root)
    if not os.path.isdir(root):
        raise ManifestError("the capsule %s is not a directory" % root)
    files, _links, _others = list_tree(root, refuse_symlinks=True)
    if not files:
        raise ManifestError("the capsule %s is empty" % root)
    real_root = os.path.realpath(root)
    entries = []
    total = 0
    for rel in files:
        reason = check_relpath(rel)
        full = os.path.join(root, *rel.split("/"))
        if reason is None and not os.path.realpath(full).startswith(real_root + os.sep):
            reason = "escapes the capsule"
        if reason:
            raise ManifestError("refused path %s: %s" % (rel, reason))
        st = os.lstat(full)
        size = st.st_size
        entries.append({"path": rel, "bytes": size, "sha256": known_sha(known, rel, st) or sha256_file(full)})
        total += size
    doc = {"schema": SCHEMA, "run_id": run_id, "host": host, "instance_id": instance_id,
           "created_at": created_at, "files": entries, "totals": {"files": len(entries), "bytes": total}}
    if logs is not None:
        doc["logs"] = logs
    return doc


def dumps(doc):
    """The manifest's bytes as written (the manifest_sha256 is over exactly these bytes)."""
    return (json.dumps(doc, sort_keys=True, indent=1) + "\n").encode("utf-8")


def validate_manifest(doc, run_id=None):
    """Every problem of a manifest document (empty list: valid). Checks schema, run_id, paths, sizes, hashes."""
    problems = []
    if not isinstance(doc, dict):
        return ["the manifest is not a JSON object"]
    if doc.get("schema") != SCHEMA:
        problems.append("schema is %r, expected %r" % (doc.get("schema"), SCHEMA))
    rid = doc.get("run_id")
    if check_name(rid, "run id"):
        problems.append(check_name(rid, "run id"))
    elif run_id is not None and rid != run_id:
        problems.append("run_id is %r, expected %r" % (rid, run_id))
    files = doc.get("files")
    if not isinstance(files, list) or not files:
        problems.append("files must be a non-empty list")
        return problems
    seen = set()
    total = 0
    paths = []
    for i, entry in enumerate(files):
        if not isinstance(entry, dict):
            problems.append("files[%d] is not an object" % i)
            continue
        path = entry.get("path")
        reason = check_relpath(path)
        if reason:
            problems.append("files[%d] path %r: %s" % (i, path, reason))
            continue
        if path in seen:
            problems.append("duplicate path %s" % path)
        seen.add(path)
        paths.append(path)
        size = entry.get("bytes")
        if not isinstance(size, int) or isinstance(size, bool) or size < 0:
            problems.append("%s: bytes %r is not a non-negative integer" % (path, size))
        else:
            total += size
        sha = entry.get("sha256")
        if not isinstance(sha, str) or not SHA_RE.match(sha):
            problems.append("%s: sha256 %r is not 64 lowercase hex digits" % (path, sha))
    if paths != sorted(paths):
        problems.append("files are not sorted by path")
    # a path cannot be both a file and a directory of another path
    for path in paths:
        parts = path.split("/")
        for k in range(1, len(parts)):
            if "/".join(parts[:k]) in seen:
                problems.append("%s is listed as a file and as a directory" % "/".join(parts[:k]))
    totals = doc.get("totals")
    if not isinstance(totals, dict) or totals.get("files") != len(files) or totals.get("bytes") != total:
        problems.append("totals %r do not match the files (%d files, %d bytes)" % (totals, len(files), total))
    problems += _log_problems(doc.get("logs", {"files": []}), seen)
    return problems


def _log_problems(logs, listed):
    """Problems of a manifest's optional `logs` record: every log it says is sealed must be a listed file."""
    if not isinstance(logs, dict) or not isinstance(logs.get("files"), list):
        return ["logs must be an object with a list of files"]
    problems = []
    for i, rec in enumerate(logs["files"]):
        if not isinstance(rec, dict):
            problems.append("logs.files[%d] is not an object" % i)
        elif rec.get("sealed") and rec.get("path") not in listed:
            problems.append("logs.files[%d] says %r is sealed, but the manifest does not list it"
                            % (i, rec.get("path")))
    return problems


def load_manifest(path, run_id=None):
    """(doc, raw bytes) of a manifest file; raises ManifestError on unreadable or invalid documents."""
    try:
        with open(path, "rb") as handle:
            raw = handle.read()
    except (IOError, OSError) as exc:
        raise ManifestError("cannot read the manifest %s: %s" % (path, exc)) from None
    try:
        doc = json.loads(raw.decode("utf-8"))
    except ValueError as exc:
        raise ManifestError("the manifest %s is not valid JSON: %s" % (path, exc)) from None
    problems = validate_manifest(doc, run_id)
    if problems:
        raise ManifestError("the manifest %s is invalid: %s" % (path, "; ".join(problems[:20])), problems)
    return doc, raw


def top_level_entries(doc):
    """Sorted first path components of the manifest (what a pull transfers one rsync session at a time)."""
    return sorted(set(e["path"].split("/", 1)[0] for e in doc["files"]))


def compare(root, doc, known=None, record=None):
    """Compare a local directory with a (valid) manifest.

    Returns {ok, missing, unexpected, size_mismatch, sha_mismatch, files, bytes}; lists hold paths. A local
    symlink or special file counts as unexpected (it is never followed). Nothing is ignored. `known` ({path:
    (stat_key, sha256)}) gives the hash of a file unchanged since it was hashed (known_sha); `record`, a dict,
    receives {path: [stat_key, sha256]} of every file of the right size whose hash may be reused (`settled`)."""
    expected = dict((e["path"], e) for e in doc["files"])
    result = {"missing": [], "unexpected": [], "size_mismatch": [], "sha_mismatch": []}
    if os.path.isdir(root) and not os.path.islink(root):
        files, links, others = list_tree(root, refuse_symlinks=False)
    else:
        files, links, others = [], [], []
    local = set(files)
    result["unexpected"] = sorted(set(links) | set(others) | (local - set(expected)))
    result["missing"] = sorted(p for p in expected if p not in local)
    checked = 0
    for path in sorted(local & set(expected)):
        entry = expected[path]
        full = os.path.join(root, *path.split("/"))
        st = os.lstat(full)
        if st.st_size != entry["bytes"]:
            result["size_mismatch"].append(path)
            continue
        digest = known_sha(known, path, st)
        if digest is None:
            started = time.time_ns() if hasattr(time, "time_ns") else int(time.time() * 1e9)
            digest = sha256_file(full)
            if record is not None and settled(st, os.lstat(full), started):
                record[path] = [stat_key(st), digest]
        elif record is not None:
            record[path] = [stat_key(st), digest]
        if digest != entry["sha256"]:
            result["sha_mismatch"].append(path)
            continue
        checked += 1
    result["ok"] = not any(result[k] for k in ("missing", "unexpected", "size_mismatch", "sha_mismatch"))
    result["files"] = doc["totals"]["files"]
    result["bytes"] = doc["totals"]["bytes"]
    result["matched"] = checked
    return result


def describe_problems(result, limit=20):
    """One line naming every missing/unexpected/mismatched file (first `limit` of each kind)."""
    labels = (("missing", "missing locally"), ("unexpected", "unexpected local file"),
              ("size_mismatch", "size differs"), ("sha_mismatch", "SHA-256 differs"))
    parts = []
    for key, label in labels:
        paths = result.get(key) or []
        if paths:
            more = " (+%d more)" % (len(paths) - limit) if len(paths) > limit else ""
            parts.append("%s: %s%s" % (label, ", ".join(paths[:limit]), more))
    return "; ".join(parts)


# ---------------------------------------------------------------- checkpoint load checks

def safetensors_header(path):
    """Structural check of a .safetensors file with the stdlib: header JSON, dtypes, offsets inside the file."""
    size = os.path.getsize(path)
    with open(path, "rb") as handle:
        head = handle.read(8)
        if len(head) != 8:
            raise ValueError("shorter than the 8-byte header length")
        (hlen,) = struct.unpack("<Q", head)
        if hlen > min(size - 8, 100 * CHUNK):
            raise ValueError("header length %d does not fit the file" % hlen)
        header = json.loads(handle.read(hlen).decode("utf-8"))
    data_len = size - 8 - hlen
    tensors = 0
    for name, info in header.items():
        if name == "__metadata__":
            continue
        start, end = info["data_offsets"]
        if not (0 <= start <= end <= data_len):
            raise ValueError("tensor %s has offsets outside the data" % name)
        tensors += 1
    return tensors


def _load_numpy(path, ext):
    import numpy  # noqa: F401 (optional)
    if ext == ".npy":
        arr = numpy.load(path, allow_pickle=False)
        return "array %s %s" % (arr.dtype, tuple(arr.shape))
    with numpy.load(path, allow_pickle=False) as archive:
        for key in archive.files:
            archive[key]  # forces every member to decode  # noqa: B018
        return "%d arrays" % len(archive.files)


def _load_torch(path):
    import torch  # optional
    obj = torch.load(path, map_location="cpu", weights_only=True)
    return type(obj).__name__


def loader_for(path):
    """The loader name a path would use ('numpy', 'safetensors', 'torch') or None."""
    lower = path.lower()
    if lower.endswith((".npy", ".npz")):
        return "numpy"
    if lower.endswith(".safetensors"):
        return "safetensors"
    if lower.endswith((".pt", ".pth")):
        return "torch"
    if lower.endswith(".bin"):
        import zipfile
        try:
            return "torch" if zipfile.is_zipfile(path) else None
        except (IOError, OSError):
            return None
    return None


def _importable(name):
    try:
        __import__(name)
        return True
    except Exception:  # an ImportError, or a broken install raising anything
        return False


def load_checkpoint(path, rel=None):
    """{path, loader, ok, detail}: ok True (loaded), False (failed to load), None (no loader available)."""
    rel = rel or path
    kind = loader_for(path)
    out = {"path": rel, "loader": None, "ok": None, "detail": None}
    if kind is None:
        out["detail"] = "no loader for this file type"
        return out
    try:
        if kind == "numpy":
            if not _importable("numpy"):
                out["detail"] = "numpy is not importable"
                return out
            out["loader"] = "numpy"
            out["detail"] = _load_numpy(path, os.path.splitext(path)[1].lower())
        elif kind == "safetensors":
            out["loader"] = "safetensors-header"
            tensors = safetensors_header(path)
            out["detail"] = "%d tensors" % tensors
            if _importable("safetensors") and _importable("numpy"):
                from safetensors.numpy import load_file
                out["loader"] = "safetensors"
                out["detail"] = "%d tensors" % len(load_file(path))
        else:
            if not _importable("torch"):
                out["detail"] = "torch is not importable"
                return out
            out["loader"] = "torch"
            out["detail"] = _load_torch(path)
        out["ok"] = True
    except Exception as exc:  # any loader error means: does not load
        out["ok"] = False
        out["detail"] = ("%s: %s" % (type(exc).__name__, exc))[:500]
    return out


def load_checkpoint_with(python, path, rel=None, loader=None, timeout=600):
    """load_checkpoint run by another interpreter (the job's, where numpy/torch live): `loader` is this file as a
    script (the flat bundle `ckpt_loader` of module_utils/rgt_bundle: rgt_manifest.py and the module_utils it
    imports, side by side), run as `<python> <loader> <path> <rel>`. In-process when `python` is this interpreter
    or no loader is given, and when the other interpreter cannot run it (missing, crashed, no JSON line)."""
    if not python or python == sys.executable or not loader:
        return load_checkpoint(path, rel)
    try:
        proc = subprocess.run([python, loader, path, rel or path], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              timeout=timeout)
        lines = proc.stdout.decode("utf-8", "replace").strip().splitlines()
        if proc.returncode == 0 and lines:
            return json.loads(lines[-1])
    except (OSError, ValueError, subprocess.SubprocessError):
        pass
    return load_checkpoint(path, rel)


def main(argv):
    """The checkpoint loader (load_checkpoint_with): `rgt_manifest.py <path> <rel>` prints load_checkpoint's
    result as one JSON line."""
    if len(argv) != 3:
        sys.stderr.write("usage: rgt_manifest.py <checkpoint path> <path in the capsule>\n")
        return 2
    sys.stdout.write(json.dumps(load_checkpoint(argv[1], argv[2])) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
