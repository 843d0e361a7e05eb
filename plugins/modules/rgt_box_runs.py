#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: rgt contributors
# SPDX-License-Identifier: Apache-2.0
"""Ansible module: every rgt run on the box, with its state and its export, in one read-only round trip."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: rgt_box_runs
short_description: List every rgt run on the box (all projects) with its state and export, read-only
version_added: "0.1.0"
description:
  - Walks C(<durable_root>/*/active/*) (every project, not one run) and C(<durable_root>/*/export/), in one round
    trip, and reports each run with its project, run id, run directory, state and attempt, and its export
    (sealed or not, manifest present, the manifest's SHA-256 and bytes), so that the teardown gate
    (C(rgt.remote_gpu.rgt_teardown), the runner's plan) can judge the whole box and re-verify each local pull
    against the manifest now on the box.
  - "State: C(live) when another process holds the run's C(.rgt/lock) (the wrapper holds that flock for its
    whole life), else how the run ended from C(.rgt/attempts.jsonl) and C(.rgt/exit.json): C(never),
    C(finished), C(failed), C(preempted), C(killed) or C(dead) (started, with no exit record for its last
    attempt), or C(queued) for a sweep cell that the sweep's live queue on the box will still start. An export
    sealed under C(export/) whose run directory is gone is reported with state C(exported)."
  - A directory under C(active/) whose name is not a run id (or a project directory whose name is not a project
    name) is reported in C(not_runs) as not an rgt run dir, never crashed on. Dot-files in C(export/)
    (C(.partial/), temporary files of atomic writes) are not exports and are skipped.
  - C(~) and C({user}) in I(durable_root) and in the I(mounts) paths are expanded on the box (the login user).
  - Read-only; never changes anything on the box.
options:
  durable_root:
    description: The durable root of the run layout (C(rgt_durable_root), else the profile's C(roots.durable));
      may start with C(~) and contain C({user}).
    type: str
    required: true
  mounts:
    description: The profile's C(mounts) (C(path), C(survives)); the longest one holding the durable root is
      returned as C(durable_mount), so the gate can say whether the verb deletes the runs' files.
    type: list
    elements: dict
    default: []
notes:
  - Check mode is supported; the module never changes anything, so it runs the same in check mode.
author:
  - rgt contributors
"""

EXAMPLES = r"""
- name: List every run on the box
  rgt.remote_gpu.rgt_box_runs:
    durable_root: /root/autodl-tmp
    mounts: "{{ teardown_profile.mounts }}"
  register: teardown_box
"""

RETURN = r"""
box:
  description: The listing.
  returned: always
  type: dict
  contains:
    durable_root:
      description: The durable root, expanded on the box.
      type: str
    exists:
      description: Whether the durable root exists (absent = no runs).
      type: bool
    durable_mount:
      description: The profile mount holding the durable root (C(path) expanded, C(survives), C(role)), or null.
      type: dict
    runs:
      description: "One entry per run: C(project), C(run_id), C(run_dir) (null for an export without a run
        directory), C(state), C(attempt), C(export) {C(path), C(sealed), C(manifest), C(manifest_path),
        C(manifest_sha256), C(manifest_b64), C(manifest_error)}, C(slurm_job_id) (the job a run submitted through
        sbatch recorded in C(.rgt/slurm.json), else null), C(sweep) (the sweep a cell belongs to, from
        C(.rgt/sweep.json), else null), C(offload) (the run's C(OFFLOAD_VERIFIED.json): its sealed export offloaded
        and verified, docs/offload.md; else null)."
      type: list
      elements: dict
    sweeps:
      description: "The roster of each sweep on the box, keyed C(<project>/<name>): C(roster) (the path of
        C(<project>/sweeps/<name>/roster.json)), C(cells) {cell id - the inventory host the roster places it on}."
      type: dict
    not_runs:
      description: "Entries under C(active/) or C(export/) that are not rgt runs: C(path), C(name), C(project),
        C(reason)."
      type: list
      elements: dict
"""

import base64
import hashlib
import os

from ansible.module_utils.basic import AnsibleModule

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


def main():
    module = AnsibleModule(
        argument_spec=dict(
            durable_root=dict(type="str", required=True),
            mounts=dict(type="list", elements="dict", default=[]),
        ),
        supports_check_mode=True,
    )
    module.exit_json(changed=False, box=list_box(module.params["durable_root"], module.params["mounts"]))


if __name__ == "__main__":
    main()
