"""`rgt-run PLAYBOOK` (and its subcommands smoke, probe, env_check, train): one playbook of the collection, or a
playbook file of your own, on the inventory's boxes, with the same input checks (rgt.prepare), records and summary
(rgt.report) as every other command.

`train -C` without -t/--skip-tags is the plan per host instead (rgt.plan: no box contacted). A Kubernetes host
takes no play: its run is a Job the engine applies from here (rgt.engines: each host's engine plays its share),
its manifests validated before any host (box or cluster) is touched.
"""

from __future__ import annotations

import argparse

from rich.console import Console

from rgt import engines, output, paths, plan, report, unattended
from rgt.ledger import ledger_dir
from rgt.prepare import prepare


def cmd_playbook(args: argparse.Namespace, console: Console) -> int:
    resolved = paths.resolve_playbook(args.playbook) if args.playbook else None
    if (args.check and resolved == paths.PLAYBOOKS_DIR / "train.yml" and not args.tags and not args.skip_tags):
        return plan.cmd_plan(args, console)  # -C on train: the plan per host, no box contacted
    smoke_only = resolved is not None and resolved.stem == "smoke"
    playbook, hosts, extravars = prepare(args, pins=not smoke_only)
    # a Kubernetes host's run is a Job the engine applies from here; its manifests are validated before any host
    # (box or cluster) is touched
    groups = engines.split(hosts) or [(engines.DEFAULT, [])]
    planned = [engine.plan(playbook.stem, mine) for engine, mine in groups]
    ledger = ledger_dir(args.ledger)
    down = inbox = None
    if playbook.stem == "train":
        asked = bool(getattr(args, "down", False) or getattr(args, "down_confirm", None))
        unattended.inbox_at_launch(ledger, hosts, None, down=asked)  # offload.stop_box refused before the prompt
        down = unattended.authorise_at_launch(args, hosts, ledger, console)
        inbox = unattended.inbox_at_launch(ledger, hosts, down)
    if inbox:  # the box's copy of its authorisation, written into job.json (roles/launch_detached)
        extravars = {**extravars, "rgt_inbox_stop": inbox}
    if not smoke_only:
        report.first_contact(console, ledger, hosts)
    console.print(f"[bold]rgt[/bold] {playbook.name} on {len(hosts)} host(s): "
                  + ", ".join(f"{h.name} ({h.vars['rgt_profile']})" for h in hosts))
    # one engine: the inventory's --limit as given; several: each plays its own hosts (the Kubernetes Jobs are
    # applied first), and the last result (the boxes' play) holds them all
    results = [engine.play(playbook, mine, plan_of, args, extravars, ledger, console,
                           args.limit if len(groups) == 1 else ",".join(h.name for h in mine))
               for (engine, mine), plan_of in zip(groups, planned, strict=True)]
    result = results[-1]
    for other in results[:-1]:
        result.hosts.update(other.hosts)
    doc = report.summarize(console, result, hosts, ledger, args.inventory)
    unattended.record_launch(ledger, hosts, down, doc["exit_code"], console)  # train --down: kept after a launch
    output.emit(doc, args.json)
    return doc["exit_code"]
