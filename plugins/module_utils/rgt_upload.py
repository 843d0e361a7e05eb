# -*- coding: utf-8 -*-
# Copyright: rgt contributors
# SPDX-License-Identifier: Apache-2.0
"""upload_resume's record: the report (`upload_resume_report`, docs/internals.md "Box to runner") built from what
each step of the role registered, and its line in the controller ledger (<ledger>/uploads/<host>.jsonl).

The steps (roles/upload_resume/tasks/main.yml): code_tree and data_tree (rgt_tree_manifest), existing
(rgt_tree_verify of code-<hash8>), code_rsync and data_rsync (rgt_transfer), promoted and data_verified
(rgt_tree_verify). A step that did not run is an empty dict or a skipped result. Controller side, stdlib,
Python 3.6+.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import json
import os
import posixpath
import time

from ansible_collections.rgt.remote_gpu.plugins.module_utils.rgt_runlayout import atomic_write

STEPS = ("code_tree", "existing", "code_rsync", "promoted", "data_tree", "data_rsync", "data_verified")
NOT_DEPLOYED = 3  # rgt_tree_verify's rc_hint for a tree that does not match its manifest: refuse to launch


def code_status(steps, crlf, check_mode=False):
    """refused (a CRLF script, crlf refuse), present (code-<hash8> was there and verified), uploaded (sent,
    verified, renamed), not_deployed (a code dir that does not verify), checked (check mode), else failed."""
    tree, existing, promoted, rsync = (steps.get(k) or {} for k in ("code_tree", "existing", "promoted",
                                                                     "code_rsync"))
    if tree.get("crlf_scripts") and crlf == "refuse":
        return "refused"
    if existing.get("ok"):
        return "present"
    if promoted.get("promoted"):
        return "uploaded"
    if NOT_DEPLOYED in (promoted.get("rc_hint"), existing.get("rc_hint")):
        return "not_deployed"
    if rsync.get("rc", 0) != 0:
        return "failed"
    return "checked" if check_mode else "failed"


def attempts(rsync):
    """The rsync attempts of a part: 0 when its transfer did not run."""
    return rsync.get("attempts", 1 if "rc" in rsync else 0)


def build_report(host, run_id, crlf, steps, data_src=None, started=None, check_mode=False, now=None):
    """The report: every key the role published before (tests hold them), whatever step stopped the upload."""
    s = dict((k, steps.get(k) or {}) for k in STEPS)
    tree, existing = s["code_tree"], s["existing"]
    # the paths on the box are known once the look for code-<hash8> answered (expanded there)
    code_dir = existing.get("dir") if existing.get("dir") and not existing.get("failed") else None
    run_dir = posixpath.dirname(code_dir) if code_dir else None
    status = code_status(s, crlf, check_mode)
    data = None
    if data_src:
        data = {"dir": (run_dir or "") + "/data", "files": s["data_tree"].get("files", 0),
                "bytes": s["data_tree"].get("bytes", 0), "bytes_sent": s["data_rsync"].get("bytes_sent", 0),
                "files_transferred": s["data_rsync"].get("files_transferred", 0),
                "attempts": attempts(s["data_rsync"]), "verified": bool(s["data_verified"].get("ok", False))}
    elapsed = None
    if started is not None:
        elapsed = round((time.time() if now is None else now) - float(started), 2)
    checks = (s["promoted"], existing)
    return {
        "host": host, "run_id": run_id, "run_dir": run_dir, "status": status,
        "rc_hint": NOT_DEPLOYED if status == "not_deployed" or s["data_verified"].get("rc_hint") == NOT_DEPLOYED
        else None,
        "hash8": tree.get("hash8"), "code_dir": code_dir, "files": tree.get("files", 0),
        "bytes": tree.get("bytes", 0), "bytes_sent": s["code_rsync"].get("bytes_sent", 0),
        "files_transferred": s["code_rsync"].get("files_transferred", 0), "attempts": attempts(s["code_rsync"]),
        "ignored_count": tree.get("ignored_count", 0), "crlf_scripts": tree.get("crlf_scripts", []), "crlf": crlf,
        "symlinks_skipped": tree.get("symlinks", []), "skipped": tree.get("skipped", []),
        "mismatches": [m.get("path") for c in checks for m in c.get("mismatches", [])],
        "missing": [m for c in checks for m in c.get("missing", [])],
        "data": data, "seconds": elapsed,
    }


def ledger_line(report, at=None):
    """The report with the time it was recorded, one JSON line (keys sorted)."""
    at = at or time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    return json.dumps(dict(report, at=at), sort_keys=True)


def record(ledger_dir, host, report, at=None):
    """Append the report to <ledger_dir>/<host>.jsonl (the file rewritten whole, atomically); returns its path.
    Several hosts record at once, each in its own file; making the directory is safe for all of them."""
    path = os.path.join(ledger_dir, "%s.jsonl" % host)
    try:
        os.makedirs(ledger_dir, 0o755)
    except OSError:
        if not os.path.isdir(ledger_dir):
            raise
    try:
        with open(path, "rb") as handle:
            kept = handle.read()
    except (IOError, OSError):
        kept = b""
    if kept and not kept.endswith(b"\n"):
        kept += b"\n"
    atomic_write(path, kept + (ledger_line(report, at) + "\n").encode("utf-8"), 0o644)
    return path
