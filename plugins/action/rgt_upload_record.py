# -*- coding: utf-8 -*-
# Copyright: rgt contributors
# SPDX-License-Identifier: Apache-2.0
"""rgt_upload_record: upload_resume's last step, on the controller: its report from the steps' results and a line
in the controller ledger. The documentation is plugins/modules/rgt_upload_record.py; the rules are
plugins/module_utils/rgt_upload.py."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

from ansible_collections.rgt.remote_gpu.plugins.module_utils import rgt_upload
from ansible_collections.rgt.remote_gpu.plugins.plugin_utils.rgt_action import ControllerAction

ARGUMENT_SPEC = dict(
    run_id=dict(type="str"),
    crlf=dict(type="str", default="refuse", choices=["refuse", "allow"]),
    data_src=dict(type="str"),
    started=dict(type="float"),
    ledger_dir=dict(type="path"),
    steps=dict(type="dict", default={}),
)


class ActionModule(ControllerAction):
    ARGUMENT_SPEC = ARGUMENT_SPEC

    def run(self, tmp=None, task_vars=None):
        task_vars = task_vars or {}
        result, args = self.start(tmp, task_vars)
        unknown = sorted(set(args["steps"]) - set(rgt_upload.STEPS))
        if unknown:
            result.update(failed=True, msg="steps: unknown step(s) %s; the steps are %s" % (
                ", ".join(unknown), ", ".join(rgt_upload.STEPS)))
            return result
        host = str(task_vars.get("inventory_hostname"))
        check_mode = bool(self._task.check_mode)
        report = rgt_upload.build_report(host, args["run_id"], args["crlf"], args["steps"], args["data_src"],
                                         args["started"], check_mode)
        result.update(changed=False, report=report, ledger=None)
        # the controller's record, not state of the box: never a "change"; none for a tree that was never read
        if args["ledger_dir"] and "hash8" in (args["steps"].get("code_tree") or {}) and not check_mode:
            try:
                result["ledger"] = rgt_upload.record(args["ledger_dir"], host, report)
            except (IOError, OSError) as exc:
                result.update(failed=True, msg="the upload ledger %s could not be written: %s" % (
                    args["ledger_dir"], exc))
        return result
