# -*- coding: utf-8 -*-
# Copyright: rgt contributors
# SPDX-License-Identifier: Apache-2.0
"""rsync on the controller: one home for how rgt moves files to and from a box (docs/internals.md "Transfer").

upload_resume (code and data) and collect (the repair and each top-level entry of the capsule) call it through the
rgt_transfer action plugin; the runner may call it directly (`Connection`, `Transfer`, `run`, `pull`). It decides:

- how rsync reaches the box: the host's own Ansible connection variables, so the same port, key, options and host
  key pins as Ansible (`Connection`); `ansible_connection: local` copies with a local rsync;
- the argv (`Transfer.argv`): archive mode without owner/group, resumable (`--partial`, a partial dir), an I/O
  timeout, `--stats`, a log file that counts what every attempt moved, an optional file list and bandwidth cap;
- what is worth another attempt (`should_retry`: the exit codes of `RETRY_RCS`, never a host-key failure); each
  attempt resumes where the last stopped;
- what was moved (`count_log`: bytes and files summed over every attempt from rsync's log; `changed`: at least one
  file's data was sent);
- the live progress stream rgt-run tails (`Progress`: `<dir>/<host>.<upload|pull>.jsonl`, runner/rgt/progress.py);
- the messages when a transfer fails (`push_failure`, `pull_failure`: the exit codes named, the advice to re-run).

Controller only (rsync runs here), but stdlib and Python 3.6+ like every module_util.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import json
import os
import re
import shutil
import subprocess
import tempfile
import threading
import time
from shlex import quote

# rsync exit codes worth another attempt: 10 socket I/O, 12 protocol data stream (the link broke), 30 timeout in
# data send/receive, 35 timeout waiting for a daemon connection, 255 ssh failed. Anything else (a missing file, a
# full disk, bad options) fails the same way again.
RETRY_RCS = (10, 12, 30, 35, 255)
HOST_KEY_FAILED = "Host key verification failed"  # ssh's words when the box's key does not match its pin

# What rsync's -e gets before the host's own ansible_ssh_common_args and ansible_ssh_extra_args (the runner's pins
# live in the extra args; ssh keeps the first value of an option, and nothing here sets the host key options).
SSH_OPTIONS = "-o BatchMode=yes -o ConnectTimeout=15 -o ServerAliveInterval=10 -o ServerAliveCountMax=3"
LOCAL_CONNECTIONS = ("local", "ansible.builtin.local")
PARTIAL_DIR = ".rsync-partial"  # relative: inside each destination directory
LOG_FORMAT = "%i %b %n"  # itemized change, bytes moved, name: count_log reads it

RESUME_HINT = "re-run to resume (completed files are kept, the partial file continues)."
HOST_KEY_HINT = "The host key does not match its pin: check it with rgt-run pin; never retried."
STDERR_MAX = 600  # characters of rsync's stderr in a push failure message
PULL_STDERR_MAX = 400  # in a pull failure message (all failed transfers together)
REPAIR_NAMES_MAX = 300  # characters of the repaired files' names in the repair's label


class TransferError(Exception):
    """A transfer that could not be started (its destination could not be made); nothing was sent."""


def truncate(text, length):
    """Jinja's truncate(length): keep whole words, end with '...', leave text within 5 characters of length."""
    if len(text) <= length + 5:
        return text
    return text[:length - 3].rsplit(" ", 1)[0] + "..."


def squash(text):
    """rsync's stderr on one line."""
    return re.sub(r"\s+", " ", str(text or "").strip())


def host_key_failed(stderr):
    return HOST_KEY_FAILED in str(stderr or "")


def should_retry(rc, stderr):
    """Another attempt can get further: a broken link or a timeout, never a host key that fails its pin."""
    return rc in RETRY_RCS and not host_key_failed(stderr)


# ---------------------------------------------------------------------------------------------------- the box


class Connection(object):
    """How rsync reaches one box: the host's Ansible connection variables, already templated."""

    def __init__(self, name, host=None, user="", port=None, key="", common_args="", extra_args="", local=False):
        self.name = name  # the inventory name: what messages call the box
        self.host = host or name
        self.user = user or ""
        self.port = port
        self.key = key or ""
        self.common_args = common_args or ""
        self.extra_args = extra_args or ""
        self.local = bool(local)

    # the variables read, the same ones Ansible's ssh connection reads for these settings
    VARS = ("ansible_connection", "ansible_host", "ansible_user", "ansible_port", "ansible_ssh_private_key_file",
            "ansible_ssh_common_args", "ansible_ssh_extra_args")

    @classmethod
    def from_vars(cls, name, hostvars):
        """`hostvars`: the host's values of VARS (absent ones left out); `name`: its inventory_hostname."""
        return cls(name, host=hostvars.get("ansible_host"), user=hostvars.get("ansible_user"),
                   port=hostvars.get("ansible_port"), key=hostvars.get("ansible_ssh_private_key_file"),
                   common_args=hostvars.get("ansible_ssh_common_args"),
                   extra_args=hostvars.get("ansible_ssh_extra_args"),
                   local=(hostvars.get("ansible_connection") or "ssh") in LOCAL_CONNECTIONS)

    def rsh(self):
        """The -e remote shell: `ssh -p PORT [-i KEY] SSH_OPTIONS <common args> <extra args>`."""
        parts = ["ssh", "-p", str(self.port or 22)]
        if self.key:
            parts += ["-i", quote(str(self.key))]
        parts += [SSH_OPTIONS, str(self.common_args), str(self.extra_args)]
        return " ".join(p for p in parts if p)

    def target(self):
        """`[user@]host:`; an IPv6 literal gets brackets."""
        host = str(self.host)
        if ":" in host and not host.startswith("["):
            host = "[%s]" % host
        return "%s%s:" % ("%s@" % self.user if self.user else "", host)

    def path(self, path):
        """A path on the box as rsync names it."""
        return path if self.local else self.target() + path


# ---------------------------------------------------------------------------------------------------- argv


class Transfer(object):
    """One rsync session: `src` to `dest` (a directory), pushed to the box or pulled from it.

    `src` ending in "/" sends the directory's contents, else the entry itself; `files_from` limits it to the
    NUL-separated list of paths relative to `src`; `ignore_times` re-sends them even when size and mtime match;
    `mkdir` makes `dest` first (a push). A pull passes the paths to the box's rsync unsplit (-s); a push reaches
    it through --rsync-path's shell (`mkdir -p DEST && rsync`), so its paths are plain."""

    def __init__(self, connection, src, dest, push=True, files_from=None, ignore_times=False, mkdir=False,
                 partial_dir=PARTIAL_DIR, timeout_s=60, bwlimit=None, label=None):
        self.connection = connection
        self.src = src
        self.dest = dest.rstrip("/") or "/"
        self.push = push
        self.files_from = files_from
        self.ignore_times = ignore_times
        self.mkdir = mkdir
        self.partial_dir = partial_dir or PARTIAL_DIR
        self.timeout_s = timeout_s
        self.bwlimit = bwlimit
        self.label = label or src

    def argv(self, log_file=None, progress=False):
        argv = ["rsync"] + (["--info=progress2"] if progress else []) + ["-a"]
        argv += [] if self.push else ["-s"]
        argv += ["--no-owner", "--no-group"]
        argv += ["--ignore-times"] if self.ignore_times else []
        argv += ["--partial", "--partial-dir=" + self.partial_dir]
        argv += ["--timeout=%d" % int(self.timeout_s)] if self.timeout_s is not None else []
        argv += ["--stats"]
        argv += ["--from0", "--files-from=" + self.files_from] if self.files_from else []
        argv += ["--log-file=" + log_file, "--log-file-format=" + LOG_FORMAT] if log_file else []
        argv += ["--bwlimit=%d" % int(self.bwlimit)] if self.bwlimit else []
        if not self.connection.local:
            argv += ["-e", self.connection.rsh()]
            if self.mkdir and self.push:
                argv += ["--rsync-path=mkdir -p %s && rsync" % quote(self.dest)]
        dest = self.dest if self.dest.endswith("/") else self.dest + "/"
        if self.push:
            return argv + [self.src, self.connection.path(dest)]
        return argv + [self.connection.path(self.src), dest]

    def make_dest(self):
        """A push to a local-connection box makes its destination here (a remote one: --rsync-path)."""
        if not (self.mkdir and self.push and self.connection.local):
            return
        try:
            if not os.path.isdir(self.dest):
                os.makedirs(self.dest)
            if os.stat(self.dest).st_mode & 0o7777 != 0o755:
                os.chmod(self.dest, 0o755)
        except OSError as exc:
            raise TransferError("cannot make %s: %s" % (self.dest, exc.strerror or exc)) from None


# ---------------------------------------------------------------------------------------------------- progress

# "   1,065,536  26%  1004.54kB/s    0:00:02  (xfr#1, to-chk=1/5)"; digit grouping follows the locale (, or .)
PROGRESS_LINE = re.compile(br"^\s*(\d[\d,.']*)\s+(\d+)%\s+(\S+/s)\s+(\d+:\d\d:\d\d)")
PROGRESS_EVERY_S = 0.25


def progress_file(directory, host, what):
    """The file rgt-run tails for one host's upload or pull (runner/rgt/progress.py)."""
    return os.path.join(directory, "%s.%s.jsonl" % (host, what))


class Progress(object):
    """Where one transfer's progress goes: an append-only JSON-lines scratch stream (not a state file), one object a
    line, at most four a second, {"event": "start"|"progress"|"end", "host", "what", "part", "t", ["total"], ...};
    a reader skips a last line that is not complete yet. `what`: upload or pull; `part`: code, data, repair or a
    pulled entry; `total`: the bytes of the host's whole transfer."""

    def __init__(self, path, host, what, part="", total=None):
        self.path = path
        self.host = host
        self.what = what
        self.part = part
        self.total = total

    def for_part(self, part):
        return Progress(self.path, self.host, self.what, part, self.total)


class _Stream(object):
    """One rsync run's records; any error writing the file turns it off, never the transfer."""

    def __init__(self, progress):
        self.progress = progress
        self.last = 0.0
        self.pending = None
        try:
            self.handle = open(progress.path, "a")
        except (IOError, OSError):
            self.handle = None

    def write(self, record, force=False):
        if self.handle is None:
            return
        record.update(host=self.progress.host, what=self.progress.what, part=self.progress.part,
                      t=round(time.time(), 3))
        if self.progress.total is not None:
            record["total"] = self.progress.total
        now = time.monotonic()
        if not force and now - self.last < PROGRESS_EVERY_S:
            self.pending = record
            return
        try:
            self.handle.write(json.dumps(record, sort_keys=True) + "\n")
            self.handle.flush()
        except (IOError, OSError, ValueError):
            self.handle = None
            return
        self.last = now
        self.pending = None

    def line(self, match):
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
            except (IOError, OSError):
                pass


def _pump(stdout, stream):
    """rsync's stdout with its progress lines (each ends in CR, the last in LF) diverted to stream."""
    out, buf = [], b""
    while True:
        try:
            chunk = os.read(stdout.fileno(), 65536)
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
            match = PROGRESS_LINE.match(segment)
            if match:
                stream.line(match)
            elif segment or term == b"\n":  # a bare CR (rsync clearing the line) carries nothing
                out.append(segment + term)
    out.append(buf)
    return b"".join(out)


def run_rsync(argv, progress=None):
    """One rsync run: (rc, stdout, stderr) as bytes. With `progress`, argv carries --info=progress2
    (Transfer.argv(progress=True)) and its progress lines go to the stream, not into stdout; the rest of stdout (the
    --stats block), stderr and the exit status are rsync's own. A signal that kills rsync gives rc -N."""
    stream = _Stream(progress) if progress is not None else None
    if stream:
        stream.write({"event": "start"}, force=True)
    try:
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    except OSError as exc:
        if stream:
            stream.close(127)
        return 127, b"", ("rsync could not start: %s\n" % exc).encode()
    errors = []
    reader = threading.Thread(target=lambda: errors.append(proc.stderr.read()))
    reader.daemon = True
    reader.start()
    try:
        if stream:
            stdout = _pump(proc.stdout, stream)
        else:
            stdout = proc.stdout.read()
        rc = proc.wait()
        reader.join()
    finally:
        if proc.poll() is None:  # interrupted here: rsync never outlives its caller
            proc.kill()
            proc.wait()
            reader.join(5)  # its ssh may hold stderr a moment longer
        proc.stdout.close()
        if not reader.is_alive():
            proc.stderr.close()
    if stream:
        stream.close(rc)
    return rc, stdout, b"".join(errors)


# ---------------------------------------------------------------------------------------------------- counting

LOG_SENT = re.compile(r"\] sent ([\d,.']+) bytes(?:\s+received ([\d,.']+) bytes)?")
LOG_FILE = re.compile(r"\] [<>]f\S* ")
STATS_SIZE = re.compile(r"^Total file size: ([\d,.']+) bytes", re.M)


def _number(text):
    return int(re.sub(r"\D", "", text) or "0")


def count_log(text):
    """(bytes sent, bytes received, files whose data moved) summed over every attempt in rsync's --log-file
    (LOG_FORMAT). A sender logs its totals even when the link broke, so a cut upload still counts what it sent."""
    sent = received = 0
    for match in LOG_SENT.finditer(text):
        sent += _number(match.group(1))
        received += _number(match.group(2) or "")
    return sent, received, len(LOG_FILE.findall(text))


def total_size(stdout):
    """The bytes of every file the transfer covers (--stats "Total file size"), or None without the stats."""
    found = STATS_SIZE.findall(stdout)
    return _number(found[-1]) if found else None


# ---------------------------------------------------------------------------------------------------- running


def _text(data):
    return data.decode("utf-8", "replace") if isinstance(data, bytes) else str(data or "")


def run(transfer, retries=0, delay_s=0, progress=None, sleep=time.sleep):
    """Run `transfer`, with up to `retries` more attempts `delay_s` apart while should_retry; each resumes. Returns
    {rc, attempts, changed, failed, stdout, stderr (the last attempt's), cmd, bytes_sent, bytes_received,
    files_transferred (every attempt), size, item (the transfer's label)}. Raises TransferError when the
    destination could not be made."""
    transfer.make_dest()
    scratch = tempfile.mkdtemp(prefix="rgt-rsync-")
    log_file = os.path.join(scratch, "rsync.log")
    try:
        argv = transfer.argv(log_file=log_file, progress=progress is not None)
        attempts = 0
        while True:
            attempts += 1
            rc, stdout, stderr = run_rsync(argv, progress)
            if rc == 0 or attempts > retries or not should_retry(rc, _text(stderr)):
                break
            sleep(delay_s)
        try:
            with open(log_file, "rb") as handle:
                log = _text(handle.read())
        except (IOError, OSError):
            log = ""
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    sent, received, files = count_log(log)
    stdout, stderr = _text(stdout), _text(stderr)
    return {"item": transfer.label, "rc": rc, "attempts": attempts, "changed": rc == 0 and files > 0,
            "failed": rc != 0, "stdout": stdout, "stderr": stderr, "cmd": argv, "bytes_sent": sent,
            "bytes_received": received, "files_transferred": files, "size": total_size(stdout)}


def repair_label(names):
    """What collect calls the re-sending of local files that differ from the manifest."""
    return "the files changed locally (%s)" % truncate(", ".join(names), REPAIR_NAMES_MAX)


def read_file_list(path):
    """The names of a NUL-separated --files-from list."""
    with open(path, "rb") as handle:
        return [name.decode("utf-8", "replace") for name in handle.read().split(b"\0") if name]


def pull(connection, src, dest, entries, repair_from=None, progress=None, retries=0, delay_s=0,
         sleep=time.sleep, **options):
    """Pull a directory on the box: first, when `repair_from` (a NUL-separated list of paths relative to `src`) is
    given, re-send those files whatever their size and mtime, then each of `entries` (top-level names in `src`)
    with its own session, into `dest`. Every transfer runs, whatever the others did. Returns (repair results,
    entry results), each {item, rc, changed, stderr, ...} as `run` returns it (item: the entry's name, or
    repair_label for the repair). `options`: Transfer's partial_dir, timeout_s, bwlimit."""
    base = src.rstrip("/")
    jobs = []
    if repair_from:
        label = repair_label(read_file_list(repair_from))
        jobs.append(("repair", "repair", Transfer(connection, base + "/", dest, push=False, files_from=repair_from,
                                                  ignore_times=True, label=label, **options)))
    for entry in entries:
        jobs.append(("entry", entry, Transfer(connection, base + "/" + entry, dest, push=False, label=entry,
                                              **options)))
    results = {"repair": [], "entry": []}
    for kind, part, transfer in jobs:
        results[kind].append(run(transfer, retries=retries, delay_s=delay_s, sleep=sleep,
                                 progress=progress.for_part(part) if progress is not None else None))
    return results["repair"], results["entry"]


# ---------------------------------------------------------------------------------------------------- messages


def push_failure(transfer, result):
    """The message of a push that did not finish: what, where, the attempts, rsync's exit code and words, and what
    to do (check the pin, or re-run: it resumes)."""
    stderr = result.get("stderr")
    advice = HOST_KEY_HINT if host_key_failed(stderr) else "Sent so far: %d bytes; %s" % (
        result.get("bytes_sent") or 0, RESUME_HINT)
    return "rsync of %s to %s:%s failed after %d attempt(s), rc %s: %s. %s" % (
        transfer.src.rstrip("/") or "/", transfer.connection.name, transfer.dest, result.get("attempts") or 1,
        result.get("rc"), truncate(squash(stderr), STDERR_MAX), advice)


def pull_failure(failed):
    """One sentence naming the failed pull transfers, their exit codes and rsync's words, and what to do."""
    stderrs = [str(r.get("stderr") or "").strip() for r in failed]
    hint = HOST_KEY_HINT if any(host_key_failed(e) for e in stderrs) else RESUME_HINT.capitalize()
    return "rsync failed for %s (rc %s): %s %s" % (
        ", ".join(str(r.get("item")) for r in failed), ", ".join(str(r.get("rc")) for r in failed),
        truncate(re.sub(r"\s+", " ", " | ".join(stderrs)), PULL_STDERR_MAX), hint)
