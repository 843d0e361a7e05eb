# -*- coding: utf-8 -*-
# Copyright: rgt contributors
# SPDX-License-Identifier: Apache-2.0
"""What rgt_launch does for this host's share of a sweep (option ``sweep``, docs/internals.md "Sweeps"), step by
step: validate the share and its cells, decide which cells may start (never a live or finished one; a failed one
only when named in ``retry``), lay out each such cell as an ordinary run (active/<cell id>, its own job.json), then
start the sweep's queue (files/rgt_queue.py, under the sweep's own flock) and wait until it has looked at this
generation of queue.json, or, under a primitive that runs sweeps as a job array (the registry's ``sweeps``), report
the array the primitive submitted. The single run's steps and helpers are rgt_launchplan's.

A cell's view is a tuple (cell, its RunPaths, state, attempts started): state is ``live`` or how its last attempt
ended (rgt_runlayout.last_state). Box-side (rgt_launch imports it): Python 3.6+, stdlib only.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import os
import time

from ansible_collections.rgt.remote_gpu.plugins.module_utils import rgt_launchplan as lp
from ansible_collections.rgt.remote_gpu.plugins.module_utils import rgt_registry, rgt_slurm, rgt_states, rgt_sweep
from ansible_collections.rgt.remote_gpu.plugins.module_utils import rgt_runlayout as rl
from ansible_collections.rgt.remote_gpu.plugins.module_utils.rgt_detach import slurm_live, tail


class Sweep(object):
    """This host's share of a sweep (O(sweep)) and where it lives on the box. Refuses (rc_hint 2, nothing read) a
    sweep name that is no plain name and a share without cells or slots."""

    def __init__(self, module, root):
        p = module.params
        sweep = p["sweep"]
        self.name = sweep.get("name")
        problem = rl.check_name(self.name, "run id")  # the sweep name is the run id its cells start with
        if problem:
            module.fail_json(msg="nothing launched: %s" % problem, field="rgt_job.name", rc_hint=2)
        self.cells = sweep.get("cells") or []
        self.slots = [str(s) for s in (sweep.get("slots") or [])]
        if not self.cells or not self.slots:
            module.fail_json(msg="nothing launched: sweep %s gives this host no cells or no slots" % self.name,
                             rc_hint=2)
        self.retry = set(sweep.get("retry") or [])
        self.roster = sweep.get("roster")
        self.parallel = sweep.get("parallel")
        self.poll_s = sweep.get("poll_s")
        self.dir = rl.RunPaths(root, p["project"], self.name).sweep_dir(self.name)
        self.meta = os.path.join(self.dir, ".rgt")
        self.logs = os.path.join(self.dir, "logs")
        self.session = rl.session_name(p["project"], self.name + "--queue")
        self.script = os.path.join(self.meta, "queue.py")
        self.spec = os.path.join(self.meta, "queue.json")
        self.lock = os.path.join(self.meta, "queue.lock")
        self.state = os.path.join(self.meta, "queue-state.json")


def first_result(sweep):
    """The module's result before anything is decided."""
    return dict(changed=False, run_dir=sweep.dir, sweep_dir=sweep.dir, session=sweep.session, detach=None,
                action="none", attempt=None, exit=None, code_dir=None, omp_num_threads=None, cells=[])


# ---------------------------------------------------------------- 1. validate

def refuse(module, sweep, result):
    """Refuse (rc_hint 2) a primitive that runs no sweeps (the registry's ``sweeps``) and a retry naming no cell of
    this host."""
    detach = module.params["detach"]
    if not rgt_registry.runs_sweeps(detach):
        module.fail_json(msg="rgt_job.sweep: detach %s does not run sweeps (rgt_registry: sweeps). Fix: run the "
                             "sweep on a profile that detaches with tmux, nohup or sbatch, or each cell as a job of "
                             "its own" % detach, field="rgt_job.sweep", rc_hint=2, **result)
    unknown = sorted(sweep.retry - set(c.get("id") for c in sweep.cells))
    if unknown:
        module.fail_json(msg="retry names %s, not a cell of sweep %s on this host" % (", ".join(unknown), sweep.name),
                         field="cell", rc_hint=2, **result)


def cell_view(paths, inc):
    """(state, attempt): live, or how the cell's last attempt ended (rgt_runlayout.last_state)."""
    records = rl.read_jsonl(paths.attempts)
    attempt = rl.last_attempt(records)
    if lp.wrapper_alive(paths, rl.read_json(paths.pid), inc):
        return "live", attempt
    return rl.last_state(records, rl.read_json(paths.exit)), attempt


def cell_views(module, root, sweep, array, inc, result):
    """Each cell's view, its run id and environment names refused (rc_hint 2) before the next is read; under a job
    array a cell whose task Slurm holds pending or running is live (never submitted twice)."""
    views = []
    for cell in sweep.cells:
        try:
            paths = rl.RunPaths(root, module.params["project"], cell.get("id"))
        except ValueError as exc:
            module.fail_json(msg="nothing launched: sweep %s: %s" % (sweep.name, exc), rc_hint=2, **result)
        for var in (cell.get("env") or {}):
            problem = rl.check_env_name(var)
            if problem:
                module.fail_json(msg="nothing launched: rgt_job.sweep env: %s" % problem, rc_hint=2, **result)
        state, attempt = cell_view(paths, inc)
        if array and state != "live" and slurm_live(module, paths, result):
            state = "live"  # its array task is pending or running: never submitted twice
        views.append((cell, paths, state, attempt))
    return views


# ---------------------------------------------------------------- 2. decide

def code_dir_of(module, sweep, views, result):
    """The sweep's own code-<hash8> (O(code_dir), uploaded once per box), or for a relaunch or a retry without an
    upload the code the cells were given; fails when it is not on the box."""
    p = module.params
    code_dir = rl.expand_root(p["code_dir"]) if p["code_dir"] else None
    if not code_dir:  # a relaunch or a retry without an upload: the code the cells were given
        code_dir = next((doc.get("code_dir") for doc in (rl.read_json(pa.job) for _c, pa, _s, _a in views)
                         if isinstance(doc, dict) and doc.get("code_dir")), None)
    if not code_dir or not os.path.isdir(code_dir):
        module.fail_json(msg="code_dir %s does not exist on the box (run upload_resume first: a sweep's code is "
                             "uploaded once per box into %s)" % (code_dir, sweep.dir), **result)
    return code_dir


def budget_hold(module, sweep, views, result):
    """The sweep's budget marker (rgt_runlayout.budget_held: watch held the sweep at 100% of its budget_usd).
    With ``budget_resume`` (`rgt-run retry` with a higher budget) it is removed and the cells it stopped
    (budget_stopped) are retried with the raised budget; else, while it is there, no cell is laid out or submitted
    (the queue starts none either) and the result says why. Returns the views of the cells that may start
    (to_start)."""
    held = rl.budget_held(sweep.dir)
    if module.params["sweep"].get("budget_resume"):
        sweep.retry |= set(c["id"] for c, _pa, st, _at in views if st == "budget_stopped")
        if held is not None and not module.check_mode:
            rl.release_sweep(sweep.dir)
        result["budget_released"] = held is not None
        held = None
    if held is not None:
        result["budget_held"] = held
        return []
    return to_start(views, sweep.retry)


def to_start(views, retry):
    """The views of the cells that may start (never a live one, nor one moved away: moved_away; rgt_runlayout.
    may_start, a failed one only when in `retry`)."""
    return [(c, pa, st, at) for c, pa, st, at in views if st != "live" and rl.may_start(st, c["id"] in retry)
            and not moved_away(pa)]


def moved_away(paths):
    """A cell `rgt-run move` took to another box is fenced here (rgt_runlayout.fenced): never started on this box."""
    return paths is not None and rl.fenced(paths) is not None


def would(sweep, views, to_write, result):
    """The result in check mode: what would be queued, nothing written."""
    queue_alive = rl.lock_held(sweep.lock)  # looked at again before a start
    return dict(result, state="running" if queue_alive else "not_started",
                changed=bool(to_write or not queue_alive),
                cells=[{"run_id": c["id"], "state": st, "attempt": at, "run_dir": pa.run_dir}
                       for c, pa, st, at in views],
                msg="would queue %d cell(s) of sweep %s" % (len(to_write), sweep.name))


# ---------------------------------------------------------------- 3. lay out

def lay_out(module, sweep, to_write, code_dir, omp, python, secrets_file, result):
    """The sweep's directories and roster, then each cell that may start: its directories, box-side files
    (rgt_launchplan.install_box_files), job.json (its own command, env and params; the sweep's data dir when
    there is one), .rgt/sweep.json and, for a failed cell run again, .rgt/retry.json."""
    p = module.params
    for directory in (sweep.meta, sweep.logs):
        if not os.path.isdir(directory):
            os.makedirs(directory)
    if isinstance(sweep.roster, dict):
        rl.atomic_write_json(os.path.join(sweep.dir, "roster.json"), sweep.roster)
    data_dir = os.path.join(sweep.dir, "data")
    for cell, paths, state, attempt in to_write:
        lp.make_run_dirs(paths)
        lp.install_box_files(module, paths.meta, p["wrapper_bundle"], result)
        old = rl.read_json(paths.job) or {}
        cell_code = code_dir if (p["use_new_code"] or state == "never") else old.get("code_dir") or code_dir
        doc = lp.job_document(module, paths, rgt_sweep.cell_job(p["job"], cell), cell_code, omp, python,
                              secrets_file)
        doc["sweep"] = {"name": sweep.name, "dir": sweep.dir, "params": cell.get("params") or {}}
        if os.path.isdir(data_dir):
            doc["data_dir"] = data_dir
        rl.atomic_write_json(paths.job, doc, 0o600)
        rl.atomic_write_json(os.path.join(paths.meta, "sweep.json"), {"sweep": sweep.name, "sweep_dir": sweep.dir})
        if state in rgt_states.RETRY_ENDS:
            rl.atomic_write_json(os.path.join(paths.meta, "retry.json"),
                                 {"after_attempt": attempt, "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())})


def write_queue(module, sweep, root, python, result):
    """The queue's code (rgt_launchplan.install_box_files) and a new generation of .rgt/queue.json (a live queue
    reads it); returns the generation."""
    p = module.params
    lp.install_box_files(module, sweep.meta, p["queue_bundle"], result)
    if not os.path.isfile(sweep.script):
        module.fail_json(msg="no sweep queue at %s (pass queue_bundle)" % sweep.script, **result)
    generation = int((rl.read_json(sweep.spec) or {}).get("generation") or 0) + 1
    rl.atomic_write_json(sweep.spec, {"project": p["project"], "durable_root": root, "python": python,
                                      "sweep": sweep.name, "cells": [c["id"] for c in sweep.cells],
                                      "slots": sweep.slots, "generation": generation,
                                      "poll_s": sweep.poll_s or 1.0})
    return generation


# ---------------------------------------------------------------- 4. start, 5. wait

def start_queue(module, sweep, detach, python, result):
    """Start the sweep's queue under `detach` when it is not running (looked at after queue.json: a live queue
    reads the new one). Returns (our child or None, whether it was started)."""
    proc, started = None, not rl.lock_held(sweep.lock)
    if started:
        proc = detach.start_queue(module, python, sweep.script, sweep.dir, sweep.session, result)
    return proc, started


def wait_queue(module, sweep, detach, python, generation, proc, started, result):
    """Until the queue has looked once at this generation (the cells it could start hold their locks, or ended),
    at most first_heartbeat_timeout_s; a queue that ended just before it could read it is started again. Returns
    (the queue's state document, whether a queue was started)."""
    p = module.params
    deadline = time.time() + max(1, p["first_heartbeat_timeout_s"])
    while True:
        seen = rl.read_json(sweep.state) or {}
        if seen.get("generation") == generation:
            return seen, started
        if not started and seen.get("ended") and not rl.lock_held(sweep.lock):
            started = True  # the queue ended just before it could read this generation: start another
            proc = detach.start_queue(module, python, sweep.script, sweep.dir, sweep.session, result)
        if proc is not None and proc.poll() is not None:
            deadline = min(deadline, time.time() + 1)
        if time.time() > deadline:
            module.fail_json(msg="the queue of sweep %s did not answer within %ss. queue.log tail:\n%s\n"
                                 "queue-wrapper.log tail:\n%s" % (sweep.name, p["first_heartbeat_timeout_s"],
                                                                  tail(os.path.join(sweep.logs, "queue.log")),
                                                                  tail(os.path.join(sweep.logs,
                                                                                    "queue-wrapper.log"))),
                             **result)
        time.sleep(0.1)


# ---------------------------------------------------------------- the share's result

def sweep_state(counts, total, settled):
    """The state of a host's share of a sweep from its cells' shown states: finished when every cell is, running
    while any runs or waits, else the first of failed, preempted, dead, else not_started."""
    if counts.get("finished") == total:
        return "finished"
    if not settled:
        return "running"
    return next((s for s in rgt_states.SWEEP_SHARE_ENDS if counts.get(s)), "not_started")


def _counted(counts):
    return ", ".join("%d %s" % (n, s) for s, n in sorted(counts.items()))


def queue_report(sweep, views, to_write, seen, started, inc, result):
    """The result once the queue has looked at this generation: each cell as it is now (running, queued: waiting
    for a slot, or how it ended)."""
    pending = set(seen.get("pending") or [])
    counts = {}
    for cell, paths, _state, _attempt in views:
        state, attempt = cell_view(paths, inc)
        shown = "running" if state == "live" else "queued" if cell["id"] in pending else lp.shown_state(state)
        if result.get("budget_held") is not None and shown in ("not_started", "preempted", "dead"):
            shown = "budget_stopped"  # held by the sweep's budget (rgt_reconcile.with_budget_hold says the same)
        counts[shown] = counts.get(shown, 0) + 1
        result["cells"].append({"run_id": cell["id"], "state": shown, "attempt": attempt, "run_dir": paths.run_dir,
                                "written": any(c is cell for c, _p, _s, _a in to_write)})
    ended = not seen.get("pending") and not seen.get("running")
    result.update(changed=bool(to_write) or started, action="launch" if to_write else "none",
                  state=sweep_state(counts, len(sweep.cells), ended), pid=seen.get("pid"),
                  msg="sweep %s on this box: %s (queue %s, %d slot(s): %s)" % (
                      sweep.name, _counted(counts), "started" if started else "running" if not ended else "done",
                      len(sweep.slots), " ".join("CUDA_VISIBLE_DEVICES=%s" % (s or "''") for s in sweep.slots)))
    return result


def array_report(module, sweep, views, result):
    """The cells of a sweep run as a Slurm array, as Slurm and their records say now."""
    counts = {}
    for cell, paths, _state, _attempt in views:
        records = rl.read_jsonl(paths.attempts)
        attempt = len([r for r in records if "started_at" in r])
        live = slurm_live(module, paths, result)
        state = ("queued" if live["state"] in rgt_slurm.PENDING else "running") if live else \
            lp.shown_state(rl.last_state(records, rl.read_json(paths.exit)))
        counts[state] = counts.get(state, 0) + 1
        result["cells"].append({"run_id": cell["id"], "state": state, "attempt": attempt, "run_dir": paths.run_dir,
                                "slurm_job_id": (rgt_slurm.read_record(paths.meta) or {}).get("job_id")})
    settled = not counts.get("queued") and not counts.get("running")
    result.update(state=sweep_state(counts, len(views), settled),
                  action="launch" if result.get("slurm_job_id") else "none",
                  msg="sweep %s as a Slurm array: %s%s" % (sweep.name, _counted(counts),
                                                           " (array job %s submitted now)" % result["slurm_job_id"]
                                                           if result.get("slurm_job_id") else ""))
    return result
