# -*- coding: utf-8 -*-
# Copyright: rgt contributors
# SPDX-License-Identifier: Apache-2.0
"""The box stops its own meter (docs/unattended.md "The box stops its own meter"): the rule the job wrapper runs
after its export is offloaded and verified, and the record it leaves.

Where the profile allows it (`meter_stop.in_box.allowed`: AutoDL, whose `shutdown` inside the container is 关机:
the meter stops, the disks stay) and the job asks for it (`rgt_job.offload.stop_box`), `rgt-run train --down`
puts a copy of the instance's authorisation into each run's job.json (`inbox_stop`: the authorisation as the
ledger keeps it, with its SHA-256, the profile's command and how the box knows its own id). At the end of a run the
wrapper calls `carry_out`, which stops the meter only when every one of these holds (`decide`, pure):

- the authorisation is intact (its SHA-256 matches its content: an edit by hand is refused), unexpired, and names
  this box's own instance id (the profile's `self_id.env`, from the wrapper's environment or the container's own,
  /proc/1/environ; a box that cannot tell its id refuses);
- every run on the box (every project, rgt_boxlist.list_box) is one the authorisation covers, none is live or
  queued (this run's own wrapper excepted: it is the caller), nothing under active/ or export/ is not an rgt run;
- every run it covers is on the box, sealed, and its sealed export offloaded and verified
  (`<run_dir>/OFFLOAD_VERIFIED.json` binding the SHA-256 of the manifest now on the box).

Runs of one box that end at the same instant decide one at a time, under a box-wide lock
(`<durable_root>/.rgt/inbox.lock`, fcntl), each after its own OFFLOAD_VERIFIED is written: a run whose wrapper still
holds its lock but whose current attempt has its exit.json is on its way out (offload, this rule) and counts by how
it ended, so the last run to decide sees the others ended and verified, and stops; one that finds the stop already
made by another run under the same authorisation does not run the command again.

Either way it writes `<run_dir>/.rgt/inbox_stop.json` (atomic): what it did and why. A stop is on record before the
command runs (`action: stop`), then the command's exit code is added (a command that failed: `stop_failed`).
Anything else is `refused` with the reasons, and the meter keeps running (the watcher carries out the stop from
the controller instead). Nothing irreversible is ever done from here: the profile schema allows an in-box command
only for a reversible verb.

Python 3.6+, stdlib only (bundled into the wrapper by module_utils/rgt_bundle).
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import calendar
import hashlib
import json
import os
import subprocess
import time

from ansible_collections.rgt.remote_gpu.plugins.module_utils import rgt_boxlist
from ansible_collections.rgt.remote_gpu.plugins.module_utils import rgt_runlayout as rl

AUTH_SCHEMA = "rgt/authorisation/v1"
RECORD_SCHEMA = "rgt/inbox-stop/v1"
STOP, STOP_FAILED, REFUSED = "stop", "stop_failed", "refused"
COMMAND_TIMEOUT_S = 120
LOCK_WAIT_S = 300  # how long a run waits for another run's decision (and its command) before it refuses
LIVE = ("live", "queued")
LOCK_NAME = "inbox.lock"


def digest(doc):
    """The SHA-256 over an authorisation's content (every field but `sha256`, canonical JSON): one rule for the
    ledger's copy (runner/rgt/unattended.py) and the box's."""
    body = dict((k, v) for k, v in doc.items() if k != "sha256")
    return hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":")).encode("utf-8")).hexdigest()


def _iso(ts):
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ts))


def authorisation_problem(doc, own_id, now):
    """Why an authorisation does not let this box (its own id `own_id`, None when it cannot tell) stop its meter
    now, or None."""
    if not isinstance(doc, dict):
        return "no authorisation came with the launch (rgt-run train --down)"
    if doc.get("schema") != AUTH_SCHEMA or doc.get("sha256") != digest(doc):
        return "the authorisation was changed after it was made (its SHA-256 does not match its content)"
    if not own_id:
        return "the box cannot tell its own instance id"
    if doc.get("instance_id") != own_id:
        return "the authorisation names instance %r, not this box's %r" % (doc.get("instance_id"), own_id)
    expires = doc.get("expires_ts")
    if not isinstance(expires, (int, float)) or isinstance(expires, bool) or now >= expires:
        return "the authorisation expired at %s" % doc.get("expires_at")
    if not doc.get("in_box"):
        return "the authorisation does not let the box stop its own meter (no in_box)"
    return None


def covered(doc):
    return set((str(r.get("project")), str(r.get("run_id"))) for r in doc.get("runs") or [] if isinstance(r, dict))


def _verified(run):
    """Why a listed run's sealed export is not offloaded and verified, or None (it is)."""
    export = run.get("export") or {}
    proof = run.get("offload") or {}
    if not export.get("sealed") or not export.get("manifest_sha256"):
        return "its export is not sealed on the box"
    if not proof.get("manifest_sha256"):
        return "its sealed export is not offloaded and verified (no OFFLOAD_VERIFIED.json)"
    if proof.get("manifest_sha256") != export["manifest_sha256"] or proof.get("run_id") not in (None, run["run_id"]):
        return "its OFFLOAD_VERIFIED.json does not match the manifest now on the box"
    return None


def decide(spec, box, own, own_state, own_id, now):
    """Whether the box may stop its own meter now: (stop, reasons, runs). `spec` is job.json's `inbox_stop`
    ({authorisation, command, self_id_env}), `box` the listing (rgt_boxlist.list_box), `own` this run's
    (project, run_id) and `own_state` how it ended (its wrapper still holds its lock, so the listing shows it
    live), `own_id` the box's own instance id (None: unknown). Pure."""
    spec = spec if isinstance(spec, dict) else {}
    doc = spec.get("authorisation")
    why = authorisation_problem(doc, own_id, now)
    if why:
        return False, [why], []
    reasons = []
    if not spec.get("command"):
        reasons.append("the profile gives no in-box command")
    allowed = covered(doc)
    runs = []
    on_box = set()
    for run in box.get("runs") or []:
        key = (str(run.get("project")), str(run.get("run_id")))
        on_box.add(key)
        name = "%s/%s" % key
        state = own_state if key == tuple(own) else run.get("state")
        row = {"project": key[0], "run_id": key[1], "state": state,
               "offload": (run.get("offload") or {}).get("target")}
        runs.append(row)
        if key not in allowed:
            reasons.append("run %s is on the box and the authorisation does not cover it" % name)
            continue
        if state in LIVE:
            reasons.append("run %s is still %s" % (name, state))
            continue
        problem = _verified(run)
        if problem:
            reasons.append("run %s (%s): %s" % (name, state, problem))
    for key in sorted(allowed - on_box):
        reasons.append("run %s/%s (authorised) is not on the box" % key)
    for entry in box.get("not_runs") or []:
        reasons.append("%s is on the box and is not an rgt run" % entry.get("path"))
    if not box.get("exists"):
        reasons.append("the durable root %s is not there" % box.get("durable_root"))
    return not reasons, reasons, runs


def own_id_of(env_name, environ=None, proc_environ="/proc/1/environ"):
    """The box's own instance id: the variable `env_name` in this environment, else in the container's own (PID 1's
    environment: a login over SSH does not always carry the container's variables), else None."""
    if not env_name:
        return None
    environ = os.environ if environ is None else environ
    if environ.get(env_name):
        return environ[env_name]
    try:
        with open(proc_environ, "rb") as handle:
            raw = handle.read()
    except (IOError, OSError):
        return None
    for item in raw.split(b"\0"):
        name, _, value = item.partition(b"=")
        if name.decode("utf-8", "replace") == env_name and value:
            return value.decode("utf-8", "replace")
    return None


def wanted(job):
    """Does this run's job.json ask the box to stop its own meter (offload.stop_box, with the launch's copy)?"""
    offload = (job or {}).get("offload") or {}
    return bool(offload.get("stop_box")) and isinstance((job or {}).get("inbox_stop"), dict)


def record_path(paths):
    return paths.inbox_stop  # <run_dir>/.rgt/inbox_stop.json


def _run_command(argv, timeout):
    devnull = open(os.devnull, "rb")
    try:
        proc = subprocess.Popen(argv, stdin=devnull, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                close_fds=True)
        try:
            out, _ = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, _ = proc.communicate()
            return None, (out or b"").decode("utf-8", "replace")[-300:]
        return proc.returncode, (out or b"").decode("utf-8", "replace")[-300:]
    except (IOError, OSError) as exc:
        return None, "cannot run %s: %s" % (argv[0], exc)
    finally:
        devnull.close()


def carry_out(paths, job, environ=None, now=None, run=_run_command, timeout=COMMAND_TIMEOUT_S,
              proc_environ="/proc/1/environ", lock_wait_s=LOCK_WAIT_S):
    """The wrapper's call after its offload finished (module docstring): decide under the box lock, record (atomic),
    and stop the meter when the rule holds. Returns the record, or None when the job did not ask for an in-box stop.
    Never raises."""
    if not wanted(job):
        return None
    spec = job["inbox_stop"]
    handle = _box_lock(paths.durable_root, lock_wait_s)
    try:
        return _carry_out(paths, spec, environ, time.time() if now is None else now, run, timeout, proc_environ,
                          handle, lock_wait_s)
    finally:
        if handle is not None:
            handle.close()  # releases the box lock


def _box_lock(durable_root, wait_s):
    """The box-wide lock the in-box decisions take one at a time (module docstring), or None when it could not be
    taken within wait_s (that run refuses: it never decides beside another)."""
    path = os.path.join(rl.expand_root(durable_root), ".rgt", LOCK_NAME)
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        return rl.take_lock(path, retry_s=wait_s)
    except (IOError, OSError):
        return None


def _others(box, root, own):
    """(run, its RunPaths) for every listed run on the box but this one (`own`: (project, run_id))."""
    for run in box.get("runs") or []:
        key = (str(run.get("project")), str(run.get("run_id")))
        if key == tuple(own):
            continue
        try:
            yield run, rl.RunPaths(root, key[0], key[1])
        except ValueError:
            continue


def _settle(box, root, own):
    """Another run whose wrapper still holds its lock (listed live) but whose current attempt has its exit.json has
    ended: it counts by how it ended (the rule's reading; the teardown gate's listing is left as it is)."""
    for run, paths in _others(box, root, own):
        exit_doc = rl.read_json(paths.exit) if run.get("state") == "live" else None
        if isinstance(exit_doc, dict) and exit_doc.get("attempt") == run.get("attempt"):
            run["state"] = rl.last_state(rl.read_jsonl(paths.attempts), exit_doc)


def _started_ts(paths):
    """When this run's newest attempt started (epoch seconds), or 0."""
    for rec in reversed(rl.read_jsonl(paths.attempts)):
        if isinstance(rec, dict) and rec.get("started_at"):
            try:
                return calendar.timegm(time.strptime(str(rec["started_at"]), "%Y-%m-%dT%H:%M:%SZ"))
            except ValueError:
                return 0
    return 0


def _stopped_by(box, root, own, sha, since):
    """The run (project/run_id at when) whose record says it stopped the box's meter under this authorisation since
    `since` (this run's attempt began: an older stop was undone when the box was started again)."""
    for _run, paths in _others(box, root, own):
        record = rl.read_json(record_path(paths))
        if (isinstance(record, dict) and record.get("action") == STOP and record.get("authorisation") == sha
                and isinstance(record.get("ts"), (int, float)) and record["ts"] >= since):
            return "%s/%s at %s" % (paths.project, paths.run_id, record.get("at"))
    return None


def _carry_out(paths, spec, environ, now, run, timeout, proc_environ, handle, lock_wait_s):
    own = (paths.project, paths.run_id)
    doc = spec.get("authorisation") if isinstance(spec.get("authorisation"), dict) else {}
    try:
        own_id = own_id_of(spec.get("self_id_env"), environ, proc_environ)
        root = rl.expand_root(paths.durable_root)
        box = rgt_boxlist.list_box(paths.durable_root, [])
        _settle(box, root, own)
        own_state = rl.last_state(rl.read_jsonl(paths.attempts), rl.read_json(paths.exit))
        stop, reasons, runs = decide(spec, box, own, own_state, own_id, now)
        if handle is None:
            stop, reasons = False, ["another run's in-box decision held the box lock (%s/.rgt/%s) for over %d s"
                                    % (root, LOCK_NAME, lock_wait_s)] + reasons
        elif stop:
            made = _stopped_by(box, root, own, doc.get("sha256"), _started_ts(paths))
            if made:
                stop, reasons = False, ["the box's meter stop was already made by run %s" % made]
    except Exception as exc:  # a rule that broke never stops a meter
        stop, reasons, runs, own_id = False, ["the in-box rule failed: %s" % exc], [], None
    record = {"schema": RECORD_SCHEMA, "run_id": paths.run_id, "project": paths.project,
              "instance_id": doc.get("instance_id"), "own_id": own_id, "authorisation": doc.get("sha256"),
              "at": _iso(now), "ts": now, "runs": runs, "command": list(spec.get("command") or [])}
    if not stop:
        record.update(action=REFUSED, reasons=reasons,
                      reason="the box did not stop its meter: " + "; ".join(reasons))
        _write(paths, record)
        return record
    record.update(action=STOP, reasons=[], rc=None,
                  reason="every run on the box (%s) is covered by the authorisation of %s and its sealed export "
                         "is offloaded and verified" % (", ".join("%s/%s" % (r["project"], r["run_id"])
                                                                for r in runs), doc.get("instance_id")))
    _write(paths, record)  # on record before the command: the box may be gone the moment it runs
    rc, out = run(list(spec["command"]), timeout)
    record.update(rc=rc, output=out)
    if rc != 0:
        record.update(action=STOP_FAILED, reason="the in-box stop command %s failed (rc %s): %s"
                      % (" ".join(spec["command"]), rc, (out or "").strip()[-200:]))
    _write(paths, record)
    return record


def _write(paths, record):
    try:
        rl.atomic_write_json(record_path(paths), record)
    except (IOError, OSError):
        pass  # a full disk: the wrapper's stderr has said so already; the meter decision stands as made


def describe(record):
    """One line for status and watch: what the box did of its own meter, or None."""
    if not isinstance(record, dict) or not record.get("action"):
        return None
    if record["action"] == STOP:
        return "box stopped its own meter at %s: %s" % (record.get("at"), record.get("reason"))
    return "%s at %s" % (record.get("reason"), record.get("at"))
