# -*- coding: utf-8 -*-
# Copyright: rgt contributors
# SPDX-License-Identifier: Apache-2.0
"""Read a run's logs/job.log on the box by byte offset (`rgt-run logs`, shipped in the runner's zipapp).

`start_offset(path, newest_attempt, tail_lines)`: where a first read starts: the newest attempt's
`== rgt attempt N started` line (rgt_reconcile.ATTEMPT_MARKER; the wrapper writes it), or the last N lines. Every
read is by blocks (CHUNK): memory stays bounded however long a line of the log is.
`stream(...)`: writes a one-line JSON header then the raw bytes from an offset; with follow, keeps writing what
is appended until the run has ended (no live wrapper holds .rgt/lock and exit.json is there) or the session that
asked is gone (its parent changed). Resuming from the byte offset the reader has counted never repeats a byte.
Python 3.6+, stdlib only."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import json
import os
import time

from ansible_collections.rgt.remote_gpu.plugins.module_utils import rgt_reconcile, rgt_runlayout

MARKER = b"== rgt attempt "
CHUNK = 64 * 1024
MARKER_LINE_CAP = 4096  # bytes of a marker line kept (the wrapper writes one short line)


def attempt_offsets(path):
    """[(byte offset, line)] of every `== rgt attempt N started` line, in order: one forward scan by blocks for the
    marker at the start of a line, so a line of any length costs no more memory than a block; a marker line is
    read back for at most MARKER_LINE_CAP bytes."""
    found = []
    try:
        handle = open(path, "rb")
    except (IOError, OSError):
        return found
    needle = b"\n" + MARKER
    keep = len(needle) - 1  # a needle cut by a block boundary is found with the next block, never twice
    with handle:
        window, base = b"\n", -1  # a newline before byte 0: a marker on the first line counts
        while True:
            data = handle.read(CHUNK)
            if not data:
                break
            window += data
            starts = []
            at = window.find(needle)
            while at >= 0:
                starts.append(base + at + 1)
                at = window.find(needle, at + 1)
            if starts:
                resume = handle.tell()
                for start in starts:
                    handle.seek(start)
                    line = handle.readline(MARKER_LINE_CAP).decode("utf-8", "replace").rstrip("\n")
                    if rgt_reconcile.ATTEMPT_MARKER.match(line):
                        found.append((start, line))
                handle.seek(resume)
            tail = window[-keep:] if len(window) > keep else window
            base += len(window) - len(tail)
            window = tail
    return found


def tail_offset(path, lines, floor=0):
    """The byte offset where the last `lines` lines of the file start (never before floor)."""
    try:
        size = os.path.getsize(path)
        handle = open(path, "rb")
    except (IOError, OSError):
        return floor
    with handle:
        end = size
        handle.seek(max(floor, end - 1))
        if end > floor and handle.read(1) == b"\n":
            end -= 1  # a final newline does not start a line
        count = 0
        pos = end
        while pos > floor:
            step = min(CHUNK, pos - floor)
            handle.seek(pos - step)
            data = handle.read(step)
            at = len(data)
            while True:
                at = data.rfind(b"\n", 0, at)
                if at < 0:
                    break
                count += 1
                if count == lines:
                    return pos - step + at + 1
            pos -= step
    return floor


def start_offset(path, newest_attempt=True, tail_lines=None):
    floor = 0
    if newest_attempt:
        marks = attempt_offsets(path)
        if marks:
            floor = marks[-1][0]
    if tail_lines is not None:
        return tail_offset(path, max(0, int(tail_lines)), floor) if tail_lines > 0 else _size(path)
    return floor


def _size(path):
    try:
        return os.path.getsize(path)
    except (IOError, OSError):
        return 0


def run_ended(paths):
    return not rgt_runlayout.lock_held(paths.lock) and os.path.exists(paths.exit)


def stream(params, out, sleep=time.sleep):
    """Header line {"path", "offset", "size", "attempts": [[offset, line]], "exists"} then raw bytes from offset."""
    durable = rgt_runlayout.expand_root(params["durable_root"])
    paths = rgt_runlayout.RunPaths(durable, params["project"], params["run_id"])  # ValueError: a bad name
    offset = params.get("offset")
    if offset is None:
        offset = start_offset(paths.log, params.get("newest_attempt", True), params.get("tail"))
    exists = os.path.exists(paths.log)
    header = {"path": paths.log, "offset": offset, "size": _size(paths.log), "exists": exists,
              "run_dir": paths.run_dir,
              "attempts": [[o, ln] for o, ln in attempt_offsets(paths.log)] if exists else []}
    out.write((json.dumps(header) + "\n").encode("utf-8"))
    out.flush()
    interval = float(params.get("interval", 0.5))
    parent = os.getppid()
    while True:
        ended = run_ended(paths)  # looked at before the read: what was written before the end is sent
        try:
            handle = open(paths.log, "rb")
        except (IOError, OSError):
            handle = None
        if handle is not None:
            with handle:
                handle.seek(offset)
                while True:
                    data = handle.read(64 * 1024)
                    if not data:
                        break
                    out.write(data)
                    offset += len(data)
                out.flush()
        if not params.get("follow") or ended:
            return offset
        if os.getppid() != parent:
            return offset  # the connection that asked is gone (the reader reconnects and resumes by offset)
        sleep(interval)
