# -*- coding: utf-8 -*-
# Copyright: rgt contributors
# SPDX-License-Identifier: Apache-2.0
"""Every rgt run on a box (all projects) with its state and its export, read-only: the listing the teardown gate
judges (the rgt_box_runs module returns it; module_utils/rgt_gate) and the box's own in-box stop rule reads
(module_utils/rgt_inbox, from the job wrapper). One home for what "a run on the box" is.

Python 3.6+, stdlib only (bundled into the wrapper by module_utils/rgt_bundle).
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import base64
import hashlib
import os

from ansible_collections.rgt.remote_gpu.plugins.module_utils import rgt_offload, rgt_slurm, rgt_sweep
from ansible_collections.rgt.remote_gpu.plugins.module_utils.rgt_runlayout import (
    RunPaths,
    check_name,
    expand_root,
    last_state,
    lock_held,
    read_json,
    read_jsonl,
    sweep_queue,
    will_start,
)

MANIFEST_SUFFIX = ".manifest.json"


def _listdir(path):
    try:
        return sorted(os.listdir(path))
    except OSError:
        return []


def _isdir(path):
    return os.path.isdir(path) and not os.path.islink(path)


def durable_mount(root, mounts):
    """The mount (profile entry, path expanded) with the longest path holding `root`, or None."""
    best = None
    for mount in mounts or []:
        if not isinstance(mount, dict) or not mount.get("path"):
            continue
        path = expand_root(str(mount["path"]))
        inside = path == "/" or root == path or root.startswith(path.rstrip("/") + "/")
        if inside and (best is None or len(path) > len(best["path"])):
            best = {"path": path, "survives": list(mount.get("survives") or []), "role": mount.get("role")}
    return best


def export_info(export_dir, run_id):
    capsule = os.path.join(export_dir, run_id)
    manifest = os.path.join(export_dir, run_id + MANIFEST_SUFFIX)
    info = {"path": capsule, "sealed": _isdir(capsule), "manifest": os.path.lexists(manifest),
            "manifest_path": manifest, "manifest_sha256": None, "manifest_b64": None, "manifest_error": None}
    if info["manifest"]:
        try:
            with open(manifest, "rb") as handle:
                raw = handle.read()
        except (IOError, OSError) as exc:
            info["manifest_error"] = "cannot read %s: %s" % (manifest, exc)
        else:
            info["manifest_sha256"] = hashlib.sha256(raw).hexdigest()
            info["manifest_b64"] = base64.b64encode(raw).decode("ascii")
    return info


def _attempt(records, exit_doc):
    started = [r.get("attempt") for r in records if "started_at" in r and isinstance(r.get("attempt"), int)]
    if started:
        return max(started)
    if isinstance(exit_doc, dict) and isinstance(exit_doc.get("attempt"), int):
        return exit_doc["attempt"]
    return None


def describe_run(paths):
    records = [r for r in read_jsonl(paths.attempts) if isinstance(r, dict)]
    exit_doc = read_json(paths.exit)
    exit_doc = exit_doc if isinstance(exit_doc, dict) else None
    attempt = _attempt(records, exit_doc)
    if lock_held(paths.lock):
        state = "live"
        pid = read_json(paths.pid)
        if isinstance(pid, dict) and isinstance(pid.get("attempt"), int):
            attempt = pid["attempt"]
    else:
        state = last_state(records, exit_doc)
        if state != "finished" and will_start(sweep_queue(paths), paths.run_id):
            state = "queued"  # a sweep's live queue will start it: it counts as live for the gate
    slurm = rgt_slurm.read_record(paths.meta)  # a run submitted through sbatch: its job (teardown cancels it)
    return {"project": paths.project, "run_id": paths.run_id, "run_dir": paths.run_dir, "state": state,
            "attempt": attempt, "export": export_info(paths.export_dir, paths.run_id),
            "slurm_job_id": str(slurm["job_id"]) if slurm and slurm.get("job_id") else None,
            "sweep": (read_json(os.path.join(paths.meta, "sweep.json")) or {}).get("sweep"),
            # the sealed export offloaded and verified (module_utils/rgt_offload; the teardown gate checks the target)
            "offload": _offload_verified(paths.run_dir)}


def _offload_verified(run_dir):
    doc = read_json(os.path.join(run_dir, rgt_offload.VERIFIED))
    return doc if isinstance(doc, dict) else None


def list_project(root, project, runs, not_runs):
    project_dir = os.path.join(root, project)
    active = os.path.join(project_dir, "active")
    export = os.path.join(project_dir, "export")
    found = {}
    for name in _listdir(active):
        path = os.path.join(active, name)
        if not os.path.isdir(path):
            continue
        try:
            paths = RunPaths(root, project, name)
        except ValueError as exc:
            not_runs.append({"path": path, "name": name, "project": project,
                             "reason": "not an rgt run dir (%s)" % exc})
            continue
        found[name] = describe_run(paths)
    for name in _listdir(export):
        if name.startswith("."):
            continue  # .partial/ (candidates being built), temporary files of atomic writes
        path = os.path.join(export, name)
        if name.endswith(MANIFEST_SUFFIX) and not os.path.isdir(path):
            run_id = name[:-len(MANIFEST_SUFFIX)]
        elif os.path.isdir(path):
            run_id = name
        else:
            continue
        if run_id in found:
            continue
        problem = check_name(run_id, "run id")
        if problem:
            not_runs.append({"path": path, "name": name, "project": project,
                             "reason": "not an rgt export (%s)" % problem})
            continue
        found[run_id] = {"project": project, "run_id": run_id, "run_dir": None, "state": "exported",
                         "attempt": None, "export": export_info(export, run_id)}
    runs.extend(found[k] for k in sorted(found))


def list_sweeps(root, project, sweeps):
    """The roster of each sweep of a project on this box (<project>/sweeps/<name>/roster.json, read by
    rgt_sweep.box_roster: one reading for the gate and the runner's placement): its cells, keyed <project>/<name>."""
    base = os.path.join(root, project, "sweeps")
    for name in _listdir(base):
        try:
            roster = rgt_sweep.box_roster({"durable_root": root, "project": project, "sweep": name})
        except ValueError:
            continue  # not a sweep rgt could have named
        if roster is not None:
            sweeps["%s/%s" % (project, name)] = {"roster": os.path.join(base, name, "roster.json"),
                                                 "cells": roster["cells"]}


def list_box(durable_root, mounts):
    root = expand_root(durable_root)
    box = {"durable_root": root, "exists": os.path.isdir(root), "durable_mount": durable_mount(root, mounts),
           "runs": [], "not_runs": [], "sweeps": {}}
    for project in _listdir(root):
        project_dir = os.path.join(root, project)
        if not os.path.isdir(project_dir):
            continue
        if not (os.path.isdir(os.path.join(project_dir, "active")) or
                os.path.isdir(os.path.join(project_dir, "export"))):
            continue  # caches and other files beside the projects
        problem = check_name(project, "project")
        if problem:
            box["not_runs"].append({"path": project_dir, "name": project, "project": None,
                                    "reason": "not an rgt project dir (%s)" % problem})
            continue
        list_project(root, project, box["runs"], box["not_runs"])
        list_sweeps(root, project, box["sweeps"])
    return box
