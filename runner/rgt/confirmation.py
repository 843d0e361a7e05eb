"""The confirmation of a meter stop through `rgt-run`: which variables carry it, and which plays carry a role that
reads it. One home, derived from the roles themselves (docs/internals.md "Teardown gate"):

- a role option named `*_confirm` or `*_confirms` in the role's meta/argument_specs.yml confirms a destructive step
  of that role (the teardown role's `teardown_confirm`), and every variable its default (defaults/main.yml)
  reads is a confirmation too (`teardown_confirm` reads `rgt_teardown_confirms` and `rgt_teardown_confirm`):
  `confirm_vars()`. The runner refuses each of them given with `-e` (rgt.prepare) or set in the inventory
  (rgt.inventory.load_hosts), and `pins()` holds each of them, in every play it runs, to what `rgt-run teardown`
  confirmed after its plan (extra vars outrank play vars, role params, vars files and set_fact);
- a role with such an option can stop a meter (`meter_stop_roles()`); a playbook that carries one and is not the
  collection's playbooks/teardown.yml is refused before anything runs (`carried_role()`): `rgt-run teardown` is the
  one way through the runner, with its plan and its confirmation.

The roles used without the runner (plain ansible-playbook) keep taking `teardown_confirm` / `rgt_teardown_confirm`.
"""

from __future__ import annotations

import functools
import hashlib
import json
from pathlib import Path

from rgt import paths
from rgt.ledger import cache_path, cache_put

COLLECTION = "rgt.remote_gpu"
SUFFIXES = ("_confirm", "_confirms")
# what `rgt-run teardown` passes, after its plan and the confirmation: {inventory host: instance id}
CHANNEL = "rgt_teardown_confirms"
ROLES_DIR = paths.REPO_ROOT / "roles"
CACHE_KEEP = 4  # derivations kept on disk (one per collection version in use)


def _yaml(path: Path) -> object:
    import yaml  # 11 ms of every start; only a derivation the disk cache does not hold reads the roles' YAML

    try:
        return yaml.load(path.read_text(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))  # noqa: S506
    except (OSError, yaml.YAMLError, UnicodeDecodeError):
        return None


def _role_files() -> list[Path]:
    return sorted(f for role in ROLES_DIR.iterdir() for f in (role / "meta" / "argument_specs.yml",
                                                             role / "defaults" / "main.yml") if f.is_file())


def role_options() -> dict[str, dict[str, object]]:
    """{role: {option: its default from defaults/main.yml (None when it has none)}} for every role."""
    out: dict[str, dict[str, object]] = {}
    for role in sorted(p for p in ROLES_DIR.iterdir() if (p / "meta" / "argument_specs.yml").is_file()):
        specs = _yaml(role / "meta" / "argument_specs.yml")
        main = ((specs.get("argument_specs") or {}).get("main") or {}) if isinstance(specs, dict) else {}
        options = main.get("options") or {}
        defaults = _yaml(role / "defaults" / "main.yml")
        defaults = defaults if isinstance(defaults, dict) else {}
        out[role.name] = {name: defaults.get(name) for name in options}
    return out


def _names_read(value: object) -> set[str]:
    """The variables a default's Jinja reads (every name loaded in its templates)."""
    if not isinstance(value, str) or "{" not in value:
        return set()
    # jinja2: 20 ms of a start; only when the roles changed (derive() is cached on disk) is a default parsed
    import jinja2
    import jinja2.nodes

    try:
        tree = jinja2.Environment().parse(value)
    except jinja2.TemplateSyntaxError:
        return set()
    return {node.name for node in tree.find_all(jinja2.nodes.Name) if node.ctx == "load"}


def derive() -> dict:
    """What the roles say, from their files: {"options": {confirmation option: {"role", "default"}}, "vars": every
    variable a role reads as a confirmation}. The confirmation options, and what their defaults read (through
    other options' defaults too), of the names that are rgt's (`rgt_*`) or a role's options; Ansible's own
    (inventory_hostname) are not."""
    everything = role_options()
    defaults = {name: default for opts in everything.values() for name, default in opts.items()}
    options = {name: {"role": role, "default": default} for role, opts in everything.items()
               for name, default in opts.items() if name.endswith(SUFFIXES)}
    found: set[str] = set()
    todo = list(options)
    while todo:
        name = todo.pop()
        if name in found:
            continue
        found.add(name)
        todo += [n for n in _names_read(defaults.get(name)) if n.startswith("rgt_") or n in defaults]
    return {"options": options, "vars": sorted(found)}


@functools.cache
def _derived() -> dict:
    """derive(), kept on disk while the roles' argument specs and defaults are unchanged (every rgt-run command
    reads it: YAML and Jinja cost it a few tenths of a second otherwise)."""
    key = [(str(f), f.stat().st_mtime_ns, f.stat().st_size) for f in _role_files()]
    path = cache_path("confirmation", hashlib.sha256(json.dumps(key).encode()).hexdigest()[:32] + ".json")
    try:
        doc = json.loads(path.read_bytes())
        if isinstance(doc, dict) and isinstance(doc.get("options"), dict) and isinstance(doc.get("vars"), list):
            return doc
    except (OSError, ValueError):
        pass
    doc = derive()
    cache_put(path, json.dumps(doc).encode(), CACHE_KEEP)
    return doc


def confirm_options() -> dict[str, str]:
    """{option: role} for every role option that confirms a destructive step (named `*_confirm(s)`)."""
    return {name: item["role"] for name, item in _derived()["options"].items()}


def confirm_vars() -> tuple[str, ...]:
    """Every variable a role reads as a confirmation (derive())."""
    return tuple(_derived()["vars"])


def meter_stop_roles() -> tuple[str, ...]:
    """The roles that can stop a meter: those with a confirmation option."""
    return tuple(sorted(set(confirm_options().values())))


def pins(confirmed: dict | None = None) -> dict:
    """Extra vars for a play run through rgt-run: the channel holds what `rgt-run teardown` confirmed (empty
    otherwise), each confirmation option its role's default (which reads the channel), every other confirmation
    variable nothing. No play vars, role params, vars files or set_fact can confirm a meter stop past them."""
    options = _derived()["options"]
    out: dict = {}
    for name in confirm_vars():
        if name == CHANNEL:
            out[name] = dict(confirmed or {})
        elif name in options and isinstance(options[name]["default"], str):
            out[name] = options[name]["default"]
        else:
            out[name] = ""
    return out


# ---------------------------------------------------------------- does a playbook carry a meter-stop role?

TASK_LISTS = ("pre_tasks", "tasks", "post_tasks", "handlers")
BLOCK_KEYS = ("block", "rescue", "always")
ROLE_ACTIONS = {f"{prefix}{name}" for prefix in ("", "ansible.builtin.", "ansible.legacy.")
                for name in ("include_role", "import_role")}
TASK_FILE_ACTIONS = {f"{prefix}{name}" for prefix in ("", "ansible.builtin.", "ansible.legacy.")
                     for name in ("include_tasks", "import_tasks", "include")}
PLAYBOOK_ACTIONS = {f"{prefix}import_playbook" for prefix in ("", "ansible.builtin.", "ansible.legacy.")}
MAX_FILES = 200  # a play's own files are a handful; a cycle or a huge tree stops here (the pins still hold)


class _Walk:
    """A read of a playbook and what it pulls in (imported playbooks, task files, its own roles and their
    dependencies), as text: templated names cannot be told and are skipped (the pins hold for them)."""

    def __init__(self, playbook: Path):
        self.base = playbook.resolve().parent
        self.seen: set[Path] = set()
        self.found: str | None = None

    def _first_visit(self, path: Path) -> bool:
        path = path.resolve()
        if path in self.seen or len(self.seen) >= MAX_FILES or not path.is_file():
            return False
        self.seen.add(path)
        return True

    def role(self, name: object, here: Path) -> None:
        """A role named in a play, a task or a dependency, resolved the way Ansible does: an FQCN of this
        collection; else roles/ beside the file, the collection's roles (rgt's roles_path), the path itself."""
        if self.found or not isinstance(name, str) or "{{" in name:
            return
        name = name.strip()
        if name.startswith(COLLECTION + "."):
            self.collection_role(name[len(COLLECTION) + 1:])
            return
        if "/" in name:
            candidates = [Path(name)] if Path(name).is_absolute() else [here / name, self.base / name]
        else:
            candidates = [here / "roles" / name, self.base / "roles" / name, ROLES_DIR / name, here / name]
        for candidate in candidates:
            if candidate.is_dir():
                found = candidate.resolve()
                if found.parent == ROLES_DIR.resolve():
                    self.collection_role(found.name)
                else:
                    self.role_dir(found)  # the user's own role: what it runs
                return

    def collection_role(self, role: str) -> None:
        if role in meter_stop_roles():
            self.found = f"{COLLECTION}.{role}"
        elif (ROLES_DIR / role).is_dir():
            self.role_dir(ROLES_DIR / role)

    def role_dir(self, path: Path) -> None:
        meta = path / "meta" / "main.yml"
        if self._first_visit(meta):
            doc = _yaml(meta)
            for dep in (doc.get("dependencies") or []) if isinstance(doc, dict) else []:
                self.role(dep.get("role") or dep.get("name") if isinstance(dep, dict) else dep, path.parent.parent)
        self.task_file(path / "tasks" / "main.yml", path)

    def task_file(self, path: Path, role_dir: Path | None = None) -> None:
        if self._first_visit(path):
            self.tasks(_yaml(path), path.parent, role_dir)

    def tasks(self, items: object, here: Path, role_dir: Path | None = None) -> None:
        for task in items if isinstance(items, list) else []:
            if self.found or not isinstance(task, dict):
                continue
            for key in BLOCK_KEYS:
                self.tasks(task.get(key), here, role_dir)
            for key, value in task.items():
                if key in ROLE_ACTIONS:
                    self.role(_arg(value, "name"), here)
                elif key in TASK_FILE_ACTIONS:
                    rel = _arg(value, "file")
                    if isinstance(rel, str) and "{{" not in rel:
                        roots = ([role_dir / "tasks"] if role_dir else []) + [here, self.base]
                        for root in roots:
                            if (root / rel).is_file():
                                self.task_file(root / rel, role_dir)
                                break

    def playbook(self, path: Path) -> None:
        if not self._first_visit(path):
            return
        here = path.resolve().parent
        plays = _yaml(path)
        for play in plays if isinstance(plays, list) else []:
            if self.found or not isinstance(play, dict):
                continue
            for key in PLAYBOOK_ACTIONS & set(play):
                target = _arg(play[key], "file")
                if isinstance(target, str) and "{{" not in target:
                    if target.startswith(COLLECTION + "."):
                        self.playbook(paths.PLAYBOOKS_DIR / f"{target[len(COLLECTION) + 1:]}.yml")
                    else:
                        self.playbook(here / target)
            for entry in play.get("roles") or []:
                self.role(entry.get("role") or entry.get("name") if isinstance(entry, dict) else entry, here)
            for key in TASK_LISTS:
                self.tasks(play.get(key), here)


def _arg(value: object, key: str) -> object:
    """The main argument of `include_role: {name: x}`, `include_role: name=x`, `import_tasks: x.yml`."""
    if isinstance(value, dict):
        return value.get(key)
    if isinstance(value, str):
        for word in value.split():
            if word.startswith(f"{key}="):
                return word.split("=", 1)[1]
        return value if "=" not in value else None
    return None


def carried_role(playbook: Path) -> str | None:
    """The meter-stop role (its FQCN) that `playbook` runs, through its plays' roles, include_role/import_role,
    imported playbooks and task files, and its own roles' dependencies; None when none is found (a playbook that
    cannot be read is left to Ansible to report). The collection's own playbooks are known (a test holds which of
    them carries one): only teardown.yml, which is `rgt-run teardown`."""
    if playbook.resolve().parent == paths.PLAYBOOKS_DIR.resolve():
        return f"{COLLECTION}.teardown" if playbook.name == "teardown.yml" else None
    if not meter_stop_roles():
        return None
    walk = _Walk(playbook)
    walk.playbook(playbook)
    return walk.found
