"""A sweep's roster as the ledger keeps it: `<ledger>/sweeps/<project>/<name>.json` (which cell runs on which host,
and the sweep's job), read back with a damaged one refused (exit 2, the file named); the job a roster keeps, and a
cell of it as an ordinary run's job spec.

Below both rgt.memory (a host's runs: the cells a roster places on it) and rgt.sweeps (placement, the launch's share,
the tally), which keep and read rosters through this module.
"""

from __future__ import annotations

import json
from pathlib import Path

from rgt import paths
from rgt.errors import InputError
from rgt.ledger import atomic_write_bytes, read_record

ROSTER_SCHEMA = "rgt/roster/v1"


def roster_path(ledger: Path, project: str, name: str) -> Path:
    return ledger / "sweeps" / project / f"{name}.json"


def _roster_problem(doc) -> str | None:
    if not isinstance(doc, dict) or doc.get("schema") != ROSTER_SCHEMA:
        return f"not an {ROSTER_SCHEMA} roster"
    if not isinstance(doc.get("cells"), list) or not all(
            isinstance(c, dict) and isinstance(c.get("id"), str) and isinstance(c.get("host"), str)
            for c in doc["cells"]):
        return "its cells are not a list of {id, host}"
    if "job" in doc and not isinstance(doc["job"], dict):
        return "its job is not a mapping"
    return None


def _read(path: Path) -> dict | None:
    return read_record(path, _roster_problem, fix=f"restore {path} from a backup, or move it away: the next train "
                       "then keeps each cell on the host the ledger's runs and the boxes' own roster of the sweep "
                       "name (a cell never moves to another host)")


def read_roster(ledger: Path, project: str, name: str) -> dict | None:
    """The sweep's roster in the ledger, or None when there is none; a damaged one is refused (exit 2)."""
    return _read(roster_path(ledger, project, name))


def project_rosters(ledger: Path, project: str) -> list[dict]:
    """Every roster of a project in the ledger (a damaged one is refused), newest first."""
    folder = ledger / "sweeps" / project
    docs = [_read(p) for p in sorted(folder.glob("*.json"))] if folder.is_dir() else []
    return sorted((d for d in docs if d), key=lambda d: str(d.get("created_at") or ""), reverse=True)


def roster_job(roster: dict) -> dict | None:
    """The sweep's job as its roster keeps it, with `sweep.matrix` in the order its cells' run ids name the keys (a
    roster written with sorted keys lost that order, and another order makes other run ids)."""
    job = roster.get("job")
    matrix = ((job or {}).get("sweep") or {}).get("matrix")
    name = (job or {}).get("run_id") or (job or {}).get("name")
    if not isinstance(matrix, dict) or len(matrix) < 2 or not name:
        return job
    for cell in roster.get("cells") or []:
        keys = [part.split("=", 1)[0] for part in str(cell["id"])[len(name) + 2:].split("--")]
        if sorted(keys) == sorted(matrix):  # a cell of the matrix names exactly its keys, in their order
            return {**job, "sweep": {**job["sweep"], "matrix": {k: matrix[k] for k in keys}}}
    return job


def cell_job(job: dict, cell: dict) -> dict:
    """A cell of the roster as an ordinary run's job spec (module_util rgt_sweep.cell_job: one rule with the box)."""
    return paths.module_util("rgt_sweep").cell_job(job, cell)


def cell_of(ledger: Path, project: str, name: str, cell_id: str) -> dict:
    """The roster's entry of one cell ({id, host, ...}); InputError (exit 2) when the ledger keeps no roster of the
    sweep or it holds no such cell."""
    roster = read_roster(ledger, project, name)
    cell = next((c for c in (roster or {}).get("cells") or [] if c["id"] == cell_id), None)
    if cell is None:
        raise InputError(f"{cell_id} is no cell of the roster of sweep {name} in the ledger "
                         f"({roster_path(ledger, project, name)})", fix="name a cell as `rgt-run status` lists it",
                         field="RUN")
    return cell


def move_cell(ledger: Path, project: str, name: str, cell_id: str, host: str) -> None:
    """`rgt-run move` of a sweep cell: the roster places the cell on `host` from now on (atomic); a later train,
    watch or retry keeps it there (rgt.sweeps.plan keeps a roster's hosts), and the old host's share leaves it out."""
    roster = read_roster(ledger, project, name)
    for cell in (roster or {}).get("cells") or []:
        if cell["id"] == cell_id:
            cell["host"] = host
    if isinstance((roster or {}).get("hosts"), dict):  # {host: [ids]}: the cell leaves its old host's list
        by_host = {h: [c for c in ids if c != cell_id] for h, ids in roster["hosts"].items()}
        by_host[host] = [*by_host.get(host, []), cell_id]
        roster["hosts"] = by_host
    if roster is not None:  # keys in the order read: the order of sweep.matrix is part of every cell's run id
        atomic_write_bytes(roster_path(ledger, project, name),
                           (json.dumps(roster, indent=2, default=str) + "\n").encode())
