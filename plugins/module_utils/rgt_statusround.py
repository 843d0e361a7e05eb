# -*- coding: utf-8 -*-
# Copyright: rgt contributors
# SPDX-License-Identifier: Apache-2.0
"""The box side of the runner's status round (runner/rgt/sshround.py): the `__main__.py` of the status zipapp
(module_utils/rgt_bundle, bundle ``status``), run as ``python3 <cache>/status-<hash>/__main__.py`` with one line
of JSON arguments on stdin (never in argv).

- ``op: status`` (the default): ``{"status": <rgt_statusdoc.status_document>}``, the monitor module's document.
- ``op: roster``: ``{"roster": <rgt_sweep.box_roster>}``, this box's roster of a sweep.
- ``op: budget_stop``: ``{"stopped": bool}``: rgt_runlayout.request_budget_stop for one run (rgt.budget: the
  one write of the round, its budget marker and RGT_PREEMPT_FILE).
- ``op: budget_hold``: ``{"held": bool, "cancelled": [job id], "errors": [...]}``: a sweep held at its budget on
  this box (rgt.budget, before its running cells are stopped): rgt_runlayout.hold_sweep writes the sweep's marker,
  then rgt_slurm.cancel_pending scancels the pending array tasks of the cells named (``cells``).
- ``op: offload_pick``: ``{"entry": {name, path, signature, manifest [[sha256, rel]], bytes} | null, "why"}``: the
  newest complete checkpoint of one run as rgt_offload picks it (two looks agree), hashed on the box, its signature
  looked at again after hashing; with ``name``, only that entry's signature now (``offload: to: controller``,
  runner/rgt/offload.py: read-only).
- ``op: supersede``: ``{"superseded": {run_dir, generation, set_aside, moved}}``: rgt_runlayout.set_aside_stale
  for one run before `rgt-run move` launches ``generation`` of it here (a run moved back to a box it once left:
  the older generation's ckpt/ and offload.jsonl set aside, never deleted).
- ``op: spare``: ``{"spare": {root, measured, writable, free_gib, why}}``: rgt_runlayout.spare_check of a durable
  root (`rgt-run watch`, before it moves a run to a spare; one empty file written and removed).
- ``op: log``: rgt_logread.stream: a header line, then the log's bytes (``rgt-run logs``).

A ValueError from the arguments is ``{"failed": true, "msg": ...}`` and exit 1. Python 3.6+, stdlib only.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import json
import os
import sys

from ansible_collections.rgt.remote_gpu.plugins.module_utils import (
    rgt_logread,
    rgt_offload,
    rgt_runlayout,
    rgt_slurm,
    rgt_statusdoc,
    rgt_sweep,
)


def offload_pick(params):
    """The newest complete checkpoint entry of a run, its manifest made here ({"entry": ..., "why": ...})."""
    paths = rgt_runlayout.RunPaths(rgt_runlayout.expand_root(params["durable_root"]), params["project"],
                                   params["run_id"])  # ValueError: a bad name
    if params.get("name"):
        path = os.path.join(paths.ckpt, os.path.basename(params["name"]))
        sig = rgt_offload.signature(path) if os.path.lexists(path) else None
        return {"entry": {"name": params["name"], "signature": sig} if sig else None, "why": None}
    try:
        with open(paths.job) as handle:
            pattern = json.load(handle).get("ckpt_glob") or "*"
    except (OSError, ValueError):
        pattern = "*"
    path, sig, why = rgt_offload.pick_entry(paths.ckpt, pattern, float(params.get("settle_s", rgt_offload.SETTLE_S)))
    if sig is None:
        return {"entry": None, "why": why}
    lines = rgt_offload.manifest_lines(path)
    if rgt_offload.signature(path) != sig:
        return {"entry": None, "why": "%s changed while it was hashed" % os.path.basename(path)}
    return {"entry": {"name": os.path.basename(path), "path": path, "signature": sig, "manifest": lines,
                      "bytes": sum(size for _rel, size, _mtime, _ino in sig)}, "why": None}


def budget_hold(params):
    """Hold a sweep at its budget on this box: its marker first (the queue starts nothing more), then the pending
    Slurm tasks of its cells cancelled."""
    root = rgt_runlayout.expand_root(params["durable_root"])
    sweep = params["sweep"]
    sweep_dir = rgt_runlayout.RunPaths(root, params["project"], sweep).sweep_dir(sweep)  # ValueError: a bad name
    cells = [rgt_runlayout.RunPaths(root, params["project"], c) for c in params.get("cells") or []]
    held = rgt_runlayout.hold_sweep(sweep_dir, params.get("marker") or {})
    return dict(rgt_slurm.cancel_pending([c.meta for c in cells]), held=held)


def main():
    params = json.loads(sys.stdin.readline() or "{}")
    op = params.pop("op", "status")
    out = sys.stdout.buffer if hasattr(sys.stdout, "buffer") else sys.stdout
    try:
        if op == "log":
            rgt_logread.stream(params, out)
            return 0
        if op == "roster":
            doc = {"roster": rgt_sweep.box_roster(params)}
        elif op == "budget_stop":
            paths = rgt_runlayout.RunPaths(rgt_runlayout.expand_root(params["durable_root"]), params["project"],
                                           params["run_id"])  # ValueError: a bad name
            doc = {"stopped": rgt_runlayout.request_budget_stop(paths, params.get("marker") or {})}
        elif op == "budget_hold":
            doc = budget_hold(params)
        elif op == "offload_pick":
            doc = offload_pick(params)
        elif op == "supersede":
            paths = rgt_runlayout.RunPaths(rgt_runlayout.expand_root(params["durable_root"]), params["project"],
                                           params["run_id"])  # ValueError: a bad name
            doc = {"superseded": rgt_runlayout.set_aside_stale(paths, int(params["generation"]))}
        elif op == "spare":
            doc = {"spare": rgt_runlayout.spare_check(params["durable_root"])}
        else:
            doc = {"status": rgt_statusdoc.status_document(params)}
    except ValueError as exc:
        doc = {"failed": True, "msg": str(exc)}
    except KeyboardInterrupt:
        return 130
    out.write((json.dumps(doc, default=str) + "\n").encode("utf-8"))
    out.flush()
    return 1 if doc.get("failed") else 0


if __name__ == "__main__":
    sys.exit(main())
