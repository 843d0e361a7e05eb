"""`rgt-run teardown`: stop the meter of each host, behind the teardown gate (design.md "Teardown gate").

The runner asks; the role decides. For each host the user names the instance: typed at an interactive prompt
that shows the verb, whether it can be undone, what it deletes and what keeps billing, or passed with
`--confirm <instance-id>` (repeatable, one per host). A host without a matching confirmation is refused here
(exit 3) and never reaches the playbook: zero control-plane calls. Confirmed hosts run playbooks/teardown.yml
with `rgt_teardown_confirms: {host: id}`; the role re-checks the confirmation and the pull
(PULL_VERIFIED.json vs the manifest now on the box, and a fresh local re-verification) and refuses with
rc_hint 3 on its own, so `rgt-run playbooks/teardown.yml` without a confirmation is refused too.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from rich.console import Console
from rich.panel import Panel

from rgt import errors
from rgt.ledger import ledger_dir, read_json


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="rgt-run teardown", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("-i", "--inventory", required=True, help="inventory file or directory")
    p.add_argument("-l", "--limit", help="limit to these hosts/groups")
    p.add_argument("-e", "--extra-vars", action="append", default=[], help="extra vars: @job.yml, k=v or JSON")
    p.add_argument("--confirm", action="append", default=[], metavar="INSTANCE_ID",
                   help="confirm the teardown of this instance (repeatable, one per host); without it an "
                        "interactive terminal asks you to type the id, anything else is refused")
    p.add_argument("--runs-dir", help="the runs root with the verified pulls (default $RGT_RUNS_DIR or ./runs)")
    p.add_argument("--json", action="store_true", help="print one JSON document on stdout")
    p.add_argument("--ledger", help="ledger directory (default $RGT_LEDGER or ./.rgt)")
    p.add_argument("-v", "--verbose", action="count", default=0)
    return p


def plan(host) -> dict:
    """What the verb does to this host, from its profile: shown at the prompt and returned in --json."""
    meter = host.profile.get("meter_stop") or {}
    reversible = bool(meter.get("reversible"))
    kind = "stop" if reversible else "terminate"
    deletes = [m["path"] for m in host.profile.get("mounts") or [] if kind not in (m.get("survives") or [])]
    return {"host": host.name, "instance_id": host.instance_id, "profile": host.profile.get("name"),
            "verb": meter.get("verb") or "manual", "label": meter.get("label") or meter.get("verb"),
            "reversible": reversible, "deletes": deletes, "keeps_billing": list(meter.get("keeps_billing") or []),
            "api": bool((meter.get("api") or {}).get("client")),
            "key_env": (meter.get("api") or {}).get("key_env")}


def render_plan(console: Console, item: dict) -> None:
    lines = []
    if item["reversible"]:
        lines.append(f"[yellow]{item['label']}[/yellow] ({item['verb']}) of [bold]{item['instance_id']}[/bold]: "
                     "reversible; it can be started again.")
    else:
        lines.append(f"[bold red]{item['label']} ({item['verb']}) of {item['instance_id']}: IRREVERSIBLE.[/bold red] "
                     "The instance and every disk listed below are destroyed for good; nothing can bring them back.")
    if item["deletes"]:
        lines.append("deletes: " + ", ".join(item["deletes"]))
    for line in item["keeps_billing"]:
        lines.append(f"[yellow]keeps billing:[/yellow] {line}")
    if not item["api"]:
        lines.append("rgt calls nothing for this verb: it shows the steps to take in the console.")
    console.print(Panel("\n".join(lines), title=f"teardown {item['host']} ({item['profile']})", expand=False))


def confirmations(console: Console, hosts: list, given: list[str], interactive: bool) -> tuple[dict, dict]:
    """({host: instance_id} confirmed, {host: reason} refused)."""
    confirmed: dict[str, str] = {}
    refused: dict[str, str] = {}
    for host in hosts:
        item = plan(host)
        if host.instance_id in given:
            confirmed[host.name] = host.instance_id
            continue
        if interactive and not given:
            render_plan(console, item)
            typed = console.input(f"Type the instance id [bold]{host.instance_id}[/bold] to {item['verb']} it "
                                  "(anything else cancels): ").strip()
            if typed == host.instance_id:
                confirmed[host.name] = host.instance_id
            else:
                refused[host.name] = f"you typed {typed!r}, not {host.instance_id!r}: nothing was called"
            continue
        if given:
            refused[host.name] = (f"--confirm {', '.join(given)} does not name this host's instance "
                                  f"{host.instance_id!r}: nothing was called")
        else:
            refused[host.name] = (f"no confirmation for {host.instance_id!r} and no terminal to ask on: pass "
                                  f"--confirm {host.instance_id}")
    return confirmed, refused


def runs_dir(explicit: str | None) -> Path:
    return Path(explicit or os.environ.get("RGT_RUNS_DIR") or "runs").expanduser().resolve()


def main_teardown(argv: list[str] | None = None) -> int:
    from rgt.cli import main

    return main(["teardown", *(sys.argv[1:] if argv is None else argv)])


def cmd_teardown(args: argparse.Namespace, console: Console) -> int:
    from rgt.cli import emit, prepare
    from rgt.phases import run_playbook

    ns = argparse.Namespace(playbook="teardown", extra_vars=args.extra_vars, inventory=args.inventory,
                            limit=args.limit)
    playbook, hosts, extravars = prepare(ns, pins=True)
    ledger = ledger_dir(args.ledger)
    interactive = sys.stdin.isatty() and not args.json
    confirmed, refused = confirmations(console, hosts, args.confirm, interactive)
    doc: dict = {"command": "teardown", "hosts": {}, "ledger": str(ledger)}
    for name, reason in refused.items():
        console.print(f"[bold]{name}[/bold]: [red]REFUSED[/red] {reason}")
        doc["hosts"][name] = {"refused": True, "reason": reason, "final_state": None}
    code = errors.REFUSED if refused else errors.OK
    run_hosts = [h for h in hosts if h.name in confirmed]
    if run_hosts:
        evars = {**extravars, "rgt_teardown_confirms": confirmed,
                 "rgt_runs_dir": str(runs_dir(args.runs_dir or extravars.get("rgt_runs_dir")))}
        console.print(f"[bold]rgt[/bold] teardown on {len(run_hosts)} host(s): "
                      + ", ".join(f"{h.name} ({h.vars['rgt_profile']}, {h.instance_id})" for h in run_hosts))
        result = run_playbook(playbook, args.inventory, run_hosts, ledger=ledger, console=console, extravars=evars,
                              limit=",".join(h.name for h in run_hosts), verbosity=args.verbose)
        console.print()
        for host in run_hosts:
            out = result.hosts.get(host.name)
            record = read_json(ledger / "teardown" / f"{host.name}.json") or {}
            entry = {"refused": bool(out and out.gate_refused), "final_state": None,
                     "messages": out.messages if out else ["not run"], **plan(host)}
            if out and not out.failed and not out.unreachable:
                entry.update(final_state=record.get("final_state"), calls=record.get("calls"),
                             keeps_billing=record.get("keeps_billing") or entry["keeps_billing"])
            elif record and out and out.failed and not out.gate_refused:
                entry.update(final_state=record.get("final_state"), calls=record.get("calls"))
            doc["hosts"][host.name] = entry
            _print_host(console, host, entry, out)
        code = errors.REFUSED if (refused or result.exit_code == errors.REFUSED) else result.exit_code
    doc["exit_code"] = code
    doc["next"] = _next_step(doc, args.inventory)
    if doc["next"]:
        console.print(f"\nnext: {doc['next']}")
    console.print(f"exit {code} · ledger {ledger}")
    emit(doc, args.json)
    return code


def _print_host(console: Console, host, entry: dict, out) -> None:
    if out is None:
        state = "[dim]not run[/dim]"
    elif entry["refused"]:
        state = "[red]REFUSED[/red] (nothing was called)"
    elif out.unreachable:
        state = "[magenta]UNREACHABLE[/magenta]: the gate could not read the manifest on the box; nothing was called"
    elif out.failed:
        state = f"[red]FAILED[/red] final state: {entry.get('final_state') or 'not stopped'}"
    else:
        state = f"[green]{entry.get('final_state')}[/green]"
    console.print(f"[bold]{host.name}[/bold] ({host.vars['rgt_profile']}, {host.instance_id}): {state}")
    for msg in (out.messages if out else [])[:3]:
        console.print(f"  {msg.splitlines()[0] if msg else ''}")
    if out and not out.failed:
        for line in entry.get("keeps_billing") or []:
            console.print(f"  [yellow]still billing:[/yellow] {line}")


def _next_step(doc: dict, inventory: str) -> str:
    states = [h for h in doc["hosts"].values()]
    if any(h.get("refused") for h in states):
        return (f"rgt-run pull -i {inventory} (re-pull and re-verify), then rgt-run teardown -i {inventory} "
                "--confirm <instance-id>")
    if any(h.get("final_state") and "unknown" in str(h["final_state"]) for h in states):
        return "check the platform console: the instance was not reported gone in time (rgt will not call again)"
    if states and all(h.get("final_state") for h in states):
        return ("done: whatever still bills is listed above (storage, volumes, IPs); delete it yourself when you no "
                "longer need it")
    return ""


if __name__ == "__main__":
    raise SystemExit(main_teardown())
