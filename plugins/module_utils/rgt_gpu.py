# -*- coding: utf-8 -*-
# Copyright: rgt contributors
# SPDX-License-Identifier: Apache-2.0
"""Pure parsers for nvidia-smi output and kernel-log Xid lines.

Nothing here runs a command or touches a file: the probe and status modules
collect text on the box and hand it to these functions, and the unit tests
feed them real captured outputs. Kept to the Python 3.6 standard library
because module_utils are shipped to whatever interpreter the rented box has.
"""

from __future__ import absolute_import, division, print_function

import re

__metaclass__ = type

# Spellings nvidia-smi uses for "no value" across driver generations:
# "[Not Supported]" (before ~2020), "[N/A]" (later), bare "N/A" in tables,
# "[Requested functionality has been deprecated]" in all-field dumps (R590+).
_MISSING = frozenset(["", "n/a", "[n/a]", "not supported", "[not supported]",
                      "[unknown error]", "unknown error", "[insufficient permissions]"])

# Field names whose values are text even when they look like numbers
# (driver_version "550.90" must not become the float 550.9).
_TEXT_FIELD_HINTS = ("name", "uuid", "serial", "bus_id", "version", "timestamp",
                     "pstate", "mode", "reasons.active", "reasons.supported",
                     "vbios", "board_id")

_NUMBER_WITH_UNIT = re.compile(r"^(-?\d+(?:\.\d+)?)\s*([A-Za-z%]+)?$")
_HEADER_UNIT = re.compile(r"^(\S+)\s+\[[^\]]+\]$")
_IDENTIFIER = re.compile(r"^[a-z_][a-z0-9_.]*$")

# compute-apps prints these aliases under their canonical names in the header.
_COMPUTE_APPS_ALIASES = {"used_memory": "used_gpu_memory", "name": "process_name"}


def is_missing(raw):
    """True for every spelling of "this GPU/driver has no value here"."""
    if raw is None:
        return True
    text = raw.strip()
    if text.lower() in _MISSING:
        return True
    # Any other bracketed marker, e.g. "[Requested functionality has been deprecated]".
    return text.startswith("[") and text.endswith("]")


def _is_text_field(field):
    field = (field or "").lower()
    return any(hint in field for hint in _TEXT_FIELD_HINTS)


def parse_value(raw, field=None):
    """Turn one CSV/table cell into int, float, str or None.

    Units ("92 %", "75351 MiB", "312.13 W") are dropped so `--format=csv`
    with or without `nounits` reads the same. Text fields stay strings.
    """
    if is_missing(raw):
        return None
    text = raw.strip()
    if _is_text_field(field):
        return text
    match = _NUMBER_WITH_UNIT.match(text)
    if not match:
        return text
    number = match.group(1)
    if "." in number:
        return float(number)
    return int(number)


def _split_csv_line(line):
    # nvidia-smi never quotes; values are separated by ", " (process names
    # with commas are not escaped, so split on the first N-1 separators).
    return [cell.strip() for cell in line.split(",")]


def _header_name(cell):
    match = _HEADER_UNIT.match(cell.strip())
    return (match.group(1) if match else cell.strip()).lower()


def _looks_like_header(cells, fields, aliases):
    if any(_HEADER_UNIT.match(cell) for cell in cells):
        return True
    names = [_header_name(cell) for cell in cells]
    if fields:
        first = fields[0].lower()
        return names[0] in (first, aliases.get(first, first))
    return all(_IDENTIFIER.match(name) for name in names)


def _csv_rows(text, fields, aliases):
    lines = [line.rstrip("\r") for line in (text or "").splitlines() if line.strip()]
    if not lines:
        return []
    cells = _split_csv_line(lines[0])
    if _looks_like_header(cells, fields, aliases):
        keys = [_header_name(cell) for cell in cells]
        lines = lines[1:]
    elif fields:
        keys = [aliases.get(f.lower(), f.lower()) for f in fields]
    else:
        raise ValueError("CSV has no header and no field list was given")
    rows = []
    for line in lines:
        values = _split_csv_line(line)
        if len(values) > len(keys):
            # A comma inside the last text value (process path): rejoin the tail.
            values = values[:len(keys) - 1] + [", ".join(values[len(keys) - 1:])]
        row = {}
        for index, key in enumerate(keys):
            row[key] = parse_value(values[index], key) if index < len(values) else None
        rows.append(row)
    return rows


def parse_query_gpu(text, fields=None):
    """Parse `nvidia-smi --query-gpu=<fields> --format=csv[,noheader][,nounits]`.

    `fields` is the list passed to --query-gpu; it names the columns when the
    output has no header. Returns one dict per GPU, missing values as None.
    """
    return _csv_rows(text, fields, {})


def parse_compute_apps(text, fields=None):
    """Parse `nvidia-smi --query-compute-apps=... --format=csv...`.

    An idle GPU prints only the header (or nothing with noheader): that is an
    empty list, not an error. Aliases are normalised to the header names
    nvidia-smi prints (`used_memory` -> `used_gpu_memory`, `name` -> `process_name`).
    """
    return _csv_rows(text, fields, _COMPUTE_APPS_ALIASES)


# ---------------------------------------------------------------- default table

_BANNER_SMI = re.compile(r"NVIDIA-SMI\s+(\S+)")
_BANNER_DRIVER = re.compile(r"(?:Driver|KMD) Version:\s*(\S+)")
_BANNER_CUDA = re.compile(r"CUDA (?:UMD )?Version:\s*(\S+)")
_GPU_ROW0 = re.compile(r"^\s*(\d+)\s+(.*?)\s+(On|Off|N/A)\s*$")
_MEM_CELL = re.compile(r"(\d+)\s*MiB\s*/\s*(\d+)\s*MiB")
_PROC_NEW = re.compile(r"^(\d+)\s+(\S+)\s+(\S+)\s+(\d+)\s+(\S+)\s+(.+?)\s+(\S+)$")
_PROC_OLD = re.compile(r"^(\d+)\s+(\d+)\s+(\S+)\s+(.+?)\s+(\S+)$")


def _cells(line):
    return [cell.strip() for cell in line.strip().strip("|").split("|")]


def _int_or_none(text):
    text = (text or "").strip().rstrip("%C").rstrip("W")
    try:
        return int(text)
    except ValueError:
        return None


def _watts(text):
    match = re.match(r"^\s*(\d+(?:\.\d+)?)W\s*$", text or "")
    return float(match.group(1)) if match else None


def _mib(text):
    match = re.match(r"^\s*(\d+)MiB\s*$", text or "")
    return int(match.group(1)) if match else None


def _memory_pair(cell):
    match = _MEM_CELL.search(cell or "")
    if not match:
        return None, None
    return int(match.group(1)), int(match.group(2))


def _parse_gpu_group(rows):
    """One GPU block of the table: 2 lines (pre-R450) or 3 (with MIG M.)."""
    first = _cells(rows[0])
    head = _GPU_ROW0.match(first[0]) if first else None
    if not head:
        return None
    name = head.group(2)
    gpu = {"index": int(head.group(1)), "name": name,
           "name_truncated": name.endswith("..."), "persistence_mode": head.group(3),
           "bus_id": None, "display_active": None, "ecc": None,
           "fan_pct": None, "temperature_c": None, "perf_state": None,
           "power_w": None, "power_cap_w": None,
           "memory_used_mib": None, "memory_total_mib": None,
           "utilization_pct": None, "compute_mode": None, "mig_mode": None}
    if len(first) > 1:
        parts = first[1].split()
        gpu["bus_id"] = parts[0] if parts else None
        gpu["display_active"] = parts[1] if len(parts) > 1 else None
    if len(first) > 2:
        gpu["ecc"] = first[2] or None
    if len(rows) > 1:
        _fill_second_row(gpu, _cells(rows[1]))
    if len(rows) > 2:
        third = _cells(rows[2])
        if len(third) > 2 and third[2]:
            gpu["mig_mode"] = None if is_missing(third[2]) else third[2]
    return gpu


def _fill_second_row(gpu, cells):
    left = cells[0] if cells else ""
    match = re.match(r"^(\S+)\s+(\S+)\s+(\S+)\s+(.*)$", left)
    if match:
        gpu["fan_pct"] = _int_or_none(match.group(1))
        gpu["temperature_c"] = _int_or_none(match.group(2))
        gpu["perf_state"] = None if is_missing(match.group(3)) else match.group(3)
        power = match.group(4).split("/")
        gpu["power_w"] = _watts(power[0])
        gpu["power_cap_w"] = _watts(power[1]) if len(power) > 1 else None
    if len(cells) > 1:
        # GB10 (unified memory) prints "Not Supported" here: stays None.
        gpu["memory_used_mib"], gpu["memory_total_mib"] = _memory_pair(cells[1])
    if len(cells) > 2:
        util = re.match(r"^(\S+)\s*(.*)$", cells[2])
        if util:
            gpu["utilization_pct"] = _int_or_none(util.group(1))
            gpu["compute_mode"] = util.group(2).strip() or None


def _parse_mig_group(rows):
    first = _cells(rows[0])
    ids = first[0].split() if first else []
    if len(ids) < 4 or not all(part.isdigit() for part in ids[:4]):
        return None
    used, total = _memory_pair(first[1] if len(first) > 1 else "")
    sm = first[2].split() if len(first) > 2 else []
    device = {"gpu": int(ids[0]), "gi": int(ids[1]), "ci": int(ids[2]), "mig_dev": int(ids[3]),
              "memory_used_mib": used, "memory_total_mib": total,
              "sm_count": int(sm[0]) if sm and sm[0].isdigit() else None,
              "bar1_used_mib": None, "bar1_total_mib": None}
    if len(rows) > 1:
        second = _cells(rows[1])
        device["bar1_used_mib"], device["bar1_total_mib"] = _memory_pair(
            second[1] if len(second) > 1 else "")
    return device


def _parse_process_line(content, with_instances):
    if with_instances:
        match = _PROC_NEW.match(content)
        if not match:
            return None
        gpu, gi, ci, pid, kind, name, mem = match.groups()
    else:
        match = _PROC_OLD.match(content)
        if not match:
            return None
        gpu, pid, kind, name, mem = match.groups()
        gi = ci = "N/A"
    return {"gpu": int(gpu), "gi": _int_or_none(gi), "ci": _int_or_none(ci),
            "pid": int(pid), "type": kind, "process_name": name,
            "used_memory_mib": _mib(mem)}


class _TableState:
    """Walks the default table section by section (banner, GPUs, MIG, processes)."""

    def __init__(self):
        self.result = {"smi_version": None, "driver_version": None, "cuda_version": None,
                       "gpus": [], "mig_devices": [], "processes": [],
                       "processes_state": "absent"}
        self.section = None
        self.in_body = False
        self.group = []
        self.proc_header = ""

    def flush(self):
        if not self.group:
            return
        if self.section == "gpus":
            gpu = _parse_gpu_group(self.group)
            if gpu:
                self.result["gpus"].append(gpu)
        elif self.section == "mig":
            device = _parse_mig_group(self.group)
            if device:
                self.result["mig_devices"].append(device)
        self.group = []

    def end_section(self):
        self.flush()
        self.section = None
        self.in_body = False

    def start(self, name):
        self.end_section()
        self.section = name
        if name == "procs":
            self.result["processes_state"] = "empty"

    def feed(self, line):
        stripped = line.strip()
        if "NVIDIA-SMI" in line:
            self.banner(line)
            return
        if "Persistence-M" in line:
            self.start("gpus")
            return
        if "MIG devices:" in line:
            self.start("mig")
            return
        if "Processes:" in line:
            self.start("procs")
            return
        if not stripped or stripped[0] not in "|+":
            self.end_section()
            return
        if self.section is None:
            return
        if stripped.startswith("|="):
            self.in_body = True
            return
        if not self.in_body:
            if self.section == "procs":
                self.proc_header += " " + stripped
            return
        self.body_line(stripped)

    def body_line(self, stripped):
        if stripped.startswith("+"):
            self.flush()
            return
        if self.section in ("gpus", "mig"):
            self.group.append(stripped)
            return
        content = stripped.strip("|").strip()
        if content.startswith("No running processes found"):
            self.result["processes_state"] = "none"
            return
        proc = _parse_process_line(content, " GI " in self.proc_header)
        if proc:
            self.result["processes"].append(proc)
            self.result["processes_state"] = "listed"

    def banner(self, line):
        for key, pattern in (("smi_version", _BANNER_SMI), ("driver_version", _BANNER_DRIVER),
                             ("cuda_version", _BANNER_CUDA)):
            match = pattern.search(line)
            if match:
                value = match.group(1).strip("|")
                self.result[key] = None if is_missing(value) else value


def parse_smi_table(text):
    """Parse the default `nvidia-smi` table, R418 to R610 layouts.

    Returns smi/driver/CUDA versions (R610's "KMD Version" / "CUDA UMD Version"
    included; "CUDA Version: N/A" becomes None), per-GPU rows, MIG devices and
    processes. `processes_state` says what the Processes box showed: "listed",
    "none" ("No running processes found"), "empty" (a box with no rows: the
    container cannot see host PIDs) or "absent" (no Processes box).
    """
    state = _TableState()
    for line in (text or "").splitlines():
        state.feed(line.rstrip("\r"))
    state.end_section()
    return state.result


# ---------------------------------------------------------------- nvidia-smi -q

_Q_KEY_VALUE = re.compile(r"^(.+?)\s+:\s?(.*)$")

# -q sub-keys under "Clocks Event Reasons" (R545+) / "Clocks Throttle Reasons" (<= R525).
_Q_REASON_KEYS = {
    "idle": "gpu_idle",
    "applications clocks setting": "applications_clocks_setting",
    "sw power cap": "sw_power_cap",
    "hw slowdown": "hw_slowdown",
    "hw thermal slowdown": "hw_thermal_slowdown",
    "hw power brake slowdown": "hw_power_brake_slowdown",
    "sync boost": "sync_boost",
    "sw thermal slowdown": "sw_thermal_slowdown",
    "display clock setting": "display_clock_setting",
}


def _q_tree(text):
    """Indentation tree of `nvidia-smi -q`; split on " : ", not a fixed column."""
    root = {}
    stack = [(-1, root)]
    for raw in (text or "").splitlines():
        line = raw.rstrip("\r").rstrip()
        if not line.strip() or line.strip().startswith("="):
            continue
        indent = len(line) - len(line.lstrip())
        while stack[-1][0] >= indent:
            stack.pop()
        parent = stack[-1][1]
        match = _Q_KEY_VALUE.match(line.strip())
        if match:
            parent.setdefault(match.group(1).strip(), match.group(2).strip())
            continue
        node = {}
        key = line.strip()
        if key in parent:
            key = "%s #%d" % (key, len([k for k in parent if k.startswith(key)]) + 1)
        parent[key] = node
        stack.append((indent, node))
    return root


def _active(value):
    if value is None:
        return None
    value = value.strip().lower()
    if value == "active":
        return True
    if value == "not active":
        return False
    return None


def _q_reasons(node):
    section = node.get("Clocks Event Reasons")
    naming = "event"
    if not isinstance(section, dict):
        section = node.get("Clocks Throttle Reasons")
        naming = "throttle"
    if not isinstance(section, dict):
        return None, None
    reasons = {}
    for key, value in section.items():
        name = _Q_REASON_KEYS.get(key.lower())
        if name and not isinstance(value, dict):
            reasons[name] = _active(value)
    return reasons, naming


def _q_mhz(node, section, key):
    block = node.get(section)
    if not isinstance(block, dict):
        return None
    return parse_value(block.get(key), "clocks")


def parse_query_q(text):
    """Parse `nvidia-smi -q` (or `-q -d PERFORMANCE`, `-a`).

    Per GPU: bus id, product name, the clocks event/throttle reasons as
    {name: True/False/None}, the active ones as a list, and which section name
    the driver used ("event" from R545, "throttle" up to R525).
    """
    tree = _q_tree(text)
    result = {"driver_version": None, "cuda_version": None, "attached_gpus": None, "gpus": []}
    for key, value in tree.items():
        if key in ("Driver Version", "KMD Version"):
            result["driver_version"] = value
        elif key in ("CUDA Version", "CUDA UMD Version"):
            result["cuda_version"] = None if is_missing(value) else value
        elif key == "Attached GPUs":
            result["attached_gpus"] = parse_value(value, "count")
        elif key.startswith("GPU ") and isinstance(value, dict):
            result["gpus"].append(_q_gpu(key, value))
    return result


def _q_gpu(key, node):
    reasons, naming = _q_reasons(node)
    temperature = node.get("Temperature")
    temp = None
    if isinstance(temperature, dict):
        temp = parse_value(temperature.get("GPU Current Temp"), "temperature")
    return {
        "bus_id": key.split(None, 1)[1].strip(),
        "product_name": node.get("Product Name"),
        "reasons": reasons,
        "reasons_section": naming,
        "active_reasons": sorted(k for k, v in (reasons or {}).items() if v),
        "temperature_c": temp,
        "clocks_sm_mhz": _q_mhz(node, "Clocks", "SM"),
        "clocks_max_sm_mhz": _q_mhz(node, "Max Clocks", "SM"),
    }


# ---------------------------------------------------------------- failures

def classify_smi_failure(rc, stdout="", stderr=""):
    """Say why nvidia-smi gave no usable output, or None if it worked.

    kinds: not_installed (127 / not found), driver_unreachable ("couldn't
    communicate with the NVIDIA driver", rc 9), driver_mismatch (NVML
    driver/library version mismatch), no_devices ("No devices were found"),
    failed (any other non-zero rc).
    """
    text = "%s\n%s" % (stdout or "", stderr or "")
    lowered = text.lower()
    if rc == 127 or "command not found" in lowered or "no such file or directory" in lowered:
        return {"kind": "not_installed", "message": "nvidia-smi is not installed or not on PATH"}
    if "couldn't communicate with the nvidia driver" in lowered or rc == 9:
        return {"kind": "driver_unreachable",
                "message": "nvidia-smi couldn't communicate with the NVIDIA driver"}
    if "driver/library version mismatch" in lowered:
        return {"kind": "driver_mismatch",
                "message": "NVML driver/library version mismatch (driver updated without reboot)"}
    if "no devices were found" in lowered:
        return {"kind": "no_devices", "message": "nvidia-smi: No devices were found"}
    if rc not in (0, None):
        first = next((line.strip() for line in text.splitlines() if line.strip()), "")
        return {"kind": "failed", "message": "nvidia-smi exited %s: %s" % (rc, first)}
    return None


# ---------------------------------------------------------------- kernel log / Xid

_XID_LINE = re.compile(r"NVRM: Xid \(PCI:([^)]*)\):\s*(\d+),\s*(.*)$")
_XID_PID = re.compile(r"^pid=('?)(<unknown>|\d+)\1,\s*")
_XID_NAME = re.compile(r"^name=(<unknown>|[^,]*),\s*")
_PCI_IN_TEXT = re.compile(r"\b([0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}(?:\.[0-9a-fA-F])?)\b")

# code: (severity, short meaning, advice). "re-rent" means the GPU, not the job, is at fault.
XID_CLASSES = {
    13: ("info", "graphics engine exception", "usually the application (bad kernel or "
         "out-of-range access); if it repeats with known-good code, suspect the GPU"),
    31: ("info", "GPU memory page fault (MMU fault)", "usually the application "
         "(illegal address); check the code before blaming the GPU"),
    43: ("info", "GPU stopped processing", "usually the application; restart the job"),
    45: ("info", "preemptive cleanup after an earlier error", "follows another error "
         "or a killed process; look at the Xid before it"),
    48: ("critical", "double-bit ECC error (DBE)", "re-rent: the GPU memory is failing"),
    62: ("warning", "internal micro-controller halt", "reset the GPU; re-rent if it repeats"),
    63: ("warning", "ECC page retirement / row remapping event", "reset the GPU to "
         "activate the remap; re-rent if remapping keeps happening"),
    64: ("warning", "ECC page retirement / row remapper recording failure", "reset the GPU; "
         "re-rent if it repeats"),
    74: ("critical", "NVLink error", "re-rent: the NVLink fabric of this box is faulty"),
    79: ("critical", "GPU has fallen off the bus", "re-rent: the GPU is gone until the host is "
         "serviced"),
    92: ("critical", "high single-bit ECC error rate", "re-rent: the GPU memory is degrading"),
    94: ("warning", "contained ECC error", "the affected application must restart; the GPU "
         "can keep working"),
    95: ("critical", "uncontained ECC error", "re-rent: every application on the GPU is "
         "affected and the GPU needs a reset"),
    109: ("warning", "context switch timeout", "restart the job; re-rent if it repeats"),
    119: ("critical", "GSP RPC timeout", "re-rent: the GPU's system processor stopped "
          "answering; it needs a reset"),
    120: ("warning", "GSP error", "reset the GPU; re-rent if it repeats"),
}
RE_RENT_XIDS = frozenset([48, 74, 79, 92, 95, 119])


def classify_xid(code):
    """Severity (critical|warning|info), meaning and advice for one Xid code."""
    known = XID_CLASSES.get(code)
    if known:
        severity, meaning, advice = known
    else:
        severity, meaning, advice = ("warning", "unrecognised Xid",
                                     "look it up in NVIDIA's Xid catalog")
    return {"code": code, "severity": severity, "meaning": meaning, "advice": advice,
            "re_rent": code in RE_RENT_XIDS}


def parse_xid_line(line):
    """One `NVRM: Xid (PCI:...): <code>, pid=..., name=..., <text>` line, or None.

    Works whatever prefix the line has (raw, ctime, iso, syslog, journal,
    alert wrappers). pid/name are None when the kernel printed '<unknown>' or
    left them out (Xid 63/94 lines have no name=).
    """
    match = _XID_LINE.search(line)
    if not match:
        return None
    pci_field = match.group(1).strip()
    pci = pci_field.split()[0] if pci_field else None
    gpu_instance = None
    gi = re.search(r"GPU-I:(\w+)", pci_field)
    if gi:
        gpu_instance = gi.group(1)
    rest = match.group(3)
    pid = name = None
    pid_match = _XID_PID.match(rest)
    if pid_match:
        pid = int(pid_match.group(2)) if pid_match.group(2).isdigit() else None
        rest = rest[pid_match.end():]
    name_match = _XID_NAME.match(rest)
    if name_match:
        name = None if name_match.group(1) == "<unknown>" else name_match.group(1)
        rest = rest[name_match.end():]
    return {"code": int(match.group(2)), "pci": pci, "gpu_instance": gpu_instance,
            "pid": pid, "name": name, "message": rest.strip(), "line": line.strip()}


def _fallen_off_bus_pci(lines, index):
    # The no-Xid variant spreads one message over indented continuation lines:
    # "NVRM: The NVIDIA GPU 0000:b3:00.0" / "... installed in this system has" /
    # "NVRM: fallen off the bus ...". Look back a few lines for the address.
    for back in range(index, max(-1, index - 4), -1):
        match = _PCI_IN_TEXT.search(lines[back].replace("PCI ID", ""))
        if match:
            return match.group(1)
    return None


def scan_kernel_log(text):
    """Scan dmesg/journal text for GPU health evidence.

    Returns {"xids": [...parse_xid_line dicts + lineno + classification...],
    "fallen_off_bus": [{pci, line, lineno}], "codes": sorted unique codes}.
    "fallen off the bus" lines that are not Xid lines are listed separately,
    because a GPU can drop without any Xid (R570).
    """
    lines = [line.rstrip("\r") for line in (text or "").splitlines()]
    xids = []
    fallen = []
    for index, line in enumerate(lines):
        xid = parse_xid_line(line)
        if xid:
            xid["lineno"] = index + 1
            xid.update({k: v for k, v in classify_xid(xid["code"]).items() if k != "code"})
            xids.append(xid)
            continue
        if "fallen off the bus" in line.lower():
            fallen.append({"pci": _fallen_off_bus_pci(lines, index), "line": line.strip(),
                           "lineno": index + 1})
    return {"xids": xids, "fallen_off_bus": fallen,
            "codes": sorted(set(x["code"] for x in xids))}


def gpu_health_verdict(scan):
    """Worst severity in a kernel-log scan: critical | warning | info | ok."""
    if not scan:
        return "ok"
    if scan.get("fallen_off_bus"):
        return "critical"
    order = {"critical": 3, "warning": 2, "info": 1}
    worst = 0
    for xid in scan.get("xids", []):
        worst = max(worst, order.get(xid.get("severity"), 2))
    for name, rank in order.items():
        if rank == worst:
            return name
    return "ok"
