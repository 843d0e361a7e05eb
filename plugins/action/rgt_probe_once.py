# -*- coding: utf-8 -*-
# Copyright: rgt contributors
# SPDX-License-Identifier: Apache-2.0
"""rgt_probe_once: the probe role's one task. Reads the controller ledger's record of this host's last probe and
reuses it when rgt_probe_eval.reuse allows (same instance, same host key pin, same question, not failed, young
enough); otherwise runs the rgt_probe module on the box (one round trip), evaluates nothing itself (the module
does) and writes the record atomically. The documentation is plugins/modules/rgt_probe_once.py."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import os
import time

from ansible.plugins.action import ActionBase

from ansible_collections.rgt.remote_gpu.plugins.module_utils import rgt_probe_eval
from ansible_collections.rgt.remote_gpu.plugins.plugin_utils.rgt_action import earlier_record, write_record

ARGUMENT_SPEC = dict(
    probe=dict(type="dict", required=True),
    report_dir=dict(type="str", default=""),
    instance_id=dict(type="str", required=True),
    profile=dict(type="str", required=True),
    pin=dict(type="str", default=""),
    max_age_s=dict(type="int", default=0),
)


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _supports_check_mode = True

    def run(self, tmp=None, task_vars=None):
        task_vars = task_vars or {}
        result = super(ActionModule, self).run(tmp, task_vars)
        _, args = self.validate_argument_spec(argument_spec=ARGUMENT_SPEC)
        host, record_file, previous = earlier_record(args["report_dir"], task_vars)
        inputs = rgt_probe_eval.probe_inputs_digest(args["probe"])
        now = time.time()
        reusable, why = rgt_probe_eval.reuse(previous, args["instance_id"], args["pin"], inputs, now,
                                             args["max_age_s"])
        result.update(first_contact=not (record_file and os.path.exists(record_file)), reused=reusable, why=why,
                      changed=False)
        if reusable:
            report = dict(previous)
            report["probed"] = dict(previous["probed"], reused=True, age_s=int(now - previous["probed"]["at"]))
            result.update(report=report, findings=report.get("findings", []), verdict=report.get("verdict"))
            return result
        probed = self._execute_module(module_name="rgt.remote_gpu.rgt_probe", module_args=args["probe"],
                                      task_vars=task_vars)
        if probed.get("failed") or probed.get("unreachable"):
            probed.setdefault("reused", False)
            return probed
        report = dict(probed.get("report") or {})
        report.update(findings=probed.get("findings", []), verdict=probed.get("verdict"), host=host,
                      instance_id=args["instance_id"], profile=args["profile"],
                      probed={"at": now, "pin": args["pin"], "inputs": inputs, "reused": False, "age_s": 0})
        result.update(report=report, findings=report["findings"], verdict=report["verdict"],
                      changed=bool(probed.get("changed")))
        if record_file:
            # the controller's record, not state of the box: written in --check too, never a "change"
            problem = write_record(record_file, report)
            if problem:
                result.update(failed=True, msg="the probe record %s could not be written: %s" % (record_file, problem))
        return result
