"""Input preparation: everything that can reject a command's input, done before any host is touched.

Every command that acts on hosts starts here (`prepare`, or `prepare_hosts` for a command that only looks): the
extra vars (`-e`, read the way ansible-playbook reads them, with a size and alias bound), the job spec (validated,
its relative paths resolved), the playbook (a meter stop only through `rgt-run teardown`), the inventory's hosts
(rgt.inventory.load_hosts), the ledger's records (a damaged one is named now), the runs a host without a job spec
acts on (rgt.memory.recall), a sweep's share per host (rgt.sweeps.prepare), the detach primitive being built, the
programs the command runs on this machine (`check_controller_tools`), the secrets set in this shell, and the host
keys' pins. Bad input is one InputError (exit 2) naming the field and the fix, and nothing changed on any host.

The CLI (rgt.cli) parses and dispatches; the commands call this module, never the CLI.
"""

from __future__ import annotations

import argparse
import difflib
import shlex
import shutil
from pathlib import Path

from rgt import confirmation, engines, jobspec, k8s_engine, memory, paths, profiles, sshround, sweeps
from rgt.errors import InputError, RgtError
from rgt.inventory import (
    Host,
    ansible_env,
    check_pins,
    check_spares,
    load_hosts,
    missing_secrets,
    secret_name_shown,
    validate_job,
)
from rgt.ledger import ledger_dir

MAX_VARS_FILE_BYTES = 8 << 20
MAX_VARS_NODES = 200_000  # after expanding YAML aliases: a job spec is a few hundred values
SECRET_PLAYBOOKS = ("train", "env_check")  # the playbooks that deliver rgt_job.secrets to the box


# ---------------------------------------------------------------- extra vars (-e)

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
    import yaml  # 11 ms of every start; only `-e` is YAML here (a status without -e reads none)

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
            import yaml  # 11 ms of every start; only `-e` is YAML here (a status without -e reads none)

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


# ---------------------------------------------------------------- the playbook

def playbook_names() -> list[str]:
    """The collection's playbooks, by name (what `rgt-run NAME` and `rgt-run playbooks/NAME.yml` run)."""
    return sorted(p.stem for p in paths.PLAYBOOKS_DIR.glob("*.yml"))


def unknown_command(name: str, subcommands: list[str] | tuple[str, ...] = ()) -> InputError:
    """A first word that is neither a subcommand (`subcommands`, the CLI's table) nor a playbook: the closest name
    and every name there is."""
    names = playbook_names()
    close = difflib.get_close_matches(name, [*subcommands, *names], n=1)
    hint = f"did you mean `{close[0]}`? " if close else ""
    listed = f"subcommands: {', '.join(subcommands)}; " if subcommands else ""
    return InputError(f"unknown command or playbook '{name}'",
                      fix=f"{hint}{listed}playbooks: {', '.join(names)} (or a path to a playbook file)",
                      field="command")


# ---------------------------------------------------------------- programs this machine runs

# The programs a command runs on this machine (the controller), checked before any box is touched: rsync for the
# plays whose roles move files (upload_resume in train, collect: local boxes too), ssh for every box reached over
# SSH (any play but the smoke, which runs here; status and logs too), kubectl for a Kubernetes host.
RSYNC_PLAYBOOKS = ("train", "upload_resume", "collect", "move")
LOCAL_PLAYBOOKS = ("smoke",)  # run on this machine only: no box is reached
DEBIAN_PACKAGES = {"rsync": "rsync", "ssh": "openssh-client"}


def controller_tools(playbook: str, hosts: list[Host]) -> dict[str, list[str]]:
    """{program: [the hosts it is needed for]} for `playbook` (a stem: train, collect, monitor ...) on `hosts`."""
    boxes = [h for h in hosts if engines.engine_of(h.profile).over_ssh]
    needed = {"ssh": [h.name for h in boxes if not h.is_local] if playbook not in LOCAL_PLAYBOOKS else [],
              "rsync": [h.name for h in boxes] if playbook in RSYNC_PLAYBOOKS else [],
              "kubectl": [h.name for h in hosts if "kubectl" in engines.engine_of(h.profile).programs]}
    return {program: names for program, names in needed.items() if names}


def check_controller_tools(playbook: str, hosts: list[Host], path: str | None = None) -> None:
    """Refuse (exit 2, nothing touched) when a program the command runs here is missing, naming it, the hosts that
    need it and the Debian package that has it. rsync and ssh are looked for on the PATH the plays get
    (rgt.inventory.ansible_env, or `path`); kubectl where the Kubernetes engine finds it (rgt.k8s_engine)."""
    search = path if path is not None else ansible_env().get("PATH", "")
    for program, names in controller_tools(playbook, hosts).items():
        who = ", ".join(names[:5]) + (f" and {len(names) - 5} more" if len(names) > 5 else "")
        if program == "kubectl":
            try:
                k8s_engine.find_kubectl()
            except RgtError as exc:
                raise InputError(f"{exc.message} (for {who})", fix=f"{exc.fix}; Debian's package kubernetes-client "
                                 "is an old kubectl (1.20)", field="kubectl") from None
        elif shutil.which(program, path=search) is None:
            purpose = "to copy files to and from" if program == "rsync" else "to reach"
            raise InputError(f"{program} is not installed on this machine (no {program} on PATH); rgt runs it here "
                             f"{purpose} {who}", fix=f"install it (Debian/Ubuntu: `sudo apt-get install "
                             f"{DEBIAN_PACKAGES[program]}`), then run the same command again", field=program)


# ---------------------------------------------------------------- prepare

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
        raise unknown_command(args.playbook) from None
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
    if playbook.stem in memory.LAUNCHING_PLAYBOOKS:
        check_spares(args.inventory, hosts)  # watch's automatic move: spares are other hosts of the inventory
    swept = sweeps.prepare(playbook.stem, hosts, extravars, ledger, plan_only=plan,
                           look=_box_rosters(args, extravars)
                           if pins and playbook.stem in memory.LAUNCHING_PLAYBOOKS else None)
    # a detach primitive not built yet: refused before any box
    profiles.check_launch(playbook.stem, hosts)
    if not plan:  # rsync, ssh, kubectl: a missing one is named now, not as a play's failure on the box
        check_controller_tools(playbook.stem, hosts)
    # a Kubernetes host has no SSH (no pin) and reads its secrets from a Secret by reference (none from here)
    ssh_hosts = [h for h in hosts if engines.engine_of(h.profile).over_ssh]
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
            listed = "; ".join(f"{secret_name_shown(name)} (for {', '.join(on)})"
                               for name, on in sorted(missing.items()))
            names = [name for name in sorted(missing) if secret_name_shown(name) == name]
            export = ("export " + " ".join(f"{name}=..." for name in names) if names
                      else "write each variable's NAME in rgt_job.secrets (e.g. HF_TOKEN) and export it")
            raise InputError(f"secret variable(s) not set in this environment: {listed}",
                             fix=export + " in this shell (rgt reads each secret by name and never stores it), or "
                                 "remove it from rgt_job.secrets", field="rgt_job.secrets")
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
        boxes = [h for h in hosts if engines.engine_of(h.profile).over_ssh]
        check_pins(args.inventory, boxes)
        return sshround.roster_round(args.inventory, boxes, extravars, project, name)
    return look


def prepare_hosts(args: argparse.Namespace, playbook: str = "monitor", choose: memory.Chooser | None = None):
    """(hosts, extra vars) of a play a command runs on `args` (prepare): with no job spec, each host acts on every
    run the ledger remembers on it (a launch: the unit `choose` picks)."""
    ns = argparse.Namespace(**vars(args))
    ns.playbook = playbook
    _playbook, hosts, extravars = prepare(ns, choose=choose)
    return hosts, extravars
