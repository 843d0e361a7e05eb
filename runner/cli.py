"""`rgt-run`: a thin runner over ansible-runner. It validates input, runs phases, keeps the ledger, prints results.

Human output goes to stderr; `--json` prints exactly one JSON document on stdout. Exit codes: see rgt.errors.
"""

from __future__ import annotations

import argparse
import difflib
import json
import shlex
import sys
from pathlib import Path

import yaml
from rich.console import Console

from rgt import errors, paths
from rgt.errors import InputError, RgtError
from rgt.inventory import check_pins, load_hosts, missing_secrets, validate_job
from rgt.ledger import ledger_dir

SUBCOMMANDS = ("profiles", "pin", "lifecycle", "smoke", "status", "watch", "pull", "teardown")


MAX_VARS_FILE_BYTES = 8 << 20
MAX_VARS_NODES = 200_000  # after expanding YAML aliases: a job spec is a few hundred values
CONFIRM_VARS = ("rgt_teardown_confirm", "rgt_teardown_confirms")
SECRET_PLAYBOOKS = ("train", "env_check")  # the playbooks that deliver rgt_job.secrets to the box


def _expanded_nodes(doc: object, where: str) -> int:
    """How many values `doc` holds once every YAML alias is expanded, refusing past MAX_VARS_NODES (an alias
    bomb is a few lines of YAML that expand to billions of values) and refusing a recursive alias."""
    memo: dict[int, int] = {}
    active: set[int] = set()

    def size(node: object) -> int:
        if not isinstance(node, (dict, list)):
            return 1
        key = id(node)
        if key in memo:
            return memo[key]
        if key in active:
            raise InputError(f"{where} holds a recursive YAML alias", fix="write the values out instead of "
                             "referring to an enclosing anchor", field="-e")
        active.add(key)
        total = 1
        for item in (node.items() if isinstance(node, dict) else node):
            total += size(item[0]) + size(item[1]) if isinstance(node, dict) else size(item)
            if total > MAX_VARS_NODES:
                raise InputError(f"{where} expands to more than {MAX_VARS_NODES} values (YAML aliases that "
                                 "multiply): refused", fix="write the job spec without nested aliases", field="-e")
        active.discard(key)
        memo[key] = total
        return total

    return size(doc)


def _load_vars_file(path: Path) -> object:
    where = f"extra vars file '{path}'"
    if not path.is_file():
        raise InputError(f"{where} does not exist" if not path.exists() else f"{where} is not a file",
                         fix="check the path after -e @", field="-e")
    try:
        with open(path, "rb") as handle:
            raw = handle.read(MAX_VARS_FILE_BYTES + 1)
    except OSError as exc:
        raise InputError(f"{where} cannot be read: {exc.strerror}", fix="check its permissions", field="-e") from exc
    if len(raw) > MAX_VARS_FILE_BYTES:
        raise InputError(f"{where} is larger than {MAX_VARS_FILE_BYTES >> 20} MiB", fix="a job spec is a few KB: "
                         "keep data in data_dir, not in the spec", field="-e")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw[:exc.start].count(b"\n") + 1
        raise InputError(f"{where} is not UTF-8 text (byte 0x{raw[exc.start]:02x} on line {line})",
                         fix="save it as UTF-8 (e.g. `iconv -f latin1 -t utf-8`)", field="-e") from exc
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise InputError(f"{where} is not valid YAML: {exc}", fix="fix the YAML syntax", field="-e") from exc
    _expanded_nodes(doc, where)
    return {} if doc is None else doc


def parse_extravars(values: list[str], origins: dict[str, str] | None = None) -> dict:
    """`-e` the way ansible-playbook reads it: @file (YAML/JSON), inline YAML/JSON mapping, or k=v pairs.
    `origins` (when given) gets, per variable, where it came from (`-e @path` or `-e on the command line`)."""
    out: dict = {}
    for raw in values or []:
        if raw.startswith("@"):
            doc = _load_vars_file(Path(raw[1:]))
            origin = f"-e {raw}"
        elif raw.lstrip().startswith("{"):
            try:
                doc = yaml.safe_load(raw)
            except yaml.YAMLError as exc:
                raise InputError(f"-e {raw!r} is not valid YAML/JSON", fix="quote it as JSON", field="-e") from exc
            _expanded_nodes(doc, f"-e {raw[:40]!r}")
            origin = "-e on the command line"
        else:
            doc = {}
            try:
                pairs = shlex.split(raw)
            except ValueError as exc:
                raise InputError(f"-e {raw!r}: {exc}", fix="close the quote", field="-e") from exc
            for pair in pairs:
                if "=" not in pair:
                    raise InputError(f"-e {pair!r} is not key=value", fix="use -e key=value or -e @file.yml",
                                     field="-e")
                key, value = pair.split("=", 1)
                doc[key] = value
            origin = "-e on the command line"
        if not isinstance(doc, dict):
            raise InputError(f"-e {raw!r} does not hold a mapping", fix="give key: value pairs", field="-e")
        out.update(doc)
        if origins is not None:
            origins.update((str(k), origin) for k in doc)
    return out


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help="print one JSON document on stdout")
    p.add_argument("--ledger", help="ledger directory (default $RGT_LEDGER or ./.rgt)")


def build_parser() -> argparse.ArgumentParser:
    p = errors.ArgumentParser(prog="rgt-run", description=__doc__,
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

    p = errors.ArgumentParser(prog="rgt-run profiles", description="list platform profiles, or show one")
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


def _unknown_command(name: str) -> InputError:
    names = sorted(p.stem for p in paths.PLAYBOOKS_DIR.glob("*.yml"))
    close = difflib.get_close_matches(name, [*SUBCOMMANDS, *names], n=1)
    hint = f"did you mean `{close[0]}`? " if close else ""
    return InputError(f"unknown command or playbook '{name}'",
                      fix=f"{hint}subcommands: {', '.join(SUBCOMMANDS)}; playbooks: {', '.join(names)} "
                          "(or a path to a playbook file)", field="command")


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
    if cmd in ("-h", "--help"):
        build_parser().print_help()
        return errors.OK
    if not cmd or cmd.startswith("-"):
        raise InputError("no command given", fix=f"rgt-run <command> ...: one of {', '.join(SUBCOMMANDS)}, or a "
                         "playbook (`rgt-run playbooks/train.yml -i INV`)", field="command")
    try:
        playbook = paths.resolve_playbook(cmd)
    except FileNotFoundError:
        raise _unknown_command(cmd) from None
    if playbook.parent == paths.PLAYBOOKS_DIR and playbook.stem == "teardown":
        # the same gate and plan as `rgt-run teardown`: a confirmation only from the person at this command
        from rgt import teardown
        return teardown.cmd_teardown(teardown.build_parser().parse_args(argv[1:]), console)
    if playbook.stem == "smoke" and not ({"-i", "--inventory"} & set(argv)):
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
    origins: dict[str, str] = {}
    extravars = parse_extravars(args.extra_vars, origins)
    for name in CONFIRM_VARS:
        if name in extravars:
            raise InputError(f"{name} was given with {origins[name]}: a teardown confirmation comes only from the "
                             "person at the command", fix="pass --confirm <instance-id> to `rgt-run teardown`, or "
                             "type the id at its prompt", field=name)
    if "rgt_job" in extravars:
        if not isinstance(extravars["rgt_job"], dict):
            raise InputError("rgt_job must be a mapping", fix="pass -e @job.yml with `rgt_job:` at the top",
                             field="rgt_job")
        validate_job(extravars["rgt_job"], f"rgt_job ({origins.get('rgt_job', 'extra vars')})")
    try:
        playbook = paths.resolve_playbook(args.playbook)
    except FileNotFoundError:
        raise _unknown_command(args.playbook) from None
    hosts = load_hosts(args.inventory, args.limit, extravars)
    if playbook.stem in SECRET_PLAYBOOKS:
        missing = missing_secrets(hosts)
        if missing:
            listed = "; ".join(f"{name} (for {', '.join(on)})" for name, on in sorted(missing.items()))
            raise InputError(f"secret variable(s) not set in this environment: {listed}",
                             fix="export " + " ".join(f"{name}=..." for name in sorted(missing)) + " in this shell "
                                 "(rgt reads each secret by name and never stores it), or remove it from "
                                 "rgt_job.secrets", field="rgt_job.secrets")
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
