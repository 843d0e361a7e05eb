"""`rgt-run pull`: seal each box's finished run, pull it and verify every byte.

Which runs: with a job spec, the run it names (a sweep: each of its cells); without one, every run the ledger
remembers on each host (rgt.memory.host_runs: single runs and sweep cells). An SSH box pulls all of them in one
pull round (rgt.pullround: one seal call, one rsync, the verification here; the hosts in parallel); a host the
round cannot stand in for (a local connection, a value only Ansible can evaluate, --check) and a Kubernetes host
pull through their engine, one collect play (or seal pod) per run (playbooks/collect.yml). Per run:
"verified: N files, X MB, SHA-256 match", or what failed (missing, unexpected and mismatched files named), then a
`log <path>: <reason>` line for each log the seal capped or could not seal. `--verify-only` re-verifies the local
copy without touching the box. Exit codes: 3 a host key does not match its pin, else 1 any
closeout/transfer/verification failure, else 4 any unreachable host, else 0.
"""

from __future__ import annotations

import argparse
import re

from rich.console import Console
from rich.markup import escape

from rgt import engines, errors, memory, offloadpull, output, paths, pullround, runreport
from rgt.ledger import atomic_write_json, ledger_dir, read_json, runs_dir
from rgt.prepare import prepare
from rgt.safetext import printable

HELP = "seal each finished run, pull its results here and verify every file's SHA-256"
DESCRIPTION = """\
Seal each box's finished run, copy its results into your runs directory (./runs/<run>/<host>/ by default) and
verify every byte against the box's manifest. Without -e it pulls every run rgt launched on each box (each cell of
a sweep too); -e @job.yml pulls only that job's. Per run it says "verified: N files, X MB, SHA-256 match", or names
the files that are missing, unexpected or different. Running it again re-verifies and sends only what is missing.
`--verify-only` checks the local copy again without touching the box.
Exit codes: 3 a host key does not match its pin, else 1 a seal, copy or check failed, else 4 a box is
unreachable, else 0."""


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--runs-dir", metavar="DIR", help="where the results land (default $RGT_RUNS_DIR or ./runs)")
    p.add_argument("--verify-only", action="store_true", help="re-verify the local copy; do not touch the box")
    p.add_argument("--from-offload", action="store_true",
                   help="fetch each run's sealed export from its offload target instead of the box (the box may be "
                        "gone), verified the same way (docs/offload.md)")


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


def sweep_manifest(root, host, sweep: str, cells: list[str], entry: dict, console: Console) -> str | None:
    """After a pull of a sweep's cells on a host: `<runs>/<sweep>/<host>.SWEEP_VERIFIED.json` (atomic) lists every
    cell of the host's roster (`cells`) with its verified pull (files, bytes, the manifest's SHA-256 from each
    cell's PULL_VERIFIED marker), written only when every one is verified; otherwise the cells that are not are
    named (and none is written: a stale one is removed). Returns the path written, or None."""
    path = root / sweep / f"{host.name}.SWEEP_VERIFIED.json"
    markers = {cell: read_json(root / cell / f"{host.name}.PULL_VERIFIED.json") for cell in cells}
    missing = [c for c in cells if not (entry["runs"].get(c) or {}).get("verified") or not markers[c]]
    if missing:
        path.unlink(missing_ok=True)
        console.print(f"[red]sweep {sweep} on {host.name}: {len(cells) - len(missing)}/{len(cells)} cells "
                      f"verified; not verified: {', '.join(missing)}[/red]")
        return None
    atomic_write_json(path, {"schema": "rgt/sweep-verified/v1", "sweep": sweep, "host": host.name,
                             "instance_id": str(host.instance_id), "cells": {
                                 c: {k: markers[c].get(k) for k in ("files", "bytes", "manifest_sha256",
                                                                    "verified_at")} for c in cells}})
    console.print(f"[green]sweep {sweep} on {host.name}: every cell of its roster verified ({len(cells)}) "
                  f"-> {path}[/green]")
    return str(path)


def runs_to_pull(host) -> list[dict]:
    """The runs a prepared host pulls, in order: every run it acts on (rgt.memory.runs_acted_on: with no job spec,
    every run the ledger knows on it; with a sweep's job, each of its cells), else the one its job spec names."""
    return memory.runs_acted_on(host) or [{"run_id": None, "job": None, "sweep": None}]


def rounds(hosts: list) -> list[list]:
    """The collect plays of a pull (collect acts on one run per host): every host in the first, on its first run;
    a host with several runs once per run (its k-th run in the k-th play)."""
    if not hosts:
        return []
    most = max(len(runs_to_pull(h)) for h in hosts)
    return [[h for h in hosts if k < len(runs_to_pull(h))] for k in range(most)]


def _point_at(host, run: dict) -> None:
    """Make a host's play (and a Kubernetes host's engine) act on one of its runs."""
    if run.get("job") is not None:
        host.recalled = {**host.recalled, "job": run["job"]}
        host.vars = {**host.vars, "rgt_job": run["job"]}


def cmd_pull(args: argparse.Namespace, console: Console) -> int:
    if getattr(args, "from_offload", False):  # the target, not the box (runner/rgt/offloadpull.py)
        return offloadpull.cmd_pull_from_offload(args, console, runs_to_pull)
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
    pulled: dict[str, list[dict]] = {h.name: runs_to_pull(h) for h in hosts}
    several = {name for name, runs in pulled.items() if len(runs) > 1 or any(r.get("sweep") for r in runs)}

    def record(host, run: dict, doc: dict) -> None:
        label = host.name
        if host.name in several:
            run_id = run["run_id"] or (host.vars.get("rgt_job") or {}).get("run_id")
            label = f"{host.name}:{run_id}"
            entry = docs.setdefault(host.name, {"host": host.name, "runs": {}})
            entry["runs"][run_id] = doc
            if run.get("sweep"):
                entry.setdefault("cells", {})[run_id] = doc
                entry.setdefault("sweeps", {}).setdefault(run["sweep"], []).append(run_id)
        else:
            docs[host.name] = doc
        console.print(f"[{'green' if doc['verified'] else 'red'}]{escape(host_line(label, doc))}[/]")

    # the SSH boxes the pull round can reach: every run of a host sealed, moved and verified together, the hosts
    # in parallel (rgt.pullround); the others (a local connection, a host only Ansible can reach, Kubernetes)
    # through their engine, one run per host and round
    boxes = [h for engine, mine in engines.split(hosts) if engine.name == "ssh" for h in mine]
    by_round = pullround.eligible(args, boxes, pulled, extravars, _point_at)
    if by_round:
        result, outcomes = pullround.pull(args, by_round, pulled, extravars, root, _point_at, console)
        results.append(result)
        for host in by_round:
            for run, outcome in zip(pulled[host.name], outcomes[host.name], strict=True):
                _point_at(host, run)
                record(host, run, host_doc(host.name, outcome))
    rest = [h for h in hosts if h not in by_round]
    # a host with several runs (a sweep's cells, or every run the ledger remembers) pulls one run per round:
    # collect acts on one run; a Kubernetes host's engine the same way
    for index, members in enumerate(rounds(rest)):
        for host in members:
            _point_at(host, pulled[host.name][index])
        outcomes = []
        for engine, mine in engines.split(members):  # a box: the collect play; Kubernetes: a seal and helper pod
            results.append(engine.collect(playbook, mine, args, extravars, ledger, root, console))
            outcomes += [(h, results[-1]) for h in mine]
        for host, result in outcomes:
            record(host, pulled[host.name][index], host_doc(host.name, result.hosts.get(host.name)))
    for host in hosts:  # back on its first run (the report looks at it, and at the others beside it)
        _point_at(host, pulled[host.name][0])
    for name, entry in docs.items():
        if name in several:
            runs = entry["runs"].values()
            entry.update(verified=all(r["verified"] for r in runs), files=sum(r.get("files") or 0 for r in runs),
                         bytes=sum(r.get("bytes") or 0 for r in runs),
                         unverified=sorted(k for k, r in entry["runs"].items() if not r["verified"]))
            sweep_names = list(entry.get("sweeps") or {})
            if sweep_names:
                entry["sweep"] = sweep_names[0]
            if not args.verify_only:
                entry["sweep_manifests"] = {s: sweep_manifest(root, by_name[name], s, cells, entry, console)
                                            for s, cells in (entry.get("sweeps") or {}).items()}
                if sweep_names:
                    entry["sweep_manifest"] = entry["sweep_manifests"][sweep_names[0]]
    result = results[0]
    code = errors.worst(r.exit_code for r in results)
    # a sweep host: every cell; one page per sweep (a Kubernetes host's report needs its box's records: not made)
    verified = [h for engine, mine in engines.split(hosts) if engine.reports_after_pull for h in mine
                if docs[h.name]["verified"]]
    if verified and not args.verify_only:  # --verify-only promises not to touch the box; the report looks at it
        reports = runreport.after_pull(args, console, verified, extravars, ledger, root)
        for rep in reports:
            for name in rep["hosts"]:
                if name in docs:
                    docs[name]["report"] = rep["html"]
    console.print(f"exit {code} · runs {root}")
    output.emit({"command": "pull", "runs_dir": str(root), "hosts": docs, "exit_code": code,
                 "phase": result.as_dict()}, args.json)
    return code


