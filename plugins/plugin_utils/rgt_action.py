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


def earlier_record(report_dir, task_vars):
    """(host, its record file or "", the ledger's record of the host's earlier look or None): the start of
    rgt_probe_once and rgt_env_check_once, whose records are <report_dir>/<inventory_hostname>.json."""
    host = str(task_vars.get("inventory_hostname"))
    record_file = os.path.join(report_dir, host + ".json") if report_dir else ""
    return host, record_file, rgt_runlayout.read_json(record_file) if record_file else None


def write_record(path, doc):
    """Write such a record atomically (tmp, fsync, rename; its directory made): None, or why it could not be."""
    try:
        if not os.path.isdir(os.path.dirname(path)):
            os.makedirs(os.path.dirname(path), 0o755)
        rgt_runlayout.atomic_write(path, json.dumps(doc, indent=4, sort_keys=True) + "\n")
    except (IOError, OSError) as exc:
        return str(exc)
    return None
