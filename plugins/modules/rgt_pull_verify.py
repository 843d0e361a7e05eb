#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: rgt contributors
# SPDX-License-Identifier: Apache-2.0
"""Verify a pulled capsule on the controller against the box's manifest; write PULL_VERIFIED.json."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
module: rgt_pull_verify
short_description: Verify a pulled export against its manifest and write the PULL_VERIFIED marker (controller side)
description:
  - Run with C(delegate_to=localhost). With I(incoming_manifest), first validates the freshly fetched manifest
    and moves it onto I(manifest_path) (an identical one is left as it is), returning the top-level entries to pull.
    A manifest sealed on another host or instance than I(host)/I(instance_id) is refused, named.
  - After the promotion, when the local copy I(dest) exists, returns in C(repair) the local files whose size or
    SHA-256 differs from the manifest (rsync's quick check would skip a corrupted file with the right size and
    mtime) and writes their NUL-separated list for C(rsync --from0 --files-from --ignore-times), and keeps the
    hashes it read for the verification of the same pull (I(reuse_hashes)).
  - With I(verify) the local directory I(dest) must equal the manifest exactly (missing and unexpected files are
    named), every size and SHA-256 must match, every declared checkpoint must load when a loader is importable,
    and I(verify_command) (if given) must exit 0 with cwd I(dest).
  - Success writes C(<host>.PULL_VERIFIED.json) and C(<host>.PROVENANCE.md) beside I(dest), atomically, only
    when their content changes (C(verified_at) is kept from an equal earlier marker); the provenance note first,
    the marker last. Any failure (a refused manifest, a file check, an error writing the note or the marker, such
    as a full disk) removes the marker and fails naming the cause (the files, first 20 of each kind).
options:
  dest:
    type: path
    required: true
    description: "The local capsule copy (runs/<run_id>/<host>)."
  manifest_path:
    type: path
    required: true
    description: "runs/<run_id>/<host>.manifest.json."
  incoming_manifest:
    type: path
    description: "Freshly fetched manifest to validate and move onto I(manifest_path)."
  run_id:
    type: str
    required: true
    description: "The run id the manifest must name."
  host:
    type: str
    required: true
    description: "Inventory name of the box."
  instance_id:
    type: str
    description:
      - "The box's instance id (recorded); the manifest's C(instance_id) must equal it."
      - Required with I(incoming_manifest).
  profile:
    type: str
    description: "The platform profile name (recorded in the provenance note)."
  declared_checkpoints:
    type: list
    elements: str
    default: []
    description: "Checkpoints relative to C(ckpt/): files, directories or globs (module_utils/rgt_outputs)."
  verify_command:
    type: str
    description: "Shell line run with cwd I(dest) after the file checks; must exit 0."
  verify_timeout_s:
    type: int
    default: 3600
    description: "Limit for I(verify_command)."
  not_pulled:
    type: list
    elements: dict
    description:
      - "[{path, reason}] left on the box (provenance)."
      - Omitted (a verify-only run, which does not look at the box) keeps the provenance note as it is.
  verify:
    type: bool
    default: true
    description: "Verify I(dest) (false with I(incoming_manifest) only promotes it)."
  write_marker:
    type: bool
    default: true
    description: "Write PULL_VERIFIED.json and PROVENANCE.md on success."
  reuse_hashes:
    type: bool
    default: false
    description:
      - "Take the hash of a file from the repair pass of the same pull (C(.incoming/<host>.hashes.json), written by"
      - "the promotion) while the file's device, inode, size, mtime and ctime are unchanged; other files are read."
      - "The record is removed either way: it serves one verification. The collect role sets it unless verify-only."
  max_names:
    type: int
    default: 20
    description: "Files named per kind in the failure message."
  report:
    type: dict
    description:
      - "Only build the collect role's report from the results its earlier steps registered, touching nothing:"
      - "C(closeout), C(promoted) (the manifest promotion), C(repair) and C(rsync) (the loops' C(results)),"
      - "C(verify) (this module's verification result), C(verify_only) (bool) and C(error) (the message of a step"
      - "that failed before the verification; C(failed) true when one did)."
      - "Returns C(report) (the document the runner and the teardown gate read) and C(failure) (the host's failure"
      - "message, or null when the pull is verified and every transfer succeeded)."
author: rgt developers
"""

RETURN = r"""
verified:
  type: bool
  description: "Every check passed."
manifest_sha256:
  type: str
  description: "SHA-256 of the manifest file."
entries:
  type: list
  description: "Top-level names of the capsule (one rsync session each)."
files:
  type: int
  description: "Files in the manifest."
bytes:
  type: int
  description: "Bytes in the manifest."
missing:
  type: list
  description: "Manifest paths absent locally."
unexpected:
  type: list
  description: "Local paths the manifest does not list (never deleted)."
size_mismatch:
  type: list
  description: "Paths whose size differs."
sha_mismatch:
  type: list
  description: "Paths whose SHA-256 differs."
checkpoints:
  type: list
  description: "[{path, loader, ok, detail}]"
verify_command_rc:
  type: int
  description: "Exit status of verify_command (absent when none)."
marker:
  type: str
  description: "Path of PULL_VERIFIED.json."
repair:
  type: list
  description: "Local files whose size or SHA-256 differs from the promoted manifest (promotion only)."
repair_list:
  type: str
  description: "NUL-separated list of I(repair) for rsync --from0 --files-from (null when nothing to repair)."
report:
  type: dict
  returned: with I(report)
  description: "The collect role's report (published as the fact collect_report; the runner reads it)."
  contains:
    host: {type: str, description: The inventory host.}
    run_id: {type: str, description: The run.}
    instance_id: {type: str, description: The instance the manifest must name.}
    sealed: {type: bool, description: The closeout sealed (or had sealed) the export; null when it did not run.}
    closeout: {type: str, description: The closeout's message.}
    quarantine: {type: str, description: Where a refused candidate was moved, or null.}
    capsule: {type: str, description: The sealed capsule on the box.}
    dest: {type: str, description: "The local copy, runs/<run_id>/<host>/."}
    manifest_path: {type: str, description: The promoted local manifest.}
    manifest_sha256: {type: str, description: SHA-256 of the manifest.}
    files: {type: int, description: Files in the manifest.}
    bytes: {type: int, description: Bytes in the manifest.}
    verified: {type: bool, description: Every check passed and PULL_VERIFIED.json was written.}
    verify_only: {type: bool, description: Nothing was transferred (a verification of an existing copy).}
    marker: {type: str, description: Path of PULL_VERIFIED.json, or null.}
    missing: {type: list, elements: str, description: Manifest paths absent locally.}
    unexpected: {type: list, elements: str, description: Local paths the manifest does not list.}
    size_mismatch: {type: list, elements: str, description: Paths whose size differs.}
    sha_mismatch: {type: list, elements: str, description: Paths whose SHA-256 differs.}
    checkpoints: {type: list, elements: dict, description: "[{path, loader, ok, detail}]"}
    problems: {type: list, elements: str, description: Other verification problems in plain words.}
    rsync_entries: {type: list, elements: str, description: Top-level capsule entries sent (one rsync each).}
    rsync_changed: {type: list, elements: str, description: Entries rsync changed.}
    rsync_failed: {type: list, elements: str, description: Entries whose rsync (or repair) failed.}
    repaired: {type: list, elements: str, description: Local files re-sent because they differed.}
    logs: {type: dict, description: "The closeout's record of the run's logs (module rgt_closeout), or null."}
    error: {type: str, description: The host's failure message, or null.}
failure:
  type: str
  returned: with I(report)
  description: "The host's failure message, or null."
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.rgt.remote_gpu.plugins.module_utils.rgt_pullverify import build_report, verify_pull


def main():
    module = AnsibleModule(
        argument_spec=dict(
            dest=dict(type="path", required=True),
            manifest_path=dict(type="path", required=True),
            incoming_manifest=dict(type="path"),
            run_id=dict(type="str", required=True),
            host=dict(type="str", required=True),
            instance_id=dict(type="str"),
            profile=dict(type="str"),
            declared_checkpoints=dict(type="list", elements="str", default=[]),
            verify_command=dict(type="str"),
            verify_timeout_s=dict(type="int", default=3600),
            not_pulled=dict(type="list", elements="dict", default=None),
            verify=dict(type="bool", default=True),
            write_marker=dict(type="bool", default=True),
            reuse_hashes=dict(type="bool", default=False),
            max_names=dict(type="int", default=20),
            report=dict(type="dict"),
        ),
        supports_check_mode=True,
    )
    p = module.params
    if p["report"] is not None:
        report, failure = build_report(p, module.check_mode)
        module.exit_json(changed=False, report=report, failure=failure)
    if module.check_mode:
        module.exit_json(changed=False, skipped=True, msg="nothing is pulled or verified in check mode")
    result, msg = verify_pull(p)
    if msg is not None:
        module.fail_json(msg=msg, **result)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
