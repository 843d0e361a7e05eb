# -*- coding: utf-8 -*-
# Copyright: rgt contributors
# SPDX-License-Identifier: Apache-2.0
"""Seal a finished run as export/<run_id> with an external manifest (docs/internals.md "Closeout, pull,
verification, teardown"): the closeout's whole logic, without Ansible.

Two callers, one rule: the module rgt_closeout (over SSH, a thin AnsibleModule around `seal`) and the Kubernetes
engine's seal pod (roles/collect/files/rgt_k8s_seal.py, run by the job's own python in the user's image with
the claim mounted; runner/k8s_engine.seal). Python 3.6+, stdlib only.

- `seal(params, check_mode=False) -> result`: params are the module's options (durable_root, project, run_id,
  host, instance_id, job_name, outputs, declared_checkpoints, attempt, force_unfinished, loader_python; absent
  optional ones take the module's defaults). The result is what the module returns (changed, sealed, capsule,
  manifest_path, run_dir, msg, manifest_sha256, files, bytes, checkpoints, not_pulled, attempt).
- `SealError(msg, result)`: every refusal; `result` holds what the module returns with it (quarantine and reason
  for a quarantined candidate, exit for an unfinished run).

Imports its siblings under their collection names, else flat from its own directory (the seal pod gets the
module_utils it needs as files of one ConfigMap directory, with no Ansible).
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import json
import os
import shutil
import time

try:  # on the controller and inside an Ansible module
    from ansible_collections.rgt.remote_gpu.plugins.module_utils import rgt_manifest as mf
    from ansible_collections.rgt.remote_gpu.plugins.module_utils import rgt_outputs as outs
    from ansible_collections.rgt.remote_gpu.plugins.module_utils.rgt_runlayout import (
        RunPaths,
        atomic_write,
        expand_root,
        fsync_dir,
        read_json,
        read_jsonl,
    )
except ImportError:  # flat, from one directory (the seal pod's ConfigMap)
    import rgt_manifest as mf
    import rgt_outputs as outs
    from rgt_runlayout import RunPaths, atomic_write, expand_root, fsync_dir, read_json, read_jsonl

# the module's optional options and their defaults (rgt_closeout's argument_spec)
DEFAULTS = dict(project="rgt", instance_id=None, job_name=None, outputs=(), declared_checkpoints=(), attempt=None,
                force_unfinished=False, loader_python=None)
# the module_utils a flat copy of this file needs beside it (the seal pod's ConfigMap)
FLAT_MODULE_UTILS = ("rgt_seal", "rgt_manifest", "rgt_outputs", "rgt_runlayout")


class SealError(Exception):
    """A refused or failed seal: `msg` says why; `result` is returned with it (quarantine, reason, exit ...)."""

    def __init__(self, msg, result=None):
        Exception.__init__(self, msg)
        self.msg = msg
        self.result = dict(result or {})

    @property
    def quarantine(self):
        return self.result.get("quarantine")

    @property
    def reason(self):
        return self.result.get("reason")


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


def write_manifest(capsule, manifest_path, p):
    doc = mf.build_manifest(capsule, p["run_id"], host=p["host"], instance_id=p["instance_id"],
                            created_at=now_iso())
    raw = mf.dumps(doc)
    atomic_write(manifest_path, raw)
    return doc, raw


def seal(params, check_mode=False):
    """Seal the run `params` name (the closeout's options); the module's result, or SealError. A sealed export is
    never touched again (a no-op that says "already sealed"); a bad candidate is quarantined."""
    p = dict(DEFAULTS)
    p.update((k, v) for k, v in params.items() if v is not None or k not in DEFAULTS)
    p["outputs"], p["declared_checkpoints"] = list(p["outputs"] or []), list(p["declared_checkpoints"] or [])
    try:
        paths = RunPaths(expand_root(p["durable_root"]), p["project"], p["run_id"])
    except ValueError as exc:
        raise SealError("nothing sealed: %s" % exc) from None
    for label, items in (("outputs", p["outputs"]), ("declared_checkpoints", p["declared_checkpoints"])):
        for item in items:
            try:
                outs.split_entry(item)
            except ValueError as exc:
                raise SealError("%s entry %r is refused: %s" % (label, item, exc)) from None
    capsule = os.path.join(paths.export_dir, p["run_id"])
    manifest_path = capsule + ".manifest.json"
    partial = os.path.join(paths.partial_dir, p["run_id"])
    outputs_all = not p["outputs"]
    result = dict(changed=False, sealed=False, capsule=capsule, manifest_path=manifest_path, run_dir=paths.run_dir)

    # 1. a sealed export is never touched again
    if os.path.isdir(capsule) and not os.path.islink(capsule):
        return _sealed_before(p, paths, capsule, manifest_path, result, check_mode)

    if not os.path.isdir(paths.run_dir):
        raise SealError("no run %s on this box (%s does not exist)" % (p["run_id"], paths.run_dir), result)

    # 2. only a finished run is sealed
    exit_doc = read_json(paths.exit) or {}
    if exit_doc.get("reason") != "finished" and not p["force_unfinished"]:
        raise SealError("run is not finished: %s (exit.json reason %s); pass collect_force_unfinished=true to seal "
                        "it anyway" % (p["run_id"], exit_doc.get("reason") or "absent"),
                        dict(result, exit=exit_doc or None))
    attempts = attempts_of(paths)
    attempt = p["attempt"]
    if attempt is None:
        nums = [a["attempt"] for a in attempts if isinstance(a.get("attempt"), int)]
        attempt = max(nums) if nums else exit_doc.get("attempt") or 0
    if check_mode:
        return dict(result, changed=True, msg="would seal %s" % capsule)

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
        _quarantine(p, paths, partial, attempt, problems, result)

    # 5b. seal: one atomic rename (same filesystem; the destination must be absent), then the manifest
    if os.path.lexists(capsule):
        raise SealError("%s appeared during the closeout; a sealed export is never overwritten" % capsule, result)
    try:
        doc = mf.build_manifest(partial, p["run_id"], host=p["host"], instance_id=p["instance_id"],
                                created_at=now_iso())
        os.rename(partial, capsule)
        fsync_dir(paths.export_dir)
        fsync_dir(paths.partial_dir)
        raw = mf.dumps(doc)
        atomic_write(manifest_path, raw)
    except mf.ManifestError as exc:
        raise SealError("closeout of %s refused: %s" % (p["run_id"], exc.message), result) from None
    result.update(changed=True, sealed=True, msg="sealed %s" % capsule, manifest_sha256=mf.sha256_bytes(raw),
                  files=doc["totals"]["files"], bytes=doc["totals"]["bytes"], attempt=attempt,
                  not_pulled=not_pulled(paths, capsule))
    return result


def _sealed_before(p, paths, capsule, manifest_path, result, check_mode):
    """Step 1 of a seal: the export exists. Its manifest is read (never rewritten); a manifest whose write was
    cut (a crash between the rename and the write) is written now."""
    result["sealed"] = True
    if os.path.isfile(manifest_path):
        try:
            doc, raw = mf.load_manifest(manifest_path, p["run_id"])
        except mf.ManifestError as exc:
            raise SealError("sealed export %s has a bad manifest (never rewritten): %s" % (capsule, exc.message),
                            result) from None
        result.update(msg="already sealed: %s" % capsule, manifest_sha256=mf.sha256_bytes(raw),
                      files=doc["totals"]["files"], bytes=doc["totals"]["bytes"],
                      not_pulled=not_pulled(paths, capsule))
        return result
    if check_mode:
        return dict(result, changed=True, msg="would write the missing manifest")
    try:
        doc, raw = write_manifest(capsule, manifest_path, p)
    except mf.ManifestError as exc:
        raise SealError("sealed export %s cannot be manifested: %s" % (capsule, exc.message),
                        result) from None
    result.update(changed=True, msg="sealed earlier; manifest written now", manifest_sha256=mf.sha256_bytes(raw),
                  files=doc["totals"]["files"], bytes=doc["totals"]["bytes"], not_pulled=not_pulled(paths, capsule))
    return result


def _quarantine(p, paths, partial, attempt, problems, result):
    """Step 5a: move the failed candidate to quarantine/<run_id>--<attempt> (never over an earlier one) with its
    REASON.txt, and raise the SealError that names it."""
    reason = "; ".join(problems)
    qdir = unique_dir(os.path.join(paths.quarantine_dir, "%s--%s" % (p["run_id"], attempt)))
    try:
        if not os.path.isdir(paths.quarantine_dir):
            os.makedirs(paths.quarantine_dir)
        if not os.path.isdir(partial):
            os.makedirs(partial)
        os.rename(partial, qdir)
        atomic_write(os.path.join(qdir, "REASON.txt"),
                     "run %s attempt %s on %s (%s), %s\n%s\n" % (p["run_id"], attempt, p["host"], p["instance_id"],
                                                                 now_iso(), "\n".join(problems)))
        fsync_dir(paths.quarantine_dir)
    except (IOError, OSError) as exc:
        reason += " (and quarantining failed: %s)" % exc
    result.update(changed=True, quarantine=qdir, reason=reason)
    raise SealError("closeout of %s failed, candidate moved to %s: %s" % (p["run_id"], qdir, reason), result)
