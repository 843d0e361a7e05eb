"""`rgt-run retry CELL`: run one failed sweep cell once more, on its own box, through its sweep's queue
(docs/internals.md "Sweeps"). The help text is DESCRIPTION."""

from __future__ import annotations

import argparse

from rich.console import Console
from rich.markup import escape

from rgt import errors
from rgt.errors import InputError

HELP = "run one failed sweep cell once more (the user's word; failed cells are never retried blindly)"
DESCRIPTION = """\
A failed sweep cell is never run again on its own: this command is your word for one cell. It finds the box the
cell belongs to (from the sweep's roster in the ledger, or from -e @job.yml), marks the cell's failed attempt as
retried there and lets the box's queue start it once more, from its newest checkpoint and with the code it ran
(nothing is uploaded). Only that cell is touched. Follow it with `rgt-run watch`.
Exit codes: 0 the cell is queued or running again, 1 it was not (it had not failed, or the launch failed), 2 the
name is no cell of a sweep on these hosts."""


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("cell", metavar="CELL", help="the cell's run id, e.g. abl--lr=3e-4--seed=1 (rgt-run status lists "
                   "them)")


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
    from rgt.cli import emit, prepare
    from rgt.ledger import ledger_dir
    from rgt.phases import run_playbook

    ns = argparse.Namespace(**vars(args))
    ns.playbook = "launch_detached"
    playbook, hosts, extravars = prepare(ns, choose=_sweep_of(args.cell))
    owners = [h for h in hosts if any(c["id"] == args.cell for c in (h.overlay.get("rgt_sweep") or {}).get("cells")
                                      or [])]
    if not owners:
        where = "these hosts" if len(hosts) > 1 else hosts[0].name
        raise InputError(f"{args.cell} is not a cell of a sweep on {where}",
                         fix="name a cell as `rgt-run status` lists it; give the sweep's job with -e @job.yml when "
                             "the ledger does not know it", field="cell")
    host = owners[0]
    host.overlay["rgt_sweep"]["retry"] = [args.cell]
    ledger = ledger_dir(args.ledger)
    console.print(f"[bold]rgt retry[/bold] {escape(args.cell)} on {escape(host.name)} (sweep "
                  f"{escape(host.overlay['rgt_sweep']['name'])})")
    result = run_playbook(playbook, args.inventory, [host], ledger=ledger, console=console,
                          extravars={**extravars, "launch_detached_use_new_code": False}, limit=host.name,
                          quiet=not args.verbose, verbosity=args.verbose or 0)
    outcome = result.hosts.get(host.name)
    report = (outcome.results.get("launch_detached_report") if outcome else None) or {}
    cell = next((c for c in report.get("cells") or [] if c.get("run_id") == args.cell), None)
    state = (cell or {}).get("state")
    if result.exit_code != errors.OK:
        code = result.exit_code
        why = ((outcome.messages if outcome else None) or ["the launch failed"])[-1][:600]
        console.print(f"[red]not retried[/red]: {escape(why)}")
    elif state in ("queued", "running"):
        code = errors.OK
        console.print(f"[green]{escape(args.cell)}: {state}[/green] (attempt {cell.get('attempt')})")
    else:
        code = errors.FAILED
        console.print(f"[yellow]{escape(args.cell)} is {state or 'unknown'}[/yellow]: only a failed cell is retried "
                      "(a preempted or dead one resumes with `rgt-run train` or `rgt-run watch`)")
    console.print(f"exit {code}")
    emit({"command": "retry", "cell": args.cell, "host": host.name, "state": state, "exit_code": code,
          "phase": result.as_dict()}, args.json)
    return code
