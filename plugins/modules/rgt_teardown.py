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

import datetime
import json
import os
import tempfile

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.rgt.remote_gpu.plugins.module_utils import (
    rgt_cloud,
    rgt_gate,
    rgt_manifest,
    rgt_registry,
    rgt_slurm,
)


def check_gate(p):
    """The gate's verdict (local reads only: no control-plane call is made here)."""
    problem = rgt_gate.confirmation_problem(p["confirm"], p["instance_id"])
    if problem:  # nothing on the controller is read before the user named the instance
        return {"passed": False, "reasons": [problem], "runs": [], "others": [], "notes": []}
    return rgt_gate.evaluate(p["instance_id"], p["instance_hosts"] or [p["host"]], p["box_runs"], p["runs_dir"],
                             p["profile"], rgt_manifest, unlisted=p["unlisted_hosts"])


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
    try:  # the rename itself survives a crash only once the directory is on disk
        dir_fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(dir_fd)
    except OSError:
        pass
    finally:
        os.close(dir_fd)


def record_paths(p):
    """Every record of this instance: I(ledger_path), and with I(ledger_dir) the file of each of its hosts."""
    out = [p["ledger_path"]] if p["ledger_path"] else []
    if p["ledger_dir"]:
        for name in sorted(set((p["instance_hosts"] or []) + [p["host"]])):
            out.append(os.path.join(p["ledger_dir"], name + ".json"))
    return [path for i, path in enumerate(out) if path not in out[:i]]


def write_records(p, record):
    for path in record_paths(p):
        write_record(path, record)


def read_record(path):
    try:
        with open(path) as handle:
            return json.load(handle)
    except (IOError, OSError, ValueError):
        return None


def in_flight_record(p):
    """The first record of this instance that says a meter-stop call is in flight (rgt_cloud.record_state), or
    None: this run then polls and never calls again."""
    for path in record_paths(p):
        record = read_record(path)
        if rgt_cloud.record_state(record, p["instance_id"]) == rgt_cloud.RECORD_IN_FLIGHT:
            return record
    return None


def _now():
    return datetime.datetime.now(datetime.timezone.utc).isoformat()


# One function per meter-stop verb of rgt_registry (``stop_<impl>``): each fills the record (final_state, calls),
# may add to `extra` (warnings, remote_jobs) and returns whether it changed anything. `earlier`: the record of a
# stop in flight (only an API verb makes one), else None.

def stop_api(module, p, api, record, extra, base, gate, earlier=None):
    """A control-plane client (rgt_cloud): look, record the intent, call once, record the answer, poll until gone.
    `earlier`: the record of a stop in flight (poll only, keep its calls), else None."""
    resume = earlier is not None
    before = list(earlier.get("calls") or []) if resume else []
    try:
        client = rgt_cloud.make_client(api, base_url=p["base_url"], http_timeout=p["http_timeout_s"])
    except rgt_cloud.CloudError as exc:
        module.fail_json(msg=exc.message, kind=exc.kind, gate=gate, calls=[], **base)

    def on_call(stage):
        # right before the call and once it is answered: a run killed from here on leaves a stop in flight
        record.update(calls=before + client.calls, final_state=rgt_cloud.REQUESTED, at=_now())
        record.setdefault("requested_at", record["at"])
        write_records(p, record)

    try:
        outcome = rgt_cloud.teardown(client, p["instance_id"], poll_timeout_s=p["poll_timeout_s"],
                                     poll_interval_s=p["poll_interval_s"], resume_poll=resume, on_call=on_call)
    except rgt_cloud.CloudError as exc:
        calls = before + client.calls
        record.update(calls=calls, final_state=rgt_cloud.UNKNOWN if any(
            c.get("method") != "GET" for c in calls) else "not stopped", at=_now(), error=exc.message)
        write_records(p, record)
        module.fail_json(msg="%s: %s" % (p["instance_id"], exc.message), kind=exc.kind, gate=gate,
                         **dict(base, **record))
    still = client.leftovers(p["instance_id"]) if outcome["final_state"] != rgt_cloud.UNKNOWN else []
    final = ("already " + outcome["final_state"]) if outcome["already"] else outcome["final_state"]
    record.update(calls=before + client.calls, final_state=final, at=_now(), states=outcome["states"])
    extra.update(warnings=extra.get("warnings", []) + outcome["warnings"], still_billing=still)
    if still:
        record["keeps_billing"] = record["keeps_billing"] + still
    if final == rgt_cloud.UNKNOWN:
        record["last_seen"] = outcome.get("last_seen")
        write_records(p, record)
        module.fail_json(msg="%s: the platform did not report the instance gone within %.0f s (last seen: %s); "
                         "not calling again — %s" % (p["instance_id"], p["poll_timeout_s"],
                                                     outcome.get("last_seen"), rgt_cloud.UNKNOWN),
                         gate=gate, **dict(base, **dict(record, **extra)))
    return outcome["stop_called"] or resume


def stop_none(module, p, api, record, extra, base, gate, earlier=None):
    record.update(final_state="nothing to stop", at=_now())
    return False


def stop_scancel(module, p, api, record, extra, base, gate, earlier=None):
    """The role runs each command on the login node and watches each job end."""
    record.update(final_state="scancel requested on the login node", at=_now())
    extra["remote_jobs"] = rgt_slurm.teardown_jobs(p["instance_id"], p["box_runs"])
    return True


def stop_delete_job(module, p, api, record, extra, base, gate, earlier=None):
    """A Kubernetes host's meter is its run's Jobs, which only the runner knows by name (rgt.k8s_run, from the
    ledger): the role alone deletes nothing and says how (never a Job named after the instance id)."""
    record.update(final_state="manual — nothing was called: `rgt-run teardown` deletes this host's run Jobs by "
                              "name (kubectl delete job <name>; the claim is kept)", at=_now())
    return False


def stop_manual(module, p, api, record, extra, base, gate, earlier=None):
    record.update(final_state="manual — nothing was called: follow the steps in the platform console", at=_now())
    return False


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
                resumed=False,
                deletes=rgt_gate.deleted_mounts(profile), keeps_billing=keeps,
                manual_steps=list(meter.get("manual_steps") or []), post_check=meter.get("post_check") or "",
                clocks=rgt_gate.clocks_started(profile))

    # the verb that stops this meter, from the registry: an unregistered or unbuilt one is bad input, nothing read
    method = rgt_registry.meter_stop(rgt_registry.meter_stop_of(dict(meter, verb=verb)))
    if method is None or not method.built:
        problems = rgt_registry.profile_problems(profile)
        field, message, fix = problems[0] if problems else (
            "meter_stop", "%r has no registered meter-stop verb that is built" % verb,
            "use one of: " + ", ".join(e.name for e in rgt_registry.METER_STOPS if e.built))
        module.fail_json(msg="%s: %s. Fix: %s" % (field, message, fix), field=field, rc_hint=2, changed=False,
                         **base)

    # a stop an earlier run requested and did not see through: poll it, call nothing, gate nothing (the box may
    # be gone already, and a poll destroys nothing)
    earlier = None
    if method.client_class and p["resume_poll"] is not False:
        earlier = in_flight_record(p)
        if earlier is None and p["resume_poll"]:
            earlier = {"calls": []}
    if earlier is not None:
        base["resumed"] = True
        note = ("the %s of %s was requested by an earlier run (at %s) that did not see it end: polling it, calling "
                "nothing" % (verb, p["instance_id"], earlier.get("requested_at") or earlier.get("at") or "an unknown "
                             "time"))
        gate = {"instance_id": p["instance_id"], "hosts": p["instance_hosts"] or [p["host"]], "passed": True,
                "reasons": [], "runs": [], "others": [], "roots": [], "notes": [note]}
    else:
        gate = check_gate(p)
    if not gate["passed"]:
        module.fail_json(msg="teardown refused for %s (%s %s): %s" % (p["host"], verb, p["instance_id"],
                                                                      "; ".join(gate["reasons"])),
                         rc_hint=3, gate=gate, changed=False, **base)

    if module.check_mode:
        module.exit_json(changed=True, gate=gate, final_state="not called (check mode): would %s %s" % (
            "poll" if earlier is not None else verb, p["instance_id"]), calls=[], **base)

    record = dict(instance_id=p["instance_id"], verb=verb, reversible=reversible, calls=[], final_state=None,
                  keeps_billing=keeps, at=None)
    if earlier is not None and earlier.get("requested_at"):
        record["requested_at"] = earlier["requested_at"]
    extra = {}
    api = meter.get("api") or {}
    if method.client_class and earlier is None:
        try:
            rgt_cloud.make_client(api, base_url=p["base_url"], http_timeout=p["http_timeout_s"])
        except rgt_cloud.CloudError as exc:
            if exc.kind == "auth" and rgt_gate.console_instead(meter, False):
                # a reversible stop with no API key (AutoDL's 关机 is a console click for most users): the console
                # steps are the way, not an error; with the key set, rgt makes the call itself
                extra["warnings"] = ["%s; follow the console steps below instead" % exc.message]
                method = rgt_registry.meter_stop("manual")
    changed = globals()["stop_" + method.impl](module, p, api, record, extra, base, gate, earlier)
    write_records(p, record)
    module.exit_json(changed=changed, gate=gate, **dict(base, **dict(record, **extra)))


if __name__ == "__main__":
    main()
