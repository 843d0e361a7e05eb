# -*- coding: utf-8 -*-
# Copyright: rgt contributors
# SPDX-License-Identifier: Apache-2.0
"""rgt_env_check_once: env_check's look at the box. Reads the controller ledger's record of this host's last
environment check and reuses it when rgt_probe_eval.reuse allows (same instance, same host key pin, the same
rgt_env_check arguments, a verdict that did not stop the play, young enough); otherwise runs the rgt_env_check
module on the box (one round trip) and writes the record atomically. The secrets file is no part of it (its own
task runs every time). The documentation is plugins/modules/rgt_env_check_once.py."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import time

from ansible.plugins.action import ActionBase

from ansible_collections.rgt.remote_gpu.plugins.module_utils import rgt_probe_eval
from ansible_collections.rgt.remote_gpu.plugins.plugin_utils.rgt_action import earlier_record, write_record

ARGUMENT_SPEC = dict(
    check=dict(type="dict", required=True),
    report_dir=dict(type="str", default=""),
    instance_id=dict(type="str", required=True),
    pin=dict(type="str", default=""),
    max_age_s=dict(type="int", default=0),
)
KEPT = ("env_report", "stop", "stop_msg")  # what the role reads of rgt_env_check's result


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _supports_check_mode = True

    def run(self, tmp=None, task_vars=None):
        task_vars = task_vars or {}
        result = super(ActionModule, self).run(tmp, task_vars)
        _, args = self.validate_argument_spec(argument_spec=ARGUMENT_SPEC)
        host, record_file, previous = earlier_record(args["report_dir"], task_vars)
        inputs = rgt_probe_eval.probe_inputs_digest(args["check"])
        now = time.time()
        if isinstance(previous, dict) and (previous.get("result") or {}).get("stop"):
            previous = dict(previous, verdict="fail")  # a check that stopped the play is never reused as a pass
        reusable, why = rgt_probe_eval.reuse(previous, args["instance_id"], args["pin"], inputs, now,
                                             args["max_age_s"], key="checked", what="environment check",
                                             asked="interpreter, command, proxy hook, driver or fail_on")
        result.update(reused=reusable, why=why, changed=False)
        if reusable:
            kept = previous["result"]
            report = dict(kept["env_report"], checked={"reused": True, "age_s": int(now - previous["checked"]["at"])})
            result.update(env_report=report, stop=kept.get("stop"), stop_msg=kept.get("stop_msg"))
            return result
        checked = self._execute_module(module_name="rgt.remote_gpu.rgt_env_check", module_args=args["check"],
                                       task_vars=task_vars)
        if checked.get("failed") or checked.get("unreachable"):
            checked.setdefault("reused", False)
            return checked
        kept = dict((k, checked.get(k)) for k in KEPT)
        result.update(kept, changed=bool(checked.get("changed")))
        if record_file and isinstance(kept["env_report"], dict):
            # the controller's record, not state of the box: written in --check too, never a "change"
            problem = write_record(record_file, {"host": host, "instance_id": args["instance_id"],
                                                 "verdict": kept["env_report"].get("verdict"), "result": kept,
                                                 "checked": {"at": now, "pin": args["pin"], "inputs": inputs}})
            if problem:
                result.update(failed=True, msg="the environment check's record %s could not be written: %s"
                              % (record_file, problem))
        return result
