"""`rgt-run watch --detach` and `rgt-run service install|status|logs|stop`: one watcher per ledger, unattended.

The watcher that acts (relaunches, notifies) holds the ledger's watch lock (rgt.watchlock) for its whole life;
`start_watch` takes it when `watch` starts (a second watcher is refused, exit 3, naming the holder; `--follow`
takes no lock and acts on nothing). What it needs across its own restarts is in the ledger, never in memory:
`<ledger>/service/relaunched.json` (atomic) holds every relaunch it started, so a run is relaunched once per
attempt whichever watcher sees it (rgt.notify already keeps what it sent in `<ledger>/notify/`); each tick it
writes `<ledger>/service/tick.json` (atomic: when, the runs it watches, what it waits on) for `service status`.

A detached watcher (`watch --detach`, or `service install` where `systemctl --user` does not work) runs under
tmux (its own server, socket `rgt-watch-<hash>`) when tmux is installed, else in a new session of its own
(setsid, SIGHUP never reaches it); a systemd user unit runs the same command. Its output is
`<ledger>/service/watch.log`, rotated by the watcher itself at LOG_CAP_BYTES (LOG_KEEP old files kept).
`<ledger>/service.json` records what was installed (watchlock.installed reads it).
"""

from __future__ import annotations

import argparse
import hashlib
import os
import pwd
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from rich.console import Console
from rich.markup import escape

from rgt import errors, output, watchlock
from rgt.ledger import atomic_write_bytes, atomic_write_json, ledger_dir, read_json
from rgt.prepare import prepare_hosts
from rgt.safetext import printable

SCHEMA = "rgt/service/v1"
RELAUNCHED_SCHEMA = "rgt/relaunched/v1"
TICK_SCHEMA = "rgt/tick/v1"
DIR = "service"
LOG = "watch.log"
TICK = "tick.json"
RELAUNCHED = "relaunched.json"
LOG_CAP_BYTES = 8 * 1024 * 1024
LOG_KEEP = 2
KEEP_RELAUNCHES = 500
START_WAIT_S = 30.0
STOP_WAIT_S = 15.0


def service_dir(ledger: Path) -> Path:
    return ledger / DIR


def log_path(ledger: Path) -> Path:
    return service_dir(ledger) / LOG


def unit_name(ledger: Path) -> str:
    """One unit (and one tmux socket) per ledger: several projects on one machine each have their own."""
    return f"rgt-watch-{hashlib.sha256(str(ledger).encode()).hexdigest()[:8]}"


# ---------------------------------------------------------------- inside the watcher (rgt.status.cmd_watch)

class Relaunched(set):
    """The relaunch keys (rgt.status.resume_key) every watcher of this ledger started: loaded from, and added to,
    `<ledger>/service/relaunched.json` (before the relaunch starts: a watcher killed during one never has it
    started again by the next). A key counts for the instance it was relaunched on (`instances`: host -> its
    rgt_instance_id now): a run of the same name on a new box of that host is a run of its own."""

    def __init__(self, path: Path | None, instances: dict[str, object] | None = None):
        super().__init__()
        self.path = path
        self.instances = instances or {}
        doc = read_json(path) if path is not None else None
        doc = doc if isinstance(doc, dict) else {}
        self.entries: list[dict] = [e for e in doc.get("relaunches") or [] if isinstance(e, dict)]
        for entry in self.entries:
            key = _key(entry.get("key"))
            if key is not None and entry.get("instance_id") == self.instances.get(key[0]):
                super().add(key)

    def add(self, key) -> None:
        super().add(key)
        if self.path is None:
            return
        self.entries = [*self.entries[-(KEEP_RELAUNCHES - 1):], {
            "key": [key[0], [list(r) for r in key[1]]], "instance_id": self.instances.get(key[0]),
            "started_at": time.time(), "pid": os.getpid()}]
        atomic_write_json(self.path, {"schema": RELAUNCHED_SCHEMA, "relaunches": self.entries})


def _key(raw) -> tuple | None:
    try:
        host, runs = raw
        return str(host), tuple((str(run), attempt) for run, attempt in runs)
    except (TypeError, ValueError):
        return None


class Watching:
    """What a running `watch` holds: the lock (None under --follow), the relaunches remembered, the tick file,
    the log it rotates."""

    def __init__(self, ledger: Path, lock: watchlock.WatchLock | None, log: Path | None, hosts: list = (),
                 log_cap: int = LOG_CAP_BYTES):
        self.ledger = ledger
        self.lock = lock
        self.follow = lock is None
        self.log = log
        self.log_cap = log_cap
        instances = {h.name: (getattr(h, "vars", None) or {}).get("rgt_instance_id") for h in hosts}
        self.relaunched = Relaunched(None if self.follow else service_dir(ledger) / RELAUNCHED, instances)

    def tick(self, ticks: int, latest: dict[str, dict], active: list[str]) -> None:
        """After each tick: the tick file (the watcher that acts) and the log's size cap."""
        if self.log is not None:
            rotate(self.log, self.log_cap)
        if self.follow:
            return
        runs = [{"host": r.get("host"), "run_id": r.get("run_id"), "state": r.get("state"),
                 "attempt": r.get("attempt")}
                for doc in latest.values() for r in (doc, *(doc.get("other_runs") or []))]
        waiting = [f"{r['host']}:{r['run_id']} ({r['state']})" for r in runs if r["host"] in active]
        atomic_write_json(service_dir(self.ledger) / TICK, {
            "schema": TICK_SCHEMA, "t": time.time(), "tick": ticks, "pid": os.getpid(), "runs": runs,
            "waiting_on": waiting})

    def close(self) -> None:
        if self.lock is not None:
            self.lock.release()


def start_watch(args: argparse.Namespace, ledger: Path, console: Console, hosts: list) -> Watching:
    """At the start of `watch`: its log (a detached or service watcher's), then the ledger's watch lock (Held:
    exit 3 naming the holder); `--follow` takes no lock and acts on nothing."""
    log = Path(args.service_log) if getattr(args, "service_log", None) else None
    if log is not None:
        redirect(log)
    if getattr(args, "follow", False):
        console.print("following: looking only (no relaunch, no notification, no lock)")
        return Watching(ledger, None, log, hosts)
    mode = getattr(args, "service_mode", None) or ("detached" if log is not None else "foreground")
    try:
        lock = watchlock.acquire(ledger, mode=mode, log=str(log) if log else None)
    except watchlock.Held as held:
        raise errors.GateRefused(f"the ledger {ledger} is watched already by {watchlock.describe(held.holder)}",
                                 fix="`rgt-run service status` says what it does; `rgt-run watch --follow ...` "
                                     "looks along without acting; `rgt-run service stop` stops it") from None
    watching = Watching(ledger, lock, log, hosts)
    if watching.relaunched:
        console.print(f"{len(watching.relaunched)} relaunch(es) remembered from earlier watchers of this ledger: "
                      "a run is relaunched once per attempt (`rgt-run train` starts one again)",
                      highlight=False, markup=False)
    return watching


def redirect(log: Path) -> None:
    """This process's stdout and stderr onto the log (appended)."""
    log.parent.mkdir(parents=True, exist_ok=True)
    sys.stdout.flush()
    sys.stderr.flush()
    fd = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.dup2(fd, 1)
        os.dup2(fd, 2)
    finally:
        os.close(fd)


def rotate(log: Path, cap: int = LOG_CAP_BYTES, keep: int = LOG_KEEP) -> bool:
    """When the log is over its cap: watch.log -> watch.log.1 -> ... (keep old ones), and a new watch.log that
    this process writes to. Returns whether it rotated."""
    try:
        if log.stat().st_size <= cap:
            return False
    except OSError:
        return False
    for n in range(keep, 0, -1):
        older = log.with_name(f"{log.name}.{n}")
        newer = log.with_name(f"{log.name}.{n - 1}") if n > 1 else log
        if newer.exists():
            os.replace(newer, older)
    redirect(log)
    return True


# ---------------------------------------------------------------- the watch command line of the service

def add_watch_arguments(p: argparse.ArgumentParser) -> None:
    """watch's own: --detach, --follow (and the log a detached watcher is given: not for people)."""
    p.add_argument("--detach", action="store_true",
                   help="start this same watch in the background (tmux, else a session of its own), its log in "
                        "<ledger>/service/watch.log; `rgt-run service status|logs|stop` see to it")
    p.add_argument("--follow", action="store_true",
                   help="look along while another watcher runs: print the ticks, act on nothing (no relaunch, "
                        "no notification)")
    p.add_argument("--service-log", dest="service_log", help=argparse.SUPPRESS)
    p.add_argument("--service-mode", dest="service_mode", help=argparse.SUPPRESS)


def watch_argv(args: argparse.Namespace, ledger: Path, mode: str) -> list[str]:
    """The `rgt-run watch` command a detached or service watcher runs: this rgt-run (this Python, this package),
    the same inventory, job spec, limit and intervals, the ledger by its absolute path, the log."""
    argv = [sys.executable, "-m", "rgt.cli", "watch", "-i", str(args.inventory)]
    for extra in args.extra_vars or []:
        argv += ["-e", extra]
    if args.limit:
        argv += ["-l", args.limit]
    if getattr(args, "interval", None) is not None:
        argv += ["--interval", f"{args.interval:g}"]
    if getattr(args, "max_ticks", None) is not None:
        argv += ["--max-ticks", str(args.max_ticks)]
    if args.verbose:
        argv.append("-" + "v" * args.verbose)
    return [*argv, "--ledger", str(ledger), "--service-log", str(log_path(ledger)), "--service-mode", mode]


def detach(args: argparse.Namespace, console: Console, ledger: Path) -> int:
    """`watch --detach`: the same watch in the background; returns once it holds the lock (0), or says why not."""
    if getattr(args, "follow", False):
        raise errors.InputError("--detach starts a watcher that acts; --follow one that only looks: not both",
                                fix="rgt-run watch --detach -i INVENTORY (then `rgt-run watch --follow` to look "
                                    "along)", field="--follow")
    _refuse_if_watched(ledger)
    cwd = Path.cwd()
    argv = watch_argv(args, ledger, "detached")
    via, pid = spawn(argv, ledger, cwd)
    record = {"schema": SCHEMA, "kind": "detached", "via": via, "argv": argv, "cwd": str(cwd),
              "log": str(log_path(ledger)), "installed_at": time.time(), "pid": pid,
              "tmux_socket": unit_name(ledger) if via == "tmux" else None}
    atomic_write_json(ledger / watchlock.SERVICE, record)
    return _started(args, console, ledger, record)


def spawn(argv: list[str], ledger: Path, cwd: Path) -> tuple[str, int | None]:
    """Start argv detached, its output appended to the log: under tmux (a server of its own, which inherits this
    environment: the webhook variables too) when tmux is installed, else in a new session. Returns (via, pid:
    None under tmux, where the pid is the lock holder's)."""
    log = log_path(ledger)
    log.parent.mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if k not in ("TMUX", "TMUX_PANE")}
    tmux = shutil.which("tmux")
    if tmux and not os.environ.get("RGT_SERVICE_NO_TMUX"):
        # stdin stays the pane's terminal: a pane whose process holds no descriptor of it is closed (SIGHUP)
        line = f"exec {shlex.join(argv)} >>{shlex.quote(str(log))} 2>&1"
        done = subprocess.run([tmux, "-L", unit_name(ledger), "new-session", "-d", "-s", "rgt-watch", line],
                              cwd=cwd, env=env, capture_output=True, text=True, timeout=30)
        if done.returncode != 0:
            raise errors.RgtError(f"tmux could not start the watcher: {printable(done.stderr.strip())}",
                                  fix="RGT_SERVICE_NO_TMUX=1 rgt-run watch --detach ... (a session of its own)")
        return "tmux", None
    with open(log, "ab") as fh:
        proc = subprocess.Popen(argv, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=fh, stderr=fh,
                                start_new_session=True)
    return "nohup", proc.pid


def _refuse_if_watched(ledger: Path) -> None:
    held = watchlock.holder(ledger)
    if held is not None:
        raise errors.GateRefused(f"the ledger {ledger} is watched already by {watchlock.describe(held)}",
                                 fix="`rgt-run service status` says what it does; `rgt-run service stop` stops it")


def _started(args: argparse.Namespace, console: Console, ledger: Path, record: dict) -> int:
    """Wait until the new watcher holds the lock; say where it runs and how to see it."""
    log = Path(record["log"])
    end = time.monotonic() + START_WAIT_S
    held = None
    while time.monotonic() < end:
        held = watchlock.holder(ledger)
        if held and held.get("mode") in ("detached", "service"):
            break
        held = None
        if record.get("pid") and not _alive(record["pid"]):
            break
        if record.get("tmux_socket") and subprocess.run(["tmux", "-L", record["tmux_socket"], "has-session"],
                                                        capture_output=True, timeout=30).returncode != 0:
            break  # its pane ended: the watcher exited (its log says why)
        time.sleep(0.2)
    out = output.results(args.json)
    if not held:
        tail = _tail(log, 20)
        console.print(f"[red]the watcher did not start[/red] (see {escape(str(log))}):\n{escape(tail)}",
                      highlight=False)
        output.emit({"command": "service", "action": "start", "running": False, "service": record,
                     "exit_code": errors.FAILED}, args.json)
        return errors.FAILED
    how = {"systemd": f"systemd user unit {record.get('unit')}", "tmux": f"tmux -L {record.get('tmux_socket')}",
           "nohup": "a session of its own (setsid)"}[record.get("via") or record["kind"]]
    out.print(f"watching: pid {held.get('pid')} ({how}); log {log}", highlight=False, markup=False)
    console.print("see it with `rgt-run service status`, `rgt-run service logs -f`; stop it with "
                  "`rgt-run service stop`", highlight=False, markup=False)
    output.emit({"command": "service", "action": "start", "running": True, "holder": held, "service": record,
                 "exit_code": errors.OK}, args.json)
    return errors.OK


def _alive(pid: int) -> bool:
    try:
        done, _status = os.waitpid(pid, os.WNOHANG)  # our own child: reap it if it ended
        if done:
            return False
    except ChildProcessError:
        pass
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _tail(path: Path, lines: int) -> str:
    try:
        data = path.read_bytes()[-64 * 1024:]
    except OSError:
        return ""
    return printable("\n".join(data.decode(errors="replace").splitlines()[-lines:]), multiline=True)


# ---------------------------------------------------------------- systemd

def systemd_works() -> bool:
    """Does `systemctl --user` reach a user manager here (a login session, or linger)?"""
    systemctl = shutil.which("systemctl")
    if not systemctl:
        return False
    try:
        proc = subprocess.run([systemctl, "--user", "show-environment"], capture_output=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return proc.returncode == 0


def _unit_quote(arg: str) -> str:
    """One ExecStart argument as systemd reads it (specifiers %, variables $, quotes and backslashes escaped)."""
    text = arg.replace("\\", "\\\\").replace('"', '\\"').replace("%", "%%").replace("$", "$$")
    return f'"{text}"' if any(c.isspace() for c in text) or text != arg or not text else text


def unit_text(ledger: Path, argv: list[str], cwd: Path, env_file: str | None = None) -> str:
    """The systemd user unit of this ledger's watcher. It restarts only when the watcher dies (a signal, a
    crash); the exit codes of a watch that ended (1 a run failed, 4 unreachable, 5 attention) are its result,
    and 2 (bad input) and 3 (another watcher holds the ledger) would only repeat."""
    lines = ["[Unit]", f"Description=rgt watch of the ledger {ledger}", "", "[Service]", "Type=simple",
             f"WorkingDirectory={_unit_quote(str(cwd))}", "ExecStart=" + " ".join(_unit_quote(a) for a in argv)]
    if env_file:
        lines.append(f"EnvironmentFile={_unit_quote(env_file)}")
    lines += ["Restart=on-failure", "RestartSec=30", "SuccessExitStatus=1 4 5", "RestartPreventExitStatus=2 3",
              "TimeoutStopSec=30", "", "[Install]", "WantedBy=default.target", ""]
    return "\n".join(lines)


def _systemctl(*words: str) -> subprocess.CompletedProcess:
    return subprocess.run(["systemctl", "--user", *words], capture_output=True, text=True, timeout=60)


# ---------------------------------------------------------------- rgt-run service

HELP = "run watch unattended: install it as a service (systemd user unit, else detached), its status, log, stop"
DESCRIPTION = """\
One watcher per ledger, left running on an always-on machine (docs/unattended.md).
  install   start `rgt-run watch` with these -i/-e/-l/--interval/--max-ticks as a systemd user unit where
            `systemctl --user` works (it restarts when it dies and starts at boot with `loginctl enable-linger`),
            else detached (tmux, else a session of its own); recorded in <ledger>/service.json
  status    running or not (the lock's holder), its pid and since when, the last tick, the runs it watches and
            what it waits on. Exit 0 running, 1 not running
  logs      its log (<ledger>/service/watch.log, rotated at 8 MiB); -f follows it
  stop      stop it (systemctl --user disable --now, or its process group) and say so"""


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("action", choices=("install", "status", "logs", "stop"), help="what to do")
    p.add_argument("--interval", type=float, default=None, metavar="SECONDS",
                   help="install: seconds between looks (watch's default: 90)")
    p.add_argument("--max-ticks", dest="max_ticks", type=int, default=None, metavar="N",
                   help="install: stop after this many looks (watch's default: 120)")
    p.add_argument("--detached", action="store_true", help="install: do not use systemd, start it detached")
    p.add_argument("--env-file", dest="env_file", metavar="FILE",
                   help="install (systemd): a file of VAR=value lines for the unit (the webhook variables your "
                        "notify rules name), readable by you only")
    p.add_argument("-f", "--follow", action="store_true", help="logs: keep printing what it writes")
    p.add_argument("-n", "--lines", type=int, default=100, metavar="N", help="logs: the last N lines (100)")


def cmd_service(args: argparse.Namespace, console: Console) -> int:
    ledger = ledger_dir(args.ledger)
    return {"install": install, "status": status, "logs": logs, "stop": stop}[args.action](args, console, ledger)


def install(args: argparse.Namespace, console: Console, ledger: Path) -> int:
    if not args.inventory:
        raise errors.InputError("service install needs the inventory the watcher watches",
                                fix="rgt-run service install -i INVENTORY [-e @job.yml]", field="--inventory")
    prepare_hosts(args)  # bad input is said here, not in the service's log
    for name, value, minimum in (("--interval", args.interval, 0), ("--max-ticks", args.max_ticks, 1)):
        if value is not None and value <= minimum:
            raise errors.InputError(f"{name} must be {'positive' if minimum == 0 else 'at least 1'}",
                                    fix=f"{name} {'90' if minimum == 0 else '120'}", field=name)
    env_file = str(Path(args.env_file).expanduser().resolve()) if args.env_file else None
    if env_file and not Path(env_file).is_file():
        raise errors.InputError(f"--env-file {env_file} is not a file", fix="a file of VAR=value lines (chmod "
                                "600), e.g. RGT_SLACK_HOOK=https://hooks.slack.com/...", field="--env-file")
    _refuse_if_watched(ledger)
    if args.detached or not systemd_works():
        if not args.detached:
            console.print("systemctl --user does not work here: starting the watcher detached (it does not come "
                          "back after a reboot: docs/unattended.md)", highlight=False, markup=False)
        return detach(args, console, ledger)
    cwd = Path.cwd()
    name = unit_name(ledger)
    argv = watch_argv(args, ledger, "service")
    config = Path(os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config")
    path = config / "systemd" / "user" / f"{name}.service"
    atomic_write_bytes(path, unit_text(ledger, argv, cwd, env_file).encode())
    for words in (("daemon-reload",), ("enable", "--now", f"{name}.service")):
        proc = _systemctl(*words)
        if proc.returncode != 0:
            raise errors.RgtError(f"systemctl --user {' '.join(words)} failed: {printable(proc.stderr.strip())}",
                                  fix=f"see `systemctl --user status {name}`, or install with --detached")
    record = {"schema": SCHEMA, "kind": "systemd", "via": "systemd", "unit": f"{name}.service",
              "unit_path": str(path), "argv": argv, "cwd": str(cwd), "log": str(log_path(ledger)),
              "installed_at": time.time(), "pid": None, "tmux_socket": None}
    atomic_write_json(ledger / watchlock.SERVICE, record)
    if not _lingers():
        console.print(f"to start it at boot without logging in: `loginctl enable-linger {_user()}`",
                      highlight=False, markup=False)
    return _started(args, console, ledger, record)


def _user() -> str:
    try:
        return pwd.getpwuid(os.getuid()).pw_name
    except KeyError:
        return os.environ.get("USER") or "$USER"


def _lingers() -> bool:
    return Path("/var/lib/systemd/linger", _user()).exists()


def _ago(seconds: float) -> str:
    seconds = max(0, int(seconds))
    return f"{seconds} s ago" if seconds < 120 else f"{seconds // 60} min ago" if seconds < 7200 \
        else f"{seconds // 3600} h ago"


def _when(t: float | None) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(float(t))) if t else "-"


def status(args: argparse.Namespace, console: Console, ledger: Path) -> int:
    held = watchlock.holder(ledger)
    record = watchlock.installed(ledger)
    tick = read_json(service_dir(ledger) / TICK)
    tick = tick if isinstance(tick, dict) else None
    out = output.results(args.json)
    if held is not None:
        out.print(f"running: {watchlock.describe(held)}", highlight=False, markup=False)
    else:
        out.print(f"not running: no watcher holds the ledger {ledger}", highlight=False, markup=False)
    if record:
        what = record.get("unit") if record.get("kind") == "systemd" else f"detached ({record.get('via')})"
        stopped = f", stopped {_when(record['stopped_at'])}" if record.get("stopped_at") else ""
        out.print(f"installed: {what} {_when(record.get('installed_at'))}{stopped}", highlight=False, markup=False)
    if tick:
        runs = tick.get("runs") or []
        out.print(f"last tick: {_when(tick.get('t'))} ({_ago(time.time() - float(tick.get('t') or 0))}), tick "
                  f"{tick.get('tick')} of pid {tick.get('pid')}; {len(runs)} run(s) watched: " + ", ".join(
                      printable(f"{r.get('host')}:{r.get('run_id')} {r.get('state')}") for r in runs),
                  highlight=False, markup=False)
        waiting = tick.get("waiting_on") or []
        out.print("waiting on: " + (", ".join(printable(w) for w in waiting) if waiting else "nothing (every run "
                  "settled)"), highlight=False, markup=False)
    log = Path((held or {}).get("log") or (record or {}).get("log") or log_path(ledger))
    out.print(f"log: {log}", highlight=False, markup=False)
    code = errors.OK if held is not None else errors.FAILED
    output.emit({"command": "service", "action": "status", "running": held is not None, "holder": held,
                 "service": record, "tick": tick, "log": str(log), "exit_code": code}, args.json)
    return code


def logs(args: argparse.Namespace, console: Console, ledger: Path) -> int:
    log = log_path(ledger)
    if not log.exists():
        console.print(f"no log yet: {log} (a watcher started with `watch --detach` or `service install` writes it)",
                      highlight=False, markup=False)
        return errors.FAILED
    text = _tail(log, max(args.lines, 0))
    if args.json:
        if args.follow:
            raise errors.InputError("service logs -f prints the log as it grows: not one JSON document",
                                    fix="rgt-run service logs --json (the last lines), or -f without --json",
                                    field="--follow")
        output.emit({"command": "service", "action": "logs", "log": str(log), "text": text,
                     "exit_code": errors.OK}, True)
        return errors.OK
    sys.stdout.write(text + "\n")
    sys.stdout.flush()
    if not args.follow:
        return errors.OK
    try:
        _follow(log)
    except KeyboardInterrupt:
        pass
    return errors.OK


def _follow(log: Path, poll_s: float = 0.5) -> None:
    """Print what the log gets, like tail -F: a rotation (a new file at the path) is followed."""
    fh = open(log, "rb")  # noqa: SIM115 - reopened at each rotation
    fh.seek(0, os.SEEK_END)
    inode = os.fstat(fh.fileno()).st_ino
    try:
        while True:
            chunk = fh.read()
            if chunk:
                sys.stdout.write(printable(chunk.decode(errors="replace"), multiline=True))
                sys.stdout.flush()
                continue
            time.sleep(poll_s)
            try:
                if os.stat(log).st_ino != inode:
                    fh.close()
                    fh = open(log, "rb")  # noqa: SIM115
                    inode = os.fstat(fh.fileno()).st_ino
            except FileNotFoundError:
                pass
    finally:
        fh.close()


def stop(args: argparse.Namespace, console: Console, ledger: Path) -> int:
    record = watchlock.installed(ledger)
    held = watchlock.holder(ledger)
    out = output.results(args.json)
    said = ""
    if record and record.get("kind") == "systemd" and not record.get("stopped_at"):
        proc = _systemctl("disable", "--now", record["unit"])
        if proc.returncode != 0:
            raise errors.RgtError(f"systemctl --user disable --now {record['unit']} failed: "
                                  f"{printable(proc.stderr.strip())}", fix=f"systemctl --user status {record['unit']}")
        said = f"stopped and disabled the systemd user unit {record['unit']} (it no longer starts at boot)"
    elif held is not None:
        if held.get("hostname") != socket.gethostname():
            raise errors.GateRefused(f"the watcher of {ledger} runs on another machine: {watchlock.describe(held)}",
                                     fix=f"run `rgt-run service stop` on {held.get('hostname')}")
        if held.get("mode") == "foreground":
            raise errors.GateRefused(f"the watcher of {ledger} was started in a terminal: "
                                     f"{watchlock.describe(held)}",
                                     fix=f"stop it where it runs (Ctrl-C), or `kill {held.get('pid')}`")
        _kill(int(held["pid"]), ledger)
        said = f"stopped the watcher {watchlock.describe(held)}"
    if record and record.get("tmux_socket") and shutil.which("tmux"):
        _end_tmux(record["tmux_socket"])
    if record and not record.get("stopped_at"):
        atomic_write_json(ledger / watchlock.SERVICE, {**record, "stopped_at": time.time()})
    gone = _wait_free(ledger)
    if not said:
        said = "no watcher was running for this ledger: nothing to stop"
    elif not gone:
        raise errors.RgtError(f"{said}, but the ledger's lock is still held by "
                              f"{watchlock.describe(watchlock.holder(ledger) or {})}",
                              fix="`rgt-run service status`; stop that process by its pid")
    out.print(said, highlight=False, markup=False)
    output.emit({"command": "service", "action": "stop", "stopped": said, "exit_code": errors.OK}, args.json)
    return errors.OK


def _end_tmux(name: str) -> None:
    """The watcher's own tmux server ended, and its socket file with it (a server whose last pane was killed
    leaves it behind)."""
    subprocess.run(["tmux", "-L", name, "kill-server"], capture_output=True, timeout=30)
    sock = Path(os.environ.get("TMUX_TMPDIR") or "/tmp") / f"tmux-{os.getuid()}" / name
    if subprocess.run(["tmux", "-L", name, "list-sessions"], capture_output=True, timeout=30).returncode != 0:
        sock.unlink(missing_ok=True)


def _kill(pid: int, ledger: Path) -> None:
    """SIGTERM to the watcher's process group (its plays with it), SIGKILL when it outlives STOP_WAIT_S."""
    try:
        group = os.getpgid(pid)
    except ProcessLookupError:
        return
    def send(sig: int) -> None:  # the group only when the watcher leads it (detached: it does), else the pid
        try:
            os.killpg(group, sig) if group == pid else os.kill(pid, sig)
        except ProcessLookupError:
            pass

    send(signal.SIGTERM)
    if not _wait_free(ledger):
        send(signal.SIGKILL)


def _wait_free(ledger: Path, wait_s: float = STOP_WAIT_S) -> bool:
    end = time.monotonic() + wait_s
    while watchlock.holder(ledger) is not None:
        if time.monotonic() > end:
            return False
        time.sleep(0.2)
    return True
