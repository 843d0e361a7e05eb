# -*- coding: utf-8 -*-
# Copyright: rgt contributors
# SPDX-License-Identifier: Apache-2.0
"""Pure decision logic for the env_check phase (runs on the remote box).

Python 3.6+ standard library only: this file is shipped inside the module payload and imported on whatever
interpreter the box offers. Nothing here runs a process or touches the network; the module gathers facts
and these functions turn them into findings, built by rgt_findings.finding (the one shape of every phase:
id, severity, message, fix, data; docs/internals.md "Findings"). Proxy values are never put into a finding or
a return value: a proxy URL can carry credentials, so only variable NAMES leave this module.
"""

from __future__ import absolute_import, division, print_function

import os
import re
import shlex

from ansible_collections.rgt.remote_gpu.plugins.module_utils.rgt_findings import finding

__metaclass__ = type

# Variables that route traffic through a proxy. no_proxy is not one of them: it only exempts hosts.
PROXY_ROUTE_VARS = ("http_proxy", "https_proxy", "all_proxy", "ftp_proxy")
NO_PROXY_VARS = ("no_proxy", "NO_PROXY")
LOOPBACK_ENTRIES = ("127.0.0.1", "localhost")

_CUDA_HEADER_RE = re.compile(r"CUDA Version:\s*([0-9]+(?:\.[0-9]+)*)")
_DRIVER_HEADER_RE = re.compile(r"Driver Version:\s*([0-9][0-9.]*)")
_VERSION_RE = re.compile(r"^\s*v?([0-9]+)(?:\.([0-9]+))?")
_IPV4_RE = re.compile(r"^[0-9]{1,3}(?:\.[0-9]{1,3}){3}(?:/[0-9]{1,2})?$")
_ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def fails_on(report_verdict, fail_on):
    """True when a verdict must stop the play under the fail_on policy (critical | warning | never)."""
    if fail_on == "never":
        return False
    if fail_on == "warning":
        return report_verdict in ("fail", "warn")
    return report_verdict == "fail"


# ----------------------------------------------------------------------------------------------------
# torch / CUDA / driver triangle: a torch wheel built for a newer CUDA than the driver supports fails at init
# ----------------------------------------------------------------------------------------------------

def parse_cuda_version(value):
    """'12.4' -> (12, 4); '11' -> (11, 0); 'cu121'-style or junk -> None. Accepts None."""
    if value is None:
        return None
    text = str(value).strip()
    if text.lower().startswith("cu") and text[2:].isdigit() and len(text) >= 5:
        # wheel tag style: cu121 -> 12.1, cu118 -> 11.8
        digits = text[2:]
        return (int(digits[:-1]), int(digits[-1]))
    m = _VERSION_RE.match(text)
    if not m:
        return None
    return (int(m.group(1)), int(m.group(2) or 0))


def format_version(version):
    return None if version is None else "%d.%d" % version


def parse_nvidia_smi_header(text):
    """Return {'cuda': '12.4' or None, 'driver': '550.54.15' or None} from plain `nvidia-smi` output.

    The header's "CUDA Version" is the newest CUDA the installed driver supports, not an installed toolkit.
    """
    text = text or ""
    cuda = _CUDA_HEADER_RE.search(text)
    driver = _DRIVER_HEADER_RE.search(text)
    return {
        "cuda": cuda.group(1) if cuda else None,
        "driver": driver.group(1) if driver else None,
    }


def count_gpus_from_list(text):
    """Number of `GPU N: ...` lines in `nvidia-smi -L` output."""
    return sum(1 for line in (text or "").splitlines() if line.startswith("GPU "))


def _arch_supports(capability, arch_list):
    """Can a torch build whose arch list is arch_list run kernels on a device of this capability?

    Exact sm_XY, an older sm of the same major (binary compatible), or PTX (compute_XY) not newer than the
    device, which the driver JIT-compiles.
    """
    major, minor = capability
    for arch in arch_list:
        kind, _, digits = str(arch).partition("_")
        if not digits.isdigit() or len(digits) < 2:
            continue
        a_major, a_minor = int(digits[:-1]), int(digits[-1])
        if kind == "sm" and a_major == major and a_minor <= minor:
            return True
        if kind == "compute" and (a_major, a_minor) <= (major, minor):
            return True
    return False


def cuda_findings(driver_cuda, torch_info, gpus_present, expected_cuda_driver=None):
    """Findings for the driver <-> torch.version.cuda <-> is_available triangle.

    driver_cuda: the nvidia-smi header's CUDA version string ("12.4") or None when unknown.
    torch_info: {"present", "version", "cuda", "available", "device_count", "capability", "arch_list",
                 "cuda_warning"} as reported by the interpreter probe.
    gpus_present: True when nvidia-smi listed GPUs, False when it ran and listed none, None when unknown.
    expected_cuda_driver: the minimum CUDA version the job needs the driver to support, or None.
    """
    out = []
    driver = parse_cuda_version(driver_cuda)
    wanted = parse_cuda_version(expected_cuda_driver)

    if wanted is not None:
        if driver is None:
            out.append(finding(
                "driver_cuda_unknown", "warning",
                "the job expects a driver supporting CUDA %s but nvidia-smi reported no CUDA version"
                % format_version(wanted),
                "check that nvidia-smi works on the box, or drop expected_cuda_driver"))
        elif driver < wanted:
            out.append(finding(
                "driver_older_than_expected", "critical",
                "the driver supports CUDA up to %s but the job expects at least %s"
                % (format_version(driver), format_version(wanted)),
                "rent a box with a newer driver, or use a torch build for CUDA <= %s"
                % format_version(driver)))

    torch_info = torch_info or {}
    if not torch_info.get("present"):
        if gpus_present:
            out.append(finding(
                "torch_missing", "warning",
                "the interpreter cannot import torch on a GPU box (%s)"
                % (torch_info.get("import_error") or "ImportError"),
                "use the prebuilt environment's interpreter (rgt_job.python); do not pip install torch over "
                "the image's build"))
        return out

    torch_cuda = parse_cuda_version(torch_info.get("cuda"))
    available = bool(torch_info.get("available"))
    device_count = int(torch_info.get("device_count") or 0)
    warning_text = torch_info.get("cuda_warning") or ""
    torch_label = "torch %s" % (torch_info.get("version") or "?")

    if torch_cuda is None:
        if gpus_present:
            out.append(finding(
                "torch_cpu_build", "warning",
                "%s is a CPU-only build (torch.version.cuda is None) on a box with GPUs" % torch_label,
                "use the image's CUDA build of torch; filter torch/torchvision/torchaudio pins out of "
                "requirements before pip install"))
        return out

    specific = False
    if driver is not None and torch_cuda > driver:
        major_gap = torch_cuda[0] > driver[0]
        if major_gap or not available:
            specific = True
            out.append(finding(
                "torch_cuda_newer_than_driver", "critical",
                "%s is built for CUDA %s but the driver supports only CUDA %s: CUDA failure 804 / "
                "'the NVIDIA driver on your system is too old'%s"
                % (torch_label, format_version(torch_cuda), format_version(driver),
                   (" (torch said: %s)" % warning_text[:200]) if warning_text else ""),
                "install a torch build for CUDA <= %s (or keep the image's torch), or use a box with a newer "
                "driver" % format_version(driver)))
        else:
            out.append(finding(
                "torch_cuda_minor_newer_than_driver", "warning",
                "%s is built for CUDA %s, newer than the driver's %s; it runs through CUDA minor-version "
                "compatibility, but kernels needing PTX JIT can fail"
                % (torch_label, format_version(torch_cuda), format_version(driver)),
                "prefer a torch build for CUDA <= %s" % format_version(driver)))

    if not available and gpus_present and not specific:
        out.append(finding(
            "cuda_unavailable", "critical",
            "%s (CUDA %s) reports torch.cuda.is_available() == False although nvidia-smi lists GPUs%s"
            % (torch_label, format_version(torch_cuda),
               (" (torch said: %s)" % warning_text[:200]) if warning_text else ""),
            "check CUDA_VISIBLE_DEVICES, the driver/torch pairing and that the job runs on a GPU node"))

    if available and device_count == 0 and gpus_present:
        out.append(finding(
            "cuda_no_devices", "critical",
            "torch sees CUDA but no devices (CUDA_VISIBLE_DEVICES hides them?)",
            "unset or fix CUDA_VISIBLE_DEVICES"))

    capability = torch_info.get("capability")
    arch_list = torch_info.get("arch_list") or []
    if available and capability and arch_list:
        cap = (int(capability[0]), int(capability[1]))
        if not _arch_supports(cap, arch_list):
            out.append(finding(
                "no_kernel_image", "critical",
                "%s has no kernels for this GPU (compute capability %d.%d; built for %s): "
                "'no kernel image is available for execution on the device'"
                % (torch_label, cap[0], cap[1], ", ".join(str(a) for a in arch_list)),
                "use a torch build that supports sm_%d%d (newer GPUs need newer CUDA wheels)" % cap))
    return out


# ----------------------------------------------------------------------------------------------------
# interpreter
# ----------------------------------------------------------------------------------------------------

def conda_env_name(prefix, conda_meta_present, conda_default_env=None):
    """'base' for a conda root prefix, the env's name for <root>/envs/<name>, None outside conda."""
    if not conda_meta_present:
        return None
    parts = str(prefix).rstrip("/").split("/")
    if len(parts) >= 2 and parts[-2] == "envs":
        return parts[-1]
    return "base" if conda_default_env in (None, "", "base") else conda_default_env


def interpreter_findings(info, refuse_conda_base=False):
    out = []
    if info.get("conda_env") == "base" and refuse_conda_base:
        out.append(finding(
            "conda_base", "critical",
            "the interpreter %s runs in conda base; this profile refuses base" % info.get("executable"),
            "create or pick a project env (conda env list), confirm sys.executable is under "
            ".../envs/<proj>/, and pass it as rgt_job.python"))
    return out


# ----------------------------------------------------------------------------------------------------
# the interpreter the command runs: `python train.py` looks `python` up on the job's PATH, where the declared
# interpreter's directory comes first (rgt_runlayout.job_base_env); a name that directory lacks runs another one
# ----------------------------------------------------------------------------------------------------

_PYTHON_NAME = re.compile(r"python[0-9.]*\Z")
_LEADERS = ("exec", "env", "time", "nohup", "command")  # words that run the next word
_ASSIGNMENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*=")


def command_interpreters(command):
    """The Python interpreters a job command runs by name: the first word of each simple command (each line, and
    after `&&`, `||`, `;`, `|`, `&`, `(`; past `VAR=value` and exec/env/time/nohup) that is python, python3,
    python3.11, ... bare or as a path. In order, each once; a line shlex cannot read (an open quote) is skipped."""
    out = []
    for line in (command or "").splitlines():
        try:
            words = list(shlex.shlex(line, posix=True, punctuation_chars=True))
        except ValueError:
            continue
        start = True
        for word in words:
            if word and set(word) <= set("&|;()<>"):
                start = True
                continue
            if not start:
                continue
            if _ASSIGNMENT.match(word) or word in _LEADERS:
                continue
            start = False
            if _PYTHON_NAME.match(os.path.basename(word)) and word not in out:
                out.append(word)
    return out


def command_findings(command, python, resolve):
    """A warning for each interpreter the command runs (command_interpreters) that is not in rgt_job.python's
    directory: env_check examined that one, the job would run another. `resolve(word)` is the path a word runs on
    the job's PATH (None when nothing does); a relative path (./venv/bin/python) is not judged."""
    out = []
    want = os.path.dirname(os.path.normpath(python))
    for word in command_interpreters(command):
        if "/" in word and not os.path.isabs(word):
            continue
        found = resolve(word)
        if found and os.path.dirname(os.path.normpath(found)) == want:
            continue
        where = ("%s on the job's PATH" % found) if found else "not found on the job's PATH"
        out.append(finding(
            "command_interpreter", "warning",
            "rgt_job.command runs `%s`, which is %s: not in %s, the directory of rgt_job.python %s that env_check "
            "examined" % (word, where, want, python),
            "run the interpreter by a name that directory has (e.g. `%s train.py`) or by its path, or set "
            "rgt_job.python to the interpreter the command means" % os.path.basename(python),
            data={"word": word, "resolved": found}))
    return out


# ----------------------------------------------------------------------------------------------------
# proxies and no_proxy: a platform's proxy hook (e.g. AutoDL's /etc/network_turbo) exports both casings
# ----------------------------------------------------------------------------------------------------

def proxy_var_names(env):
    """Sorted names of the non-empty proxy-related variables (route and no_proxy ones, any casing)."""
    return sorted(name for name, value in env.items() if "proxy" in name.lower() and value)


def proxy_present(env):
    """True when any route proxy variable (http/https/all/ftp, either casing) is set and non-empty."""
    return any(env.get(n) or env.get(n.upper()) for n in PROXY_ROUTE_VARS)


def normalize_no_proxy_entry(entry):
    """Apply the exemption rules to one entry; returns the entry or None to drop it.

    - `*` alone is dropped (tools disagree about it; it would silently disable the proxy everywhere);
    - `*.example.com` and `example.com` become `.example.com` (leading-dot domain, no wildcard);
    - IPs, CIDRs, `localhost`, and host:port entries are kept as written.
    """
    text = str(entry).strip()
    if not text or text == "*":
        return None
    while text.startswith("*"):
        text = text[1:]
    if not text or text == ".":
        return None
    bare = text.lstrip(".")
    if bare == "localhost" or _IPV4_RE.match(bare) or ":" in bare:
        return bare
    if "." not in bare:
        # a single-label host name (e.g. an internal "metadata" host): exact match, no dot
        return bare
    return "." + bare


def split_no_proxy(value):
    return [p for p in (s.strip() for s in (value or "").split(",")) if p]


def compute_no_proxy(env, profile_no_proxy):
    """Return {'no_proxy': v, 'NO_PROXY': v} to apply, or {} when no proxy is exported.

    The value is the union, in order, of 127.0.0.1 and localhost, the entries the environment already
    carries (either casing, e.g. the list /etc/network_turbo exports) and the profile's entries, each
    normalized by normalize_no_proxy_entry, without duplicates. Both casings get the same value.
    """
    if not proxy_present(env):
        return {}
    merged = []
    sources = list(LOOPBACK_ENTRIES)
    sources += split_no_proxy(env.get("no_proxy")) + split_no_proxy(env.get("NO_PROXY"))
    sources += list(profile_no_proxy or [])
    for raw in sources:
        entry = normalize_no_proxy_entry(raw)
        if entry and entry not in merged:
            merged.append(entry)
    value = ",".join(merged)
    return {"no_proxy": value, "NO_PROXY": value}


def proxy_findings(env, profile_no_proxy):
    """Findings about the environment the hook produced (names only; values never quoted)."""
    out = []
    present = proxy_present(env)
    lower, upper = env.get("no_proxy"), env.get("NO_PROXY")
    if present and (lower or "") != (upper or ""):
        out.append(finding(
            "no_proxy_casing", "info",
            "no_proxy and NO_PROXY differ in the hook's environment; rgt sets both to the same merged list",
            "export both casings with the same value in your own shells"))
    wildcard = [e for e in split_no_proxy(lower) + split_no_proxy(upper) if e.startswith("*")]
    wildcard += [e for e in (profile_no_proxy or []) if str(e).strip().startswith("*")]
    if wildcard:
        out.append(finding(
            "no_proxy_wildcard", "info",
            "no_proxy entries with '*' are not honoured consistently; rgt rewrites them as "
            "leading-dot domains",
            "write exemptions as .example.com (leading dot, no '*')"))
    if not present and (lower or upper):
        out.append(finding(
            "no_proxy_without_proxy", "info",
            "no_proxy is set but no proxy is exported; clear both casings when unsetting a proxy", ""))
    return out


# Variables bash itself maintains; a change in them says nothing about the hook.
_SHELL_BOOKKEEPING = frozenset(("PWD", "OLDPWD", "SHLVL", "_"))


def env_changes(before, after):
    """Sorted names of variables the hook added or changed (values are not returned)."""
    return sorted(name for name, value in after.items()
                  if before.get(name) != value and name not in _SHELL_BOOKKEEPING)


def valid_env_name(name):
    return bool(_ENV_NAME_RE.match(str(name)))


def parse_env0(data):
    """Parse `env -0` output (bytes) into a dict of text; undecodable bytes are replaced."""
    env = {}
    for item in data.split(b"\0"):
        if not item or b"=" not in item:
            continue
        name, _, value = item.partition(b"=")
        env[name.decode("utf-8", "replace")] = value.decode("utf-8", "replace")
    return env


# CRLF (a CR before the LF breaks shell scripts): the rule (what is a script, which line ends count) lives in
# rgt_tree, shared with upload_resume; the rgt_env_check module applies it on the box.
