# -*- coding: utf-8 -*-
# Copyright: rgt contributors
# SPDX-License-Identifier: Apache-2.0
"""Declared outputs and checkpoints under a run directory, resolved without ever following a symlink
(docs/internals.md "Closeout, pull, verification, teardown").

One home for the rule, used by rgt_closeout (what is sealed), rgt_status (`outputs_missing`) and rgt_pull_verify
(which manifest paths a declared checkpoint covers). Python 3.6+, stdlib only; runs on the box.

An entry (relative to `out/` or `ckpt/`) is
- a file: it must be a regular file;
- a directory: collected recursively, regular files only (a trailing `/` says it must be a directory);
- a glob: `*`, `?` and `[...]` matched one path component at a time (`checkpoint-*/model.safetensors`, `*.json`);
  a wildcard never matches a name starting with `.` unless the pattern component starts with `.` too (as in a
  shell). A file entry or a directory entry exists or is missing; a glob needs at least one match.

Every component, from the run directory down, is opened with O_NOFOLLOW relative to its parent's descriptor, and
files are copied from the descriptor that was opened, so no symlink is ever followed, even one swapped in while
the closeout runs. A symlink or a special file met on the way is refused and named, never skipped. Entries with
an absolute path, a backslash, `..`, `.` or an empty component are refused (rgt_runlayout.check_relpath).
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import errno
import fnmatch
import hashlib
import os
import stat

from ansible_collections.rgt.remote_gpu.plugins.module_utils.rgt_manifest import CHUNK
from ansible_collections.rgt.remote_gpu.plugins.module_utils.rgt_runlayout import check_relpath

GLOB_CHARS = ("*", "?", "[")
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_DIR_FLAGS = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | os.O_NOFOLLOW | _CLOEXEC
_FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | getattr(os, "O_NONBLOCK", 0) | _CLOEXEC


class Refused(Exception):
    """A symlink or a special file on a path that would be exported; the message names it."""


def is_glob(component):
    return any(c in component for c in GLOB_CHARS)


def split_entry(entry):
    """(components, must_be_dir) of a declared entry; ValueError naming the reason when it is refused."""
    if not isinstance(entry, str):
        raise ValueError("not a string")
    must_be_dir = entry.endswith("/") and entry.strip("/") != ""
    core = entry.rstrip("/") if must_be_dir else entry
    reason = check_relpath(core)
    if reason:
        raise ValueError(reason)
    return core.split("/"), must_be_dir


def component_matches(name, pattern):
    """fnmatch of one path component; a wildcard does not match a leading '.' unless the pattern has one."""
    if not is_glob(pattern):
        return name == pattern
    if name.startswith(".") and not pattern.startswith("."):
        return False
    return fnmatch.fnmatchcase(name, pattern)


def _link_text(dir_fd, name):
    try:
        return " -> %s" % os.readlink(name, dir_fd=dir_fd)
    except (OSError, TypeError, NotImplementedError):
        return ""


def _lstat(dir_fd, name):
    """lstat of name in dir_fd, or None when absent."""
    try:
        return os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except OSError as exc:
        if exc.errno in (errno.ENOENT, errno.ENOTDIR):
            return None
        raise


def open_dir(dir_fd, name, label):
    """Descriptor of the directory `name` in dir_fd, never through a symlink. None when absent; Refused when
    `name` is a symlink or not a directory (`label` names it in the message)."""
    try:
        return os.open(name, _DIR_FLAGS, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno == errno.ENOENT:
            return None
        if exc.errno in (errno.ELOOP, errno.ENOTDIR, errno.EMLINK):
            st = _lstat(dir_fd, name)
            if st is not None and stat.S_ISLNK(st.st_mode):
                raise Refused("%s is a symlink%s (nothing is followed)" % (label, _link_text(dir_fd, name))) from None
            if st is None:
                return None
            raise Refused("%s is not a directory" % label) from None
        raise


def open_run_subdir(run_dir, name):
    """Descriptor of <run_dir>/<name> (`out`, `ckpt`): the run dir is opened as given, `name` never through a
    symlink. None when either is absent; Refused when `name` is a symlink or not a directory."""
    try:
        run_fd = os.open(run_dir, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | _CLOEXEC)
    except OSError as exc:
        if exc.errno in (errno.ENOENT, errno.ENOTDIR):
            return None
        raise
    try:
        return open_dir(run_fd, name, name + "/")
    finally:
        os.close(run_fd)


def walk_files(dir_fd, prefix, label, problems):
    """Sorted relative paths (prefix/...) of every regular file under dir_fd. A symlink or special file is added
    to `problems` (named with `label`), never followed or copied."""
    files = []
    for name in sorted(os.listdir(dir_fd)):
        rel = prefix + "/" + name if prefix else name
        st = _lstat(dir_fd, name)
        if st is None:
            continue  # vanished while listing
        if stat.S_ISLNK(st.st_mode):
            problems.append("%s%s is a symlink%s (nothing is followed)" % (label, rel, _link_text(dir_fd, name)))
        elif stat.S_ISREG(st.st_mode):
            files.append(rel)
        elif stat.S_ISDIR(st.st_mode):
            try:
                sub = open_dir(dir_fd, name, label + rel)
            except Refused as exc:
                problems.append(str(exc))
                continue
            if sub is None:
                continue
            try:
                files.extend(walk_files(sub, rel, label, problems))
            finally:
                os.close(sub)
        else:
            problems.append("%s%s is not a regular file or directory" % (label, rel))
    return files


class Resolved(object):
    """What one entry resolved to: matched (the file/dir exists, or the glob matched), files (regular files,
    relative to the base dir, when walked), problems (symlinks, special files: each one refuses the entry)."""

    def __init__(self, entry):
        self.entry = entry
        self.matched = False
        self.files = []
        self.problems = []

    @property
    def ok(self):
        return self.matched and not self.problems


def resolve_entry(base_fd, entry, label="", walk=True):
    """Resolve one declared entry under base_fd (the opened `out/` or `ckpt/`); `label` ("out/") prefixes names
    in messages. walk=False only decides existence (a matched directory is not listed: the status poll)."""
    res = Resolved(entry)
    try:
        parts, must_be_dir = split_entry(entry)
    except ValueError as exc:
        res.problems.append("%s%s is refused: %s" % (label, entry, exc))
        return res
    _match(base_fd, parts, "", must_be_dir, label, walk, res)
    res.files = sorted(set(res.files))
    return res


def _match(dir_fd, parts, prefix, must_be_dir, label, walk, res):
    pattern, last = parts[0], len(parts) == 1
    if is_glob(pattern):
        names = sorted(n for n in os.listdir(dir_fd) if component_matches(n, pattern))
    else:
        names = [pattern]
    for name in names:
        rel = prefix + "/" + name if prefix else name
        st = _lstat(dir_fd, name)
        if st is None:
            continue
        if stat.S_ISLNK(st.st_mode):
            res.problems.append("%s%s is a symlink%s (nothing is followed)" % (label, rel, _link_text(dir_fd, name)))
            continue
        if stat.S_ISDIR(st.st_mode):
            if last and not walk:
                res.matched = True
                continue
            try:
                sub = open_dir(dir_fd, name, label + rel)
            except Refused as exc:
                res.problems.append(str(exc))
                continue
            if sub is None:
                continue
            try:
                if last:
                    res.matched = True
                    res.files.extend(walk_files(sub, rel, label, res.problems))
                else:
                    _match(sub, parts[1:], rel, must_be_dir, label, walk, res)
            finally:
                os.close(sub)
        elif stat.S_ISREG(st.st_mode):
            if last and not must_be_dir:
                res.matched = True
                res.files.append(rel)
            # a file where a directory is needed: no match (a literal entry is then missing)
        elif last or not is_glob(pattern):
            res.problems.append("%s%s is not a regular file or directory" % (label, rel))


def resolve(base_fd, entries, label="", walk=True):
    """{"files": sorted unique relative paths, "missing": [entries], "problems": [messages], "entries": [Resolved]}
    for a list of entries. base_fd None (the base dir is absent) makes every entry missing."""
    out = {"files": [], "missing": [], "problems": [], "entries": []}
    seen = set()
    for entry in entries:
        if base_fd is None:
            res = Resolved(entry)
            try:
                split_entry(entry)
            except ValueError as exc:
                res.problems.append("%s%s is refused: %s" % (label, entry, exc))
        else:
            res = resolve_entry(base_fd, entry, label, walk)
        out["entries"].append(res)
        if not res.matched and not res.problems:
            out["missing"].append(entry)
        out["problems"].extend(res.problems)
        for rel in res.files:
            if rel not in seen:
                seen.add(rel)
                out["files"].append(rel)
    out["files"].sort()
    return out


def missing_words(entry, label, what="required output"):
    """How a missing entry is named: a glob matches nothing, a file or directory is missing."""
    try:
        parts, _d = split_entry(entry)
    except ValueError:
        parts = [entry]
    if any(is_glob(p) for p in parts):
        return "%s %s%s matches nothing" % (what, label, entry)
    return "%s %s%s is missing" % (what, label, entry)


def present(run_dir, sub, entries):
    """{entry: bool} for the status poll: True when the entry exists under <run_dir>/<sub> (a file or directory,
    or a glob with at least one match) with no symlink or special file on its path. Never walks a directory."""
    entries = list(entries or [])
    try:
        base = open_run_subdir(run_dir, sub)
    except (Refused, OSError):
        return dict((e, False) for e in entries)
    try:
        result = {}
        for entry in entries:
            try:
                result[entry] = base is not None and resolve_entry(base, entry, sub + "/", walk=False).ok
            except OSError:
                result[entry] = False
        return result
    finally:
        if base is not None:
            os.close(base)


def copy_file(base_fd, rel, dst, label=""):
    """Copy the regular file `rel` (under base_fd) to dst: every component opened with O_NOFOLLOW relative to
    its parent's descriptor, the bytes read from the descriptor that was opened; mode and mtime kept, dst fsynced.
    Refused when a component is a symlink (or the file is not a regular file). Returns the SHA-256 of the bytes
    copied (the seal's manifest takes it instead of reading dst again: rgt_manifest.known_sha)."""
    parts = rel.split("/")
    fds = []
    try:
        cur = base_fd
        for i, name in enumerate(parts[:-1]):
            sub = open_dir(cur, name, label + "/".join(parts[:i + 1]))
            if sub is None:
                raise Refused("%s%s vanished during the closeout" % (label, rel))
            fds.append(sub)
            cur = sub
        try:
            src = os.open(parts[-1], _FILE_FLAGS, dir_fd=cur)
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise Refused("%s%s is a symlink%s (nothing is followed)"
                              % (label, rel, _link_text(cur, parts[-1]))) from None
            if exc.errno == errno.ENOENT:
                raise Refused("%s%s vanished during the closeout" % (label, rel)) from None
            raise
        fds.append(src)
        st = os.fstat(src)
        if not stat.S_ISREG(st.st_mode):
            raise Refused("%s%s is not a regular file" % (label, rel))
        parent = os.path.dirname(dst)
        if parent and not os.path.isdir(parent):
            os.makedirs(parent)
        out = os.open(dst, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _CLOEXEC, 0o600)
        digest = hashlib.sha256()
        try:
            while True:
                block = os.read(src, CHUNK)
                if not block:
                    break
                digest.update(block)
                view = memoryview(block)
                while view:
                    view = view[os.write(out, view):]
            os.fchmod(out, stat.S_IMODE(st.st_mode))
            os.fsync(out)
        finally:
            os.close(out)
        os.utime(dst, ns=(st.st_atime_ns, st.st_mtime_ns))
        return digest.hexdigest()
    finally:
        for fd in reversed(fds):
            os.close(fd)


def match_listed(paths, entry, base=""):
    """The paths of a listing (e.g. a manifest's, `ckpt/...`) that `entry` covers under `base` ("ckpt"): the
    file itself, every file under a matched directory, every match of a glob. Pure string matching."""
    try:
        parts, must_be_dir = split_entry(entry)
    except ValueError:
        return []
    prefix = base.strip("/").split("/") if base.strip("/") else []
    n = len(prefix) + len(parts)
    found = []
    for path in paths:
        comps = path.split("/")
        if len(comps) < n or comps[:len(prefix)] != prefix:
            continue
        if must_be_dir and len(comps) == n:
            continue
        if all(component_matches(comps[len(prefix) + i], part) for i, part in enumerate(parts)):
            found.append(path)
    return found
