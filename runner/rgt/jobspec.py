"""Where a job spec's local paths point: relative paths follow the user, never the installation.

A relative `rgt_job.code_dir` or `data_dir` resolves against the directory of the file it was written in: the
`-e @job.yml` file, or the inventory file that defines `rgt_job` (host_vars, the hosts file, group_vars), else the
current directory (a job given inline with `-e '{...}'`). The runner hands Ansible absolute paths, one base
directory per host (`rgt_job_base_dirs: {host: dir}`); the roles resolve a relative path against that, else the
current directory, so a playbook run without the runner behaves the same from the user's project.

A notify rule's `on:` written unquoted is what YAML 1.1 (PyYAML, Ansible) reads as the boolean true: the key is
True in an `-e @job.yml` file and "true" once `ansible-inventory` has printed the inventory as JSON.
`notify_rule` names it `on` again (`with_notify_on` for a job spec or a host's variables), before the schema sees
it, so docs/report.md's example works as written.
"""

from __future__ import annotations

import re
from pathlib import Path

from rgt.errors import InputError

PATH_FIELDS = ("code_dir", "data_dir")
DEFAULT_CRLF = "refuse"  # rgt_job.crlf: roles/upload_resume/defaults (rgt_job.crlf | default('refuse'))
_DEFINES_JOB = re.compile(r"(^|[\s{,])rgt_job\s*[:=]", re.M)


def templated(value: object) -> bool:
    """A Jinja template string: Ansible fills it in, the runner leaves it alone."""
    return isinstance(value, str) and ("{{" in value or "{%" in value)


def origin_dir(origin: str | None, cwd: Path | None = None) -> Path:
    """The base directory of a job spec given with -e: the file's directory for `-e @path`, else the cwd."""
    cwd = cwd or Path.cwd()
    if origin and origin.startswith("-e @"):
        return (cwd / Path(origin[len("-e @"):]).expanduser()).resolve().parent
    return cwd.resolve()


def _candidates(inventory: Path, host: str, groups: list[str]) -> list[Path]:
    """Files that may define a host's rgt_job, most specific first (Ansible's precedence: host_vars, then the
    inventory file itself, then group_vars of the host's groups, `all` last)."""
    base = inventory if inventory.is_dir() else inventory.parent
    out: list[Path] = []

    def add(root: Path, name: str) -> None:
        for cand in (root / name, root / f"{name}.yml", root / f"{name}.yaml", root / f"{name}.json"):
            if cand.is_file():
                out.append(cand)
            elif cand.is_dir():
                out.extend(sorted(p for p in cand.rglob("*") if p.is_file()))

    add(base / "host_vars", host)
    out.extend(sorted(p for p in base.iterdir() if p.is_file() and p.suffix in (".yml", ".yaml", ".ini", ".json",
                                                                                ""))
               if inventory.is_dir() else [inventory])
    for group in [*groups, "all"]:
        add(base / "group_vars", group)
    return out


def inventory_dir_of_job(inventory: str | Path, host: str, groups: list[str] | None = None,
                         cwd: Path | None = None) -> Path:
    """The directory of the inventory file that defines this host's rgt_job (else the current directory)."""
    inv = Path(inventory)
    if not inv.exists():
        return (cwd or Path.cwd()).resolve()
    for cand in _candidates(inv.resolve(), host, groups or []):
        try:
            if _DEFINES_JOB.search(cand.read_text(errors="replace")):
                return cand.parent
        except OSError:
            continue
    return (cwd or Path.cwd()).resolve()


def resolve_paths(job: dict, base: Path) -> dict:
    """A copy of the job spec with code_dir/data_dir made absolute against `base` (templates and `~` kept)."""
    out = dict(job)
    for key in PATH_FIELDS:
        value = out.get(key)
        if not isinstance(value, str) or not value or templated(value):
            continue
        path = Path(value).expanduser()
        out[key] = str(path if path.is_absolute() else (base / path).resolve())
    return out


def _is_yaml_on(key: object) -> bool:
    """The key an unquoted `on:` becomes: True (YAML 1.1), or "true" after a JSON round trip (ansible-inventory)."""
    return key is True or key == "true"


def notify_rule(rule: object, field: str = "rgt_job.notify[]") -> object:
    """A notify rule with its YAML-1.1 `on:` key (True, "true") named `on`; refused when `on` is given twice."""
    if not isinstance(rule, dict) or not any(_is_yaml_on(k) for k in rule):
        return rule
    if "on" in rule or sum(1 for k in rule if _is_yaml_on(k)) > 1:
        raise InputError(f"{field}: `on` is given twice (once quoted, once as YAML's true)",
                         fix="write `on:` once in the rule", field=f"{field}.on")
    return {("on" if _is_yaml_on(k) else k): v for k, v in rule.items()}


def _rules(rules: object, field: str) -> object:
    if not isinstance(rules, list):
        return rules
    return [notify_rule(rule, f"{field}[{index}]") for index, rule in enumerate(rules)]


def with_notify_on(job: object, field: str = "rgt_job") -> object:
    """A job spec (a copy when anything changed) whose notify rules read `on:` as `on` (notify_rule)."""
    if not isinstance(job, dict) or not isinstance(job.get("notify"), list):
        return job
    rules = _rules(job["notify"], f"{field}.notify")
    return job if rules == job["notify"] else {**job, "notify": rules}


def host_vars_notify_on(hostvars: dict) -> dict:
    """A host's variables whose rgt_job.notify and rgt_notify rules read `on:` as `on` (notify_rule)."""
    out = dict(hostvars)
    if isinstance(out.get("rgt_job"), dict):
        out["rgt_job"] = with_notify_on(out["rgt_job"])
    if isinstance(out.get("rgt_notify"), list):
        out["rgt_notify"] = _rules(out["rgt_notify"], "rgt_notify")
    return out
