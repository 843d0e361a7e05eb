#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: rgt contributors
# SPDX-License-Identifier: Apache-2.0
"""Ansible module: cancel a Slurm job once on the login node and watch it end (the teardown's scancel verb)."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: rgt_slurm_cancel
short_description: Cancel Slurm jobs once each and wait, bounded, until Slurm reports them ended
version_added: "0.1.0"
description:
  - Runs on the login node, after the teardown gate passed (C(rgt.remote_gpu.rgt_teardown) returns the
    C(remote_jobs) to cancel: the instance id and the job each run on the box submitted through sbatch). The
    decisions live in C(plugins/module_utils/rgt_slurm.py) (C(cancel), C(cancel_jobs)).
  - Each job on its own, as follows.
  - Looks at the job with C(scontrol show job -o) first. C(scancel) exits 0 for an unknown job id, so only
    scontrol's view says what happened - a job Slurm no longer knows ("Invalid job id") or one that already
    ended is C(already gone) and nothing is called; any other scontrol error (slurmctld busy, a timeout) is asked
    again (O(look_tries) times, O(look_delay_s) apart) and then fails the task with nothing cancelled.
  - Otherwise runs O(argv) once (never again) and polls scontrol every O(interval_s) seconds, at most
    O(timeout_s), until the job ended or Slurm no longer knows it (C(gone)). When it never ends, C(ended=false)
    and C(final_state="unknown — check squeue"); the task itself succeeds so the caller can record the outcome,
    then fail.
options:
  jobs:
    description: The jobs, C([{job_id, argv}]); argv is the cancel command (e.g. C([scancel, <job id>])), run
      without a shell.
    type: list
    elements: dict
    required: true
  timeout_s:
    description: Seconds to wait for Slurm to report the job ended.
    type: float
    default: 60
  interval_s:
    description: Seconds between two looks while waiting.
    type: float
    default: 2
  look_tries:
    description: How often to ask scontrol before the cancel when it cannot say.
    type: int
    default: 5
  look_delay_s:
    description: Seconds between those tries.
    type: float
    default: 3
notes:
  - Check mode is not supported (a cancel cannot be previewed by running it).
author:
  - rgt contributors
"""

EXAMPLES = r"""
- name: Cancel the job (once) and watch it end
  rgt.remote_gpu.rgt_slurm_cancel:
    jobs: [{job_id: "12345", argv: [scancel, "12345"]}]
  register: teardown_slurm
"""

RETURN = r"""
ended:
  description: True when Slurm reported every job ended or no longer knows it (before or after the cancel).
  returned: always
  type: bool
final_state:
  description: C(gone) (cancelled now and ended), C(already gone) (nothing was called for any job) or
    C(unknown — check squeue) (one was cancelled and never reported ended within O(timeout_s)).
  returned: always
  type: str
slurm_state:
  description: The last JobState Slurm reported, as C(JobState=X) (or C(unknown)); for several jobs
    C(<id>: JobState=X; ...).
  returned: always
  type: str
calls:
  description: The cancel calls, C([{argv, rc}]); rc null when nothing was called.
  returned: always
  type: list
jobs:
  description: Each job's outcome, C([{job_id, ok, final_state, slurm_state, calls, msg}]).
  returned: always
  type: list
at:
  description: When the outcome was decided (UTC, ISO 8601).
  returned: always
  type: str
"""

import time

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.rgt.remote_gpu.plugins.module_utils import rgt_slurm


def main():
    module = AnsibleModule(
        argument_spec=dict(
            jobs=dict(type="list", elements="dict", required=True),
            timeout_s=dict(type="float", default=60),
            interval_s=dict(type="float", default=2),
            look_tries=dict(type="int", default=5),
            look_delay_s=dict(type="float", default=3),
        ),
        supports_check_mode=False,
    )
    p = module.params
    bad = [j for j in p["jobs"] if not j.get("job_id") or not isinstance(j.get("argv"), list) or not j["argv"]]
    if not p["jobs"] or bad:
        module.fail_json(msg="jobs: each needs a job_id and a non-empty argv (got %r)" % (bad or p["jobs"],),
                         rc_hint=2)
    jobs = [{"job_id": str(j["job_id"]), "argv": [str(a) for a in j["argv"]]} for j in p["jobs"]]
    outcome = rgt_slurm.cancel_jobs(jobs, p["timeout_s"], p["interval_s"], p["look_tries"], p["look_delay_s"])
    result = dict(changed=any(c["rc"] is not None for c in outcome["calls"]), ended=outcome["ok"],
                  final_state=outcome["final_state"], slurm_state=outcome["slurm_state"], calls=outcome["calls"],
                  jobs=outcome["jobs"], at=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                  msg=outcome["msg"])
    if outcome["final_state"] is None:  # Slurm could not say for a job: it was not cancelled, nothing to record
        module.fail_json(**result)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
