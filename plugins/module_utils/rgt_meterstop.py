# -*- coding: utf-8 -*-
# Copyright: rgt contributors
# SPDX-License-Identifier: Apache-2.0
"""How rgt_teardown stops a meter, step by step: decide the verb (the registry, plugins/module_utils/rgt_registry.py:
the profile's API client, else its verb, else manual), find a stop an earlier run left in flight, call the verb
(one small class per verb in the table ``STOPS``), and keep the teardown record of the instance (atomic, one file
per host of the instance). The gate itself is rgt_gate's; the control-plane clients and the one look-call-poll
algorithm are rgt_cloud's.

A verb's class fills the record (final_state, calls), may add to ``extra`` (warnings, remote_jobs) and returns
whether it changed anything. Its ``name`` is the registry's name of the verb; the one class ``ApiStop`` serves every
verb that is a control-plane client (the registry's ``api``), its key ``API``. tests/unit/test_registry.py holds the
table and the registry together.

Controller-side (rgt_teardown runs delegated to localhost): Python 3.6+, stdlib and Ansible's module_utils only.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import datetime
import json
import os

from ansible_collections.rgt.remote_gpu.plugins.module_utils import rgt_cloud, rgt_gate, rgt_registry, rgt_slurm
from ansible_collections.rgt.remote_gpu.plugins.module_utils import rgt_runlayout as rl

API = "api"  # the key in STOPS of the stop every control-plane client verb shares


def _now():
    return datetime.datetime.now(datetime.timezone.utc).isoformat()


# ---------------------------------------------------------------- the records of an instance

def write_record(path, record):
    """The record as JSON at `path` (atomic: rgt_runlayout.atomic_write), its directory made when missing."""
    if not path:
        return
    directory = os.path.dirname(path) or "."
    if not os.path.isdir(directory):
        os.makedirs(directory)
    rl.atomic_write(path, json.dumps(record, indent=2, sort_keys=True) + "\n", 0o644)


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


def in_flight_record(p):
    """The first record of this instance that says a meter-stop call is in flight (rgt_cloud.record_state), or
    None: this run then polls and never calls again."""
    for path in record_paths(p):
        record = rl.read_json(path)
        if rgt_cloud.record_state(record, p["instance_id"]) == rgt_cloud.RECORD_IN_FLIGHT:
            return record
    return None


def new_record(p, earlier):
    """The record this teardown writes: {instance_id, verb, reversible, calls, final_state, keeps_billing, at}, with
    the time an earlier run requested the stop it polls."""
    meter = p["profile"].get("meter_stop") or {}
    record = dict(instance_id=p["instance_id"], verb=meter.get("verb") or "manual",
                  reversible=bool(meter.get("reversible")), calls=[], final_state=None,
                  keeps_billing=list(meter.get("keeps_billing") or []), at=None)
    if earlier is not None and earlier.get("requested_at"):
        record["requested_at"] = earlier["requested_at"]
    return record


# ---------------------------------------------------------------- 1. decide the verb

def base_result(p):
    """What every result of this teardown carries: the instance, the verb and what it does and leaves."""
    profile = p["profile"]
    meter = profile.get("meter_stop") or {}
    verb = meter.get("verb") or "manual"
    return dict(instance_id=p["instance_id"], verb=verb, label=meter.get("label") or verb,
                reversible=bool(meter.get("reversible")), resumed=False,
                deletes=rgt_gate.deleted_mounts(profile), keeps_billing=list(meter.get("keeps_billing") or []),
                manual_steps=list(meter.get("manual_steps") or []), post_check=meter.get("post_check") or "",
                clocks=rgt_gate.clocks_started(profile))


def verb_problem(profile):
    """(the registry's entry of the verb that stops this profile's meter, None), or (None, (field, message, fix))
    when it is not registered or not built: bad input, nothing read or called."""
    meter = profile.get("meter_stop") or {}
    verb = meter.get("verb") or "manual"
    entry = rgt_registry.meter_stop(rgt_registry.meter_stop_of(dict(meter, verb=verb)))
    if entry is not None and entry.built:
        return entry, None
    problems = rgt_registry.profile_problems(profile)
    return None, problems[0] if problems else (
        "meter_stop", "%r has no registered meter-stop verb that is built" % verb,
        "use one of: " + ", ".join(e.name for e in rgt_registry.METER_STOPS if e.built))


# ---------------------------------------------------------------- 2. a stop in flight, else the gate

def earlier_stop(p, entry):
    """The record of a stop an earlier run requested and did not see through (only an API verb makes one; with
    resume_poll true and no record, an empty one), else None: then this run polls, calls nothing, gates nothing
    (the box may be gone already, and a poll destroys nothing)."""
    if not entry.api or p["resume_poll"] is False:
        return None
    earlier = in_flight_record(p)
    if earlier is None and p["resume_poll"]:
        earlier = {"calls": []}
    return earlier


def resumed_gate(p, earlier, verb):
    """The gate's verdict for a stop in flight: passed, with a note saying what an earlier run requested."""
    note = ("the %s of %s was requested by an earlier run (at %s) that did not see it end: polling it, calling "
            "nothing" % (verb, p["instance_id"], earlier.get("requested_at") or earlier.get("at") or "an unknown "
                         "time"))
    return {"instance_id": p["instance_id"], "hosts": p["instance_hosts"] or [p["host"]], "passed": True,
            "reasons": [], "runs": [], "others": [], "roots": [], "notes": [note]}


# ---------------------------------------------------------------- 3. call (and poll): the verbs

class MeterStop(object):
    """A meter-stop verb of the registry (rgt_registry.METER_STOPS) of the same ``name``."""

    name = None

    def stop(self, module, record, extra, base, gate, earlier=None):
        """Stop the meter: fill `record`, maybe add to `extra`; True when anything changed. `earlier`: the record
        of a stop in flight (only an API verb makes one), else None."""
        raise NotImplementedError


class ApiStop(MeterStop):
    """A control-plane client (rgt_cloud): look, record the intent, call once, record the answer, poll until gone.
    `earlier`: the record of a stop in flight (poll only, keep its calls), else None."""

    name = API

    def stop(self, module, record, extra, base, gate, earlier=None):
        p = module.params
        api = (p["profile"].get("meter_stop") or {}).get("api") or {}
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


class NothingToStop(MeterStop):
    """Nothing bills (the local profile): nothing to stop."""

    name = "none"

    def stop(self, module, record, extra, base, gate, earlier=None):
        record.update(final_state="nothing to stop", at=_now())
        return False


class Scancel(MeterStop):
    """The role runs each command on the login node and watches each job end."""

    name = "scancel"

    def stop(self, module, record, extra, base, gate, earlier=None):
        p = module.params
        record.update(final_state="scancel requested on the login node", at=_now())
        extra["remote_jobs"] = rgt_slurm.teardown_jobs(p["instance_id"], p["box_runs"])
        return True


class DeleteJob(MeterStop):
    """A Kubernetes host's meter is its run's Jobs, which only the runner knows by name (rgt.k8s_run, from the
    ledger): the role alone deletes nothing and says how (never a Job named after the instance id)."""

    name = "delete_job"

    def stop(self, module, record, extra, base, gate, earlier=None):
        record.update(final_state="manual — nothing was called: `rgt-run teardown` deletes this host's run Jobs by "
                                  "name (kubectl delete job <name>; the claim is kept)", at=_now())
        return False


class Manual(MeterStop):
    """Nothing is called: the user follows the profile's console steps."""

    name = "manual"

    def stop(self, module, record, extra, base, gate, earlier=None):
        record.update(final_state="manual — nothing was called: follow the steps in the platform console", at=_now())
        return False


# The verbs by the registry's name (built from the classes; API for every control-plane client; every entry of
# rgt_registry.METER_STOPS has its class here: tests/unit/test_registry.py).
STOPS = dict((cls.name, cls) for cls in (ApiStop, NothingToStop, Scancel, DeleteJob, Manual))


def stop_of(entry):
    """The class that runs the registry's verb `entry` (an instance)."""
    return STOPS[API if entry.api else entry.name]()


def choose(module, entry, earlier, extra):
    """The verb to call: the registry's, except a reversible stop whose API key is not set (AutoDL's 关机 is a
    console click for most users), which follows the console steps instead (a warning in `extra`); with the key
    set, rgt makes the call itself. A stop in flight is always polled by its own verb."""
    p = module.params
    meter = p["profile"].get("meter_stop") or {}
    if entry.api and earlier is None:
        try:
            rgt_cloud.make_client(meter.get("api") or {}, base_url=p["base_url"], http_timeout=p["http_timeout_s"])
        except rgt_cloud.CloudError as exc:
            if exc.kind == "auth" and rgt_gate.console_instead(meter, False):
                extra["warnings"] = ["%s; follow the console steps below instead" % exc.message]
                entry = rgt_registry.meter_stop("manual")
    return stop_of(entry)
