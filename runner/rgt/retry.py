"""`rgt-run retry RUN`: run one failed run once more, on its own box: a single run, or a sweep cell through its
sweep's queue (docs/job-spec.md "How a run ends", docs/internals.md "Sweeps"). A failed or killed run is started
again by this command only (the box's rule, rgt_runlayout.may_start): `train` and `watch` never do. The help text is
DESCRIPTION."""

from __future__ import annotations

import argparse

from rich.console import Console
from rich.markup import escape

from rgt import budget, engines, errors, memory, output, paths
from rgt.errors import InputError
from rgt.ledger import ledger_dir
from rgt.phases import run_playbook
from rgt.prepare import prepare

_states = paths.module_util("rgt_states")  # live: a retry that left the run running or queued worked

HELP = "run one failed run or sweep cell once more (the user's word; a failed run is never retried blindly)"
DESCRIPTION = """\
A failed run (it exited non-zero, or was killed by a signal that is no stop signal: what status shows as failed)
is never run again on its own, by `train` or `watch`: this command is your word for one run. It finds the box the
run belongs to (a sweep cell from the sweep's roster in the ledger, a single run from the runs the ledger remembers,
or from -e @job.yml) and starts it once more there, from its newest checkpoint and with the code it ran (nothing is
uploaded): a single run as its next attempt, a cell through its box's queue. Only that run is touched. Follow it
with `rgt-run watch`. A run watch stopped at its budget (budget_stopped) is retried only with a higher
rgt_job.budget_usd than it spent. A sweep watch held at its budget is resumed as a whole by its name
(`rgt-run retry SWEEP` with a higher budget_usd): every host's share lifts the hold, its budget_stopped cells run
again from their checkpoints and its held cells start as slots free; a cell's own retry does so on its box only.
Exit codes: 0 the run is queued or running again, 1 it was not (it had not failed, or the launch failed), 2 the
name is no run or cell on these hosts (or a sweep that was not stopped at its budget), 3 a budget_stopped run or
sweep whose budget was not raised."""


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("cell", metavar="RUN", help="the run id of the failed run or sweep cell, e.g. tiny-train or "
                   "abl--lr=3e-4--seed=1 (rgt-run status lists them), or a sweep's name for a sweep held at its "
                   "budget")


def single_run_owners(hosts: list, run_id: str, ledger) -> list:
    """The hosts whose single run (no sweep cell) is `run_id`: the job given with -e, in the inventory or remembered
    for the host, else an older run the ledger remembers on it (that run's job is given to the host, and a sweep
    share it had is dropped: only this run is touched)."""
    owners = []
    for host in hosts:
        job = host.vars.get("rgt_job")
        if isinstance(job, dict) and not job.get("sweep") and (job.get("run_id") or job.get("name")) == run_id:
            owners.append(host)
            continue
        for run in memory.runs_of(ledger, host.name):
            if run.get("run_id") == run_id and run.get("project") == host.project and not run["job"].get("sweep"):
                host.vars = {**host.vars, "rgt_job": run["job"]}
                host.recalled = run
                host.overlay = {k: v for k, v in host.overlay.items() if k != "rgt_sweep"}
                host.sweep = None
                owners.append(host)
                break
    return owners


def _sweep_of(cell: str):
    """With no job spec: every host that holds cells of CELL's sweep (the ledger's runs and rosters) launches that
    sweep's share, so the owner's launch gets the cell and the roster keeps every host (rgt.memory.recall)."""
    def choose(runs_by_host: dict[str, list[dict]]) -> dict:
        sweep = next((r["sweep"] for runs in runs_by_host.values() for r in runs
                      if r.get("sweep") and cell in (r["run_id"], r["sweep"])), None)
        return {name: ("sweep", sweep) for name, runs in runs_by_host.items()
                if sweep and any(r.get("sweep") == sweep for r in runs)}
    return choose


def _job_of(extravars: dict, host) -> dict | None:
    return extravars.get("rgt_job") if isinstance(extravars.get("rgt_job"), dict) else host.vars.get("rgt_job")


def retry_sweep(args: argparse.Namespace, console: Console, playbook, hosts: list, extravars: dict) -> int:
    """`rgt-run retry SWEEP`: a sweep watch held at its budget, resumed on every host of it with the higher
    budget_usd given: each box's launch removes the sweep's budget marker and retries its budget_stopped cells
    (the held ones start as slots free). Refused (exit 3) while the budget is not above what the sweep spent, and
    (exit 2) for a sweep that was not stopped at its budget (a failed cell is retried by its own name)."""
    sweep = args.cell
    ledger = ledger_dir(args.ledger)
    if not budget.stopped(ledger, sweep):
        raise InputError(f"sweep {sweep} was not stopped at its budget: `rgt-run retry` takes one failed cell of it",
                         fix="name the cell as `rgt-run status` lists it, e.g. rgt-run retry "
                             f"{sweep}--<params>", field="cell")
    budget.check_retry(ledger, "", sweep, _job_of(extravars, hosts[0]), sweep)  # not raised: exit 3
    for host in hosts:
        host.overlay["rgt_sweep"]["budget_resume"] = True
    names = ", ".join(h.name for h in hosts)
    console.print(f"[bold]rgt retry[/bold] sweep {escape(sweep)} on {escape(names)} (a higher budget)")
    result = run_playbook(playbook, args.inventory, hosts, ledger=ledger, console=console,
                          extravars={**extravars, "launch_detached_use_new_code": False},
                          limit=",".join(h.name for h in hosts), quiet=not args.verbose, verbosity=args.verbose or 0)
    cells = []
    for host in hosts:
        outcome = result.hosts.get(host.name)
        report = (outcome.results.get("launch_detached_report") if outcome else None) or {}
        cells += [{**c, "host": host.name} for c in report.get("cells") or []]
    held = [c["run_id"] for c in cells if c.get("state") == "budget_stopped"]
    if result.exit_code != errors.OK:
        code = result.exit_code
        console.print("[red]not retried[/red]: the launch failed")
    elif held or not cells:
        code = errors.FAILED
        console.print(f"[yellow]sweep {escape(sweep)}: still held[/yellow]: {escape(', '.join(held) or 'no cell')}")
    else:
        code = errors.OK
        counts: dict[str, int] = {}
        for c in cells:
            counts[c.get("state")] = counts.get(c.get("state"), 0) + 1
        console.print(f"[green]sweep {escape(sweep)} resumed[/green]: "
                      + escape(", ".join(f"{n} {s}" for s, n in sorted(counts.items(), key=str))))
    console.print(f"exit {code}")
    output.emit({"command": "retry", "cell": None, "sweep": sweep, "hosts": [h.name for h in hosts],
                 "cells": cells, "exit_code": code, "phase": result.as_dict()}, args.json)
    return code


def cmd_retry(args: argparse.Namespace, console: Console) -> int:
    ns = argparse.Namespace(**vars(args))
    ns.playbook = "launch_detached"
    playbook, hosts, extravars = prepare(ns, choose=_sweep_of(args.cell))
    whole = [h for h in hosts if (h.overlay.get("rgt_sweep") or {}).get("name") == args.cell]
    if whole:
        return retry_sweep(args, console, playbook, whole, extravars)
    owners = [h for h in hosts if any(c["id"] == args.cell for c in (h.overlay.get("rgt_sweep") or {}).get("cells")
                                      or [])]
    sweep = None
    if owners:
        host = owners[0]
        sweep = host.overlay["rgt_sweep"]["name"]
        host.overlay["rgt_sweep"]["retry"] = [args.cell]
        # the queue starts the cell: its retry.json says the failed attempt may start once more
        evars = {**extravars, "launch_detached_use_new_code": False}
    else:
        owners = single_run_owners(hosts, args.cell, ledger_dir(args.ledger, make=False))
        if not owners:
            where = "these hosts" if len(hosts) > 1 else hosts[0].name
            raise InputError(f"{args.cell} is no run or sweep cell on {where}",
                             fix="name a run or cell as `rgt-run status` lists it; give its job with -e @job.yml "
                                 "when the ledger does not know it", field="cell")
        host = owners[0]
        engines.engine_of(host.profile).check_retry(args.cell, host)  # Kubernetes: a failed Job never starts again
        # a failed or killed run only: a preempted or dead one is left to train and watch
        evars = {**extravars, "launch_detached_use_new_code": False, "launch_detached_relaunch_failed": True,
                 "launch_detached_relaunch": False}
    ledger = ledger_dir(args.ledger)
    budget.check_retry(ledger, host.name, args.cell, _job_of(extravars, host), sweep)  # not raised: exit 3
    if sweep and budget.stopped(ledger, sweep):  # the raised budget: the box's launch removes the sweep's hold
        host.overlay["rgt_sweep"]["budget_resume"] = True
    console.print(f"[bold]rgt retry[/bold] {escape(args.cell)} on {escape(host.name)}"
                  + (f" (sweep {escape(sweep)})" if sweep else ""))
    result = run_playbook(playbook, args.inventory, [host], ledger=ledger, console=console, extravars=evars,
                          limit=host.name, quiet=not args.verbose, verbosity=args.verbose or 0)
    outcome = result.hosts.get(host.name)
    report = (outcome.results.get("launch_detached_report") if outcome else None) or {}
    if sweep:
        cell = next((c for c in report.get("cells") or [] if c.get("run_id") == args.cell), None)
    else:  # a single run: started now, or it was left as it was (live, finished, preempted, dead)
        cell = report if report.get("state") and report.get("action") in ("launch", "relaunch") else None
    state = (cell or {}).get("state") if sweep else report.get("state")
    if result.exit_code != errors.OK:
        code = result.exit_code
        why = ((outcome.messages if outcome else None) or ["the launch failed"])[-1][:600]
        console.print(f"[red]not retried[/red]: {escape(why)}")
    elif cell is not None and _states.is_live(state):
        code = errors.OK
        console.print(f"[green]{escape(args.cell)}: {state}[/green] (attempt {cell.get('attempt')})")
    else:
        code = errors.FAILED
        console.print(f"[yellow]{escape(args.cell)} is {state or 'unknown'}[/yellow]: only a failed run is retried "
                      "(a preempted or dead one resumes with `rgt-run train` or `rgt-run watch`)")
    console.print(f"exit {code}")
    output.emit({"command": "retry", "cell": args.cell, "sweep": sweep, "host": host.name, "state": state,
                 "exit_code": code, "phase": result.as_dict()}, args.json)
    return code
