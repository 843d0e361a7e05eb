"""Platform profiles for the runner: load, list, and show them (`rgt-run profiles [show <name>]`).

The loader and validator live in `plugins/module_utils/rgt_profiles.py`, shared with the Ansible lookup
`rgt.remote_gpu.profile`, so the runner and the roles accept exactly the same files. The runner loads that
file by path: `rgt` is installed in editable mode from the repo, so the collection sits next to this
package (`<repo>/runner/rgt/profiles.py` -> `<repo>/plugins/module_utils/rgt_profiles.py`) and no
`ansible_collections` import path is needed.
"""

from __future__ import annotations

import argparse
import os
from datetime import date
from pathlib import Path

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from rgt import errors, output, paths
from rgt.errors import InputError

_core = paths.module_util("rgt_profiles")
registry = paths.module_util("rgt_registry")  # the detach primitives and meter-stop verbs, one home

ProfileError = _core.ProfileError
PROFILES_DIR: Path = _core.PROFILES_DIR
SCHEMA_PATH: Path = _core.SCHEMA_PATH
expand_path = _core.expand_path
render_env = _core.render_env
clear_cache = _core.clear_cache
fill_placeholders = _core.fill_placeholders  # `<field.path>` in prose -> the profile's value (filled at load too)

STALE_AFTER_MONTHS = 6


def registry_errors(profile: object, source: str = "<profile>") -> list:
    """A ProfileError for every detach primitive or meter-stop verb the profile names that is not registered."""
    return [ProfileError(field, message, fix, source) for field, message, fix in registry.profile_problems(profile)]


def load_profile(name: str, profiles_dir: str | Path | None = None) -> dict:
    """Return the validated profile `name`; raise ProfileError(field, message, fix) naming the JSON path.
    A primitive or verb that is not registered (plugins/module_utils/rgt_registry.py) is refused here too."""
    profile = _core.load_profile(name, profiles_dir=profiles_dir)
    errors = registry_errors(profile, str(_core.profile_path(name, profiles_dir)))
    if errors:
        raise errors[0]
    return profile


def validate_profile_data(data: object, source: str = "<profile>", expected_name: str | None = None) -> list:
    """Return every problem in `data` as a list of ProfileError (empty when valid)."""
    errors = _core.validate_profile_data(data, source, expected_name=expected_name)
    return errors or registry_errors(data, source)


# The playbooks that start a run's wrapper (train imports launch_detached); lifecycle and `-C train` go through them.
LAUNCHING_PLAYBOOKS = ("train", "launch_detached")


def check_launch(playbook: str, hosts: list) -> None:
    """Before a play that launches: refuse (InputError, exit 2, nothing touched) when a host's profile names a
    detach primitive that is not built yet, so nothing is uploaded for a launch that cannot happen."""
    if playbook not in LAUNCHING_PLAYBOOKS:
        return
    for host in hosts:
        err = launch_problem(host.profile)
        if err is not None:
            raise InputError(f"host '{host.name}': {err}", fix=err.fix, field=err.field)


def launch_problem(profile: dict) -> ProfileError | None:
    """Why a run cannot be launched through this profile's detach primitive (not registered, or registered but not
    built: the registry's `built`), as a ProfileError naming the field and what to use instead; None when it can."""
    detach = profile.get("detach") or {}
    found = registry.launch_problem(detach.get("primitive"), detach.get("fallback"))
    if found is None:
        return None
    field, message, fix = found
    source = f"profile {profile.get('name')}"
    return ProfileError(field, message, fix, source)


def verb_plan(inst) -> dict:
    """What the meter stop's verb does to a teardown's instance (rgt.teardown.Instance: instance_id, names, profile),
    from its profile: shown before the prompt and returned in --json."""
    profile = inst.profile
    meter = profile.get("meter_stop") or {}
    api = meter.get("api") or {}
    key_env = api.get("key_env")
    key_set = bool(key_env and os.environ.get(key_env))
    gate = paths.module_util("rgt_gate")  # the gate's rules, the same file the rgt_teardown module runs
    console = gate.console_instead(meter, key_set)
    return {"instance_id": inst.instance_id, "hosts": inst.names, "profile": profile.get("name"),
            "verb": meter.get("verb") or "manual", "label": meter.get("label") or meter.get("verb"),
            "reversible": bool(meter.get("reversible")), "deletes": gate.deleted_mounts(profile),
            "keeps_billing": list(meter.get("keeps_billing") or []), "api": bool(api.get("client")),
            "key_env": key_env, "key_set": key_set if key_env else None, "console_steps": console,
            "manual_steps": list(meter.get("manual_steps") or []) if (console or not api.get("client")) else [],
            "clocks": gate.clocks_started(profile)}


def profile_names() -> list[str]:
    """Names of every profile on the search path, without loading (a broken one must not hide the others)."""
    return _core.available_names()


def list_profiles(profiles_dir: str | Path | None = None) -> list[dict]:
    """All valid profiles, sorted by name; the first broken one raises ProfileError."""
    return [load_profile(n, profiles_dir) for n in _core.available_names(profiles_dir)]


def profile_as_json(profile: dict) -> dict:
    """A JSON-ready copy of the profile (for --json), with the survival matrix spelled out."""
    doc = dict(profile)
    doc["survival"] = [
        {"path": p, "role": r, "survives_stop": s, "survives_terminate": t, "inode_cap": i}
        for p, r, s, t, i in _core.survival(profile)
    ]
    fallback = (profile.get("detach") or {}).get("fallback")
    doc["engines"] = fill_placeholders({  # what the registry says of the primitive and verb this profile names
        "detach": registry.detach(profile["detach"]["primitive"]).as_dict(),
        "fallback": registry.detach(fallback).as_dict() if fallback else None,
        "meter_stop": registry.meter_stop(registry.meter_stop_of(profile["meter_stop"])).as_dict(),
    }, profile)
    return doc


def is_stale(verified: str, today: date | None = None, months: int = STALE_AFTER_MONTHS) -> bool:
    """True when a YYYY-MM stamp is older than `months` (the source's check_staleness rule)."""
    if verified == "none":
        return False
    today = today or date.today()
    year, month = (int(x) for x in verified.split("-"))
    return (today.year - year) * 12 + (today.month - month) > months


def _yes(flag: bool) -> str:
    return "[green]yes[/green]" if flag else "[red]no[/red]"


def _verb(ms: dict) -> str:
    label = ms["label"]
    same = label.lower().replace(" ", "_") == ms["verb"]
    return escape(ms["verb"] if same else f"{ms['verb']} ({label})")


def _built(entry, profile: dict) -> str:
    """A registry entry's name, marked when it is not built yet (launch refuses it)."""
    name = escape(entry.name)
    instead = fill_placeholders(entry.instead or "", profile)
    return name if entry.built else f"{name} [red](not built yet: {escape(instead)})[/red]"


def render_list(console: Console, profiles_dir: str | Path | None = None) -> None:
    """`rgt-run profiles`: one row per platform."""
    table = Table(title="rgt platform profiles", show_lines=False)
    for col in ("name", "kind", "meter stop", "reversible", "spot grace", "verified"):
        table.add_column(col)
    for prof in list_profiles(profiles_dir):
        ms, spot = prof["meter_stop"], prof["spot"]
        if spot["grace_s"] is not None:
            grace = f"{spot['grace_s']} s" + ("" if spot["available"] else " (stop signal, no spot)")
        else:
            grace = "n/a"
        verified = prof["verified"]
        if is_stale(verified):
            verified = f"[yellow]{verified} (stale)[/yellow]"
        table.add_row(prof["name"], prof["kind"], _verb(ms), _yes(ms["reversible"]), grace, verified)
    console.print(table)


def render_show(console: Console, profile: dict) -> None:
    """`rgt-run profiles show <name>`: survival matrix, meter stop, danger clocks; every `<field.path>` in the
    text (the registry's, the profile's own) shows the profile's value."""
    p = fill_placeholders(profile, profile)
    console.print(
        f"[bold]{escape(p['title'])}[/bold] — profile [cyan]{p['name']}[/cyan], kind {p['kind']}, "
        f"facts verified {p['verified']}" + (" [yellow](stale)[/yellow]" if is_stale(p["verified"]) else "")
    )
    console.print(escape(f"durable root: {p['roots']['durable']}    scratch root: {p['roots']['scratch']}"))

    matrix = Table(title="Storage survival: is the data still there after stop / terminate?")
    matrix.add_column("mount", no_wrap=True)
    matrix.add_column("role", no_wrap=True)
    matrix.add_column("stop", no_wrap=True)
    matrix.add_column("terminate", no_wrap=True)
    matrix.add_column("inode cap", no_wrap=True)
    matrix.add_column("size")
    for m in p["mounts"]:
        s = set(m["survives"])
        cap = f"{m['inode_cap']:,}" if m.get("inode_cap") else "-"
        path = m["path"] + (" (optional)" if m.get("optional") else "")
        matrix.add_row(
            escape(path),
            m["role"],
            _yes("stop" in s),
            _yes("terminate" in s),
            cap,
            escape(m.get("size_hint") or "-"),
        )
    console.print(matrix)

    ms = p["meter_stop"]
    console.print(
        f"[bold]Meter stop:[/bold] {_verb(ms)} — "
        + (
            "reversible (the box can be started again)"
            if ms["reversible"]
            else "[red]irreversible[/red] (deletes the instance and its local disks)"
        )
    )
    if ms["api"]:
        api = ms["api"]
        console.print(escape(f"  via {api['client']} at {api['base_url']} (key from ${api['key_env']})"))
    elif ms["verb"] == "manual":
        console.print("  no API: the user does it in the console")
    for step in ms["manual_steps"]:
        console.print(f"  step: {escape(step)}")
    for alt in ms.get("alternatives", []):
        kind = "reversible" if alt["reversible"] else "irreversible"
        console.print(escape(f"  also: {alt['label']} ({alt['verb']}, {kind}): {alt['effect']}"))
    console.print("[bold]Keeps billing after the stop:[/bold]" + ("" if ms["keeps_billing"] else " nothing"))
    for item in ms["keeps_billing"]:
        console.print(f"  $ {escape(item)}")
    console.print(f"[bold]Check afterwards:[/bold] {escape(ms['post_check'])}")
    in_box = ms.get("in_box") or {}
    if in_box.get("allowed"):
        console.print(escape(f"  from the box itself (rgt_job.offload.stop_box): {' '.join(in_box['command'])}, "
                             f"its own id from ${in_box['self_id']['env']}"))
    else:
        console.print(escape("  never from the box itself: " + (in_box.get("reason") or "the profile does not say "
                                                                 "an in-box stop is safe")))

    spot = p["spot"]
    grace = f"{spot['grace_s']} s" if spot["grace_s"] is not None else "n/a"
    console.print(
        f"[bold]Spot:[/bold] {'available' if spot['available'] else 'not available'}, grace {grace}"
    )
    console.print(
        f"[bold]Detach:[/bold] {_built(registry.detach(p['detach']['primitive']), p)}"
        + (f" (fallback {_built(registry.detach(p['detach']['fallback']), p)})" if p["detach"]["fallback"]
           else " (no fallback)")
    )
    stop = registry.meter_stop(registry.meter_stop_of(ms))
    console.print(f"[bold]Meter stopped by:[/bold] {_built(stop, p)} — needs "
                  f"{escape(fill_placeholders(stop.needs(), p))}")

    console.print("[bold]Danger clocks:[/bold]" + ("" if p["danger_clocks"] else " none"))
    for line in p["danger_clocks"]:
        console.print(f"  [red]⏰[/red] {escape(line)}")
    if p["conveniences"]:
        console.print("[bold]Conveniences:[/bold]")
        for line in p["conveniences"]:
            console.print(f"  [green]•[/green] {escape(line)}")
    if p.get("notes"):
        console.print("[bold]Notes:[/bold]")
        for line in p["notes"]:
            console.print(f"  - {escape(line)}")


# ---------------------------------------------------------------- `rgt-run profiles` (the table is in rgt.cli)

HELP = "list the platforms rgt knows, or show one platform's facts (`profiles show NAME`)"
DESCRIPTION = """\
List the platforms rgt knows (SSH user and port, where data survives a stop, how the meter stops, what keeps
billing), or show everything known about one of them: `rgt-run profiles show runpod`. The profile name goes into
your inventory as rgt_profile."""


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("action", nargs="?", choices=["list", "show"], default="list", help="list (default) or show")
    p.add_argument("name", nargs="?", metavar="NAME", help="the platform to show")


def cmd_profiles(args: argparse.Namespace, console: Console) -> int:
    if args.action == "list":
        if args.name:
            raise InputError(f"`rgt-run profiles list` takes no name (got {args.name!r})",
                             fix=f"rgt-run profiles show {args.name}", field="name")
        items = list_profiles()
        render_list(output.results(args.json))
        output.emit({"command": "profiles", "profiles": [profile_as_json(x) for x in items]}, args.json)
        return errors.OK
    if not args.name:
        raise InputError("`rgt-run profiles show` needs a profile name", fix="rgt-run profiles show runpod",
                         field="name")
    try:
        prof = load_profile(args.name)
    except ProfileError as exc:
        raise InputError(str(exc), fix=exc.fix, field=exc.field) from exc
    render_show(output.results(args.json), prof)
    output.emit({"command": "profiles show", "profile": profile_as_json(prof)}, args.json)
    return errors.OK
