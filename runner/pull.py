"""`rgt-run pull`: seal each box's finished run, pull it and verify every byte (playbooks/collect.yml).

Per host: "verified: N files, X MB, SHA-256 match", or what failed (missing, unexpected and mismatched files
named), then a `log <path>: <reason>` line for each log the seal capped or could not seal. `--verify-only`
re-verifies the local copy without touching the box. Exit codes: 3 a host key does not match its pin, else 1 any
closeout/transfer/verification failure, else 4 any unreachable host, else 0.
"""

from __future__ import annotations

import argparse
import json
import re
import sys

from rich.console import Console
from rich.markup import escape

from rgt import errors
from rgt.safetext import printable

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


def log_notes(doc: dict) -> list[str]:
    """The closeout's word on each log it capped or could not seal (module_utils/rgt_seal.log_warnings)."""
    from rgt import paths

    return paths.module_util("rgt_seal").log_warnings(doc.get("logs"))


def host_line(name: str, doc: dict) -> str:
    notes = "".join(f"\n  log {printable(note)}" for note in log_notes(doc))
    if doc.get("verified"):
        mb = (doc.get("bytes") or 0) / 1e6
        repaired = doc.get("repaired") or []
        fixed = f" (re-sent {len(repaired)} file(s) changed locally: {_named(repaired)})" if repaired else ""
        return printable(f"{name}: verified: {doc.get('files')} files, {mb:.1f} MB, SHA-256 match -> "
                         f"{doc.get('dest')}{fixed}") + notes
    return f"{name}: NOT verified: {printable(what_failed(doc))}{notes}"  # the box's messages and file names


def host_doc(name: str, outcome) -> dict:
    """One host's (or one cell's) pull: its collect report, or why there is none."""
    if outcome is None:
        return {"host": name, "verified": False, "error": "the collect play returned nothing for this host"}
    if outcome.unreachable:
        return {"host": name, "verified": False, "unreachable": True,
                "error": (outcome.messages or ["unreachable"])[-1][:600]}
    doc = dict(outcome.results.get("collect_report") or {"host": name, "verified": False})
    if outcome.failed and not doc.get("error"):
        doc["error"] = (outcome.messages or ["failed"])[-1][:600]
    doc["verified"] = bool(doc.get("verified")) and not outcome.failed
    return doc


def sweep_manifest(root, host, entry: dict, console: Console) -> str | None:
    """After a sweep host's pull: `<runs>/<sweep>/<host>.SWEEP_VERIFIED.json` (atomic) lists every cell of the
    host's roster with its verified pull (files, bytes, the manifest's SHA-256 from each cell's PULL_VERIFIED
    marker), written only when every one is verified; otherwise the cells that are not are named (and none is
    written: a stale one is removed). Returns the path written, or None."""
    from rgt.ledger import atomic_write_json, read_json

    path = root / host.sweep / f"{host.name}.SWEEP_VERIFIED.json"
    expected = [c["run_id"] for c in host.recalled["cells"]]
    markers = {cell: read_json(root / cell / f"{host.name}.PULL_VERIFIED.json") for cell in expected}
    missing = [c for c in expected if not (entry["cells"].get(c) or {}).get("verified") or not markers[c]]
    if missing:
        path.unlink(missing_ok=True)
        console.print(f"[red]sweep {host.sweep} on {host.name}: {len(expected) - len(missing)}/{len(expected)} cells "
                      f"verified; not verified: {', '.join(missing)}[/red]")
        return None
    atomic_write_json(path, {"schema": "rgt/sweep-verified/v1", "sweep": host.sweep, "host": host.name,
                             "instance_id": str(host.instance_id), "cells": {
                                 c: {k: markers[c].get(k) for k in ("files", "bytes", "manifest_sha256",
                                                                    "verified_at")} for c in expected}})
    console.print(f"[green]sweep {host.sweep} on {host.name}: every cell of its roster verified ({len(expected)}) "
                  f"-> {path}[/green]")
    return str(path)


def rounds(hosts: list) -> list[list]:
    """The collect plays of a pull: every host in the first; a sweep host once per cell (its k-th cell in the
    k-th play)."""
    if not hosts:
        return []
    most = max([len(h.recalled["cells"]) for h in hosts if h.sweep] or [1])
    return [[h for h in hosts if (h.sweep and k < len(h.recalled["cells"])) or (not h.sweep and k == 0)]
            for k in range(most)]


def cmd_pull(args: argparse.Namespace, console: Console) -> int:
    from rgt import k8s_run
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
    docs: dict[str, dict] = {}
    results = []
    by_name = {h.name: h for h in hosts}
    on_cluster, boxes = k8s_run.split(hosts)
    if on_cluster:  # seal on the claim, copy through a helper pod, verify here (rgt.k8s_run)
        results.append(k8s_run.pull(on_cluster, root, bool(args.verify_only), console))
        for host in on_cluster:
            docs[host.name] = host_doc(host.name, results[-1].hosts.get(host.name))
            console.print(f"[{'green' if docs[host.name]['verified'] else 'red'}]"
                          f"{escape(host_line(host.name, docs[host.name]))}[/]")
    for index, members in enumerate(rounds(boxes)):  # a sweep host pulls one cell per round: collect is per run
        for host in members:
            if host.sweep:
                host.recalled = {**host.recalled, "job": host.recalled["cells"][index]}
        result = run_playbook(playbook, args.inventory, members, ledger=ledger, console=console,
                              extravars=extravars,
                              limit=",".join(h.name for h in members) if index or on_cluster else args.limit,
                              quiet=not args.verbose, verbosity=args.verbose or 0)
        results.append(result)
        for host in members:
            doc = host_doc(host.name, result.hosts.get(host.name))
            label = host.name
            if host.sweep:
                cell = host.recalled["job"]["run_id"]
                label = f"{host.name}:{cell}"
                docs.setdefault(host.name, {"host": host.name, "sweep": host.sweep, "cells": {}})["cells"][cell] = doc
            else:
                docs[host.name] = doc
            console.print(f"[{'green' if doc['verified'] else 'red'}]{escape(host_line(label, doc))}[/]")
    for name, entry in docs.items():
        if by_name[name].sweep:
            cells = entry["cells"].values()
            entry.update(verified=all(c["verified"] for c in cells), files=sum(c.get("files") or 0 for c in cells),
                         bytes=sum(c.get("bytes") or 0 for c in cells),
                         unverified=sorted(k for k, c in entry["cells"].items() if not c["verified"]))
            if not args.verify_only:
                entry["sweep_manifest"] = sweep_manifest(root, by_name[name], entry, console)
    result = results[0]
    code = errors.worst(r.exit_code for r in results)
    # a sweep host: every cell; one page per sweep (a Kubernetes host's report needs its box's records: not made)
    verified = [h for h in boxes if docs[h.name]["verified"]]
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


