#!/usr/bin/env python3
"""Run rsync with --info=progress2 and write its progress as JSON lines to a file that rgt-run tails.

Usage: rgt_rsync_progress.py --out FILE --host NAME --what upload|pull [--part NAME] [--total BYTES] -- rsync ARGS...

Used by the upload_resume and collect roles only when rgt-run asks for progress (it passes rgt_progress_dir when
its console is a terminal); a plain ansible-playbook run, or rgt-run without a terminal, calls rsync directly.
rsync's own output is passed through unchanged: its progress lines (ending in CR) go to FILE instead of stdout,
everything else on stdout (the --stats block) is written as rsync wrote it, stderr is rsync's own, and the exit
status is rsync's (killed by a signal: this process dies of the same signal). A progress FILE that cannot be
written never stops the transfer. FILE is an append-only scratch stream, not a state file: one JSON object a
line, at most four a second, {"event": "start"|"progress"|"end", "host", "what", "part", "t", ...}; a reader
skips a last line that is not complete yet.
Runs on the controller (delegated to localhost): Python 3.6+, stdlib only.
"""

import json
import os
import re
import signal
import subprocess
import sys
import time

# "   1,065,536  26%  1004.54kB/s    0:00:02  (xfr#1, to-chk=1/5)"; digit grouping follows the locale (, or .)
PROGRESS = re.compile(br"^\s*(\d[\d,.']*)\s+(\d+)%\s+(\S+/s)\s+(\d+:\d\d:\d\d)")
EVERY_S = 0.25
USAGE = "usage: rgt_rsync_progress.py --out FILE --host NAME --what WORDS [--part NAME] [--total BYTES] -- rsync ARGS"


def parse_args(argv):
    opts = {"out": None, "host": "", "what": "", "part": "", "total": None}
    i = 0
    while i < len(argv) and argv[i] != "--":
        key = argv[i][2:] if argv[i].startswith("--") else None
        if key not in opts or i + 1 >= len(argv):
            sys.stderr.write("rgt_rsync_progress.py: bad argument %r\n%s\n" % (argv[i], USAGE))
            sys.exit(2)
        opts[key] = argv[i + 1]
        i += 2
    command = argv[i + 1:]
    if not command or not opts["out"]:
        sys.stderr.write(USAGE + "\n")
        sys.exit(2)
    total = opts["total"]
    opts["total"] = int(total) if total and total.isdigit() else None
    return opts, command


class Stream:
    """The JSON-lines progress file; any error writing it turns it off, never the transfer."""

    def __init__(self, opts):
        self.opts = opts
        self.last = 0.0
        self.pending = None
        try:
            self.handle = open(opts["out"], "a")
        except OSError:
            self.handle = None

    def write(self, record, force=False):
        if self.handle is None:
            return
        record.update(host=self.opts["host"], what=self.opts["what"], part=self.opts["part"],
                      t=round(time.time(), 3))
        if self.opts["total"] is not None:
            record["total"] = self.opts["total"]
        now = time.monotonic()
        if not force and now - self.last < EVERY_S:
            self.pending = record
            return
        try:
            self.handle.write(json.dumps(record, sort_keys=True) + "\n")
            self.handle.flush()
        except (OSError, ValueError):
            self.handle = None
            return
        self.last = now
        self.pending = None

    def progress(self, match):
        size = int(re.sub(br"\D", b"", match.group(1)) or b"0")
        self.write({"event": "progress", "bytes": size, "pct": int(match.group(2)),
                    "rate": match.group(3).decode("ascii", "replace"), "eta": match.group(4).decode("ascii")})

    def close(self, rc):
        if self.pending is not None:
            self.write(self.pending, force=True)
        self.write({"event": "end", "rc": rc}, force=True)
        if self.handle is not None:
            try:
                self.handle.close()
            except OSError:
                pass


def pump(proc, stream, out):
    """Copy rsync's stdout to ours, diverting its progress lines (each ends in CR, the last in LF) to stream."""
    buf = b""
    while True:
        try:
            chunk = os.read(proc.stdout.fileno(), 65536)
        except InterruptedError:
            continue
        if not chunk:
            break
        buf += chunk
        while True:
            ends = [p for p in (buf.find(b"\r"), buf.find(b"\n")) if p >= 0]
            if not ends:
                break
            cut = min(ends)
            segment, term, buf = buf[:cut], buf[cut:cut + 1], buf[cut + 1:]
            match = PROGRESS.match(segment)
            if match:
                stream.progress(match)
            elif segment or term == b"\n":  # a bare CR (rsync clearing the line) carries nothing
                out.write(segment + term)
                out.flush()
    if buf:
        out.write(buf)
        out.flush()


def main():
    opts, command = parse_args(sys.argv[1:])
    command = [command[0], "--info=progress2"] + command[1:]
    stream = Stream(opts)
    stream.write({"event": "start"}, force=True)
    try:
        proc = subprocess.Popen(command, stdout=subprocess.PIPE)
    except OSError as exc:
        sys.stderr.write("rsync could not start: %s\n" % exc)
        stream.close(127)
        return 127
    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, lambda s, _f: proc.send_signal(s))
    pump(proc, stream, getattr(sys.stdout, "buffer", sys.stdout))
    rc = proc.wait()
    stream.close(rc)
    if rc < 0:  # rsync died of a signal: so does this process, so the caller sees what it would have seen
        signal.signal(-rc, signal.SIG_DFL)
        os.kill(os.getpid(), -rc)
        return 128 - rc
    return rc


if __name__ == "__main__":
    sys.exit(main())
