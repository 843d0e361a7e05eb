"""`rgt-run status` and `rgt-run watch`: the monitor phase seen from the controller.

One parallel round over multiplexed SSH per poll (rgt.sshround: one read-only `python3` call per host running the
monitor module's own code, module_utils/rgt_statusdoc); playbooks/monitor.yml gives the same document for ops teams
and for a host whose connection is an Ansible template. The box decides the job's state; the runner adds
`unreachable` for a host whose SSH failed and never turns that into a job state. Exit codes: 3 a host key does
not match its pin, else 5 any attention, else 1 any failed/dead/preempted/not_started run or module error, else 4
any unreachable host, else 0 (every run running or finished).

watch: a bounded loop of status ticks (default every 90 s, at most 120 ticks). A host whose SSH fails is backed
off exponentially (interval x 2^k, capped at 10 min) and skipped until it is due again; the next tick is at the
smallest due time. The loop ends when every run is finished, failed, dead, preempted (and not being resumed),
not started, or needs attention. Every run a host acts on (rgt.memory: without a job spec, every run and sweep cell
the ledger knows on it) is looked at and resumed on its own: a preempted run whose job.json says
attempt_policy.auto_resume, and a sweep cell its dead queue never started, are relaunched once per attempt through
playbooks/launch_detached.yml (old code; a sweep through its queue); failed, dead and attention runs never are.
"""

from __future__ import annotations

import argparse
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from rgt import (
    automove,
    budget,
    endings,
    errors,
    memory,
    move,
    notify,
    offload,
    output,
    paths,
    runreport,
    service,
    sweeps,
    unattended,
)
from rgt.engines import poll, split
from rgt.ledger import append_jsonl, ledger_dir, runs_dir
from rgt.prepare import prepare_hosts
from rgt.prices import Prices
from rgt.safetext import printable

_states = paths.module_util("rgt_states")  # the run states, their groups and styles, one home
_offload = paths.module_util("rgt_offload")  # the newest verified offload of a run, in words
_inbox = paths.module_util("rgt_inbox")  # what the box did of its own meter (offload.stop_box), in words
BACKOFF_CAP_S = 600
DEFAULT_INTERVAL_S = 90
DEFAULT_MAX_TICKS = 120


# ---------------------------------------------------------------- one look

def every_run(docs: dict[str, dict]) -> list[dict]:
    """Each host's document and the documents of the other runs seen on that host."""
    return [run for doc in docs.values() for run in (doc, *(doc.get("other_runs") or []))]


def exit_code(docs: dict[str, dict], tallies: list[dict] = ()) -> int:
    """Exit codes for status/watch over every run seen; host identity first, then attention, job, transport. A
    sweep cell seen on two hosts is attention; one missing from its host is a failure."""
    values = every_run(docs)
    if any(d.get("host_key_mismatch") for d in values):
        return errors.REFUSED
    if any(d.get("attention") for d in values) or any(t["counts"].get("duplicate") for t in tallies):
        return errors.ATTENTION
    if any(_states.is_failed(d.get("state")) for d in values) or any(t["counts"].get("missing") for t in tallies):
        return errors.FAILED
    if any(d.get("state") == "unreachable" for d in values):
        return errors.UNREACHABLE
    return errors.OK


def _ago(seconds: float) -> str:
    seconds = max(0, int(seconds))
    if seconds < 120:
        return f"{seconds} s ago"
    if seconds < 7200:
        return f"{seconds // 60} min ago"
    return f"{seconds // 3600} h ago"


# ---------------------------------------------------------------- rendering

def _fmt(value, spec: str = "", missing: str = "-") -> str:
    if value is None:
        return missing
    if isinstance(value, float) and spec:
        return format(value, spec)
    return str(value)


def _max(values: list) -> float | None:
    numbers = [v for v in values if isinstance(v, (int, float))]
    return max(numbers) if numbers else None


def summary_fields(doc: dict) -> dict:
    mounts = doc.get("mounts") or []
    gpus = doc.get("gpu") or []
    util = [g.get("util_pct") for g in gpus]
    evidence = doc.get("evidence") or {}
    loss = doc.get("loss")
    return {
        "attempt": _fmt(doc.get("attempt")), "step": _fmt(doc.get("step")),
        "loss": _fmt(loss, ".4g") if not isinstance(loss, str) else loss,
        "util": "/".join(f"{u}%" for u in util if u is not None) or "-",
        "disk": _fmt(_max([m.get("bytes_pct") for m in mounts])),
        "inode": _fmt(_max([m.get("inodes_pct") for m in mounts])),
        "hb": _fmt(evidence.get("heartbeat_age_s"), ".0f"),
        "cost": _fmt(doc.get("cost_so_far"), ".2f"),
    }


def state_text(doc: dict, now: float) -> str:
    state = doc.get("state", "?")
    if state == "unreachable":
        seen = doc.get("last_seen")
        text = "unreachable"
        if seen and seen.get("seen_at"):
            text += f" (last seen: {seen.get('state')} {_ago(now - seen['seen_at'])})"
        return text
    return state


def render_table(console: Console, docs: dict[str, dict]) -> None:
    now = time.time()
    priced = any(d.get("cost_so_far") is not None for d in every_run(docs))
    table = Table(show_edge=False, pad_edge=False)
    several = any(d.get("other_runs") for d in docs.values())  # a run column only when a host shows several
    columns = ["host", *(["run"] if several else []), "state", "att", "step", "loss", "gpu", "disk%", "inode%",
               "hb s"]
    if priced:
        columns.append("cost")
    budgeted = any(d.get("budget") for d in every_run(docs))  # rgt.budget.annotate: spend/budget when one is set
    if budgeted:
        columns.append("budget")
    for col in columns:
        table.add_column(col, overflow="fold")
    for name, host_doc_ in sorted(docs.items()):
        for doc in (host_doc_, *(host_doc_.get("other_runs") or [])):
            f = {k: escape(printable(v)) for k, v in summary_fields(doc).items()}  # box text: no controls, no markup
            style = _states.style(doc.get("state"))
            row = [name, *([escape(printable(doc.get("run_id") or "-"))] if several else []),
                   f"[{style}]{escape(printable(doc.get('state', '?')))}[/]", f["attempt"], f["step"], f["loss"],
                   f["util"], f["disk"], f["inode"], f["hb"]]
            if priced:
                row.append(f["cost"])
            if budgeted:
                row.append(escape(budget.column(doc)))
            table.add_row(*row)
    console.print(table)
    for doc in sorted(every_run(docs), key=lambda d: (d["host"], str(d.get("run_id")))):
        name = doc["host"] if not docs[doc["host"]].get("other_runs") else f"{doc['host']}:{doc.get('run_id')}"
        name = escape(printable(name))
        for item in doc.get("attention") or []:
            console.print(f"  [red]attention[/red] {name}: {escape(printable(item.get('id')))}: "
                          f"{escape(printable(item.get('message')))}")
        if doc.get("error"):
            console.print(f"  [magenta]{name}[/magenta]: {escape(printable(state_text(doc, now)))}: "
                          f"{escape(printable(doc['error']))}")
        if doc.get("offload"):
            console.print(f"  {name}: {escape(printable(_offload.describe(doc['offload'])))}")
        if _inbox.describe(doc.get("inbox_stop")):
            console.print(f"  {name}: {escape(printable(_inbox.describe(doc['inbox_stop'])))}")
        for warning in doc.get("warnings") or []:
            console.print(f"  [yellow]warning[/yellow] {name}: {escape(printable(warning))}")


def tick_line(name: str, doc: dict, now: float, note: str = "") -> str:
    f = summary_fields(doc)
    clock = datetime.fromtimestamp(now).strftime("%H:%M:%S")
    attention = ",".join(a.get("id", "?") for a in doc.get("attention") or [])
    parts = [clock, name, state_text(doc, now), f"step={f['step']}", f"loss={f['loss']}", f"util={f['util']}",
             f"disk={f['disk']}%", f"inode={f['inode']}%", f"hb={f['hb']}s"]
    if attention:
        parts.append(f"attention={attention}")
    if doc.get("offload"):
        parts.append(_offload.short(doc["offload"]))
    if isinstance(doc.get("inbox_stop"), dict) and doc["inbox_stop"].get("action"):
        parts.append(f"box_stop={doc['inbox_stop']['action']}")
    if note:
        parts.append(note)
    return printable(" ".join(parts))  # box text (state, loss, attention ids): no controls, one line


# ---------------------------------------------------------------- status

def cmd_status(args: argparse.Namespace, console: Console) -> int:
    hosts, extravars = prepare_hosts(args)
    ledger = ledger_dir(args.ledger)
    hosts = move.left_behind(console, ledger, hosts)  # a host whose runs all moved away (rgt.move): one line
    docs = poll(args, console, hosts, extravars, ledger)
    runs = every_run(docs)  # spend/budget of each run with rgt_job.budget_usd (its column, --json), at the
    budget.annotate(runs, prices=budget.platform_prices(runs, Prices(ledger, hosts, console)))  # platform's price
    offload.annotate(docs, runs_dir(getattr(args, "runs_dir", None)))  # offload.to: controller: the local copies
    out = output.results(args.json)  # the table is the result: stdout (stderr under --json)
    render_table(out, docs)
    endings.annotate(docs, hosts, args, console)  # a run that ended by a signal: what happened, what to run
    tallies = sweep_tallies(out, ledger, hosts, docs)
    code = exit_code(docs, tallies)
    console.print(f"exit {code} · ledger {ledger / 'status'}")
    output.emit({"command": "status", "hosts": docs, "sweeps": tallies, "exit_code": code}, args.json)
    return code


def sweep_tallies(console: Console, ledger: Path, hosts: list, docs: dict[str, dict]) -> list[dict]:
    """Each sweep with cells on these hosts, reconciled against its roster (rgt.sweeps.tally), one line each."""
    out = sweeps.tallies(ledger, hosts, every_run(docs))
    for t in out:
        style = "green" if t["done"] else "red" if set(_states.CELL_NAMED) & set(t["counts"]) else "cyan"
        console.print(f"[{style}]{escape(sweeps.tally_line(t))}[/]")
        if len(t["hosts"]) > 1:
            console.print("  " + "; ".join(f"{escape(h)}: " + ", ".join(f"{n} {k}" for k, n in sorted(c.items()))
                                           for h, c in sorted(t["hosts"].items())))
    return out


# ---------------------------------------------------------------- watch

class Schedule:
    """Per-host due times: healthy hosts every interval, unreachable ones backed off (interval x 2^k, capped)."""

    def __init__(self, names: list[str], interval: float, start: float, cap: float = BACKOFF_CAP_S):
        self.interval = interval
        self.cap = cap
        self.due = {n: start for n in names}
        self.failures = {n: 0 for n in names}
        self.done: set[str] = set()

    def active(self) -> list[str]:
        return [n for n in self.due if n not in self.done]

    def due_hosts(self, now: float) -> list[str]:
        return [n for n in self.active() if self.due[n] <= now + 1e-6]

    def next_due(self) -> float | None:
        times = [self.due[n] for n in self.active()]
        return min(times) if times else None

    def update(self, name: str, reachable: bool, now: float) -> float:
        if reachable:
            self.failures[name] = 0
            delay = self.interval
        else:
            self.failures[name] += 1
            delay = min(self.interval * (2 ** self.failures[name]), self.cap)
        self.due[name] = now + delay
        return delay


def is_terminal(doc: dict, resumable: bool = False) -> bool:
    """Nothing more to wait for on this host: the run ended, needs a human, or the box refused us (and every
    other run seen on the host has ended too)."""
    if doc.get("host_key_mismatch"):
        return True
    if not all(is_terminal(other) for other in doc.get("other_runs") or []):
        return False
    if doc.get("attention"):
        return True
    state = doc.get("state")
    if state == "preempted" and resumable:
        return False
    return _states.is_terminal(state)


def relaunch(args: argparse.Namespace, console: Console, hosts: list[str], *, extravars: dict | None = None,
             ledger: Path | None = None, host_objs: list | None = None,
             due: dict[str, list[dict]] | None = None) -> int:
    """Start the due runs again through playbooks/launch_detached.yml (a Kubernetes host: its Job again,
    rgt.k8s_run): a preempted run with its old code (attempt n+1), a sweep whose cells never started through its
    queue. By run, not by host: a host acting on the runs the ledger remembers (rgt.memory.recall) gets one launch
    per sweep with due cells (its queue resumes them all) and one per due single run (the k-th of each host in the
    k-th play); a host given a job spec launches that job. `due`: {host: the due runs' status documents}. Returns
    the worst exit code of the launches."""
    by_obj = {h.name: h for h in host_objs or []}
    remembered = [n for n in hosts if (getattr(by_obj.get(n), "recalled", None) or {}).get("remembered")]
    plays: list[tuple[memory.Chooser | None, list[str]]] = []
    given = [n for n in hosts if n not in remembered]
    if given:
        plays.append((None, given))
    by_sweep: dict[str, list[str]] = {}
    singles: dict[str, list[str]] = {}
    for name in remembered:
        sweep_of = {r["run_id"]: r.get("sweep") for r in memory.runs_acted_on(by_obj[name])}
        for run in (due or {}).get(name) or []:
            run_id = str(run.get("run_id"))
            sweep = run.get("sweep") or sweep_of.get(run_id)
            if sweep and name not in by_sweep.setdefault(sweep, []):
                by_sweep[sweep].append(name)
            elif not sweep:
                singles.setdefault(name, []).append(run_id)
    for sweep, names in sorted(by_sweep.items()):
        plays.append((_same_sweep(sweep), names))
    for index in range(max([len(ids) for ids in singles.values()] or [0])):
        picked = {name: ids[index] for name, ids in singles.items() if index < len(ids)}
        plays.append((lambda _runs, picked=picked: {n: ("run", r) for n, r in picked.items()}, sorted(picked)))
    codes = [_launch(args, console, ledger or ledger_dir(args.ledger), choose, names) for choose, names in plays]
    return errors.worst(codes)


def _same_sweep(sweep: str):
    """A chooser (rgt.memory.recall) that gives every host holding cells of `sweep` that sweep's share (the roster
    needs all its hosts in the play; the launch runs only where cells are due)."""
    def choose(runs_by_host: dict[str, list[dict]]) -> dict:
        return {name: ("sweep", sweep) for name, runs in runs_by_host.items()
                if any(r.get("sweep") == sweep for r in runs)}
    return choose


def _launch(args: argparse.Namespace, console: Console, ledger: Path, choose, names: list[str]) -> int:
    """One relaunch play on `names`, prepared as a launch (a sweep host gets its share), the code each run ran."""
    playbook = paths.PLAYBOOKS_DIR / "launch_detached.yml"
    if not playbook.is_file():
        console.print(f"[red]cannot relaunch[/red] {', '.join(names)}: {playbook} does not exist")
        return errors.FAILED
    all_hosts, extravars = prepare_hosts(args, "launch_detached", choose)
    hosts = [h for h in all_hosts if h.name in names]
    inbox = unattended.inbox_for_relaunch(ledger, hosts)
    if inbox:  # the box's copy of its authorisation (train --down) goes back into the relaunched job.json
        extravars = {**extravars, "rgt_inbox_stop": inbox}
    codes = [engine.relaunch(args, console, mine, extravars, ledger) for engine, mine in split(hosts)]
    return errors.worst(codes)


def due_runs(doc: dict, cells: set[str] | frozenset = frozenset()) -> list[dict]:
    """The runs of a host's document (its run and the others seen beside it) that a relaunch would start again:
    preempted with auto_resume and no attention; and a sweep cell (its document names the sweep, or its id is in
    `cells`) that never started (its sweep's queue on the box is not running, or will not start it: a relaunch
    starts the queue again; train asked for the cell, so auto_resume does not apply). Failed, dead and attention
    runs never are."""
    out = []
    for run in (doc, *(doc.get("other_runs") or [])):
        if run.get("attention"):
            continue
        cell = bool(run.get("sweep")) or str(run.get("run_id")) in cells
        if (run.get("state") == "preempted" and run.get("auto_resume")) or (cell and run.get("state") ==
                                                                            "not_started"):
            out.append(run)
    return out


def resume_key(name: str, doc: dict, cells: set[str] | frozenset = frozenset()) -> tuple | None:
    """What a relaunch of this host would start again, once (None: nothing): every due run (due_runs) with its
    attempt, so a later preemption of the same run is a new key."""
    due = due_runs(doc, cells)
    if not due:
        return None
    return name, tuple(sorted((str(r.get("run_id")), r.get("attempt")) for r in due))


def cells_of(host) -> set[str]:
    """The run ids of the sweep cells a prepared host acts on (rgt.memory.runs_acted_on)."""
    return {r["run_id"] for r in memory.runs_acted_on(host) if r.get("sweep")}


def _monotonic() -> float:  # seams for tests: a fake clock drives the scheduler
    return time.monotonic()


def _sleep(seconds: float) -> None:
    time.sleep(seconds)


def cmd_watch(args: argparse.Namespace, console: Console) -> int:
    hosts, extravars = prepare_hosts(args)
    ledger = ledger_dir(args.ledger)
    interval = float(args.interval if args.interval is not None else DEFAULT_INTERVAL_S)
    if interval <= 0:
        raise errors.InputError("--interval must be positive", fix="--interval 90", field="--interval")
    max_ticks = args.max_ticks if args.max_ticks is not None else DEFAULT_MAX_TICKS
    if max_ticks < 1:
        raise errors.InputError("--max-ticks must be at least 1", fix="--max-ticks 120", field="--max-ticks")
    if getattr(args, "detach", False):  # the same watch in the background (rgt.service)
        return service.detach(args, console, ledger)
    watching = service.start_watch(args, ledger, console, hosts)  # the ledger's watch lock (--follow: none), its log
    idle = automove.idle_spares(hosts)  # spares with no run: looked at once a run moves there (rgt.automove)
    hosts = [h for h in hosts if h.name not in idle]
    # hosts given no job whose runs all moved away (rgt.move): looked at only to fence them, never a run's state
    left = {h.name for h in hosts if move.all_moved_away(ledger, h)}
    by_name = {h.name: h for h in hosts}
    events = ledger / "events" / f"{datetime.now(UTC).strftime('%Y%m%dT%H%M%SZ')}-watch-{uuid.uuid4().hex[:6]}.jsonl"
    schedule = Schedule(list(by_name), interval, _monotonic())
    latest: dict[str, dict] = {}
    relaunched = watching.relaunched  # from the ledger: once per attempt across watcher restarts
    relaunches: list[dict] = []
    ticks = 0
    code = errors.OK
    notifier = None if watching.follow else _watch_notifier(ledger, hosts, extravars, console)
    budgets = None if watching.follow else budget.Watcher(args, console, ledger, hosts, extravars, notifier)
    moves = None if watching.follow else automove.Watcher(args, console, ledger, notifier, events, extravars)
    console.print(f"[bold]rgt watch[/bold] {len(hosts)} host(s), every {interval:g} s, at most {max_ticks} ticks "
                  "(dead runs are reported, never relaunched)")
    while ticks < max_ticks and schedule.active():
        wait = (schedule.next_due() or 0) - _monotonic()
        if wait > 0:
            _sleep(wait)
        due = schedule.due_hosts(_monotonic())
        if not due:
            continue
        ticks += 1
        docs = poll(args, console, [by_name[n] for n in due], extravars, ledger)
        if moves is not None:  # a run `rgt-run move` took away: its stale attempt on a box that answers again
            moves.fenced(move.fence(args.inventory, console,  # is stopped (rgt.move)
                                    [by_name[n] for n in due if docs[n].get("state") != "unreachable"], extravars,
                                    ledger, events))
            for moved in moves.tick({n: docs[n] for n in due}, by_name):  # a gone box's run, to a spare
                _follow_moved(args, console, moved, by_name, schedule, hosts, notifier, extravars, _monotonic())
        offload.tick(args, console, hosts, docs, extravars, watching.follow)  # rgt.offload: to: controller
        mono, now = _monotonic(), time.time()
        to_resume = []
        keys: dict[str, tuple] = {}
        for name in due:
            doc = docs[name]
            if moves is not None and name in moves.left and doc.get("state") == "unreachable":
                latest.pop(name, None)  # every run it held moved away: its silence is no run's state
                schedule.update(name, False, mono)  # looked at again (backed off) for the fence, if it comes back
                console.print(f"{name}: unreachable; its runs moved away", highlight=False, markup=False)
                continue
            if name in left:  # its runs all moved away before this watch: once it answers and is fenced, done
                latest.pop(name, None)
                fenced = doc.get("state") != "unreachable" and all(
                    r.get("fenced_at") for r in memory.moved_away(ledger, name))
                if fenced:
                    schedule.done.add(name)
                else:
                    schedule.update(name, False, mono)  # looked at again (backed off) for the fence
                console.print(f"{name}: " + ("its runs moved away and are fenced here; not looked at again" if fenced
                              else f"{doc.get('state')}; its runs moved away, not fenced yet"),
                              highlight=False, markup=False)
                continue
            latest[name] = doc
            delay = schedule.update(name, doc.get("state") != "unreachable", mono)
            key = resume_key(name, doc, cells_of(by_name[name]))
            resumable = key is not None and key not in relaunched
            note = f"next try in {delay:.0f} s" if doc.get("state") == "unreachable" else ""
            console.print(tick_line(name, doc, now, note), highlight=False, markup=False)
            for other in doc.get("other_runs") or []:
                console.print(tick_line(f"{name}:{other.get('run_id')}", other, now), highlight=False, markup=False)
            if resumable and not watching.follow:
                to_resume.append(name)
                keys[name] = key
            elif is_terminal(doc):
                schedule.done.add(name)
            elif doc.get("state") == "preempted" and all(is_terminal(o) for o in doc.get("other_runs") or []):
                schedule.done.add(name)  # preempted and not resumable (again): report, leave it to the user
        if budgets is not None:  # rgt.budget (--follow acts on nothing)
            budgets.tick(latest)  # rgt.budget: 50/80/100% of budget_usd (a stop at 100%), idle meters
        _watch_notify(notifier, docs, _watch_summary(latest, ledger, hosts) if notifier is not None else "")
        if not watching.follow:  # a meter stop authorised at launch (--follow acts on nothing)
            unattended.tick(args, console, ledger, hosts, latest, notifier)
        if to_resume:
            for name in to_resume:
                relaunched.add(keys[name])  # before the relaunch: a watcher killed during it never repeats it
            waiting = {n: due_runs(latest[n], cells_of(by_name[n])) for n in to_resume}
            console.print("[yellow]relaunching[/yellow] preempted run(s) with auto_resume on, and sweep cells whose "
                          "queue never started them: " + ", ".join(
                              f"{n} ({', '.join(str(r.get('run_id')) for r in waiting[n])})" for n in to_resume))
            rc = relaunch(args, console, to_resume, extravars=extravars, ledger=ledger,
                          host_objs=[by_name[n] for n in to_resume], due=waiting)
            for name in to_resume:
                runs = waiting[name]
                entry = {"t": time.time(), "event": "relaunch", "host": name, "attempt": latest[name].get("attempt"),
                         "runs": [r.get("run_id") for r in runs],
                         "reason": "preempted" if any(r.get("state") == "preempted" for r in runs)
                         else "never started", "auto_resume": any(r.get("auto_resume") for r in runs),
                         "exit_code": rc}
                relaunches.append(entry)
                append_jsonl(events, entry)
                if rc != errors.OK:
                    schedule.done.add(name)
                else:
                    schedule.due[name] = _monotonic() + min(interval, 30.0)  # see the new attempt soon
            console.print(f"relaunch exit {rc}")
        code = exit_code(latest)
        watching.tick(ticks, latest, schedule.active())  # <ledger>/service/tick.json, the log's size cap
    out = output.results(args.json)  # the ticks were progress; where every run ended up is the result (stdout)
    for item in latest.values():
        if item.get("attention") or item.get("state") in _states.EXPLAINED:
            for att in item.get("attention") or []:
                out.print(f"  [red]attention[/red] {item['host']}: {escape(printable(att.get('id')))}: "
                          f"{escape(printable(att.get('message')))}")
            if item.get("error"):
                out.print(f"  [magenta]{item['host']}[/magenta]: {escape(printable(item['error']))}")
    if latest:
        endings.annotate(latest, hosts, args, console, watching=True)
    reason = "every run is settled" if not schedule.active() else f"max ticks ({max_ticks}) reached"
    tallies = sweep_tallies(out, ledger, hosts, latest) if latest else []
    code = exit_code(latest, tallies) if latest else code
    summary = _watch_summary(latest, ledger, hosts)
    if summary:
        out.print(summary, highlight=False, markup=False)
    if notifier is not None:
        try:
            notifier.flush()
        except Exception as exc:  # noqa: BLE001 - a notification never fails the watch
            console.print(f"notify: not flushed ({type(exc).__name__}: {exc})", highlight=False, markup=False)
    console.print(f"watch stopped after {ticks} tick(s): {reason}; exit {code}")
    watching.close()
    output.emit({"command": "watch", "ticks": ticks, "hosts": latest, "relaunches": relaunches, "exit_code": code,
                 "summary": summary, "sweeps": tallies,
                 "stopped": "settled" if not schedule.active() else "max_ticks"}, args.json)
    return code


def _watch_summary(latest: dict[str, dict], ledger: Path | None = None, hosts: list | None = None) -> str:
    """The one-glance line (rgt.runreport.glance); for hosts that run sweeps, each sweep's tally (a failed cell
    with why: its exit code, a Traceback in its log) then the preemptions, compute lost and cost of every run;
    empty when nothing was seen."""
    if not latest:
        return ""
    tallies = sweeps.tallies(ledger, hosts, every_run(latest)) if ledger is not None and hosts else []
    if not tallies:
        return runreport.glance(latest)
    seen = [r for r in every_run(latest) if r.get("state") != "unreachable"]
    docs = {(r.get("host"), r.get("run_id")): r for r in seen}

    def why(cell: dict) -> str:
        doc = docs.get((cell["host"], cell["id"]))
        return runreport.why_failed(cell["id"], doc) if doc else cell["id"]

    lines = [sweeps.tally_line(t, why) for t in tallies]
    return "; ".join(lines) + "; " + runreport.losses_and_cost(runreport.run_facts(r) for r in seen)


def _follow_moved(args: argparse.Namespace, console: Console, moved: dict, by_name: dict, schedule: Schedule,
                  hosts: list, notifier, extravars: dict, now: float) -> None:
    """After watch moved a run to a spare (rgt.automove): the spare is watched from the next tick, with the runs the
    ledger now knows on it; the old host is done once the platform said it is gone."""
    if moved.get("gone"):
        schedule.done.add(moved["from"])  # terminated: nothing there to fence, ever
    ns = argparse.Namespace(**{**vars(args), "limit": moved["to"], "extra_vars": []})
    try:
        (spare,), _extra = prepare_hosts(ns)
    except (errors.InputError, ValueError) as exc:  # the run goes on there; watch says why it cannot follow it
        console.print(f"{moved['to']}: not watched by this watch ({getattr(exc, 'message', exc)}): `rgt-run watch "
                      f"-i INV -l {moved['to']}` follows the run there", highlight=False, markup=False)
        return
    by_name[moved["to"]] = spare
    hosts[:] = [h for h in hosts if h.name != spare.name] + [spare]
    schedule.due[spare.name], schedule.failures[spare.name] = now, 0
    schedule.done.discard(spare.name)
    if notifier is not None:
        notifier.rules[spare.name] = notify.host_rules(spare, extravars)


def _watch_notifier(ledger: Path, hosts: list, extravars: dict, console: Console):
    """The notification rules of these hosts (rgt.notify), or None when no run asks for any."""
    notifier = notify.notifier_for(ledger, hosts, extravars, console)
    return notifier if notifier.active else None


def _watch_notify(notifier, docs: dict[str, dict], summary: str) -> None:
    """One pass per tick: the transitions in this tick's documents, each message carrying the summary of every
    host seen so far; then the deliveries due (bounded in time, never raising)."""
    if notifier is None:
        return
    try:
        notifier.observe(docs, summary)  # every run of each document (a sweep's cells too), each on its own
        notifier.deliver()
    except Exception as exc:  # noqa: BLE001 - a notification never fails the watch
        notifier.console.print(f"notify: skipped this tick ({type(exc).__name__}: {exc})",
                               highlight=False, markup=False)


# ---------------------------------------------------------------- command line (the table is in rgt.cli)

STATUS_HELP = "look at each box once: the state of its run, step, loss, GPU use, disk, heartbeat (read-only)"
STATUS_DESCRIPTION = """\
Look at each box once, read-only, and print one row per run (without -e: every run and sweep cell rgt launched on
each box; -e @job.yml narrows it to that job): the run's state (running, stalled, finished,
failed, dead, preempted), step and loss from its log, GPU use, free disk and inodes, the last heartbeat, the cost
so far, and anything that needs your attention. A box that cannot be reached is shown as unreachable with the
last state it reported; it is never taken for a dead job.
Exit codes: 3 a host key does not match its pin, else 5 something needs your attention, else 1 a run failed, died,
was preempted or never started, else 4 a box is unreachable, else 0 (every run running or finished)."""
WATCH_HELP = "look again every 90 s until every run settles; resumes preempted runs that allow it"
WATCH_DESCRIPTION = """\
Run `rgt-run status` again and again (every 90 s by default, at most 120 times) until every run has finished,
failed, died, or needs your attention. A box that cannot be reached is asked again later and later (doubling, at
most every 10 minutes). A preempted run whose job spec says auto_resume: true is restarted from its newest
checkpoint with the code it started with; failed runs and runs that need attention never are. A sweep whose queue
on the box died before starting every cell gets its queue started again. Without -e it watches every run and sweep
rgt launched on each box (and resumes each, by run); -e @job.yml narrows it to that job.
One watcher per ledger: a second one exits 3 naming the one that holds it; --follow looks along without acting;
--detach runs it in the background (`rgt-run service` installs it, shows it, stops it: docs/unattended.md).
Exit codes: as for `rgt-run status`."""


def add_watch_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--interval", type=float, default=DEFAULT_INTERVAL_S, metavar="SECONDS",
                   help=f"seconds between looks ({DEFAULT_INTERVAL_S})")
    p.add_argument("--max-ticks", dest="max_ticks", type=int, default=DEFAULT_MAX_TICKS, metavar="N",
                   help=f"stop after this many looks ({DEFAULT_MAX_TICKS})")


def run_status(args: argparse.Namespace, console: Console) -> int:
    """`rgt-run status ARGS` (errors are reported by rgt.cli.main)."""
    args.interval, args.max_ticks = None, None
    return cmd_status(args, console)


