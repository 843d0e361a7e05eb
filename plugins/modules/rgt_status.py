#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: rgt contributors
# SPDX-License-Identifier: Apache-2.0
"""Ansible module: the status of one run in one round trip (rgt monitor phase)."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: rgt_status
short_description: Reconcile the liveness and health of one rgt run into a status document
version_added: "0.1.0"
description:
  - Reads the run layout under C(<durable_root>/<project>/active/<run_id>) (C(.rgt/job.json), C(pid),
    C(heartbeat), C(attempts.jsonl), C(exit.json), C(gpu.csv), C(logs/job.log), C(ckpt/), C(out/)), checks the
    recorded wrapper and job pids under the box's current incarnation (boot id + PID 1 start time), asks
    C(tmux has-session) when tmux is installed, measures bytes and inodes of the given mounts with
    C(df -P -B1) and C(df -P -i), reads the cgroup memory files and the C(oom_kill) counter, and decides the
    state (running, stalled, finished, failed, preempted, dead, not_started) with the evidence behind it.
  - "Attention ids: C(nonfinite_loss), C(loss_spike), C(stalled), C(fast_finish), C(disk_full) (bytes or inodes
    >= 95%), C(oom_kill) (counter above the attempt's baseline), C(outputs_missing)."
  - Only the last O(log_tail_kb) KiB of the log are read; the first non-finite loss in that window is reported
    even when finite lines follow it.
  - GPU figures come from the wrapper's C(gpu.csv) (the latest samples); without it, one bounded
    C(nvidia-smi --query-gpu) call (10 s) is made when nvidia-smi is installed.
  - Read-only. A job state is data, never a module failure; the module fails only when it cannot run at all.
extends_documentation_fragment:
  - rgt.remote_gpu.run_layout
options:
  mounts:
    description: Paths whose bytes% and inodes% are reported. Empty means the durable root and C(/).
      Missing paths are skipped with a warning.
    type: list
    elements: str
    default: []
  log_tail_kb:
    description: KiB read from the end of C(logs/job.log) for step, loss, NaN and spike detection.
    type: int
    default: 256
  history_kb:
    description:
      - KiB read from the end of C(logs/job.log) and of C(.rgt/gpu.csv) for the C(history) key (loss over steps
        per attempt, GPU samples per GPU, idle stretches, the attempt records, the last error line of the log).
        The points are thinned to a few hundred, so the document stays small. C(0) leaves C(history) out.
    type: int
    default: 1024
  other_run_ids:
    description:
      - More runs of the same project on this box, reported in the same call (one round trip) under
        C(other_runs), each a status document of its own. Each id must be a plain name like C(run_id).
    type: list
    elements: str
    default: []
notes:
  - Check mode is supported; the module never changes anything, so it runs the same in check mode.
author:
  - rgt contributors
"""

EXAMPLES = r"""
- name: Status of the run
  rgt.remote_gpu.rgt_status:
    durable_root: /root/autodl-tmp
    project: myproj
    run_id: exp1
  register: monitor_result

- name: Keep it for the runner
  ansible.builtin.set_fact:
    monitor_status_report: "{{ monitor_result.status }}"
"""

RETURN = r"""
status:
  description: >-
    The status document (docs/internals.md "Status document"), schema 1, built by module_util
    rgt_statusdoc.status_document (the runner's status round runs the same function). Non-finite numbers are the
    strings nan, inf, -inf.
  returned: always
  type: dict
  contains:
    schema: {type: int, description: "1."}
    host: {type: str, description: The box's host name.}
    run_id: {type: str, description: The run.}
    run_dir: {type: str, description: The run dir on the box.}
    state:
      type: str
      description: running, stalled, finished, failed, preempted, dead, not_started; under Slurm also queued, timeout,
        oom.
    attempt: {type: int, description: The current attempt (null before the first).}
    evidence:
      type: dict
      description: "What the state rests on: wrapper_pid_alive, job_pid_alive, session_alive, incarnation_changed,
        heartbeat_age_s, log_age_s, ckpt_age_s, exit (the exit record or null)."
    step: {type: int, description: The newest step in the log (current attempt).}
    loss: {type: float, description: The newest loss in the log.}
    nonfinite_loss: {type: dict, description: "{step, value} of the first NaN/inf loss, or null."}
    loss_spike: {type: dict, description: "{step, value, median}, or null."}
    gpu: {type: list, elements: dict, description: "[{index, util_pct, mem_used_mib, mem_total_mib}]"}
    gpu_source: {type: str, description: "gpu.csv, nvidia-smi or null."}
    mounts: {type: list, elements: dict, description: "[{path, bytes_pct, inodes_pct}]"}
    cgroup: {type: dict, description: "{mem_limit_bytes, mem_usage_bytes, oom_kill}"}
    outputs_missing: {type: list, elements: str, description: Declared outputs absent from a finished run.}
    elapsed_s: {type: float, description: Wall seconds of all attempts.}
    expected_duration_s: {type: float, description: From the job spec.}
    cost_so_far: {type: float, description: price_per_hour x wall hours, or null.}
    price_per_hour: {type: float, description: From the job spec, or null.}
    budget_usd: {type: float, description: "From the job spec (rgt_job.budget_usd), or null: watch stops it there."}
    auto_resume: {type: bool, description: From the job spec.}
    attention: {type: list, elements: dict, description: "[{id, message, ...}]: each makes the runner exit 5."}
    offload:
      type: dict
      description: "A run whose job spec has an offload: {to, newest: {name, step, bytes, dest, age_s} of the newest
        verified copy or null, failing: the last copy's failure or null, behind_s} (module_utils/rgt_offload,
        docs/offload.md); null otherwise."
    inbox_stop:
      type: dict
      description: "What the box did of its own meter (rgt_job.offload.stop_box, module_utils/rgt_inbox): the run's
        .rgt/inbox_stop.json {action (stop, stop_failed, refused), reason, reasons, at, instance_id, own_id,
        authorisation, runs, command, rc}; null when it made none."
    warnings: {type: list, elements: str, description: What could not be read or looks wrong.}
    collected_at: {type: float, description: Epoch seconds on the box.}
    history:
      type: dict
      description: "For the report (absent when history_kb is 0): schema, loss {points [[attempt, step, loss]],
        attempts, truncated}, log_error {line, traceback} or null, gpu {series, idle, interval_s, samples,
        truncated}, attempts (attempts.jsonl records)."
    slurm:
      type: dict
      description: "Only for a run submitted through Slurm: job_id, known, state, reason, exit_rc, exit_signal,
        restarts, time_limit, run_time, nodes, error."
    queue_reason: {type: str, description: Only for a run queued by Slurm, its reason.}
    stop_reason:
      type: str
      description: "Only for a sweep cell its sweep's budget holds (state budget_stopped): budget_held (the
        sweep's .rgt/BUDGET_STOP; rgt-run retry SWEEP with a higher budget_usd resumes it)."
    other_runs:
      type: list
      elements: dict
      description: Status documents of other_run_ids, the same keys (absent without other_run_ids).
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.rgt.remote_gpu.plugins.module_utils import rgt_runlayout, rgt_statusdoc

# the collectors live in module_utils/rgt_statusdoc (one copy, shared with the runner's ssh round)
from ansible_collections.rgt.remote_gpu.plugins.module_utils.rgt_statusdoc import (  # noqa: F401
    collect,
    collect_mounts,
)


def main():
    module = AnsibleModule(
        argument_spec=dict(
            rgt_runlayout.RUN_LAYOUT_ARGS,
            mounts=dict(type="list", elements="str", default=[]),
            log_tail_kb=dict(type="int", default=rgt_statusdoc.LOG_TAIL_KB),
            history_kb=dict(type="int", default=rgt_statusdoc.HISTORY_KB),
            other_run_ids=dict(type="list", elements="str", default=[]),
        ),
        supports_check_mode=True,
    )
    try:
        status = rgt_statusdoc.status_document(module.params)
    except ValueError as exc:  # a project or run id that is not a plain name: no path is built from it
        module.fail_json(msg=str(exc))
    module.exit_json(changed=False, status=status)


if __name__ == "__main__":
    main()
