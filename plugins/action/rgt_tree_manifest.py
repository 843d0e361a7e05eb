# -*- coding: utf-8 -*-
# Copyright: rgt contributors
# SPDX-License-Identifier: Apache-2.0
"""rgt_tree_manifest on the controller, in Ansible's worker: the same step as the module file
(rgt_tree.manifest_step) without starting a module process for it (about 0.4 s a call). The documentation and the
argument spec are plugins/modules/rgt_tree_manifest.py."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

from ansible_collections.rgt.remote_gpu.plugins.module_utils.rgt_tree import manifest_step
from ansible_collections.rgt.remote_gpu.plugins.modules.rgt_tree_manifest import ARGUMENT_SPEC
from ansible_collections.rgt.remote_gpu.plugins.plugin_utils.rgt_action import ControllerAction


class ActionModule(ControllerAction):
    ARGUMENT_SPEC = ARGUMENT_SPEC

    def run(self, tmp=None, task_vars=None):
        result, args = self.start(tmp, task_vars or {})
        doc, warnings, failure = manifest_step(args["src"], args["ignore_file"], args["files_from"], args["crlf"])
        result.update(doc or {})
        result["changed"] = False
        if warnings:
            result["warnings"] = warnings
        if failure:
            result.update(failed=True, msg=failure)
        return result
