# PYTHON_ARGCOMPLETE_OK
"""`rgt-run`: a thin runner over ansible-runner. It validates input, runs phases, keeps the ledger, prints results.

A command's result (a table, a plan, a log) goes to stdout; progress, warnings, hints and errors go to stderr
(rgt.output). `--json` prints exactly one JSON document on stdout, and the human rendering goes to stderr then.
Exit codes: see rgt.errors.
The command line: one argparse subparser per subcommand (COMMANDS, the one dispatch table), each built from the
shared options (SHARED_OPTIONS, one definition, handed in as a parent parser). A first word that is no subcommand
but names a playbook (`playbooks/train.yml`, `train.yml`, any playbook file) runs that playbook: the phases
smoke, probe, env_check and train are subcommands too, so both spellings parse alike.
"""

from __future__ import annotations

import argparse
import difflib
import json
import os
import shlex
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import yaml
from rich.console import Console

from rgt import confirmation, errors, jobspec, k8s, memory, output, paths, profiles, sweeps
from rgt.errors import InputError, RgtError
from rgt.inventory import check_pins, load_hosts, missing_secrets, validate_job
from rgt.ledger import ledger_dir

MAX_VARS_FILE_BYTES = 8 << 20
MAX_VARS_NODES = 200_000  # after expanding YAML aliases: a job spec is a few hundred values
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


def _playbook_options(check_help: str) -> Callable[[argparse.ArgumentParser], None]:
    def add(p: argparse.ArgumentParser) -> None:
        p.add_argument("-t", "--tags", metavar="TAGS", help="run only these steps (comma-separated tags)")
        p.add_argument("--skip-tags", metavar="TAGS", help="skip these steps (comma-separated tags)")
        p.add_argument("-C", "--check", action="store_true", help=check_help)
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


PROFILES_HELP = "list the platforms rgt knows, or show one platform's facts (`profiles show NAME`)"
PROFILES_DESCRIPTION = """\
List the platforms rgt knows (SSH user and port, where data survives a stop, how the meter stops, what keeps
billing), or show everything known about one of them: `rgt-run profiles show runpod`. The profile name goes into
your inventory as rgt_profile."""


def _add_profiles_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("action", nargs="?", choices=["list", "show"], default="list", help="list (default) or show")
    p.add_argument("name", nargs="?", metavar="NAME", help="the platform to show").completer = complete_profiles


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
it again while the run is live changes nothing and says so. Follow it with `rgt-run watch`, `rgt-run pull` and
`rgt-run teardown` (or run all of it with `rgt-run lifecycle`).""", {}),
}


def commands() -> dict[str, Command]:
    """The dispatch table, in the order `rgt-run` lists it."""
    from rgt import init, lifecycle, logs, pin, pull, retry, runreport, runs, status, teardown

    table = [
        Command("init", init.HELP, init.__doc__ or init.HELP, init.run, OUTPUT_ONLY, init.add_arguments),
        Command("profiles", PROFILES_HELP, PROFILES_DESCRIPTION, cmd_profiles, OUTPUT_ONLY,
                _add_profiles_arguments),
        Command("pin", pin.HELP, pin.DESCRIPTION, pin.cmd_pin, ("inventory", "limit", *OUTPUT_ONLY),
                pin.add_arguments),
    ]
    for name, (one_line, description, overrides) in PLAYBOOK_COMMANDS.items():
        check = PLAN_HELP if name == "train" else CHECK_MODE_HELP
        table.append(Command(name, one_line, description, cmd_playbook, ALL_SHARED, _playbook_options(check),
                             overrides, PLAYBOOK_EPILOG.format(name=name), playbook=True))
    table += [
        Command("status", status.STATUS_HELP, status.STATUS_DESCRIPTION, status.run_status),
        Command("watch", status.WATCH_HELP, status.WATCH_DESCRIPTION, status.cmd_watch, ALL_SHARED,
                status.add_watch_arguments),
        Command("logs", logs.HELP, logs.DESCRIPTION, logs.cmd_logs, ALL_SHARED, logs.add_arguments),
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


def _playbook_names() -> list[str]:
    return sorted(p.stem for p in paths.PLAYBOOKS_DIR.glob("*.yml"))


def _subparser(sub, command: Command) -> argparse.ArgumentParser:
    p = sub.add_parser(command.name, help=command.help, description=command.description, epilog=command.epilog,
                       parents=[_shared(command.shared, **command.overrides)],
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    if command.add_arguments:
        command.add_arguments(p)
    for action in p._actions:
        if action.dest == "profile":  # `init --profile NAME`
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
                                     "-i INVENTORY (playbooks: " + ", ".join(_playbook_names()) + ").\n"
                                     "`rgt-run COMMAND --help` tells more about each command.")
    p.add_argument("--version", action="version", version=f"rgt-run {version()}")
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


def version() -> str:
    """The installed distribution's version; in a checkout that was never installed, pyproject.toml's."""
    from importlib import metadata

    try:
        return metadata.version("rgt")
    except metadata.PackageNotFoundError:
        pass
    try:
        import tomllib

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
              + ", ".join(_playbook_names()) + ")"]
    return "\n".join(lines)


# ---------------------------------------------------------------- shell completion (argcomplete)

def complete_profiles(prefix: str = "", **_kwargs) -> list[str]:
    try:
        from rgt.profiles import profile_names

        return [name for name in profile_names() if name.startswith(prefix)]
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


# ---------------------------------------------------------------- commands

def emit(doc: dict, as_json: bool) -> None:
    if as_json:
        sys.stdout.write(json.dumps(doc, sort_keys=True, default=str) + "\n")
        sys.stdout.flush()


def cmd_profiles(args: argparse.Namespace, console: Console) -> int:
    from rgt import profiles

    if args.action == "list":
        if args.name:
            raise InputError(f"`rgt-run profiles list` takes no name (got {args.name!r})",
                             fix=f"rgt-run profiles show {args.name}", field="name")
        items = profiles.list_profiles()
        profiles.render_list(output.results(args.json))
        emit({"command": "profiles", "profiles": [profiles.profile_as_json(x) for x in items]}, args.json)
        return errors.OK
    if not args.name:
        raise InputError("`rgt-run profiles show` needs a profile name", fix="rgt-run profiles show runpod",
                         field="name")
    try:
        prof = profiles.load_profile(args.name)
    except profiles.ProfileError as exc:
        raise InputError(str(exc), fix=exc.fix, field=exc.field) from exc
    profiles.render_show(output.results(args.json), prof)
    emit({"command": "profiles show", "profile": profiles.profile_as_json(prof)}, args.json)
    return errors.OK


def _unknown_command(name: str) -> InputError:
    names = _playbook_names()
    subcommands = list(commands())
    close = difflib.get_close_matches(name, [*subcommands, *names], n=1)
    hint = f"did you mean `{close[0]}`? " if close else ""
    return InputError(f"unknown command or playbook '{name}'",
                      fix=f"{hint}subcommands: {', '.join(subcommands)}; playbooks: {', '.join(names)} "
                          "(or a path to a playbook file)", field="command")


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
        return cmd_playbook(args, console)
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
            import argcomplete

            parser = build_parser()
            argcomplete.autocomplete(parser)
        return dispatch(argv, console, parser)
    except RgtError as exc:
        console.print(f"[red]error:[/red] {exc.message}")
        if exc.fix:
            console.print(f"  fix: {exc.fix}")
        emit({"command": argv[0] if argv else "", **exc.as_dict()}, as_json)
        return exc.exit_code
    except KeyboardInterrupt:
        console.print("[yellow]interrupted[/yellow]: nothing on the box was stopped; run the same command again "
                      "to resume")
        return errors.INTERRUPTED


def prepare(args: argparse.Namespace, pins: bool = True, plan: bool = False, choose: memory.Chooser | None = None):
    """Everything that can reject input, done before any host is touched (a launch only reads, over the status
    round, the boxes' own roster of a sweep the ledger lost). `plan`: for train -C (a sweep's roster is shown, not
    kept). `choose`: for a launching play given no job spec, which remembered launch unit each host launches
    (rgt.memory.recall; default its newest)."""
    origins: dict[str, str] = {}
    extravars = parse_extravars(args.extra_vars, origins)
    for name in confirmation.confirm_vars():  # every variable a role reads as a meter stop's confirmation
        if name in extravars:
            raise InputError(f"{name} was given with {origins[name]}: through rgt-run a teardown confirmation "
                             "comes only from the person at the command", fix="pass --confirm <instance-id> to "
                             "`rgt-run teardown`, or type the id at its prompt (ansible-playbook, without rgt-run, "
                             "takes -e teardown_confirm=<instance-id>)", field=name)
    if "rgt_job" in extravars:
        if not isinstance(extravars["rgt_job"], dict):
            raise InputError("rgt_job must be a mapping", fix="pass -e @job.yml with `rgt_job:` at the top",
                             field="rgt_job")
        extravars["rgt_job"] = jobspec.with_notify_on(extravars["rgt_job"])  # an unquoted `on:` (YAML true)
        # relative local paths follow the file they were written in (`-e @job.yml`), else the current directory
        base = jobspec.origin_dir(origins.get("rgt_job"))
        validate_job(extravars["rgt_job"], f"rgt_job ({origins.get('rgt_job', 'extra vars')})", base)
        extravars["rgt_job"] = jobspec.resolve_paths(extravars["rgt_job"], base)
    try:
        playbook = paths.resolve_playbook(args.playbook)
    except FileNotFoundError:
        raise _unknown_command(args.playbook) from None
    if playbook != paths.PLAYBOOKS_DIR / "teardown.yml":
        role = confirmation.carried_role(playbook)
        if role:  # a copy of teardown.yml, or the user's own play: only `rgt-run teardown` plans and asks
            raise InputError(f"playbook '{args.playbook}' runs the role {role}, which stops a meter: through rgt-run "
                             "a meter stop goes only through `rgt-run teardown` (the plan of every run on the box, "
                             "then your confirmation)", fix=f"rgt-run teardown -i {args.inventory} (add --confirm "
                             "<instance-id> where no one can type it); to run your own play, use ansible-playbook, "
                             "where the role takes -e teardown_confirm=<instance-id>", field="playbook")
    hosts = load_hosts(args.inventory, args.limit, extravars)
    ledger = ledger_dir(getattr(args, "ledger", None), make=False)  # read here; made by what writes to it
    if playbook.stem in (*memory.RECALLING_PLAYBOOKS, *memory.LAUNCHING_PLAYBOOKS):
        memory.check_records(ledger, hosts)  # a damaged record of runs is named now, never overwritten later
    if playbook.stem in memory.RECALLING_PLAYBOOKS and "rgt_job" not in extravars:
        # every run the ledger knows on each host without a job spec (a launch: the unit `choose` picks)
        memory.recall(ledger, hosts, launching=playbook.stem in memory.LAUNCHING_PLAYBOOKS, choose=choose)
    swept = sweeps.prepare(playbook.stem, hosts, extravars, ledger, plan_only=plan,
                           look=_box_rosters(args, extravars)
                           if pins and playbook.stem in memory.LAUNCHING_PLAYBOOKS else None)
    # a detach primitive not built yet: refused before any box
    profiles.check_launch(playbook.stem, hosts)
    if not plan:  # rsync, ssh, kubectl: a missing one is named now, not as a play's failure on the box
        from rgt.phases import check_controller_tools

        check_controller_tools(playbook.stem, hosts)
    # a Kubernetes host has no SSH (no pin) and reads its secrets from a Secret by reference (none from here)
    ssh_hosts = [h for h in hosts if not k8s.is_k8s(h.profile)]
    if playbook.stem == "smoke" and not any(isinstance(h.vars.get("rgt_job"), dict)
                                            and h.vars["rgt_job"].get("smoke_command") for h in hosts):
        raise InputError("there is nothing to smoke: the job spec has no smoke_command",
                         fix="set rgt_job.smoke_command to one or two batches of the training command on CPU "
                             "(e.g. `python train.py --steps 2`)", field="rgt_job.smoke_command")
    # an inventory's job: its relative paths follow the inventory file that wrote it (the roles read this)
    extravars["rgt_job_base_dirs"] = {h.name: str(h.job_base) for h in hosts if h.job_base}
    if playbook.stem in SECRET_PLAYBOOKS:
        missing = missing_secrets(ssh_hosts)
        if missing:
            listed = "; ".join(f"{name} (for {', '.join(on)})" for name, on in sorted(missing.items()))
            raise InputError(f"secret variable(s) not set in this environment: {listed}",
                             fix="export " + " ".join(f"{name}=..." for name in sorted(missing)) + " in this shell "
                                 "(rgt reads each secret by name and never stores it), or remove it from "
                                 "rgt_job.secrets", field="rgt_job.secrets")
    if pins:
        check_pins(args.inventory, ssh_hosts)
    if playbook.stem == "train" and not plan and not getattr(args, "check", False):
        for item in swept:  # the roster is kept before the play: a cell keeps its host from here on
            sweeps.record(ledger, item)
    return playbook, hosts, extravars


def _box_rosters(args: argparse.Namespace, extravars: dict) -> sweeps.BoxLook:
    """How a launch reads the boxes' own roster of a sweep the ledger keeps none of: over the status round, after
    the hosts' pins are checked (read-only)."""
    def look(hosts: list, project: str, name: str) -> dict:
        from rgt import sshround

        boxes = [h for h in hosts if not k8s.is_k8s(h.profile)]
        check_pins(args.inventory, boxes)
        return sshround.roster_round(args.inventory, boxes, extravars, project, name)
    return look


def cmd_playbook(args: argparse.Namespace, console: Console) -> int:
    from rgt import k8s_run, report
    from rgt.phases import PhaseResult, new_ident, run_playbook

    resolved = paths.resolve_playbook(args.playbook) if args.playbook else None
    if (args.check and resolved == paths.PLAYBOOKS_DIR / "train.yml" and not args.tags and not args.skip_tags):
        from rgt import plan

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
    emit(doc, args.json)
    return doc["exit_code"]


if __name__ == "__main__":
    raise SystemExit(main())
