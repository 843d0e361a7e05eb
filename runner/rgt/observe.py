"""One look at every host's run, recorded in the ledger: what `rgt-run status`, each `watch` tick, `lifecycle`
(where to resume) and `report` see.

A box is looked at in one parallel round over multiplexed SSH (rgt.sshround: one read-only `python3` call per host
running the monitor module's own code); a host whose connection or status arguments are Ansible templates through
playbooks/monitor.yml (only Ansible can evaluate them), giving the same document; a Kubernetes host through kubectl
(rgt.k8s_run). Each host is looked at by its engine (rgt.engines.poll, Engine.observe); here are the documents'
shapes. Each host's document is kept in `<ledger>/status/<host>.json` (atomic) with one tick line appended to
`<host>.jsonl`; an unreachable host keeps what it said when it last answered.
"""

from __future__ import annotations

import argparse
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from rich.console import Console

from rgt import paths
from rgt.ledger import append_jsonl, atomic_write_json, read_json
from rgt.phases import run_playbook


def first_line(messages: list[str]) -> str:
    """The first non-blank line of a host's messages (300 characters at most), else ''."""
    for msg in messages or []:
        if msg and msg.strip():
            return msg.strip().splitlines()[0][:300]
    return ""


def host_doc(name: str, outcome, now: float) -> dict:
    """The per-host entry of a poll: the box's status document, or unreachable/error from the runner."""
    if outcome is None:
        return {"host": name, "state": "error", "error": "the monitor play returned nothing for this host"}
    if outcome.unreachable:
        doc = {"host": name, "state": "unreachable", "error": first_line(outcome.messages) or "unreachable"}
        if outcome.host_key_mismatch:
            doc["host_key_mismatch"] = True
        return doc
    report = outcome.results.get("monitor_status_report")
    if outcome.failed or not isinstance(report, dict):
        return {"host": name, "state": "error",
                "error": first_line(outcome.messages) or "the monitor play did not return a status document"}
    return seen_doc(name, report, now)


def round_doc(name: str, outcome, now: float) -> dict:
    """The per-host entry from the ssh round (rgt.sshround.Outcome): the same shapes as host_doc."""
    if outcome.unreachable:
        doc = {"host": name, "state": "unreachable", "error": outcome.error or "unreachable"}
        if outcome.host_key_mismatch:
            doc["host_key_mismatch"] = True
        return doc
    if not isinstance(outcome.status, dict):
        return {"host": name, "state": "error", "error": outcome.error or "no status document"}
    return seen_doc(name, outcome.status, now)


def seen_doc(name: str, report: dict, now: float) -> dict:
    """A box's status document as the runner keeps it: the inventory name as host, the box's as hostname."""
    doc = dict(report)
    doc["hostname"] = doc.get("host")
    doc["host"] = name
    doc["seen_at"] = now
    if report.get("other_runs"):  # older runs remembered on this host, from the same round trip
        doc["other_runs"] = [{**other, "hostname": other.get("host"), "host": name, "seen_at": now}
                             for other in report["other_runs"] if isinstance(other, dict)]
    return doc


def last_seen(ledger: Path, host: str) -> dict | None:
    """The last state the box itself reported (from <ledger>/status/<host>.json), if any."""
    prev = read_json(ledger / "status" / f"{host}.json")
    if not isinstance(prev, dict):
        return None
    if prev.get("state") == "unreachable":
        return prev.get("last_seen")
    if prev.get("seen_at") is None:
        return None
    return {"state": prev.get("state"), "seen_at": prev.get("seen_at"), "attempt": prev.get("attempt"),
            "step": prev.get("step"), "run_id": prev.get("run_id"), "elapsed_s": prev.get("elapsed_s"),
            "cost_so_far": prev.get("cost_so_far")}


def record(ledger: Path, host: str, doc: dict, now: float) -> dict:
    """Latest status per host (atomic) and one tick line appended; an unreachable host keeps its last seen."""
    if doc.get("state") == "unreachable":
        doc = {**doc, "at": now, "last_seen": last_seen(ledger, host)}
    atomic_write_json(ledger / "status" / f"{host}.json", doc)
    tick = {"t": now, "state": doc.get("state"), "attempt": doc.get("attempt"), "step": doc.get("step"),
            "loss": doc.get("loss"), "attention": [a.get("id") for a in doc.get("attention") or []],
            "error": doc.get("error")}
    append_jsonl(ledger / "status" / f"{host}.jsonl", tick)
    return doc


RECORD_THREADS = 16  # the hosts' records written at once: their fsyncs overlap (each waits on the disk, not the CPU)


def record_all(ledger: Path, docs: dict[str, dict], now: float) -> dict[str, dict]:
    """record() of every host's document, several at once: each host's two files are its own, each write as atomic
    and fsynced as alone; 16 hosts' 48 fsyncs one after another were 50-800 ms of a look on a shared disk."""
    if len(docs) < 2:
        return {host: record(ledger, host, doc, now) for host, doc in docs.items()}
    with ThreadPoolExecutor(max_workers=min(RECORD_THREADS, len(docs))) as pool:
        futures = {host: pool.submit(record, ledger, host, doc, now) for host, doc in docs.items()}
        return {host: future.result() for host, future in futures.items()}  # a refused write raises here


def poll_play(args: argparse.Namespace, console: Console, hosts: list, extravars: dict, ledger: Path) -> dict:
    """One monitor.yml run over `hosts`: {host: doc} (not recorded)."""
    playbook = paths.PLAYBOOKS_DIR / "monitor.yml"
    result = run_playbook(playbook, args.inventory, hosts, ledger=ledger, console=console, extravars=extravars,
                          limit=",".join(h.name for h in hosts), quiet=True, verbosity=args.verbose or 0)
    now = time.time()
    return {h.name: host_doc(h.name, result.hosts.get(h.name), now) for h in hosts}
