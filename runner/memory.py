"""The ledger remembers what was launched where, so later commands need no `-e @job.yml` again.

`<ledger>/runs/<host>.json` (atomic): {"schema": "rgt/runs/v1", "host", "instance_id", "runs": {"<project>/<run_id>":
{"run_id", "project", "job" (the job spec as launched: names of secrets only, local paths absolute),
"launched_at" (the newest attempt's launch), "first_launched_at" (the run's first), "attempt", "state", "detach",
"session", "code_dir" (on the box)}}}. Written after every train or launch play for each host whose launch
reported a run; read by status, watch, pull and `rgt-run runs`. A job spec given on the command line or in the
inventory still wins.
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

from rgt import jobspec
from rgt.ledger import atomic_write_json, read_json
from rgt.sweeps import cell_job

# the plays that look at or collect a run already launched: a host without a job spec gets its remembered one
RECALLING_PLAYBOOKS = ("monitor", "collect", "teardown", "launch_detached")

SCHEMA = "rgt/runs/v1"


def _path(ledger: Path, host: str) -> Path:
    return ledger / "runs" / f"{host}.json"


def run_key(project: str, run_id: str) -> str:
    return f"{project}/{run_id}"


def record_launch(ledger: Path, host: str, instance_id: str, project: str, job: dict, report: dict) -> dict:
    """Remember (or refresh) one run of a host after its launch phase reported it."""
    doc = read_json(_path(ledger, host))
    if not isinstance(doc, dict) or doc.get("schema") != SCHEMA or not isinstance(doc.get("runs"), dict):
        doc = {"schema": SCHEMA, "host": host, "runs": {}}
    doc["instance_id"] = instance_id
    run_id = job.get("run_id") or job.get("name")
    key = run_key(project, run_id)
    previous = doc["runs"].get(key) or {}
    doc["runs"][key] = {
        "run_id": run_id, "project": project, "job": job,
        "launched_at": previous.get("launched_at") if report.get("action") in (None, "none")
        else datetime.now(UTC).isoformat(timespec="seconds"),
        "attempt": report.get("attempt"), "state": report.get("state"), "detach": report.get("detach"),
        "session": report.get("session"), "code_dir": report.get("code_dir"),
        "recorded_at": datetime.now(UTC).isoformat(timespec="seconds")}
    if doc["runs"][key]["launched_at"] is None:
        doc["runs"][key]["launched_at"] = doc["runs"][key]["recorded_at"]
    # launched_at is the newest attempt's launch; the run started with its first one (`rgt-run runs`: started)
    doc["runs"][key]["first_launched_at"] = (previous.get("first_launched_at") or previous.get("launched_at")
                                             or doc["runs"][key]["launched_at"])
    atomic_write_json(_path(ledger, host), doc)
    return doc["runs"][key]


def runs_of(ledger: Path, host: str) -> list[dict]:
    """The runs remembered for a host, newest launch first."""
    doc = read_json(_path(ledger, host))
    if not isinstance(doc, dict) or not isinstance(doc.get("runs"), dict):
        return []
    runs = [r for r in doc["runs"].values() if isinstance(r, dict) and isinstance(r.get("job"), dict)]
    return sorted(runs, key=lambda r: str(r.get("launched_at") or ""), reverse=True)


def hosts_remembered(ledger: Path) -> list[str]:
    folder = ledger / "runs"
    return sorted(p.stem for p in folder.glob("*.json")) if folder.is_dir() else []


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
                                  cell_job(job, by_id[cell["run_id"]]),
                                  {**report, "attempt": cell.get("attempt"), "state": cell.get("state"),
                                   "session": None})
            continue
        record_launch(ledger, host.name, str(host.instance_id), host.project, job, report)


def recall(ledger: Path, hosts: list) -> list:
    """Give each host that has no job spec (none with -e, none in the inventory) its newest remembered run of
    the host's project (the run the plays act on) and the ids of the older ones (status reports them too, in the
    same round trip). Returns the hosts that got one."""
    recalled = []
    for host in hosts:
        if isinstance(host.vars.get("rgt_job"), dict):
            continue
        project = host.project
        runs = [r for r in runs_of(ledger, host.name) if r.get("project") == project]
        if runs:
            host.recalled = runs[0]
            host.other_runs = [r["run_id"] for r in runs[1:]]
            host.vars = {**host.vars, "rgt_job": runs[0]["job"]}
            recalled.append(host)
    return recalled
