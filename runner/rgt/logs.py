"""`rgt-run logs`: a run's job log (<run_dir>/logs/job.log) from its box, over the status round's connection.

The box side is module_utils/rgt_logread.py in the cached zipapp (rgt.sshround): a one-line JSON header (path,
start offset, size, the `== rgt attempt N started` lines and their offsets), then the raw bytes from the offset.
By default the newest attempt is shown (from its marker line); `--all` shows every attempt, `--tail N` the last N
lines of what would be shown. Attempt boundaries are marked. `-f` keeps streaming over the same multiplexed SSH
connection until the run ends; when the link drops it says so, reconnects (backing off, capped) and resumes at the
byte offset it has counted, so no line is shown twice. Several hosts: each line is prefixed with its host.

A host whose connection or durable root is an Ansible template (the embedded local inventory, the one `rgt-run init
--profile local` writes) has those values rendered by Ansible on this machine first (rgt.inventory.render_vars,
no box contacted), then is read the same way.

Memory stays bounded whatever the log holds: the log is read and printed in blocks as it arrives (the calls to all
hosts start at once; each host's bytes wait in its pipe until its turn), and a line longer than LINE_CAP bytes is
cut there, with a marker saying how many bytes were left out.
"""

from __future__ import annotations

import argparse
import json
import os
import select
import shlex
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import IO

from rich.console import Console

from rgt import engines, errors, memory, output, paths, sshround
from rgt.bundle import status_zipapp
from rgt.engines.base import LogSource
from rgt.errors import InputError
from rgt.ledger import ledger_dir
from rgt.prepare import prepare_hosts
from rgt.safetext import printable

HELP = "print a run's log from its box (the newest attempt); -f follows it live"
DESCRIPTION = """\
Print the log of the run on each box (or on the boxes of -l): by default the newest attempt only, from the line
where it started; --all shows every attempt, --tail N only the last N lines. Attempt boundaries are marked. With
-f it keeps printing what the job writes until the run ends (Ctrl-C stops following; the job keeps running). If
the connection drops while following, it says so, reconnects and carries on where it stopped, without repeating
a line. With several boxes each line starts with the box's name. Terminal control sequences the job wrote
(colours, cursor moves, window titles) are left out. On a Kubernetes host it is `kubectl logs` of the run's Job
(the newest pod; --all is not served there). A line longer than 64 KiB is cut there, marked.
Exit codes: 3 a host key does not match its pin, else 1 a log could not be read, else 4 a box is unreachable,
else 0."""
BACKOFF_START_S = 1.0
BACKOFF_CAP_S = 30.0
LINE_CAP = 64 * 1024  # bytes of one log line shown; the rest is cut, marked with how many bytes were left out
CUT_MARK = " [… {cut} more bytes of this line not shown]"
CHUNK = 64 * 1024
HEADER_CAP = 1 << 20  # the box's header line (JSON: path, offsets, attempt lines) is never longer
STDERR_KEPT = 64 * 1024  # of a reader's stderr, read back for its message


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--run", metavar="RUN", help="the run to show (default: the host's run, as `rgt-run status` "
                                                "shows it)")
    p.add_argument("--tail", type=int, metavar="N", help="only the last N lines")
    p.add_argument("-f", "--follow", action="store_true", help="keep printing new lines until the run ends")
    p.add_argument("--all", dest="all_attempts", action="store_true",
                   help="every attempt of the run, not only the newest")


def boundary(line: str) -> str:
    """How an attempt boundary (`== rgt attempt N started/ended ...`) is shown."""
    return f"──── {line} ────"


def _whole_chars(raw: bytes) -> str:
    """A line cut at LINE_CAP decoded without the half character the cut may leave at its end."""
    for drop in range(4):
        try:
            return raw[:len(raw) - drop].decode("utf-8")
        except UnicodeDecodeError:
            continue
    return raw.decode("utf-8", "replace")


class Printer:
    """Whole lines to stdout, one writer at a time; a line split across reads is held until it is complete, and a
    line longer than `cap` bytes is cut (its first `cap` bytes are held, the rest only counted)."""

    def __init__(self, out=None, cap: int = LINE_CAP):
        self.out = out or sys.stdout
        self.cap = cap
        self.lock = threading.Lock()

    def _take(self, source: LogSource, data: bytes, start: int, end: int) -> None:
        room = self.cap - len(source.partial)
        if room > 0:
            source.partial += data[start:min(end, start + room)]
        source.cut += max(0, end - start - max(room, 0))

    def feed(self, source: LogSource, data: bytes, final: bool = False) -> None:
        done: list[tuple[bytes, int]] = []
        start = 0
        while True:
            nl = data.find(b"\n", start)
            if nl < 0:
                break
            self._take(source, data, start, nl)
            done.append((source.partial, source.cut))
            source.partial, source.cut = b"", 0
            start = nl + 1
        self._take(source, data, start, len(data))
        if final and (source.partial or source.cut):
            done.append((source.partial, source.cut))
            source.partial, source.cut = b"", 0
        if not done:
            return
        with self.lock:
            for raw, cut in done:
                self.line(source, raw, cut)
            if source.lines is None:
                self.out.flush()

    def line(self, source: LogSource, raw: bytes, cut: int = 0) -> None:
        """The one place a log line is shown (or kept for --json): decoded, a cut line marked, a boundary drawn;
        on the terminal without the terminal control sequences the box's bytes may hold."""
        text = (_whole_chars(raw) if cut else raw.decode("utf-8", "replace")) + (CUT_MARK.format(cut=cut)
                                                                                  if cut else "")
        if source.lines is not None:
            source.lines.append(text)
            return
        text = printable(text)
        if text.startswith("== rgt attempt "):
            text = boundary(text)
        self.out.write(f"{source.prefix}{text}\n")


def _stdin(source: LogSource, follow: bool) -> bytes:
    doc = {"op": "log", **source.params, "offset": source.offset, "follow": follow}
    return (json.dumps(doc) + "\n").encode()


def _split(stdout: bytes) -> tuple[dict | None, bytes]:
    head, sep, rest = stdout.partition(b"\n")
    try:
        header = json.loads(head)
    except ValueError:
        return None, stdout
    return (header if sep and isinstance(header, dict) else None), rest


def _note(console: Console, source: LogSource, header: dict, all_attempts: bool, tail: int | None) -> None:
    marks = header.get("attempts") or []
    if not header.get("exists"):
        return
    where = f"{source.host}: {source.params['run_id']} ({printable(header.get('path'))})"
    if all_attempts:
        what = f"every attempt ({len(marks)})" if marks else "the whole log"
    else:
        what = f"attempt {len(marks)} of {len(marks)}" if marks else "the whole log (no attempt marker)"
    if tail is not None:
        what += f", last {tail} line(s)"
    console.print(f"{where}: {what}", highlight=False, markup=False)


# ---------------------------------------------------------------- one reader process on a box

@dataclass
class Reader:
    """One `op: log` call on a box, read as it streams: its stdout by blocks from the pipe (never all at once),
    its stderr into a temp file (a box that writes much there cannot stall the call)."""
    proc: subprocess.Popen
    errfile: IO[bytes]
    pending: bytes = b""  # read past the header line: the first bytes of the log
    eof: bool = False
    timed_out: bool = False


def start_reader(source: LogSource, follow: bool) -> Reader:
    digest, _data = status_zipapp()
    command = sshround.RUN_CACHED.format(digest=digest, python=shlex.quote(source.target.python),
                                         missing=sshround.MISSING_RC)
    sshround._ensure_control_dir(source.target)
    errfile = tempfile.TemporaryFile()
    proc = subprocess.Popen(sshround.command_argv(source.target, command), stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=errfile)
    try:
        proc.stdin.write(_stdin(source, follow))
        proc.stdin.close()
    except BrokenPipeError:
        pass  # it ended before reading (no cached zipapp, no connection): its exit status says why
    return Reader(proc, errfile)


def read_block(reader: Reader, timeout: float | None) -> bytes:
    """The next block of the reader's stdout (b"" at its end); with `timeout`, a box silent that long is cut off."""
    if reader.pending:
        data, reader.pending = reader.pending, b""
        return data
    if reader.eof:
        return b""
    fd = reader.proc.stdout.fileno()
    if timeout is not None and not select.select([fd], [], [], timeout)[0]:
        reader.timed_out = True
        reader.proc.kill()
        data = b""
    else:
        data = os.read(fd, CHUNK)
    reader.eof = not data
    return data


def read_header(reader: Reader, timeout: float | None) -> tuple[dict | None, bytes]:
    """(the header, the bytes read for it): the box's first line; (None, what came) when it sent none."""
    head = b""
    while b"\n" not in head and len(head) <= HEADER_CAP:
        data = read_block(reader, timeout)
        if not data:
            break
        head += data
    header, rest = _split(head)
    if header is not None:
        reader.pending = rest
    return header, head


def finish(reader: Reader) -> tuple[int, str]:
    """(exit status, the start of its stderr) once the reader has ended (stopped when it is still sending)."""
    if not reader.eof and reader.proc.poll() is None:
        reader.proc.kill()
    rc = reader.proc.wait()
    reader.proc.stdout.close()
    reader.errfile.seek(0)
    err = reader.errfile.read(STDERR_KEPT).decode("utf-8", "replace")
    reader.errfile.close()
    if reader.timed_out:
        return sshround.SSH_FAILED_RC, f"no answer within {sshround.ANSWER_TIMEOUT_S:.0f} s"
    return rc, err


@dataclass
class Opened:
    """A log read that has begun: the reader and the box's header, or the answer that says why there is none."""
    reader: Reader | None = None
    header: dict | None = None
    answer: sshround.Answer | None = None


def open_log(source: LogSource) -> Opened:
    """Start the read of one host's log and take its header (the zipapp is shipped first when the box lacks it);
    the log's bytes wait in the pipe until they are printed."""
    shipped = False
    while True:
        reader = start_reader(source, False)
        header, head = read_header(reader, sshround.ANSWER_TIMEOUT_S)
        if header is not None:
            return Opened(reader, header)
        timed_out = reader.timed_out
        rc, err = finish(reader)
        if rc == sshround.MISSING_RC and not shipped:
            digest, data = status_zipapp()
            answer = sshround.ship(source.target, digest, data)
            if answer.rc != 0:
                return Opened(answer=answer)
            shipped = True
            continue
        return Opened(answer=sshround.Answer(rc, head, err, timed_out=timed_out))


def read_once(source: LogSource, opened: Opened, console: Console, printer: Printer,
              args: argparse.Namespace) -> dict:
    header = opened.header
    if header is None:
        outcome = sshround.classify(opened.answer)
        if outcome.unreachable:
            doc = {"state": "unreachable", "error": outcome.error}
            if outcome.host_key_mismatch:
                doc["host_key_mismatch"] = True
            return doc
        return {"state": "error", "error": outcome.error}
    reader = opened.reader
    if not header.get("exists"):
        finish(reader)
        return {"state": "error", "error": f"no log yet at {header.get('path')}", "path": header.get("path")}
    if args.json:
        source.lines = []
    else:
        _note(console, source, header, args.all_attempts, args.tail)
    start = header.get("offset") or 0
    sent = 0
    while True:
        data = read_block(reader, sshround.ANSWER_TIMEOUT_S)
        if not data:
            break
        sent += len(data)
        printer.feed(source, data)
    printer.feed(source, b"", final=True)
    rc, err = finish(reader)
    doc = {"state": "ok", "path": header.get("path"), "from_byte": start, "to_byte": start + sent,
           "attempts": [m[1] for m in header.get("attempts") or []]}
    if source.lines is not None:
        doc["lines"] = source.lines
    if rc != 0:
        doc.update(state="error", error=f"the log was read up to byte {start + sent}, then the reader ended with "
                                        f"exit {rc}: {sshround.first_line(err) or 'no message'}")
    return doc


def follow(source: LogSource, console: Console, printer: Printer, args: argparse.Namespace, result: dict,
           procs: dict) -> None:
    """Stream until the run ends; on a dropped link, say so, reconnect and resume at the counted offset."""
    delay = BACKOFF_START_S
    lost = None
    while True:
        reader = start_reader(source, True)
        procs[source.host] = reader.proc
        header, head = read_header(reader, None)
        if header is not None:
            source.header = header
            if source.offset is None:
                source.offset = header.get("offset") or 0
                _note(console, source, header, args.all_attempts, args.tail)
            if lost:
                console.print(f"{source.host}: reconnected; resuming at byte {source.offset}", highlight=False,
                              markup=False)
                lost = None
                delay = BACKOFF_START_S
            while True:
                chunk = read_block(reader, None)
                if not chunk:
                    break
                source.offset += len(chunk)
                printer.feed(source, chunk)
        rc, stderr_text = finish(reader)
        if rc == sshround.MISSING_RC and header is None:
            digest, data = status_zipapp()
            shipped = sshround.ship(source.target, digest, data)
            if shipped.rc == 0:
                continue
            stderr_text, rc = shipped.stderr, shipped.rc
        if header is not None and rc == 0:
            printer.feed(source, b"", final=True)
            result[source.host] = {"state": "ok", "path": header.get("path"), "to_byte": source.offset}
            return
        if header is None and rc == 1 and head.strip():
            result[source.host] = {"state": "error", "error": sshround.classify(
                sshround.Answer(rc, head, stderr_text)).error}
            return
        if sshround.is_host_key_refusal(stderr_text):
            result[source.host] = {"state": "unreachable", "host_key_mismatch": True,
                                   "error": sshround.first_line(stderr_text)}
            return
        reason = sshround.first_line(stderr_text) or (f"exit {rc}" if rc >= 0 else f"killed by signal {-rc}")
        at = f"byte {source.offset}" if source.offset is not None else "the start"
        console.print(f"{source.host}: link lost ({printable(reason)}); reconnecting in {delay:.0f} s, resuming at "
                      f"{at}", highlight=False, markup=False)
        lost = reason
        time.sleep(delay)
        delay = min(delay * 2, BACKOFF_CAP_S)


def exit_code(results: dict) -> int:
    values = results.values()
    if any(r.get("host_key_mismatch") for r in values):
        return errors.REFUSED
    if any(r.get("state") == "error" for r in values):
        return errors.FAILED
    if any(r.get("state") == "unreachable" for r in values):
        return errors.UNREACHABLE
    return errors.OK


def check_args(args: argparse.Namespace) -> None:
    """--run and --tail, before any host is read (exit 2)."""
    if args.run is not None:
        problem = paths.module_util("rgt_runlayout").check_name(args.run, "run id")
        if problem:
            raise InputError(f"--run: {problem}", fix="--run <a run id from `rgt-run runs`>", field="--run")
    if args.tail is not None and args.tail < 0:
        raise InputError("--tail must be 0 or more", fix="--tail 100", field="--tail")


def program_logs(source: LogSource, argv: list[str], printer: Printer, procs: dict | None = None) -> dict:
    """A log a program run here prints (a Kubernetes host's: `kubectl logs job/NAME -c job`, the newest pod; the
    wrapper copies job.log to its stdout there), streamed through the printer."""
    errfile = tempfile.TemporaryFile()
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=errfile)
    if procs is not None:
        procs[source.host] = proc
    for chunk in iter(lambda: proc.stdout.read1(CHUNK), b""):
        printer.feed(source, chunk)
    printer.feed(source, b"", final=True)
    rc = proc.wait()
    errfile.seek(0)
    err = errfile.read(STDERR_KEPT).decode("utf-8", "replace")
    errfile.close()
    if rc == 0:
        return {"state": "ok", "source": source.what, **({"lines": source.lines} if source.lines is not None
                                                          else {})}
    return source.explain(argv, err)


def arrivals(console: Console, args: argparse.Namespace, sources: list[LogSource]) -> None:
    """A run `rgt-run move` brought to its host: one line before its log says from where, and the work lost (the
    log here begins with the new box's first attempt; the old box's attempts stay on the old box)."""
    try:
        ledger = ledger_dir(getattr(args, "ledger", None), make=False)
    except InputError:
        return
    for source in sources:
        run_id, project = source.params.get("run_id"), source.params.get("project")
        move = memory.arrival(ledger, source.host, project, run_id) if run_id and project else None
        if move:
            console.print(f"{source.host}: {run_id} {memory.move_words(move)}", highlight=False, markup=False)


def cmd_logs(args: argparse.Namespace, console: Console) -> int:
    if args.follow and args.json:
        raise InputError("--json prints one document at the end; it cannot follow a log",
                         fix="use -f without --json, or --json without -f", field="--json")
    hosts, extravars = prepare_hosts(args)
    check_args(args)
    every = [s for engine, mine in engines.split(hosts) for s in engine.log_sources(args, mine, extravars)]
    sources = [s for s in every if s.argv is None]  # read over the status round's SSH connection
    programs = [(s, s.argv) for s in every if s.argv is not None]  # a program run here prints it (kubectl logs)
    if len(hosts) > 1:
        width = max(len(h.name) for h in hosts)
        for source in (*sources, *(s for s, _argv in programs)):
            source.prefix = f"{source.host.ljust(width)} | "
    arrivals(console, args, every)
    printer = Printer()
    results: dict[str, dict] = {}
    if not args.follow:
        if sources:
            status_zipapp()  # once, before the threads start
            window = sshround.MAX_PARALLEL  # reads open at once: the host being printed and the next ones
            with ThreadPoolExecutor(max_workers=min(window, len(sources))) as pool:
                ahead = [pool.submit(open_log, s) for s in sources[:window]]  # all at once; printed in turn
                for index, source in enumerate(sources):
                    results[source.host] = read_once(source, ahead[index].result(), console, printer, args)
                    if index + window < len(sources):
                        ahead.append(pool.submit(open_log, sources[index + window]))
        for source, argv in programs:
            if args.json:
                source.lines = []
            results[source.host] = program_logs(source, argv, printer)
    else:
        procs: dict[str, subprocess.Popen] = {}
        threads = [threading.Thread(target=follow, args=(s, console, printer, args, results, procs), daemon=True)
                   for s in sources]
        threads += [threading.Thread(target=lambda s=s, a=a: results.__setitem__(s.host, program_logs(s, a, printer,
                                                                                                      procs)),
                                     daemon=True) for s, a in programs]
        for thread in threads:
            thread.start()
        try:
            while any(t.is_alive() for t in threads):
                for thread in threads:
                    thread.join(0.2)
        except KeyboardInterrupt:
            for proc in procs.values():
                if proc.poll() is None:
                    proc.terminate()
            console.print("stopped following; the job keeps running", highlight=False, markup=False)
            return errors.OK
    for host, result in sorted(results.items()):
        if result.get("state") != "ok":
            console.print(f"{host}: {printable(result.get('state'))}: {printable(result.get('error'))}",
                          highlight=False, markup=False)
    code = exit_code(results)
    output.emit({"command": "logs", "hosts": results, "exit_code": code}, args.json)
    return code
