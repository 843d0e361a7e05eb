#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: rgt contributors
# SPDX-License-Identifier: Apache-2.0
"""Close out a finished run on the box: build, validate and seal export/<run_id>, write its manifest (the logic is
module_utils/rgt_seal, shared with the Kubernetes seal pod)."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
module: rgt_closeout
short_description: Seal a finished run as export/<run_id> with an external manifest, in one round trip
description:
  - Builds the candidate C(<project>/export/.partial/<run_id>/) from the run (C(out/<outputs>) or all of C(out/),
    C(ckpt/<declared>) only, the run's logs under C(logs/), and a generated C(run.json)), validates it (every
    declared output exists, no symlink or special file on any exported path, declared checkpoints load when a
    loader is importable), then renames it to C(export/<run_id>/) in one atomic rename and writes
    C(export/<run_id>.manifest.json) (outside the capsule) atomically.
  - An output or checkpoint entry is a file, a directory (collected recursively, regular files only; a trailing
    C(/) requires a directory) or a glob (C(*), C(?), C([...]) matched per path component, e.g.
    C(checkpoint-*/model.safetensors)); a glob needs at least one match. Every component from the run directory
    down (C(out/) and C(ckpt/) included) is opened without following a symlink and files are copied from the
    opened descriptor (module_utils/rgt_outputs); a symlink anywhere refuses the candidate, named.
  - The logs (C(logs/job.log) with every attempt, C(.rgt/attempts.jsonl) as C(logs/attempts.jsonl), the other
    files at the top of the run's C(logs/) such as Slurm's C(slurm-<id>.out), and a Slurm array task's output from
    its sweep's C(logs/)) are copied after the outputs, each whole up to O(log_max_mb); a larger one keeps its
    first and last halves (cut at line ends) around a line naming the bytes left out, and the cap is lowered to
    what the disk has room for while leaving a floor free (64 MiB, or 5% of a smaller disk). A log that cannot
    be copied (a symlink, no room at all) is not sealed. Either way the seal goes on, a warning says so, and the
    C(logs) record in C(run.json), the manifest and the result names every log, its size and what was left out.
  - A failed candidate is moved to C(quarantine/<run_id>--<attempt>/) (a suffix is added when that exists) with
    C(REASON.txt), and the module fails with the reason.
  - A sealed export is never overwritten; a second closeout is a no-op (C(changed=false), "already sealed").
  - See docs/internals.md "Closeout, pull, verification, teardown".
extends_documentation_fragment:
  - rgt.remote_gpu.run_layout
options:
  host:
    type: str
    required: true
    description: "Inventory name of the box (recorded in run.json and the manifest)."
  instance_id:
    type: str
    description: "The platform's instance id (recorded)."
  job_name:
    type: str
    description: "The job's name (recorded in run.json; default the run id)."
  outputs:
    type: list
    elements: str
    default: []
    description: "Required outputs under C(out/): files, directories or globs; empty exports all of C(out/)."
  declared_checkpoints:
    type: list
    elements: str
    default: []
    description: "Checkpoints relative to C(ckpt/): files, directories or globs."
  attempt:
    type: int
    description: "Attempt number for the quarantine name; default the last one in attempts.jsonl."
  force_unfinished:
    type: bool
    default: false
    description: "Seal a run whose exit.json does not say finished."
  loader_python:
    type: str
    description: "Interpreter for the checkpoint load checks (the job's); default this one."
  loader_bundle:
    type: dict
    description:
      - "The checkpoint loader that O(loader_python) runs: the flat bundle C(ckpt_loader) of the lookup
        C(rgt.remote_gpu.rgt_bundle) (C(entry) C(rgt_manifest.py) and the module_utils it imports)."
      - "Installed in a temporary directory on the box for the seal's load checks, removed after; without it (or
        when the directory cannot be written) the checks run in this interpreter."
  log_max_mb:
    type: int
    description: "Cap of one log file in the capsule, in MiB (at least 1); default 256 (module_utils/rgt_seal)."
author: rgt developers
"""

RETURN = r"""
sealed:
  type: bool
  description: "True when export/<run_id> exists after the call."
capsule:
  type: str
  description: "Path of export/<run_id>."
manifest_path:
  type: str
  description: "Path of export/<run_id>.manifest.json."
manifest_sha256:
  type: str
  description: "SHA-256 of the manifest file's bytes."
files:
  type: int
  description: "Files in the capsule."
bytes:
  type: int
  description: "Bytes in the capsule."
checkpoints:
  type: list
  description: "[{path, loader, ok, detail}] for every declared checkpoint file."
not_pulled:
  type: list
  description: "[{path, reason}] what the run holds that the capsule does not (a capped log's left-out bytes too)."
logs:
  type: dict
  description:
    - "{max_bytes, files: [{path, source, source_bytes, bytes, sealed, capped, omitted, reason}]}: every log the seal
      looked at (C(path) in the capsule, or null when not sealed; C(omitted) the [start, end) bytes a capped log
      left out); null for an export sealed before logs were part of it."
quarantine:
  type: str
  description: "Where a failed candidate was moved (failure only)."
reason:
  type: str
  description: "Why the candidate failed (failure only)."
"""

import contextlib
import os
import shutil
import sys
import tempfile

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.rgt.remote_gpu.plugins.module_utils.rgt_runlayout import RUN_LAYOUT_ARGS, install_bundle
from ansible_collections.rgt.remote_gpu.plugins.module_utils.rgt_seal import SealError, log_warnings, seal


@contextlib.contextmanager
def checkpoint_loader(module):
    """The checkpoint loader (O(loader_bundle)) in a temporary directory while the seal runs, when the load checks
    run under another interpreter (O(loader_python)): yields its script, else None (the checks run here)."""
    p = module.params
    bundle, python = p["loader_bundle"], p["loader_python"]
    if not bundle or not python or python == sys.executable or module.check_mode:
        yield None
        return
    tmp = tempfile.mkdtemp(prefix="rgt-ckpt-loader-")
    try:
        try:
            install_bundle(tmp, bundle["files"], bundle["entry"])
            script = os.path.join(tmp, bundle["entry"])
        except (KeyError, TypeError, AttributeError, ValueError) as exc:
            module.fail_json(msg="nothing sealed: loader_bundle is not the bundle ckpt_loader of the lookup "
                                 "rgt.remote_gpu.rgt_bundle: %s" % exc)
        except (IOError, OSError) as exc:
            module.warn("the checkpoint loader could not be written to %s (%s): the load checks run under %s "
                        "instead of %s" % (tmp, exc, sys.executable, python))
            script = None
        yield script
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def main():
    """The seal itself is module_utils/rgt_seal (shared with the Kubernetes seal pod); this is its Ansible face."""
    module = AnsibleModule(
        argument_spec=dict(
            RUN_LAYOUT_ARGS,
            host=dict(type="str", required=True),
            instance_id=dict(type="str"),
            job_name=dict(type="str"),
            outputs=dict(type="list", elements="str", default=[]),
            declared_checkpoints=dict(type="list", elements="str", default=[]),
            attempt=dict(type="int"),
            force_unfinished=dict(type="bool", default=False),
            loader_python=dict(type="str"),
            loader_bundle=dict(type="dict"),
            log_max_mb=dict(type="int"),
        ),
        supports_check_mode=True,
    )
    params = dict((k, v) for k, v in module.params.items() if k != "loader_bundle")
    with checkpoint_loader(module) as loader:
        try:
            result = seal(dict(params, loader=loader), check_mode=module.check_mode)
        except SealError as exc:
            module.fail_json(msg=exc.msg, **exc.result)
    for text in log_warnings(result.get("logs")):
        module.warn(text)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
