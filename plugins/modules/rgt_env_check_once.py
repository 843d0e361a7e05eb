# -*- coding: utf-8 -*-
# Copyright: rgt contributors
# SPDX-License-Identifier: Apache-2.0
# The documentation of the rgt_env_check_once action plugin (plugins/action/rgt_env_check_once.py), which runs on the
# controller; this file is what ansible-doc reads.

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: rgt_env_check_once
short_description: check a box's environment with rgt_env_check, or reuse the ledger's record of a check a moment ago
version_added: "0.1.0"
description:
  - An action plugin that reads C(<report_dir>/<inventory_hostname>.json), the record of this host's last environment
    check. It is reused (the box not contacted) only when it is of the same I(instance_id), behind the same host key
    I(pin), asked the same I(check) arguments, its verdict C(ok) or C(warn) and it did not stop the play, and
    younger than I(max_age_s) (rgt_probe_eval.reuse).
  - Otherwise runs rgt.remote_gpu.rgt_env_check with I(check) on the box (one round trip) and writes the record
    atomically (tmp, fsync, rename; its directory made), in check mode too.
  - The job's secrets file is no part of it (env_check places it in a task of its own, every time).
author:
  - rgt contributors
options:
  check:
    description: The rgt_env_check module's arguments.
    type: dict
    required: true
  report_dir:
    description: Controller directory of the records; empty for none (no record, no reuse).
    type: str
    default: ""
  instance_id:
    description: rgt_instance_id of the host.
    type: str
    required: true
  pin:
    description: The identity of the host key pinned for the instance (rgt-run passes it); empty never reuses.
    type: str
    default: ""
  max_age_s:
    description: Reuse a record younger than this many seconds; 0 always checks.
    type: int
    default: 0
notes:
  - Supports check mode.
"""

EXAMPLES = r"""
- name: Check the environment, or reuse a check of it younger than 5 minutes
  rgt.remote_gpu.rgt_env_check_once:
    check:
      python: /usr/bin/python3
    report_dir: /home/me/.rgt/env_check
    instance_id: pod-9k2m4x
    pin: "{{ rgt_pin_id }}"
    max_age_s: 300
"""

RETURN = r"""
env_report:
  description: rgt_env_check's report; a reused one has C(checked) {reused, age_s}.
  returned: success
  type: dict
stop:
  description: rgt_env_check's C(stop).
  returned: success
  type: bool
stop_msg:
  description: rgt_env_check's C(stop_msg).
  returned: success
  type: str
reused:
  description: Whether the ledger's record was reused.
  returned: always
  type: bool
why:
  description: Why it was reused, or why not.
  returned: always
  type: str
"""
