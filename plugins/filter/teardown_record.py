# -*- coding: utf-8 -*-
# Copyright: rgt contributors
# SPDX-License-Identifier: Apache-2.0
"""What an earlier teardown record says of an instance, for the teardown role (the rule is rgt_cloud.record_state,
the same one the rgt_teardown module and the runner's plan read)."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
name: teardown_record
short_description: What an earlier teardown record says of this instance (gone, a stop in flight, or nothing)
description:
  - "Parses the text of C(<ledger>/teardown/<host>.json) and returns C({state, record}). C(state) is C(gone) (the
    instance is recorded gone, nothing to do), C(in_flight) (a meter-stop call was made, or was about to be, and
    no terminal state was seen; poll it, never call again) or C(none) (no record of this instance, or one that
    cannot be read, never taken as a fact)."
options:
  _input:
    description: The record's text (empty when there is none).
    type: str
    required: true
  instance_id:
    description: The instance the record must name.
    type: str
    required: true
"""

EXAMPLES = r"""
teardown_previous: "{{ (teardown_previous_raw.content | default('') | b64decode)
                       | rgt.remote_gpu.teardown_record(teardown_instance_id) }}"
"""

RETURN = r"""
_value:
  description: C({state, record}); C(record) is the parsed record, or C(None).
  type: dict
"""

import json

from ansible_collections.rgt.remote_gpu.plugins.module_utils import rgt_cloud


def teardown_record(text, instance_id):
    try:
        record = json.loads(text) if text else None
    except ValueError:
        record = None
    record = record if isinstance(record, dict) else None
    return {"state": rgt_cloud.record_state(record, instance_id), "record": record}


class FilterModule(object):
    def filters(self):
        return {"teardown_record": teardown_record}
