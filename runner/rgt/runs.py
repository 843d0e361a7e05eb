"""`rgt-run runs`: what the ledger knows about every run it launched, without touching any box.

One row per run: host, run id, state, attempts, started (the run's first launch), wall time, cost so far (price per
hour x wall time) and the pull state (verified / pulled, not verified / not pulled). The state is the run's last
known one: a verified pull wins (the pulled copy says how the run ended and how long its attempts took), then the
last status seen of that run, then what its launch reported. Wall time and cost grow with the clock only while
the run bills (running, and not looked at since its launch); an ended run keeps what it cost. `--json` prints the
same rows. Run `rgt-run status` for a fresh look at the boxes.
"""

from __future__ import annotations

import argparse
from datetime import UTC, datetime
from pathlib import Path

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from rgt import errors, memory, output, paths
from rgt.ledger import ledger_dir, read_json, runs_dir
from rgt.safetext import printable

HELP = "list the runs this project launched (from the local ledger; touches no box)"
_states = paths.module_util("rgt_states")  # active: the run's box time still counts while it is in one of these


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--runs-dir", metavar="DIR", help="where verified pulls land (default $RGT_RUNS_DIR or ./runs)")


def _epoch(value: object) -> float | None:
    """Seconds since the epoch from an ISO-8601 string or a number (the box's one reading: rgt_reconcile)."""
    return paths.module_util("rgt_reconcile").to_epoch(value) if value not in (None, "") else None


def _iso(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, UTC).isoformat(timespec="seconds")


def pull_state(runs: Path, run_id: str, host: str) -> str:
    marker = read_json(runs / run_id / f"{host}.PULL_VERIFIED.json")
    if isinstance(marker, dict) and marker.get("run_id") == run_id:
        return "verified"
    if (runs / run_id / host).is_dir():
        return "pulled, not verified"
    return "not pulled"


def sealed_run(runs: Path, run_id: str, host: str) -> dict:
    """What the verified capsule says of the run (its run.json, written when it was sealed): how it ended and its
    attempts; {} when there is none."""
    doc = read_json(runs / run_id / host / "run.json")
    if not isinstance(doc, dict) or doc.get("run_id") != run_id:
        return {}
    attempts = [a for a in doc.get("attempts") or [] if isinstance(a, dict)]
    reconcile = paths.module_util("rgt_reconcile")
    starts = [t for t in (_epoch(a.get("started_at")) for a in attempts) if t is not None]
    numbers = [a["attempt"] for a in attempts if isinstance(a.get("attempt"), int)]
    end = doc.get("exit") if isinstance(doc.get("exit"), dict) else {}
    return {"state": end.get("reason") or "finished", "attempt": max(numbers) if numbers else None,
            "started": min(starts) if starts else None,
            "wall_s": reconcile.wall_seconds(attempts, 0.0) if starts else None}


def _seen_run(seen: object, run_id: object) -> dict:
    """The last status seen of this run: the host's document, one of the other runs seen beside it, or, when the
    box did not answer the last look, what it said the time before (rgt.observe.last_seen)."""
    if not isinstance(seen, dict):
        return {}
    for doc in (seen, *(seen.get("other_runs") or [])):
        if isinstance(doc, dict) and doc.get("run_id") == run_id:
            return doc
    before = seen.get("last_seen") if seen.get("state") == "unreachable" else None
    return before if isinstance(before, dict) and before.get("run_id") == run_id else {}


def one_row(host: str, run: dict, seen: dict, runs: Path, now: float) -> dict:
    """The row of one remembered run: its last known state (verified pull, else the status seen, else the launch),
    its first launch, and its wall time and cost (counting with the clock only while it bills)."""
    run_id = str(run.get("run_id"))
    job = run.get("job") or {}
    pull = pull_state(runs, run_id, host)
    sealed = sealed_run(runs, run_id, host) if pull == "verified" else {}
    launched = [t for t in (_epoch(run.get(k)) for k in ("first_launched_at", "launched_at")) if t is not None]
    first = min([*launched, *([sealed["started"]] if sealed.get("started") is not None else [])], default=None)
    price = job.get("price_per_hour")
    priced = isinstance(price, (int, float)) and not isinstance(price, bool)
    cost = None
    if pull == "verified":
        source, state = "pull", sealed.get("state") or "finished"
        attempts = sealed.get("attempt") or seen.get("attempt") or run.get("attempt")
        wall = sealed.get("wall_s") if sealed.get("wall_s") is not None else seen.get("elapsed_s")
        if sealed.get("wall_s") is None:
            cost = seen.get("cost_so_far")
    elif seen:
        source, state, attempts = "status", seen.get("state"), seen.get("attempt") or run.get("attempt")
        wall, cost = seen.get("elapsed_s"), seen.get("cost_so_far")
    else:
        source, state, attempts = "launch", run.get("state"), run.get("attempt")
        since = _epoch(run.get("launched_at"))  # the current attempt's launch: it bills from then while it runs
        wall = max(0.0, now - since) if since is not None and state in (*_states.ACTIVE, None) else None
    if cost is None and priced and isinstance(wall, (int, float)):
        cost = round(price * wall / 3600.0, 4)
    return {"host": host, "run_id": run.get("run_id"), "project": run.get("project"), "state": state,
            "state_from": source, "attempts": attempts, "started": _iso(first) if first is not None else None,
            "wall_s": round(wall, 1) if isinstance(wall, (int, float)) else None, "cost_so_far": cost, "pull": pull,
            "status_seen_at": seen.get("seen_at")}


def rows(ledger: Path, runs: Path, limit: str | None = None, now: float | None = None) -> list[dict]:
    now = now if now is not None else datetime.now(UTC).timestamp()
    wanted = set((limit or "").replace(":", ",").split(",")) - {""}
    out = []
    for host in memory.hosts_remembered(ledger):
        if wanted and host not in wanted:
            continue
        seen = read_json(ledger / "status" / f"{host}.json")
        for run in memory.runs_of(ledger, host):
            out.append(one_row(host, run, _seen_run(seen, run.get("run_id")), runs, now))
    return out


def _hms(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    seconds = int(seconds)
    return f"{seconds // 3600}:{seconds % 3600 // 60:02d}:{seconds % 60:02d}"


def run(args: argparse.Namespace, console: Console) -> int:
    ledger = ledger_dir(args.ledger)
    root = runs_dir(getattr(args, "runs_dir", None))
    items = rows(ledger, root, getattr(args, "limit", None))
    as_json = getattr(args, "json", False)
    output.emit({"command": "runs", "ledger": str(ledger), "runs_dir": str(root), "runs": items,
                 "exit_code": errors.OK}, as_json)
    if not items:
        console.print(f"no runs in the ledger {ledger} yet: launch one with `rgt-run playbooks/train.yml -i INV`")
        return errors.OK
    table = Table(show_edge=False, pad_edge=False)
    for col in ("host", "run", "state", "att", "started", "wall", "cost", "pull"):
        table.add_column(col, overflow="fold")
    for item in items:
        cost = item["cost_so_far"]
        table.add_row(item["host"], item["run_id"], escape(printable(item["state"] or "-")),  # as the box said
                      escape(printable(item["attempts"] or "-")),
                      str(item["started"] or "-"), _hms(item["wall_s"]),
                      f"{cost:.2f}" if isinstance(cost, (int, float)) else "-", item["pull"])
    output.results(as_json).print(table)
    console.print("states are the last ones known (a verified pull, else the last status seen, else the launch); "
                  "`rgt-run status -i INV` looks again")
    return errors.OK
