"""`rgt-run logs`: a run's job log (<run_dir>/logs/job.log) from its box, over the status round's connection.

The box side is module_utils/rgt_logread.py in the cached zipapp (rgt.sshround): a one-line JSON header (path,
start offset, size, the `== rgt attempt N started` lines and their offsets), then the raw bytes from the offset.
By default the newest attempt is shown (from its marker line); `--all` shows every attempt, `--tail N` the last N
lines of what would be shown. Attempt boundaries are marked. `-f` keeps streaming over the same multiplexed SSH
connection until the run ends; when the link drops it says so, reconnects (backing off, capped) and resumes at the
byte offset it has counted, so no line is shown twice. Several hosts: each line is prefixed with its host.
"""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from rich.console import Console

from rgt import errors, k8s_run, paths, sshround
from rgt.errors import InputError
from rgt.safetext import printable

HELP = "print a run's log from its box (the newest attempt); -f follows it live"
DESCRIPTION = """\
Print the log of the run on each box (or on the boxes of -l): by default the newest attempt only, from the line
where it started; --all shows every attempt, --tail N only the last N lines. Attempt boundaries are marked. With
-f it keeps printing what the job writes until the run ends (Ctrl-C stops following; the job keeps running). If
the connection drops while following, it says so, reconnects and carries on where it stopped, without repeating
a line. With several boxes each line starts with the box's name. Terminal control sequences the job wrote
(colours, cursor moves, window titles) are left out. On a Kubernetes host it is `kubectl logs` of
the run's Job (the newest pod; --all is not served there).
Exit codes: 3 a host key does not match its pin, else 1 a log could not be read, else 4 a box is unreachable,
else 0."""
BACKOFF_START_S = 1.0
BACKOFF_CAP_S = 30.0


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


@dataclass
class Source:
    host: str
    target: sshround.Target
    params: dict
    prefix: str = ""
    offset: int | None = None
    partial: bytes = b""
    header: dict = field(default_factory=dict)


class Printer:
    """Whole lines to stdout, one writer at a time; a line split across reads is held until it is complete."""

    def __init__(self, out=None):
        self.out = out or sys.stdout
        self.lock = threading.Lock()

    def feed(self, source: Source, data: bytes, final: bool = False) -> None:
        buf = source.partial + data
        lines = buf.split(b"\n")
        source.partial = b"" if final else lines.pop()
        if final and lines and lines[-1] == b"":
            lines.pop()
        with self.lock:
            for raw in lines:
                line = printable(raw.decode("utf-8", "replace"))  # the box's bytes: no terminal controls
                if line.startswith("== rgt attempt "):
                    line = boundary(line)
                self.out.write(f"{source.prefix}{line}\n")
            self.out.flush()


def _stdin(source: Source, follow: bool) -> bytes:
    doc = {"op": "log", **source.params, "offset": source.offset, "follow": follow}
    return (json.dumps(doc) + "\n").encode()


def _split(stdout: bytes) -> tuple[dict | None, bytes]:
    head, sep, rest = stdout.partition(b"\n")
    try:
        header = json.loads(head)
    except ValueError:
        return None, stdout
    return (header if sep and isinstance(header, dict) else None), rest


def _note(console: Console, source: Source, header: dict, all_attempts: bool, tail: int | None) -> None:
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


def fetch(source: Source) -> sshround.Answer:
    return sshround.run_cached(source.target, _stdin(source, False))


def read_once(source: Source, answer: sshround.Answer, console: Console, printer: Printer,
              args: argparse.Namespace) -> dict:
    header, data = _split(answer.stdout)
    if header is None:
        outcome = sshround.classify(answer)
        if outcome.unreachable:
            doc = {"state": "unreachable", "error": outcome.error}
            if outcome.host_key_mismatch:
                doc["host_key_mismatch"] = True
            return doc
        return {"state": "error", "error": outcome.error}
    if not header.get("exists"):
        return {"state": "error", "error": f"no log yet at {header.get('path')}", "path": header.get("path")}
    if not args.json:
        _note(console, source, header, args.all_attempts, args.tail)
        printer.feed(source, data, final=True)
    text = data.decode("utf-8", "replace")
    return {"state": "ok", "path": header.get("path"), "from_byte": header.get("offset"),
            "to_byte": (header.get("offset") or 0) + len(data), "attempts": [m[1] for m in header["attempts"]],
            "lines": text.splitlines()}


def follow(source: Source, console: Console, printer: Printer, args: argparse.Namespace, result: dict,
           procs: dict) -> None:
    """Stream until the run ends; on a dropped link, say so, reconnect and resume at the counted offset."""
    delay = BACKOFF_START_S
    lost = None
    while True:
        digest, data = sshround.bundle()
        command = sshround.RUN_CACHED.format(digest=digest, python=shlex.quote(source.target.python),
                                             missing=sshround.MISSING_RC)
        sshround._ensure_control_dir(source.target)
        proc = subprocess.Popen(sshround.command_argv(source.target, command), stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        procs[source.host] = proc
        proc.stdin.write(_stdin(source, True))
        proc.stdin.close()
        head = proc.stdout.readline()
        header, _rest = _split(head)
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
                chunk = proc.stdout.read1(64 * 1024)
                if not chunk:
                    break
                source.offset += len(chunk)
                printer.feed(source, chunk)
        stderr = proc.stderr.read().decode("utf-8", "replace")
        rc = proc.wait()
        if rc == sshround.MISSING_RC and header is None:
            shipped = sshround.ship(source.target, digest, data)
            if shipped.rc == 0:
                continue
            stderr, rc = shipped.stderr, shipped.rc
        if header is not None and rc == 0:
            printer.feed(source, b"", final=True)
            result[source.host] = {"state": "ok", "path": header.get("path"), "to_byte": source.offset}
            return
        if header is None and rc == 1 and head.strip():
            result[source.host] = {"state": "error", "error": sshround.classify(
                sshround.Answer(rc, head, stderr)).error}
            return
        if sshround.is_host_key_refusal(stderr):
            result[source.host] = {"state": "unreachable", "host_key_mismatch": True,
                                   "error": sshround.first_line(stderr)}
            return
        reason = sshround.first_line(stderr) or (f"exit {rc}" if rc >= 0 else f"killed by signal {-rc}")
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


def sources_for(args: argparse.Namespace, hosts: list, extravars: dict) -> list[Source]:
    layout = paths.module_util("rgt_runlayout")
    if args.run is not None:
        problem = layout.check_name(args.run, "run id")
        if problem:
            raise InputError(f"--run: {problem}", fix="--run <a run id from `rgt-run runs`>", field="--run")
    if args.tail is not None and args.tail < 0:
        raise InputError("--tail must be 0 or more", fix="--tail 100", field="--tail")
    cfg = sshround.ssh_config()
    out = []
    for host in hosts:
        try:
            target = sshround.target_for(args.inventory, host, extravars, cfg)
            params = sshround.status_params(host)
        except ValueError as exc:
            raise InputError(f"host '{host.name}': {exc}", fix="`rgt-run logs` reaches a box over plain SSH (or "
                             "runs locally): give literal connection values in the inventory", field=host.name) from exc
        run_id = args.run or params["run_id"]
        problem = layout.check_name(run_id, "run id")
        if problem:
            raise InputError(f"host '{host.name}' has no run to show ({problem})",
                             fix="pass --run RUN, or -e @job.yml with the job spec", field="--run")
        params = {"durable_root": params["durable_root"], "project": params["project"], "run_id": run_id,
                  "newest_attempt": not args.all_attempts, "tail": args.tail}
        out.append(Source(host.name, target, params))
    return out


def kubectl_logs(source: Source, argv: list[str], printer: Printer, procs: dict | None = None) -> dict:
    """A Kubernetes host's log: `kubectl logs job/NAME -c job` (the newest pod; the wrapper copies job.log to its
    stdout there), streamed through the printer."""
    from rgt import k8s_engine

    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    if procs is not None:
        procs[source.host] = proc
    for chunk in iter(lambda: proc.stdout.read1(1 << 16), b""):
        printer.feed(source, chunk)
    printer.feed(source, b"", final=True)
    err = proc.stderr.read().decode("utf-8", "replace")
    if proc.wait() == 0:
        return {"state": "ok", "source": "kubectl logs"}
    exc = k8s_engine.failure(argv[argv.index("logs"):argv.index("logs") + 2], err)
    return {"state": "unreachable" if isinstance(exc, k8s_engine.ClusterUnreachable) else "error",
            "error": exc.message}


def cmd_logs(args: argparse.Namespace, console: Console) -> int:
    from rgt.status import _prepare

    if args.follow and args.json:
        raise InputError("--json prints one document at the end; it cannot follow a log",
                         fix="use -f without --json, or --json without -f", field="--json")
    hosts, extravars = _prepare(args)
    on_cluster, boxes = k8s_run.split(hosts)
    sources = sources_for(args, boxes, extravars)
    clusters = [(Source(h.name, None, {}), k8s_run.logs_argv(h, args.run, args.tail, args.follow)) for h in on_cluster]
    if len(hosts) > 1:
        width = max(len(h.name) for h in hosts)
        for source in (*sources, *(s for s, _argv in clusters)):
            source.prefix = f"{source.host.ljust(width)} | "
    printer = Printer()
    results: dict[str, dict] = {}
    if not args.follow:
        with ThreadPoolExecutor(max_workers=min(sshround.MAX_PARALLEL, len(sources) or 1)) as pool:
            answers = list(pool.map(fetch, sources))  # all hosts at once; printed host after host
        for source, answer in zip(sources, answers, strict=True):
            results[source.host] = read_once(source, answer, console, printer, args)
        for source, argv in clusters:
            results[source.host] = kubectl_logs(source, argv, printer)
    else:
        procs: dict[str, subprocess.Popen] = {}
        threads = [threading.Thread(target=follow, args=(s, console, printer, args, results, procs), daemon=True)
                   for s in sources]
        threads += [threading.Thread(target=lambda s=s, a=a: results.__setitem__(s.host, kubectl_logs(s, a, printer,
                                                                                                      procs)),
                                     daemon=True) for s, a in clusters]
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
    if args.json:
        sys.stdout.write(json.dumps({"command": "logs", "hosts": results, "exit_code": code}, sort_keys=True) + "\n")
    return code
