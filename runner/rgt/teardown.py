"""`rgt-run teardown`: stop the meter of each instance, behind the box-wide teardown gate (docs/internals.md
"Teardown gate").

First it looks: a read-only play (playbooks/teardown.yml with teardown_plan_only, in check mode: no control-plane
call, nothing changed on the box) lists EVERY run on each box, all projects, with its state and its export. Then
it shows a plan per instance: every run with its state and pull state, the verb, whether it can be undone, what it
deletes, what keeps billing and the clocks it starts. When the gate refuses (a live run; a finished or sealed run
whose pull is not verified against the manifest now on the box; a manifest written on another instance) it says
why and exits 3 without asking and without calling anything. Otherwise it asks for the instance id (typed at an
interactive prompt, or `--confirm <instance-id>`, repeatable, one per instance) and runs playbooks/teardown.yml,
whose role looks at the box again and re-checks the same gate (rgt_gate, one copy) before it calls anything.
Hosts that carry one instance id (rgt_shared_volume: true) are one teardown: one plan, one confirmation, one
meter stop. `-e @job.yml` is accepted but not needed: the gate is box-wide, not per run.

A stop that an earlier run requested and did not see end (Ctrl-C or a kill while it called or polled, or a poll
that ran out of time) is on record in the ledger before the call is made: the look finds it, the plan says so,
and the play polls the same instance to a terminal state without listing the box (it may be gone), without
asking again and without calling again. Ctrl-C during the play says which stops were requested.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console
from rich.markup import escape

from rgt import engines, errors, output, paths
from rgt.engines.base import StopInterrupted
from rgt.inventory import read_inventory
from rgt.ledger import ledger_dir, read_json, runs_dir
from rgt.prepare import prepare
from rgt.safetext import printable

_gate = paths.module_util("rgt_gate")  # the gate's rules, the same file the rgt_teardown module runs


HELP = "stop the meter of each box, only once every run on it is pulled and verified (asks first)"
DESCRIPTION = """\
Stop the meter of each box, behind a safety gate. First it looks at every box, read-only, and shows a plan per
instance: every run on it (all projects) with its state and whether its results are pulled and verified here,
what the stop does (stop or terminate, whether it can be undone, what it deletes), what keeps billing and which
platform clocks it starts.
It refuses, exit 3, without asking and without calling anything, while a run on the box is live, or finished
without a verified pull of the results now on the box. Otherwise it asks you to type the instance id (or take
--confirm INSTANCE_ID, one per instance), looks at the box again and only then stops it. Hosts that share one
instance id (rgt_shared_volume: true) are one teardown. A job spec (-e @job.yml) is accepted but not needed.
The stop is on record before it is called: after a Ctrl-C (or a poll that ran out of time), running the same
command again polls the same instance until it is gone and never calls again."""


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--confirm", action="append", default=[], metavar="INSTANCE_ID",
                   help="confirm the teardown of this instance (repeatable, one per instance); without it an "
                        "interactive terminal asks you to type the id, anything else is refused")
    p.add_argument("--runs-dir", metavar="DIR",
                   help="where your verified pulls are (default $RGT_RUNS_DIR or ./runs)")


def manifest_lib():
    """rgt_manifest, the same file the modules use: compare, validate_manifest, describe_problems for the gate."""
    return paths.module_util("rgt_manifest")


@dataclass
class Instance:
    """One box: the hosts of this run that carry its id, and every inventory host that does."""

    instance_id: str
    hosts: list  # rgt.inventory.Host, in this run (after --limit)
    inventory_hosts: list[str]

    @property
    def profile(self) -> dict:
        return self.hosts[0].profile

    @property
    def names(self) -> list[str]:
        return [h.name for h in self.hosts]


def instances_of(hosts: list, inventory: str, limit: str | None) -> list[Instance]:
    """Group hosts by instance id (the inventory loader already refused undeclared duplicates)."""
    by_id: dict[str, list] = {}
    for host in hosts:
        by_id.setdefault(host.instance_id, []).append(host)
    everyone = {h.name: h.instance_id for h in hosts}
    if limit:  # a manifest may name a host of the same instance that --limit left out
        everyone.update({name: hv.get("rgt_instance_id") for name, hv in read_inventory(inventory).items()})
    return [Instance(iid, sorted(group, key=lambda h: h.name),
                     sorted(name for name, other in everyone.items() if other == iid))
            for iid, group in by_id.items()]


# ---------------------------------------------------------------- what the person reads

def _size(n) -> str:
    if not isinstance(n, int):
        return ""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return ""


def run_verified(row: dict) -> bool:
    """Does a gate row (module_utils/rgt_gate) hold the run's result off the box: pulled and verified, or its sealed
    export offloaded, verified, and still on the target?"""
    return row.get("pull") == "verified" or str(row.get("pull") or "").startswith("export offloaded to ")


def _pull_text(row: dict) -> str:
    if row.get("pull") == "verified":
        return f"verified ({row.get('files')} files, {_size(row.get('bytes'))})"
    return str(row.get("pull") or "-")


def render_plan(console: Console, item: dict) -> None:
    iid = escape(item["instance_id"])
    hosts = ", ".join(item["hosts"])
    console.print(f"\n[bold]teardown {iid}[/bold] ({escape(str(item['profile']))}; host {escape(hosts)})")
    label = escape(str(item["label"]))
    if item["reversible"]:
        console.print(f"  [yellow]{label}[/yellow] ({item['verb']}) of {iid}: reversible; it can be started again.")
    else:
        console.print(f"  [bold red]{label} ({item['verb']}) of {iid}: IRREVERSIBLE.[/bold red] The instance and "
                      "every disk listed below are destroyed for good; nothing can bring them back.")
    if item["deletes"]:
        console.print("  deletes: " + escape(", ".join(item["deletes"])))
    if item.get("slurm_jobs"):
        console.print("  cancels the Slurm jobs (each that is still queued or running): "
                      + escape(", ".join(item["slurm_jobs"])))
    if item.get("k8s_jobs"):
        console.print("  deletes the Kubernetes Jobs (their pods first; the claim is kept): "
                      + escape(", ".join(f"{j['job']} ({j['state']})" for j in item["k8s_jobs"])))
    for line in item["keeps_billing"]:
        console.print(f"  [yellow]keeps billing:[/yellow] {escape(line)}")
    for line in item["clocks"]:
        console.print(f"  [red]clock after {label}:[/red] {escape(line)}")
    if item["console_steps"]:
        console.print(f"  {item['key_env']} is not set: rgt calls nothing; after you confirm, do this in the console:")
    elif not item["api"] and item["manual_steps"]:
        console.print("  rgt calls nothing for this verb: do this in the console after you confirm:")
    for i, step in enumerate(item["manual_steps"] if item["console_steps"] or not item["api"] else [], 1):
        console.print(f"    {i}. {escape(step)}")
    if item["api"] and not item["console_steps"] and item["key_set"] is False:
        console.print(f"  [red]{item['key_env']} is not set[/red]: the call will fail; export it in this shell")
    status = item["status"]
    if status == "already gone":
        console.print(f"  [green]already gone[/green] (ledger: {escape(str(item.get('final_state')))}): nothing "
                      "to do, nothing will be called")
        return
    if status == "in flight":
        console.print(f"  [yellow]a stop is in flight[/yellow]: an earlier run requested the {label} of {iid} (at "
                      f"{escape(str(item.get('requested_at')))}) and did not see it end. rgt polls {iid} until the "
                      "platform reports it gone; it does not list the box, ask again or call again")
        return
    gate = item.get("gate")
    if gate is not None:
        roots = ", ".join(str(r) for r in gate["roots"]) or "?"
        console.print(f"  runs on the box (under {escape(roots)}): {len(gate['runs'])}")
        for row in gate["runs"]:
            name = escape(printable(f"{row['project']}/{row['run_id']}"))
            attempt = f"attempt {row['attempt']}" if row.get("attempt") else ""
            mark = "  [red]blocks[/red]" if row["blocks"] else ""
            console.print(f"    {name:<28} {escape(printable(row['state'])):<10} {attempt:<10} "
                          f"{escape(printable(_pull_text(row)))}{mark}")
        for row in gate["runs"]:
            if row.get("note"):
                console.print(f"    [dim]note:[/dim] {escape(printable(row['note']))}")
        for other in gate["others"]:
            console.print(f"    [dim]note:[/dim] {escape(printable(other['note']))}")
        for note in gate["notes"]:
            console.print(f"    {escape(printable(note))}")
    if status == "ready":
        console.print("  gate: [green]passed[/green] (every finished or sealed run is verified: pulled, or its "
                      "export offloaded; none is live)")
    else:
        word = {"refused": "[red]REFUSED[/red]", "unreachable": "[magenta]UNREACHABLE[/magenta]",
                "failed": "[red]FAILED[/red]"}.get(status, status)
        console.print(f"  gate: {word}, nothing was called:")
        for reason in item["reasons"]:
            console.print(f"    - {escape(printable(reason))}")


def confirmations(console: Console, items: list[dict], given: list[str], interactive: bool) -> tuple[dict, dict]:
    """({instance_id: True} confirmed, {instance_id: reason} refused), one answer per instance."""
    confirmed: dict[str, bool] = {}
    refused: dict[str, str] = {}
    for item in items:
        iid = item["instance_id"]
        if iid in given:
            confirmed[iid] = True
        elif interactive and not given:
            typed = console.input(f"Type the instance id [bold]{escape(iid)}[/bold] to {item['verb']} it "
                                  "(anything else cancels): ").strip()
            if typed == iid:
                confirmed[iid] = True
            else:
                refused[iid] = f"you typed {typed!r}, not {iid!r}: nothing was called"
        elif given:
            refused[iid] = f"--confirm {', '.join(given)} does not name the instance {iid!r}: nothing was called"
        else:
            refused[iid] = f"no confirmation for {iid!r} and no terminal to ask on: pass --confirm {iid}"
    return confirmed, refused


def _look_code(items: list[dict]) -> int:
    statuses = {i["status"] for i in items}
    if "refused" in statuses:
        return errors.REFUSED
    if "failed" in statuses:
        return errors.FAILED
    if "unreachable" in statuses:
        return errors.UNREACHABLE
    return errors.OK


def cmd_teardown(args: argparse.Namespace, console: Console) -> int:
    ns = argparse.Namespace(playbook=str(paths.PLAYBOOKS_DIR / "teardown.yml"), extra_vars=args.extra_vars,
                            inventory=args.inventory, limit=args.limit, ledger=args.ledger)
    _playbook, hosts, extravars = prepare(ns, pins=True)
    ledger = ledger_dir(args.ledger)
    runs = runs_dir(args.runs_dir or extravars.get("rgt_runs_dir"))
    instances = instances_of(hosts, args.inventory, args.limit)
    groups = engines.split_instances(instances)  # a Kubernetes host's Jobs are looked at with kubectl, not a play
    doc: dict = {"command": "teardown", "ledger": str(ledger), "runs_dir": str(runs), "instances": {}, "hosts": {}}

    # 1. look at every box, read-only: the listing play ends before the gate and the verb (and runs in check mode)
    console.print(f"[bold]rgt[/bold] teardown: looking at {len(instances)} box(es) before asking anything "
                  "(read-only): " + ", ".join(f"{escape(i.instance_id)} ({', '.join(i.names)})" for i in instances))
    lib = manifest_lib()
    planned = {}
    for engine, mine in groups:  # Ctrl-C while looking: nothing was asked or called (KeyboardInterrupt)
        planned.update(engine.assess(mine, args, extravars, ledger, runs, console, lib))
    items = [planned[inst.instance_id] for inst in instances]
    for item in items:
        render_plan(console, item)
        doc["instances"][item["instance_id"]] = item

    def host_entries(item: dict, **fields) -> None:
        verb = {k: item[k] for k in ("profile", "verb", "label", "reversible", "deletes", "keeps_billing")}
        for name in item["hosts"]:
            doc["hosts"][name] = {"instance_id": item["instance_id"], "refused": False, "final_state": None,
                                  **verb, **fields}

    code = _look_code(items)
    if code != errors.OK:  # the gate refused (or could not look): nothing is asked, nothing is called
        for item in items:
            blocked = item["status"] in ("refused", "unreachable", "failed")
            host_entries(item, refused=item["status"] == "refused", reasons=item["reasons"],
                         status=item["status"] if blocked else "not run (another box was refused)")
        return _finish(console, doc, code, args)

    for item in items:
        if item["status"] == "already gone":
            host_entries(item, final_state=item.get("final_state"), status="already gone")
    todo = [i for i in items if i["status"] == "ready"]
    resumed = [i["instance_id"] for i in items if i["status"] == "in flight"]  # polled, so nothing to confirm
    interactive = sys.stdin.isatty() and not args.json
    confirmed, refused = confirmations(console, todo, args.confirm, interactive)
    for iid, reason in refused.items():
        console.print(f"[bold]{escape(iid)}[/bold]: [red]REFUSED[/red] {escape(reason)}")
        doc["instances"][iid].update(refused=True, reason=reason)
        host_entries(doc["instances"][iid], refused=True, reason=reason, status="refused")
    code = errors.REFUSED if refused else errors.OK

    def done(iid: str, outcome: dict) -> None:
        doc["instances"][iid]["outcome"] = outcome
        host_entries(doc["instances"][iid], refused=outcome["refused"], final_state=outcome["final_state"],
                     status=outcome["status"], messages=outcome["messages"])
        _print_outcome(console, doc["instances"][iid], outcome)

    # 2. stop each confirmed instance (and poll each stop in flight) through its engine
    for engine, mine in groups:
        ids = {i.instance_id for i in mine}
        try:
            codes = engine.stop(mine, doc["instances"], [i for i in confirmed if i in ids],
                                [i for i in resumed if i in ids], args, extravars, ledger, runs, console, lib, done)
        except StopInterrupted as stopped:
            return _interrupted(console, doc, stopped.instances, ledger, args)
        code = errors.worst([code, *codes])
    return _finish(console, doc, code, args)


def _print_outcome(console: Console, item: dict, outcome: dict) -> None:
    status = outcome["status"]
    if status == "refused":
        state = "[red]REFUSED[/red] (nothing was called)"
    elif status == "unreachable":
        state = "[magenta]UNREACHABLE[/magenta]: the gate could not look at the box again; nothing was called"
    elif status == "failed":
        state = f"[red]FAILED[/red] final state: {escape(str(outcome.get('final_state') or 'not stopped'))}"
    elif status == "not run":
        state = "[dim]not run[/dim]"
    else:
        state = f"[green]{escape(str(outcome.get('final_state')))}[/green]"
    console.print(f"[bold]{escape(item['instance_id'])}[/bold] ({item['profile']}; "
                  f"{escape(', '.join(item['hosts']))}): {state}")
    for msg in outcome["messages"][:3]:
        console.print(f"  {escape(printable(msg.splitlines()[0] if msg else ''))}")
    if status != "done":
        return
    report = outcome["report"]
    for warning in report.get("warnings") or []:
        console.print(f"  [yellow]warning:[/yellow] {escape(printable(warning))}")
    if str(outcome.get("final_state") or "").startswith("manual"):
        console.print("  do this in the console (rgt called nothing):")
        for i, step in enumerate(report.get("manual_steps") or item["manual_steps"], 1):
            console.print(f"    {i}. {escape(step)}")
    for line in outcome.get("keeps_billing") or item["keeps_billing"]:
        console.print(f"  [yellow]still billing:[/yellow] {escape(line)}")
    for line in report.get("clocks") or item["clocks"]:
        console.print(f"  [red]clock now running:[/red] {escape(line)}")


def _interrupted(console: Console, doc: dict, instances: list[Instance], ledger: Path,
                 args: argparse.Namespace) -> int:
    """Ctrl-C during the play: per instance, whether its stop was requested (the ledger's record, written before
    the call) and that running the same command again polls it without calling again."""
    cloud = paths.module_util("rgt_cloud")
    console.print("[yellow]interrupted[/yellow]:")
    for inst in instances:
        item = doc["instances"][inst.instance_id]
        records = [read_json(ledger / "teardown" / f"{name}.json") for name in inst.names]
        states = [cloud.record_state(r, inst.instance_id) for r in records]
        record = next((r for r, s in zip(records, states, strict=True) if s != cloud.RECORD_NONE), None) or {}
        if cloud.RECORD_IN_FLIGHT in states:
            status = "interrupted (stop requested)"
            console.print(f"  [bold]{escape(inst.instance_id)}[/bold]: the {escape(str(item['label']))} was "
                          f"requested at {escape(str(record.get('requested_at')))} (ledger {escape(str(ledger))}"
                          "/teardown); the platform had not reported it gone. Run the same command again: it polls "
                          f"{escape(inst.instance_id)} and never calls again")
        elif cloud.RECORD_GONE in states:
            status = "done"
            console.print(f"  [bold]{escape(inst.instance_id)}[/bold]: {escape(str(record.get('final_state')))}")
        else:
            status = "interrupted (nothing called)"
            console.print(f"  [bold]{escape(inst.instance_id)}[/bold]: interrupted before any call; nothing was "
                          "stopped")
        outcome = {"host": inst.names[0], "refused": False, "status": status, "calls": record.get("calls") or [],
                   "final_state": record.get("final_state"), "messages": [], "report": {}}
        item["outcome"] = outcome
        for name in inst.names:
            doc["hosts"][name] = {"instance_id": inst.instance_id, "refused": False, "status": status,
                                  "final_state": record.get("final_state"),
                                  **{k: item[k] for k in ("profile", "verb", "label", "reversible", "deletes",
                                                          "keeps_billing")}}
    return _finish(console, doc, errors.INTERRUPTED, args)


def _finish(console: Console, doc: dict, code: int, args: argparse.Namespace) -> int:
    doc["exit_code"] = code
    doc["next"] = _next_step(doc, args.inventory)
    if doc["next"]:
        console.print(f"\nnext: {escape(doc['next'])}")
    console.print(f"exit {code} · ledger {escape(doc['ledger'])}")
    output.emit(doc, args.json)
    return code


def _next_step(doc: dict, inventory: str) -> str:
    items = list(doc["instances"].values())
    if any(str((i.get("outcome") or {}).get("status", "")).startswith("interrupted") for i in items):
        return f"run the same command again (rgt-run teardown -i {inventory}): a stop that was requested is polled, " \
               "never called again"
    if any(i.get("status") == "refused" for i in items):
        return (f"wait for live runs to end (rgt-run watch -i {inventory}), rgt-run pull -i {inventory} (seal, pull "
                f"and verify every finished run), then rgt-run teardown -i {inventory}")
    if any(i.get("status") in ("unreachable", "failed") for i in items):
        return f"check the connection (rgt-run status -i {inventory}), then run the teardown again"
    if any(i.get("refused") for i in items):
        return f"rgt-run teardown -i {inventory} --confirm <instance-id>"
    states = [str((i.get("outcome") or {}).get("final_state") or i.get("final_state") or "") for i in items]
    if any("unknown" in s for s in states):
        return "check the platform console: the instance was not reported gone in time (rgt will not call again)"
    if items and all(states):
        return ("done: whatever still bills is listed above (storage, volumes, IPs); delete it yourself when you no "
                "longer need it")
    return ""

