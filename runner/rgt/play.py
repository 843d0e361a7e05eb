"""`rgt-run PLAYBOOK` (and its subcommands smoke, probe, env_check, train): one playbook of the collection, or a
playbook file of your own, on the inventory's boxes, with the same input checks (rgt.prepare), records and summary
(rgt.report) as every other command.

`train -C` without -t/--skip-tags is the plan per host instead (rgt.plan: no box contacted). A Kubernetes host
takes no play: its run is a Job the engine applies from here (rgt.k8s_run), its manifests validated before any host
(box or cluster) is touched.
"""

from __future__ import annotations

import argparse

from rich.console import Console

from rgt import k8s_run, memory, output, paths, plan, report
from rgt.ledger import ledger_dir
from rgt.phases import PhaseResult, new_ident, run_playbook
from rgt.prepare import prepare


def cmd_playbook(args: argparse.Namespace, console: Console) -> int:
    resolved = paths.resolve_playbook(args.playbook) if args.playbook else None
    if (args.check and resolved == paths.PLAYBOOKS_DIR / "train.yml" and not args.tags and not args.skip_tags):
        return plan.cmd_plan(args, console)  # -C on train: the plan per host, no box contacted
    smoke_only = resolved is not None and resolved.stem == "smoke"
    playbook, hosts, extravars = prepare(args, pins=not smoke_only)
    # a Kubernetes host's run is a Job the engine applies from here; its manifests are validated before any host
    # (box or cluster) is touched
    on_cluster, on_boxes = k8s_run.split(hosts)
    k8s_run.refuse_play(playbook.stem, on_cluster)
    planned = k8s_run.plan_launch(on_cluster) if on_cluster else {}
    ledger = ledger_dir(args.ledger)
    if not smoke_only:
        report.first_contact(console, ledger, hosts)
    console.print(f"[bold]rgt[/bold] {playbook.name} on {len(hosts)} host(s): "
                  + ", ".join(f"{h.name} ({h.vars['rgt_profile']})" for h in hosts))
    if on_boxes or not on_cluster:
        result = run_playbook(playbook, args.inventory, on_boxes, ledger=ledger, console=console,
                              extravars=extravars, limit=",".join(h.name for h in on_boxes) if on_cluster
                              else args.limit, tags=args.tags, skip_tags=args.skip_tags, check=args.check,
                              verbosity=args.verbose)
    else:
        shown = playbook.relative_to(paths.REPO_ROOT) if playbook.is_relative_to(paths.REPO_ROOT) else playbook
        result = PhaseResult(playbook=str(shown), ident=new_ident(playbook), rc=0, status="successful")
    if planned and not args.check:
        result.hosts.update(k8s_run.start_k8s_job(planned, console))
        memory.remember_launches(ledger, on_cluster, result)
    doc = report.summarize(console, result, hosts, ledger, args.inventory)
    output.emit(doc, args.json)
    return doc["exit_code"]
