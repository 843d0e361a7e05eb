# -*- coding: utf-8 -*-
# Copyright: rgt contributors
# SPDX-License-Identifier: Apache-2.0
"""Decide what a probe report means for the user: findings and a verdict.

Pure logic over the report the rgt_probe module collects (schema_version 1),
the job's GPU request and the validated profile. Kept apart from collection
so every rule is unit-tested on plain dicts.

Every finding comes from rgt_findings.finding (id, severity, message, fix, data): the message says what is
wrong, the fix what the user does about it (re-rent, free space, move the durable root...), data the facts.

Severity policy (one place, so the role and the docs can cite it):
- critical (probe FAILS, "re-rent this box"): broken NVIDIA driver; no GPU or
  fewer GPUs than requested; VRAM below the request; Xid 48/74/79/92/95/119 or
  a "fallen off the bus" line; durable root missing or not writable.
- warning: bytes or inodes >= 90% (>= 95% is still a warning, with
  data.level "high" and a stronger message: nothing has run yet, the user can
  prune or expand); thermal or hardware slowdown active; other Xids that point
  at the GPU; kernel log unreadable; GPU name not matching the request; VRAM
  size unknown; durable root on a mount that the profile's meter-stop verb
  deletes (rgt_gate.deleted_mounts, the rule the teardown plan prints);
  export/.partial and export on different filesystems (a warning, not
  critical: no run exists yet, and collect refuses a cross-filesystem
  rename later); tmux or rsync missing; no Python found or the
  job's interpreter missing; other processes already holding GPU memory.
- info: Xids that are usually the application's (13, 31, 43, 45); cgroup
  CPU quota below the visible cores (OMP_NUM_THREADS advice); cgroup memory
  limit different from MemTotal; OOM kills already counted in the cgroup;
  CUDA version not visible.
"""

from __future__ import absolute_import, division, print_function

import hashlib
import json

from ansible_collections.rgt.remote_gpu.plugins.module_utils import rgt_gate
from ansible_collections.rgt.remote_gpu.plugins.module_utils.rgt_findings import finding, worst_first
from ansible_collections.rgt.remote_gpu.plugins.module_utils.rgt_findings import verdict as verdict_of
from ansible_collections.rgt.remote_gpu.plugins.module_utils.rgt_runlayout import expand_root

__metaclass__ = type

DISK_WARN_PCT = 90
DISK_HIGH_PCT = 95
GIB = 1024 ** 3


def _gib(value):
    if value is None:
        return "unknown"
    if value < GIB:  # "0.5 GiB" reads worse than "512 MiB" for the small limits that matter most
        return "%d MiB" % (value // (1024 * 1024))
    return "%.1f GiB" % (value / float(GIB))


def requested_gpu_count(gpu_request):
    """GPUs the job asked for: count if given, 1 for a non-empty request, else 0."""
    if not gpu_request:
        return 0
    count = gpu_request.get("count")
    if count is None:
        return 1
    return int(count)


# ---------------------------------------------------------------- GPU

def _gpu_presence(gpu, wanted):
    failure = gpu.get("failure") or {}
    kind = failure.get("kind")
    if kind in ("driver_unreachable", "driver_mismatch"):
        severity = "critical" if wanted else "warning"
        return [finding("gpu_driver_broken", severity,
                        "%s; the GPUs on this box cannot be used."
                        % failure.get("message", "the NVIDIA driver is broken"),
                        "Re-rent this box: a broken driver cannot be repaired from inside the instance.",
                        {"failure": failure})]
    count = len(gpu.get("gpus") or [])
    if wanted and count == 0:
        why = failure.get("message") or "nvidia-smi lists no GPUs"
        return [finding("gpu_none", "critical",
                        "The job asks for %d GPU(s) but this box has none (%s): a container "
                        "started without GPUs, or a restart lost them." % (wanted, why),
                        "Re-rent this box, with its GPUs attached when the instance is created.",
                        {"failure": failure})]
    if wanted and count < wanted:
        return [finding("gpu_count", "critical",
                        "The job asks for %d GPUs but this box has %d." % (wanted, count),
                        "Re-rent a box with at least %d GPUs, or lower rgt_job.gpu.count." % wanted,
                        {"wanted": wanted, "found": count})]
    return []


def _gpu_fit(gpus, wanted, gpu_request):
    findings = []
    min_mib = (gpu_request or {}).get("min_memory_mib")
    if min_mib and gpus:
        unknown = [g for g in gpus if g.get("memory_total_mib") is None]
        big = [g for g in gpus if (g.get("memory_total_mib") or 0) >= min_mib]
        if unknown and not big:
            findings.append(finding(
                "gpu_memory_unknown", "warning",
                "nvidia-smi does not report GPU memory here (unified memory such as GB10), "
                "so the %d MiB request cannot be checked." % min_mib,
                "Check the GPU memory in the platform's listing; drop rgt_job.gpu.min_memory_mib "
                "to skip this check.",
                {"min_memory_mib": min_mib}))
        elif len(big) < max(wanted, 1):
            sizes = sorted(set(g.get("memory_total_mib") for g in gpus))
            findings.append(finding(
                "gpu_memory", "critical",
                "The job needs %d GPU(s) with at least %d MiB; this box has %d (GPU memory: "
                "%s MiB)." % (max(wanted, 1), min_mib, len(big), ", ".join(str(s) for s in sizes)),
                "Re-rent a box with GPUs of at least %d MiB, or lower rgt_job.gpu.min_memory_mib."
                % min_mib,
                {"min_memory_mib": min_mib, "matching": len(big), "sizes_mib": sizes}))
    name = (gpu_request or {}).get("name")
    if name and gpus:
        matching = [g for g in gpus if name.lower() in (g.get("name") or "").lower()]
        if len(matching) < max(wanted, 1):
            names = sorted(set(g.get("name") or "?" for g in gpus))
            findings.append(finding(
                "gpu_name", "warning",
                "The job asks for '%s' GPUs; this box has %s." % (name, ", ".join(names)),
                "Re-rent a box with %s GPUs, or change rgt_job.gpu.name if these will do." % name,
                {"requested": name, "found": names}))
    return findings


def _gpu_throttle(gpus):
    findings = []
    for gpu in gpus:
        reasons = gpu.get("active_reasons") or []
        thermal = [r for r in reasons if r in ("hw_thermal_slowdown", "sw_thermal_slowdown")]
        hardware = [r for r in reasons if r in ("hw_slowdown", "hw_power_brake_slowdown")]
        if thermal or hardware:
            findings.append(finding(
                "gpu_throttle", "warning",
                "GPU %s is slowing its clocks now (%s): the same code can run 25-40%% slower." % (
                    gpu.get("index"), ", ".join(thermal + hardware)),
                "Probe again in a few minutes; re-rent this box if the GPU still slows down.",
                {"gpu": gpu.get("index"), "reasons": thermal + hardware,
                 "temperature_c": gpu.get("temperature_c")}))
    return findings


def _gpu_busy(gpu):
    apps = gpu.get("compute_apps") or []
    if not apps:
        return []
    used = sum(a.get("used_gpu_memory") or 0 for a in apps)
    return [finding("gpu_busy", "warning",
                    "%d process(es) already hold %d MiB of GPU memory before the job starts "
                    "(another tenant, or leftovers from an earlier run)." % (len(apps), used),
                    "Stop those processes if they are yours (nvidia-smi lists their PIDs); "
                    "otherwise re-rent this box.",
                    {"processes": apps})]


def _kernel_log(log):
    if not log.get("readable"):
        return [finding("kernel_log_unreadable", "warning",
                        "The kernel log (dmesg/journalctl) cannot be read here, so the GPU "
                        "health verdict is non-authoritative: Xid errors would not be seen.",
                        "", {"error": log.get("error")})]
    findings = []
    fallen = log.get("fallen_off_bus") or []
    if fallen:
        findings.append(finding(
            "gpu_fallen_off_bus", "critical",
            "The kernel log says a GPU has fallen off the bus (%s)." %
            ", ".join(sorted(set(f.get("pci") or "?" for f in fallen))),
            "Re-rent this box: the GPU is gone until the host is serviced.",
            {"lines": [f.get("line") for f in fallen[:5]]}))
    by_code = {}
    for xid in log.get("xids") or []:
        by_code.setdefault(xid["code"], []).append(xid)
    for code in sorted(by_code):
        events = by_code[code]
        first = events[0]
        severity = first.get("severity", "warning")
        advice = first.get("advice", "")
        findings.append(finding(
            "gpu_xid_%d" % code, severity,
            "Xid %d (%s) seen %d time(s) on %s." % (
                code, first.get("meaning", "?"), len(events),
                ", ".join(sorted(set(e.get("pci") or "?" for e in events)))),
            advice[:1].upper() + advice[1:] + "." if advice else "",
            {"code": code, "count": len(events), "re_rent": first.get("re_rent", False),
             "lines": [e.get("line") for e in events[:3]]}))
    return findings


def gpu_findings(report, gpu_request):
    """Findings about GPUs: presence, fit to the request, throttling, Xids."""
    gpu = report.get("gpu") or {}
    wanted = requested_gpu_count(gpu_request)
    findings = _gpu_presence(gpu, wanted)
    gpus = gpu.get("gpus") or []
    findings += _gpu_fit(gpus, wanted, gpu_request)
    findings += _gpu_throttle(gpus)
    findings += _gpu_busy(gpu)
    if gpus and not gpu.get("cuda_version"):
        findings.append(finding(
            "cuda_version_unknown", "info",
            "nvidia-smi shows no CUDA version (no CUDA user-mode library in this container); "
            "the job's CUDA runtime must bring its own."))
    if wanted or gpus:
        findings += _kernel_log(report.get("kernel_log") or {})
    return findings


# ---------------------------------------------------------------- storage

def _disk_one(mount):
    findings = []
    path = mount.get("path") or mount.get("mountpoint")
    bytes_pct = mount.get("bytes_pct")
    inodes_pct = mount.get("inodes_pct")
    for kind, pct in (("inodes", inodes_pct), ("bytes", bytes_pct)):
        if pct is None or pct < DISK_WARN_PCT:
            continue
        level = "high" if pct >= DISK_HIGH_PCT else "elevated"
        what = "inodes" if kind == "inodes" else "space"
        message = "%s has %d%% of its %s left (%d%% used)" % (path, 100 - pct, what, pct)
        if kind == "inodes" and (bytes_pct is None or bytes_pct < DISK_WARN_PCT):
            message += " — inodes, not bytes, will run out first"
        if level == "high":
            message += "; at 95%% the monitor escalates"
        if kind == "inodes":
            fix = ("Delete or pack small files on %s (caches, unpacked datasets: tar them) or expand it "
                   "before launching." % path)
        else:
            fix = "Free space on %s (old checkpoints, caches) or expand it before launching." % path
        findings.append(finding("disk_%s_full" % kind, "warning", message + ".", fix,
                                {"path": path, "mountpoint": mount.get("mountpoint"),
                                 "pct": pct, "level": level}))
    return findings


def storage_findings(report):
    """bytes% / inodes% per mount (the source's DISK_PCT_MAX is 95)."""
    findings = []
    for mount in (report.get("storage") or {}).get("mounts") or []:
        findings += _disk_one(mount)
    return findings


def _expand(path, host):
    """A profile path on this box: `~` and `{user}` for the login user the report names (rgt_runlayout)."""
    return expand_root(path, user=host.get("user"), home=host.get("home"))


def _profile_mount_for(path, mounts, host):
    best = None
    best_len = -1
    for mount in mounts or []:
        point = (_expand(mount.get("path"), host) or "").rstrip("/") or "/"
        if path == point or path.startswith(point.rstrip("/") + "/") or point == "/":
            if len(point) > best_len:
                best, best_len = mount, len(point)
    return best


def layout_findings(report, profile):
    """Durable root present/writable, survival of the meter-stop verb, export rename."""
    layout = report.get("layout") or {}
    root = layout.get("durable_root")
    host = report.get("host") or {}
    findings = []
    if root and not layout.get("durable_root_exists"):
        mount = _profile_mount_for(root, (profile or {}).get("mounts"), host)
        point = (_expand(mount.get("path"), host) or "/") if mount else "/"
        missing = (report.get("storage") or {}).get("missing_paths") or []
        if point != "/" and point in missing:
            return [finding("durable_mount_missing", "critical",
                            "The durable root %s should be on %s, which is not mounted on this box "
                            "(it must be attached when the instance is created)." % (root, point),
                            "Re-rent this box with %s attached, or set rgt_durable_root to a path "
                            "on a mount this box has." % point,
                            {"durable_root": root, "mount": point})]
        if layout.get("durable_root_writable") is False:
            return [finding("durable_root_not_writable", "critical",
                            "The durable root %s does not exist and %s cannot be written (%s)."
                            % (root, layout.get("anchor"), layout.get("write_error") or "denied"),
                            "Set rgt_durable_root to a directory the login user can create.",
                            {"durable_root": root, "anchor": layout.get("anchor")})]
        findings.append(finding("durable_root_absent", "info",
                                "The durable root %s does not exist yet; upload creates it." % root,
                                "", {"durable_root": root, "anchor": layout.get("anchor")}))
        return findings + _survival(root, profile, host)
    if root and layout.get("durable_root_writable") is False:
        return [finding("durable_root_not_writable", "critical",
                        "The durable root %s cannot be written (%s)." % (
                            root, layout.get("write_error") or "denied"),
                        "Set rgt_durable_root (or the profile's roots.durable) to a writable path, "
                        "or re-rent this box.",
                        {"durable_root": root, "error": layout.get("write_error")})]
    findings += _survival(root, profile, host)
    if layout.get("same_filesystem") is False:
        findings.append(finding(
            "export_cross_filesystem", "warning",
            "%s and %s are on different filesystems, so closing a run cannot be an atomic "
            "rename; collect will refuse until they share one." % (
                layout.get("partial_dir"), layout.get("export_dir")),
            "Set rgt_durable_root to a directory on one filesystem, with no mount point below "
            "<durable root>/<project>/export.",
            {"compared": layout.get("compared")}))
    return findings


def _survival(root, profile, host):
    """A warning when the meter-stop verb deletes the mount holding the durable root: which mounts it deletes is
    rgt_gate.deleted_mounts, the same answer the teardown plan prints and the teardown module records."""
    profile = profile or {}
    meter = profile.get("meter_stop") or {}
    mounts = profile.get("mounts") or []
    if not root or not mounts or not meter:
        return []
    lost = rgt_gate.deleted_mounts(profile)
    mount = _profile_mount_for(root, mounts, host)
    if mount and mount.get("path") not in lost:
        return []
    needed = rgt_gate.verb_kind(bool(meter.get("reversible")))
    label = meter.get("label") or meter.get("verb") or "the meter stop"
    survivors = [m.get("path") for m in mounts if m.get("path") not in lost]
    where = ("on %s" % mount.get("path")) if mount else "on no mount the profile declares"
    message = "The durable root %s is %s, which does not survive '%s' (a %s)." % (root, where, label, needed)
    if survivors:
        message += " %s would survive it." % " or ".join(survivors)
        fix = "Set rgt_durable_root to a path under %s." % " or ".join(survivors)
    else:
        message += " No mount of this profile survives it."
        fix = "Pull the results (rgt-run pull) before the meter stops."
    return [finding("durable_root_not_surviving", "warning", message, fix,
                    {"durable_root": root, "verb": meter.get("verb"), "needs": needed,
                     "mount": mount.get("path") if mount else None, "survivors": survivors})]


# ---------------------------------------------------------------- host

def host_findings(report):
    """cgroup CPU/memory versus what host tools show, OOM baseline, tools, interpreter."""
    findings = []
    cpu = report.get("cpu") or {}
    cpus = cpu.get("effective_cpus")
    visible = cpu.get("nproc")
    if cpus and visible and cpus < visible:
        threads = max(int(cpus), 1)
        findings.append(finding(
            "cpu_quota_below_nproc", "info",
            "The container may use %.2g CPUs but sees %d cores: thread pools sized by the core "
            "count will oversubscribe." % (cpus, visible),
            "rgt sets OMP_NUM_THREADS=%d for the job; set it yourself in shells you start on the "
            "box." % threads,
            {"effective_cpus": cpus, "nproc": visible, "omp_num_threads": threads}))
    memory = ((report.get("cgroup") or {}).get("memory")) or {}
    limit = memory.get("limit_bytes")
    total = (report.get("memory") or {}).get("mem_total_bytes")
    if limit and total and limit != total:
        findings.append(finding(
            "cgroup_memory_limit", "info",
            "free shows the host's %s; your container has %s (cgroup limit)." % (
                _gib(total), _gib(limit)),
            "Size num_workers (and data held in RAM) by the %s limit, not by free." % _gib(limit),
            {"limit_bytes": limit, "mem_total_bytes": total}))
    if memory.get("oom_kill"):
        findings.append(finding(
            "cgroup_oom_baseline", "info",
            "This cgroup has already counted %d OOM kill(s); the monitor compares against "
            "this baseline." % memory["oom_kill"], "", {"oom_kill": memory["oom_kill"]}))
    findings += _tool_findings(report)
    return findings


def _tool_findings(report):
    findings = []
    tools = report.get("tools") or {}
    if not tools.get("tmux"):
        findings.append(finding("tool_tmux_missing", "warning",
                                "tmux is not installed: the job will be detached with nohup "
                                "(no session to attach to).",
                                "Install tmux on the box (e.g. apt-get install -y tmux) to get a "
                                "session to attach to; the job runs either way."))
    if not tools.get("rsync"):
        findings.append(finding("tool_rsync_missing", "warning",
                                "rsync is not installed: transfers cannot resume after a "
                                "dropped connection.",
                                "Install rsync on the box (e.g. apt-get install -y rsync)."))
    interp = report.get("interpreter") or {}
    if interp.get("path"):
        if not interp.get("exists"):
            findings.append(finding("interpreter_missing", "warning",
                                    "The job's interpreter %s does not exist on this box."
                                    % interp["path"],
                                    "Set rgt_job.python to the absolute path `which python` prints "
                                    "in the shell you train from on this box.",
                                    {"path": interp["path"]}))
    elif not tools.get("python3") and not tools.get("python"):
        findings.append(finding("python_missing", "warning",
                                "Neither python3 nor python is on PATH.",
                                "Give the job an explicit interpreter: rgt_job.python."))
    return findings


# ---------------------------------------------------------------- verdict


def evaluate(report, gpu_request=None, profile=None):
    """All findings for a probe report, with verdict (ok|warn|fail) and exit_hint (0|1)."""
    findings = []
    findings += gpu_findings(report, gpu_request)
    findings += storage_findings(report)
    findings += layout_findings(report, profile)
    findings += host_findings(report)
    findings = worst_first(findings)
    verdict = verdict_of(findings)
    return {"findings": findings, "verdict": verdict,
            "exit_hint": 1 if verdict == "fail" else 0}



# ---------------------------------------------------------------- reuse of a recent probe (the ledger's record)

REUSE_MAX_AGE_S = 300  # train's default window (roles/probe probe_reuse_max_age_s); a standalone probe: 0


def probe_inputs_digest(args):
    """One digest of what a probe was asked (paths, roots, project, GPU request, profile, interpreter, layout): a
    record answers only the same question."""
    text = json.dumps(args, sort_keys=True, default=str, separators=(",", ":"))
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def reuse(previous, instance_id, pin, inputs_digest, now, max_age_s, key="probed", what="probe",
          asked="paths, GPUs, interpreter or profile"):
    """(reusable, why) for the ledger's record of a probe (or of another look at the box that keeps its record the
    same way: env_check's, `key` "checked"): only a record of the same instance (rgt_instance_id), behind the same
    host key pin, asked the same question, that did not fail, taken less than max_age_s ago (and not in the
    future). Anything else, a record that cannot be read included, is looked at again."""
    if max_age_s <= 0:
        return False, "reuse off"
    if not isinstance(previous, dict):
        return False, "no earlier %s of this box in the ledger" % what
    reuse_doc = previous.get(key) if isinstance(previous.get(key), dict) else {}
    taken = reuse_doc.get("at")
    if not isinstance(taken, (int, float)) or isinstance(taken, bool):
        return False, "the earlier %s's record has no time" % what
    if previous.get("instance_id") != instance_id:
        return False, "the earlier %s was of another instance" % what
    if not pin or reuse_doc.get("pin") != pin:
        return False, "the host key pin is not the one the earlier %s met" % what
    if reuse_doc.get("inputs") != inputs_digest:
        return False, "the earlier %s was asked other things (%s)" % (what, asked)
    if previous.get("verdict") not in ("ok", "warn"):
        return False, "the earlier %s found a blocking problem" % what
    age = now - taken
    if age < 0 or age > max_age_s:
        return False, "the earlier %s is %d s old (reused up to %d s)" % (what, age, max_age_s)
    return True, "reused, taken %d s ago" % age
