#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: rgt contributors
# SPDX-License-Identifier: Apache-2.0

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: rgt_tree_verify
short_description: Verify a shipped tree on the box against its manifest (SHA-256), optionally promote it
version_added: "0.1.0"
description:
  - Runs on the box, one round trip. Hashes every manifest file under I(dir) (1 MiB chunks; a size mismatch
    is reported without hashing) and lists mismatches, missing files and extra files (present on the box,
    absent from the manifest).
  - C(ok) is true when nothing is missing or different. Extra files do not make C(ok) false (a running job may
    write C(__pycache__) into its code dir); I(remove_extra) deletes them, for a private staging dir only.
  - With I(promote_to) and C(ok), renames I(dir) to I(promote_to) (same filesystem, atomic) and never overwrites
    an existing I(promote_to); with I(record_file), appends I(record) as one JSON line (fsync'd) after a
    promotion, or after a successful verification when I(promote_to) is not given.
  - C(~) and the profile placeholder C({user}) are expanded on the box in every path option.
author:
  - rgt contributors
options:
  dir:
    description: The directory to verify.
    type: str
    required: true
  manifest:
    description: Files expected under I(dir), as returned by rgt_tree_manifest.
    type: list
    elements: dict
    required: true
  remove_extra:
    description: Delete extra files and directories left empty (only for a private staging dir, never a live one).
    type: bool
    default: false
  promote_to:
    description: When the tree verifies, rename I(dir) to this path (refused when it exists).
    type: str
  record_file:
    description: JSONL file to append I(record) to (its directory is created).
    type: str
  record:
    description: The JSON object to append; C(at) (UTC, ISO 8601) is added when absent.
    type: dict
  fail_on_mismatch:
    description:
      - Fail the task (with C(rc_hint) 3, "refuse to launch") when I(dir) exists and does not verify; the
        message names the files.
    type: bool
    default: false
  required:
    description: With I(fail_on_mismatch), also fail when I(dir) does not exist.
    type: bool
    default: false
  list_limit:
    description: At most this many entries in each of mismatches, missing and extra (counts are exact).
    type: int
    default: 200
notes:
  - Supports check mode (verifies, never deletes, renames or appends).
"""

EXAMPLES = r"""
- name: Verify and promote the staged code tree
  rgt.remote_gpu.rgt_tree_verify:
    dir: /workspace/proj/active/run-1/.code-0123abcd.partial
    manifest: "{{ tree.manifest }}"
    remove_extra: true
    promote_to: /workspace/proj/active/run-1/code-0123abcd
    record_file: /workspace/proj/active/run-1/.rgt/uploads.jsonl
    record: {code_dir: /workspace/proj/active/run-1/code-0123abcd, hash8: 0123abcd, files: 12, bytes: 4096}
"""

RETURN = r"""
dir:
  description: I(dir), expanded on the box.
  returned: always
  type: str
exists:
  description: Whether I(dir) existed.
  returned: always
  type: bool
ok:
  description: Every manifest file present with the expected size and SHA-256.
  returned: always
  type: bool
mismatches:
  description: Files that differ.
  returned: always
  type: list
  elements: dict
  sample: [{"path": "train.py", "expected": "9f86...", "actual": "2c26...", "expected_bytes": 10,
            "actual_bytes": 10, "reason": "content differs"}]
missing:
  description: Manifest paths absent under I(dir) (empty when I(dir) itself is absent; see missing_count).
  returned: always
  type: list
  elements: str
mismatch_count:
  description: Number of files that differ.
  returned: always
  type: int
missing_count:
  description: Number of missing files (all of them when I(dir) is absent).
  returned: always
  type: int
extra:
  description: Files under I(dir) that are not in the manifest.
  returned: always
  type: list
  elements: str
extra_count:
  description: Number of extra files.
  returned: always
  type: int
removed:
  description: Extra files deleted (I(remove_extra)).
  returned: always
  type: int
promoted:
  description: Whether I(dir) was renamed to I(promote_to).
  returned: always
  type: bool
promote_to:
  description: I(promote_to), expanded, or null.
  returned: always
  type: str
recorded:
  description: Whether a line was appended to I(record_file).
  returned: always
  type: bool
files:
  description: Files in the manifest.
  returned: always
  type: int
bytes:
  description: Bytes in the manifest.
  returned: always
  type: int
"""

import datetime
import os

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.rgt.remote_gpu.plugins.module_utils.rgt_runlayout import (
    append_jsonl,
    expand_root,
    fsync_dir,
)
from ansible_collections.rgt.remote_gpu.plugins.module_utils.rgt_tree import (
    TreeError,
    remove_extra,
    verify_tree,
)


def expand(path):
    return expand_root(path) if path else path


def describe_failure(doc):
    """One line naming what does not match (NOT DEPLOYED: the launch must not use this tree)."""
    if not doc["exists"]:
        return "NOT DEPLOYED: %s does not exist on the box" % doc["dir"]
    parts = []
    if doc["mismatches"]:
        parts.append("differs: " + ", ".join(
            "%s (%s)" % (m["path"], m["reason"]) for m in doc["mismatches"][:20]))
    if doc["missing_count"]:
        parts.append("missing: " + ", ".join(doc["missing"][:20]))
    more = doc["mismatch_count"] + doc["missing_count"] - min(20, len(doc["mismatches"])) - min(
        20, len(doc["missing"]))
    return "NOT DEPLOYED: %s does not match the local manifest (%d file(s) differ, %d missing) - %s%s" % (
        doc["dir"], doc["mismatch_count"], doc["missing_count"], "; ".join(parts),
        " (and %d more)" % more if more > 0 else "")


def main():
    module = AnsibleModule(
        argument_spec=dict(
            dir=dict(type="str", required=True),
            manifest=dict(type="list", elements="dict", required=True),
            remove_extra=dict(type="bool", default=False),
            promote_to=dict(type="str"),
            record_file=dict(type="str"),
            record=dict(type="dict"),
            fail_on_mismatch=dict(type="bool", default=False),
            required=dict(type="bool", default=False),
            list_limit=dict(type="int", default=200),
        ),
        supports_check_mode=True,
    )
    p = module.params
    root = expand(p["dir"])
    promote_to = expand(p["promote_to"])
    record_file = expand(p["record_file"])
    for item in p["manifest"]:
        if not isinstance(item.get("path"), str) or "sha256" not in item or "bytes" not in item:
            module.fail_json(msg="each manifest entry needs path, bytes and sha256: %r" % (item,))
    try:
        doc = verify_tree(root, p["manifest"], list_limit=p["list_limit"])
    except TreeError as exc:
        module.fail_json(msg=str(exc))
    extra_all = doc.pop("extra_all", [])
    doc.update(removed=0, promoted=False, promote_to=promote_to, recorded=False)
    changed = False
    if p["remove_extra"] and extra_all and doc["exists"] and not module.check_mode:
        doc["removed"] = remove_extra(root, extra_all, [item["path"] for item in p["manifest"]])
        changed = changed or doc["removed"] > 0
    if p["fail_on_mismatch"] and not doc["ok"] and (doc["exists"] or p["required"]):
        module.fail_json(msg=describe_failure(doc), rc_hint=3, changed=changed, **doc)
    if doc["ok"] and promote_to:
        if os.path.lexists(promote_to):
            module.fail_json(msg="%s already exists; a code dir is immutable and never overwritten" % promote_to,
                             **doc)
        if not module.check_mode:
            os.rename(root, promote_to)
            fsync_dir(os.path.dirname(promote_to))
            doc["promoted"] = True
            changed = True
    if doc["ok"] and record_file and (doc["promoted"] or not promote_to) and not module.check_mode:
        record = dict(p["record"] or {})
        record.setdefault("at", datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"))
        directory = os.path.dirname(record_file)
        if directory and not os.path.isdir(directory):
            os.makedirs(directory)
        append_jsonl(record_file, record)
        doc["recorded"] = True
        changed = True
    module.exit_json(changed=changed, **doc)


if __name__ == "__main__":
    main()
