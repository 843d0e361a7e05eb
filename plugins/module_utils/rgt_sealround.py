# -*- coding: utf-8 -*-
# Copyright: rgt contributors
# SPDX-License-Identifier: Apache-2.0
"""The box side of the runner's pull round (runner/rgt/pullround.py): the `__main__.py` of the seal zipapp
(module_utils/rgt_bundle, bundle ``seal``), run as ``python3 <cache>/status-<hash>/__main__.py`` with one line of
JSON arguments on stdin (never in argv), as the status round runs its own.

Arguments: ``{"host", "runs": [<the closeout's options for one run>], "loader_bundle": <the flat bundle
ckpt_loader, or null>}``. Every run is sealed in order by the closeout module's own code (rgt_seal.seal: a sealed
export is a no-op, a bad candidate is quarantined), and its result comes back as the module's would: ``{"runs":
[{...seal's result, "warnings", "manifest_b64"} or {...SealError's result, "failed": true, "msg"}], "view": DIR}``.

``manifest_b64`` is the sealed manifest's bytes (the role fetches the same file). ``view`` is a directory of this
box's pull view, ``<view>/<run_id>/<host>`` a symlink to each sealed capsule, so one rsync (``--copy-dirlinks``,
``--files-from`` of the manifests' paths) brings every run into ``<runs>/<run_id>/<host>/``. The view lives in
``${XDG_CACHE_HOME:-~/.cache}/rgt/pull-view/<key>`` (named by host, durable root and project), holds links only
and is rebuilt by every round. Python 3.6+, stdlib only.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import base64
import hashlib
import json
import os
import shutil
import sys
import tempfile

from ansible_collections.rgt.remote_gpu.plugins.module_utils.rgt_runlayout import install_bundle
from ansible_collections.rgt.remote_gpu.plugins.module_utils.rgt_seal import SealError, log_warnings, seal


def install_loader(bundle, runs):
    """(temp dir, script) of the checkpoint loader when a run's load checks run under another interpreter (as
    rgt_closeout's checkpoint_loader), else (None, None); warnings when it could not be written."""
    if not bundle or not any(r.get("loader_python") and r["loader_python"] != sys.executable for r in runs):
        return None, None, []
    tmp = tempfile.mkdtemp(prefix="rgt-ckpt-loader-")
    try:
        install_bundle(tmp, bundle["files"], bundle["entry"])
        return tmp, os.path.join(tmp, bundle["entry"]), []
    except (IOError, OSError) as exc:
        return tmp, None, ["the checkpoint loader could not be written to %s (%s): the load checks run under %s"
                           % (tmp, exc, sys.executable)]


def seal_one(params, loader, warnings):
    loader = loader if params.get("loader_python") and params["loader_python"] != sys.executable else None
    try:
        result = seal(dict(params, loader=loader))
    except SealError as exc:
        return dict(exc.result, failed=True, msg=exc.msg)
    except Exception as exc:  # what the module would die of: this run fails, the others go on
        return dict(failed=True, msg="the closeout of %s failed on the box: %s: %s" % (
            params.get("run_id"), type(exc).__name__, exc))
    result["warnings"] = list(warnings) + log_warnings(result.get("logs"))
    try:
        with open(result["manifest_path"], "rb") as handle:
            result["manifest_b64"] = base64.b64encode(handle.read()).decode("ascii")
    except (IOError, OSError, KeyError) as exc:
        return dict(result, failed=True, msg="the sealed manifest could not be read on the box: %s" % exc)
    return result


def view_dir(host, runs):
    first = runs[0] if runs else {}
    key = hashlib.sha256(("%s\0%s\0%s" % (host, first.get("durable_root"), first.get("project"))).encode(
        "utf-8")).hexdigest()[:16]
    base = os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache")
    return os.path.join(base, "rgt", "pull-view", key)


def link(view, run_id, host, capsule):
    """<view>/<run_id>/<host> -> capsule (replaced atomically)."""
    parent = os.path.join(view, run_id)
    if not os.path.isdir(parent):
        os.makedirs(parent, 0o755)
    path = os.path.join(parent, host)
    tmp = path + ".tmp-%d" % os.getpid()
    if os.path.lexists(tmp):
        os.unlink(tmp)
    os.symlink(capsule, tmp)
    os.rename(tmp, path)


def main():
    params = json.loads(sys.stdin.readline() or "{}")
    host, runs = str(params.get("host") or ""), list(params.get("runs") or [])
    tmp, loader, warnings = install_loader(params.get("loader_bundle"), runs)
    try:
        results = [seal_one(run, loader, warnings) for run in runs]
    finally:
        if tmp:
            shutil.rmtree(tmp, ignore_errors=True)
    view = view_dir(host, runs)
    try:
        for index, result in enumerate(results):
            if not result.get("failed") and result.get("sealed"):
                link(view, runs[index]["run_id"], host, result["capsule"])
    except (IOError, OSError) as exc:
        doc = {"failed": True, "msg": "the pull view %s could not be made on the box: %s" % (view, exc)}
    else:
        doc = {"runs": results, "view": view}
    out = sys.stdout.buffer if hasattr(sys.stdout, "buffer") else sys.stdout
    out.write((json.dumps(doc, default=str) + "\n").encode("utf-8"))
    out.flush()
    return 1 if doc.get("failed") else 0


if __name__ == "__main__":
    sys.exit(main())
