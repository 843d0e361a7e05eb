#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: rgt contributors
# SPDX-License-Identifier: Apache-2.0
"""Close out a finished run on the box: build, validate and seal export/<run_id>, write its manifest."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
module: rgt_closeout
short_description: Seal a finished run as export/<run_id> with an external manifest, in one round trip
description:
  - Builds the candidate C(<project>/export/.partial/<run_id>/) from the run (C(out/<outputs>) or all of C(out/),
    C(ckpt/<declared>) only, and a generated C(run.json)), validates it (every declared output exists, no
    symlink or special file on any exported path, declared checkpoints load when a loader is importable), then
    renames it to C(export/<run_id>/) in one atomic rename and writes C(export/<run_id>.manifest.json) (outside
    the capsule) atomically.
  - An output or checkpoint entry is a file, a directory (collected recursively, regular files only; a trailing
    C(/) requires a directory) or a glob (C(*), C(?), C([...]) matched per path component, e.g.
    C(checkpoint-*/model.safetensors)); a glob needs at least one match. Every component from the run directory
    down (C(out/) and C(ckpt/) included) is opened without following a symlink and files are copied from the
    opened descriptor (module_utils/rgt_outputs); a symlink anywhere refuses the candidate, named.
  - A failed candidate is moved to C(quarantine/<run_id>--<attempt>/) (a suffix is added when that exists) with
    C(REASON.txt), and the module fails with the reason.
  - A sealed export is never overwritten; a second closeout is a no-op (C(changed=false), "already sealed").
  - See docs/internals.md "Closeout, pull, verification, teardown".
extends_documentation_fragment:
  - rgt.remote_gpu.run_layout
options:
  host:
    type: str
    required: true
    description: "Inventory name of the box (recorded in run.json and the manifest)."
  instance_id:
    type: str
    description: "The platform's instance id (recorded)."
  job_name:
    type: str
    description: "The job's name (recorded in run.json; default the run id)."
  outputs:
    type: list
    elements: str
    default: []
    description: "Required outputs under C(out/): files, directories or globs; empty exports all of C(out/)."
  declared_checkpoints:
    type: list
    elements: str
    default: []
    description: "Checkpoints relative to C(ckpt/): files, directories or globs."
  attempt:
    type: int
    description: "Attempt number for the quarantine name; default the last one in attempts.jsonl."
  force_unfinished:
    type: bool
    default: false
    description: "Seal a run whose exit.json does not say finished."
  loader_python:
    type: str
    description: "Interpreter for the checkpoint load checks (the job's); default this one."
author: rgt developers
"""

RETURN = r"""
sealed:
  type: bool
  description: "True when export/<run_id> exists after the call."
capsule:
  type: str
  description: "Path of export/<run_id>."
manifest_path:
  type: str
  description: "Path of export/<run_id>.manifest.json."
manifest_sha256:
  type: str
  description: "SHA-256 of the manifest file's bytes."
files:
  type: int
  description: "Files in the capsule."
bytes:
  type: int
  description: "Bytes in the capsule."
checkpoints:
  type: list
  description: "[{path, loader, ok, detail}] for every declared checkpoint file."
not_pulled:
  type: list
  description: "[{path, reason}] what the run holds that the capsule does not."
quarantine:
  type: str
  description: "Where a failed candidate was moved (failure only)."
reason:
  type: str
  description: "Why the candidate failed (failure only)."
"""

import json
import os
import shutil
import time

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.rgt.remote_gpu.plugins.module_utils import rgt_manifest as mf
from ansible_collections.rgt.remote_gpu.plugins.module_utils import rgt_outputs as outs
from ansible_collections.rgt.remote_gpu.plugins.module_utils.rgt_runlayout import (
    RUN_LAYOUT_ARGS,
    RunPaths,
    atomic_write,
    expand_root,
    fsync_dir,
    read_json,
    read_jsonl,
)


def now_iso():
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def gather(run_dir, sub, entries, partial, what, everything=False):
    """Copy what `entries` name under <run_dir>/<sub> (`out`, `ckpt`) into <partial>/<sub>, never through a
    symlink (module_utils/rgt_outputs). everything=True takes all of <sub>. Returns (copied paths relative to
    <sub>, problems)."""
    label = sub + "/"
    problems = []
    try:
        base = outs.open_run_subdir(run_dir, sub)
    except outs.Refused as exc:
        return [], ["%s: %s" % ("everything in out/" if everything else what + "s", exc)]
    if base is None:
        if everything:
            return [], ["out/ is missing"]
        return [], [outs.missing_words(e, label, what) for e in entries]
    try:
        if everything:
            files = outs.walk_files(base, "", label, problems)
        else:
            res = outs.resolve(base, entries, label)
            files = res["files"]
            problems += [outs.missing_words(e, label, what) for e in res["missing"]]
            for r in res["entries"]:
                if r.problems:
                    problems.append("%s %s%s refused: %s" % (what, label, r.entry, "; ".join(r.problems)))
        for rel in files:  # what resolved cleanly is copied even when another entry failed (quarantine shows it)
            try:
                outs.copy_file(base, rel, os.path.join(partial, sub, *rel.split("/")), label)
            except outs.Refused as exc:
                problems.append(str(exc))
        return files, problems
    finally:
        os.close(base)


def attempts_of(paths):
    """Attempts from attempts.jsonl: start and end records merged by attempt number."""
    merged = {}
    for rec in read_jsonl(paths.attempts):
        num = rec.get("attempt")
        if num is None:
            continue
        merged.setdefault(num, {"attempt": num}).update(rec)
    return [merged[k] for k in sorted(merged, key=lambda x: (str(type(x)), x))]


def not_pulled(paths, capsule):
    """What the run dir holds that the sealed capsule leaves out, and why (for PROVENANCE.md)."""
    try:
        sealed, _l, _o = mf.list_tree(capsule, refuse_symlinks=False)
    except OSError:
        sealed = []
    sealed = set(sealed)
    sealed_ckpt = set(f.split("/")[1] for f in sealed if f.startswith("ckpt/"))
    out = []
    try:
        names = sorted(os.listdir(paths.run_dir))
    except OSError:
        names = []
    for name in names:
        if name.startswith("code-"):
            out.append({"path": name + "/", "reason": "shipped code (immutable copy of the local tree)"})
        elif name == "data":
            out.append({"path": "data/", "reason": "input data (shipped from the controller)"})
        elif name == "logs":
            out.append({"path": "logs/", "reason": "logs stay on the box (not results)"})
        elif name == ".rgt":
            out.append({"path": ".rgt/", "reason": "wrapper state; attempts are copied into run.json"})
        elif name == "ckpt":
            try:
                ckpts = sorted(os.listdir(paths.ckpt))
            except OSError:
                ckpts = []
            for ck in ckpts:
                if ck not in sealed_ckpt:
                    out.append({"path": "ckpt/" + ck, "reason": "not a declared checkpoint (rolling/resume state)"})
        elif name == "out":
            extra = []
            try:
                base = outs.open_run_subdir(paths.run_dir, "out")
            except (outs.Refused, OSError):
                base = None
            if base is not None:
                try:
                    extra = outs.walk_files(base, "", "out/", [])
                except OSError:
                    extra = []
                finally:
                    os.close(base)
            for rel in extra:
                if "out/" + rel not in sealed:
                    out.append({"path": "out/" + rel, "reason": "not a declared output"})
        else:
            out.append({"path": name, "reason": "outside out/ and ckpt/"})
    return out


def unique_dir(base):
    if not os.path.exists(base):
        return base
    n = 2
    while os.path.exists("%s.%d" % (base, n)):
        n += 1
    return "%s.%d" % (base, n)


def write_manifest(module, capsule, manifest_path, p):
    doc = mf.build_manifest(capsule, p["run_id"], host=p["host"], instance_id=p["instance_id"],
                            created_at=now_iso())
    raw = mf.dumps(doc)
    atomic_write(manifest_path, raw)
    return doc, raw


def main():
    module = AnsibleModule(
        argument_spec=dict(
            RUN_LAYOUT_ARGS,
            host=dict(type="str", required=True),
            instance_id=dict(type="str"),
            job_name=dict(type="str"),
            outputs=dict(type="list", elements="str", default=[]),
            declared_checkpoints=dict(type="list", elements="str", default=[]),
            attempt=dict(type="int"),
            force_unfinished=dict(type="bool", default=False),
            loader_python=dict(type="str"),
        ),
        supports_check_mode=True,
    )
    p = module.params
    try:
        paths = RunPaths(expand_root(p["durable_root"]), p["project"], p["run_id"])
    except ValueError as exc:
        module.fail_json(msg="nothing sealed: %s" % exc)
    for label, items in (("outputs", p["outputs"]), ("declared_checkpoints", p["declared_checkpoints"])):
        for item in items:
            try:
                outs.split_entry(item)
            except ValueError as exc:
                module.fail_json(msg="%s entry %r is refused: %s" % (label, item, exc))
    capsule = os.path.join(paths.export_dir, p["run_id"])
    manifest_path = capsule + ".manifest.json"
    partial = os.path.join(paths.partial_dir, p["run_id"])
    outputs_all = not p["outputs"]
    result = dict(changed=False, sealed=False, capsule=capsule, manifest_path=manifest_path, run_dir=paths.run_dir)

    def excluded():
        return not_pulled(paths, capsule)

    # 1. a sealed export is never touched again
    if os.path.isdir(capsule) and not os.path.islink(capsule):
        result["sealed"] = True
        if os.path.isfile(manifest_path):
            try:
                doc, raw = mf.load_manifest(manifest_path, p["run_id"])
            except mf.ManifestError as exc:
                module.fail_json(msg="sealed export %s has a bad manifest (never rewritten): %s"
                                     % (capsule, exc.message), **result)
            result.update(msg="already sealed: %s" % capsule, manifest_sha256=mf.sha256_bytes(raw),
                          files=doc["totals"]["files"], bytes=doc["totals"]["bytes"], not_pulled=excluded())
            module.exit_json(**result)
        # sealed, but the manifest write was cut (crash between rename and write): finish the seal
        if module.check_mode:
            module.exit_json(changed=True, msg="would write the missing manifest", **result)
        try:
            doc, raw = write_manifest(module, capsule, manifest_path, p)
        except mf.ManifestError as exc:
            module.fail_json(msg="sealed export %s cannot be manifested: %s" % (capsule, exc.message), **result)
        result.update(changed=True, msg="sealed earlier; manifest written now",
                      manifest_sha256=mf.sha256_bytes(raw), files=doc["totals"]["files"],
                      bytes=doc["totals"]["bytes"], not_pulled=excluded())
        module.exit_json(**result)

    if not os.path.isdir(paths.run_dir):
        module.fail_json(msg="no run %s on this box (%s does not exist)" % (p["run_id"], paths.run_dir), **result)

    # 2. only a finished run is sealed
    exit_doc = read_json(paths.exit) or {}
    if exit_doc.get("reason") != "finished" and not p["force_unfinished"]:
        module.fail_json(msg="run is not finished: %s (exit.json reason %s); pass collect_force_unfinished=true "
                             "to seal it anyway" % (p["run_id"], exit_doc.get("reason") or "absent"),
                         exit=exit_doc or None, **result)
    attempts = attempts_of(paths)
    attempt = p["attempt"]
    if attempt is None:
        nums = [a["attempt"] for a in attempts if isinstance(a.get("attempt"), int)]
        attempt = max(nums) if nums else exit_doc.get("attempt") or 0
    if module.check_mode:
        module.exit_json(changed=True, msg="would seal %s" % capsule, **result)

    # 3. build the candidate in export/.partial/<run_id> (a leftover of a cut closeout is rebuilt)
    job = read_json(paths.job) or {}
    checkpoints = []
    try:
        if os.path.lexists(partial):
            shutil.rmtree(partial) if os.path.isdir(partial) and not os.path.islink(partial) else os.unlink(partial)
        os.makedirs(partial)
        problems = []
        _files, found = gather(paths.run_dir, "out", p["outputs"], partial, "required output", everything=outputs_all)
        problems += found
        if p["declared_checkpoints"]:
            ck_files, found = gather(paths.run_dir, "ckpt", p["declared_checkpoints"], partial, "declared checkpoint")
            problems += found
            if not found:
                checkpoints = [("ckpt/" + rel, os.path.join(partial, "ckpt", *rel.split("/"))) for rel in ck_files]
        code_dir = job.get("code_dir") or ""
        run_doc = {"schema": "rgt/run/v1", "run_id": p["run_id"], "host": p["host"],
                   "instance_id": p["instance_id"], "job_name": p["job_name"] or p["run_id"],
                   "command": job.get("command"),
                   "code_hash8": os.path.basename(code_dir)[5:] if os.path.basename(code_dir).startswith("code-")
                   else None,
                   "attempts": attempts, "exit": exit_doc or None, "created_at": now_iso()}
        atomic_write(os.path.join(partial, "run.json"), json.dumps(run_doc, sort_keys=True, indent=1) + "\n")

        # 4. validate: no symlinks anywhere, something besides run.json, checkpoints load
        try:
            mf.list_tree(partial, refuse_symlinks=True)
        except mf.ManifestError as exc:
            problems.append(exc.message)
        if os.listdir(partial) == ["run.json"] and not problems:
            problems.append("nothing to export: no outputs in out/ and no declared checkpoints")
        loads = []
        for rel, full in checkpoints:
            res = mf.load_checkpoint_with(p["loader_python"], full, rel)
            loads.append(res)
            if res["ok"] is False:
                problems.append("declared checkpoint %s does not load (%s): %s" % (rel, res["loader"], res["detail"]))
        result["checkpoints"] = loads
        fsync_dir(partial)
    except (IOError, OSError) as exc:
        problems = ["closeout error: %s" % exc]
        result.setdefault("checkpoints", [])

    if problems:
        # 5a. quarantine the failed candidate with its reason; never overwrite an earlier quarantine
        reason = "; ".join(problems)
        qdir = unique_dir(os.path.join(paths.quarantine_dir, "%s--%s" % (p["run_id"], attempt)))
        try:
            if not os.path.isdir(paths.quarantine_dir):
                os.makedirs(paths.quarantine_dir)
            if not os.path.isdir(partial):
                os.makedirs(partial)
            os.rename(partial, qdir)
            atomic_write(os.path.join(qdir, "REASON.txt"),
                         "run %s attempt %s on %s (%s), %s\n%s\n" % (p["run_id"], attempt, p["host"],
                                                                     p["instance_id"], now_iso(),
                                                                     "\n".join(problems)))
            fsync_dir(paths.quarantine_dir)
        except (IOError, OSError) as exc:
            reason += " (and quarantining failed: %s)" % exc
        result.update(changed=True, quarantine=qdir, reason=reason)
        module.fail_json(msg="closeout of %s failed, candidate moved to %s: %s" % (p["run_id"], qdir, reason),
                         **result)

    # 5b. seal: one atomic rename (same filesystem; the destination must be absent), then the manifest
    if os.path.lexists(capsule):
        module.fail_json(msg="%s appeared during the closeout; a sealed export is never overwritten" % capsule,
                         **result)
    try:
        doc = mf.build_manifest(partial, p["run_id"], host=p["host"], instance_id=p["instance_id"],
                                created_at=now_iso())
        os.rename(partial, capsule)
        fsync_dir(paths.export_dir)
        fsync_dir(paths.partial_dir)
        raw = mf.dumps(doc)
        atomic_write(manifest_path, raw)
    except mf.ManifestError as exc:
        module.fail_json(msg="closeout of %s refused: %s" % (p["run_id"], exc.message), **result)
    result.update(changed=True, sealed=True, msg="sealed %s" % capsule, manifest_sha256=mf.sha256_bytes(raw),
                  files=doc["totals"]["files"], bytes=doc["totals"]["bytes"], attempt=attempt,
                  not_pulled=excluded())
    module.exit_json(**result)


if __name__ == "__main__":
    main()
