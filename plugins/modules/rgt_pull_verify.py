#!/usr/bin/python
# -*- coding: utf-8 -*-
"""Verify a pulled capsule on the controller against the box's manifest; write PULL_VERIFIED.json."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
module: rgt_pull_verify
short_description: Verify a pulled export against its manifest and write the PULL_VERIFIED marker (controller side)
description:
  - Run with C(delegate_to=localhost). With I(incoming_manifest), first validates the freshly fetched manifest
    and moves it onto I(manifest_path) (an identical one is left as it is), returning the top-level entries to pull.
  - With I(verify) the local directory I(dest) must equal the manifest exactly (missing and unexpected files are
    named), every size and SHA-256 must match, every declared checkpoint must load when a loader is importable,
    and I(verify_command) (if given) must exit 0 with cwd I(dest).
  - Success writes C(<host>.PULL_VERIFIED.json) and C(<host>.PROVENANCE.md) beside I(dest), atomically, only
    when their content changes (C(verified_at) is kept from an equal earlier marker). Failure removes a stale
    marker and fails naming the files (first 20 of each kind).
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
    description: "The box's instance id (recorded)."
  profile:
    type: str
    description: "The platform profile name (recorded in the provenance note)."
  declared_checkpoints:
    type: list
    elements: str
    default: []
    description: "Checkpoints relative to C(ckpt/)."
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
  max_names:
    type: int
    default: 20
    description: "Files named per kind in the failure message."
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
"""

import json
import os
import subprocess
import time

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.rgt.remote_gpu.plugins.module_utils import rgt_manifest as mf
from ansible_collections.rgt.remote_gpu.plugins.module_utils.rgt_runlayout import atomic_write, fsync_dir, read_json

MARKER_SCHEMA = "rgt/pull-verified/v1"


def now_iso():
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def promote(module, incoming, target, run_id):
    """Validate the fetched manifest and move it onto target; False when target already held the same bytes."""
    try:
        doc, raw = mf.load_manifest(incoming, run_id)
    except mf.ManifestError as exc:
        module.fail_json(msg="the box's manifest was refused: %s" % exc.message, problems=exc.problems)
    same = False
    if os.path.isfile(target):
        with open(target, "rb") as handle:
            same = handle.read() == raw
    if same:
        os.unlink(incoming)
        return doc, raw, False
    parent = os.path.dirname(target)
    if not os.path.isdir(parent):
        os.makedirs(parent)
    os.rename(incoming, target)
    fsync_dir(parent)
    return doc, raw, True


def provenance(p, doc, sha, run_doc, checkpoints):
    lines = ["# Provenance of %s/%s" % (p["run_id"], p["host"]), "",
             "- run id: `%s`" % p["run_id"],
             "- host: `%s` (instance `%s`, profile `%s`)" % (p["host"], p["instance_id"], p["profile"] or "?"),
             "- manifest: `%s` (SHA-256 `%s`), %d files, %d bytes, sealed %s" % (
                 os.path.basename(p["manifest_path"]), sha, doc["totals"]["files"], doc["totals"]["bytes"],
                 doc.get("created_at")),
             "- job: `%s`, command `%s`, code dir `%s`" % (
                 run_doc.get("job_name"), run_doc.get("command") or "-",
                 ("code-" + run_doc["code_hash8"]) if run_doc.get("code_hash8") else "-"),
             "", "## Attempts", ""]
    attempts = run_doc.get("attempts") or []
    for a in attempts:
        lines.append("- attempt %s: started %s, ended %s, reason %s, rc %s" % (
            a.get("attempt"), a.get("started_at"), a.get("ended_at"), a.get("reason"), a.get("rc")))
    if not attempts:
        lines.append("- (no attempt records)")
    lines += ["", "## Checkpoints", ""]
    for c in checkpoints:
        state = {True: "loads", False: "DOES NOT LOAD", None: "not load-checked (no loader)"}[c["ok"]]
        lines.append("- `%s`: %s (%s)" % (c["path"], state, c.get("loader") or "-"))
    if not checkpoints:
        lines.append("- (none declared)")
    lines += ["", "## Not pulled (left on the box)", ""]
    for item in p["not_pulled"]:
        lines.append("- `%s`: %s" % (item.get("path"), item.get("reason")))
    if not p["not_pulled"]:
        lines.append("- (nothing recorded)")
    lines += ["", "Checkpoints are re-derivable only where the job is deterministic; results are not.", ""]
    return "\n".join(lines)


def write_if_changed(path, data):
    raw = data if isinstance(data, bytes) else data.encode("utf-8")
    try:
        with open(path, "rb") as handle:
            if handle.read() == raw:
                return False
    except (IOError, OSError):
        pass
    atomic_write(path, raw)
    return True


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
            max_names=dict(type="int", default=20),
        ),
        supports_check_mode=False,
    )
    p = module.params
    dest = p["dest"].rstrip("/")
    base = os.path.dirname(dest)
    marker = os.path.join(base, "%s.PULL_VERIFIED.json" % p["host"])
    prov_path = os.path.join(base, "%s.PROVENANCE.md" % p["host"])
    result = dict(changed=False, verified=False, marker=marker, dest=dest, manifest_path=p["manifest_path"])

    if p["incoming_manifest"]:
        doc, raw, moved = promote(module, p["incoming_manifest"], p["manifest_path"], p["run_id"])
        result["changed"] = moved
    else:
        try:
            doc, raw = mf.load_manifest(p["manifest_path"], p["run_id"])
        except mf.ManifestError as exc:
            removed = os.path.exists(marker)
            if removed:
                os.unlink(marker)
            module.fail_json(msg="cannot verify %s: %s" % (dest, exc.message), problems=exc.problems,
                             changed=removed, **{k: v for k, v in result.items() if k != "changed"})
    sha = mf.sha256_bytes(raw)
    result.update(manifest_sha256=sha, entries=mf.top_level_entries(doc), files=doc["totals"]["files"],
                  bytes=doc["totals"]["bytes"])
    if not p["verify"]:
        module.exit_json(**result)

    cmp_result = mf.compare(dest, doc)
    result.update((k, cmp_result[k]) for k in ("missing", "unexpected", "size_mismatch", "sha_mismatch"))
    problems = []
    described = mf.describe_problems(cmp_result, p["max_names"])
    if described:
        problems.append(described)

    # declared checkpoints: every manifest file under ckpt/<entry> (a file, or a directory's files)
    checkpoints = []
    listed = [e["path"] for e in doc["files"]]
    for rel in p["declared_checkpoints"]:
        prefix = "ckpt/" + rel.strip("/")
        members = [x for x in listed if x == prefix or x.startswith(prefix + "/")]
        if not members:
            problems.append("declared checkpoint %s is not in the manifest" % prefix)
        for member in members:
            full = os.path.join(dest, *member.split("/"))
            if member in cmp_result["missing"]:
                continue
            res = mf.load_checkpoint(full, member)
            checkpoints.append(res)
            if res["ok"] is False:
                problems.append("checkpoint %s does not load (%s): %s" % (member, res["loader"], res["detail"]))
    result["checkpoints"] = checkpoints

    if not problems and p["verify_command"]:
        env = dict(os.environ, RGT_RUN_ID=p["run_id"], RGT_PULL_DIR=dest, RGT_MANIFEST=p["manifest_path"])
        try:
            proc = subprocess.run(p["verify_command"], shell=True, cwd=dest, env=env, stdout=subprocess.PIPE,
                                  stderr=subprocess.STDOUT, timeout=p["verify_timeout_s"])
            result["verify_command_rc"] = proc.returncode
            result["verify_command_output"] = proc.stdout.decode("utf-8", "replace")[-4000:]
            if proc.returncode != 0:
                problems.append("verify_command exited %d: %s" % (
                    proc.returncode, result["verify_command_output"].strip()[-600:]))
        except subprocess.TimeoutExpired:
            result["verify_command_rc"] = None
            problems.append("verify_command ran past %d s" % p["verify_timeout_s"])

    if problems:
        if os.path.exists(marker):
            os.unlink(marker)
            fsync_dir(base)
            result["changed"] = True
            result["marker_removed"] = True
        result["problems"] = problems
        module.fail_json(msg="PULL NOT VERIFIED for %s/%s: %s" % (p["run_id"], p["host"], "; ".join(problems)),
                         **result)

    result["verified"] = True
    if p["write_marker"]:
        marker_doc = {"schema": MARKER_SCHEMA, "run_id": p["run_id"], "host": p["host"],
                      "instance_id": p["instance_id"], "manifest_sha256": sha, "files": doc["totals"]["files"],
                      "bytes": doc["totals"]["bytes"],
                      "checkpoints": [{"path": c["path"], "loader": c["loader"], "ok": c["ok"]} for c in checkpoints],
                      "verify_command": p["verify_command"]}
        old = read_json(marker)
        if isinstance(old, dict) and old.get("verified_at") and \
                dict((k, v) for k, v in old.items() if k != "verified_at") == marker_doc:
            marker_doc["verified_at"] = old["verified_at"]  # same facts: keep the marker byte-identical
        else:
            marker_doc["verified_at"] = now_iso()
        changed = write_if_changed(marker, json.dumps(marker_doc, sort_keys=True, indent=1) + "\n")
        run_doc = read_json(os.path.join(dest, "run.json")) or {}
        if p["not_pulled"] is not None or not os.path.exists(prov_path):
            p["not_pulled"] = p["not_pulled"] or []
            changed = write_if_changed(prov_path, provenance(p, doc, sha, run_doc, checkpoints)) or changed
        result["changed"] = result["changed"] or changed
        result["provenance"] = prov_path
    result["msg"] = "PULL VERIFIED: %d files, %d bytes, SHA-256 match (%s)" % (
        doc["totals"]["files"], doc["totals"]["bytes"], marker)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
