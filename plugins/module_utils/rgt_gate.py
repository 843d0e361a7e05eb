# -*- coding: utf-8 -*-
# Copyright: rgt contributors
# SPDX-License-Identifier: Apache-2.0
"""The teardown gate (docs/internals.md "Teardown gate"): may this instance be stopped, given EVERY run on its box?

Pure logic over the box listing (the `rgt_box_runs` module) and the controller's runs root. One copy, used by the
`rgt_teardown` module (which re-checks right before the call) and by the runner's plan
(`rgt.paths.module_util("rgt_gate")`). Python 3.6+, stdlib only, and no import of another module_util: the
manifest rules come in as the `rgt_manifest` module itself (`manifest_lib`, for `compare`, `validate_manifest`
and `describe_problems`), so the runner's by-path loading and Ansible's module packaging use the same code.

For one instance (every inventory host that carries its id, one listing per host that looked at the box):
- a live run refuses (named with project/run_id and attempt), and so does a sweep cell its sweep's live queue
  will still start (state queued);
- a finished run, or any run with a sealed export or a manifest, refuses unless its pull is verified: the marker
  `<runs>/<run_id>/<host>.PULL_VERIFIED.json` (host = the manifest's `host`, one of the instance's inventory
  hosts) binds this run, this instance and the SHA-256 of the manifest now on the box, and the local copy
  re-verifies (file set, sizes, SHA-256). A manifest written on another instance refuses;
- other runs (failed, preempted, killed, dead, never) do not refuse; they are listed with what the verb does to
  the mount their files are on (a failed sweep cell too: it has no result to verify; `rgt-run retry` runs it
  again); a run that names a sweep whose roster on the box does not place it on this instance (an unexpected
  cell) refuses;
- a box with no runs passes.

A verified offload of the sealed export (docs/offload.md) is accepted as a verified pull is: the box's
`<run_dir>/OFFLOAD_VERIFIED.json` (the listing's `offload`) binds the SHA-256 of the manifest now on the box, and
`offload_check(run)` (the caller's look at the target now, module_utils/rgt_offload.target_check) finds the copy
still there with that manifest. The plan row says which holds: pull "verified" (pulled) or "export offloaded to
<target>". Checkpoints offloaded without the export never count; an offload nobody could check refuses.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import base64
import hashlib
import json
import os

PULL_VERIFIED_SCHEMA = "rgt/pull-verified/v1"
PULL_HINT = "run `rgt-run pull`"


# ---------------------------------------------------------------- what the verb does (profile facts)

def verb_kind(reversible):
    """The `survives` word of a verb: 'stop' for a reversible park, 'terminate' for the irreversible end."""
    return "stop" if reversible else "terminate"


def survives(mount, profile):
    """Whether a profile mount survives the profile's meter-stop verb (its `survives` list names the verb's kind):
    the one rule behind deleted_mounts and files_fate."""
    kind = verb_kind(bool((profile.get("meter_stop") or {}).get("reversible")))
    return kind in (mount.get("survives") or [])


def deleted_mounts(profile):
    """Mount paths (as the profile writes them) that do not survive the profile's meter-stop verb."""
    return [m.get("path") for m in profile.get("mounts") or [] if not survives(m, profile)]


def clocks_started(profile):
    """Danger clocks that start once the verb has run (profile `meter_stop.starts_clocks`), e.g. the release of
    a powered-off AutoDL box after 15 days: shown in the plan and repeated after the verb."""
    return list((profile.get("meter_stop") or {}).get("starts_clocks") or [])


def console_instead(meter, key_present):
    """True when a reversible stop is done by hand in the console because its API key is not set (AutoDL 关机 is a
    console click for most users): rgt then calls nothing and gives the profile's manual_steps."""
    api = meter.get("api") or {}
    return bool(api.get("client")) and not key_present and bool(meter.get("reversible")) \
        and bool(meter.get("manual_steps"))


def confirmation_problem(confirm, instance_id):
    """None when the confirmation names this exact instance, else the reason."""
    if not instance_id:
        return "the host has no rgt_instance_id"
    if (confirm or "") == instance_id:
        return None
    if confirm:
        return "the confirmation %r does not name this instance %r" % (confirm, instance_id)
    return "no confirmation: type the instance id %r at the prompt or pass --confirm %s" % (instance_id, instance_id)


def files_fate(mount, profile):
    """(goes, text): whether the verb deletes the mount a run's files are on (None: the profile does not say)."""
    meter = profile.get("meter_stop") or {}
    label = meter.get("label") or meter.get("verb") or "the verb"
    if not isinstance(mount, dict) or not mount.get("path"):
        return None, "its files stay on the box; the profile lists no mount for them, so whether %s keeps them " \
                     "is unknown" % label
    if survives(mount, profile):
        return False, "its files stay on %s, which survives %s" % (mount["path"], label)
    return True, "its files go with the box: %s deletes %s" % (label, mount["path"])


# ---------------------------------------------------------------- one run

def _run_name(run):
    return "%s/%s" % (run.get("project") or "?", run.get("run_id") or "?")


def _read_marker(path):
    try:
        with open(path, "rb") as handle:
            return json.loads(handle.read().decode("utf-8")), None
    except (IOError, OSError):
        return None, "missing"
    except ValueError:
        return None, "invalid"


def _first_file(result):
    for key in ("sha_mismatch", "size_mismatch", "missing", "unexpected"):
        if result.get(key):
            return result[key][0]
    return "the local copy"


def verify_pull(run, instance_id, hosts, runs_dir, manifest_lib):
    """(pull, reason, evidence) for a run with a sealed export or a manifest. reason None: the pull is verified."""
    name = _run_name(run)
    what = "run %s (%s)" % (name, run.get("state") or "?")
    run_id = run.get("run_id")
    export = run.get("export") or {}
    evidence = {}
    if not export.get("manifest"):
        return "sealed, no manifest", "%s is sealed but has no manifest on the box: %s" % (what, PULL_HINT), evidence
    sha = str(export.get("manifest_sha256") or "").lower()
    try:
        raw = base64.b64decode(export.get("manifest_b64") or "")
    except (TypeError, ValueError):
        raw = b""
    if not sha or hashlib.sha256(raw).hexdigest() != sha:
        return "manifest unreadable", "%s: its manifest could not be read whole from the box (%s): run again" % (
            what, export.get("manifest_error") or "changed while reading"), evidence
    evidence["manifest_sha256"] = sha
    try:
        doc = json.loads(raw.decode("utf-8"))
    except ValueError:
        return "manifest invalid", "%s: its manifest on the box is not valid JSON" % what, evidence
    problems = manifest_lib.validate_manifest(doc, run_id)
    if problems:
        return "manifest invalid", "%s: its manifest on the box is invalid: %s" % (what, "; ".join(problems[:5])), \
            evidence
    if doc.get("instance_id") != instance_id:
        return "other instance", "%s: its manifest was written on instance %r, not on %r (the instance being torn " \
                                 "down)" % (what, doc.get("instance_id"), instance_id), evidence
    host = doc.get("host")
    evidence["host"] = host
    if host not in hosts:
        return "unknown host", "%s: its manifest names host %r, which is not an inventory host of instance %r (%s)" \
            % (what, host, instance_id, ", ".join(hosts) or "none"), evidence
    marker = os.path.join(runs_dir, run_id, host + ".PULL_VERIFIED.json")
    pulled = os.path.join(runs_dir, run_id, host)
    evidence.update(marker=marker, pulled=pulled)
    verified, problem = _read_marker(marker)
    if problem == "missing":
        return "sealed, not pulled", "%s is sealed, not pulled (no %s): %s" % (what, marker, PULL_HINT), evidence
    if problem or not isinstance(verified, dict) or verified.get("schema") != PULL_VERIFIED_SCHEMA:
        return "marker invalid", "%s: %s is not a %s document: %s" % (what, marker, PULL_VERIFIED_SCHEMA,
                                                                     PULL_HINT), evidence
    if verified.get("run_id") != run_id:
        return "marker for another run", "%s: %s is for run %r: %s" % (what, marker, verified.get("run_id"),
                                                                       PULL_HINT), evidence
    if not verified.get("instance_id"):
        return "marker without instance", "%s: %s names no instance (an older marker): %s to verify it again" % (
            what, marker, PULL_HINT), evidence
    if verified.get("instance_id") != instance_id:
        return "marker for another instance", "%s: %s was verified for instance %r, not %r: %s" % (
            what, marker, verified.get("instance_id"), instance_id, PULL_HINT), evidence
    if str(verified.get("manifest_sha256") or "").lower() != sha:
        return "pulled, manifest changed", "%s was pulled, but the manifest on the box changed since (box %s…, " \
            "verified %s…): %s" % (what, sha[:12], str(verified.get("manifest_sha256"))[:12], PULL_HINT), evidence
    result = manifest_lib.compare(pulled, doc)
    evidence.update(files=result.get("files"), bytes=result.get("bytes"))
    if not result.get("ok"):
        for key in ("missing", "unexpected", "size_mismatch", "sha_mismatch"):
            evidence[key] = result.get(key) or []
        return "pulled, changed locally", "%s was pulled, but %s no longer matches (%s): %s" % (
            what, _first_file(result), manifest_lib.describe_problems(result), PULL_HINT), evidence
    return "verified", None, evidence


def offload_holds(run, sha, offload_check):
    """(the plan's word, None) when the run's sealed export (manifest sha256 `sha`, the one on the box now) was
    offloaded, verified, and the target still holds it; else (None, why not) — (None, None) without an offload."""
    done = run.get("offload")
    if not isinstance(done, dict) or not done.get("manifest_sha256"):
        return None, None
    target = done.get("target") or "?"
    if str(done["manifest_sha256"]).lower() != sha:
        return None, "its export offload to %s is of another manifest (%s…, the box's %s…)" % (
            target, str(done["manifest_sha256"])[:12], sha[:12])
    if offload_check is None:
        return None, "its export offload to %s was not checked (no rclone on the controller)" % target
    problem = offload_check(run)
    if problem:
        return None, "its export offload to %s does not hold now: %s" % (target, problem)
    return "export offloaded to %s" % target, None


def judge_run(run, instance_id, hosts, runs_dir, profile, mount, manifest_lib, offload_check=None):
    """The plan row of one run: {project, run_id, run_dir, state, attempt, sealed, manifest, pull, blocks,
    reason, note, ...evidence}."""
    export = run.get("export") or {}
    state = run.get("state") or "unknown"
    row = {"project": run.get("project"), "run_id": run.get("run_id"), "run_dir": run.get("run_dir"),
           "state": state, "attempt": run.get("attempt"), "sealed": bool(export.get("sealed")),
           "manifest": bool(export.get("manifest")), "pull": None, "blocks": False, "reason": None, "note": None}
    name = _run_name(run)
    if state == "live":
        row.update(pull="-", blocks=True, reason="run %s is running (attempt %s)" % (name, run.get("attempt") or "?"))
        return row
    if state == "queued":
        row.update(pull="-", blocks=True, reason="run %s is queued: its sweep's queue on the box will start it"
                   % name)
        return row
    if not row["sealed"] and not row["manifest"]:
        if state == "finished":
            row.update(pull="not sealed", blocks=True,
                       reason="run %s finished but its export is not sealed: %s" % (name, PULL_HINT))
            return row
        goes, text = files_fate(mount, profile)
        row.update(pull="-" if state == "never" else "not pulled", files_go=goes,
                   note="run %s (%s) is not pulled; %s" % (name, state, text))
        return row
    pull, reason, evidence = verify_pull(run, instance_id, hosts, runs_dir, manifest_lib)
    if reason is not None and evidence.get("marker"):  # the box's manifest is whole, valid, of this instance
        held, why = offload_holds(run, evidence["manifest_sha256"], offload_check)
        if held:
            pull, reason = held, None
            evidence["offload_target"] = run["offload"].get("target")
        elif why:
            reason = "%s; %s" % (reason, why)
    row.update(evidence)
    row.update(pull=pull, blocks=reason is not None, reason=reason)
    return row


def unexpected_cell(run, sweeps, hosts):
    """Why a run that names a sweep is not a cell this box should hold (its sweep has no roster on the box, the
    roster does not name it, or places it on a host of another instance), else None."""
    if not run.get("sweep"):
        return None
    roster = sweeps.get("%s/%s" % (run.get("project"), run["sweep"]))
    if roster is None:
        why = "that sweep has no roster on the box"
    elif run.get("run_id") not in (roster.get("cells") or {}):
        why = "the roster (%s) does not name it" % roster.get("roster")
    elif hosts and roster["cells"][run["run_id"]] not in hosts:
        why = "the roster places it on host %s, not on this instance (%s)" % (roster["cells"][run["run_id"]],
                                                                            ", ".join(hosts))
    else:
        return None
    return ("run %s says it is a cell of sweep %s, but %s: an unexpected cell is never torn down unseen; pull it, "
            "or look at the box" % (_run_name(run), run["sweep"], why))


# ---------------------------------------------------------------- one instance

def evaluate(instance_id, hosts, listings, runs_dir, profile, manifest_lib, unlisted=(), offload_check=None):
    """The gate for one instance.

    instance_id: the instance to tear down; hosts: every inventory host that carries it (a manifest's `host`
    must be one of them); listings: the `box` documents of rgt_box_runs, one per host that looked (hosts that
    share the instance list the same box: runs are counted once); runs_dir: the controller's runs root;
    profile: the platform profile (what the verb deletes); manifest_lib: rgt_manifest; unlisted: hosts of this
    instance that could not list the box (each refuses: the box was not seen whole); offload_check: run -> None when the
    target still holds the run's offloaded export, else why not (module_utils/rgt_offload.target_check; None: no
    offload counts).

    Returns {instance_id, hosts, passed, reasons, runs, others, notes, roots}; `reasons` name each run and its
    state; an empty box passes with a note saying so."""
    hosts = sorted(set(hosts or []))
    reasons = []
    rows = []
    others = []
    notes = []
    roots = []
    seen = set()
    for name in sorted(set(unlisted or [])):
        reasons.append("host %s (instance %s) could not list the runs on its box: the gate cannot see the box whole"
                       % (name, instance_id))
    if not listings and not unlisted:
        reasons.append("nothing listed the runs on the box of instance %s: the gate cannot pass unseen runs"
                       % instance_id)
    for listing in listings or []:
        if not isinstance(listing, dict):
            reasons.append("a box listing for instance %s is not a document: look again" % instance_id)
            continue
        root = listing.get("durable_root")
        if root not in roots:
            roots.append(root)
        mount = listing.get("durable_mount")
        sweeps = listing.get("sweeps") or {}
        for run in listing.get("runs") or []:
            key = (root, run.get("project"), run.get("run_id"))
            if key in seen:
                continue
            seen.add(key)
            row = judge_run(run, instance_id, hosts, runs_dir, profile, mount, manifest_lib, offload_check)
            row["durable_root"] = root
            problem = unexpected_cell(run, sweeps, hosts)
            if problem:
                row.update(blocks=True, reason=problem)
            rows.append(row)
            if row["blocks"]:
                reasons.append(row["reason"])
        for other in listing.get("not_runs") or []:
            key = (root, None, other.get("path"))
            if key in seen:
                continue
            seen.add(key)
            goes, text = files_fate(mount, profile)
            others.append(dict(other, files_go=goes, note="%s: %s; %s" % (other.get("path"), other.get("reason"),
                                                                          text)))
    if not rows and listings:
        where = ", ".join(str(r) for r in roots) or "the durable root"
        notes.append("no runs on the box (under %s): nothing on it waits for a pull" % where)
    return {"instance_id": instance_id, "hosts": hosts, "passed": not reasons, "reasons": reasons, "runs": rows,
            "others": others, "notes": notes, "roots": roots}
