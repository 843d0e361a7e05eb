#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: rgt contributors
# SPDX-License-Identifier: Apache-2.0

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: rgt_teardown
short_description: Stop the meter of a rented GPU instance, behind the box-wide teardown gate (controller side)
version_added: "0.1.0"
description:
  - Runs on the controller (C(delegate_to) localhost), once per instance (hosts that share one instance id are one
    teardown). First the teardown gate, entirely local and with zero control-plane calls; a refusal fails with
    C(rc_hint=3) and a message naming every run that blocks it and why.
  - "Gate (C(rgt_gate), the same code the runner's plan uses): I(confirm) equals I(instance_id); no run on the
    box is live; every finished run, and every run with a sealed export or a manifest, has a verified pull:
    C(<runs_dir>/<run_id>/<host>.PULL_VERIFIED.json) (host = the manifest's C(host), one of I(instance_hosts))
    binds that run, this instance and the SHA-256 of the manifest now on the box, and a fresh re-verification of
    C(<runs_dir>/<run_id>/<host>/) (file set, sizes, SHA-256) passes; a manifest written on another instance
    refuses. Failed, preempted, killed, dead and never-started runs do not refuse; the gate lists them with what
    the verb does to their files. A box with no runs passes."
  - Then the profile's meter-stop verb. API verbs (RunPod, vast.ai, Lambda, Paperspace, AutoDL) look at the
    instance first (already gone, no call), call the meter-stop once, re-query instead of calling again after a
    timeout or 409, and poll until the platform reports it gone (or stopped, for a reversible verb), bounded by
    I(poll_timeout_s); a poll that runs out fails with the state C(unknown — check the console). A reversible
    stop whose API key is not set (AutoDL 关机 without C(AUTODL_TOKEN)) calls nothing and returns the console
    steps.
  - Which verb stops the meter comes from the registry C(plugins/module_utils/rgt_registry.py) (the API client
    C(meter_stop.api.client), else C(meter_stop.verb), else C(manual) for an action with console steps); one that
    is not registered or not built fails before the gate with C(rc_hint=2) and the profile field, nothing called.
  - C(manual) prints the profile's steps and calls nothing; C(none) has nothing to stop; C(scancel) returns the
    command for the role to run on the login node; C(delete_job) calls nothing here (C(rgt-run teardown) deletes
    the run's Jobs by name, docs/kubernetes.md) and says so.
  - Writes the record C({instance_id, verb, reversible, calls, final_state, keeps_billing, at}) (atomic) to
    I(ledger_path) and, with I(ledger_dir), to C(<ledger_dir>/<host>.json) of I(host) and of every host in
    I(instance_hosts) (one instance, one record) once the gate passed, and returns the same. An API verb records
    its intent right before the meter-stop call (C(final_state) C(requested — not reported gone yet),
    C(requested_at)) and again once the call is answered, so a run interrupted while it calls or polls (Ctrl-C,
    a kill) leaves a record saying the stop is in flight.
  - A record of this instance that says a stop is in flight (that intent, or C(unknown — check the console) after
    a call the platform accepted or never answered) makes this run poll the same instance to a terminal state
    without calling again, and without the gate or the confirmation (the box may already be gone, and nothing
    destructive is done); C(resumed) is true and the record keeps the earlier calls.
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
    description: The inventory host that runs the teardown of this instance (named in messages).
    type: str
    required: true
  instance_hosts:
    description: Every inventory host that carries I(instance_id) (a manifest's C(host) must be one of them);
      empty means I(host) alone.
    type: list
    elements: str
    default: []
  box_runs:
    description: The C(box) documents of C(rgt.remote_gpu.rgt_box_runs), one per host of this instance that listed
      the box (hosts sharing the instance list the same box; each run is judged once).
    type: list
    elements: dict
    required: true
  unlisted_hosts:
    description: Hosts of this instance in the play that could not list the box; each refuses the gate.
    type: list
    elements: str
    default: []
  runs_dir:
    description: The controller's runs root (C(runs/<run_id>/<host>/) and its markers).
    type: path
    required: true
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
  rclone_binary:
    description:
      - The controller's rclone; with it the gate accepts a run whose sealed export was offloaded and verified
        (the box's C(OFFLOAD_VERIFIED.json)) when the target still holds that copy (module_utils rgt_offload
        C(target_check)). Without it such a run needs a verified pull.
    type: str
  ledger_dir:
    description: The directory of the teardown records C(<host>.json); the record is read from and written to
      the file of I(host) and of every host in I(instance_hosts). Empty to skip.
    type: path
  resume_poll:
    description:
      - Only poll the instance, never call (an earlier run made the meter-stop call, or was interrupted making it,
        and saw no terminal state). Read from the records (I(ledger_path), I(ledger_dir)) when not given.
    type: bool
notes:
  - Supports check mode (the gate is evaluated; nothing is called; the result says what would happen).
"""

EXAMPLES = r"""
- name: List every run on the box
  rgt.remote_gpu.rgt_box_runs:
    durable_root: "{{ teardown_durable_root }}"
    mounts: "{{ teardown_profile.mounts }}"
  register: teardown_box

- name: Stop the meter (gated on every run of the box)
  rgt.remote_gpu.rgt_teardown:
    profile: "{{ teardown_profile }}"
    instance_id: "{{ teardown_instance_id }}"
    confirm: "{{ teardown_confirm }}"
    host: "{{ inventory_hostname }}"
    box_runs: ["{{ teardown_box.box }}"]
    runs_dir: "{{ teardown_runs_dir }}"
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
  description: C(gone), C(stopped), C(already gone), C(unknown — check the console), C(requested — not reported
    gone yet) (only in a record a run left when it was interrupted), or what a non-API verb did.
  returned: success
  type: str
keeps_billing:
  description: What keeps billing after the verb (the profile's C(keeps_billing)), plus resources found still
    billing (Paperspace lists).
  returned: success
  type: list
clocks:
  description: Danger clocks that start once the verb has run (profile C(meter_stop.starts_clocks)), e.g. the
    release of a powered-off AutoDL box after 15 days.
  returned: always
  type: list
manual_steps:
  description: The profile's console steps (printed when nothing was called).
  returned: always
  type: list
gate:
  description: The gate's verdict (module_utils rgt_gate.evaluate; the runner's plan is the same function).
  returned: always
  type: dict
  contains:
    instance_id: {type: str, description: The instance judged.}
    hosts: {type: list, elements: str, description: Every inventory host that carries the instance.}
    passed: {type: bool, description: Nothing on the box blocks the meter stop.}
    reasons: {type: list, elements: str, description: "One per blocking run, naming it and its state."}
    runs:
      type: list
      elements: dict
      description: "Every run on the box: project, run_id, run_dir, state, attempt, sealed, manifest, pull, blocks,
        reason, note, files_go (whether the verb deletes its files; null when the profile does not say),
        durable_root; with a manifest also its evidence: manifest_sha256, host (the host it names), marker (the
        local PULL_VERIFIED.json), pulled (the local copy), files, bytes, and when the copy differs missing,
        unexpected, size_mismatch, sha_mismatch."
    others: {type: list, elements: str, description: Directories under the roots that are not rgt runs.}
    notes: {type: list, elements: str, description: What passed without blocking (an empty box, unpulled runs).}
    roots: {type: list, elements: str, description: The durable roots the listings covered.}
remote_jobs:
  description: For C(scancel), every job the role cancels on the login node, C([{job_id, argv}]) (the instance id,
    then the job each run on the box submitted through sbatch).
  returned: when verb is scancel
  type: list
resumed:
  description: A stop an earlier run requested was polled (the record said it was in flight); nothing was gated,
    nothing was called.
  returned: always
  type: bool
rc_hint:
  description: 3 when the gate refused (the runner's exit code).
  returned: on refusal
  type: int
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.rgt.remote_gpu.plugins.module_utils import rgt_gate, rgt_manifest, rgt_offload
from ansible_collections.rgt.remote_gpu.plugins.module_utils import rgt_meterstop as ms


def check_gate(p):
    """The gate's verdict (local reads only: no control-plane call is made here)."""
    problem = rgt_gate.confirmation_problem(p["confirm"], p["instance_id"])
    if problem:  # nothing on the controller is read before the user named the instance
        return {"passed": False, "reasons": [problem], "runs": [], "others": [], "notes": []}
    check = rgt_offload.target_check(p["rclone_binary"]) if p["rclone_binary"] else None
    return rgt_gate.evaluate(p["instance_id"], p["instance_hosts"] or [p["host"]], p["box_runs"], p["runs_dir"],
                             p["profile"], rgt_manifest, unlisted=p["unlisted_hosts"], offload_check=check)


def main():
    module = AnsibleModule(
        argument_spec=dict(
            profile=dict(type="dict", required=True),
            instance_id=dict(type="str", required=True),
            confirm=dict(type="str", default=""),
            host=dict(type="str", required=True),
            instance_hosts=dict(type="list", elements="str", default=[]),
            box_runs=dict(type="list", elements="dict", required=True),
            unlisted_hosts=dict(type="list", elements="str", default=[]),
            runs_dir=dict(type="path", required=True),
            base_url=dict(type="str"),
            poll_timeout_s=dict(type="float", default=300),
            poll_interval_s=dict(type="float", default=5),
            http_timeout_s=dict(type="float", default=30),
            ledger_path=dict(type="path"),
            ledger_dir=dict(type="path"),
            rclone_binary=dict(type="str"),
            resume_poll=dict(type="bool"),
        ),
        supports_check_mode=True,
    )
    p = module.params
    base = ms.base_result(p)

    # 1. decide the verb (the registry): an unregistered or unbuilt one is bad input, nothing read or called
    entry, refused = ms.verb_problem(p["profile"])
    if refused:
        field, message, fix = refused
        module.fail_json(msg="%s: %s. Fix: %s" % (field, message, fix), field=field, rc_hint=2, changed=False,
                         **base)

    # 2. gate check: a stop an earlier run requested is polled without the gate; else the gate, all local
    earlier = ms.earlier_stop(p, entry)
    if earlier is not None:
        base["resumed"] = True
        gate = ms.resumed_gate(p, earlier, base["verb"])
    else:
        gate = check_gate(p)
    if not gate["passed"]:
        module.fail_json(msg="teardown refused for %s (%s %s): %s" % (p["host"], base["verb"], p["instance_id"],
                                                                      "; ".join(gate["reasons"])),
                         rc_hint=3, gate=gate, changed=False, **base)
    if module.check_mode:
        module.exit_json(changed=True, gate=gate, final_state="not called (check mode): would %s %s" % (
            "poll" if earlier is not None else base["verb"], p["instance_id"]), calls=[], **base)

    # 3. call and 4. poll: the verb's class (an API verb records its intent before the call)
    record = ms.new_record(p, earlier)
    extra = {}
    stop = ms.choose(module, entry, earlier, extra)
    changed = stop.stop(module, record, extra, base, gate, earlier)

    # 5. record (atomic, the file of every host of the instance)
    ms.write_records(p, record)
    module.exit_json(changed=changed, gate=gate, **dict(base, **dict(record, **extra)))


if __name__ == "__main__":
    main()
