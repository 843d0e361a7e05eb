"""`rgt-run pull`: seal each box's finished run, pull it and verify every byte (playbooks/collect.yml).

Per host: "verified: N files, X MB, SHA-256 match", or what failed (missing, unexpected and mismatched files
named). `--verify-only` re-verifies the local copy without touching the box. Exit codes: 3 a host key does not
match its pin, else 1 any closeout/transfer/verification failure, else 4 any unreachable host, else 0.
"""

from __future__ import annotations

import argparse
import json
import re
import sys

from rich.console import Console

HELP = "seal each finished run, pull its results here and verify every file's SHA-256"
DESCRIPTION = """\
Seal each box's finished run, copy its results into your runs directory (./runs/<run>/<host>/ by default) and
verify every byte against the box's manifest. Per host it says "verified: N files, X MB, SHA-256 match", or names
the files that are missing, unexpected or different. Running it again re-verifies and sends only what is missing.
`--verify-only` checks the local copy again without touching the box.
Exit codes: 3 a host key does not match its pin, else 1 a seal, copy or check failed, else 4 a box is
unreachable, else 0."""


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--runs-dir", metavar="DIR", help="where the results land (default $RGT_RUNS_DIR or ./runs)")
    p.add_argument("--verify-only", action="store_true", help="re-verify the local copy; do not touch the box")


LISTS = (("missing", "missing here"), ("unexpected", "unexpected here (never deleted; move it away)"),
         ("size_mismatch", "of the wrong size"), ("sha_mismatch", "whose content differs from the box's (SHA-256)"))
LIST_LABELS = ("missing locally:", "unexpected local file:", "size differs:", "SHA-256 differs:")


def _named(paths: list[str], limit: int = 5) -> str:
    more = f" and {len(paths) - limit} more" if len(paths) > limit else ""
    return ", ".join(paths[:limit]) + more


def what_failed(doc: dict) -> str:
    """The cause of a failed pull in plain words: the files by kind, a refused manifest, a closeout that was not
    sealed, a full disk (the module's own message), a transfer."""
    error = str(doc.get("error") or "failed")
    error = re.sub(r"^(?:\S+: )?PULL NOT VERIFIED for \S+: ", "", error)
    if doc.get("unreachable"):
        return f"the box is unreachable: {error}"
    if doc.get("rsync_failed"):  # the transfer is the cause; the role's message names it and how to resume
        return re.sub(r"^\S+: (?=rsync failed)", "", error)
    kinds = [f"{len(doc[key])} file(s) {words}: {_named(doc[key])}" for key, words in LISTS if doc.get(key)]
    if not kinds:
        return error
    others = [p for p in doc.get("problems") or [] if not str(p).startswith(LIST_LABELS)]
    return "; ".join(kinds + others)


def host_line(name: str, doc: dict) -> str:
    if doc.get("verified"):
        mb = (doc.get("bytes") or 0) / 1e6
        repaired = doc.get("repaired") or []
        fixed = f" (re-sent {len(repaired)} file(s) changed locally: {_named(repaired)})" if repaired else ""
        return (f"{name}: verified: {doc.get('files')} files, {mb:.1f} MB, SHA-256 match -> {doc.get('dest')}"
                f"{fixed}")
    return f"{name}: NOT verified: {what_failed(doc)}"


def cmd_pull(args: argparse.Namespace, console: Console) -> int:
    from rgt.cli import prepare
    from rgt.ledger import ledger_dir, runs_dir
    from rgt.phases import run_playbook

    ns = argparse.Namespace(**vars(args))
    ns.playbook = "collect"
    playbook, hosts, extravars = prepare(ns)
    root = runs_dir(args.runs_dir)
    extravars = {**extravars, "rgt_runs_dir": str(root), "collect_verify_only": bool(args.verify_only)}
    ledger = ledger_dir(args.ledger)
    console.print(f"[bold]rgt pull[/bold] {'(verify only) ' if args.verify_only else ''}on {len(hosts)} host(s) "
                  f"into {root}")
    result = run_playbook(playbook, args.inventory, hosts, ledger=ledger, console=console, extravars=extravars,
                          limit=args.limit, quiet=not args.verbose, verbosity=args.verbose or 0)
    docs: dict[str, dict] = {}
    for host in hosts:
        outcome = result.hosts.get(host.name)
        if outcome is None:
            doc = {"host": host.name, "verified": False, "error": "the collect play returned nothing for this host"}
        elif outcome.unreachable:
            doc = {"host": host.name, "verified": False, "unreachable": True,
                   "error": (outcome.messages or ["unreachable"])[-1][:600]}
        else:
            doc = dict(outcome.results.get("collect_report") or {"host": host.name, "verified": False})
            if outcome.failed and not doc.get("error"):
                doc["error"] = (outcome.messages or ["failed"])[-1][:600]
            doc["verified"] = bool(doc.get("verified")) and not outcome.failed
        docs[host.name] = doc
        style = "green" if doc["verified"] else "red"
        console.print(f"[{style}]{host_line(host.name, doc)}[/]")
    code = result.exit_code
    verified = [h for h in hosts if docs[h.name]["verified"]]
    if verified and not args.verify_only:  # --verify-only promises not to touch the box; the report looks at it
        from rgt import runreport

        reports = runreport.after_pull(args, console, verified, extravars, ledger, root)
        for rep in reports:
            for name in rep["hosts"]:
                if name in docs:
                    docs[name]["report"] = rep["html"]
    console.print(f"exit {code} · runs {root}")
    if args.json:
        sys.stdout.write(json.dumps({"command": "pull", "runs_dir": str(root), "hosts": docs, "exit_code": code,
                                     "phase": result.as_dict()}, sort_keys=True, default=str) + "\n")
        sys.stdout.flush()
    return code


