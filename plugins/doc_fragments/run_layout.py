# -*- coding: utf-8 -*-
# Copyright: rgt contributors
# SPDX-License-Identifier: Apache-2.0
"""Options every module that addresses one run on the box shares (docs/internals.md "Run spine")."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type


class ModuleDocFragment(object):
    DOCUMENTATION = r"""
options:
  durable_root:
    description:
      - Durable root of the run layout (the profile's C(roots.durable) or C(rgt_durable_root)).
      - C(~) and C({user}) are expanded on the box.
    type: str
    required: true
  project:
    description: Project directory under the durable root.
    type: str
    default: rgt
  run_id:
    description: The run's identity, C(rgt_job.run_id | default(rgt_job.name)), matching C(^[A-Za-z0-9._-]+$).
    type: str
    required: true
"""
