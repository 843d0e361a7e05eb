# -*- coding: utf-8 -*-
# Copyright: rgt contributors
# SPDX-License-Identifier: Apache-2.0
"""Pure parsers for host facts: df, cgroup v1/v2 files, /proc files.

Host tools (`free`, `nproc`, `uptime`) describe the shared node, not the
tenant's container; the cgroup files are what the job will actually get.
No I/O here; Python 3.6 standard library only (module_utils run on the box).
"""

from __future__ import absolute_import, division, print_function

import re

__metaclass__ = type

# Values that mean "no memory limit": cgroup v2 "max"; v1 PAGE_COUNTER_MAX
# (page-aligned LONG_MAX, 9223372036854771712) on newer kernels and 2**64-1
# on old ones. Anything at or above 2**62 is no real limit either.
_UNLIMITED_FLOOR = 2 ** 62

_HUMAN_UNITS = {"": 1, "K": 1024, "M": 1024 ** 2, "G": 1024 ** 3, "T": 1024 ** 4,
                "P": 1024 ** 5, "E": 1024 ** 6}


def _human_to_int(text):
    """"1.8G" -> bytes (df -h uses powers of 1024); "0" -> 0; "-" -> None."""
    text = (text or "").strip()
    match = re.match(r"^(\d+(?:[.,]\d+)?)([KMGTPE]?)i?B?$", text, re.IGNORECASE)
    if not match:
        return None
    number = float(match.group(1).replace(",", "."))
    return int(round(number * _HUMAN_UNITS[match.group(2).upper()]))


def _plain_int(text):
    text = (text or "").strip()
    return int(text) if re.match(r"^\d+$", text) else None


def _pct(text):
    text = (text or "").strip().rstrip("%")
    return int(text) if text.isdigit() else None


def _df_layout(header):
    """What a df header says: has a Type column? inode or byte counts? in what unit?"""
    tokens = header.split()
    has_type = len(tokens) > 1 and tokens[1].lower() == "type"
    size_col = tokens[2 if has_type else 1] if len(tokens) > (2 if has_type else 1) else ""
    lowered = size_col.lower()
    if lowered.startswith("inodes"):
        kind = "inodes"
    else:
        kind = "bytes"
    multiplier = None  # None: human-readable sizes
    match = re.match(r"^(\d+)([kKmMgG]?)b?-blocks$", size_col, re.IGNORECASE)
    if match:
        multiplier = int(match.group(1)) * _HUMAN_UNITS[match.group(2).upper()]
    elif kind == "inodes":
        multiplier = 1
    return has_type, kind, multiplier


def _df_number(text, multiplier):
    if multiplier is None:
        return _human_to_int(text)
    value = _plain_int(text)
    return None if value is None else value * multiplier


def parse_df(text):
    """Parse `df` output: -P or human, bytes (-B1/-k/-h) or inodes (-i), with or without -T.

    Returns rows {filesystem, fstype, mountpoint, kind ("bytes"|"inodes"),
    total, used, free, pct}. A long device name that the non-POSIX format
    wraps onto its own line is joined with the numbers on the next line.
    "-" counts (filesystems without inodes) become None.
    """
    lines = [line.rstrip("\r") for line in (text or "").splitlines() if line.strip()]
    if not lines or not lines[0].lower().startswith("filesystem"):
        return []
    has_type, kind, multiplier = _df_layout(lines[0])
    fixed = 6 if has_type else 5  # columns before "Mounted on"
    rows = []
    pending = None
    for line in lines[1:]:
        tokens = line.split()
        if pending is not None:
            tokens = [pending] + tokens
            pending = None
        if len(tokens) < fixed + 1:
            pending = " ".join(tokens)
            continue
        numbers = tokens[2:5] if has_type else tokens[1:4]
        pct = tokens[5] if has_type else tokens[4]
        rows.append({
            "filesystem": tokens[0],
            "fstype": tokens[1] if has_type else None,
            "kind": kind,
            "total": _df_number(numbers[0], multiplier),
            "used": _df_number(numbers[1], multiplier),
            "free": _df_number(numbers[2], multiplier),
            "pct": _pct(pct),
            "mountpoint": " ".join(tokens[fixed:]),
        })
    return rows


def combine_df(byte_rows, inode_rows, paths=None):
    """Join byte and inode rows per mount into the probe's per-mount record.

    df prints one row per argument, in argument order, so when `paths` has
    as many entries as rows each row is tagged with the path asked about.
    inodes_pct is None when the filesystem reports no inodes (btrfs, some FUSE).
    """
    inodes_by_mount = {}
    for row in inode_rows or []:
        inodes_by_mount.setdefault(row["mountpoint"], row)
    use_paths = paths is not None and len(paths) == len(byte_rows or [])
    result = []
    for index, row in enumerate(byte_rows or []):
        if use_paths:
            inode = (inode_rows[index] if inode_rows and len(inode_rows) == len(byte_rows)
                     else inodes_by_mount.get(row["mountpoint"], {}))
        else:
            inode = inodes_by_mount.get(row["mountpoint"], {})
        inodes_total = inode.get("total")
        no_inodes = not inodes_total
        result.append({
            "path": paths[index] if use_paths else row["mountpoint"],
            "mountpoint": row["mountpoint"],
            "filesystem": row["filesystem"],
            "fstype": row.get("fstype") or inode.get("fstype"),
            "bytes_total": row["total"],
            "bytes_used": row["used"],
            "bytes_avail": row["free"],
            "bytes_pct": row["pct"],
            "inodes_total": None if no_inodes else inodes_total,
            "inodes_used": None if no_inodes else inode.get("used"),
            "inodes_free": None if no_inodes else inode.get("free"),
            "inodes_pct": None if no_inodes else inode.get("pct"),
        })
    return result


# ---------------------------------------------------------------- cgroups

def _first_line(text):
    for line in (text or "").splitlines():
        if line.strip():
            return line.strip()
    return ""


def parse_memory_limit(text):
    """memory.max (v2) or memory.limit_in_bytes (v1) -> bytes, or None for unlimited."""
    value = _first_line(text)
    if value in ("", "max", "-1"):
        return None
    if not value.isdigit():
        return None
    number = int(value)
    return None if number >= _UNLIMITED_FLOOR else number


def parse_int_file(text):
    """A one-number cgroup/proc file (memory.current, usage_in_bytes) -> int or None."""
    value = _first_line(text)
    return int(value) if re.match(r"^-?\d+$", value) else None


def parse_flat_keyed(text):
    """"key value" lines (memory.events, cpu.stat, v1 memory.oom_control) -> {key: int}."""
    result = {}
    for line in (text or "").splitlines():
        parts = line.split()
        if len(parts) == 2 and re.match(r"^-?\d+$", parts[1]):
            result[parts[0]] = int(parts[1])
    return result


def parse_cpu_max(text):
    """cgroup v2 cpu.max "<quota|max> <period>" -> (quota_us or None, period_us)."""
    parts = _first_line(text).split()
    if not parts:
        return None, None
    quota = None if parts[0] == "max" else _plain_int(parts[0])
    period = _plain_int(parts[1]) if len(parts) > 1 else 100000
    return quota, period


def parse_cfs(quota_text, period_text):
    """cgroup v1 cpu.cfs_quota_us (-1 = none) and cpu.cfs_period_us -> (quota, period)."""
    quota = parse_int_file(quota_text)
    period = parse_int_file(period_text) or 100000
    if quota is None or quota < 0:
        return None, period
    return quota, period


def effective_cpus(quota, period, nproc=None):
    """CPUs the cgroup quota allows (float), capped by nproc; None when no quota."""
    if not quota or not period:
        return None
    cpus = quota / float(period)
    if nproc:
        cpus = min(cpus, float(nproc))
    return round(cpus, 2)


def parse_proc_cgroup(text):
    """/proc/self/cgroup -> {"v2": "/path" or None, "v1": {controller: path}}."""
    result = {"v2": None, "v1": {}}
    for line in (text or "").splitlines():
        parts = line.strip().split(":", 2)
        if len(parts) != 3:
            continue
        hier, controllers, path = parts
        if hier == "0" and controllers == "":
            result["v2"] = path
        else:
            for controller in controllers.split(","):
                if controller:
                    result["v1"][controller] = path
    return result


def memory_summary(version, limit_text, usage_text, events_text=None, oom_control_text=None):
    """One dict for cgroup memory, v1 or v2: limit (None = unlimited), usage, oom_kill."""
    events = parse_flat_keyed(events_text) if events_text else {}
    if oom_control_text and "oom_kill" not in events:
        events.update({k: v for k, v in parse_flat_keyed(oom_control_text).items()
                       if k == "oom_kill"})
    limit = parse_memory_limit(limit_text) if limit_text is not None else None
    return {"version": version, "limit_bytes": limit,
            "unlimited": limit is None and limit_text is not None,
            "usage_bytes": parse_int_file(usage_text) if usage_text is not None else None,
            "oom_kill": events.get("oom_kill"), "events": events}


# ---------------------------------------------------------------- /proc

def parse_meminfo(text):
    """/proc/meminfo -> {key: bytes} (kB values converted)."""
    result = {}
    for line in (text or "").splitlines():
        match = re.match(r"^(\w+(?:\(\w+\))?):\s+(\d+)(?:\s+kB)?\s*$", line.strip())
        if match:
            factor = 1024 if line.strip().endswith("kB") else 1
            result[match.group(1)] = int(match.group(2)) * factor
    return result


def parse_uptime(text):
    """/proc/uptime -> seconds since boot (float) or None."""
    parts = _first_line(text).split()
    try:
        return float(parts[0])
    except (IndexError, ValueError):
        return None
