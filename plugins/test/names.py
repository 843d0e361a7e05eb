# -*- coding: utf-8 -*-
# Copyright: rgt contributors
# SPDX-License-Identifier: Apache-2.0
"""Jinja test `rgt.remote_gpu.rgt_name`: the one name rule (module_utils rgt_runlayout.check_name) for the roles'
own input checks, so a playbook run without the runner refuses `..`, `.partial` or a trailing newline exactly as
`rgt-run` and the modules on the box do."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
name: rgt_name
short_description: True when a value is a valid rgt name (run id, project, host name, instance id)
description:
  - A full match of the name rule in C(plugins/module_utils/rgt_runlayout.py) (C(check_name)): letters, digits,
    C(.), C(_), C(-) (hosts and instance ids also C(:) and C(@)), starting with a letter or digit, at most 128
    characters. C(.), C(..), C(.hidden), C(a/b) and a trailing newline are not names.
options:
  _input:
    description: The value to test.
    type: str
    required: true
  what:
    description: Which rule - C(run id), C(project), C(host name) or C(instance id).
    type: str
    default: run id
"""

EXAMPLES = r"""
- ansible.builtin.assert:
    that: launch_detached_run_id is rgt.remote_gpu.rgt_name('run id')
"""

RETURN = r"""
_value:
  description: Whether the value is a valid name of that kind.
  type: bool
"""

from ansible_collections.rgt.remote_gpu.plugins.module_utils.rgt_runlayout import check_name


def rgt_name(value, what="run id"):
    return check_name(value, what) is None


class TestModule(object):
    def tests(self):
        return {"rgt_name": rgt_name}
