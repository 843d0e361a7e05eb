"""What the user reads after a phase: per-host outcome, findings by severity, the next command to run."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

from rich.console import Console
from rich.markup import escape

from rgt import errors, paths
from rgt.inventory import Host
from rgt.ledger import atomic_write_json
from rgt.phases import PhaseResult
from rgt.safetext import printable

_findings_rule = paths.module_util("rgt_findings")  # the one shape and order of every phase's findings
SEVERITY_STYLE = {"critical": "red", "warning": "yellow", "info": "cyan"}

NEXT_STEP = {
    "probe": "rgt-run playbooks/env_check.yml -i {inv}",
    "env_check": "rgt-run playbooks/train.yml -i {inv}",
    "train": "rgt-run watch -i {inv}   (or `rgt-run status -i {inv}` for one look)",
    "launch_detached": "rgt-run watch -i {inv}",
    "upload_resume": "rgt-run playbooks/launch_detached.yml -i {inv}",
    "collect": "rgt-run teardown -i {inv} --confirm <instance-id>",
}


def first_contact(console: Console, ledger: Path, hosts: list[Host]) -> None:
    """Principle #10: teach the platform's danger clocks the first time we meet an instance."""
    for host in hosts:
        record = ledger / "hosts" / f"{host.instance_id}.json"
        if record.exists():
            continue
        prof = host.profile
        console.print(f"[bold]First contact with {host.name}[/bold] ({prof.get('title', prof['name'])}, "
                      f"facts verified {prof.get('verified', 'never')}):")
        for line in prof.get("danger_clocks", []):
            console.print(f"  [red]⏰[/red] {line}")
        for line in prof.get("conveniences", []):
            console.print(f"  [green]•[/green] {line}")
        atomic_write_json(record, {"instance_id": host.instance_id, "host": host.name, "profile": prof["name"],
                                   "first_contact": datetime.now(UTC).isoformat(),
                                   "danger_clocks_shown": prof.get("danger_clocks", [])})


SKIPPED_SHOWN = 5
SKIPPED_KIND = {"symlink": "symlink", "special": "not a regular file", "undecodable": "name not UTF-8",
                "unsafe": "backslash or drive prefix in the name"}


def _named(items: list[str], shown: int = SKIPPED_SHOWN) -> str:
    """The first few names and how many more, markup-escaped (a file may be called `[red]`)."""
    text = ", ".join(escape(str(item)) for item in items[:shown])
    return text + (f" and {len(items) - shown} more" if len(items) > shown else "")


def _phase_line(phase: str, rep: dict) -> str:
    """One plain line per phase report (upload: bytes sent, what was left out; launch: live / started / finished).
    Upload adds, on the same line, the files skipped while shipping (first few + count) and CRLF scripts shipped
    because the user allowed them."""
    if phase == "upload_resume":
        line = (f"upload: {rep.get('status')} {escape(rep.get('code_dir') or '')} ({rep.get('files')} files, "
                f"{rep.get('bytes_sent', 0)} bytes sent)")
        skipped = rep.get("skipped")
        if skipped is None:  # a report from before `skipped` existed
            skipped = [{"path": p, "kind": "symlink"} for p in rep.get("symlinks_skipped") or []]
        if skipped:
            line += (f"; skipped {len(skipped)} not shipped: "
                     + _named([f"{s.get('path')} ({SKIPPED_KIND.get(s.get('kind'), s.get('kind'))})"
                               for s in skipped]))
        crlf = rep.get("crlf_scripts") or []
        if crlf and rep.get("status") != "refused":
            line += f"; shipped with CRLF line ends ({rep.get('crlf') or 'allow'}): " + _named(crlf)
        return line
    if rep.get("msg"):
        return f"{phase}: {escape(printable(rep['msg']))}"  # the box's message
    return f"{phase}: {rep.get('status') or rep.get('state') or ''}".rstrip(": ")


def _print_findings(console: Console, findings: list[dict]) -> None:
    """Every finding of every phase (rgt_findings shape): severity, message, and its fix when it has one."""
    for f in findings:
        sev = f.get("severity", "info")
        fix = f" [dim]fix: {escape(printable(f['fix']))}[/dim]" if f.get("fix") else ""
        console.print(f"  [{SEVERITY_STYLE.get(sev, 'white')}]{sev:<8}[/] {escape(printable(f.get('message')))}{fix}")


def summarize(console: Console, result: PhaseResult, hosts: list[Host], ledger: Path,
              inventory: str = "<inventory>") -> dict:
    code = result.exit_code
    doc: dict = {"command": "playbook", **result.as_dict(), "ledger": str(ledger)}
    per_host = doc["hosts"]
    console.print()
    for host in hosts:
        out = result.hosts.get(host.name)
        entry = per_host.setdefault(host.name, {})
        if out is None:
            state = "[dim]not run[/dim]"
        elif out.host_key_mismatch:
            state = "[red]REFUSED[/red] host key does not match the pinned key"
        elif out.unreachable:
            state = "[magenta]UNREACHABLE[/magenta] (says nothing about any job on it)"
        elif out.failed:
            state = "[red]FAILED[/red]"
        else:
            state = "[green]ok[/green]"
        console.print(f"[bold]{host.name}[/bold] ({host.vars['rgt_profile']}, {host.instance_id}): {state}")
        if out and out.host_key_mismatch:
            console.print(f"  the key offered for instance '{host.instance_id}' is not the one pinned; nothing was "
                          "accepted. If the instance was re-created, verify the new fingerprint in the console, "
                          f"then `rgt-run pin -i <inv> --limit {host.name} --replace {host.instance_id}`.")
        for msg in (out.messages if out else [])[:3]:
            console.print(f"  {escape(printable(msg.splitlines()[0] if msg else ''))}")
        probe = out.results.get("probe_report") if out else None
        if probe:
            findings = _findings_rule.worst_first(probe.get("findings", []))
            entry["probe"] = {"verdict": probe.get("verdict"), "findings": findings}
            probed = probe.get("probed") if isinstance(probe.get("probed"), dict) else {}
            if probed.get("reused"):  # the ledger's record of a probe a moment ago (roles/probe, rgt_probe_once)
                entry["probe"].update(reused=True, age_s=probed.get("age_s"))
                console.print(f"  probe: reused, taken {probed.get('age_s')} s ago")
            _print_findings(console, findings)
        env = out.results.get("env_check_report") if out else None
        if env:
            env_findings = _findings_rule.worst_first(env.get("findings", []))
            entry["env_check"] = {"verdict": env.get("verdict"), "findings": env_findings,
                                  "interpreter": (env.get("interpreter") or {}).get("path"),
                                  "torch": env.get("torch"), "driver_cuda": env.get("driver_cuda")}
            checked = env.get("checked") if isinstance(env.get("checked"), dict) else {}
            if checked.get("reused"):  # the ledger's record of a check a moment ago (roles/env_check)
                entry["env_check"].update(reused=True, age_s=checked.get("age_s"))
                console.print(f"  env_check: reused, checked {checked.get('age_s')} s ago")
            _print_findings(console, env_findings)
        for key, rep in sorted((out.results if out else {}).items()):
            if key in ("probe_report", "env_check_report"):
                continue
            entry[key[: -len("_report")]] = rep
            line = _phase_line(key[: -len("_report")], rep)
            if line:
                console.print(f"  {line}")
    doc["exit_code"] = code
    stem = Path(result.playbook).stem
    if code == errors.OK and stem in NEXT_STEP:
        doc["next"] = NEXT_STEP[stem].format(inv=inventory)
        console.print(f"\nnext: {doc['next']}")
    elif code == errors.UNREACHABLE:
        console.print("\nnext: check the box in the platform console (ports change on restart); run the same "
                      "command again when it answers")
    console.print(f"exit {code} · ledger {ledger}")
    return doc
