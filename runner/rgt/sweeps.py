"""Sweeps on the controller: the roster (which cell runs on which host), kept in the ledger; each host's share for
the launch; each cell as an ordinary run for the plays that look at runs; the sweep's tally for status and watch.

The cells, their run ids, commands and environments are module_util rgt_sweep's (one copy for the runner and the
box). Placement is rgt_sweep.place over the hosts that carry the sweep, each weighted by the cells it runs at once
(rgt_job.gpu.count // sweep.gpus_per_cell, at least 1). A roster is sticky: once `<ledger>/sweeps/<project>/
<name>.json` holds it, a cell keeps its host on every later train (so a changed inventory never starts a cell a
second time elsewhere); a cell whose host is not in the play is refused (exit 2), and only new cells are placed. A
roster the ledger lost is not guessed again: the cells the ledger remembers launched (rgt.memory) and each box's own
roster (read before a launch) keep their hosts; a damaged roster is refused (exit 2, the file named).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

from rgt import memory, paths
from rgt.errors import InputError
from rgt.ledger import atomic_write_bytes
from rgt.rosters import cell_job, read_roster, roster_path
from rgt.safetext import printable

_states = paths.module_util("rgt_states")  # the cell states and the map of every run state to one


def _lib():
    return paths.module_util("rgt_sweep")


def sweep_job(host) -> dict | None:
    job = host.vars.get("rgt_job")
    return job if isinstance(job, dict) and job.get("sweep") else None


def slots(job: dict) -> list[str]:
    """CUDA_VISIBLE_DEVICES of each slot of a host: its gpu.count GPUs in groups of sweep.gpus_per_cell (default 1),
    at most sweep.parallel of them; cells without GPUs (gpus_per_cell 0 or gpu.count 0) get sweep.parallel slots
    (default 1) that see no GPU."""
    sweep = job["sweep"]
    count = int((job.get("gpu") or {}).get("count") or 0)
    per_cell = int(sweep.get("gpus_per_cell", 1))
    parallel = sweep.get("parallel")
    if count <= 0 or per_cell <= 0:
        return [""] * int(parallel or 1)
    groups = [",".join(str(g * per_cell + i) for i in range(per_cell)) for g in range(count // per_cell)] \
        or [",".join(str(i) for i in range(count))]  # fewer GPUs than a cell asks for: one slot with them all
    return groups[:int(parallel)] if parallel else groups


def groups(hosts: list) -> dict[tuple[str, str], list]:
    """{(project, sweep name): [host, ...]} over the hosts whose job declares a sweep; refuses two hosts that
    declare different sweeps under one name."""
    out: dict[tuple[str, str], list] = {}
    for host in hosts:
        job = sweep_job(host)
        if job:
            out.setdefault((host.project, job.get("run_id") or job.get("name")), []).append(host)
    for (_project, name), members in out.items():
        first = sweep_job(members[0])
        for other in members[1:]:
            if sweep_job(other)["sweep"] != first["sweep"] or sweep_job(other).get("command") != first.get("command"):
                raise InputError(f"hosts '{members[0].name}' and '{other.name}' declare different sweeps named "
                                 f"{name}", fix="give every host of one sweep the same rgt_job (or another "
                                 "rgt_job.name)", field="rgt_job.sweep")
    return out


def _cells(job: dict) -> list[dict]:
    lib = _lib()
    try:
        return lib.cells(job)
    except lib.SweepError as exc:
        raise InputError(str(exc), fix=exc.fix, field=exc.field) from None


# (hosts, project, sweep name) -> {host: that box's own roster of the sweep}: rgt.sshround.roster_round
BoxLook = Callable[[list, str, str], dict]


def placed_before(ledger: Path | None, project: str, name: str, cell_ids: set[str], hosts: list,
                  look: BoxLook | None = None) -> dict[str, str]:
    """{cell id: host} for a sweep whose roster is not in the ledger, from what is known instead of a guess: the
    cells the ledger remembers launched on a host (rgt.memory) and the roster each box keeps (`look`, the hosts that
    can be asked before the play). A cell known on two hosts is refused (exit 2)."""
    found: dict[str, set[str]] = {}
    if ledger is not None:
        for host in memory.hosts_remembered(ledger):
            for run in memory.runs_of(ledger, host):
                if run.get("project") == project and run.get("run_id") in cell_ids and not run.get("moved_to"):
                    found.setdefault(run["run_id"], set()).add(host)
    for _asked, roster in (look(hosts, project, name) if look and hosts else {}).items():
        for cell, host in (roster.get("cells") or {}).items():
            if cell in cell_ids and isinstance(host, str):
                found.setdefault(cell, set()).add(host)
    twice = sorted((cell, sorted(on)) for cell, on in found.items() if len(on) > 1)
    if twice:
        listed = ", ".join(f"{cell} (on {' and '.join(on)})" for cell, on in twice[:5])
        raise InputError(f"sweep {name}: the ledger keeps no roster, and cell(s) {listed} are known on two hosts",
                         fix="restore the sweep's roster in the ledger, or give the sweep a new rgt_job.name",
                         field="rgt_job.sweep")
    return {cell: next(iter(on)) for cell, on in found.items()}


def plan(hosts: list, ledger: Path | None, look: BoxLook | None = None) -> list[dict]:
    """Each sweep of the play: {sweep, project, job, gpus_per_cell, slots {host: [...]}, at_once {host: n},
    roster}. With a ledger, a cell already in the sweep's roster keeps its host; a sweep with no roster there keeps
    the hosts placed_before finds (the ledger's runs, and with `look` the boxes' own rosters)."""
    lib = _lib()
    out = []
    for (project, name), members in groups(hosts).items():
        job = sweep_job(members[0])
        cells = _cells(job)
        names = [h.name for h in members]
        host_slots = {h.name: slots(sweep_job(h)) for h in members}
        at_once = {h: len(s) for h, s in host_slots.items()}
        kept = read_roster(ledger, project, name) if ledger is not None else None
        if kept is not None:
            before = {c["id"]: c["host"] for c in kept["cells"]}
        else:
            before = placed_before(ledger, project, name, {c["id"] for c in cells}, members, look)
        elsewhere = sorted((cid, before[cid]) for cid in (c["id"] for c in cells)
                           if cid in before and before[cid] not in names)
        if elsewhere:
            listed = ", ".join(f"{cid} (on {host})" for cid, host in elsewhere[:5])
            raise InputError(f"sweep {name}: cell(s) {listed} were placed on a host that is not in this play: a cell "
                             "runs on one host only, never a second time elsewhere",
                             fix="include that host (inventory and --limit), or give the sweep a new rgt_job.name",
                             field="rgt_job.sweep")
        kept_cells = {h: [c["id"] for c in cells if before.get(c["id"]) == h] for h in names}
        # new cells go where the fewest cells per slot are, counting the cells each host already has
        placement = lib.place([c["id"] for c in cells if c["id"] not in before], names, at_once, kept_cells)
        order = {c["id"]: i for i, c in enumerate(cells)}
        placement = {h: sorted(ids, key=order.get) for h, ids in placement.items()}
        roster = lib.roster(name, cells, placement,
                            created_at=(kept or {}).get("created_at")
                            or datetime.now(UTC).isoformat(timespec="seconds"))
        roster["project"] = project
        for cell in roster["cells"]:
            cell["command"] = lib.cell_command(job.get("command") or "", cell)
        out.append({"sweep": name, "project": project, "job": job,
                    "gpus_per_cell": int(job["sweep"].get("gpus_per_cell", 1)), "slots": host_slots,
                    "at_once": at_once, "roster": roster})
    return out


def record(ledger: Path, item: dict) -> None:
    """Keep a sweep's roster (and its job, for `rgt-run retry` and a relaunch) in the ledger, atomically, with the
    keys in the order written: the order of `sweep.matrix` is part of every cell's run id."""
    doc = {**item["roster"], "job": item["job"]}
    atomic_write_bytes(roster_path(ledger, item["project"], item["sweep"]),
                       (json.dumps(doc, indent=2, default=str) + "\n").encode())


def host_share(item: dict, host: str, retry: list[str] | None = None) -> dict:
    """The launch's `rgt_sweep` for one host: its cells in roster order, its slots, the roster, cells to retry."""
    cells = [{"id": c["id"], "command": c["command"], "env": c["env"], "params": c["params"]}
             for c in item["roster"]["cells"] if c["host"] == host]
    return {"name": item["sweep"], "cells": cells, "slots": item["slots"][host], "roster": item["roster"],
            "retry": list(retry or []), "poll_s": item["job"]["sweep"].get("poll_s") or 1.0,
            "parallel": item["job"]["sweep"].get("parallel")}


def expand(hosts: list, extravars: dict, items: list[dict]) -> None:
    """For a play that looks at runs: each sweep host acts on its cells (rgt.memory.act_on: the first, and the
    others in the same round trip); the sweep's job leaves the extra vars (each host gets its own cell's job through
    the runner's inventory)."""
    if isinstance(extravars.get("rgt_job"), dict) and extravars["rgt_job"].get("sweep"):
        del extravars["rgt_job"]
    by_name = {h.name: h for h in hosts}
    for item in items:
        for name in item["slots"]:
            runs = [{"run_id": c["id"], "project": item["project"], "job": cell_job(item["job"], c),
                     "sweep": item["sweep"], "launched_at": None}
                    for c in item["roster"]["cells"] if c["host"] == name]
            host = by_name[name]
            if runs:
                memory.act_on(host, runs)
            host.sweep = item["sweep"]


def prepare(playbook: str, hosts: list, extravars: dict, ledger: Path, plan_only: bool = False,
            look: BoxLook | None = None) -> list[dict]:
    """Before a play (rgt.prepare, after rgt.memory.recall): a launching play (train, launch_detached) gets each
    sweep host's share as the host var rgt_sweep (through the runner's inventory); any other play sees each cell as
    a run (expand). Refuses a sweep on a profile whose detach primitive cannot run one (exit 2). `look`: how to
    read the boxes' own roster of a sweep the ledger keeps none of (not for a plan). Returns the sweeps' plans."""
    if not any(sweep_job(h) for h in hosts):
        return []
    for host in hosts:
        primitive = ((host.profile or {}).get("detach") or {}).get("primitive")
        if sweep_job(host) and not paths.module_util("rgt_registry").runs_sweeps(primitive):
            raise InputError(f"host '{host.name}': its profile launches with {primitive}, which does not run sweeps "
                             "(Kubernetes sweeps are not built)",
                             fix="run the sweep on hosts whose profile detaches with tmux, nohup or sbatch, or run "
                                 "each cell as a job of its own", field="rgt_job.sweep")
    items = plan(hosts, ledger, None if plan_only else look)
    if plan_only:
        return items
    if playbook in ("train", "launch_detached"):
        for item in items:
            for host in hosts:
                if host.name in item["slots"]:
                    host.overlay["rgt_sweep"] = host_share(item, host.name)
        return items
    expand(hosts, extravars, items)
    return items


# ---------------------------------------------------------------- the tally

def tally(roster: dict, runs: list[dict], down: set[str] | frozenset = frozenset()) -> dict:
    """A sweep against its roster from the status documents seen (each with host, run_id, state): per cell its
    cell state (rgt_states.CELL_STATES: its run's state as rgt_states.cell_state counts it; missing: seen nowhere
    or never prepared, duplicate: seen started on two hosts, unreachable: its host (in `down`) did not answer),
    counts in total and per host, and `done` when every cell of the roster finished."""
    by_cell: dict[str, list[dict]] = {}
    for run in runs:
        by_cell.setdefault(str(run.get("run_id")), []).append(run)
    cells = []
    totals: dict[str, int] = {}
    per_host: dict[str, dict[str, int]] = {}
    for cell in roster.get("cells") or []:
        seen = by_cell.get(cell["id"]) or []
        started = [r for r in seen if r.get("state") not in (*_states.NO_START_SEEN, None)]
        mine = [r for r in seen if r.get("host") == cell["host"]]
        if len({r.get("host") for r in started}) > 1:
            state = "duplicate"
        elif cell["host"] in down:
            state = "unreachable"
        else:
            state = _states.cell_state(mine[0].get("state")) if mine else "missing"
        cells.append({"id": cell["id"], "host": cell["host"], "state": state})
        totals[state] = totals.get(state, 0) + 1
        per_host.setdefault(cell["host"], {})
        per_host[cell["host"]][state] = per_host[cell["host"]].get(state, 0) + 1
    return {"sweep": roster.get("sweep"), "project": roster.get("project"), "cells": cells, "total": len(cells),
            "counts": totals, "hosts": per_host, "done": bool(cells) and totals.get("finished") == len(cells)}


def tally_line(t: dict, why=None) -> str:
    """`sweep lr: 6/8 finished, 1 running, 1 failed (lr--seed=2)`; `why(cell)` may say more of a failed cell
    (`lr--seed=2: exit 1, Traceback in log: ...`)."""
    parts = [f"{t['counts'].get('finished', 0)}/{t['total']} finished"]
    for state in _states.CELL_STATES[1:]:
        n = t["counts"].get(state)
        if n:
            named = [printable(why(c)) if why and state == "failed" else c["id"] for c in t["cells"]
                     if c["state"] == state]  # why: box text (an exit code, a log line), made printable
            parts.append(f"{n} {state}" + (f" ({', '.join(named[:3])}{' ...' if len(named) > 3 else ''})"
                                            if state in _states.CELL_NAMED else ""))
    return f"sweep {t['sweep']}: " + ", ".join(parts)


def in_scope(hosts: list) -> list[tuple[str, str]]:
    """(project, sweep) of every sweep whose cells these prepared hosts act on (rgt.memory.runs_acted_on)."""
    out: list[tuple[str, str]] = []
    for host in hosts:
        for run in memory.runs_acted_on(host):
            key = (run.get("project") or host.project, run.get("sweep"))
            if key[1] and key not in out:
                out.append(key)
    return out


def tallies(ledger: Path, hosts: list, runs: list[dict]) -> list[dict]:
    """The tally of every sweep these hosts act on (a job spec given narrows them to its own), over the cells its
    roster places on these hosts (a cell of a host outside the play was not looked at)."""
    names = {h.name for h in hosts}
    down = {r["host"] for r in runs if r.get("state") == "unreachable"}
    out = []
    for project, name in in_scope(hosts):
        roster = read_roster(ledger, project, name)
        if roster is None:
            continue
        mine = {**roster, "cells": [c for c in roster["cells"] if c.get("host") in names]}
        out.append(tally(mine, runs, down))
    return out
