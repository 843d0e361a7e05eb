"""Read an inventory the way Ansible will, and refuse malformed host variables before any host is touched."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import jsonschema
from referencing import Registry, Resource

from rgt import paths
from rgt.errors import InputError
from rgt.profiles import ProfileError, load_profile, profile_names

SCHEMA_DIR = Path(__file__).resolve().parent / "schemas"


@dataclass
class Host:
    name: str
    vars: dict
    profile: dict = field(default_factory=dict)

    @property
    def instance_id(self) -> str:
        return self.vars["rgt_instance_id"]

    @property
    def is_local(self) -> bool:
        return self.vars.get("ansible_connection") == "local"


def _validator(schema: str | dict) -> jsonschema.Draft202012Validator:
    """A validator for a schema file name (or an inline schema) that may $ref the other schemas in SCHEMA_DIR."""
    resources = []
    for schema_file in SCHEMA_DIR.glob("*.schema.json"):
        doc = json.loads(schema_file.read_text())
        resources.append((schema_file.name, Resource.from_contents(doc)))
        resources.append((doc["$id"], Resource.from_contents(doc)))
    registry = Registry().with_resources(resources)
    if isinstance(schema, str):
        schema = json.loads((SCHEMA_DIR / schema).read_text())
    return jsonschema.Draft202012Validator(schema, registry=registry)


def _field_path(error: jsonschema.ValidationError) -> str:
    out = ""
    for part in error.absolute_path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


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
    desc = error.schema.get("description", "")
    return InputError(f"{where}: field '{fld}' is invalid: {error.message}",
                      fix=(f"expected {error.validator} {error.validator_value!r}" + (f" — {desc}" if desc else "")),
                      field=fld)


def validate_job(job: dict, where: str = "job spec") -> None:
    """Validate a job spec given as extra vars; field paths read `rgt_job.<field>` like in an inventory."""
    wrapper = {"$schema": "https://json-schema.org/draft/2020-12/schema", "type": "object",
               "properties": {"rgt_job": {"$ref": "job.schema.json"}}}
    errors = sorted(_validator(wrapper).iter_errors({"rgt_job": job}), key=lambda e: list(e.absolute_path))
    if errors:
        raise explain(errors[0], where)


def ansible_env() -> dict:
    env = dict(os.environ)
    # the ansible-* executables live beside this interpreter (a venv is not always activated)
    bindir = str(Path(sys.executable).parent)
    if bindir not in env.get("PATH", "").split(os.pathsep):
        env["PATH"] = bindir + os.pathsep + env.get("PATH", "")
    env["ANSIBLE_CONFIG"] = str(paths.ANSIBLE_CFG)
    env["ANSIBLE_COLLECTIONS_PATH"] = str(paths.ensure_collection_link())
    return env


def read_inventory(inventory: str, limit: str | None = None) -> dict:
    """The merged host vars per host, as `ansible-inventory --list` sees them (group_vars included)."""
    inv = Path(inventory)
    if not inv.exists():
        raise InputError(f"inventory '{inventory}' does not exist", fix="pass -i inventories/<platform>",
                         field="-i")
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
    data = json.loads(proc.stdout)
    return data.get("_meta", {}).get("hostvars", {})


def load_hosts(inventory: str, limit: str | None = None, extravars: dict | None = None) -> list[Host]:
    """Validate every host's rgt_* variables and profile; raise InputError naming the first bad field."""
    merged = read_inventory(inventory, limit)
    if not merged:
        raise InputError(f"inventory '{inventory}' has no hosts" + (f" matching --limit {limit}" if limit else ""),
                         fix="add a host with rgt_profile and rgt_instance_id", field="-i")
    validator = _validator("inventory_host.schema.json")
    extravars = extravars or {}
    hosts = []
    names = profile_names()
    for name, hv in sorted(merged.items()):
        # extra vars win over inventory, as in Ansible; template strings are not evaluated here
        hv = {**hv, **{k: v for k, v in extravars.items() if k.startswith("rgt_")}}
        rgt_vars = {k: v for k, v in hv.items() if k.startswith("rgt_")}
        errors = sorted(validator.iter_errors(rgt_vars),
                        key=lambda e: (e.validator != "required", list(e.absolute_path)))
        if errors:
            raise explain(errors[0], f"host '{name}'")
        if rgt_vars["rgt_profile"] not in names:
            raise InputError(f"host '{name}': rgt_profile: unknown profile '{rgt_vars['rgt_profile']}'",
                             fix="use one of: " + ", ".join(names), field="rgt_profile")
        try:
            profile = load_profile(rgt_vars["rgt_profile"])
        except ProfileError as exc:
            raise InputError(str(exc), fix=exc.fix, field=exc.field) from exc
        hosts.append(Host(name=name, vars=hv, profile=profile))
    return hosts


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
