"""`rgt-run train -C`: the plan per host of a fresh run, computed on this machine; no box is contacted.

The same input checks as a real run first (rgt.cli.prepare: job spec, inventory, secrets set in this shell, host
key pins). Then, per host: the code tree's manifest with the very module_util the upload runs (rgt_tree: ignore
rules, SHA-256 per file, hash8), so `code-<hash8>` is the directory a real upload would create; the run layout
from rgt_runlayout.RunPaths; the command; the disk floor; the price and what the expected duration costs.

Host variables may be Jinja templates (the embedded local inventory's durable root is one). They are rendered by
Ansible itself with one ad-hoc `debug` call: an action that runs on the controller and opens no connection to the
box (no facts are gathered), so a plan works on a box that is down, and the values are the ones the roles see.
Nothing is written but a scratch directory under $TMPDIR (the extra vars file), removed at once.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import tempfile
from pathlib import Path

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from rgt import errors, jobspec, paths
from rgt.errors import InputError, RgtError

DEFAULT_PROJECT = "rgt"  # roles/*/defaults: rgt_project | default('rgt')
DEFAULT_DISK_FLOOR_GIB = 1  # roles/launch_detached/defaults: launch_detached_job.disk_floor_gib | default(1)
DEFAULT_CRLF = "refuse"  # roles/upload_resume/defaults: rgt_job.crlf | default('refuse')

# what the roles read, rendered by Ansible for each host (missing ones come back as null)
_RENDER = ("{{ {'durable_root': rgt_durable_root | default(none), 'project': rgt_project | default(none), "
           "'job': rgt_job | default(none), 'ignore_file': upload_resume_ignore_file | default(none), "
           "'skip_smoke': rgt_skip_smoke | default(false)} }}")


def render(inventory: str, limit: str | None, extravars: dict, names: list[str]) -> dict[str, dict]:
    """{host: rendered values} through `ansible -m debug` (runs on the controller only; no box is contacted)."""
    from rgt.inventory import ansible_env

    with tempfile.TemporaryDirectory(prefix="rgt-plan-") as scratch:
        vars_file = Path(scratch) / "vars.json"
        fd = os.open(vars_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as handle:
            json.dump(extravars, handle, default=str)
        tree = Path(scratch) / "tree"
        cmd = ["ansible", "all", "-i", str(inventory), "-m", "ansible.builtin.debug",
               "-a", json.dumps({"msg": _RENDER}), "-e", f"@{vars_file}", "--tree", str(tree), "-o"]
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


def _number(value: object) -> float | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return float(value)
    try:
        return float(str(value))
    except (TypeError, ValueError):
        return None


def host_plan(host, values: dict, base: str | None, tree, layout) -> dict:
    """The plan of one host from its rendered values (tree, layout: the rgt_tree and rgt_runlayout module_utils)."""
    job = values.get("job")
    if not isinstance(job, dict) or not job:
        raise InputError(f"host '{host.name}': no job spec to plan", fix="pass -e @job.yml, or set rgt_job in the "
                         "inventory", field="rgt_job")
    run_id = job.get("run_id") or job.get("name")
    project = values.get("project") or DEFAULT_PROJECT
    root = values.get("durable_root") or host.profile["roots"]["durable"]
    if host.is_local:
        root = layout.expand_root(root)  # this machine is the box: its ~ and {user} are ours
    try:
        layout_paths = layout.RunPaths(str(root), str(project), str(run_id))
    except ValueError as exc:
        raise InputError(f"host '{host.name}': {exc}", fix="set rgt_job.run_id (or name) and rgt_project to plain "
                         "names", field="rgt_job.run_id") from exc
    code_src = job.get("code_dir")
    local = jobspec.resolve_paths(job, Path(base) if base else Path.cwd())  # relative paths follow their file
    if not code_src:
        raise InputError(f"host '{host.name}': the job spec has no code_dir", fix="set rgt_job.code_dir to the "
                         "local directory to ship", field="rgt_job.code_dir")
    code_local = Path(local["code_dir"])
    if not code_local.is_dir():
        raise InputError(f"host '{host.name}': rgt_job.code_dir {code_src!r} is not a directory ({code_local})",
                         fix="set rgt_job.code_dir to the local directory to ship", field="rgt_job.code_dir")
    try:
        code = tree.build_manifest(str(code_local), values.get("ignore_file"))
        data = None
        if job.get("data_dir"):
            data_local = Path(local["data_dir"])
            manifest = tree.build_manifest(str(data_local))
            data = {"src": manifest["src"], "dir": layout_paths.data, "files": manifest["files"],
                    "bytes": manifest["bytes"]}
    except tree.TreeError as exc:
        raise RgtError(f"host '{host.name}': cannot read the code or data tree: {exc}",
                       fix="make the files readable (the upload would fail the same way)") from exc
    crlf = str(job.get("crlf") or DEFAULT_CRLF)
    refusal = tree.crlf_refusal(code["src"], code["crlf_scripts"]) if code["crlf_scripts"] and crlf == "refuse" \
        else None
    price = _number(job.get("price_per_hour"))
    duration = _number(job.get("expected_duration_s"))
    floor = _number(job.get("disk_floor_gib"))
    return {
        "host": host.name, "profile": host.profile["name"], "instance_id": host.instance_id,
        "run_id": run_id, "project": project, "durable_root": str(root), "run_dir": layout_paths.run_dir,
        "hash8": code["hash8"], "code_dir": layout_paths.code_dir(code["hash8"]), "code_src": code["src"],
        "files": code["files"], "bytes": code["bytes"], "ignored": code["ignored_count"],
        "skipped": code["skipped"], "crlf_scripts": code["crlf_scripts"], "refused": refusal, "data": data,
        "command": job.get("command"), "python": job.get("python"), "smoke_command": None if values.get(
            "skip_smoke") in (True, "true", "True") else job.get("smoke_command"),
        "secrets": list(job.get("secrets") or []),
        "disk_floor_gib": DEFAULT_DISK_FLOOR_GIB if floor is None else floor,
        "price_per_hour": price, "expected_duration_s": duration,
        "expected_cost": round(price * duration / 3600.0, 4) if price is not None and duration is not None else None,
    }


def _size(n: int) -> str:
    value = float(n)
    for unit in ("B", "KB", "MB", "GB"):
        if value < 1000 or unit == "GB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1000
    return f"{n} B"


def _hours(seconds: float) -> str:
    minutes = int(round(seconds / 60.0))
    return f"{minutes // 60} h {minutes % 60:02d} min" if minutes >= 60 else f"{seconds:g} s" if seconds < 60 \
        else f"{minutes} min"


def render_plan(console: Console, item: dict) -> None:
    table = Table(show_header=False, show_edge=False, box=None, pad_edge=False)
    table.add_column(style="bold", no_wrap=True)
    table.add_column(overflow="fold")
    table.add_row("run", escape(f"{item['run_id']} (project {item['project']})"))
    table.add_row("code", escape(f"code-{item['hash8']} from {item['code_src']}: {item['files']} files, "
                                 f"{_size(item['bytes'])} to send (nothing if code-{item['hash8']} is already "
                                 f"on the box)" + (f"; {item['ignored']} ignored" if item["ignored"] else "")))
    if item["data"]:
        table.add_row("data", escape(f"{item['data']['src']}: {item['data']['files']} files, "
                                     f"{_size(item['data']['bytes'])} to {item['data']['dir']}"))
    table.add_row("command", escape(f"{item['command']}" + (f"   (python: {item['python']})" if item["python"]
                                                              else "")))
    if item["smoke_command"]:
        table.add_row("smoke", escape(f"{item['smoke_command']} on this machine first"))
    if item["secrets"]:
        table.add_row("secrets", escape(", ".join(item["secrets"]) + " (read from this shell, never stored)"))
    table.add_row("run dir", escape(f"{item['run_dir']} (on the box)"))
    table.add_row("code dir", escape(item["code_dir"]))
    table.add_row("disk floor", f"{item['disk_floor_gib']:g} GiB free on {escape(item['durable_root'])} at launch")
    if item["price_per_hour"] is None:
        table.add_row("price", "not set (rgt_job.price_per_hour)")
    else:
        cost = (f"; the expected {_hours(item['expected_duration_s'])} cost {item['expected_cost']:.2f}"
                if item["expected_cost"] is not None else "; set rgt_job.expected_duration_s for an estimate")
        table.add_row("price", f"{item['price_per_hour']:g} per hour{cost}")
    if item["skipped"]:
        table.add_row("skipped", escape(", ".join(s["path"] for s in item["skipped"][:5])
                                        + (" ..." if len(item["skipped"]) > 5 else "") + " (never shipped)"))
    console.print(f"[bold]{escape(item['host'])}[/bold] ({escape(item['profile'])}, instance "
                  f"{escape(item['instance_id'])})")
    console.print(table)
    if item["refused"]:
        console.print(f"  [red]the upload would be refused:[/red] {escape(item['refused'])}")


def cmd_plan(args: argparse.Namespace, console: Console) -> int:
    """Print (and with --json emit) the plan per host; exit 0, or 1 when an upload would be refused."""
    from rgt.cli import emit, prepare

    _playbook, hosts, extravars = prepare(args)
    values = render(args.inventory, args.limit, extravars, [h.name for h in hosts])
    tree = paths.module_util("rgt_tree")
    layout = paths.module_util("rgt_runlayout")
    bases = extravars.get("rgt_job_base_dirs") or {}
    plans = {h.name: host_plan(h, values[h.name], bases.get(h.name), tree, layout) for h in hosts}
    console.print(f"[bold]rgt[/bold] plan for train on {len(hosts)} host(s) (-C: computed here, no box contacted, "
                  "nothing changed)")
    for item in plans.values():
        render_plan(console, item)
    code = errors.FAILED if any(p["refused"] for p in plans.values()) else errors.OK
    console.print(f"exit {code} · run it for real without -C")
    emit({"command": "plan", "hosts": plans, "exit_code": code}, args.json)
    return code
