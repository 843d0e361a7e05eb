#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: rgt contributors
# SPDX-License-Identifier: Apache-2.0
"""Ansible module: run the job's smoke command on the controller's CPU before anything is uploaded."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: rgt_smoke
short_description: Run a job's 1-2 batch CPU smoke command locally, before anything billable
description:
  - Runs O(command) from O(chdir) with a bounded time, the GPU hidden (C(CUDA_VISIBLE_DEVICES=)), trackers off
    (C(WANDB_MODE=disabled), C(HF_HUB_OFFLINE=1)) and throw-away C(RGT_CKPT_DIR)/C(RGT_OUT_DIR).
  - Passes when the command exits 0 and prints no C(Traceback). Cheap checks before paid ones.
  - Meant to run on the controller (C(delegate_to: localhost)). Changes nothing anywhere.
version_added: "0.1.0"
author: rgt developers
options:
  command:
    description: The smoke command (a shell line), e.g. C(python train.py --steps 2).
    type: str
    required: true
  chdir:
    description: Directory to run it in (the job's code dir).
    type: path
    required: true
  timeout:
    description: Seconds before the smoke run is killed and counted as failed.
    type: float
    default: 300
  env:
    description: Extra environment (the job's non-secret env).
    type: dict
    default: {}
attributes:
  check_mode:
    support: full
    details: Runs in check mode too; it only runs a local command in a temporary directory.
"""

EXAMPLES = r"""
- name: Smoke the job on the controller's CPU
  rgt.remote_gpu.rgt_smoke:
    command: python train.py --steps 2
    chdir: examples/tiny_train
  delegate_to: localhost
  run_once: true
"""

RETURN = r"""
passed:
  description: Whether the smoke run exited 0 without a Traceback.
  type: bool
  returned: always
rc:
  description: Exit code (null on timeout).
  type: int
  returned: always
seconds:
  description: Wall time of the smoke run.
  type: float
  returned: always
tail:
  description: The last 40 lines of output.
  type: str
  returned: always
"""

import os
import shutil
import signal
import subprocess
import tempfile
import time

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.rgt.remote_gpu.plugins.module_utils.rgt_runlayout import command_script


def run_smoke(command, chdir, timeout, extra_env):
    scratch = tempfile.mkdtemp(prefix="rgt-smoke-")
    env = dict(os.environ)
    env.update(dict((k, str(v)) for k, v in (extra_env or {}).items()))
    env.update({"CUDA_VISIBLE_DEVICES": "", "WANDB_MODE": "disabled", "HF_HUB_OFFLINE": "1",
                "RGT_SMOKE": "1", "RGT_RUN_ID": "smoke", "RGT_ATTEMPT": "1",
                "RGT_CKPT_DIR": os.path.join(scratch, "ckpt"), "RGT_OUT_DIR": os.path.join(scratch, "out"),
                "RGT_RESUME_FROM": "", "RGT_PREEMPT_FILE": os.path.join(scratch, "PREEMPT"),
                "PYTHONUNBUFFERED": "1"})
    started = time.time()
    proc = subprocess.Popen(["bash", "-c", command_script(command)], cwd=chdir, env=env, stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=timeout)
        rc = proc.returncode
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        rc = None
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    text = out.decode("utf-8", "replace")
    return rc, text, time.time() - started


def main():
    module = AnsibleModule(
        argument_spec=dict(command=dict(type="str", required=True), chdir=dict(type="path", required=True),
                           timeout=dict(type="float", default=300), env=dict(type="dict", default={})),
        supports_check_mode=True)
    p = module.params
    if not os.path.isdir(p["chdir"]):
        module.fail_json(msg="smoke: code dir %s does not exist (rgt_job.code_dir)" % p["chdir"], passed=False,
                         rc=None, seconds=0.0, tail="")
    rc, text, seconds = run_smoke(p["command"], p["chdir"], p["timeout"], p["env"])
    tail = "\n".join(text.splitlines()[-40:])
    passed = rc == 0 and "Traceback" not in text
    result = dict(changed=False, passed=passed, rc=rc, seconds=round(seconds, 2), tail=tail)
    if not passed:
        why = "timed out after %ss" % p["timeout"] if rc is None else (
            "exited %s" % rc if rc != 0 else "printed a Traceback")
        module.fail_json(msg="smoke run failed on the controller (%s): fix it before paying for a GPU. "
                             "Last lines:\n%s" % (why, "\n".join(tail.splitlines()[-8:])), **result)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
