# -*- coding: utf-8 -*-
# Copyright: rgt contributors
# SPDX-License-Identifier: Apache-2.0
"""The status document of a run, built on the box: one copy of the logic for the rgt_status module (the monitor
role) and for the runner's ssh round (rgt.sshround ships this file and the module_utils it imports as a zipapp).

`params_from_vars(hostvars, other_run_ids)` derives the document's arguments from a host's variables the way the
monitor role's defaults do; `status_document(params)` builds the document (with `other_runs`). Python 3.6+,
stdlib only."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import os
import shutil
import socket
import time

from ansible_collections.rgt.remote_gpu.plugins.module_utils import (
    rgt_gpu,
    rgt_history,
    rgt_host,
    rgt_offload,
    rgt_outputs,
    rgt_reconcile,
    rgt_runlayout,
    rgt_slurm,
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
        "slurm": rgt_slurm.observe(paths.run_dir),  # None unless the run was submitted through Slurm
        "queue": rgt_runlayout.sweep_queue(paths),  # None unless the run is a sweep's cell
    }
    doc = rgt_reconcile.reconcile(facts)
    doc["offload"], offload_attention = rgt_offload.status_of(paths.run_dir, job, newest, now)
    doc["attention"].extend(offload_attention)  # failing or behind: exit 5, the job keeps running
    doc["run_dir"] = paths.run_dir
    doc["inbox_stop"] = rgt_runlayout.read_json(paths.inbox_stop)  # the box stopped its own meter, or why not
    doc["gpu_source"] = gpu_source
    doc["price_per_hour"] = (job or {}).get("price_per_hour")
    doc["budget_usd"] = (job or {}).get("budget_usd")
    doc["collected_at"] = now
    if params.get("history_kb"):
        doc["history"] = collect_history(paths, job, attempts, params["history_kb"] * 1024)
    return doc


def collect_history(paths, job, attempts, max_bytes):
    """The run's history for the report (module_utils/rgt_history): bounded reads, thinned points."""
    log_text, log_partial = read_tail(paths.log, max_bytes)
    gpu_text, gpu_partial = read_tail(paths.gpu, max_bytes)
    return rgt_history.build(log_text, log_partial, gpu_text, gpu_partial, attempts,
                             (job or {}).get("log_patterns"), (job or {}).get("metrics"))


# ---------------------------------------------------------------- arguments

LOG_TAIL_KB = 256
HISTORY_KB = 1024
PARAM_DEFAULTS = {"mounts": [], "log_tail_kb": LOG_TAIL_KB, "history_kb": HISTORY_KB, "other_run_ids": []}
DEFAULT_PROJECT = "rgt"


def params_from_vars(hostvars, profile_durable_root, other_run_ids=()):
    """The module's arguments from a host's variables, as roles/monitor/defaults/main.yml derives them:
    monitor_* wins, then run_context_* (roles/run_context), then rgt_durable_root (else the profile's durable
    root), rgt_project (else rgt), rgt_job.run_id (else rgt_job.name). Raises ValueError naming a value that is
    still a template (the runner then leaves that host to the monitor play)."""
    job = hostvars.get("rgt_job") if isinstance(hostvars.get("rgt_job"), dict) else {}
    project = hostvars.get("run_context_project", hostvars.get("rgt_project", DEFAULT_PROJECT))
    run_id = hostvars.get("run_context_run_id", job.get("run_id") or job.get("name") or "")
    params = {
        "durable_root": hostvars.get("monitor_durable_root", hostvars.get("rgt_durable_root", profile_durable_root)),
        "project": hostvars.get("monitor_project", project),
        "run_id": hostvars.get("monitor_run_id", run_id),
        "mounts": hostvars.get("monitor_mounts", PARAM_DEFAULTS["mounts"]),
        "log_tail_kb": hostvars.get("monitor_log_tail_kb", LOG_TAIL_KB),
        "history_kb": hostvars.get("monitor_history_kb", HISTORY_KB),
        "other_run_ids": list(hostvars.get("monitor_other_run_ids") or other_run_ids or []),
    }
    for key, value in params.items():
        for item in (value if isinstance(value, list) else [value]):
            if isinstance(item, str) and ("{{" in item or "{%" in item):
                raise ValueError("%s is a template (%s); only Ansible can evaluate it" % (key, item))
    for key in ("log_tail_kb", "history_kb"):
        params[key] = int(params[key])
    params["mounts"] = [str(m) for m in params["mounts"]]
    params["other_run_ids"] = [str(r) for r in params["other_run_ids"]]
    for key in ("durable_root", "project", "run_id"):
        params[key] = "" if params[key] is None else str(params[key])
    return params


def check_names(params):
    """The role's assert: a plain run id and project (rgt_runlayout.check_name), else the message."""
    for key, what in (("run_id", "run id"), ("project", "project")):
        problem = rgt_runlayout.check_name(params[key], what)
        if problem:
            return ("monitor needs rgt_job.name (or rgt_job.run_id, or monitor_run_id) and rgt_project as plain "
                    "names: %s" % problem)
    return None


def status_document(params):
    """The status document of params["run_id"], with `other_runs` for params["other_run_ids"] (one call).
    Raises ValueError for a project or run id that is not a plain name (no path is built from it)."""
    params = dict(PARAM_DEFAULTS, **params)
    status = collect(params)
    others = [collect(dict(params, run_id=run_id)) for run_id in params["other_run_ids"]]
    if others:
        status["other_runs"] = others
    return status
