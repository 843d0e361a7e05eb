"""Read an inventory the way Ansible will, and refuse malformed host variables before any host is touched."""

from __future__ import annotations

import copy
import hashlib
import json
import math
import os
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING

from ansible.release import __version__ as ansible_version

from rgt import confirmation, jobspec, paths
from rgt.errors import InputError, RgtError
from rgt.ledger import cache_path, cache_put, pass_key, passed_before, remember_pass
from rgt.profiles import ProfileError, load_profile, profile_names

if TYPE_CHECKING:
    import jsonschema

SCHEMA_DIR = Path(__file__).resolve().parent / "schemas"
_layout = paths.module_util("rgt_runlayout")  # the box's name, env-name and relative-path rules, one home
_sweep = paths.module_util("rgt_sweep")  # a sweep's cells and their run ids
_slurm = paths.module_util("rgt_slurm")  # the sbatch options rgt passes itself
_offload = paths.module_util("rgt_offload")  # the offload field's input rules (values never echoed)
_states = paths.module_util("rgt_states")  # the words of a notify rule's `on`, filled into the job schema
# where in job.schema.json the enum of a notify rule's `on` words goes (generated: rgt_states.NOTIFY_EVENTS)
NOTIFY_ON_WORD = ("$defs", "notify", "items", "properties", "on", "items", "then")


@dataclass
class Host:
    name: str
    vars: dict
    profile: dict = field(default_factory=dict)
    job_base: Path | None = None  # where a relative rgt_job.code_dir/data_dir of the inventory's job resolves
    recalled: dict | None = None  # the runs it acts on (rgt.memory.act_on: job, cells, runs), or a launch's unit
    other_runs: list[str] = field(default_factory=list)  # the other runs it reports in the same round trip
    overlay: dict = field(default_factory=dict)  # more host vars from the runner (a sweep's share: rgt_sweep)
    sweep: str | None = None  # the sweep of the first run it acts on (rgt.memory.act_on), for the report

    @property
    def instance_id(self) -> str:
        return self.vars["rgt_instance_id"]

    @property
    def is_local(self) -> bool:
        return self.vars.get("ansible_connection") == "local"

    @property
    def project(self) -> str:
        """The project a host's runs live under (the roles' default when the inventory names none)."""
        project = self.vars.get("rgt_project")
        return project if isinstance(project, str) and project else "rgt"


def load_schema(name: str) -> dict:
    """A schema of SCHEMA_DIR, with what it takes from the vocabularies: the job schema's notify `on` words are
    rgt_states.NOTIFY_EVENTS (one home: a new run state a rule may ask for changes no schema file)."""
    doc = json.loads((SCHEMA_DIR / name).read_text())
    if name == "job.schema.json":
        node = doc
        for key in NOTIFY_ON_WORD:
            node = node[key]
        node["enum"] = list(_states.NOTIFY_EVENTS)
    return doc


def _validator(schema: str | dict) -> jsonschema.Draft202012Validator:
    """A validator for a schema file name (or an inline schema) that may $ref the other schemas in SCHEMA_DIR.
    jsonschema is imported here, by the first document that has not passed before (`_passed`): 40 ms of a start."""
    import jsonschema
    from referencing import Registry, Resource

    resources = []
    for schema_file in SCHEMA_DIR.glob("*.schema.json"):
        doc = load_schema(schema_file.name)
        resources.append((schema_file.name, Resource.from_contents(doc)))
        resources.append((doc["$id"], Resource.from_contents(doc)))
    registry = Registry().with_resources(resources)
    if isinstance(schema, str):
        schema = load_schema(schema)
    # format checks too: a log pattern that is no regex is refused here, not on the box
    return jsonschema.Draft202012Validator(schema, registry=registry,
                                           format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER)


@cache
def _checker() -> bytes:
    """What decides a schema verdict here: every schema file as it is filled in (load_schema) and this module's own
    code (the validator it builds, the wrappers it validates against)."""
    parts = [json.dumps(load_schema(p.name), sort_keys=True).encode() for p in sorted(SCHEMA_DIR.glob("*.json"))]
    return b"\0".join([*parts, Path(__file__).read_bytes()])


def _passed(kind: str, doc: object) -> tuple[bool, Path | None]:
    """(did `doc` pass this validation before, the key to remember its pass by) (rgt.ledger.pass_key)."""
    key = pass_key(kind, doc, _checker() + b"\0" + kind.encode())
    return passed_before(key), key


def _field_path(error: jsonschema.ValidationError) -> str:
    out = ""
    for part in error.absolute_path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


_SECRETISH = re.compile(r"secret|credential|token|passw|key|webhook|auth", re.I)
ECHO_MAX = 24  # a longer refused value is not repeated: it may be a key pasted into the wrong field


def _unechoed(error: jsonschema.ValidationError, fld: str) -> str:
    """The schema's message, without the refused value where it may be a secret: a value longer than ECHO_MAX
    characters, or any value of a field whose name reads like a secret's. Short values (a typo in an enum, a
    word where a number belongs) stay: they are what makes the message useful."""
    shown = repr(error.instance)
    if shown not in error.message or (len(shown) <= ECHO_MAX + 2 and not _SECRETISH.search(fld)):
        return error.message
    value = error.instance
    what = (f"a string of {len(value)} characters" if isinstance(value, str)
            else f"a list of {len(value)} items" if isinstance(value, list)
            else f"a mapping of {len(value)} keys" if isinstance(value, dict) else f"a {type(value).__name__}")
    return error.message.replace(shown, f"the value given ({what}, not shown)")


def explain(error: jsonschema.ValidationError, where: str) -> InputError:
    """Turn a schema error into one sentence naming the field and the fix."""
    fld = _field_path(error)
    if error.validator == "required":
        missing = error.message.split("'")[1] if "'" in error.message else error.message
        fld = f"{fld}.{missing}" if fld else missing
        desc = error.schema.get("properties", {}).get(missing, {}).get("description", "")
        return InputError(f"{where}: missing required field '{fld}'", fix=f"set {fld}: {desc}".rstrip(": "),
                          field=fld)
    if error.validator == "additionalProperties":
        extra = sorted(set(error.instance) - set(error.schema.get("properties", {})))
        bad = f"{fld}.{extra[0]}" if fld and extra else (extra[0] if extra else fld)
        return InputError(f"{where}: unknown key '{bad}'",
                          fix=f"remove it; allowed keys of {fld or 'this object'}: "
                              + ", ".join(sorted(error.schema.get("properties", {}))), field=bad)
    if fld.endswith("webhook_env"):
        # a pasted webhook URL is a secret: never echo the value
        return InputError(f"{where}: field '{fld}' must be the NAME of an environment variable (e.g. "
                          "SLACK_WEBHOOK_URL), not the URL", fix="export SLACK_WEBHOOK_URL=... in this shell and "
                          "write webhook_env: SLACK_WEBHOOK_URL", field=fld)
    if ".offload." in f".{fld}":
        hint = _offload.input_hint(fld)  # the value may hold a key: never echoed
        if hint:
            return InputError(f"{where}: field '{fld}' is invalid: {hint[0]}", fix=hint[1], field=fld)
    if fld.endswith("secrets") or re.search(r"\.secrets\[\d+\]$", fld):
        # a value pasted where a NAME belongs is a secret: never echoed
        return InputError(f"{where}: field '{fld}' must list NAMES of environment variables of this shell (e.g. "
                          "HF_TOKEN), not their values", fix="export HF_TOKEN=... here and write secrets: "
                          "[HF_TOKEN]", field=fld)
    desc = error.schema.get("description", "")
    return InputError(f"{where}: field '{fld}' is invalid: {_unechoed(error, fld)}",
                      fix=(f"expected {error.validator} {error.validator_value!r}" + (f" — {desc}" if desc else "")),
                      field=fld)


def validate_job(job: dict, where: str = "job spec", base: Path | None = None) -> None:
    """Validate a job spec given as extra vars; field paths read `rgt_job.<field>` like in an inventory.
    `base`: where its relative local paths resolve (rgt.jobspec; default the current directory)."""
    wrapper = {"$schema": "https://json-schema.org/draft/2020-12/schema", "type": "object",
               "properties": {"rgt_job": {"$ref": "job.schema.json"}}}
    seen, key = _passed("job", {"rgt_job": job})
    if not seen:
        errors = sorted(_validator(wrapper).iter_errors({"rgt_job": job}), key=lambda e: list(e.absolute_path))
        if errors:
            raise explain(errors[0], where)
        remember_pass(key)
    check_job(job, where, base)


def _nonfinite(value: object, path: str) -> str | None:
    """The field path of the first NaN or infinity in value (YAML `.nan`, `.inf`), or None."""
    if isinstance(value, float) and not math.isfinite(value):
        return path
    if isinstance(value, dict):
        for key, item in value.items():
            found = _nonfinite(item, f"{path}.{key}")
            if found:
                return found
    if isinstance(value, list):
        for index, item in enumerate(value):
            found = _nonfinite(item, f"{path}[{index}]")
            if found:
                return found
    return None


def check_job(job: dict, where: str, base: Path | None = None) -> None:
    """What the schema cannot say: names built into paths on the box (the box's own rule), env names, NaN and
    infinities, output and checkpoint paths that stay inside the run, a code dir that exists (a relative one
    against `base`, the directory of the file it was written in; default the current directory), no sbatch option
    in slurm.extra that rgt passes itself (rgt_slurm.extra_problem), and a sweep's cells (at most
    rgt_sweep.MAX_CELLS, counted before any is built)."""
    bad = _nonfinite(job, "rgt_job")
    if bad:
        raise InputError(f"{where}: {bad} is not a finite number", fix="give a plain number (not .nan or .inf)",
                         field=bad)
    for key in ("run_id", "name"):
        if key in job and not jobspec.templated(job[key]):
            problem = _layout.check_name(job[key], "run id")
            if problem:
                raise InputError(f"{where}: rgt_job.{key}: {problem}", fix=f"set rgt_job.{key} to a plain name "
                                 "such as tiny-train-2", field=f"rgt_job.{key}")
    for key in ("python", "code_dir", "data_dir"):
        if isinstance(job.get(key), str) and any(ord(ch) < 0x20 for ch in job[key]):
            raise InputError(f"{where}: rgt_job.{key} holds a control character (a newline?): {job[key]!r}",
                             fix=f"write rgt_job.{key} on one line", field=f"rgt_job.{key}")
    for name in job.get("env") or {}:
        problem = _layout.check_env_name(name)
        if problem:
            raise InputError(f"{where}: rgt_job.env: {problem}", fix="rename the variable; values go after the "
                             "colon (`MY_SETTING: value`)", field=f"rgt_job.env.{name}")
    declared = ((job.get("checkpoint") or {}).get("declared") or [])
    for field_name, items, env_dir in (("outputs", job.get("outputs") or [], "RGT_OUT_DIR"),
                                       ("checkpoint.declared", declared, "RGT_CKPT_DIR")):
        for item in items:
            problem = None if jobspec.templated(item) else _layout.check_relpath(item.rstrip("/") or item)
            if problem:
                raise InputError(f"{where}: rgt_job.{field_name} entry {item!r} is refused: {problem}",
                                 fix=f"give paths relative to {env_dir}, without '..' (e.g. weights.bin, ckpt-*/)",
                                 field=f"rgt_job.{field_name}")
    for key in jobspec.PATH_FIELDS:
        value = job.get(key)
        if not isinstance(value, str) or jobspec.templated(value):
            continue
        local = Path(value).expanduser()
        if not local.is_absolute():
            local = (base or Path.cwd()) / local
        if not local.exists():
            raise InputError(f"{where}: rgt_job.{key} {value!r} does not exist ({local})",
                             fix=f"set rgt_job.{key} to the local directory to ship", field=f"rgt_job.{key}")
        if not local.is_dir():
            raise InputError(f"{where}: rgt_job.{key} {value!r} is a file, not a directory ({local})",
                             fix=f"set rgt_job.{key} to the directory that holds it", field=f"rgt_job.{key}")
    unbuilt = _offload.not_built(job.get("offload"))
    if unbuilt:
        raise InputError(f"{where}: {unbuilt[0]}", fix=unbuilt[1], field="rgt_job.offload.credentials")
    slurm = job.get("slurm")
    refused = _slurm.extra_problem(slurm.get("extra")) if isinstance(slurm, dict) else None
    if refused:
        index, message, fix = refused
        raise InputError(f"{where}: {message}", fix=fix, field=f"rgt_job.slurm.extra[{index}]")
    if job.get("sweep") and not jobspec.templated(job.get("run_id") or job.get("name")):
        try:
            _sweep.cells(job)
        except _sweep.SweepError as exc:
            raise InputError(f"{where}: {exc}", fix=exc.fix, field=exc.field) from exc


def check_spares(inventory: str, hosts: list) -> None:
    """`offload.spares` (watch's automatic move, docs/move.md): every spare is a host of the inventory (not only of
    --limit) and not the run's own host, and the offload goes to an rclone target (a move reads the checkpoint
    there). Exit 2 naming the field; nothing is read when no job names spares."""
    wanting = [(h, h.vars["rgt_job"]["offload"]) for h in hosts if isinstance(h.vars.get("rgt_job"), dict)
               and isinstance(h.vars["rgt_job"].get("offload"), dict) and h.vars["rgt_job"]["offload"].get("spares")]
    if not wanting:
        return
    names = set(read_inventory(inventory, None, {}))
    for host, offload in wanting:
        if not _offload.remote_of(offload.get("to")):
            raise InputError(f"host '{host.name}': offload.spares needs offload.to to be an rclone target (a move "
                             "resumes from the checkpoint copied there)", fix="set offload.to: remote:path, or drop "
                             "offload.spares", field="rgt_job.offload.spares")
        for spare in offload["spares"]:
            if spare == host.name:
                raise InputError(f"host '{host.name}': offload.spares names the run's own host", fix="name other "
                                 "hosts of the inventory, kept for the run to move to", field="rgt_job.offload.spares")
            if spare not in names:
                raise InputError(f"host '{host.name}': offload.spares names {spare}, no host of the inventory "
                                 f"{inventory}", fix=f"name one of: {', '.join(sorted(names - {host.name}))}",
                                 field="rgt_job.offload.spares")


def secret_name_shown(name: str) -> str:
    """A secret's NAME as a message may show it: an UPPER_CASE name as it is; anything else (`hf_Zq8...`: a
    token's value pasted where its variable's name belongs passes the name pattern) by its length only."""
    if re.fullmatch(r"[A-Z_][A-Z0-9_]{0,63}", name):
        return name
    return (f"a name of {len(name)} characters that is not UPPER_CASE (not shown: it may be the secret's value; "
            "write the NAME of the variable that holds it)")


def missing_secrets(hosts: list[Host]) -> dict[str, list[str]]:
    """{secret NAME: [hosts]} for every secret a host's job names that is not set in this environment."""
    missing: dict[str, list[str]] = {}
    for host in hosts:
        for name in _offload.shipped_secrets(host.vars.get("rgt_job") or {}):
            if not os.environ.get(name):
                missing.setdefault(name, []).append(host.name)
    return missing


def ansible_env() -> dict:
    env = dict(os.environ)
    # the ansible-* executables live beside this interpreter (a venv is not always activated)
    bindir = str(Path(sys.executable).parent)
    if bindir not in env.get("PATH", "").split(os.pathsep):
        env["PATH"] = bindir + os.pathsep + env.get("PATH", "")
    env["ANSIBLE_CONFIG"] = str(paths.ANSIBLE_CFG)
    env["ANSIBLE_COLLECTIONS_PATH"] = str(paths.ensure_collection_link())
    # Ansible runs from the collection root; `lookup('env', 'PWD')` in the roles and the local inventory means
    # the user's directory (relative job paths, ./runs, the local box), whoever started this process
    env["PWD"] = os.getcwd()
    return env


def _inventory_files(inv: Path) -> list[Path]:
    """Every file ansible-inventory reads for `inv`: the file (or every file under the directory) and the
    group_vars/ and host_vars/ trees beside it."""
    inv = inv.resolve()
    roots = [inv] if inv.is_dir() else [inv, inv.parent / "group_vars", inv.parent / "host_vars"]
    files = []
    for root in roots:
        if root.is_file():
            files.append(root)
        elif root.is_dir():
            files.extend(sorted(p for p in root.rglob("*") if p.is_file()))
    return files


def _fingerprint(inv: Path) -> tuple:
    out = []
    for path in _inventory_files(inv):
        try:
            st = path.stat()
        except OSError:
            continue
        out.append((str(path), st.st_mtime_ns, st.st_size))
    return tuple(out)


# ansible-inventory costs a second or two: one parse per process (lifecycle runs several plays, watch polls), and
# for a static inventory one parse across processes too (rgt-run status twice), while none of its files changed;
# a change (or a new file) parses it again
_PARSED: dict[tuple, dict] = {}
CACHE_KEEP = 32  # parsed inventories kept on disk, newest first


def _static(inv: Path) -> bool:
    """An inventory whose parse depends only on its files: no script (executable) and no inventory plugin config
    (a YAML `plugin:` document: its hosts come from an API, whatever the file says)."""
    sources = [p for p in _inventory_files(inv)
               if inv.is_dir() or p == inv.resolve()]  # group_vars/host_vars are data either way
    for path in sources:
        try:
            if os.access(path, os.X_OK):
                return False
            if path.suffix in (".yml", ".yaml", ".json", "") and re.search(rb"(?m)^plugin\s*:", path.read_bytes()):
                return False
        except OSError:
            return False
    return True


def _cache_file(key: tuple) -> Path:
    env = sorted((k, v) for k, v in os.environ.items() if k.startswith("ANSIBLE_"))
    digest = hashlib.sha256(json.dumps([key, ansible_version, env], default=str).encode()).hexdigest()[:32]
    return cache_path("inventory", f"{digest}.json")


def _parse_cached(inv: Path, limit: str | None, key: tuple) -> dict:
    if not _static(inv):
        return _parse_inventory(inv, limit)
    path = _cache_file(key)
    try:
        data = json.loads(path.read_bytes())
        if isinstance(data, dict) and isinstance(data.get("_meta"), dict):
            return data
    except (OSError, ValueError):
        pass
    data = _parse_inventory(inv, limit)
    cache_put(path, json.dumps(data).encode(), CACHE_KEEP, mode=0o600)  # inventory vars: the user's eyes only
    return data


def read_inventory(inventory: str, limit: str | None = None, groups: dict | None = None) -> dict:
    """The merged host vars per host, as `ansible-inventory --list` sees them (group_vars included). `groups`
    (when given) gets each host's groups. Cached per process while the inventory's files are unchanged."""
    inv = Path(inventory)
    if not str(inventory).strip() or not inv.exists():
        raise InputError(f"inventory '{inventory}' does not exist", fix="pass -i inventories/<platform>",
                         field="-i")
    key = (str(inv.resolve()), limit, _fingerprint(inv))
    if key not in _PARSED:
        _PARSED.clear()  # only the newest parse is worth keeping
        _PARSED[key] = _parse_cached(inv, limit, key)
    data = copy.deepcopy(_PARSED[key])
    if groups is not None:
        for group, members in data.items():
            if group != "_meta" and isinstance(members, dict):
                for host in members.get("hosts") or []:
                    groups.setdefault(host, []).append(group)
    return data.get("_meta", {}).get("hostvars", {})


def _parse_inventory(inv: Path, limit: str | None) -> dict:
    inventory = str(inv)
    cmd = ["ansible-inventory", "-i", str(inv), "--list"]
    if limit:
        cmd += ["--limit", limit]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=ansible_env(), timeout=120)
    problems = [ln.strip() for ln in proc.stderr.splitlines()
                if "Unable to parse" in ln or "Skipping" in ln or "ERROR" in ln]
    if proc.returncode != 0 or problems:
        detail = (problems or proc.stderr.strip().splitlines() or ["unknown error"])[0]
        raise InputError(f"inventory '{inventory}' could not be parsed: {detail}",
                         fix="check the YAML/INI syntax of the inventory and its group_vars/host_vars", field="-i")
    return json.loads(proc.stdout)


def load_hosts(inventory: str, limit: str | None = None, extravars: dict | None = None) -> list[Host]:
    """Validate every host's rgt_* variables and profile; raise InputError naming the first bad field."""
    groups: dict[str, list[str]] = {}
    merged = read_inventory(inventory, limit, groups)
    if not merged:
        raise InputError(f"inventory '{inventory}' has no hosts" + (f" matching --limit {limit}" if limit else ""),
                         fix="add a host with rgt_profile and rgt_instance_id", field="-i")
    validator = None  # built for the first host whose variables did not pass before
    extravars = extravars or {}
    hosts = []
    names = profile_names()
    for name, hv in sorted(merged.items()):
        problem = _layout.check_name(name, "host name")
        if problem:
            raise InputError(f"inventory '{inventory}': {problem}", fix="rename the host (its name is used in "
                             "local paths: runs/<run>/<host>/, the ledger); put the address in ansible_host",
                             field="host")
        for key in confirmation.confirm_vars():  # every variable a role reads as a meter stop's confirmation
            if key in hv:
                source = _file_defining(inventory, key)
                raise InputError(f"host '{name}': {key} is set in {source}: through rgt-run a teardown "
                                 "confirmation comes only from the person at the command", fix=f"remove {key} from "
                                 f"{source}; pass --confirm <instance-id> to `rgt-run teardown`, or type the id at "
                                 "its prompt", field=key)
        # extra vars win over inventory, as in Ansible; template strings are not evaluated here; a notify rule's
        # unquoted `on:` (YAML's true, "true" in ansible-inventory's JSON) is `on`
        hv = jobspec.host_vars_notify_on({**hv, **{k: v for k, v in extravars.items() if k.startswith("rgt_")}})
        rgt_vars = {k: v for k, v in hv.items() if k.startswith("rgt_")}
        seen, key = _passed("inventory_host", rgt_vars)
        if not seen:
            validator = validator or _validator("inventory_host.schema.json")
            errors = sorted(validator.iter_errors(rgt_vars),
                            key=lambda e: (e.validator != "required", list(e.absolute_path)))
            if errors:
                raise explain(errors[0], f"host '{name}'")
            remember_pass(key)
        if rgt_vars["rgt_profile"] not in names:
            raise InputError(f"host '{name}': rgt_profile: unknown profile '{rgt_vars['rgt_profile']}'",
                             fix="use one of: " + ", ".join(names), field="rgt_profile")
        try:
            profile = load_profile(rgt_vars["rgt_profile"])
        except ProfileError as exc:
            raise InputError(str(exc), fix=exc.fix, field=exc.field) from exc
        for key, what in (("rgt_instance_id", "instance id"), ("rgt_project", "project")):
            if key in rgt_vars and not jobspec.templated(rgt_vars[key]):
                problem = _layout.check_name(rgt_vars[key], what)
                if problem:
                    raise InputError(f"host '{name}': {key}: {problem}", fix=f"set {key} to a plain name",
                                     field=key)
        job_base = jobspec.inventory_dir_of_job(inventory, name, groups.get(name))
        if isinstance(hv.get("rgt_job"), dict) and "rgt_job" not in extravars:
            check_job(hv["rgt_job"], f"host '{name}'", job_base)
        hosts.append(Host(name=name, vars=hv, profile=profile, job_base=job_base))
    check_shared_instances(hosts)
    return hosts


def check_shared_instances(hosts: list[Host]) -> None:
    """Two hosts with one rgt_instance_id are one box: refused unless each says so (rgt_shared_volume: true)."""
    by_id: dict[str, list[Host]] = {}
    for host in hosts:
        by_id.setdefault(host.instance_id, []).append(host)
    for iid, group in sorted(by_id.items()):
        undeclared = [h.name for h in group if h.vars.get("rgt_shared_volume") is not True]
        if len(group) > 1 and undeclared:
            raise InputError(f"hosts {', '.join(h.name for h in group)} share rgt_instance_id '{iid}'",
                             fix="give each box its own instance id; if they really are one box with one durable "
                                 "volume, set rgt_shared_volume: true on each of them (each run then needs its own "
                                 "verified pull)", field="rgt_instance_id")


def _file_defining(inventory: str, key: str) -> str:
    """The inventory file (hosts, group_vars, host_vars) that sets `key`, for an error message."""
    inv = Path(inventory)
    roots = [inv] if inv.is_dir() else [inv, inv.parent / "group_vars", inv.parent / "host_vars"]
    pattern = re.compile(r"(^|[\s{,])%s\s*[:=]" % re.escape(key), re.M)
    for root in roots:
        files = [root] if root.is_file() else sorted(p for p in root.rglob("*") if p.is_file()) if root.is_dir() \
            else []
        for candidate in files:
            try:
                if pattern.search(candidate.read_text(errors="replace")):
                    return str(candidate)
            except OSError:
                continue
    return f"the inventory '{inventory}'"


def known_hosts_file(inventory: str, host: Host) -> Path:
    explicit = host.vars.get("rgt_known_hosts")
    if explicit:
        return Path(explicit).expanduser()
    inv = Path(inventory).resolve()
    base = inv if inv.is_dir() else inv.parent
    return base / "known_hosts"


def check_pins(inventory: str, hosts: list[Host]) -> None:
    """Every SSH host needs a pinned key before we connect: strict by default, never trust on first use."""
    for host in hosts:
        if host.is_local:
            continue
        kh = known_hosts_file(inventory, host)
        pinned = kh.is_file() and any(
            line.split(" ", 1)[0] == host.instance_id for line in kh.read_text().splitlines() if line.strip())
        if not pinned:
            raise InputError(
                f"host '{host.name}': no pinned host key for rgt_instance_id '{host.instance_id}' in {kh}",
                fix=f"run `rgt-run pin -i {inventory} --limit {host.name}` and compare the fingerprint with the "
                    "platform console, or add the line `<instance_id> <keytype> <key>` yourself",
                field="rgt_instance_id")


def render_vars(inventory: str, limit: str | None, extravars: dict, names: list[str], template: str) -> dict:
    """{host: the value of `template` (a Jinja expression of the host's variables) as Ansible renders it for that
    host}, for every host in `names`. One ad-hoc `debug` call: an action that runs on the controller and opens no
    connection to any box (no facts are gathered), so it works on a box that is down. Nothing is left behind but
    for a moment a scratch directory under $TMPDIR (the extra vars file, 0600). A host whose template does not
    render is an InputError naming it."""
    with tempfile.TemporaryDirectory(prefix="rgt-render-") as scratch:
        vars_file = Path(scratch) / "vars.json"
        fd = os.open(vars_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as handle:
            json.dump(extravars, handle, default=str)
        tree = Path(scratch) / "tree"
        cmd = ["ansible", "all", "-i", str(inventory), "-m", "ansible.builtin.debug",
               "-a", json.dumps({"msg": template}), "-e", f"@{vars_file}", "--tree", str(tree), "-o"]
        if limit:
            cmd += ["--limit", limit]
        env = {**ansible_env(), "ANSIBLE_FORCE_COLOR": "0", "ANSIBLE_NOCOLOR": "1"}
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=120)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise RgtError(f"could not render the inventory's variables with Ansible: {exc}",
                           fix="run `ansible-inventory -i INVENTORY --list` to see what Ansible makes of it") from exc
        out: dict[str, dict] = {}
        for name in names:
            try:
                doc = json.loads((tree / name).read_text())
            except (OSError, ValueError):
                doc = {}
            if doc.get("failed") or not isinstance(doc.get("msg"), dict):
                detail = str(doc.get("msg") or proc.stderr.strip() or "no result").splitlines()[0][:300]
                raise InputError(f"host '{name}': its variables do not render: {detail}",
                                 fix="fix the template in the inventory or the job spec", field="rgt_job")
            out[name] = doc["msg"]
    return out
