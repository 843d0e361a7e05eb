#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: rgt contributors
# SPDX-License-Identifier: Apache-2.0
# The documentation of the action plugin plugins/action/rgt_upload_record.py (it runs on the controller: nothing
# here runs). The rules are plugins/module_utils/rgt_upload.py.

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: rgt_upload_record
short_description: upload_resume's report from its steps' results, and its line in the controller ledger
version_added: "0.1.0"
description:
  - Runs on the controller (an action plugin). Builds C(upload_resume_report) from what each step of the
    upload_resume role registered, whatever step stopped it, and appends it with C(at) (UTC) to
    C(<ledger_dir>/<inventory_hostname>.jsonl) (the file rewritten atomically; its directory made).
  - C(status) is C(refused) (a CRLF script with I(crlf) refuse), C(present) (code-<hash8> was on the box and
    verified), C(uploaded), C(not_deployed) (a code dir that does not verify; C(rc_hint) 3), C(checked) (check
    mode) or C(failed).
  - No ledger line in check mode, without I(ledger_dir), or when the code tree was never manifested.
author:
  - rgt contributors
options:
  run_id:
    description: The run id.
    type: str
  crlf:
    description: upload_resume_crlf.
    type: str
    choices: [refuse, allow]
    default: refuse
  data_src:
    description: The data dir asked for (upload_resume_data_src); the report has C(data) only with one.
    type: str
  started:
    description: When the upload started (seconds since the epoch); C(seconds) is measured from it.
    type: float
  ledger_dir:
    description: Controller directory of the ledger files; null for none.
    type: path
  steps:
    description:
      - The registered results, by step (an empty dict for one that did not run), C(code_tree), C(data_tree)
        (rgt_tree_manifest), C(existing) (rgt_tree_verify of code-<hash8>), C(code_rsync), C(data_rsync)
        (rgt_transfer), C(promoted), C(data_verified) (rgt_tree_verify).
    type: dict
    default: {}
notes:
  - Supports check mode (the report with status C(checked), no ledger line).
"""

EXAMPLES = r"""
- name: Record the upload
  rgt.remote_gpu.rgt_upload_record:
    run_id: run-1
    started: "{{ started }}"
    ledger_dir: /home/me/.rgt/ledger/uploads
    steps:
      code_tree: "{{ code_tree }}"
      existing: "{{ existing }}"
"""

RETURN = r"""
report:
  description: >-
    upload_resume_report: host, run_id, run_dir, status, rc_hint, hash8, code_dir, files, bytes, bytes_sent,
    files_transferred, attempts, ignored_count, crlf_scripts, crlf, symlinks_skipped, skipped, mismatches,
    missing, data ({dir, files, bytes, bytes_sent, files_transferred, attempts, verified} or null), seconds.
  returned: always
  type: dict
ledger:
  description: The ledger file written, or null.
  returned: always
  type: str
"""
