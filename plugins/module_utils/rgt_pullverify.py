# -*- coding: utf-8 -*-
# Copyright: rgt contributors
# SPDX-License-Identifier: Apache-2.0
"""The controller side of a pull (docs/internals.md "Closeout, pull, verification, teardown"): promote the box's
manifest, list the local files to repair, verify the local capsule against the manifest (files, sizes, SHA-256,
declared checkpoints, verify_command), write PROVENANCE.md and PULL_VERIFIED.json, and build the collect role's
report. One copy for both pulls: the module rgt_pull_verify (the SSH pull, delegate_to localhost) is its Ansible
face, and the Kubernetes pull (runner/rgt/k8s_engine.py) calls it directly.

- `verify_pull(p) -> (result, msg)`: p holds the module's options (dest, manifest_path, incoming_manifest, run_id,
  host, instance_id, profile, declared_checkpoints, verify_command, verify_timeout_s, not_pulled, verify,
  write_marker, max_names, reuse_hashes); msg is None when verified, else the failure (the marker is removed).
- Hash once: the promotion's repair pass (a re-pull: the local copy exists) records the hashes it read in
  `.incoming/<host>.hashes.json` with each file's stat key (rgt_manifest.stat_key, only for files settled before
  the read); the verification of the same pull (reuse_hashes) takes a file's hash from there while its stat key
  is unchanged (rsync replaces a file it writes: a new inode, hashed again) and removes the record. The Kubernetes
  pull does the same: its placing pass (runner/rgt/k8s_engine._place) records, its verification reuses. Every
  other verification (verify-only, the teardown gate) reads every byte.
- `promote(incoming, target, run_id, host, instance_id)`, `Failed`: the manifest's promotion alone.
- `build_report(p, check_mode=False) -> (report, failure)`: the role's report from the results its steps
  registered (p["report"]).

Python 3 stdlib (it runs on the controller).
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import errno
import json
import os
import subprocess
import time

from ansible_collections.rgt.remote_gpu.plugins.module_utils import rgt_manifest as mf
from ansible_collections.rgt.remote_gpu.plugins.module_utils import rgt_outputs as outs
from ansible_collections.rgt.remote_gpu.plugins.module_utils.rgt_rsync import pull_failure
from ansible_collections.rgt.remote_gpu.plugins.module_utils.rgt_runlayout import atomic_write, fsync_dir, read_json

MARKER_SCHEMA = "rgt/pull-verified/v1"


def now_iso():
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


class Failed(Exception):
    """Why the pull is not verified; verify_pull removes the marker and returns it as the failure."""

    def __init__(self, message, **extra):
        Exception.__init__(self, message)
        self.message = message
        self.extra = extra


ERRNO_WORDS = {errno.ENOSPC: "the local disk is full", errno.EDQUOT: "the local disk quota is exceeded",
               errno.EROFS: "the local filesystem is read-only", errno.EACCES: "permission denied",
               errno.EPERM: "permission denied", errno.EIO: "an I/O error on the local disk"}


def os_words(exc, with_path=True):
    """A plain description of an OSError: what happened, then the system's own words (and the path)."""
    what = ERRNO_WORDS.get(getattr(exc, "errno", None))
    path = getattr(exc, "filename", None) if with_path else None
    detail = "%s%s" % (exc.strerror or exc, (": %s" % path) if path else "")
    return "%s (%s)" % (what, detail) if what else detail


class WriteError(Exception):
    def __init__(self, path, cause):
        Exception.__init__(self, "%s: %s" % (path, cause))
        self.path = path
        self.cause = cause


def write_or_say(path, data):
    """write_if_changed, naming the file when it fails."""
    try:
        return write_if_changed(path, data)
    except (IOError, OSError) as exc:
        raise WriteError(path, exc) from None


def identity_problem(doc, host, instance_id):
    """None when the manifest was sealed on this host and instance, else the reason (names both)."""
    if doc.get("host") == host and (instance_id is None or doc.get("instance_id") == instance_id):
        return None
    return "it was sealed on host %s, instance %s, but this pull is for host %s, instance %s" % (
        doc.get("host"), doc.get("instance_id"), host, instance_id if instance_id is not None else "(any)")


def promote(incoming, target, run_id, host, instance_id):
    """Validate the fetched manifest and move it onto target; False when target already held the same bytes."""
    try:
        doc, raw = mf.load_manifest(incoming, run_id)
    except mf.ManifestError as exc:
        raise Failed("the box's manifest was refused: %s" % exc.message, problems=exc.problems) from None
    problem = identity_problem(doc, host, instance_id)
    if problem:
        raise Failed("the box's manifest was refused: %s" % problem, problems=[problem])
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


HASHES_SCHEMA = "rgt/pull-hashes/v1"


def hashes_path(dest, host):
    """The repair pass's hashes for this pull's verification: <runs>/<run_id>/.incoming/<host>.hashes.json."""
    return os.path.join(os.path.dirname(dest.rstrip("/")), ".incoming", "%s.hashes.json" % host)


def write_hashes(path, dest, sha, record):
    """Keep the repair pass's {path: [stat_key, sha256]} for the verification that follows (atomic); none: removed."""
    if record and os.path.isdir(os.path.dirname(path)):
        doc = {"schema": HASHES_SCHEMA, "dest": dest, "manifest_sha256": sha, "files": record}
        atomic_write(path, json.dumps(doc, sort_keys=True) + "\n")
    elif os.path.lexists(path):
        os.unlink(path)


def take_hashes(path, dest, sha, reuse):
    """The hashes the repair pass of this pull recorded for dest and this manifest, removed as they are read:
    they serve the one verification that follows (`reuse`: the module's reuse_hashes, set by the collect role
    when its repair pass ran). A verify-only run (reuse false) hashes every file and drops what a cut pull left.
    {} when there are none (or they name another copy or manifest)."""
    doc = read_json(path) if reuse else None
    if os.path.lexists(path):
        os.unlink(path)
    if not isinstance(doc, dict) or doc.get("schema") != HASHES_SCHEMA or doc.get("dest") != dest or \
            doc.get("manifest_sha256") != sha or not isinstance(doc.get("files"), dict):
        return {}
    return dict((k, v) for k, v in doc["files"].items() if isinstance(v, list) and len(v) == 2)


def repairs(dest, doc, list_path, record=None):
    """Local files of dest whose size or SHA-256 differs from the manifest, and their NUL-separated list file
    (removed when there is nothing to repair). `record` receives the hashes that may be reused (rgt_manifest
    compare)."""
    found = []
    if os.path.isdir(dest) and not os.path.islink(dest):
        cmp_result = mf.compare(dest, doc, record=record)
        found = sorted(cmp_result["size_mismatch"] + cmp_result["sha_mismatch"])
    if found:
        atomic_write(list_path, "".join(path + "\0" for path in found).encode("utf-8"))
        return found, list_path
    if os.path.lexists(list_path):
        os.unlink(list_path)
    return found, None


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


def remove_marker(marker):
    """True when a marker was removed."""
    if not os.path.lexists(marker):
        return False
    os.unlink(marker)
    fsync_dir(os.path.dirname(marker) or ".")
    return True


def check(p, dest, doc, result, known=None):
    """The file checks, checkpoint loads and verify_command; returns (problems, checkpoints). `known`: the repair
    pass's hashes of files unchanged since (take_hashes; rgt_manifest.known_sha)."""
    cmp_result = mf.compare(dest, doc, known=known)
    result.update((k, cmp_result[k]) for k in ("missing", "unexpected", "size_mismatch", "sha_mismatch"))
    problems = []
    described = mf.describe_problems(cmp_result, p["max_names"])
    if described:
        problems.append(described)

    # declared checkpoints: every manifest file an entry covers under ckpt/ (a file, a directory's files, a glob)
    checkpoints = []
    listed = [e["path"] for e in doc["files"]]
    for rel in p["declared_checkpoints"]:
        members = outs.match_listed(listed, rel, "ckpt")
        if not members:
            problems.append("declared checkpoint ckpt/%s is not in the manifest" % rel)
        for member in members:
            full = os.path.join(dest, *member.split("/"))
            if member in cmp_result["missing"]:
                continue
            res = mf.load_checkpoint(full, member)
            checkpoints.append(res)
            if res["ok"] is False:
                problems.append("checkpoint %s does not load (%s): %s" % (member, res["loader"], res["detail"]))

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
    return problems, checkpoints


def write_outputs(p, doc, sha, dest, marker, prov_path, checkpoints):
    """Write PROVENANCE.md, then PULL_VERIFIED.json (the gate's evidence, last); True when either changed."""
    marker_doc = {"schema": MARKER_SCHEMA, "run_id": p["run_id"], "host": p["host"],
                  "instance_id": p["instance_id"], "manifest_sha256": sha, "files": doc["totals"]["files"],
                  "bytes": doc["totals"]["bytes"],
                  "checkpoints": [{"path": c["path"], "loader": c["loader"], "ok": c["ok"]} for c in checkpoints],
                  "verify_command": p["verify_command"]}
    if p.get("source"):  # `rgt-run pull --from-offload` (runner/rgt/offloadpull.py): fetched from the target
        marker_doc.update(source=p["source"], offload_target=p.get("offload_target"))
    old = read_json(marker)
    if isinstance(old, dict) and old.get("verified_at") and \
            dict((k, v) for k, v in old.items() if k != "verified_at") == marker_doc:
        marker_doc["verified_at"] = old["verified_at"]  # same facts: keep the marker byte-identical
    else:
        marker_doc["verified_at"] = now_iso()
    changed = False
    run_doc = read_json(os.path.join(dest, "run.json")) or {}
    if p["not_pulled"] is not None or not os.path.exists(prov_path):
        p["not_pulled"] = p["not_pulled"] or []
        changed = write_or_say(prov_path, provenance(p, doc, sha, run_doc, checkpoints))
    return write_or_say(marker, json.dumps(marker_doc, sort_keys=True, indent=1) + "\n") or changed


def ran(results):
    """The loop results of items that ran (not skipped)."""
    return [r for r in results or [] if "skipped" not in r]


def build_report(p, check_mode=False):
    """The collect role's report and failure message from the results its steps registered (docs/internals.md)."""
    r = p["report"]
    closeout = r.get("closeout") or {}
    promoted = r.get("promoted") or {}
    verify = r.get("verify") or {}
    rsync = ran(r.get("rsync"))
    failed = [x for x in ran(r.get("repair")) + rsync if x.get("rc") != 0]
    verified = bool(verify.get("verified", False))
    report = {
        "host": p["host"], "run_id": p["run_id"], "instance_id": p["instance_id"],
        "sealed": closeout.get("sealed"), "closeout": closeout.get("msg"),
        "quarantine": closeout.get("quarantine"), "capsule": closeout.get("capsule"),
        "dest": p["dest"], "manifest_path": p["manifest_path"],
        "manifest_sha256": verify.get("manifest_sha256", closeout.get("manifest_sha256")),
        "files": verify.get("files", closeout.get("files")), "bytes": verify.get("bytes", closeout.get("bytes")),
        "verified": verified, "verify_only": bool(r.get("verify_only")), "marker": verify.get("marker"),
        "missing": verify.get("missing", []), "unexpected": verify.get("unexpected", []),
        "size_mismatch": verify.get("size_mismatch", []), "sha_mismatch": verify.get("sha_mismatch", []),
        "checkpoints": verify.get("checkpoints", []), "problems": verify.get("problems", []),
        "rsync_entries": [x.get("item") for x in rsync],
        "rsync_changed": [x.get("item") for x in rsync if x.get("changed")],
        "rsync_failed": [x.get("item") for x in failed],
        "repaired": promoted.get("repair", []),
        "logs": closeout.get("logs"),
        "error": None if verified and not failed else verify.get("msg"),
    }
    if r.get("failed"):  # a step before the verification failed: its message is the host's
        report["error"] = r.get("error") or "failed"
        return report, r.get("error") or "collect failed"
    if check_mode or (verified and not failed):
        return report, None
    parts = ([pull_failure(failed)] if failed else []) + \
        ([verify.get("msg") or "verification did not run"] if not verified else [])
    report["error"] = "%s: %s" % (p["host"], " ".join(parts))
    return report, report["error"]


def verify_pull(p):
    """Verify p["dest"] (promoting p["incoming_manifest"] first, when given), write the provenance note and the
    marker beside it: (result, None); on a failure the marker is removed: (result, message). The one copy for the
    module and for the Kubernetes pull (runner/rgt/k8s_engine.py)."""
    dest = p["dest"].rstrip("/")
    base = os.path.dirname(dest)
    marker = os.path.join(base, "%s.PULL_VERIFIED.json" % p["host"])
    prov_path = os.path.join(base, "%s.PROVENANCE.md" % p["host"])
    result = dict(changed=False, verified=False, marker=marker, dest=dest, manifest_path=p["manifest_path"])
    if p["incoming_manifest"] and p["instance_id"] is None:
        return result, "instance_id is required with incoming_manifest (the manifest's instance must match)"
    where = "%s/%s" % (p["run_id"], p["host"])
    try:
        run(p, dest, marker, prov_path, result)
        return result, None
    except Failed as exc:
        result.update(exc.extra)
        msg = "PULL NOT VERIFIED for %s: %s" % (where, exc.message)
    except (IOError, OSError) as exc:
        msg = "PULL NOT VERIFIED for %s: %s; nothing is marked verified" % (where, os_words(exc))
    result["verified"] = False
    try:  # a stale marker, or one half-way through a failed write
        if remove_marker(marker):
            result["changed"] = True
            result["marker_removed"] = True
    except (IOError, OSError) as exc:
        msg += "; and the marker %s could not be removed: %s (delete it by hand)" % (marker, os_words(exc))
    return result, msg


def run(p, dest, marker, prov_path, result):
    if p["incoming_manifest"]:
        doc, raw, moved = promote(p["incoming_manifest"], p["manifest_path"], p["run_id"], p["host"],
                                  p["instance_id"])
        result["changed"] = moved
    else:
        try:
            doc, raw = mf.load_manifest(p["manifest_path"], p["run_id"])
        except mf.ManifestError as exc:
            raise Failed("cannot verify %s: %s" % (dest, exc.message), problems=exc.problems) from None
        problem = identity_problem(doc, p["host"], p["instance_id"])
        if problem:
            raise Failed("the local manifest %s is refused: %s" % (p["manifest_path"], problem), problems=[problem])
    sha = mf.sha256_bytes(raw)
    result.update(manifest_sha256=sha, entries=mf.top_level_entries(doc), files=doc["totals"]["files"],
                  bytes=doc["totals"]["bytes"])
    cache = hashes_path(dest, p["host"])
    if not p["verify"]:
        if p["incoming_manifest"]:
            list_path = os.path.join(os.path.dirname(p["incoming_manifest"]), "%s.repair" % p["host"])
            record = {}
            result["repair"], result["repair_list"] = repairs(dest, doc, list_path, record)
            write_hashes(cache, dest, sha, record)
        return

    problems, checkpoints = check(p, dest, doc, result, take_hashes(cache, dest, sha, p.get("reuse_hashes")))
    result["checkpoints"] = checkpoints
    if problems:
        raise Failed("; ".join(problems), problems=problems)

    if p["write_marker"]:
        try:
            changed = write_outputs(p, doc, sha, dest, marker, prov_path, checkpoints)
        except WriteError as exc:
            cause = os_words(exc.cause, with_path=False)
            raise Failed("every file matched, but %s could not be written: %s; no PULL_VERIFIED.json is left: "
                         "free the space (or fix the path) and re-run" % (exc.path, cause),
                         problems=["%s: %s" % (exc.path, cause)]) from None
        result["changed"] = result["changed"] or changed
        result["provenance"] = prov_path
    result["verified"] = True
    result["msg"] = "PULL VERIFIED: %d files, %d bytes, SHA-256 match (%s)" % (
        doc["totals"]["files"], doc["totals"]["bytes"], marker)
