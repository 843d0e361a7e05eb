"""The ledger remembers what was launched where, so later commands need no `-e @job.yml` again.

`<ledger>/runs/<host>.json` (atomic): {"schema": "rgt/runs/v1", "host", "instance_id", "runs": {"<project>/<run_id>":
{"run_id", "project", "job" (the job spec as launched: names of secrets only, local paths absolute), "instance_id"
(the box it was launched on), "sweep" (a sweep's cell: the sweep's name, else null), "launched_at" (the newest
attempt's launch), "first_launched_at" (the run's first), "attempt", "state", "detach", "session", "code_dir" (on
the box), "recorded_at"}}}; a run `rgt-run move` took away: "moved_to", "moved_at", "generation" (and "fence",
"fenced_at" once watch fenced it) on the old host, "generation", "moved_from", "move" on the new one (rgt.move).
Written after every train or launch play for each host whose launch reported a run (each cell of a sweep too); read
by every command that acts on runs already launched and by `rgt-run runs`.

A host's runs (`host_runs`, the one list every command acts on): every run remembered for it (its project, its
current instance) and every cell a sweep's roster (`<ledger>/sweeps/<project>/<name>.json`, rgt.rosters) places on
it, newest first. A host with no job spec (none with -e, none in the inventory) acts on all of them (`recall`):
status and watch look at each, watch resumes each, pull pulls each. A job spec given on the command line or in the
inventory still wins and narrows the command to that job. A record that cannot be read is refused (exit 2, the
file named), never taken for "no runs".
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

from rgt import jobspec, rosters
from rgt.errors import InputError
from rgt.ledger import atomic_write_json, read_record

# the plays that look at or collect a run already launched: a host without a job spec acts on its remembered runs
RECALLING_PLAYBOOKS = ("monitor", "collect", "teardown", "launch_detached")
# the plays that launch: they act on one launch unit per host (a run, or a sweep's share) and remember what started
LAUNCHING_PLAYBOOKS = ("train", "launch_detached")

SCHEMA = "rgt/runs/v1"


def _path(ledger: Path, host: str) -> Path:
    return ledger / "runs" / f"{host}.json"


def run_key(project: str, run_id: str) -> str:
    return f"{project}/{run_id}"


def _problem(doc) -> str | None:
    if not isinstance(doc, dict) or doc.get("schema") != SCHEMA:
        return f"not an {SCHEMA} record"
    if not isinstance(doc.get("runs"), dict):
        return "it holds no `runs` mapping"
    for key, run in doc["runs"].items():
        if not isinstance(run, dict) or not run.get("run_id") or not isinstance(run.get("job"), dict):
            return f"its run {key!r} has no run_id or job"
    return None


def read_runs(ledger: Path, host: str) -> dict | None:
    """The host's record, or None when there is none. A damaged one (truncated, not JSON, another schema) is
    refused, exit 2 naming the file."""
    path = _path(ledger, host)
    return read_record(path, _problem, fix=f"restore {path} from a backup, or move it away: rgt then forgets the "
                                           f"runs it listed for {host} (give their job with -e @job.yml)")


def record_launch(ledger: Path, host: str, instance_id: str, project: str, job: dict, report: dict,
                  sweep: str | None = None) -> dict | None:
    """Remember (or refresh) one run of a host after its launch phase reported it. A record that became damaged
    since the command checked it is left as it is (the next command names it)."""
    try:
        doc = read_runs(ledger, host)
    except InputError:
        return None
    doc = doc or {"schema": SCHEMA, "host": host, "runs": {}}
    doc["instance_id"] = instance_id
    run_id = job.get("run_id") or job.get("name")
    key = run_key(project, run_id)
    previous = doc["runs"].get(key) or {}
    now = datetime.now(UTC).isoformat(timespec="seconds")
    entry = {
        "run_id": run_id, "project": project, "job": job, "instance_id": instance_id, "sweep": sweep,
        "launched_at": previous.get("launched_at") if report.get("action") in (None, "none") else now,
        "attempt": report.get("attempt"), "state": report.get("state"), "detach": report.get("detach"),
        "session": report.get("session"), "code_dir": report.get("code_dir"), "recorded_at": now}
    for kept in ("generation", "moved_from"):  # a move's fence (rgt.move) outlives the run's relaunches
        if previous.get(kept) is not None:
            entry[kept] = previous[kept]
    if entry["launched_at"] is None:
        entry["launched_at"] = now
    # launched_at is the newest attempt's launch; the run started with its first one (`rgt-run runs`: started)
    entry["first_launched_at"] = (previous.get("first_launched_at") or previous.get("launched_at")
                                  or entry["launched_at"])
    doc["runs"][key] = entry
    atomic_write_json(_path(ledger, host), doc)
    return entry


def record_move(ledger: Path, old: str, new: str, project: str, run_id: str, generation: int, move: dict) -> None:
    """After `rgt-run move` started the run on `new`: the old host's entry says where the run went (`moved_to`,
    `moved_at`, its own `generation`: a stale attempt there is fenced by it), the new host's entry holds the run's
    generation and where it came from. The run is then one of the new host's runs only (host_runs)."""
    doc = read_runs(ledger, old)
    key = run_key(project, run_id)
    if doc and key in doc["runs"]:
        run = doc["runs"][key]
        run.update(moved_to=new, moved_at=move.get("at"), generation=int(run.get("generation") or 1))
        atomic_write_json(_path(ledger, old), doc)
    doc = read_runs(ledger, new)
    if doc and key in doc["runs"]:
        doc["runs"][key].update(generation=generation, moved_from=old, move=move)
        if move.get("sweep"):  # a sweep cell started there as one run: it stays a cell of its sweep
            doc["runs"][key]["sweep"] = move["sweep"]
        atomic_write_json(_path(ledger, new), doc)


def record_fence(ledger: Path, host: str, project: str, run_id: str, fence: dict) -> None:
    """The old host's entry of a moved run: what watch found and did there (`fence`, `fenced_at`): looked at once
    the box answered, its stale attempt stopped when it was live."""
    doc = read_runs(ledger, host)
    key = run_key(project, run_id)
    if doc and key in doc["runs"]:
        doc["runs"][key].update(fence=fence, fenced_at=datetime.now(UTC).isoformat(timespec="seconds"))
        atomic_write_json(_path(ledger, host), doc)


def arrival(ledger: Path, host: str, project: str, run_id: str) -> dict | None:
    """The move that brought `run_id` to `host` (the moves.jsonl line rgt.move keeps in the new host's entry), or
    None for a run that started there (or a record that cannot be read: the command that reads it names it)."""
    try:
        doc = read_runs(ledger, host)
    except InputError:
        return None
    run = ((doc or {}).get("runs") or {}).get(run_key(project, run_id)) or {}
    move = run.get("move")
    return move if run.get("moved_from") and isinstance(move, dict) else None


def move_words(move: dict) -> str:
    """`moved from rp (generation 2, attempt 2, resumed from step 30; work lost 12 steps)`: logs and the report."""
    ckpt = move.get("checkpoint") or {}
    lost = move.get("work_lost_steps")
    return (f"moved from {move.get('from')} (generation {move.get('generation')}, attempt {move.get('attempt')}, "
            f"resumed from step {ckpt.get('step')}; work lost "
            + (f"{lost} steps)" if lost is not None else "unknown: the old box never reported a step)"))


def moved_away(ledger: Path, host: str) -> list[dict]:
    """The runs of a host that `rgt-run move` took to another host (each with `moved_to` and `generation`)."""
    return [r for r in runs_of(ledger, host) if r.get("moved_to")]


def runs_of(ledger: Path, host: str) -> list[dict]:
    """The runs remembered for a host (every project and instance), newest launch first."""
    doc = read_runs(ledger, host)
    runs = list((doc or {}).get("runs", {}).values())
    return sorted(runs, key=lambda r: str(r.get("launched_at") or ""), reverse=True)


def hosts_remembered(ledger: Path) -> list[str]:
    folder = ledger / "runs"
    return sorted(p.stem for p in folder.glob("*.json")) if folder.is_dir() else []


def check_records(ledger: Path, hosts: list) -> None:
    """Before any box is touched: every host's record of runs reads (exit 2 naming a damaged one)."""
    for host in hosts:
        read_runs(ledger, host.name)


def remember_launches(ledger: Path, hosts: list, result) -> None:
    """After a play: remember every run a launch reported (train, launch_detached, a watch relaunch)."""
    for host in hosts:
        out = result.hosts.get(host.name)
        report = out.results.get("launch_detached_report") if out else None
        job = host.vars.get("rgt_job")
        if not isinstance(report, dict) or not report.get("state") or not isinstance(job, dict):
            continue
        job = jobspec.resolve_paths(job, host.job_base or Path.cwd())
        share = host.overlay.get("rgt_sweep")
        if share and isinstance(report.get("cells"), list):  # a sweep: each cell is a run of its own
            by_id = {c["id"]: c for c in share["cells"]}
            for cell in report["cells"]:
                if cell.get("run_id") in by_id:
                    record_launch(ledger, host.name, str(host.instance_id), host.project,
                                  rosters.cell_job(job, by_id[cell["run_id"]]),
                                  {**report, "attempt": cell.get("attempt"), "state": cell.get("state"),
                                   "session": None}, sweep=share.get("name"))
            continue
        record_launch(ledger, host.name, str(host.instance_id), host.project, job, report)


# ---------------------------------------------------------------- a host's runs

def host_runs(ledger: Path, host) -> list[dict]:
    """Every run the ledger knows on `host` (an inventory host), of the host's project: each run remembered for it on
    its current instance, and each cell a sweep's roster in the ledger places on it (launched or not yet). Newest
    first; a sweep's cells stay together, in roster order, at the sweep's newest launch. Each entry: {run_id,
    project, job (a cell: its job as one run), sweep (the cell's sweep, else None), launched_at}. Raises InputError
    for a damaged record."""
    project = host.project
    doc = read_runs(ledger, host.name) or {}
    instance = str(host.instance_id)
    remembered = {r["run_id"]: r for r in doc.get("runs", {}).values()
                  if r.get("project") == project and str(r.get("instance_id") or doc.get("instance_id")
                                                          or instance) == instance
                  and not r.get("moved_to")}  # a run `rgt-run move` took away is the new host's
    units: list[tuple[str, list[dict]]] = []
    taken: set[str] = set()
    for roster in rosters.project_rosters(ledger, project):
        mine = [c for c in roster["cells"] if c.get("host") == host.name and c["id"] not in taken]
        if not mine:
            continue
        entries = []
        for cell in mine:
            seen = remembered.get(cell["id"]) or {}
            job = seen.get("job") or rosters.cell_job(roster.get("job") or {}, cell)
            entries.append({"run_id": cell["id"], "project": project, "job": job, "sweep": roster["sweep"],
                            "launched_at": seen.get("launched_at")})
            taken.add(cell["id"])
        when = max([str(e["launched_at"] or "") for e in entries] + [str(roster.get("created_at") or "")])
        units.append((when, entries))
    for run_id, run in remembered.items():
        if run_id not in taken:
            units.append((str(run.get("launched_at") or ""), [
                {"run_id": run_id, "project": project, "job": run["job"], "sweep": run.get("sweep"),
                 "launched_at": run.get("launched_at")}]))
    units.sort(key=lambda unit: unit[0], reverse=True)
    return [entry for _when, entries in units for entry in entries]


def act_on(host, runs: list[dict]) -> None:
    """Point a host at these runs for a play that looks at runs: it acts on the first and reports the others in the
    same round trip (`other_runs`); `recalled["cells"]` holds every run's job, in order (pull runs one collect
    play per run), `recalled["runs"]` the entries themselves (rgt.memory.host_runs' shape)."""
    host.recalled = {"job": runs[0]["job"], "cells": [r["job"] for r in runs], "runs": runs}
    host.other_runs = [r["run_id"] for r in runs[1:]]
    host.vars = {**host.vars, "rgt_job": runs[0]["job"]}
    host.sweep = runs[0].get("sweep")


def runs_acted_on(host) -> list[dict]:
    """The runs a prepared host acts on, in order (recall or a sweep's expand), or [] when it acts on its own job
    spec (the runs are then the one that job names)."""
    return list((getattr(host, "recalled", None) or {}).get("runs") or [])


def units(runs: list[dict]) -> list[tuple[str, str]]:
    """The launch units of a host's runs, newest first: ("sweep", name) once per sweep, ("run", run_id) per single
    run."""
    out: list[tuple[str, str]] = []
    for run in runs:
        unit = ("sweep", run["sweep"]) if run.get("sweep") else ("run", run["run_id"])
        if unit not in out:
            out.append(unit)
    return out


def newest_units(runs_by_host: dict[str, list[dict]]) -> dict[str, tuple[str, str]]:
    """The default for a launching play given no job spec: each host's newest launch unit."""
    return {name: units(runs)[0] for name, runs in runs_by_host.items() if runs}


def unit_job(ledger: Path, host, unit: tuple[str, str], runs: list[dict]) -> dict:
    """The job spec that launches a unit on a host: a sweep's job (from its roster in the ledger), or the run's."""
    kind, name = unit
    if kind == "sweep":
        roster = rosters.read_roster(ledger, host.project, name)
        if roster is None or not isinstance(roster.get("job"), dict):
            raise InputError(f"host '{host.name}': the roster of sweep {name} is not in the ledger "
                             f"({rosters.roster_path(ledger, host.project, name)}), so its job is not known here",
                             fix="give the sweep's job with -e @job.yml", field="rgt_job")
        return rosters.roster_job(roster)
    run = next((r for r in runs if r["run_id"] == name), None)
    if run is None:
        raise InputError(f"host '{host.name}': no run {name} is remembered for it", fix="name a run `rgt-run "
                         "status` lists for the host, or give its job with -e @job.yml", field="rgt_job")
    return run["job"]


Chooser = Callable[[dict[str, list[dict]]], dict[str, tuple[str, str]]]


def recall(ledger: Path, hosts: list, launching: bool = False, choose: Chooser | None = None) -> list:
    """Give each host that has no job spec (none with -e, none in the inventory) the runs the ledger knows on it
    (host_runs). A play that looks at runs acts on all of them (act_on); a launching play on one launch unit per
    host, the one `choose` picks ({host: unit} from {host: runs}; default each host's newest). Returns the hosts
    that got runs."""
    wanting = [h for h in hosts if not isinstance(h.vars.get("rgt_job"), dict)]
    runs = {h.name: host_runs(ledger, h) for h in wanting}
    recalled = []
    if launching:
        picked = (choose or newest_units)({name: r for name, r in runs.items() if r})
        for host in wanting:
            unit = picked.get(host.name)
            if unit is None:
                continue
            job = unit_job(ledger, host, unit, runs[host.name])
            host.recalled = {"job": job}
            host.vars = {**host.vars, "rgt_job": job}
            recalled.append(host)
        return recalled
    for host in wanting:
        if runs[host.name]:
            act_on(host, runs[host.name])
            host.recalled["remembered"] = True  # from the ledger, not a job spec given (watch relaunches by run)
            recalled.append(host)
    return recalled
