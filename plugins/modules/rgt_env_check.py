#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: rgt contributors
# SPDX-License-Identifier: Apache-2.0

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: rgt_env_check
short_description: Check the job's interpreter, torch/CUDA/driver pairing, proxy hook and scripts on a GPU box
version_added: "0.1.0"
description:
  - Gathers, in one round trip, what the env_check phase needs to decide whether a job can start on the box.
  - Runs the profile's proxy hook in C(bash) (C(LC_ALL=C), bounded by I(timeout)) followed by C(env -0) to
    learn
    which variables the hook exports. Only variable B(names) are reported, never values, because proxy URLs
    can embed credentials.
  - Runs the given interpreter (C(<python> -c <probe>)) with the hook's environment, I(network_env) and,
    when a
    proxy is exported, the C(no_proxy)/C(NO_PROXY) pair computed from I(no_proxy). The probe reports
    C(sys.executable), the Python version, the prefix and conda env, and whether C(torch) imports, its
    version,
    C(torch.version.cuda), C(torch.cuda.is_available()), the device count, capability and arch list.
  - The hook and the probe start from the environment the job starts from (module_utils
    C(rgt_runlayout.job_base_env), the job wrapper's rule) - the login environment without rgt's own variables
    (C(ANSIBLE_*), those of ansible-runner and tmux) and without the virtual environments rgt runs from, with the
    interpreter's directory first on C(PATH) - so C(python) in the job's command is the interpreter checked here.
  - Reads the CUDA version the driver supports from the C(nvidia-smi) header, and lists GPUs with
    C(nvidia-smi -L).
    Without C(nvidia-smi) the driver CUDA is null and the GPU checks that need it are skipped.
  - Optionally scans the scripts under I(scripts_dir) for carriage returns (CRLF line ends), with upload_resume's
    rule (module_utils C(rgt_tree)) - a script is a file with a shell suffix (C(.sh), C(.bash), C(.zsh), C(.ksh),
    C(.command)) or a shebang; data files with CRLF are fine.
  - Read-only. It B(never) creates a conda env, never runs pip, never changes the box. The interpreter is
    never discovered or guessed; it must be given explicitly.
  - Always returns C(changed=false); supports check mode (runs the same read-only probe).
author:
  - rgt contributors
options:
  python:
    description:
      - Absolute path of the interpreter the job will run with (from C(rgt_job.python) or the profile's
        C(env_contract.interpreter)). A leading C(~) and C({user}) are expanded for the login user
        (rgt_runlayout.expand_root).
      - The module fails when the path is not absolute, does not exist or is not executable.
    type: str
    required: true
  command:
    description:
      - The job's command (C(rgt_job.command)). Each interpreter it runs by name (C(python), C(python3), ...: the
        first word of a simple command) is looked up on the job's C(PATH); one that is not in the directory of
        I(python) is a C(command_interpreter) warning (the job would run another interpreter than the one checked).
      - Null skips that check.
    type: str
  proxy_hook:
    description:
      - Shell line from the profile's C(network.proxy_hook), e.g. C(source /etc/network_turbo 2>/dev/null ||
        true).
      - Null or empty means no hook. The hook's own output is discarded. Marked no_log, since a hook line can
        embed a proxy URL with credentials.
    type: str
  network_env:
    description:
      - Variables from the profile's C(network.env) (e.g. C(HF_ENDPOINT)) applied on top of the hook's
        environment when the interpreter runs. Only the names are returned.
    type: dict
    default: {}
  no_proxy:
    description:
      - Hosts the profile exempts from the proxy. Applied only when a proxy variable is exported, merged with
        C(127.0.0.1), C(localhost) and any list the hook exported, normalised to leading-dot domains without
        C(*), and set under both C(no_proxy) and C(NO_PROXY).
    type: list
    elements: str
    default: []
  scripts_dir:
    description:
      - Directory on the box whose scripts (shell suffix or shebang; recursively, symlinks not followed) are
        scanned for CRLF. upload_resume already refuses CRLF scripts in the shipped code before it is sent; this
        scan is for scripts that reach the box another way.
      - A missing directory is reported as an info finding.
    type: path
  expected_cuda_driver:
    description:
      - Minimum CUDA version (C(12.1)) the job needs the driver to support. Lower is critical; an unknown
        driver
        CUDA with this set is a warning.
    type: str
  refuse_conda_base:
    description:
      - Make an interpreter running in conda C(base) a critical finding (owned workstations; on rentals such
        as
        AutoDL the base env IS the environment).
    type: bool
    default: false
  timeout:
    description:
      - Seconds allowed for the interpreter probe (importing torch and initialising CUDA can be slow). The
        hook
        and C(nvidia-smi) get at most 30 seconds each.
    type: int
    default: 120
  fail_on:
    description:
      - Which verdict stops the play (rgt_envcheck.fails_on); the module decides, the role only acts on C(stop).
      - C(critical) stops on verdict C(fail), C(warning) also on C(warn), C(never) only reports.
    type: str
    choices: [critical, warning, never]
    default: critical
notes:
  - The probe imports C(torch) in a separate process; a hang there is killed after I(timeout) and reported.
seealso:
  - module: rgt.remote_gpu.rgt_secret_file
"""

EXAMPLES = r"""
- name: Check the interpreter, torch/CUDA and proxy hook
  rgt.remote_gpu.rgt_env_check:
    python: /root/miniconda3/bin/python
    proxy_hook: "source /etc/network_turbo 2>/dev/null || true"
    network_env:
      HF_ENDPOINT: https://hf-mirror.com
      HF_HUB_DISABLE_XET: "1"
    no_proxy: [.tuna.tsinghua.edu.cn, .aliyuncs.com, .modelscope.cn, .hf-mirror.com]
    scripts_dir: /root/autodl-tmp/myproj/active/run-1/code-0123abcd
  register: env_check_result

- name: Stop when the verdict is fail
  ansible.builtin.fail:
    msg: "{{ env_check_result.env_report.findings | selectattr('severity', 'eq', 'critical') | list }}"
  when: env_check_result.env_report.verdict == 'fail'
"""

RETURN = r"""
stop:
  description: True when the verdict reaches I(fail_on) and the play must stop.
  returned: success
  type: bool
stop_msg:
  description: >-
    The message to stop with (the verdict and the messages of the findings at the stopping severities), or null.
  returned: success
  type: str
env_report:
  description: What was found. Contains no variable values from the hook or I(network_env), only names.
  returned: success
  type: dict
  contains:
    interpreter:
      description: C(path) (sys.executable), C(version), C(prefix), C(conda_env) (null, C(base) or the env
        name).
      type: dict
      sample: {path: /root/miniconda3/bin/python, version: 3.10.14, prefix: /root/miniconda3, conda_env: base}
    torch:
      description: >-
        C(present), C(version), C(cuda) (torch.version.cuda), C(available), C(device_count), C(capability),
        C(arch_list), C(import_error) when it did not import.
      type: dict
      sample: {present: true, version: 2.3.1+cu121, cuda: "12.1", available: true, device_count: 1}
    driver_cuda:
      description: Newest CUDA the driver supports (nvidia-smi header), null without nvidia-smi.
      type: str
      sample: "12.4"
    driver_version:
      description: Driver version from the nvidia-smi header, or null.
      type: str
    gpu_count:
      description: GPUs listed by C(nvidia-smi -L); null when nvidia-smi is absent or failed.
      type: int
    proxy:
      description: >-
        C(hook) {C(set), C(rc), C(exports) (names the hook added or changed)}, C(vars_present) (names of the
        non-empty proxy variables after the hook), C(no_proxy_applied) (true when the module set
        no_proxy/NO_PROXY for the interpreter probe).
      type: dict
    network_env:
      description: C(names) of the I(network_env) variables applied.
      type: dict
    crlf:
      description: Scripts with CR line ends, each C(path), C(lines) (first 20 line numbers) and C(count).
      type: list
      elements: dict
      sample: [{path: /root/proj/run.sh, lines: [1, 2, 3], count: 3}]
    findings:
      description: Each C(id), C(severity) (critical, warning, info), C(message), C(fix) and C(data), built by
        rgt_findings.finding (the shape every phase shares; docs/internals.md "Findings").
      type: list
      elements: dict
    verdict:
      description: C(fail) with any critical finding, C(warn) with any warning, else C(ok).
      type: str
      sample: ok
"""

import json
import os
import shutil
import subprocess

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.rgt.remote_gpu.plugins.module_utils import rgt_envcheck as ec
from ansible_collections.rgt.remote_gpu.plugins.module_utils import rgt_runlayout as rl
from ansible_collections.rgt.remote_gpu.plugins.module_utils import rgt_tree as tree
from ansible_collections.rgt.remote_gpu.plugins.module_utils.rgt_findings import finding, verdict

HOOK_TIMEOUT_S = 30
SMI_TIMEOUT_S = 30
CRLF_MAX_FILES = 2000
CRLF_MAX_BYTES = 8 * 1024 * 1024
CRLF_MAX_LINES = 20
JSON_MARKER = "__RGT_ENV_JSON__"

# Runs under the job's interpreter: keep it Python 2.7/3.x compatible and free of side effects.
PROBE = r"""
import json, os, sys
out = {"executable": sys.executable, "version": "%d.%d.%d" % tuple(sys.version_info[:3]),
       "prefix": sys.prefix, "conda_meta": os.path.isdir(os.path.join(sys.prefix, "conda-meta")),
       "conda_default_env": os.environ.get("CONDA_DEFAULT_ENV")}
t = {"present": False}
try:
    import torch
except Exception as e:
    t["import_error"] = (type(e).__name__ + ": " + str(e))[:300]
else:
    t["present"] = True
    t["version"] = str(getattr(torch, "__version__", "?"))
    t["cuda"] = getattr(getattr(torch, "version", None), "cuda", None)
    import warnings
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            t["available"] = bool(torch.cuda.is_available())
        except Exception as e:
            t["available"] = False
            t["cuda_warning"] = (type(e).__name__ + ": " + str(e))[:300]
    if caught and not t.get("cuda_warning"):
        t["cuda_warning"] = str(caught[0].message)[:300]
    try:
        t["device_count"] = int(torch.cuda.device_count()) if t["available"] else 0
    except Exception:
        t["device_count"] = 0
    if t["available"] and t["device_count"]:
        try:
            t["capability"] = list(torch.cuda.get_device_capability(0))
            t["arch_list"] = list(torch.cuda.get_arch_list())
        except Exception as e:
            t["cuda_warning"] = (type(e).__name__ + ": " + str(e))[:300]
out["torch"] = t
sys.stdout.write("\n" + MARKER + json.dumps(out) + "\n")
""".replace("MARKER", repr(JSON_MARKER))


def _run(argv, env, timeout):
    """Run argv without a shell; returns (rc, stdout bytes, stderr bytes); rc None on timeout, -1 if absent.

    cwd is / so that nothing in the module's working directory can shadow an import in the probe; a new
    session lets a timeout kill the whole process group (a hook may start children).
    """
    try:
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, env=env, cwd="/", close_fds=True,
                                start_new_session=True)
    except OSError as exc:
        return -1, b"", str(exc).encode()
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, 9)
        except OSError:
            proc.kill()
        proc.communicate()
        return None, b"", b""
    return proc.returncode, out, err


def expand_value(value):
    """Profile env values may start with ~ and contain {user}; resolve both for the login user (not a path:
    not normalised)."""
    return rl.expand_user("" if value is None else str(value))


def run_hook(hook, base_env, findings):
    """Environment after the hook; the hook's stdout goes to stderr so that only `env -0` reaches stdout."""
    script = "{\n%s\n} 1>&2\nprintf '%%s=%%s\\0' RGT_HOOK_RC \"$?\"\nexec env -0\n" % hook
    rc, out, _err = _run(["bash", "-c", script], base_env, HOOK_TIMEOUT_S)
    if rc is None:
        findings.append(finding("proxy_hook_timeout", "critical",
                                "the profile's proxy hook did not finish within %ds" % HOOK_TIMEOUT_S,
                                "fix network.proxy_hook in the profile; it must return promptly"))
        return dict(base_env), None
    env = ec.parse_env0(out)
    hook_rc = env.pop("RGT_HOOK_RC", None)
    if rc == -1 or hook_rc is None:
        findings.append(finding("proxy_hook_broken", "critical",
                                "the profile's proxy hook could not run or exited its shell "
                                "(bash rc %s)" % rc,
                                "the hook must be a line bash can source; do not call exit in it"))
        return dict(base_env), None
    hook_rc = int(hook_rc) if hook_rc.isdigit() else hook_rc
    if hook_rc != 0:
        findings.append(finding("proxy_hook_rc", "warning",
                                "the profile's proxy hook returned rc %s" % hook_rc,
                                "append '|| true' only if a missing hook is acceptable on this box"))
    return env, hook_rc


def nvidia_smi(env):
    info = {"driver_cuda": None, "driver_version": None, "gpu_count": None, "state": "absent"}
    rc, out, _err = _run(["nvidia-smi"], env, SMI_TIMEOUT_S)
    if rc == -1:
        return info
    if rc is None:
        info["state"] = "timeout"
        return info
    if rc != 0:
        if b"No devices were found" in out + _err:
            info.update(gpu_count=0, state="no_devices")
        else:
            info["state"] = "failed"
        return info
    header = ec.parse_nvidia_smi_header(out.decode("utf-8", "replace"))
    info.update(driver_cuda=header["cuda"], driver_version=header["driver"], state="ok")
    rc, out, _err = _run(["nvidia-smi", "-L"], env, SMI_TIMEOUT_S)
    if rc == 0:
        info["gpu_count"] = ec.count_gpus_from_list(out.decode("utf-8", "replace"))
    return info


def scan_crlf(root):
    found = []
    scanned = 0
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in (".git", "__pycache__"))
        for name in sorted(filenames):
            path = os.path.join(dirpath, name)
            if os.path.islink(path) or not os.path.isfile(path):
                continue
            try:
                with open(path, "rb") as handle:
                    if not tree.is_script(name, handle.read(2)):
                        continue
                    scanned += 1
                    if scanned > CRLF_MAX_FILES:
                        return found, True
                    handle.seek(0)
                    data = handle.read(CRLF_MAX_BYTES)
            except (IOError, OSError):
                continue  # unreadable: not ours to judge
            lines = tree.crlf_lines(data)
            if lines:
                found.append({"path": path, "lines": lines[:CRLF_MAX_LINES], "count": len(lines)})
    return found, False


def resolve(word, path):
    """The file a command word runs: an absolute path when executable, else the first match on `path`; None."""
    if os.path.isabs(word):
        return word if os.path.isfile(word) and os.access(word, os.X_OK) else None
    return shutil.which(word, path=path or "")


def probe_interpreter(python, env, timeout):
    rc, out, err = _run([python, "-c", PROBE], env, timeout)
    if rc is None:
        return None, ("the interpreter probe did not finish within %ds (importing torch or CUDA init hung)"
                      % timeout)
    text = out.decode("utf-8", "replace")
    for line in reversed(text.splitlines()):
        if line.startswith(JSON_MARKER):
            try:
                return json.loads(line[len(JSON_MARKER):]), None
            except ValueError:
                break
    tail = err.decode("utf-8", "replace").strip().splitlines()[-3:]
    return None, "the interpreter probe failed (rc %s): %s" % (rc, " | ".join(tail) or "no output")


def main():
    module = AnsibleModule(
        argument_spec=dict(
            python=dict(type="str", required=True),
            command=dict(type="str"),
            proxy_hook=dict(type="str", no_log=True),
            network_env=dict(type="dict", default={}),
            no_proxy=dict(type="list", elements="str", default=[]),
            scripts_dir=dict(type="path"),
            expected_cuda_driver=dict(type="str"),
            refuse_conda_base=dict(type="bool", default=False),
            timeout=dict(type="int", default=120),
            fail_on=dict(type="str", choices=["critical", "warning", "never"], default="critical"),
        ),
        supports_check_mode=True,
    )
    p = module.params
    python = rl.expand_root(p["python"] or "")
    fix = ("set rgt_job.python (or the profile's env_contract.interpreter) to the absolute path of the "
           "prebuilt environment's interpreter, e.g. the output of `which python` in the shell you train "
           "from; rgt never guesses it and never creates an env")
    where = "rgt_job.python / env_contract.interpreter"
    if not os.path.isabs(python):
        module.fail_json(msg="interpreter %r (%s) is not an absolute path: %s" % (p["python"], where, fix))
    if not os.path.isfile(python) or not os.access(python, os.X_OK):
        module.fail_json(msg="interpreter %s (%s) does not exist or is not executable on this box: %s"
                         % (python, where, fix))

    findings = []
    # the environment the job starts from (the wrapper's rule): rgt's own variables and virtual environments out,
    # the interpreter's directory first on PATH, so what is probed here is what the job runs
    base_env = rl.job_base_env(os.environ, python, rl.own_prefixes())
    base_env["LC_ALL"] = "C"
    base_env.pop("LANGUAGE", None)

    hook = (p["proxy_hook"] or "").strip()
    hook_rc = None
    exports = []
    if hook:
        env, hook_rc = run_hook(hook, base_env, findings)
        exports = ec.env_changes(base_env, env)
    else:
        env = dict(base_env)
    env["LC_ALL"] = "C"

    bad_names = [n for n in p["network_env"] if not ec.valid_env_name(n)]
    if bad_names:
        module.fail_json(msg="network_env has invalid variable names: %s" % ", ".join(sorted(bad_names)))
    env.update((k, expand_value(v)) for k, v in p["network_env"].items())

    findings.extend(ec.proxy_findings(env, p["no_proxy"]))
    no_proxy = ec.compute_no_proxy(env, p["no_proxy"])
    env.update(no_proxy)
    vars_present = ec.proxy_var_names(env)

    smi = nvidia_smi(env)
    if smi["state"] in ("failed", "timeout"):
        findings.append(finding("nvidia_smi_" + smi["state"], "critical",
                                "nvidia-smi is installed but %s: the driver is not usable" % (
                                       "failed" if smi["state"] == "failed" else "hung"),
                                "reboot/replace the box, or run on a node with a working driver"))
    if smi["state"] == "no_devices":
        findings.append(finding("no_gpus", "warning",
                                "nvidia-smi runs but finds no GPUs (a no-GPU/CPU-only start mode?)",
                                "restart the instance with GPUs attached before launching a GPU job"))
    gpus_present = None if smi["gpu_count"] is None else smi["gpu_count"] > 0

    if p["command"]:  # what `python` in the command is on the job's PATH (the declared interpreter's dir first)
        findings.extend(ec.command_findings(p["command"], python, lambda word: resolve(word, env.get("PATH"))))

    info, error = probe_interpreter(python, env, p["timeout"])
    if info is None:
        findings.append(finding("interpreter_probe_failed", "critical", "%s (%s)" % (error, python),
                                "run `%s -c 'import sys; print(sys.executable)'` on the box" % python))
        info = {"executable": python, "torch": {"present": False}}
    torch_info = info.get("torch") or {"present": False}
    info["conda_env"] = ec.conda_env_name(info.get("prefix") or "", info.get("conda_meta"),
                                          info.get("conda_default_env"))
    findings.extend(ec.interpreter_findings(info, p["refuse_conda_base"]))
    findings.extend(ec.cuda_findings(smi["driver_cuda"], torch_info, gpus_present, p["expected_cuda_driver"]))

    crlf = []
    if p["scripts_dir"]:
        if os.path.isdir(p["scripts_dir"]):
            crlf, truncated = scan_crlf(p["scripts_dir"])
            if truncated:
                findings.append(finding("crlf_scan_truncated", "info",
                                        "stopped the CRLF scan after %d scripts" % CRLF_MAX_FILES, ""))
        else:
            findings.append(finding("scripts_dir_missing", "info",
                                    "scripts_dir %s does not exist yet; CRLF scan skipped"
                                    % p["scripts_dir"], ""))
    for item in crlf:
        findings.append(finding(
            "crlf", "critical",
            "%s has CRLF line ends (%d lines, first at line %d): bash fails with $'\\r': command not found"
            % (item["path"], item["count"], item["lines"][0]),
            tree.crlf_fix([item["path"]])))

    report = {
        "interpreter": {
            "path": info.get("executable") or python,
            "requested": python,
            "version": info.get("version"),
            "prefix": info.get("prefix"),
            "conda_env": info.get("conda_env"),
        },
        "torch": torch_info,
        "driver_cuda": smi["driver_cuda"],
        "driver_version": smi["driver_version"],
        "gpu_count": smi["gpu_count"],
        "proxy": {
            "hook": {"set": bool(hook), "rc": hook_rc, "exports": exports},
            "vars_present": vars_present,
            "no_proxy_applied": bool(no_proxy),
        },
        "network_env": {"names": sorted(p["network_env"])},
        "crlf": crlf,
        "findings": findings,
        "verdict": verdict(findings),
    }
    module.exit_json(changed=False, env_report=report, **stop_decision(report, p["fail_on"]))


def stop_decision(report, fail_on):
    """Whether the verdict stops the play under fail_on, and the message naming the findings that stop it."""
    if not ec.fails_on(report["verdict"], fail_on):
        return {"stop": False, "stop_msg": None}
    severities = ("critical", "warning") if fail_on == "warning" else ("critical",)
    return {"stop": True, "stop_msg": "env_check verdict is %s: %s" % (report["verdict"], " | ".join(
        f["message"] for f in report["findings"] if f["severity"] in severities))}


if __name__ == "__main__":
    main()
