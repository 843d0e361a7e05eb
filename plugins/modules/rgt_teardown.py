#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: rgt contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: rgt_teardown
short_description: Stop the meter of a rented GPU instance, behind the teardown gate (controller side)
version_added: "0.1.0"
description:
  - Runs on the controller (C(delegate_to) localhost). First the teardown gate, entirely local and with zero
    control-plane calls; a refusal fails with C(rc_hint=3) and a message naming what is wrong.
  - "Gate: I(confirm) equals I(instance_id); C(<runs_dir>/<run_id>/<host>.PULL_VERIFIED.json) exists, names this
    run, and its C(manifest_sha256) equals the SHA-256 of the manifest now on the box (I(box_manifest_sha256),
    which must also be the hash of I(box_manifest_content)); and a fresh re-verification of
    C(<runs_dir>/<run_id>/<host>/) against that manifest (file set, sizes, SHA-256) passes."
  - Then the profile's meter-stop verb. API verbs (RunPod, vast.ai, Lambda, Paperspace, AutoDL) look at the
    instance first (already gone, no call), call the meter-stop once, re-query instead of calling again after a
    timeout or 409, and poll until the platform reports it gone (or stopped, for a reversible verb), bounded by
    I(poll_timeout_s); a poll that runs out fails with the state C(unknown — check the console).
  - C(manual) prints the profile's steps and calls nothing; C(none) has nothing to stop; C(scancel) returns the
    command for the role to run on the login node; C(delete_job) runs C(kubectl delete job) when kubectl exists
    on the controller (the PVC is kept), else prints it.
  - Writes the record C({instance_id, verb, reversible, calls, final_state, keeps_billing, at}) to
    I(ledger_path) (atomic) once the gate passed, and returns the same.
  - The API key is read from the environment variable named by the profile (C(meter_stop.api.key_env)); it is
    never an option, never logged and never returned.
author:
  - rgt contributors
options:
  profile:
    description: The validated platform profile (C(meter_stop), C(mounts)).
    type: dict
    required: true
  instance_id:
    description: The instance to stop (the host's C(rgt_instance_id)).
    type: str
    required: true
  confirm:
    description: The confirmation; must equal I(instance_id) exactly.
    type: str
    default: ""
  host:
    description: The inventory host name (names the pulled directory, the markers and the ledger record).
    type: str
    required: true
  run_id:
    description: The run whose pull must be verified.
    type: str
    required: true
  runs_dir:
    description: The controller's runs root (C(runs/<run_id>/<host>/) and its markers).
    type: path
    required: true
  box_manifest_sha256:
    description: SHA-256 of C(export/<run_id>.manifest.json) on the box, now; empty when the file is absent.
    type: str
    default: ""
  box_manifest_content:
    description: The same file's content, base64 (as C(ansible.builtin.slurp) returns it).
    type: str
    default: ""
  base_url:
    description: Override of the control plane's base URL (default from C(meter_stop.api.base_url_env), else
      the profile's C(base_url)).
    type: str
  poll_timeout_s:
    description: How long to poll for the platform to report the instance gone.
    type: float
    default: 300
  poll_interval_s:
    description: Seconds between polls.
    type: float
    default: 5
  http_timeout_s:
    description: Client timeout of every HTTP call.
    type: float
    default: 30
  ledger_path:
    description: Where to write the teardown record (JSON); empty to skip.
    type: path
  resume_poll:
    description:
      - The record at I(ledger_path) says an earlier run made the meter-stop call for this instance and then ran
        out of time polling (C(unknown)); poll again without calling. Read from the record when not given.
    type: bool
notes:
  - Supports check mode (the gate is evaluated; nothing is called; the result says what would happen).
"""

EXAMPLES = r"""
- name: Stop the meter (gated)
  rgt.remote_gpu.rgt_teardown:
    profile: "{{ teardown_profile }}"
    instance_id: "{{ teardown_instance_id }}"
    confirm: "{{ teardown_confirm }}"
    host: "{{ inventory_hostname }}"
    run_id: "{{ teardown_run_id }}"
    runs_dir: "{{ teardown_runs_dir }}"
    box_manifest_sha256: "{{ teardown_box_manifest.stat.checksum | default('') }}"
    box_manifest_content: "{{ teardown_box_manifest_raw.content | default('') }}"
    ledger_path: "{{ teardown_ledger_dir }}/{{ inventory_hostname }}.json"
  delegate_to: localhost
"""

RETURN = r"""
instance_id:
  description: The instance.
  returned: always
  type: str
verb:
  description: The profile's meter-stop verb.
  returned: always
  type: str
reversible:
  description: Whether the verb can be undone (AutoDL 关机) or not (terminate, destroy, delete).
  returned: always
  type: bool
calls:
  description: Every control-plane call made, C({method, path, status}) (no query values, no headers).
  returned: success
  type: list
final_state:
  description: C(gone), C(stopped), C(already gone), C(unknown — check the console), or what a non-API verb did.
  returned: success
  type: str
keeps_billing:
  description: What keeps billing after the verb (the profile's C(keeps_billing)), plus resources found still
    billing (Paperspace lists).
  returned: success
  type: list
gate:
  description: The gate's evidence (manifest hash, files and bytes re-verified) or its refusal reasons.
  returned: always
  type: dict
remote_command:
  description: For C(scancel), the argv the role runs on the login node.
  returned: when verb is scancel
  type: list
rc_hint:
  description: 3 when the gate refused (the runner's exit code).
  returned: on refusal
  type: int
"""

import base64
import datetime
import hashlib
import json
import os
import shutil
import subprocess
import tempfile

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.rgt.remote_gpu.plugins.module_utils import rgt_cloud
from ansible_collections.rgt.remote_gpu.plugins.module_utils.rgt_manifest import (
    compare,
    describe_problems,
    validate_manifest,
)

PULL_VERIFIED_SCHEMA = "rgt/pull-verified/v1"


def check_gate(p):
    """(reasons, evidence). Local reads only: no control-plane call is made here."""
    reasons = []
    evidence = {}
    iid = p["instance_id"] or ""
    if not iid:
        reasons.append("the host has no rgt_instance_id")
    if (p["confirm"] or "") != iid:
        if p["confirm"]:
            reasons.append("the confirmation %r does not name this instance %r" % (p["confirm"], iid))
        else:
            reasons.append("no confirmation: type the instance id %r at the prompt or pass --confirm %s"
                           % (iid, iid))
        return reasons, evidence  # nothing else is read before the user named the instance
    run_dir = os.path.join(p["runs_dir"], p["run_id"])
    marker = os.path.join(run_dir, p["host"] + ".PULL_VERIFIED.json")
    pulled = os.path.join(run_dir, p["host"])
    box_sha = (p["box_manifest_sha256"] or "").lower()
    evidence.update(marker=marker, pulled=pulled, box_manifest_sha256=box_sha)
    if not box_sha:
        reasons.append("no manifest on the box for run %s (export/%s.manifest.json): run collect first"
                       % (p["run_id"], p["run_id"]))
        return reasons, evidence
    try:
        with open(marker, "rb") as handle:
            verified = json.loads(handle.read().decode("utf-8"))
    except (IOError, OSError):
        reasons.append("%s does not exist: the pull was not verified (run collect)" % marker)
        return reasons, evidence
    except ValueError:
        reasons.append("%s is not valid JSON: re-run collect" % marker)
        return reasons, evidence
    if not isinstance(verified, dict) or verified.get("schema") != PULL_VERIFIED_SCHEMA:
        reasons.append("%s is not a %s document" % (marker, PULL_VERIFIED_SCHEMA))
        return reasons, evidence
    if verified.get("run_id") != p["run_id"]:
        reasons.append("%s is for run %r, not %r" % (marker, verified.get("run_id"), p["run_id"]))
    if verified.get("instance_id") not in (None, "", iid):
        reasons.append("%s was written for instance %r, not %r" % (marker, verified.get("instance_id"), iid))
    if str(verified.get("manifest_sha256") or "").lower() != box_sha:
        reasons.append("the manifest on the box changed since the pull was verified (box %s…, verified %s…): "
                       "re-run collect" % (box_sha[:12], str(verified.get("manifest_sha256"))[:12]))
    try:
        raw = base64.b64decode(p["box_manifest_content"] or "")
    except (TypeError, ValueError):
        raw = b""
    if hashlib.sha256(raw).hexdigest() != box_sha:
        reasons.append("the manifest read from the box does not hash to %s… (changed while reading): run again"
                       % box_sha[:12])
        return reasons, evidence
    try:
        doc = json.loads(raw.decode("utf-8"))
    except ValueError:
        reasons.append("the manifest on the box is not valid JSON")
        return reasons, evidence
    problems = validate_manifest(doc, p["run_id"])
    if problems:
        reasons.append("the manifest on the box is invalid: %s" % "; ".join(problems[:5]))
        return reasons, evidence
    if reasons:
        return reasons, evidence
    result = compare(pulled, doc)
    evidence.update(files=result.get("files"), bytes=result.get("bytes"))
    if not result.get("ok", not any(result.get(k) for k in ("missing", "unexpected", "size_mismatch",
                                                                  "sha_mismatch"))):
        evidence.update({k: result.get(k) for k in ("missing", "unexpected", "size_mismatch", "sha_mismatch")})
        reasons.append("the local copy %s no longer matches the manifest: %s" % (pulled, describe_problems(result)))
    return reasons, evidence


def deleted_mounts(profile, reversible):
    """Mounts that do not survive the verb (stop for a reversible verb, terminate otherwise)."""
    kind = "stop" if reversible else "terminate"
    return [m.get("path") for m in profile.get("mounts") or [] if kind not in (m.get("survives") or [])]


def write_record(path, record):
    if not path:
        return
    directory = os.path.dirname(path) or "."
    if not os.path.isdir(directory):
        os.makedirs(directory)
    fd, tmp = tempfile.mkstemp(prefix="." + os.path.basename(path) + ".", suffix=".tmp", dir=directory)
    with os.fdopen(fd, "w") as handle:
        handle.write(json.dumps(record, indent=2, sort_keys=True) + "\n")
        handle.flush()
        os.fsync(handle.fileno())
    os.chmod(tmp, 0o644)
    os.replace(tmp, path)


def call_made_before(path, instance_id):
    """True when the earlier record for this instance shows a meter-stop call and an unknown outcome."""
    if not path or not os.path.exists(path):
        return False
    try:
        with open(path) as handle:
            prev = json.load(handle)
    except (IOError, OSError, ValueError):
        return False
    if not isinstance(prev, dict) or prev.get("instance_id") != instance_id:
        return False
    if not str(prev.get("final_state") or "").startswith("unknown"):
        return False
    return any(c.get("method") != "GET" and (c.get("status") == "timeout" or
                                             (isinstance(c.get("status"), int) and c["status"] < 300))
               for c in prev.get("calls") or [] if isinstance(c, dict))


def run_kubectl(module, name):
    kubectl = shutil.which("kubectl")
    command = ["kubectl", "delete", "job", name]
    if not kubectl:
        return "manual — run: %s (the PVC is kept)" % " ".join(command), False
    proc = subprocess.run([kubectl, "delete", "job", name, "--ignore-not-found", "--wait=true"],
                          capture_output=True, text=True, timeout=300)
    if proc.returncode != 0:
        module.fail_json(msg="kubectl delete job %s failed: %s" % (name, proc.stderr.strip()[:500]),
                         final_state="unknown — check kubectl get job")
    return ("deleted" if proc.stdout.strip() else "already gone"), bool(proc.stdout.strip())


def main():
    module = AnsibleModule(
        argument_spec=dict(
            profile=dict(type="dict", required=True),
            instance_id=dict(type="str", required=True),
            confirm=dict(type="str", default=""),
            host=dict(type="str", required=True),
            run_id=dict(type="str", required=True),
            runs_dir=dict(type="path", required=True),
            box_manifest_sha256=dict(type="str", default=""),
            box_manifest_content=dict(type="str", default=""),
            base_url=dict(type="str"),
            poll_timeout_s=dict(type="float", default=300),
            poll_interval_s=dict(type="float", default=5),
            http_timeout_s=dict(type="float", default=30),
            ledger_path=dict(type="path"),
            resume_poll=dict(type="bool"),
        ),
        supports_check_mode=True,
    )
    p = module.params
    profile = p["profile"]
    meter = profile.get("meter_stop") or {}
    verb = meter.get("verb") or "manual"
    reversible = bool(meter.get("reversible"))
    keeps = list(meter.get("keeps_billing") or [])
    base = dict(instance_id=p["instance_id"], verb=verb, label=meter.get("label") or verb, reversible=reversible,
                deletes=deleted_mounts(profile, reversible), keeps_billing=keeps,
                manual_steps=list(meter.get("manual_steps") or []), post_check=meter.get("post_check") or "")

    reasons, evidence = check_gate(p)
    if reasons:
        module.fail_json(msg="teardown refused for %s (%s %s): %s" % (p["host"], verb, p["instance_id"],
                                                                      "; ".join(reasons)),
                         rc_hint=3, gate=dict(passed=False, reasons=reasons, **evidence), changed=False, **base)
    gate = dict(passed=True, **evidence)

    if module.check_mode:
        module.exit_json(changed=True, gate=gate, final_state="not called (check mode): would %s %s"
                         % (verb, p["instance_id"]), calls=[], **base)

    now = lambda: datetime.datetime.now(datetime.timezone.utc).isoformat()  # noqa: E731
    record = dict(instance_id=p["instance_id"], verb=verb, reversible=reversible, calls=[], final_state=None,
                  keeps_billing=keeps, at=None)
    extra = {}
    changed = False
    api = meter.get("api") or {}
    client_error = None
    if api.get("client"):
        try:
            rgt_cloud.make_client(api, base_url=p["base_url"], http_timeout=p["http_timeout_s"])
        except rgt_cloud.CloudError as exc:
            client_error = exc
    if client_error is not None and client_error.kind == "auth" and reversible and meter.get("manual_steps"):
        # a reversible stop with no API key (AutoDL's 关机 is a console click for most users): the console steps
        # are the way, not an error; with the key set, rgt makes the call itself
        extra["warnings"] = ["%s; follow the console steps below instead" % client_error.message]
        api = {}
    if api.get("client"):
        resume = p["resume_poll"]
        if resume is None:
            resume = call_made_before(p["ledger_path"], p["instance_id"])
        try:
            client = rgt_cloud.make_client(api, base_url=p["base_url"], http_timeout=p["http_timeout_s"])
        except rgt_cloud.CloudError as exc:
            module.fail_json(msg=exc.message, kind=exc.kind, gate=gate, calls=[], **base)
        try:
            outcome = rgt_cloud.teardown(client, p["instance_id"], poll_timeout_s=p["poll_timeout_s"],
                                         poll_interval_s=p["poll_interval_s"], resume_poll=resume)
        except rgt_cloud.CloudError as exc:
            record.update(calls=client.calls, final_state=rgt_cloud.UNKNOWN if client.calls and any(
                c["method"] != "GET" for c in client.calls) else "not stopped", at=now(), error=exc.message)
            write_record(p["ledger_path"], record)
            module.fail_json(msg="%s: %s" % (p["instance_id"], exc.message), kind=exc.kind, gate=gate,
                             **dict(base, **record))
        still = client.leftovers(p["instance_id"]) if outcome["final_state"] != rgt_cloud.UNKNOWN else []
        final = ("already " + outcome["final_state"]) if outcome["already"] else outcome["final_state"]
        changed = outcome["stop_called"]
        record.update(calls=client.calls, final_state=final, at=now(), states=outcome["states"])
        extra.update(warnings=outcome["warnings"], still_billing=still)
        if still:
            record["keeps_billing"] = keeps + still
        if final == rgt_cloud.UNKNOWN:
            record["last_seen"] = outcome.get("last_seen")
            write_record(p["ledger_path"], record)
            module.fail_json(msg="%s: the platform did not report the instance gone within %.0f s (last seen: %s); "
                             "not calling again — %s" % (p["instance_id"], p["poll_timeout_s"],
                                                         outcome.get("last_seen"), rgt_cloud.UNKNOWN),
                             gate=gate, **dict(base, **dict(record, **extra)))
    elif verb == "none":
        record.update(final_state="nothing to stop", at=now())
    elif verb == "scancel":
        record.update(final_state="scancel requested on the login node", at=now())
        extra["remote_command"] = ["scancel", p["instance_id"]]
        changed = True
    elif verb == "delete_job":
        final, changed = run_kubectl(module, p["instance_id"])
        record.update(final_state=final, at=now())
    else:
        record.update(final_state="manual — nothing was called: follow the steps in the platform console", at=now())
    write_record(p["ledger_path"], record)
    module.exit_json(changed=changed, gate=gate, **dict(base, **dict(record, **extra)))


if __name__ == "__main__":
    main()
