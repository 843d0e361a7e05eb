#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: rgt contributors
# SPDX-License-Identifier: Apache-2.0
"""Ansible module: audit a GPU box in one round trip (rgt probe phase)."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: rgt_probe
short_description: Audit a rented GPU box (GPUs, kernel log, disks, cgroups, tools, run layout)
version_added: "0.1.0"
description:
  - Collects, in one invocation, everything the probe phase needs to decide whether a box can
    run the job, and evaluates it into findings and a verdict (C(ok), C(warn), C(fail)).
  - "Runs C(nvidia-smi --query-gpu), the default C(nvidia-smi) table (CUDA version),
    C(--query-compute-apps), C(nvidia-smi -q -d PERFORMANCE) (clock event/throttle reasons),
    C(df -P -T -B1) and C(df -P -i) over the given paths and C(/), reads cgroup v1/v2 memory and
    CPU files, C(/proc/meminfo), C(/proc/uptime), looks up tools with the PATH, scans C(dmesg)
    (falling back to C(journalctl -k -n 2000)) for Xid errors, tests that the durable root is
    writable, and compares the device of the export and export/.partial directories."
  - Every command runs with C(LC_ALL=C) and a 20 second timeout.
  - The module B(always returns normally), also when the verdict is C(fail), so the role can
    write the report to the ledger first; the C(probe) role fails afterwards on
    C(verdict == 'fail').
  - It writes nothing except a short-lived probe file in the durable root (created and removed
    at once), and the run-layout directories when O(create_layout=true); C(changed) is true only
    when those directories were created by this call.
options:
  paths:
    description: Mount paths to inspect with C(df); C(/) is always added. Missing paths are
      reported and skipped.
    type: list
    elements: str
    default: []
  durable_root:
    description: The run layout's durable root. C(~) and C({user}) are expanded on the box for the login user, in
      every path option (rgt_runlayout.expand_root).
    type: str
  scratch_root:
    description: The scratch root; inspected with C(df) like O(paths).
    type: str
  project:
    description: Project directory name under the durable root.
    type: str
    default: rgt
  gpu_request:
    description: The job's GPU request, keys C(count), C(min_memory_mib), C(name).
    type: dict
    default: {}
  profile:
    description: The validated profile dict (C(mounts), C(roots), C(meter_stop) are used).
    type: dict
    default: {}
  python:
    description: Explicit interpreter path of the job (C(~) and C({user}) expanded); its existence is checked.
    type: str
  create_layout:
    description: Create C(<durable_root>/<project>/export/.partial) (and parents) before the
      filesystem comparison. When false, the nearest existing parents are compared.
    type: bool
    default: false
  timeout:
    description: Seconds each subprocess may run.
    type: int
    default: 20
notes:
  - Check mode is supported; the durable-root write test is skipped in check mode (the result is
    then C(null)) and no directories are created.
author:
  - rgt contributors
"""

EXAMPLES = r"""
- name: Probe the box
  rgt.remote_gpu.rgt_probe:
    paths: [/root/autodl-tmp, /root/autodl-fs]
    durable_root: /root/autodl-tmp
    project: myproj
    gpu_request: {count: 1, min_memory_mib: 24000}
    profile: "{{ probe_profile }}"
  register: probe

- name: Fail after the report is written
  ansible.builtin.fail:
    msg: "{{ probe.findings | selectattr('severity', 'eq', 'critical') | map(attribute='message') | list }}"
  when: probe.verdict == 'fail'
"""

RETURN = r"""
report:
  description: >-
    All collected facts, JSON-able, schema_version 1. Keys: schema_version, collected_at,
    host {hostname, home, user, uptime_s}, gpu {smi, failure, driver_version, cuda_version, gpus[],
    mig_devices[], compute_apps[], table_processes_state, raw_errors}, kernel_log {readable,
    source, error, xids[], fallen_off_bus[], codes[], verdict}, storage {command, mounts[],
    missing_paths[], error}, cgroup {version, path, memory {limit_bytes, unlimited,
    usage_bytes, oom_kill, events}, cpu {quota_us, period_us}}, cpu {nproc, cpu_count,
    effective_cpus}, memory {mem_total_bytes}, tools {name: path or null}, layout
    {durable_root, project, durable_root_exists, durable_root_writable, write_error,
    export_dir, partial_dir, compared, devices, same_filesystem, created}, interpreter
    {path, exists, executable}, gpu_request, profile_name.
  returned: always
  type: dict
findings:
  description: >-
    Worst first; each built by rgt_findings.finding, the shape every phase shares (docs/internals.md
    "Findings").
  returned: always
  type: list
  elements: dict
  contains:
    id:
      description: Stable identifier (C(gpu_none), C(disk_inodes_full), C(gpu_xid_79), ...).
      type: str
    severity:
      description: C(critical), C(warning) or C(info).
      type: str
    message:
      description: What is wrong on this box.
      type: str
    fix:
      description: What the user does about it (re-rent, free space, move the durable root...); empty when
        there is nothing to do.
      type: str
    data:
      description: The facts behind the message, for machines; empty when none.
      type: dict
verdict:
  description: C(fail) if any finding is critical, C(warn) if any is a warning, else C(ok).
  returned: always
  type: str
exit_hint:
  description: 1 when the verdict is C(fail), else 0.
  returned: always
  type: int
"""

import datetime
import os
import shutil
import socket

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.rgt.remote_gpu.plugins.module_utils import rgt_gpu, rgt_host, rgt_probe_eval
from ansible_collections.rgt.remote_gpu.plugins.module_utils.rgt_proc import read, run
from ansible_collections.rgt.remote_gpu.plugins.module_utils.rgt_runlayout import expand_root, login_user

QUERY_GPU_FIELDS = ["index", "uuid", "name", "pci.bus_id", "driver_version", "memory.total",
                    "memory.used", "utilization.gpu", "temperature.gpu", "clocks.sm",
                    "clocks.max.sm", "power.draw"]
COMPUTE_APPS_FIELDS = ["pid", "process_name", "used_memory", "gpu_uuid"]
TOOLS = ["tmux", "rsync", "python3", "python", "fuser", "lsof", "nvidia-smi"]
CGROUP_ROOT = "/sys/fs/cgroup"




# ---------------------------------------------------------------- GPU

def collect_gpu(smi, timeout):
    result = {"smi": smi, "failure": None, "driver_version": None, "cuda_version": None,
              "gpus": [], "mig_devices": [], "compute_apps": [], "table_processes_state": None,
              "raw_errors": []}
    if not smi:
        result["failure"] = {"kind": "not_installed",
                             "message": "nvidia-smi is not installed or not on PATH"}
        return result
    rc, out, err = run([smi, "--query-gpu=" + ",".join(QUERY_GPU_FIELDS),
                        "--format=csv,noheader,nounits"], timeout)
    failure = rgt_gpu.classify_smi_failure(rc, out, err)
    if failure:
        result["failure"] = failure
        return result
    rows = rgt_gpu.parse_query_gpu(out, QUERY_GPU_FIELDS)
    _table(smi, timeout, result)
    reasons = _reasons(smi, timeout, result)
    result["gpus"] = [_gpu_row(row, reasons) for row in rows]
    if rows and not result["driver_version"]:
        result["driver_version"] = rows[0].get("driver_version")
    rc, out, err = run([smi, "--query-compute-apps=" + ",".join(COMPUTE_APPS_FIELDS),
                        "--format=csv,noheader,nounits"], timeout)
    if rc == 0:
        result["compute_apps"] = rgt_gpu.parse_compute_apps(out, COMPUTE_APPS_FIELDS)
    else:
        result["raw_errors"].append("query-compute-apps rc=%s: %s" % (rc, err.strip()[:200]))
    return result


def _table(smi, timeout, result):
    rc, out, err = run([smi], timeout)
    if rc != 0:
        result["raw_errors"].append("nvidia-smi rc=%s: %s" % (rc, err.strip()[:200]))
        return
    table = rgt_gpu.parse_smi_table(out)
    result["driver_version"] = table["driver_version"]
    result["cuda_version"] = table["cuda_version"]
    result["mig_devices"] = table["mig_devices"]
    result["table_processes_state"] = table["processes_state"]


def _reasons(smi, timeout, result):
    rc, out, err = run([smi, "-q", "-d", "PERFORMANCE"], timeout)
    if rc != 0:
        result["raw_errors"].append("nvidia-smi -q rc=%s: %s" % (rc, err.strip()[:200]))
        return {}
    parsed = rgt_gpu.parse_query_q(out)
    return dict(((g["bus_id"] or "").lower(), g) for g in parsed["gpus"])


def _bus_key(bus_id):
    # query-gpu prints 00000000:07:00.0; -q prints the same form. Normalise the case.
    return (bus_id or "").lower()


def _gpu_row(row, reasons):
    q = reasons.get(_bus_key(row.get("pci.bus_id")), {})
    return {"index": row.get("index"), "uuid": row.get("uuid"), "name": row.get("name"),
            "pci_bus_id": row.get("pci.bus_id"), "driver_version": row.get("driver_version"),
            "memory_total_mib": row.get("memory.total"), "memory_used_mib": row.get("memory.used"),
            "utilization_pct": row.get("utilization.gpu"),
            "temperature_c": row.get("temperature.gpu"), "clocks_sm_mhz": row.get("clocks.sm"),
            "clocks_max_sm_mhz": row.get("clocks.max.sm"), "power_w": row.get("power.draw"),
            "active_reasons": q.get("active_reasons", []), "reasons_section": q.get(
                "reasons_section")}


def collect_kernel_log(timeout):
    rc, out, err = run(["dmesg"], timeout)
    source = "dmesg"
    if rc != 0:  # an empty but permitted read is readable: it just holds no Xid
        first_err = err.strip()[:200]
        rc, out, err = run(["journalctl", "-k", "-n", "2000", "--no-pager"], timeout)
        source = "journalctl"
        if rc != 0 or not out.strip() or out.strip().startswith("-- No entries --"):
            return {"readable": False, "source": None,
                    "error": "dmesg: %s; journalctl: %s" % (first_err or "no output",
                                                            err.strip()[:200] or "no output"),
                    "xids": [], "fallen_off_bus": [], "codes": [], "verdict": None}
    scan = rgt_gpu.scan_kernel_log(out)
    scan.update({"readable": True, "source": source, "error": None,
                 "verdict": rgt_gpu.gpu_health_verdict(scan)})
    return scan


# ---------------------------------------------------------------- storage, cgroup, cpu

def collect_storage(paths, timeout):
    existing = [p for p in paths if os.path.exists(p)]
    missing = [p for p in paths if not os.path.exists(p)]
    result = {"command": "df -P -T -B1 / df -P -i", "mounts": [], "missing_paths": missing,
              "error": None}
    if not existing:
        return result
    rc, out, err = run(["df", "-P", "-T", "-B1", "--"] + existing, timeout)
    if not out.strip():
        # busybox or an old df without -T: fall back to the plain POSIX form.
        rc, out, err = run(["df", "-P", "-B1", "--"] + existing, timeout)
        result["command"] = "df -P -B1 / df -P -i"
    byte_rows = rgt_host.parse_df(out)
    rc_i, out_i, err_i = run(["df", "-P", "-i", "--"] + existing, timeout)
    inode_rows = rgt_host.parse_df(out_i)
    if not byte_rows:
        result["error"] = "df rc=%s: %s" % (rc, err.strip()[:200])
    result["mounts"] = rgt_host.combine_df(byte_rows, inode_rows, existing)
    return result


def _cgroup_dir():
    own = rgt_host.parse_proc_cgroup(read("/proc/self/cgroup") or "")
    if os.path.exists(os.path.join(CGROUP_ROOT, "cgroup.controllers")):
        nested = os.path.join(CGROUP_ROOT, (own["v2"] or "/").lstrip("/"))
        if own["v2"] and os.path.exists(os.path.join(nested, "memory.max")):
            return 2, nested
        return 2, CGROUP_ROOT
    if os.path.isdir(os.path.join(CGROUP_ROOT, "memory")):
        return 1, CGROUP_ROOT
    return None, None


def collect_cgroup():
    version, base = _cgroup_dir()
    result = {"version": version, "path": base, "memory": {}, "cpu": {}}
    if version == 2:
        result["memory"] = rgt_host.memory_summary(
            2, read(os.path.join(base, "memory.max")), read(os.path.join(base, "memory.current")),
            read(os.path.join(base, "memory.events")))
        quota, period = rgt_host.parse_cpu_max(read(os.path.join(base, "cpu.max")) or "")
    elif version == 1:
        mem = os.path.join(base, "memory")
        result["memory"] = rgt_host.memory_summary(
            1, read(os.path.join(mem, "memory.limit_in_bytes")),
            read(os.path.join(mem, "memory.usage_in_bytes")),
            oom_control_text=read(os.path.join(mem, "memory.oom_control")))
        cpu = os.path.join(base, "cpu")
        quota, period = rgt_host.parse_cfs(read(os.path.join(cpu, "cpu.cfs_quota_us")),
                                           read(os.path.join(cpu, "cpu.cfs_period_us")))
    else:
        quota, period = None, None
    result["cpu"] = {"quota_us": quota, "period_us": period}
    return result


def collect_cpu(cgroup):
    try:
        nproc = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        nproc = os.cpu_count()
    cpu = cgroup.get("cpu") or {}
    return {"nproc": nproc, "cpu_count": os.cpu_count(),
            "effective_cpus": rgt_host.effective_cpus(cpu.get("quota_us"), cpu.get("period_us"),
                                                      nproc)}


# ---------------------------------------------------------------- layout

def _nearest_existing(path):
    while path and not os.path.exists(path):
        parent = os.path.dirname(path)
        if parent == path:
            break
        path = parent
    return path


def _write_test(root):
    probe = os.path.join(root, ".rgt-probe-%d" % os.getpid())
    try:
        with open(probe, "w") as handle:
            handle.write("rgt probe\n")
            handle.flush()
            os.fsync(handle.fileno())
        os.remove(probe)
        return True, None
    except (IOError, OSError) as exc:
        return False, str(exc)


def collect_layout(durable_root, project, create, check_mode):
    result = {"durable_root": durable_root, "project": project, "durable_root_exists": None,
              "durable_root_writable": None, "write_error": None, "export_dir": None,
              "partial_dir": None, "compared": [], "devices": [], "same_filesystem": None,
              "created": False}
    if not durable_root:
        return result
    result["durable_root_exists"] = os.path.isdir(durable_root)
    if not result["durable_root_exists"]:
        # a plain directory under an existing mount is created at upload; what must exist is where it goes
        anchor = _nearest_existing(durable_root)
        result["anchor"] = anchor
        if not check_mode:
            result["durable_root_writable"], result["write_error"] = _write_test(anchor)
        return result
    if not check_mode:
        result["durable_root_writable"], result["write_error"] = _write_test(durable_root)
    export_dir = os.path.join(durable_root, project, "export")
    partial_dir = os.path.join(export_dir, ".partial")
    result["export_dir"], result["partial_dir"] = export_dir, partial_dir
    if create and not check_mode and not os.path.isdir(partial_dir):
        try:
            os.makedirs(partial_dir)
            result["created"] = True
        except OSError as exc:
            result["write_error"] = str(exc)
    compared = [_nearest_existing(partial_dir), _nearest_existing(export_dir)]
    devices = [os.stat(p).st_dev for p in compared]
    result["compared"], result["devices"] = compared, devices
    result["same_filesystem"] = devices[0] == devices[1]
    return result


def collect_interpreter(path):
    if not path:
        return {"path": None, "exists": None, "executable": None}
    return {"path": path, "exists": os.path.exists(path),
            "executable": os.access(path, os.X_OK)}


# ---------------------------------------------------------------- main

def build_report(params, check_mode):
    home = os.path.expanduser("~")
    user = login_user()

    def expand(path):
        # profiles may say ~ or {user} (e.g. /scratch/{user}/rgt-runs): resolved on the box, the one way
        return expand_root(path, user=user, home=home)

    durable = expand(params["durable_root"])
    scratch = expand(params["scratch_root"])
    timeout = params["timeout"]
    paths = [expand(p) for p in params["paths"]]
    for extra in (durable, scratch, "/"):
        if extra and extra not in paths:
            paths.append(extra)
    tools = dict((name, shutil.which(name)) for name in TOOLS)
    cgroup = collect_cgroup()
    meminfo = rgt_host.parse_meminfo(read("/proc/meminfo") or "")
    profile = params["profile"] or {}
    return {
        "schema_version": 1,
        "collected_at": datetime.datetime.now(datetime.timezone.utc).replace(
            microsecond=0).isoformat(),
        "host": {"hostname": socket.gethostname(), "home": home, "user": user,
                 "uptime_s": rgt_host.parse_uptime(read("/proc/uptime") or "")},
        "gpu": collect_gpu(tools.get("nvidia-smi"), timeout),
        "kernel_log": collect_kernel_log(timeout),
        "storage": collect_storage(paths, timeout),
        "cgroup": cgroup,
        "cpu": collect_cpu(cgroup),
        "memory": {"mem_total_bytes": meminfo.get("MemTotal")},
        "tools": tools,
        "layout": collect_layout(durable, params["project"], params["create_layout"], check_mode),
        "interpreter": collect_interpreter(expand(params["python"])),
        "gpu_request": params["gpu_request"] or {},
        "profile_name": profile.get("name"),
    }


def main():
    module = AnsibleModule(
        argument_spec=dict(
            paths=dict(type="list", elements="str", default=[]),
            durable_root=dict(type="str"),
            scratch_root=dict(type="str"),
            project=dict(type="str", default="rgt"),
            gpu_request=dict(type="dict", default={}),
            profile=dict(type="dict", default={}),
            python=dict(type="str"),
            create_layout=dict(type="bool", default=False),
            timeout=dict(type="int", default=20),
        ),
        supports_check_mode=True,
    )
    report = build_report(module.params, module.check_mode)
    evaluation = rgt_probe_eval.evaluate(report, module.params["gpu_request"],
                                         module.params["profile"])
    # Always return normally: the role writes the report, then fails on verdict == 'fail'.
    # changed is true only when create_layout made the run-layout directories.
    module.exit_json(changed=bool(report["layout"].get("created")), report=report,
                     findings=evaluation["findings"], verdict=evaluation["verdict"],
                     exit_hint=evaluation["exit_hint"])


if __name__ == "__main__":
    main()
