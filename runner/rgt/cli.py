# PYTHON_ARGCOMPLETE_OK
"""`rgt-run`: a thin runner over ansible-runner. It validates input, runs phases, keeps the ledger, prints results.

A command's result (a table, a plan, a log) goes to stdout; progress, warnings, hints and errors go to stderr
(rgt.output). `--json` prints exactly one JSON document on stdout, and the human rendering goes to stderr then.
Exit codes: see rgt.errors.
The command line: one argparse subparser per subcommand (COMMANDS, the one dispatch table), each built from the
shared options (SHARED_OPTIONS, one definition, handed in as a parent parser). A first word that is no subcommand
but names a playbook (`playbooks/train.yml`, `train.yml`, any playbook file) runs that playbook: the phases
smoke, probe, env_check and train are subcommands too, so both spellings parse alike.
This module parses and dispatches only (argparse, the command table, completion, main()): a command's input is
prepared by rgt.prepare and its work done in its own module (rgt.play runs a playbook); nothing below the CLI
imports it (the layers: rgt.layers).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from rich.console import Console

from rgt import (
    errors,
    init,
    lifecycle,
    logs,
    move,
    output,
    paths,
    pin,
    play,
    profiles,
    pull,
    retry,
    runreport,
    runs,
    service,
    status,
    teardown,
    unattended,
)
from rgt.errors import InputError, RgtError
from rgt.prepare import playbook_names, unknown_command

# ---------------------------------------------------------------- the command line

# Every option more than one subcommand takes, defined once; each subcommand names the ones it takes and gets them
# through a parent parser (`_shared`). Help texts speak of the user's files and boxes, never of rgt's insides.
SHARED_OPTIONS: dict[str, tuple[tuple[str, ...], dict]] = {
    "inventory": (("-i", "--inventory"), {"required": True, "metavar": "INVENTORY",
                                          "help": "your inventory: a hosts file, or a directory that holds one"}),
    "extra_vars": (("-e", "--extra-vars"), {"dest": "extra_vars", "action": "append", "default": [],
                                            "metavar": "VARS",
                                            "help": "extra variables: @job.yml (your job spec), key=value or "
                                                    "JSON; repeatable, the last one wins"}),
    "limit": (("-l", "--limit"), {"metavar": "HOSTS", "help": "only these hosts or groups (comma-separated)"}),
    "json": (("--json",), {"action": "store_true",
                           "help": "print one JSON document on stdout (the tables and messages go to stderr)"}),
    "ledger": (("--ledger",), {"metavar": "DIR",
                               "help": "where rgt keeps its records of your runs (default $RGT_LEDGER or ./.rgt)"}),
    "verbose": (("-v", "--verbose"), {"action": "count", "default": 0,
                                      "help": "more detail from Ansible (repeat for more: -vvv)"}),
}
ALL_SHARED = tuple(SHARED_OPTIONS)
OUTPUT_ONLY = ("json", "ledger", "verbose")
LOCAL_INVENTORY = paths.REPO_ROOT / "inventories" / "local"


def _shared(names: tuple[str, ...], **overrides: dict) -> argparse.ArgumentParser:
    """A parent parser holding the shared options `names` (`overrides`: per option, keyword changes)."""
    parent = argparse.ArgumentParser(add_help=False)
    for name in names:
        flags, kwargs = SHARED_OPTIONS[name]
        action = parent.add_argument(*flags, **{**kwargs, **overrides.get(name, {})})
        if name == "limit":
            action.completer = complete_hosts  # type: ignore[attr-defined]
    return parent


def _playbook_options(check_help: str, more: Callable[[argparse.ArgumentParser], None] | None = None
                      ) -> Callable[[argparse.ArgumentParser], None]:
    def add(p: argparse.ArgumentParser) -> None:
        p.add_argument("-t", "--tags", metavar="TAGS", help="run only these steps (comma-separated tags)")
        p.add_argument("--skip-tags", metavar="TAGS", help="skip these steps (comma-separated tags)")
        p.add_argument("-C", "--check", action="store_true", help=check_help)
        if more:
            more(p)
    return add


CHECK_MODE_HELP = "check mode: report what would change on each box, change nothing"
PLAN_HELP = ("dry run: print the plan per host and exit 0: the code-<hash8> directory the code would land in, the "
             "files and bytes to send, the command, the run directory, the disk floor, the price per hour and what "
             "the expected duration costs. It reads only files on this machine and contacts no box (with -t or "
             "--skip-tags, -C is check mode instead: each step reports what it would change)")

PLAYBOOK_EPILOG = ("A playbook path works the same way: `rgt-run playbooks/{name}.yml -i INVENTORY` is "
                   "`rgt-run {name} -i INVENTORY`.")


@dataclass(frozen=True)
class Command:
    """One subcommand: its one-line help (the listing), its --help text, the shared options it takes, its own
    options and the function that runs it (args, console) -> exit code."""

    name: str
    help: str
    description: str
    run: Callable[[argparse.Namespace, Console], int]
    shared: tuple[str, ...] = ALL_SHARED
    add_arguments: Callable[[argparse.ArgumentParser], None] | None = None
    overrides: dict = field(default_factory=dict)
    epilog: str | None = None
    playbook: bool = False  # a playbook of the collection run as a subcommand


PLAYBOOK_COMMANDS = {
    "smoke": ("run your job's smoke command on this machine's CPU (no box, nothing billed)", """\
Run the smoke command of your job spec (rgt_job.smoke_command) once on this machine's CPU, from your code
directory: a typo or an import error shows up here, before anything is uploaded or billed. Without -i it uses
the built-in inventory of this machine.""", {"inventory": {"required": False, "default": None,
                                                         "help": "your inventory (default: this machine)"}}),
    "probe": ("audit each box before you pay for training on it (changes nothing)", """\
Audit each box of the inventory without changing anything: GPU model, count and driver, CUDA, memory, disks and
inodes, the mounts that survive a stop, the network. A box that does not match your job's needs is named with
what is wrong.""", {}),
    "env_check": ("check the Python, torch/CUDA, proxy and secrets your job will run with", """\
Check the environment your job will run in on each box: the interpreter (rgt_job.python), torch and CUDA against
the driver, the proxy and mirrors, scripts with Windows line ends, and that every secret your job names reaches
the box (read from this shell, never stored).""", {}),
    "train": ("smoke, probe, check, upload your code and start the job detached, then return", """\
Start your job: smoke on this machine, probe and check each box, upload your code (resumably; every file's
SHA-256 is verified on the box), then start the job detached so it survives your SSH session, and return. Running
it again while the run is live changes nothing and says so. A box probed less than 5 minutes ago (the same
instance behind the same pinned host key, no blocking finding) is not probed again: the summary says `probe:
reused` (-e rgt_probe_again=true probes anyway). Follow it with `rgt-run watch`, `rgt-run pull` and
`rgt-run teardown` (or run all of it with `rgt-run lifecycle`).""", {}),
}


def commands() -> dict[str, Command]:
    """The dispatch table, in the order `rgt-run` lists it."""
    table = [
        Command("init", init.HELP, init.__doc__ or init.HELP, init.run, OUTPUT_ONLY, init.add_arguments),
        Command("profiles", profiles.HELP, profiles.DESCRIPTION, profiles.cmd_profiles, OUTPUT_ONLY,
                profiles.add_arguments),
        Command("pin", pin.HELP, pin.DESCRIPTION, pin.cmd_pin, ("inventory", "limit", *OUTPUT_ONLY),
                pin.add_arguments),
    ]
    for name, (one_line, description, overrides) in PLAYBOOK_COMMANDS.items():
        check = PLAN_HELP if name == "train" else CHECK_MODE_HELP
        options = _playbook_options(check, unattended.add_down_arguments if name == "train" else None)
        table.append(Command(name, one_line, description, play.cmd_playbook, ALL_SHARED, options,
                             overrides, PLAYBOOK_EPILOG.format(name=name), playbook=True))
    table += [
        Command("status", status.STATUS_HELP, status.STATUS_DESCRIPTION, status.run_status),
        Command("watch", status.WATCH_HELP, status.WATCH_DESCRIPTION, status.cmd_watch, ALL_SHARED,
                _watch_arguments),
        Command("service", service.HELP, service.DESCRIPTION, service.cmd_service, ALL_SHARED,
                service.add_arguments, {"inventory": {"required": False}}),
        Command("logs", logs.HELP, logs.DESCRIPTION, logs.cmd_logs, ALL_SHARED, logs.add_arguments),
        Command("move", move.HELP, move.DESCRIPTION, move.cmd_move, ("inventory", *OUTPUT_ONLY), move.add_arguments),
        Command("retry", retry.HELP, retry.DESCRIPTION, retry.cmd_retry, ALL_SHARED, retry.add_arguments),
        Command("pull", pull.HELP, pull.DESCRIPTION, pull.cmd_pull, ALL_SHARED, pull.add_arguments),
        Command("teardown", teardown.HELP, teardown.DESCRIPTION, teardown.cmd_teardown, ALL_SHARED,
                teardown.add_arguments),
        Command("lifecycle", lifecycle.HELP, lifecycle.DESCRIPTION, lifecycle.cmd_lifecycle, ALL_SHARED,
                lifecycle.add_arguments),
        Command("runs", runs.HELP, runs.__doc__ or runs.HELP, runs.run, ("limit", *OUTPUT_ONLY),
                runs.add_arguments),
        Command("report", runreport.HELP, runreport.DESCRIPTION, runreport.run, ALL_SHARED,
                runreport.add_arguments),
    ]
    return {c.name: c for c in table}


def _watch_arguments(p: argparse.ArgumentParser) -> None:
    status.add_watch_arguments(p)
    service.add_watch_arguments(p)  # --detach, --follow


def _subparser(sub, command: Command) -> argparse.ArgumentParser:
    p = sub.add_parser(command.name, help=command.help, description=command.description, epilog=command.epilog,
                       parents=[_shared(command.shared, **command.overrides)],
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    if command.add_arguments:
        command.add_arguments(p)
    for action in p._actions:  # `init --profile NAME`, `profiles show NAME`
        if action.dest == "profile" or (command.name == "profiles" and action.dest == "name"):
            action.completer = complete_profiles  # type: ignore[attr-defined]
    return p


TOP_DESCRIPTION = """\
Deploy long GPU jobs on rented boxes, watch them, pull the results verified by SHA-256, and stop the meter only
when nothing would be lost. Results (tables, plans, logs) go to stdout, messages to stderr; --json prints one
JSON document on stdout (the tables then go to stderr).
Exit codes: 0 ok, 1 failed, 2 bad input (nothing was touched), 3 refused by a safety gate, 4 a box unreachable,
5 a run needs your attention."""


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """`rgt-run` and every subcommand (the parser argcomplete completes from), or with `only` just that one (a
    command line names one: building the other 16 costs each run a tenth of a second)."""
    table = commands()
    p = errors.ArgumentParser(prog="rgt-run", description=TOP_DESCRIPTION,
                              formatter_class=argparse.RawDescriptionHelpFormatter,
                              epilog="A playbook name or path works as a command too: rgt-run playbooks/train.yml "
                                     "-i INVENTORY (playbooks: " + ", ".join(playbook_names()) + ").\n"
                                     "`rgt-run COMMAND --help` tells more about each command.")
    p.add_argument("--version", action=_Version, nargs=0, help="show the version and exit")
    sub = p.add_subparsers(dest="command", metavar="COMMAND", title="commands")
    for command in table.values():
        if only is None or command.name == only:
            _subparser(sub, command)
    return p


def playbook_parser(prog: str = "rgt-run PLAYBOOK") -> argparse.ArgumentParser:
    """The parser of a playbook given by path that is no subcommand (a phase such as upload_resume or collect, or
    a playbook of your own)."""
    p = errors.ArgumentParser(prog=prog, description="Run this playbook on the inventory's boxes, with the same "
                              "input checks, records and report as every other command.",
                              parents=[_shared(ALL_SHARED)], formatter_class=argparse.RawDescriptionHelpFormatter)
    _playbook_options(CHECK_MODE_HELP)(p)
    return p


class _Version(argparse.Action):
    """--version, asked only when given (importlib.metadata and the distribution's metadata: 30 ms of a start)."""

    def __call__(self, parser, namespace, values, option_string=None):
        sys.stdout.write(f"rgt-run {version()}\n")
        parser.exit()


def version() -> str:
    """The installed distribution's version; in a checkout that was never installed, pyproject.toml's."""
    from importlib import metadata  # 30 ms of every start; only --version reads it

    try:
        return metadata.version("rgt")
    except metadata.PackageNotFoundError:
        pass
    try:
        import tomllib  # 2 ms of every start; only --version in a checkout that was never installed reads it

        return str(tomllib.loads((paths.REPO_ROOT / "pyproject.toml").read_text())["project"]["version"])
    except (OSError, KeyError, ValueError):
        return "unknown"


def listing(table: dict[str, Command] | None = None) -> str:
    """The subcommands, one line each (printed when the command is missing or unknown)."""
    table = table or commands()
    width = max(len(name) for name in table)
    lines = ["usage: rgt-run COMMAND [options]   (rgt-run COMMAND --help tells more)", "", "commands:"]
    lines += [f"  {name.ljust(width)}  {c.help}" for name, c in table.items()]
    lines += ["", "or a playbook name or path: rgt-run playbooks/train.yml -i INVENTORY (playbooks: "
              + ", ".join(playbook_names()) + ")"]
    return "\n".join(lines)


# ---------------------------------------------------------------- shell completion (argcomplete)

def complete_profiles(prefix: str = "", **_kwargs) -> list[str]:
    try:
        return [name for name in profiles.profile_names() if name.startswith(prefix)]
    except Exception:  # noqa: BLE001 - a completer never fails loudly
        return []


def _yaml_names(doc: object, out: set[str]) -> None:
    """Host and group names of a YAML inventory (`all: {hosts: {...}, children: {group: {...}}}`)."""
    if not isinstance(doc, dict):
        return
    for group, body in doc.items():
        if not isinstance(group, str) or group.startswith("_"):
            continue
        out.add(group)
        if isinstance(body, dict):
            if isinstance(body.get("hosts"), dict):
                out.update(str(h) for h in body["hosts"])
            _yaml_names(body.get("children"), out)


def _ini_names(text: str, out: set[str]) -> None:
    section = ""
    for raw in text.splitlines():
        line = raw.split("#", 1)[0].split(";", 1)[0].strip() if not raw.lstrip().startswith(("#", ";")) else ""
        if not line:
            continue
        if line.startswith("[") and line.endswith("]"):
            section = line[1:-1]
            name, _, kind = section.partition(":")
            out.add(name)
            section = kind
            continue
        if section == "vars":
            continue
        out.add(line.split()[0])


def inventory_names(inventory: str | os.PathLike) -> list[str]:
    """Host and group names of an inventory file or directory, read as text (no Ansible, no templating): what
    `-l` completes from. Unreadable or odd files give fewer names, never an error."""
    inv = Path(inventory).expanduser()
    files = ([p for p in sorted(inv.iterdir()) if p.is_file() and p.name != "known_hosts"
              and p.suffix in (".yml", ".yaml", ".json", ".ini", "")] if inv.is_dir() else [inv])
    import yaml  # 11 ms of every start; only a shell completing -l reads an inventory here

    names: set[str] = set()
    for path in files:
        try:
            text = path.read_text(errors="replace")[:1 << 20]
            if path.suffix in (".yml", ".yaml", ".json"):
                _yaml_names(yaml.safe_load(text), names)
            else:
                _ini_names(text, names)
        except Exception:  # noqa: BLE001,S112 - a completer never fails loudly
            continue
    names.discard("all")
    names.discard("ungrouped")
    return sorted(names)


def _ledger_hosts(ledger: str | None) -> list[str]:
    """Hosts the ledger remembers runs of (`runs -l`, which takes no inventory)."""
    root = Path(ledger or os.environ.get("RGT_LEDGER") or ".rgt").expanduser() / "runs"
    try:
        return sorted(p.stem for p in root.glob("*.json"))
    except OSError:
        return []


def complete_hosts(prefix: str = "", parsed_args: argparse.Namespace | None = None, **_kwargs) -> list[str]:
    """`-l`: the host and group names of the `-i` inventory (else the ledger's hosts); completes the last item of
    a comma-separated list."""
    try:
        inventory = getattr(parsed_args, "inventory", None)
        names = (inventory_names(inventory) if inventory and Path(inventory).expanduser().exists()
                 else [] if inventory else _ledger_hosts(getattr(parsed_args, "ledger", None)))
        head, _, last = prefix.rpartition(",")
        lead = f"{head}," if head else ""
        taken = set(head.split(",")) if head else set()
        return [lead + name for name in names if name.startswith(last) and name not in taken]
    except Exception:  # noqa: BLE001 - a completer never fails loudly
        return []


# ---------------------------------------------------------------- dispatch

def _unknown_command(name: str) -> InputError:
    return unknown_command(name, list(commands()))


def dispatch(argv: list[str], console: Console, parser: argparse.ArgumentParser | None = None) -> int:
    """Route a command line through the dispatch table; a first word that is no subcommand is a playbook."""
    cmd = argv[0] if argv else ""
    if cmd in ("-h", "--help"):
        (parser or build_parser()).print_help()
        return errors.OK
    if cmd == "--version":
        sys.stdout.write(f"rgt-run {version()}\n")
        return errors.OK
    table = commands()
    if not cmd or cmd.startswith("-"):
        console.print(listing(table), markup=False)
        raise InputError("no command given", fix=f"rgt-run <command> ...: one of {', '.join(table)}, or a "
                         "playbook (`rgt-run playbooks/train.yml -i INV`)", field="command")
    rest = argv[1:]
    name, playbook = cmd, cmd
    if cmd not in table:
        try:
            resolved = paths.resolve_playbook(cmd)
        except FileNotFoundError:
            console.print(listing(table), markup=False)
            raise _unknown_command(cmd) from None
        # a playbook of the collection that is also a subcommand parses as that subcommand; `playbooks/teardown.yml`
        # is `rgt-run teardown`: the same gate and plan, a confirmation only from the person at this command
        name = resolved.stem if resolved.parent == paths.PLAYBOOKS_DIR else ""
        if not (name in table and (table[name].playbook or name == "teardown")):
            name = ""
    if name:
        sub = _subparsers(parser or build_parser(only=name))[name]
        args = sub.parse_args(rest)
    else:
        args = playbook_parser(f"rgt-run {cmd}").parse_args(rest)
    command = table.get(name)
    if command is None or command.playbook:
        args.playbook = playbook
        if args.inventory is None:  # smoke: runs on this machine, the built-in local inventory carries it
            args.inventory = str(LOCAL_INVENTORY)
        return play.cmd_playbook(args, console)
    return command.run(args, console)


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def main(argv: list[str] | None = None) -> int:
    """Every command's errors end here: one message, the fix, the exit code, and a JSON error doc with --json."""
    argv = list(sys.argv[1:] if argv is None else argv)
    console = output.messages()
    as_json = "--json" in argv
    output.set_json(as_json)  # stdout holds the JSON document only, whatever runs inside this command
    try:
        parser = None
        if "_ARGCOMPLETE" in os.environ:  # a shell completing: the whole parser, then argcomplete exits
            import argcomplete  # only a shell completing needs it (3 ms of every other start)

            parser = build_parser()
            argcomplete.autocomplete(parser)
        return dispatch(argv, console, parser)
    except RgtError as exc:
        console.print(f"[red]error:[/red] {exc.message}")
        if exc.fix:
            console.print(f"  fix: {exc.fix}")
        output.emit({"command": argv[0] if argv else "", **exc.as_dict()}, as_json)
        return exc.exit_code
    except KeyboardInterrupt:
        console.print("[yellow]interrupted[/yellow]: nothing on the box was stopped; run the same command again "
                      "to resume")
        return errors.INTERRUPTED


if __name__ == "__main__":
    raise SystemExit(main())
