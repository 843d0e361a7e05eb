# -*- coding: utf-8 -*-
# Copyright: rgt contributors
# SPDX-License-Identifier: Apache-2.0
"""What rgt's action plugins share (plugins/action): they run on the controller only, never reach the box through
Ansible's connection, support check mode, and validate their arguments against their ARGUMENT_SPEC (the same
options as their documentation stub in plugins/modules, held by tests/unit/test_action_docs.py)."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import json
import os

from ansible.plugins.action import ActionBase

from ansible_collections.rgt.remote_gpu.plugins.module_utils import rgt_runlayout


class ControllerAction(ActionBase):
    TRANSFERS_FILES = False
    _supports_check_mode = True
    _requires_connection = False

    ARGUMENT_SPEC = {}
    VALIDATION = {}  # validate_argument_spec's other checks (required_if, mutually_exclusive, ...)

    def start(self, tmp, task_vars):
        """(result, args): the base result and the validated arguments."""
        result = super(ControllerAction, self).run(tmp, task_vars)
        _, args = self.validate_argument_spec(argument_spec=self.ARGUMENT_SPEC, **self.VALIDATION)
        return result, args


def read_record(path):
    """The ledger's JSON record of an earlier look at a box (rgt_probe_once, rgt_env_check_once), or None."""
    try:
        with open(path) as handle:
            return json.load(handle)
    except (IOError, OSError, ValueError):
        return None


def write_record(path, doc):
    """Write such a record atomically (tmp, fsync, rename; its directory made): None, or why it could not be."""
    try:
        if not os.path.isdir(os.path.dirname(path)):
            os.makedirs(os.path.dirname(path), 0o755)
        rgt_runlayout.atomic_write(path, json.dumps(doc, indent=4, sort_keys=True) + "\n")
    except (IOError, OSError) as exc:
        return str(exc)
    return None
