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
rgt_job.budget_usd than it spent.
Exit codes: 0 the run is queued or running again, 1 it was not (it had not failed, or the launch failed), 2 the
name is no run or cell on these hosts, 3 a budget_stopped run whose budget was not raised."""


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("cell", metavar="RUN", help="the run id of the failed run or sweep cell, e.g. tiny-train or "
                   "abl--lr=3e-4--seed=1 (rgt-run status lists them)")


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
                      if r["run_id"] == cell and r.get("sweep")), None)
        return {name: ("sweep", sweep) for name, runs in runs_by_host.items()
                if sweep and any(r.get("sweep") == sweep for r in runs)}
    return choose


def cmd_retry(args: argparse.Namespace, console: Console) -> int:
    ns = argparse.Namespace(**vars(args))
    ns.playbook = "launch_detached"
    playbook, hosts, extravars = prepare(ns, choose=_sweep_of(args.cell))
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
    job = extravars.get("rgt_job") if isinstance(extravars.get("rgt_job"), dict) else host.vars.get("rgt_job")
    budget.check_retry(ledger, host.name, args.cell, job, sweep)  # stopped at its budget and not raised: exit 3
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
