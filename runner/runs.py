"""`rgt-run runs`: what the ledger knows about every run it launched, without touching any box.

One row per run: host, run id, state (the last status seen, else the launch's), attempts, started, wall time, cost
so far (price per hour x wall time), and the pull state (verified / pulled, not verified / not pulled). `--json`
prints the same rows. Run `rgt-run status` for a fresh look at the boxes.
"""

from __future__ import annotations

import argparse
import json
from datetime import UTC, datetime
from pathlib import Path

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from rgt import errors, memory
from rgt.ledger import ledger_dir, read_json, runs_dir
from rgt.safetext import printable

HELP = "list the runs this project launched (from the local ledger; touches no box)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--runs-dir", metavar="DIR", help="where verified pulls land (default $RGT_RUNS_DIR or ./runs)")


def _parse_time(value: object) -> float | None:
    if not isinstance(value, str) or not value:
        return None
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def pull_state(runs: Path, run_id: str, host: str) -> str:
    marker = read_json(runs / run_id / f"{host}.PULL_VERIFIED.json")
    if isinstance(marker, dict) and marker.get("run_id") == run_id:
        return "verified"
    if (runs / run_id / host).is_dir():
        return "pulled, not verified"
    return "not pulled"


def _seen_run(seen: object, run_id: object) -> dict:
    """The last status seen of this run: the host's document, or one of the other runs seen beside it."""
    if not isinstance(seen, dict):
        return {}
    for doc in (seen, *(seen.get("other_runs") or [])):
        if isinstance(doc, dict) and doc.get("run_id") == run_id:
            return doc
    return {}


def rows(ledger: Path, runs: Path, limit: str | None = None, now: float | None = None) -> list[dict]:
    now = now if now is not None else datetime.now(UTC).timestamp()
    wanted = set((limit or "").replace(":", ",").split(",")) - {""}
    out = []
    for host in memory.hosts_remembered(ledger):
        if wanted and host not in wanted:
            continue
        seen = read_json(ledger / "status" / f"{host}.json")
        for run in memory.runs_of(ledger, host):
            job = run.get("job") or {}
            status = _seen_run(seen, run.get("run_id"))
            started = _parse_time(run.get("launched_at"))
            wall = status.get("elapsed_s")
            if wall is None and started is not None and status.get("state") in (None, "running", "stalled"):
                wall = max(0.0, now - started)
            price = job.get("price_per_hour")
            cost = status.get("cost_so_far")
            if cost is None and isinstance(price, (int, float)) and isinstance(wall, (int, float)):
                cost = round(price * wall / 3600.0, 4)
            out.append({"host": host, "run_id": run.get("run_id"), "project": run.get("project"),
                        "state": status.get("state") or run.get("state"),
                        "attempts": status.get("attempt") or run.get("attempt"),
                        "started": run.get("launched_at"), "wall_s": round(wall, 1) if wall is not None else None,
                        "cost_so_far": cost, "pull": pull_state(runs, str(run.get("run_id")), host),
                        "status_seen_at": status.get("seen_at")})
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
    if getattr(args, "json", False):
        print(json.dumps({"command": "runs", "ledger": str(ledger), "runs_dir": str(root), "runs": items,
                          "exit_code": errors.OK}, sort_keys=True))
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
    console.print(table)
    console.print("states are the last ones seen; `rgt-run status -i INV` looks again")
    return errors.OK
