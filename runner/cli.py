"""`rgt-run`: a thin runner over ansible-runner. It validates input, runs phases, keeps the ledger, prints results.

Human output goes to stderr; `--json` prints exactly one JSON document on stdout. Exit codes: see rgt.errors.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from pathlib import Path

import yaml
from rich.console import Console

from rgt import errors, paths
from rgt.errors import InputError, RgtError
from rgt.inventory import check_pins, load_hosts, validate_job
from rgt.ledger import ledger_dir

SUBCOMMANDS = ("profiles", "pin", "lifecycle", "smoke", "status", "watch", "pull", "teardown")


def parse_extravars(values: list[str]) -> dict:
    """`-e` the way ansible-playbook reads it: @file (YAML/JSON), inline YAML/JSON mapping, or k=v pairs."""
    out: dict = {}
    for raw in values or []:
        if raw.startswith("@"):
            path = Path(raw[1:])
            if not path.is_file():
                raise InputError(f"extra vars file '{path}' does not exist", fix="check the path after -e @",
                                 field="-e")
            try:
                doc = yaml.safe_load(path.read_text()) or {}
            except yaml.YAMLError as exc:
                raise InputError(f"extra vars file '{path}' is not valid YAML: {exc}",
                                 fix="fix the YAML syntax", field="-e") from exc
        elif raw.lstrip().startswith("{"):
            try:
                doc = yaml.safe_load(raw)
            except yaml.YAMLError as exc:
                raise InputError(f"-e {raw!r} is not valid YAML/JSON", fix="quote it as JSON", field="-e") from exc
        else:
            doc = {}
            for pair in shlex.split(raw):
                if "=" not in pair:
                    raise InputError(f"-e {pair!r} is not key=value", fix="use -e key=value or -e @file.yml",
                                     field="-e")
                key, value = pair.split("=", 1)
                doc[key] = value
        if not isinstance(doc, dict):
            raise InputError(f"-e {raw!r} does not hold a mapping", fix="give key: value pairs", field="-e")
        out.update(doc)
    return out


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help="print one JSON document on stdout")
    p.add_argument("--ledger", help="ledger directory (default $RGT_LEDGER or ./.rgt)")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="rgt-run", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("playbook", help="playbook path or name (probe, env_check, train), or a subcommand: "
                                    + ", ".join(SUBCOMMANDS))
    p.add_argument("-i", "--inventory", required=True, help="inventory file or directory")
    p.add_argument("-e", "--extra-vars", action="append", default=[], help="extra vars: @job.yml, k=v or JSON")
    p.add_argument("-l", "--limit", help="limit to these hosts/groups")
    p.add_argument("-t", "--tags", help="only these phases/tags")
    p.add_argument("--skip-tags", help="skip these tags")
    p.add_argument("-C", "--check", action="store_true", help="show what would change, change nothing")
    p.add_argument("-v", "--verbose", action="count", default=0)
    _common(p)
    return p


def emit(doc: dict, as_json: bool) -> None:
    if as_json:
        sys.stdout.write(json.dumps(doc, sort_keys=True, default=str) + "\n")
        sys.stdout.flush()


def cmd_profiles(argv: list[str], console: Console) -> int:
    from rgt import profiles

    p = argparse.ArgumentParser(prog="rgt-run profiles", description="list platform profiles, or show one")
    p.add_argument("action", nargs="?", choices=["list", "show"], default="list")
    p.add_argument("name", nargs="?")
    _common(p)
    args = p.parse_args(argv)
    if args.action == "list":
        items = profiles.list_profiles()
        if args.json:
            emit({"command": "profiles", "profiles": [profiles.profile_as_json(x) for x in items]}, True)
        else:
            profiles.render_list(console)
        return errors.OK
    if not args.name:
        raise InputError("`rgt-run profiles show` needs a profile name", fix="rgt-run profiles show runpod",
                         field="name")
    try:
        prof = profiles.load_profile(args.name)
    except profiles.ProfileError as exc:
        raise InputError(str(exc), fix=exc.fix, field=exc.field) from exc
    if args.json:
        emit({"command": "profiles show", "profile": profiles.profile_as_json(prof)}, True)
    else:
        profiles.render_show(console, prof)
    return errors.OK


def dispatch(argv: list[str], console: Console) -> int:
    """Route a command line to its subcommand; anything else is a playbook."""
    cmd = argv[0] if argv else ""
    if cmd == "profiles":
        return cmd_profiles(argv[1:], console)
    if cmd == "pin":
        from rgt.pin import cmd_pin
        return cmd_pin(argv[1:], console)
    if cmd in ("status", "watch"):
        from rgt import status
        return status.run(cmd, argv[1:], console)
    if cmd == "pull":
        from rgt import pull
        return pull.cmd_pull(pull.build_parser().parse_args(argv[1:]), console)
    if cmd == "teardown":
        from rgt import teardown
        return teardown.cmd_teardown(teardown.build_parser().parse_args(argv[1:]), console)
    if cmd == "lifecycle":
        from rgt import lifecycle
        return lifecycle.cmd_lifecycle(lifecycle.build_parser().parse_args(argv[1:]), console)
    if cmd == "smoke" and not ({"-i", "--inventory"} & set(argv)):
        # the smoke runs on the controller: no box needed, the embedded local inventory carries it
        argv = [*argv, "-i", str(paths.REPO_ROOT / "inventories" / "local")]
    return cmd_playbook(build_parser().parse_args(argv), console)


def main(argv: list[str] | None = None) -> int:
    """Every command's errors end here: one message, the fix, the exit code, and a JSON error doc with --json."""
    argv = list(sys.argv[1:] if argv is None else argv)
    console = Console(stderr=True, highlight=False, soft_wrap=True)
    as_json = "--json" in argv
    try:
        return dispatch(argv, console)
    except RgtError as exc:
        console.print(f"[red]error:[/red] {exc.message}")
        if exc.fix:
            console.print(f"  fix: {exc.fix}")
        emit({"command": argv[0] if argv else "", **exc.as_dict()}, as_json)
        return exc.exit_code
    except KeyboardInterrupt:
        console.print("[yellow]interrupted[/yellow]: nothing on the box was stopped; run the same command again "
                      "to resume")
        return 130


def prepare(args: argparse.Namespace, pins: bool = True):
    """Everything that can reject input, done before any host is touched."""
    extravars = parse_extravars(args.extra_vars)
    if "rgt_job" in extravars:
        if not isinstance(extravars["rgt_job"], dict):
            raise InputError("rgt_job must be a mapping", fix="pass -e @job.yml with `rgt_job:` at the top",
                             field="rgt_job")
        validate_job(extravars["rgt_job"], "extra vars")
    try:
        playbook = paths.resolve_playbook(args.playbook)
    except FileNotFoundError as exc:
        raise InputError(f"playbook '{args.playbook}' not found",
                         fix="one of: " + ", ".join(sorted(p.stem for p in paths.PLAYBOOKS_DIR.glob("*.yml")))
                         + " (or a subcommand: " + ", ".join(SUBCOMMANDS) + ")", field="playbook") from exc
    hosts = load_hosts(args.inventory, args.limit, extravars)
    if pins:
        check_pins(args.inventory, hosts)
    return playbook, hosts, extravars


def cmd_playbook(args: argparse.Namespace, console: Console) -> int:
    from rgt import report
    from rgt.phases import run_playbook

    smoke_only = paths.resolve_playbook(args.playbook).stem == "smoke" if args.playbook else False
    playbook, hosts, extravars = prepare(args, pins=not smoke_only)
    ledger = ledger_dir(args.ledger)
    if not smoke_only:
        report.first_contact(console, ledger, hosts)
    console.print(f"[bold]rgt[/bold] {playbook.name} on {len(hosts)} host(s): "
                  + ", ".join(f"{h.name} ({h.vars['rgt_profile']})" for h in hosts))
    result = run_playbook(playbook, args.inventory, hosts, ledger=ledger, console=console,
                          extravars=extravars, limit=args.limit, tags=args.tags, skip_tags=args.skip_tags,
                          check=args.check, verbosity=args.verbose)
    doc = report.summarize(console, result, hosts, ledger, args.inventory)
    emit(doc, args.json)
    return doc["exit_code"]


if __name__ == "__main__":
    raise SystemExit(main())
