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

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.rgt.remote_gpu.plugins.module_utils.rgt_boxlist import list_box


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
