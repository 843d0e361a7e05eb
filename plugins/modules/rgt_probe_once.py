#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: rgt contributors
# SPDX-License-Identifier: Apache-2.0
# The documentation of the action plugin plugins/action/rgt_probe_once.py (it runs on the controller and calls the
# rgt_probe module on the box: nothing here runs). The reuse rule is rgt_probe_eval.reuse.

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: rgt_probe_once
short_description: probe a box with rgt_probe, or reuse the ledger's record of a probe of it a moment ago
version_added: "0.1.0"
description:
  - An action plugin that reads C(<report_dir>/<inventory_hostname>.json), the record of this host's last probe. It
    is reused (the box not contacted) only when it is of the same I(instance_id), behind the same host key
    I(pin), asked the same I(probe) arguments, its verdict C(ok) or C(warn) (a probe that found a blocking problem
    is never reused), and younger than I(max_age_s) (rgt_probe_eval.reuse).
  - Otherwise runs rgt.remote_gpu.rgt_probe with I(probe) on the box (one round trip) and writes the record
    atomically (tmp, fsync, rename; its directory made), in check mode too.
author:
  - rgt contributors
options:
  probe:
    description: The rgt_probe module's arguments.
    type: dict
    required: true
  report_dir:
    description: Controller directory of the probe records; empty for none (no record, no reuse).
    type: str
    default: ""
  instance_id:
    description: rgt_instance_id of the host.
    type: str
    required: true
  profile:
    description: The platform profile's name, kept in the record.
    type: str
    required: true
  pin:
    description: The identity of the host key pinned for the instance (rgt-run passes it); empty never reuses.
    type: str
    default: ""
  max_age_s:
    description: Reuse a record younger than this many seconds; 0 always probes.
    type: int
    default: 0
notes:
  - Supports check mode.
"""

EXAMPLES = r"""
- name: Probe the box, or reuse a probe of it younger than 5 minutes
  rgt.remote_gpu.rgt_probe_once:
    probe:
      durable_root: /workspace
      project: rgt
    report_dir: /home/me/.rgt/probe
    instance_id: pod-9k2m4x
    profile: runpod
    pin: "{{ rgt_pin_id }}"
    max_age_s: 300
"""

RETURN = r"""
report:
  description: The probe report (rgt_probe's report with findings, verdict, host, instance_id, profile, and
    C(probed) {at, pin, inputs, reused, age_s}).
  returned: success
  type: dict
findings:
  description: The probe's findings.
  returned: success
  type: list
verdict:
  description: ok, warn or fail.
  returned: success
  type: str
first_contact:
  description: No record of this host was in the ledger.
  returned: always
  type: bool
reused:
  description: The record was reused; the box was not contacted.
  returned: always
  type: bool
why:
  description: Why the record was or was not reused.
  returned: always
  type: str
"""
