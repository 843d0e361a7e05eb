# -*- coding: utf-8 -*-
# Copyright: rgt contributors
# SPDX-License-Identifier: Apache-2.0
"""Seal a finished run on a Kubernetes claim: the closeout (module_utils/rgt_seal) without Ansible, run by the
job's own python in the job's image inside the seal pod (runner/rgt/k8s_engine.seal), the claim mounted at the
durable root.

    python rgt_k8s_seal.py PARAMS.json        (or the params as JSON text in $RGT_SEAL_PARAMS)

The params are rgt_closeout's options (durable_root, project, run_id, host, ...). Prints ONE JSON line on stdout:
the seal's result, or {"failed": true, "msg": ...} with what the closeout returns on failure (quarantine, reason);
exit 0 or 1. Stdlib only, Python 3.6+. Shipped as the bundle `k8s_seal` (module_utils/rgt_bundle): this file and
the module_utils it imports, flat, in the seal pod's ConfigMap. That directory holds the checkpoint loader too
(rgt_manifest.py run as a script, the bundle `ckpt_loader`): a checkpoint whose load check needs another
interpreter than this one (loader_python) runs it from there.
"""

from __future__ import absolute_import, division, print_function

import json
import os
import sys
import traceback

sys.dont_write_bytecode = True  # the ConfigMap mount is read-only: no __pycache__ for the module_utils below

from ansible_collections.rgt.remote_gpu.plugins.module_utils import rgt_manifest, rgt_seal

PARAMS_ENV = "RGT_SEAL_PARAMS"


def load_params(argv):
    """The params: the JSON file argv[1], else $RGT_SEAL_PARAMS; ValueError saying what is wrong."""
    if len(argv) > 1:
        with open(argv[1]) as handle:
            text, where = handle.read(), argv[1]
    elif os.environ.get(PARAMS_ENV):
        text, where = os.environ[PARAMS_ENV], "$" + PARAMS_ENV
    else:
        raise ValueError("no params: give a JSON file as the argument or the JSON text in $%s" % PARAMS_ENV)
    params = json.loads(text)
    if not isinstance(params, dict):
        raise ValueError("the params in %s are not a JSON object" % where)
    return params


def main(argv):
    try:
        params = load_params(argv)
        params.setdefault("loader", rgt_manifest.__file__)  # the checkpoint loader, beside this file
        doc = rgt_seal.seal(params)
    except rgt_seal.SealError as exc:
        doc = dict(exc.result, failed=True, msg=exc.msg)
    except (IOError, OSError, ValueError) as exc:
        doc = {"failed": True, "msg": "nothing sealed: %s" % exc}
    except Exception as exc:  # noqa: BLE001 - one JSON line whatever happens: the controller reads nothing else
        doc = {"failed": True, "msg": "the seal crashed: %r" % exc, "traceback": traceback.format_exc()[-2000:]}
    sys.stdout.write(json.dumps(doc, sort_keys=True) + "\n")
    sys.stdout.flush()
    return 1 if doc.get("failed") else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
