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
    The status document (docs/internals.md "Status document"), schema 1. Keys: schema, host, run_id, run_dir,
    state, attempt, evidence {wrapper_pid_alive, job_pid_alive, session_alive, incarnation_changed,
    heartbeat_age_s, log_age_s, ckpt_age_s, exit}, step, loss, nonfinite_loss {step, value}, loss_spike {step,
    value, median}, gpu [{index, util_pct, mem_used_mib, mem_total_mib}], gpu_source (gpu.csv, nvidia-smi or
    null), mounts [{path, bytes_pct, inodes_pct}], cgroup {mem_limit_bytes, mem_usage_bytes, oom_kill},
    outputs_missing, elapsed_s, expected_duration_s, cost_so_far, price_per_hour, auto_resume,
    attention [{id, message, ...}], warnings, collected_at, history {schema, loss {points [[attempt, step, loss]],
    attempts [{attempt, first_step, last_step, losses}], truncated}, log_error {line, traceback} or null, gpu
    {series {index: [[ts, util_pct, mem_used_mib, mem_total_mib]]}, idle [{index, start, end, samples}],
    interval_s, samples, truncated}, attempts [attempts.jsonl records]} (absent when history_kb is 0),
    other_runs [status documents of other_run_ids, same keys] (absent without other_run_ids).
    Non-finite numbers are the strings nan, inf, -inf.
  returned: always
  type: dict
"""

import os
import shutil
import socket
import time

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.rgt.remote_gpu.plugins.module_utils import (
    rgt_gpu,
    rgt_history,
    rgt_host,
    rgt_outputs,
    rgt_reconcile,
    rgt_runlayout,
)
from ansible_collections.rgt.remote_gpu.plugins.module_utils.rgt_proc import read, run

CGROUP_ROOT = "/sys/fs/cgroup"
GPU_FIELDS = ["index", "utilization.gpu", "memory.used", "memory.total"]
GPU_SAMPLES_PER_INDEX = 3
TIMEOUT = 10




def read_tail(path, max_bytes):
    """(text, partial_first_line): the last max_bytes of a file, decoded leniently."""
    try:
        with open(path, "rb") as handle:
            handle.seek(0, os.SEEK_END)
            size = handle.tell()
            start = max(0, size - max_bytes)
            handle.seek(start)
            data = handle.read()
    except (IOError, OSError):
        return None, False
    return data.decode("utf-8", "replace"), start > 0


# ---------------------------------------------------------------- collectors

def collect_mounts(paths, warnings):
    existing = []
    for path in paths:
        if path in existing:
            continue
        if os.path.exists(path):
            existing.append(path)
        else:
            warnings.append("mount path %s does not exist" % path)
    if not existing:
        return []
    rc, out, err = run(["df", "-P", "-B1", "--"] + existing, TIMEOUT)
    byte_rows = rgt_host.parse_df(out)
    rc_i, out_i, err_i = run(["df", "-P", "-i", "--"] + existing, TIMEOUT)
    inode_rows = rgt_host.parse_df(out_i)
    if not byte_rows:
        warnings.append("df failed (rc=%s): %s" % (rc, err.strip()[:200]))
        return []
    if rc_i != 0 or not inode_rows:
        warnings.append("df -i failed (rc=%s): %s; inode use of %s is not known"
                        % (rc_i, err_i.strip()[:200], ", ".join(existing)))
    return [{"path": row["path"], "bytes_pct": row["bytes_pct"], "inodes_pct": row["inodes_pct"]}
            for row in rgt_host.combine_df(byte_rows, inode_rows, existing)]


def collect_cgroup():
    """{mem_limit_bytes, mem_usage_bytes, oom_kill} from cgroup v2 (own cgroup or root) or v1."""
    own = rgt_host.parse_proc_cgroup(read("/proc/self/cgroup") or "")
    if os.path.exists(os.path.join(CGROUP_ROOT, "cgroup.controllers")):
        base = CGROUP_ROOT
        nested = os.path.join(CGROUP_ROOT, (own["v2"] or "/").lstrip("/"))
        if own["v2"] and os.path.exists(os.path.join(nested, "memory.max")):
            base = nested
        summary = rgt_host.memory_summary(2, read(os.path.join(base, "memory.max")),
                                          read(os.path.join(base, "memory.current")),
                                          read(os.path.join(base, "memory.events")))
    elif os.path.isdir(os.path.join(CGROUP_ROOT, "memory")):
        mem = os.path.join(CGROUP_ROOT, "memory")
        summary = rgt_host.memory_summary(1, read(os.path.join(mem, "memory.limit_in_bytes")),
                                          read(os.path.join(mem, "memory.usage_in_bytes")),
                                          oom_control_text=read(os.path.join(mem, "memory.oom_control")))
    else:
        summary = {}
    return {"mem_limit_bytes": summary.get("limit_bytes"), "mem_usage_bytes": summary.get("usage_bytes"),
            "oom_kill": summary.get("oom_kill")}


def parse_gpu_csv(text):
    """gpu.csv (module_utils/rgt_history's reader) -> the last few samples per index."""
    per_index = {}
    for row in rgt_history.gpu_csv_rows(text):
        rows = per_index.setdefault(row["index"], [])
        rows.append(row)
        if len(rows) > GPU_SAMPLES_PER_INDEX:
            rows.pop(0)
    out = []
    for index in sorted(per_index):
        out.extend(per_index[index])
    return out


def collect_gpu(paths, warnings):
    text, _partial = read_tail(paths.gpu, 16 * 1024)
    if text is not None:
        samples = parse_gpu_csv(text)
        if samples:
            return samples, "gpu.csv"
    smi = shutil.which("nvidia-smi")
    if not smi:
        return [], None
    rc, out, err = run([smi, "--query-gpu=" + ",".join(GPU_FIELDS), "--format=csv,noheader,nounits"], TIMEOUT)
    if rc != 0:
        warnings.append("nvidia-smi rc=%s: %s" % (rc, (err or out).strip()[:200]))
        return [], None
    rows = rgt_gpu.parse_query_gpu(out, GPU_FIELDS)
    return [{"index": r.get("index"), "util_pct": r.get("utilization.gpu"), "mem_used_mib": r.get("memory.used"),
             "mem_total_mib": r.get("memory.total")} for r in rows], "nvidia-smi"


def session_alive(paths, attempt_start):
    """tmux has-session for the run's session; None when tmux is absent or the attempt used another primitive."""
    detach = (attempt_start or {}).get("detach")
    if detach and detach != "tmux":
        return None
    tmux = shutil.which("tmux")
    if not tmux:
        return None
    session = (attempt_start or {}).get("session") or paths.session()
    rc, _out, _err = run([tmux, "has-session", "-t", "=" + session], TIMEOUT)
    return rc == 0


def outputs_present(paths, outputs):
    """{entry: bool}: a file or directory exists, a glob matches, with no symlink on its path (what the closeout
    will seal; module_utils/rgt_outputs)."""
    return rgt_outputs.present(paths.run_dir, "out", outputs or [])


def collect(params):
    warnings = []
    now = time.time()
    durable = rgt_runlayout.expand_root(params["durable_root"])
    paths = rgt_runlayout.RunPaths(durable, params["project"], params["run_id"])  # ValueError: a bad name
    job = rgt_runlayout.read_json(paths.job)
    if os.path.exists(paths.job) and job is None:
        warnings.append("job.json exists but is not readable JSON")
    pid_doc = rgt_runlayout.read_json(paths.pid)
    incarnation = rgt_runlayout.incarnation()
    same = bool(pid_doc) and pid_doc.get("incarnation") == incarnation
    attempts = rgt_runlayout.read_jsonl(paths.attempts)
    records = rgt_reconcile.attempt_records(attempts)
    current = rgt_reconcile.current_attempt(pid_doc, attempts, None)
    start = (records.get(current) or {}).get("start")
    log_tail, partial = read_tail(paths.log, max(1, params["log_tail_kb"]) * 1024)
    ckpt_glob = (job or {}).get("ckpt_glob") or "*"
    newest = rgt_runlayout.newest_checkpoint(paths.ckpt, ckpt_glob)
    mount_paths = [rgt_runlayout.expand_root(p) for p in params["mounts"]] or [durable, "/"]
    if durable in mount_paths and not os.path.exists(durable):
        mount_paths = [p for p in mount_paths if p != durable]
        warnings.append("durable root %s does not exist" % durable)
    gpu_samples, gpu_source = collect_gpu(paths, warnings)
    facts = {
        "host": socket.gethostname(), "run_id": params["run_id"], "job": job, "pid": pid_doc,
        "heartbeat": rgt_runlayout.read_json(paths.heartbeat),
        "heartbeat_age_s": rgt_runlayout.age_s(paths.heartbeat, now),
        "exit": rgt_runlayout.read_json(paths.exit), "attempts": attempts, "incarnation": incarnation,
        "wrapper_alive": same and rgt_runlayout.pid_alive(pid_doc.get("wrapper_pid")),
        "job_alive": same and rgt_runlayout.pid_alive(pid_doc.get("job_pid")),
        "session_alive": session_alive(paths, start) if job else None,
        "log_tail": log_tail, "log_tail_partial": partial, "log_age_s": rgt_runlayout.age_s(paths.log, now),
        "ckpt_age_s": rgt_runlayout.age_s(newest, now) if newest else None,
        "outputs_present": outputs_present(paths, (job or {}).get("outputs")),
        "mounts": collect_mounts(mount_paths, warnings), "cgroup": collect_cgroup(),
        "gpu_samples": gpu_samples, "now": now, "warnings": warnings,
    }
    doc = rgt_reconcile.reconcile(facts)
    doc["run_dir"] = paths.run_dir
    doc["gpu_source"] = gpu_source
    doc["price_per_hour"] = (job or {}).get("price_per_hour")
    doc["collected_at"] = now
    if params.get("history_kb"):
        doc["history"] = collect_history(paths, job, attempts, params["history_kb"] * 1024)
    return doc


def collect_history(paths, job, attempts, max_bytes):
    """The run's history for the report (module_utils/rgt_history): bounded reads, thinned points."""
    log_text, log_partial = read_tail(paths.log, max_bytes)
    gpu_text, gpu_partial = read_tail(paths.gpu, max_bytes)
    return rgt_history.build(log_text, log_partial, gpu_text, gpu_partial, attempts,
                             (job or {}).get("log_patterns"))


def main():
    module = AnsibleModule(
        argument_spec=dict(
            rgt_runlayout.RUN_LAYOUT_ARGS,
            mounts=dict(type="list", elements="str", default=[]),
            log_tail_kb=dict(type="int", default=256),
            history_kb=dict(type="int", default=1024),
            other_run_ids=dict(type="list", elements="str", default=[]),
        ),
        supports_check_mode=True,
    )
    try:
        status = collect(module.params)
        others = [collect(dict(module.params, run_id=run_id)) for run_id in module.params["other_run_ids"]]
        if others:
            status["other_runs"] = others
    except ValueError as exc:  # a project or run id that is not a plain name: no path is built from it
        module.fail_json(msg=str(exc))
    module.exit_json(changed=False, status=status)


if __name__ == "__main__":
    main()
