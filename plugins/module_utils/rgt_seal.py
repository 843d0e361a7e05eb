# -*- coding: utf-8 -*-
# Copyright: rgt contributors
# SPDX-License-Identifier: Apache-2.0
"""Seal a finished run as export/<run_id> with an external manifest (docs/internals.md "Closeout, pull,
verification, teardown"): the closeout's whole logic, without Ansible.

Two callers, one rule: the module rgt_closeout (over SSH, a thin AnsibleModule around `seal`) and the Kubernetes
engine's seal pod (module_utils/rgt_k8s_seal.py, run by the job's own python in the user's image with
the claim mounted; runner/rgt/k8s_engine.seal). Python 3.6+, stdlib only.

- `seal(params, check_mode=False) -> result`: params are the module's options (durable_root, project, run_id,
  host, instance_id, job_name, outputs, declared_checkpoints, attempt, force_unfinished, loader_python,
  log_max_mb; absent optional ones take the module's defaults; and loader, the checkpoint loader's script when
  loader_python is another interpreter). The result is what the module returns (changed,
  sealed, capsule, manifest_path, run_dir, msg, manifest_sha256, files, bytes, checkpoints, not_pulled, attempt,
  logs).
- The run's logs go into the capsule's `logs/` (`gather_logs`): `logs/job.log` (every attempt), the wrapper's
  `.rgt/attempts.jsonl` as `logs/attempts.jsonl`, every other regular file at the top of the run's `logs/`
  (`wrapper.log`, Slurm's `slurm-<job id>.out`) and, for a sweep cell run as a Slurm array task, its
  `sweeps/<sweep>/logs/slurm-<array id>_<task>.out`. A log larger than its cap (log_max_mb, default LOG_MAX_MB
  MiB, lowered to what the disk has room for while leaving a floor free) keeps its first and last halves around
  a line that says what was left out; one that cannot be copied is not sealed. Either way the seal goes on and
  the `logs` record (in run.json, the manifest and the result) says so: a log never refuses the candidate.
- `SealError(msg, result)`: every refusal; `result` holds what the module returns with it (quarantine and reason
  for a quarantined candidate, exit for an unfinished run).

Imports its siblings under their collection names (module_utils/rgt_bundle: the seal pod gets it and them as the
flat bundle `k8s_seal`, one ConfigMap directory, with no Ansible).
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import errno
import fcntl
import hashlib
import json
import os
import re
import shutil
import stat
import time

from ansible_collections.rgt.remote_gpu.plugins.module_utils import rgt_manifest as mf
from ansible_collections.rgt.remote_gpu.plugins.module_utils import rgt_outputs as outs
from ansible_collections.rgt.remote_gpu.plugins.module_utils import rgt_slurm
from ansible_collections.rgt.remote_gpu.plugins.module_utils.rgt_runlayout import (
    RunPaths,
    atomic_write,
    check_relpath,
    expand_root,
    fsync_dir,
    read_json,
    read_jsonl,
)

LOG_MAX_MB = 256  # the cap of one log file in the capsule unless log_max_mb (collect_log_max_mb) says otherwise
# the module's optional options and their defaults (rgt_closeout's argument_spec)
# (and `loader`: the checkpoint loader script on this machine, rgt_manifest.load_checkpoint_with's; rgt_closeout
# installs its loader_bundle for it, the seal pod has it beside its own script)
DEFAULTS = dict(project="rgt", instance_id=None, job_name=None, outputs=(), declared_checkpoints=(), attempt=None,
                force_unfinished=False, loader_python=None, loader=None, log_max_mb=LOG_MAX_MB)


class SealError(Exception):
    """A refused or failed seal: `msg` says why; `result` is returned with it (quarantine, reason, exit ...)."""

    def __init__(self, msg, result=None):
        Exception.__init__(self, msg)
        self.msg = msg
        self.result = dict(result or {})

    @property
    def quarantine(self):
        return self.result.get("quarantine")

    @property
    def reason(self):
        return self.result.get("reason")


def now_iso():
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def hashed(hashes, rel, dst, sha):
    """Record in `hashes` the SHA-256 of the bytes just copied to dst, under dst's stat_key as it is now (the
    manifest reads the file again only when it changed since: rgt_manifest.known_sha)."""
    if hashes is not None and sha:
        hashes[rel] = (mf.stat_key(os.lstat(dst)), sha)


def gather(run_dir, sub, entries, partial, what, everything=False, hashes=None):
    """Copy what `entries` name under <run_dir>/<sub> (`out`, `ckpt`) into <partial>/<sub>, never through a
    symlink (module_utils/rgt_outputs). everything=True takes all of <sub>. Returns (copied paths relative to
    <sub>, problems); `hashes` receives each copy's {<sub>/<path>: (stat_key, sha256)} (hashed)."""
    label = sub + "/"
    problems = []
    try:
        base = outs.open_run_subdir(run_dir, sub)
    except outs.Refused as exc:
        return [], ["%s: %s" % ("everything in out/" if everything else what + "s", exc)]
    if base is None:
        if everything:
            return [], ["out/ is missing"]
        return [], [outs.missing_words(e, label, what) for e in entries]
    try:
        if everything:
            files = outs.walk_files(base, "", label, problems)
        else:
            res = outs.resolve(base, entries, label)
            files = res["files"]
            problems += [outs.missing_words(e, label, what) for e in res["missing"]]
            for r in res["entries"]:
                if r.problems:
                    problems.append("%s %s%s refused: %s" % (what, label, r.entry, "; ".join(r.problems)))
        for rel in files:  # what resolved cleanly is copied even when another entry failed (quarantine shows it)
            dst = os.path.join(partial, sub, *rel.split("/"))
            try:
                hashed(hashes, label + rel, dst, outs.copy_file(base, rel, dst, label))
            except outs.Refused as exc:
                problems.append(str(exc))
        return files, problems
    finally:
        os.close(base)


# ---------------------------------------------------------------- the run's logs

MIB = 1 << 20
LOG_MIN_BYTES = 64 << 10  # less room than this on the box's disk: the log is not sealed (and the record says why)
LOG_FLOOR_BYTES = 64 * MIB  # a log copy leaves this much of the export's disk free (or LOG_FLOOR_SHARE of it):
LOG_FLOOR_SHARE = 0.05  # another run on the box keeps room for its own records
_LOG_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
LOG_ABSENT = "not sealed: it is not on the box"
# a sealed export is never rebuilt, so a log left out stays out: the way to keep it is to copy it before teardown
LOG_STAYS = "it stays on the box until teardown (`rgt-run logs --all` prints a run's job.log)"
_ARRAY_TASK = re.compile(r"^[0-9]+_[0-9]+$")  # a Slurm array task's id, <array job id>_<index>


def _mib(n):
    """A size in words: bytes below 10 KiB, else KiB or MiB with one decimal."""
    if n < 10 << 10:
        return "%d bytes" % n
    return "%.1f KiB" % (n / 1024.0) if n < MIB else "%.1f MiB" % (n / float(MIB))


def log_room(directory):
    """(bytes a log copy into `directory` may use, the floor left free): the free space (for an unprivileged
    writer) less the floor (LOG_FLOOR_BYTES, or LOG_FLOOR_SHARE of a smaller disk). (None, 0) when the filesystem
    cannot say."""
    try:
        st = os.statvfs(directory)
    except OSError:
        return None, 0
    floor = min(LOG_FLOOR_BYTES, int(st.f_blocks * st.f_frsize * LOG_FLOOR_SHARE))
    return max(0, st.f_bavail * st.f_frsize - floor), floor


def _write(out, data, digest):
    """Write all of data to the descriptor out, hashing it into digest."""
    digest.update(data)
    view = memoryview(data)
    while view:
        view = view[os.write(out, view):]


def _copy_range(src, out, start, end, digest):
    """Copy bytes [start, end) of the descriptor src to out in CHUNK blocks, hashing what is written into digest;
    the count copied (less at an EOF)."""
    pos = start
    while pos < end:
        block = os.pread(src, min(mf.CHUNK, end - pos), pos)
        if not block:
            break
        _write(out, block, digest)
        pos += len(block)
    return pos - start


def _capped(src, out, size, limit, why, source, digest):
    """Write the first and the last ~limit/2 bytes of src (cut at line ends) to out with a line between them that
    says what was left out and why. Returns (bytes written, [first omitted byte, end of the omitted range))."""
    head = os.pread(src, limit // 2, 0)
    cut = head.rfind(b"\n")
    if cut >= 0:
        head = head[:cut + 1]
    start = size - (limit - len(head))
    probe = os.pread(src, min(mf.CHUNK, size - start), start)
    cut = probe.find(b"\n")
    if cut >= 0 and start + cut + 1 < size:
        start += cut + 1
    line = ("%s== rgt: bytes %d to %d of this log (%d of its %d bytes) are not in the export: %s; the whole log "
            "stays on the box at %s until teardown ==\n" % ("" if head.endswith(b"\n") or not head else "\n",
                                                             len(head), start, start - len(head), size, why, source))
    written = 0
    for data in (head, line.encode("utf-8")):
        _write(out, data, digest)
        written += len(data)
    return written + _copy_range(src, out, start, size, digest), [len(head), start]


def _not_sealed(rec, why):
    rec.update(path=None, bytes=0, sealed=False, capped=False, omitted=None, reason=why)
    return rec


def copy_log(dir_fd, name, dst, max_bytes, source, share=1, hashes=None):
    """Copy the log `name` (under dir_fd, opened without following a symlink) to dst: whole when it fits its cap
    (max_bytes, lowered to its `share` of log_room: the room left divided among the logs still to copy), else
    capped (_capped). Never raises for the log itself: what could not be copied is a record with sealed false and
    the reason (and no file at dst). The record: {path (in the capsule, or None), source (the box's path),
    source_bytes, bytes, sealed, capped, omitted ([start, end) left out, or None), reason (None for a whole
    copy)}. `hashes` receives the copy's {logs/<name>: (stat_key, sha256)} (hashed)."""
    rec = {"path": "logs/" + os.path.basename(dst), "source": source, "source_bytes": None, "bytes": 0,
           "sealed": False, "capped": False, "omitted": None, "reason": None}
    try:
        src = os.open(name, _LOG_FLAGS, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            try:
                target = " -> %s" % os.readlink(name, dir_fd=dir_fd)
            except OSError:
                target = ""
            return _not_sealed(rec, "not sealed: it is a symlink%s (nothing is followed)" % target)
        if exc.errno == errno.ENOENT:
            return _not_sealed(rec, LOG_ABSENT)
        return _not_sealed(rec, "not sealed: it cannot be opened (%s)" % (exc.strerror or exc))
    out = None
    try:
        st = os.fstat(src)
        rec["source_bytes"] = st.st_size if stat.S_ISREG(st.st_mode) else None
        if stat.S_ISDIR(st.st_mode):
            return _not_sealed(rec, "not sealed: it is a directory (the files at the top of logs/ are sealed)")
        if not stat.S_ISREG(st.st_mode):
            return _not_sealed(rec, "not sealed: it is not a regular file")
        size = st.st_size
        parent = os.path.dirname(dst)
        room, floor = log_room(os.path.dirname(parent))  # the candidate's dir, on the export's disk
        limit, why = max_bytes, "it is capped at %s (collect_log_max_mb)" % _mib(max_bytes)
        if room is not None and room // share < limit:
            limit = room // share
            why = "the box's disk has room for only %s of it (%s is left free%s)" % (
                _mib(limit), _mib(floor), ", the rest shared with %d more log(s)" % (share - 1) if share > 1 else "")
        if size > limit and limit < LOG_MIN_BYTES:
            return _not_sealed(rec, "not sealed: it has %s and the box's disk has room for %s (%s is left free); "
                                    "%s" % (_mib(size), _mib(limit), _mib(floor), LOG_STAYS))
        if not os.path.isdir(parent):
            os.makedirs(parent)
        out = os.open(dst, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), 0o600)
        digest = hashlib.sha256()
        if size <= limit:  # the size when it was opened: a finished run's log does not grow
            rec["bytes"] = _copy_range(src, out, 0, size, digest)
        else:
            rec["bytes"], rec["omitted"] = _capped(src, out, size, limit, why, source, digest)
            rec["capped"] = True
            rec["reason"] = "capped: bytes %d to %d (%s of %s) are not in the export: %s" % (
                rec["omitted"][0], rec["omitted"][1], _mib(rec["omitted"][1] - rec["omitted"][0]), _mib(size), why)
        os.fchmod(out, stat.S_IMODE(st.st_mode))
        os.fsync(out)
        os.close(out)
        out = None
        os.utime(dst, ns=(st.st_atime_ns, st.st_mtime_ns))
        hashed(hashes, rec["path"], dst, digest.hexdigest())
        rec["sealed"] = True
        return rec
    except (IOError, OSError) as exc:
        if out is not None:
            os.close(out)
        if os.path.lexists(dst):
            os.unlink(dst)
        full = exc.errno in (errno.ENOSPC, errno.EDQUOT)
        return _not_sealed(rec, "not sealed: %s (%s); %s" % ("the box's disk filled up while it was copied" if full
                                                             else "it could not be copied", exc.strerror or exc,
                                                             LOG_STAYS))
    finally:
        os.close(src)


def _array_logs(paths):
    """(sweep logs dir, [file names]) of a sweep cell that ran as a Slurm array task (its .rgt/slurm.json names
    the array and the sweep dir): Slurm wrote the task's output to <sweep_dir>/logs/slurm-<array>_<task>.out
    (rgt_detach.Sbatch.submit_array). None for any other run."""
    record = rgt_slurm.read_record(paths.meta) or {}
    sweep_dir = record.get("comment")
    if record.get("array_job_id") is None or not isinstance(sweep_dir, str):
        return None
    sweep_dir = sweep_dir.rstrip("/")
    name = os.path.basename(sweep_dir)
    if check_relpath(name) or paths.sweep_dir(name) != sweep_dir:  # the project's own sweeps/<name>, nothing else
        return None
    ids = [s.get("job_id") for s in record.get("submits") or [] if isinstance(s, dict)] + [record.get("job_id")]
    names = []
    for job_id in ids:
        name = "slurm-%s.out" % job_id
        if isinstance(job_id, str) and _ARRAY_TASK.match(job_id) and name not in names:
            names.append(name)
    return sweep_dir, names


def _open(parent, sub):
    """(descriptor of <parent>/<sub> opened without following `sub`, or None; why it was refused, or None)."""
    try:
        return outs.open_run_subdir(parent, sub), None
    except outs.Refused as exc:
        return None, "not sealed: %s" % exc
    except OSError as exc:
        return None, "not sealed: %s/ cannot be opened (%s)" % (sub, exc.strerror or exc)


def _names(dir_fd, where, files):
    """The entries of the directory dir_fd ([] for None); one that cannot be listed is a record in `files`."""
    if dir_fd is None:
        return []
    try:
        return os.listdir(dir_fd)
    except OSError as exc:
        files.append(_not_sealed({"source": where, "source_bytes": None}, "not sealed: the directory cannot be "
                                 "listed (%s)" % (exc.strerror or exc)))
        return []


def _size_of(dir_fd, name):
    try:
        st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except OSError:
        return 0
    return st.st_size if stat.S_ISREG(st.st_mode) else 0


def gather_logs(paths, partial, max_bytes, hashes=None):
    """Copy the run's logs into <partial>/logs/ (copy_log): logs/job.log, .rgt/attempts.jsonl (as
    logs/attempts.jsonl), the other entries at the top of logs/ (wrapper.log, slurm-<id>.out; a directory or a link
    is recorded, not followed), and a Slurm array task's output from its sweep's logs/. The smallest are copied
    first, each with an equal share of the room the disk has left, so a huge log never crowds out the attempt
    records. Returns the `logs` record for run.json and the manifest: {max_bytes, files: [copy_log's], in the
    order above}; `hashes` receives each copy's hash (copy_log)."""
    files, taken, jobs = [], set(), []
    logs_fd, logs_why = _open(paths.run_dir, "logs")
    meta_fd, meta_why = _open(paths.run_dir, ".rgt")
    opened = [fd for fd in (logs_fd, meta_fd) if fd is not None]
    try:
        others = sorted(n for n in _names(logs_fd, paths.logs, files) if n != "job.log")
        plan = [(logs_fd, logs_why, paths.logs, "job.log", "job.log", True),
                (meta_fd, meta_why, paths.meta, "attempts.jsonl", "attempts.jsonl", True)]
        plan += [(logs_fd, None, paths.logs, n, n, False) for n in others]
        array = _array_logs(paths)
        if array is not None:
            sweep_fd, sweep_why = _open(array[0], "logs")
            if sweep_fd is not None:
                opened.append(sweep_fd)
                present = set(_names(sweep_fd, os.path.join(array[0], "logs"), files))
                plan += [(sweep_fd, None, os.path.join(array[0], "logs"), n, n, False)
                         for n in array[1] if n in present]
        for fd, why, where, name, as_name, required in plan:
            rec = {"path": None, "source": os.path.join(where, name), "source_bytes": None}
            if why is not None or fd is None:
                if why is not None or required:
                    files.append(_not_sealed(rec, why or LOG_ABSENT))
            elif as_name in taken:
                files.append(_not_sealed(rec, "not sealed: the export's logs/%s is the wrapper's %s" % (
                    as_name, os.path.join(paths.meta, as_name))))
            elif check_relpath("logs/" + as_name):
                files.append(_not_sealed(rec, "not sealed: its name cannot be a path in the export (%s)"
                                         % check_relpath("logs/" + as_name)))
            else:
                taken.add(as_name)
                files.append(None)  # copied below
                jobs.append((len(files) - 1, fd, name, as_name, rec["source"]))
        jobs.sort(key=lambda job: (_size_of(job[1], job[2]), job[0]))
        for done, (index, fd, name, as_name, source) in enumerate(jobs):
            files[index] = copy_log(fd, name, os.path.join(partial, "logs", as_name), max_bytes, source,
                                    share=len(jobs) - done, hashes=hashes)
    finally:
        for fd in opened:
            os.close(fd)
    return {"max_bytes": max_bytes, "files": files}


def log_warnings(logs):
    """One line per log that is capped or not sealed (the closeout's warnings, the pull's notes)."""
    return ["%s: %s" % (f.get("source"), f.get("reason")) for f in (logs or {}).get("files") or []
            if isinstance(f, dict) and f.get("reason")]


def attempts_of(paths):
    """Attempts from attempts.jsonl: start and end records merged by attempt number."""
    merged = {}
    for rec in read_jsonl(paths.attempts):
        num = rec.get("attempt")
        if num is None:
            continue
        merged.setdefault(num, {"attempt": num}).update(rec)
    return [merged[k] for k in sorted(merged, key=lambda x: (str(type(x)), x))]


def sealed_logs(capsule):
    """The `logs` record of a sealed capsule (its run.json), or None: sealed before logs were part of it."""
    logs = (read_json(os.path.join(capsule, "run.json")) or {}).get("logs")
    return logs if isinstance(logs, dict) else None


def _box_relative(paths, source):
    """A log's box path as PROVENANCE.md names it: relative to the run dir when it is inside it."""
    source = str(source)
    return source[len(paths.run_dir) + 1:] if source.startswith(paths.run_dir + os.sep) else source


def not_pulled(paths, capsule):
    """What the run dir holds that the sealed capsule leaves out, and why (for PROVENANCE.md)."""
    try:
        sealed, _l, _o = mf.list_tree(capsule, refuse_symlinks=False)
    except OSError:
        sealed = []
    logs = sealed_logs(capsule)
    sealed = set(sealed)
    sealed_ckpt = set(f.split("/")[1] for f in sealed if f.startswith("ckpt/"))
    out = []
    try:
        names = sorted(os.listdir(paths.run_dir))
    except OSError:
        names = []
    for name in names:
        if name.startswith("code-"):
            out.append({"path": name + "/", "reason": "shipped code (immutable copy of the local tree)"})
        elif name == "data":
            out.append({"path": "data/", "reason": "input data (shipped from the controller)"})
        elif name == "logs" and logs is None:
            out.append({"path": "logs/", "reason": "logs stay on the box (this export was sealed before logs were "
                                                   "part of it)"})
        elif name == "logs":
            continue  # what a log record says, below
        elif name == ".rgt":
            out.append({"path": ".rgt/", "reason": "wrapper state; the attempts are in run.json and "
                                                   "logs/attempts.jsonl"})
        elif name == "ckpt":
            try:
                ckpts = sorted(os.listdir(paths.ckpt))
            except OSError:
                ckpts = []
            for ck in ckpts:
                if ck not in sealed_ckpt:
                    out.append({"path": "ckpt/" + ck, "reason": "not a declared checkpoint (rolling/resume state)"})
        elif name == "out":
            extra = []
            try:
                base = outs.open_run_subdir(paths.run_dir, "out")
            except (outs.Refused, OSError):
                base = None
            if base is not None:
                try:
                    extra = outs.walk_files(base, "", "out/", [])
                except OSError:
                    extra = []
                finally:
                    os.close(base)
            for rel in extra:
                if "out/" + rel not in sealed:
                    out.append({"path": "out/" + rel, "reason": "not a declared output"})
        else:
            out.append({"path": name, "reason": "outside out/, ckpt/ and logs/"})
    for rec in (logs or {}).get("files") or []:  # a capped log, or one left on the box (not one that is absent)
        if isinstance(rec, dict) and rec.get("reason") and rec["reason"] != LOG_ABSENT:
            out.append({"path": _box_relative(paths, rec.get("source")), "reason": rec["reason"]})
    return out


def unique_dir(base):
    if not os.path.exists(base):
        return base
    n = 2
    while os.path.exists("%s.%d" % (base, n)):
        n += 1
    return "%s.%d" % (base, n)


def write_manifest(capsule, manifest_path, p):
    doc = mf.build_manifest(capsule, p["run_id"], host=p["host"], instance_id=p["instance_id"],
                            created_at=now_iso(), logs=sealed_logs(capsule))
    raw = mf.dumps(doc)
    atomic_write(manifest_path, raw)
    return doc, raw


def seal(params, check_mode=False):
    """Seal the run `params` name (the closeout's options); the module's result, or SealError. A sealed export is
    never touched again (a no-op that says "already sealed"); a bad candidate is quarantined. One seal of a run at a
    time: the job wrapper's seal at the job's end (an offload, module_utils/rgt_offload) and a pull's closeout take
    the run's .rgt/seal.lock, so the second one finds the export sealed and leaves it as it is."""
    lock = None
    meta = _run_meta(params)
    if meta and os.path.isdir(meta) and not check_mode:
        try:
            lock = os.open(os.path.join(meta, "seal.lock"), os.O_RDWR | os.O_CREAT, 0o600)
            fcntl.flock(lock, fcntl.LOCK_EX)
        except OSError:
            lock = None
    try:
        return _seal(params, check_mode)
    finally:
        if lock is not None:
            os.close(lock)


def _run_meta(params):
    try:
        return RunPaths(expand_root(params["durable_root"]), params.get("project") or DEFAULTS["project"],
                        params["run_id"]).meta
    except (KeyError, TypeError, ValueError):
        return None


def _seal(params, check_mode):
    p = dict(DEFAULTS)
    p.update((k, v) for k, v in params.items() if v is not None or k not in DEFAULTS)
    p["outputs"], p["declared_checkpoints"] = list(p["outputs"] or []), list(p["declared_checkpoints"] or [])
    if not isinstance(p["log_max_mb"], int) or isinstance(p["log_max_mb"], bool) or p["log_max_mb"] < 1:
        raise SealError("nothing sealed: log_max_mb (collect_log_max_mb) is %r: give a whole number of MiB, at "
                        "least 1 (default %d)" % (p["log_max_mb"], LOG_MAX_MB))
    try:
        paths = RunPaths(expand_root(p["durable_root"]), p["project"], p["run_id"])
    except ValueError as exc:
        raise SealError("nothing sealed: %s" % exc) from None
    for label, items in (("outputs", p["outputs"]), ("declared_checkpoints", p["declared_checkpoints"])):
        for item in items:
            try:
                outs.split_entry(item)
            except ValueError as exc:
                raise SealError("%s entry %r is refused: %s" % (label, item, exc)) from None
    capsule = os.path.join(paths.export_dir, p["run_id"])
    manifest_path = capsule + ".manifest.json"
    partial = os.path.join(paths.partial_dir, p["run_id"])
    outputs_all = not p["outputs"]
    result = dict(changed=False, sealed=False, capsule=capsule, manifest_path=manifest_path, run_dir=paths.run_dir)

    # 1. a sealed export is never touched again
    if os.path.isdir(capsule) and not os.path.islink(capsule):
        return _sealed_before(p, paths, capsule, manifest_path, result, check_mode)

    if not os.path.isdir(paths.run_dir):
        raise SealError("no run %s on this box (%s does not exist)" % (p["run_id"], paths.run_dir), result)

    # 2. only a finished run is sealed
    exit_doc = read_json(paths.exit) or {}
    if exit_doc.get("reason") != "finished" and not p["force_unfinished"]:
        raise SealError("run is not finished: %s (exit.json reason %s); pass collect_force_unfinished=true to seal "
                        "it anyway" % (p["run_id"], exit_doc.get("reason") or "absent"),
                        dict(result, exit=exit_doc or None))
    attempts = attempts_of(paths)
    attempt = p["attempt"]
    if attempt is None:
        nums = [a["attempt"] for a in attempts if isinstance(a.get("attempt"), int)]
        attempt = max(nums) if nums else exit_doc.get("attempt") or 0
    if check_mode:
        return dict(result, changed=True, msg="would seal %s" % capsule)

    # 3. build the candidate in export/.partial/<run_id> (a leftover of a cut closeout is rebuilt)
    job = read_json(paths.job) or {}
    checkpoints = []
    logs = None
    hashes = {}  # {path in the capsule: (stat_key, sha256)} of every copy, hashed while it was copied
    try:
        if os.path.lexists(partial):
            shutil.rmtree(partial) if os.path.isdir(partial) and not os.path.islink(partial) else os.unlink(partial)
        os.makedirs(partial)
        problems = []
        _files, found = gather(paths.run_dir, "out", p["outputs"], partial, "required output", everything=outputs_all,
                               hashes=hashes)
        problems += found
        if p["declared_checkpoints"]:
            ck_files, found = gather(paths.run_dir, "ckpt", p["declared_checkpoints"], partial, "declared checkpoint",
                                     hashes=hashes)
            problems += found
            if not found:
                checkpoints = [("ckpt/" + rel, os.path.join(partial, "ckpt", *rel.split("/"))) for rel in ck_files]
        results = bool(os.listdir(partial))  # outputs or checkpoints: the logs come with results, never instead
        if results and not problems:  # the results first: a log never takes an output's room, nor refuses the seal
            logs = gather_logs(paths, partial, p["log_max_mb"] * MIB, hashes)
        code_dir = job.get("code_dir") or ""
        run_doc = {"schema": "rgt/run/v1", "run_id": p["run_id"], "host": p["host"],
                   "instance_id": p["instance_id"], "job_name": p["job_name"] or p["run_id"],
                   "command": job.get("command"),
                   "code_hash8": os.path.basename(code_dir)[5:] if os.path.basename(code_dir).startswith("code-")
                   else None,
                   "attempts": attempts, "exit": exit_doc or None, "created_at": now_iso()}
        if logs is not None:
            run_doc["logs"] = logs
        atomic_write(os.path.join(partial, "run.json"), json.dumps(run_doc, sort_keys=True, indent=1) + "\n")

        # 4. validate: no symlinks anywhere, something besides run.json, checkpoints load
        try:
            mf.list_tree(partial, refuse_symlinks=True)
        except mf.ManifestError as exc:
            problems.append(exc.message)
        if not results and not problems:
            problems.append("nothing to export: no outputs in out/ and no declared checkpoints")
        loads = []
        for rel, full in checkpoints:
            res = mf.load_checkpoint_with(p["loader_python"], full, rel, p["loader"])
            loads.append(res)
            if res["ok"] is False:
                problems.append("declared checkpoint %s does not load (%s): %s" % (rel, res["loader"], res["detail"]))
        result["checkpoints"] = loads
        fsync_dir(partial)
    except (IOError, OSError) as exc:
        problems = ["closeout error: %s" % exc]
        result.setdefault("checkpoints", [])

    if problems:
        _quarantine(p, paths, partial, attempt, problems, result)

    # 5b. seal: one atomic rename (same filesystem; the destination must be absent), then the manifest
    if os.path.lexists(capsule):
        raise SealError("%s appeared during the closeout; a sealed export is never overwritten" % capsule, result)
    try:
        doc = mf.build_manifest(partial, p["run_id"], host=p["host"], instance_id=p["instance_id"],
                                created_at=now_iso(), logs=logs, known=hashes)
        os.rename(partial, capsule)
        fsync_dir(paths.export_dir)
        fsync_dir(paths.partial_dir)
        raw = mf.dumps(doc)
        atomic_write(manifest_path, raw)
    except mf.ManifestError as exc:
        raise SealError("closeout of %s refused: %s" % (p["run_id"], exc.message), result) from None
    result.update(changed=True, sealed=True, msg="sealed %s" % capsule, manifest_sha256=mf.sha256_bytes(raw),
                  files=doc["totals"]["files"], bytes=doc["totals"]["bytes"], attempt=attempt,
                  not_pulled=not_pulled(paths, capsule), logs=logs)
    return result


def _sealed_before(p, paths, capsule, manifest_path, result, check_mode):
    """Step 1 of a seal: the export exists. Its manifest is read (never rewritten); a manifest whose write was
    cut (a crash between the rename and the write) is written now."""
    result.update(sealed=True, logs=sealed_logs(capsule))
    if os.path.isfile(manifest_path):
        try:
            doc, raw = mf.load_manifest(manifest_path, p["run_id"])
        except mf.ManifestError as exc:
            raise SealError("sealed export %s has a bad manifest (never rewritten): %s" % (capsule, exc.message),
                            result) from None
        result.update(msg="already sealed: %s" % capsule, manifest_sha256=mf.sha256_bytes(raw),
                      files=doc["totals"]["files"], bytes=doc["totals"]["bytes"],
                      not_pulled=not_pulled(paths, capsule))
        return result
    if check_mode:
        return dict(result, changed=True, msg="would write the missing manifest")
    try:
        doc, raw = write_manifest(capsule, manifest_path, p)
    except mf.ManifestError as exc:
        raise SealError("sealed export %s cannot be manifested: %s" % (capsule, exc.message),
                        result) from None
    result.update(changed=True, msg="sealed earlier; manifest written now", manifest_sha256=mf.sha256_bytes(raw),
                  files=doc["totals"]["files"], bytes=doc["totals"]["bytes"], not_pulled=not_pulled(paths, capsule))
    return result


def _quarantine(p, paths, partial, attempt, problems, result):
    """Step 5a: move the failed candidate to quarantine/<run_id>--<attempt> (never over an earlier one) with its
    REASON.txt, and raise the SealError that names it."""
    reason = "; ".join(problems)
    qdir = unique_dir(os.path.join(paths.quarantine_dir, "%s--%s" % (p["run_id"], attempt)))
    try:
        if not os.path.isdir(paths.quarantine_dir):
            os.makedirs(paths.quarantine_dir)
        if not os.path.isdir(partial):
            os.makedirs(partial)
        os.rename(partial, qdir)
        atomic_write(os.path.join(qdir, "REASON.txt"),
                     "run %s attempt %s on %s (%s), %s\n%s\n" % (p["run_id"], attempt, p["host"], p["instance_id"],
                                                                 now_iso(), "\n".join(problems)))
        fsync_dir(paths.quarantine_dir)
    except (IOError, OSError) as exc:
        reason += " (and quarantining failed: %s)" % exc
    result.update(changed=True, quarantine=qdir, reason=reason)
    raise SealError("closeout of %s failed, candidate moved to %s: %s" % (p["run_id"], qdir, reason), result)
