# -*- coding: utf-8 -*-
# Copyright: rgt contributors
# SPDX-License-Identifier: Apache-2.0
"""Load and validate platform profiles (profiles/<name>.yml).

Controller-side only (stdlib + PyYAML + jsonschema). Shared by the lookup plugin
``rgt.remote_gpu.profile`` and by the runner (``rgt.profiles``), so a profile that
the runner accepts is exactly a profile the roles accept.

Errors name the file, the JSON path of the field (``mounts[1].survives[0]``) and a fix.
"""

from __future__ import annotations

import copy
import json
import os
import re
from pathlib import Path

import yaml

from ansible_collections.rgt.remote_gpu.plugins.module_utils import rgt_registry
from ansible_collections.rgt.remote_gpu.plugins.module_utils.rgt_runlayout import expand_root

try:
    import jsonschema
except ImportError:  # pragma: no cover - reported as a ProfileError on use
    jsonschema = None

COLLECTION_ROOT = Path(__file__).resolve().parents[2]
PROFILES_DIR = COLLECTION_ROOT / "profiles"
SCHEMA_PATH = PROFILES_DIR / "schema" / "profile.schema.json"

_NAME_RE = re.compile(r"^[a-z][a-z0-9_]*$")
# `<meter_stop.api.key_env>`, `<spot.grace_s>`: a profile field's path in prose (the registry's `needs`, a note);
# a word without a dot (`<name>`, `<PORT>`, `<run_dir>`) is the user's to fill, never a field
_PLACEHOLDER_RE = re.compile(r"<([a-z_][a-z0-9_]*(?:\.[a-z_][a-z0-9_]*|\[[0-9]+\])+)>")

_CACHE: dict = {}
_SCHEMA_CACHE: dict = {}


class ProfileError(Exception):
    """A profile problem: where (``field``, a JSON path), what (``message``) and how to fix it."""

    def __init__(self, field: str, message: str, fix: str, source: str = "") -> None:
        self.field = field or "<root>"
        self.message = message
        self.fix = fix
        self.source = source
        super().__init__(str(self))

    def __str__(self) -> str:
        # The fix is kept apart (callers print it on its own line, e.g. InputError(fix=...)).
        where = f"{self.source}: " if self.source else ""
        return f"{where}{self.field}: {self.message}"

    def describe(self) -> str:
        """One line with the fix, for places that print a single string."""
        return f"{self}. Fix: {self.fix}"

    def as_dict(self) -> dict:
        return {"source": self.source, "field": self.field, "message": self.message, "fix": self.fix}


def _json_path(parts) -> str:
    out = ""
    for part in parts:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
    return out


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def load_schema(path: Path | None = None) -> dict:
    path = Path(path or SCHEMA_PATH)
    key = str(path)
    if key not in _SCHEMA_CACHE:
        with open(path, encoding="utf-8") as fh:
            _SCHEMA_CACHE[key] = json.load(fh)
    return _SCHEMA_CACHE[key]


def _subschema_at(schema: dict, parts) -> dict:
    """Walk the schema along an instance path (for descriptions in fix hints)."""
    node = schema
    for part in parts:
        if isinstance(part, int):
            node = node.get("items", {})
        else:
            props = node.get("properties", {})
            if part in props:
                node = props[part]
            elif isinstance(node.get("additionalProperties"), dict):
                node = node["additionalProperties"]
            else:
                return {}
    return node


def _describe(node: dict) -> str:
    desc = node.get("description", "")
    return f" — {desc}" if desc else ""


def _type_name(value) -> str:
    if value is None:
        return "null"
    return {
        bool: "boolean",
        int: "integer",
        float: "number",
        str: "string",
        list: "list",
        dict: "mapping",
    }.get(type(value), type(value).__name__)


def _convert(err, schema: dict, source: str) -> list:
    """Turn one jsonschema error into ProfileErrors with a precise field path and a fix."""
    parts = list(err.absolute_path)
    path = _json_path(parts)
    v = err.validator
    if v == "additionalProperties" and isinstance(err.instance, dict):
        allowed = sorted(err.schema.get("properties", {}))
        extra = [k for k in err.instance if k not in err.schema.get("properties", {})]
        return [
            ProfileError(
                _join(path, str(k)),
                f"unknown key {k!r}",
                f"remove it or fix the spelling; allowed keys here: {', '.join(allowed)}",
                source,
            )
            for k in extra
        ]
    if v == "required" and isinstance(err.instance, dict):
        props = err.schema.get("properties", {})
        return [
            ProfileError(
                _join(path, k),
                "required key is missing",
                f"add {k!r}{_describe(props.get(k, {}))}",
                source,
            )
            for k in err.validator_value
            if k not in err.instance
        ]
    if v == "enum":
        choices = ", ".join("null" if c is None else str(c) for c in err.validator_value)
        return [ProfileError(path, f"{err.instance!r} is not allowed", f"use one of: {choices}", source)]
    if v == "type":
        want = err.validator_value
        want = " or ".join(want) if isinstance(want, list) else want
        node = _subschema_at(schema, parts)
        return [
            ProfileError(
                path,
                f"expected {want}, got {_type_name(err.instance)} ({err.instance!r})",
                f"write a {want} here{_describe(node)}",
                source,
            )
        ]
    if v == "pattern":
        node = _subschema_at(schema, parts)
        return [
            ProfileError(
                path,
                f"{err.instance!r} does not match {err.validator_value}",
                f"write a value matching {err.validator_value}{_describe(node)}",
                source,
            )
        ]
    if v == "propertyNames":
        return [
            ProfileError(
                path,
                f"invalid key {err.instance!r}",
                "environment variable names are UPPER_SNAKE_CASE (^[A-Z_][A-Z0-9_]*$)",
                source,
            )
        ]
    if v == "uniqueItems":
        return [ProfileError(path, "duplicate items", "list each value once", source)]
    if v in ("minimum", "maximum", "minItems", "minLength"):
        return [ProfileError(path, err.message, f"respect {v} {err.validator_value}", source)]
    node = _subschema_at(schema, parts)
    return [ProfileError(path, err.message, f"see the schema{_describe(node)}", source)]


def _semantic_errors(data: dict, source: str, expected_name: str | None) -> list:
    """Rules JSON Schema cannot say clearly."""
    errors = []
    if expected_name is not None and data.get("name") != expected_name:
        errors.append(
            ProfileError(
                "name",
                f"name {data.get('name')!r} differs from the file name {expected_name!r}",
                f"set name: {expected_name} (or rename the file)",
                source,
            )
        )
    ms = data.get("meter_stop", {})
    if ms.get("verb") == "manual" and not ms.get("manual_steps"):
        errors.append(
            ProfileError(
                "meter_stop.manual_steps",
                "verb is manual but there are no manual steps",
                "list the exact console steps the user must take",
                source,
            )
        )
    if (
        ms.get("api") is None
        and ms.get("verb") not in [e.name for e in rgt_registry.METER_STOPS if not e.api]
        and not ms.get("manual_steps")
    ):
        errors.append(
            ProfileError(
                "meter_stop.api",
                f"verb {ms.get('verb')!r} has neither an API nor manual steps",
                "give meter_stop.api, or list manual_steps (and consider verb: manual)",
                source,
            )
        )
    in_box = ms.get("in_box") or {}
    if in_box.get("allowed"):
        for key, fix in (("command", "give the argv the box runs, e.g. [/usr/bin/shutdown]"),
                         ("self_id", "say how the box knows its own instance id: self_id: {env: NAME}")):
            if not in_box.get(key):
                errors.append(ProfileError(f"meter_stop.in_box.{key}", f"an allowed in-box stop needs {key}", fix,
                                           source))
        if not ms.get("reversible"):
            errors.append(ProfileError("meter_stop.in_box.allowed", "an in-box stop is allowed only for a reversible "
                                       "verb that keeps the data: nothing irreversible is done from the box",
                                       "set allowed: false with a reason", source))
    elif in_box and not in_box.get("reason"):
        errors.append(ProfileError("meter_stop.in_box.reason", "a refused in-box stop needs its reason",
                                   "say why the box must not stop its own meter", source))
    clocks = data.get("danger_clocks") or []
    for i, clock in enumerate(ms.get("starts_clocks") or []):
        if clock not in clocks:
            errors.append(
                ProfileError(
                    f"meter_stop.starts_clocks[{i}]",
                    f"{clock!r} is not one of danger_clocks",
                    "list the clock in danger_clocks too, word for word (a YAML anchor writes it once)",
                    source,
                )
            )
    seen = {}
    for i, mount in enumerate(data.get("mounts", [])):
        path = mount.get("path")
        if path in seen:
            errors.append(
                ProfileError(
                    f"mounts[{i}].path",
                    f"{path!r} is listed twice (first at mounts[{seen[path]}])",
                    "describe each path once; put variants in notes",
                    source,
                )
            )
        seen.setdefault(path, i)
    return errors


def validate_profile_data(data, source: str = "<profile>", expected_name: str | None = None) -> list:
    """Return a list of ProfileError (empty when the profile is valid)."""
    if jsonschema is None:
        return [
            ProfileError("<root>", "python package jsonschema is missing", "pip install jsonschema", source)
        ]
    if not isinstance(data, dict):
        return [
            ProfileError(
                "<root>",
                f"the file must hold a mapping, got {_type_name(data)}",
                "write the profile as YAML keys (name:, kind:, ...)",
                source,
            )
        ]
    schema = load_schema()
    validator = jsonschema.Draft202012Validator(schema)
    errors = []
    for err in sorted(validator.iter_errors(data), key=lambda e: [str(p) for p in e.absolute_path]):
        errors.extend(_convert(err, schema, source))
    if not errors:
        errors.extend(_semantic_errors(data, source, expected_name))
    return errors


def profile_path(name: str, profiles_dir=None) -> Path:
    if not isinstance(name, str) or not _NAME_RE.match(name):
        raise ProfileError(
            "rgt_profile",
            f"{name!r} is not a profile name",
            "use a lower-case name such as autodl or runpod (see `rgt-run profiles`)",
            "",
        )
    if profiles_dir:
        return Path(profiles_dir) / f"{name}.yml"
    for directory in _search_dirs():
        if (directory / f"{name}.yml").exists():
            return directory / f"{name}.yml"
    return PROFILES_DIR / f"{name}.yml"


def _search_dirs() -> list:
    """$RGT_PROFILES_DIR (a team's own or patched profiles) first, then the shipped ones."""
    extra = os.environ.get("RGT_PROFILES_DIR")
    return ([Path(extra)] if extra else []) + [PROFILES_DIR]


def load_profile(name: str, profiles_dir=None) -> dict:
    """Load profiles/<name>.yml, validate it, and return the dict (cached per process and file mtime).

    Raises ProfileError for a missing file, bad YAML or the first validation error
    (the message counts the others)."""
    path = profile_path(name, profiles_dir)
    source = str(path)
    try:
        mtime = path.stat().st_mtime_ns
    except FileNotFoundError:
        known = ", ".join(available_names(profiles_dir)) or "none"
        raise ProfileError(
            "rgt_profile",
            f"no profile named {name!r} ({source} does not exist)",
            f"use one of: {known}",
            source,
        ) from None
    key = (str(path.resolve()), mtime)
    if key in _CACHE:
        return copy.deepcopy(_CACHE[key])  # callers may mutate their copy; the cache stays pristine
    try:
        with open(path, encoding="utf-8") as fh:
            data = yaml.safe_load(fh)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark else "unknown position"
        raise ProfileError(
            "<root>", f"invalid YAML at {where}: {exc}", "fix the YAML syntax", source
        ) from None
    errors = validate_profile_data(data, source, expected_name=name)
    if errors:
        first = errors[0]
        if len(errors) > 1:
            first.message += f" (and {len(errors) - 1} more problem(s) in this file)"
        raise first
    data = fill_placeholders(data, data)
    _CACHE[key] = data
    return copy.deepcopy(data)


def available_names(profiles_dir=None) -> list:
    dirs = [Path(profiles_dir)] if profiles_dir else _search_dirs()
    return sorted({p.stem for d in dirs if d.is_dir() for p in d.glob("*.yml") if _NAME_RE.match(p.stem)})


def clear_cache() -> None:
    _CACHE.clear()
    _SCHEMA_CACHE.clear()


def expand_path(path: str, home: str, user: str) -> str:
    """Resolve '~' (login home) and '{user}' (login user) in a profile path: rgt_runlayout.expand_root, the one
    expansion the modules apply on the box, for a given home and user."""
    return expand_root(path, user=user, home=home)


def field_value(profile: dict, path: str):
    """The value at a JSON path of the profile (`meter_stop.api.key_env`, `mounts[1].path`), or None."""
    node = profile
    for key, index in re.findall(r"([a-z_][a-z0-9_]*)|\[([0-9]+)\]", path):
        if key:
            node = node.get(key) if isinstance(node, dict) else None
        else:
            node = node[int(index)] if isinstance(node, list) and int(index) < len(node) else None
        if node is None:
            return None
    return node


def fill_placeholders(value, profile: dict):
    """`value` (a string, or lists and mappings of them) with every `<field.path>` of the profile replaced by that
    field's value (`<meter_stop.api.key_env>` -> RUNPOD_API_KEY). A path that names no scalar stays as written."""
    if isinstance(value, str):
        def one(match):
            found = field_value(profile, match.group(1))
            if found is None or isinstance(found, (dict, list)):
                return match.group(0)
            return str(found).lower() if isinstance(found, bool) else str(found)
        return _PLACEHOLDER_RE.sub(one, value)
    if isinstance(value, list):
        return [fill_placeholders(item, profile) for item in value]
    if isinstance(value, dict):
        return {key: fill_placeholders(item, profile) for key, item in value.items()}
    return value


def render_env(profile: dict, durable_root: str, scratch_root: str) -> dict:
    """Return network.env with {durable_root} and {scratch_root} replaced (roots already expanded)."""
    env = profile.get("network", {}).get("env", {}) or {}
    return {
        k: v.replace("{durable_root}", durable_root.rstrip("/")).replace(
            "{scratch_root}", scratch_root.rstrip("/")
        )
        for k, v in env.items()
    }


def survival(profile: dict) -> list:
    """Rows of the survival matrix: (path, role, survives stop, survives terminate, inode cap)."""
    rows = []
    for m in profile.get("mounts", []):
        s = set(m.get("survives", []))
        rows.append((m["path"], m["role"], "stop" in s, "terminate" in s, m.get("inode_cap")))
    return rows
