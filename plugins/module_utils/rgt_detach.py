# -*- coding: utf-8 -*-
# Copyright: rgt contributors
# SPDX-License-Identifier: Apache-2.0
"""The detach primitives: how rgt_launch starts a run's job wrapper (or a sweep's queue) so that it outlives the SSH
session. One small class per primitive, in the table ``DETACHES`` keyed by the class's ``name``, which is the name
the registry gives it (plugins/module_utils/rgt_registry.py stays the one list of names and facts: what each needs,
whether it is built, whether it runs sweeps; tests/unit/test_registry.py holds the table and the registry together).

A primitive's class says how to
- ``live``: find the run's job that a scheduler holds pending or running (never submitted twice); None without one,
- ``start``: start the wrapper detached; returns the child when it is rgt_launch's own (its early exit shortens the
  wait for the first heartbeat), else None,
- ``wait``: after the start, wait for a job that may sit in a scheduler's queue (it ends the module: the call never
  waits for the queue); a primitive without a queue returns and rgt_launch waits for the first heartbeat,
- ``spawn``: start any argv detached (the run's wrapper, a sweep's queue).

``scheduler``: a scheduler's job (Slurm): the login node's CPUs and cgroup say nothing about it. ``started_by``: the
runner's function that starts a primitive applied from the controller (the Kubernetes Job); rgt_launch refuses such a
primitive before anything on the box is read (``rgt_registry.launch_problem(where="box")``), so it is never started
here.

Box-side (rgt_launch imports it): Python 3.6+, stdlib only.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import os
import shutil
import subprocess
import time
from shlex import quote

from ansible_collections.rgt.remote_gpu.plugins.module_utils import rgt_registry, rgt_slurm
from ansible_collections.rgt.remote_gpu.plugins.module_utils import rgt_runlayout as rl
from ansible_collections.rgt.remote_gpu.plugins.module_utils.rgt_proc import read


def tail(path, lines=20):
    text = read(path) or ""
    return "\n".join(text.splitlines()[-lines:])


# ---------------------------------------------------------------- tmux and setsid

def tmux_env():
    env = dict(os.environ)
    env.pop("TMUX", None)
    env.pop("TMUX_PANE", None)
    return env


TMUX_OWNER_OPTION = "@rgt_run_dir"


def tmux_has(tmux, session):
    return subprocess.call([tmux, "has-session", "-t", "=" + session], stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL, env=tmux_env()) == 0


def tmux_owner(tmux, session):
    """The run dir a session was started for (the @rgt_run_dir option rgt sets), or None (not rgt's)."""
    proc = subprocess.Popen([tmux, "show-options", "-t", "=%s:" % session, "-v", TMUX_OWNER_OPTION],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=tmux_env(),
                            universal_newlines=True)
    out, _err = proc.communicate()
    return (out.strip() or None) if proc.returncode == 0 else None


def tmux_detached(module, session, owner, argv, whose, result):
    """exec `argv` in a new tmux session marked with `owner` (the run or sweep dir, option @rgt_run_dir). A
    session of the same name is killed only when it is that owner's own leftover (its process is dead: checked
    before); anything else is left alone and the task fails, naming `whose` session it should have been."""
    tmux = shutil.which("tmux")
    if tmux_has(tmux, session):
        found = tmux_owner(tmux, session)
        if found != owner:
            module.fail_json(msg="a tmux session named %s already exists and is not %s (%s): it was left "
                                 "alone and nothing was started. Rename or end that session, or use another "
                                 "run id." % (session, whose, "it belongs to %s" % found if found
                                              else "it was not started by rgt"), **result)
        subprocess.call([tmux, "kill-session", "-t", "=" + session], stdout=subprocess.DEVNULL,
                        stderr=subprocess.DEVNULL, env=tmux_env())
    proc = subprocess.Popen([tmux, "new-session", "-d", "-s", session, "exec %s" % " ".join(quote(x) for x in argv),
                             ";", "set-option", "-t", "=%s:" % session, TMUX_OWNER_OPTION, owner],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
                            env=tmux_env(), universal_newlines=True)
    out, err = proc.communicate()
    if proc.returncode != 0:
        module.fail_json(msg="tmux new-session failed (rc %s): %s" % (proc.returncode, (err or out).strip()),
                         **result)


def setsid_detached(argv, log, cwd):
    """Start `argv` in a new session (setsid: no hangup reaches it), stdin /dev/null, output appended to `log`;
    returns the child."""
    handle = open(log, "ab")
    try:
        return subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=handle, stderr=subprocess.STDOUT, cwd=cwd,
                                start_new_session=True, close_fds=True)
    finally:
        handle.close()


# ---------------------------------------------------------------- Slurm from the login node

def slurm_job_name(paths):
    """The Slurm job name of a run (the run dir, its --comment, is what identifies it)."""
    return "rgt-%s-%s" % (paths.project, paths.run_id)


def slurm_spec(module):
    """The job spec's `slurm` block (resources per job or array task), checked by check_slurm before anything on
    the box was read or written."""
    return module.params["job"].get("slurm") or {}


def slurm_live(module, paths, result):
    """Slurm's view of the job recorded in a run's .rgt/slurm.json (a run's sbatch job, a sweep cell's array task)
    when it is pending or running, else None; fails, submitting nothing, when Slurm cannot say."""
    record = rgt_slurm.read_record(paths.meta) or {}
    if not record.get("job_id"):
        return None
    seen = rgt_slurm.show_job(record["job_id"])
    if seen["known"] is None:
        module.fail_json(msg="Slurm could not say whether job %s of %s still runs (%s): nothing was submitted; try "
                             "again when slurmctld answers" % (record["job_id"], paths.run_id, seen["error"]),
                         **result)
    return seen["view"] if seen["known"] and not rgt_slurm.ended(seen["view"]["state"]) else None


def live_sbatch(module, paths, result):
    """Slurm's view of this run's job when it is pending or running (never submit twice), else None. Looks up the
    recorded job id (.rgt/slurm.json) and the jobs squeue lists under the run's name with the run dir as comment;
    fails, submitting nothing, when Slurm cannot say."""
    recorded = slurm_live(module, paths, result)
    views = [recorded] if recorded else []
    if not views:
        rows, error = rgt_slurm.live_jobs(slurm_job_name(paths), paths.run_dir)
        if rows is None:
            module.fail_json(msg="squeue could not list the jobs of %s (%s): nothing was submitted; try again when "
                                 "slurmctld answers" % (paths.run_id, error), **result)
        for row in rows:
            seen = rgt_slurm.show_job(row["job_id"])
            views.append(seen["view"] if seen["known"] else {"job_id": row["job_id"], "state": row["state"],
                                                             "reason": None, "restarts": 0})
    return views[0] if views else None


def submit(module, argv, what, result):
    """Run sbatch and return the job id it printed; the task fails naming `what` and sbatch's words otherwise."""
    rc, out, err = rgt_slurm.run_argv(argv, timeout=60)
    job_id = rgt_slurm.parse_submit(out) if rc == 0 else None
    if not job_id:
        module.fail_json(msg="sbatch refused %s (rc %s): %s" % (what, rc, (err or out).strip()), sbatch_argv=argv,
                         **result)
    return job_id


def _now():
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


# ---------------------------------------------------------------- the primitives

class Detach(object):
    """A detach primitive (the registry's entry of the same ``name``)."""

    name = None
    scheduler = False  # a scheduler's job: its CPUs are the allocation's, and it may wait in a queue
    started_by = None  # the runner's function that starts it from the controller; None: started on the box

    @property
    def entry(self):
        """The registry's facts of this primitive (rgt_registry.DETACH_PRIMITIVES)."""
        return rgt_registry.detach(self.name)

    def live(self, module, paths, result):
        """The result of a run whose job a scheduler holds pending or running (never started twice), else None."""
        return None

    def start(self, module, paths, python, wrapper, result):
        """Start the run's wrapper detached; returns the child when it is ours, else None."""
        return self.spawn(module, [python, wrapper, paths.run_dir], paths.run_dir, paths.session(),
                          os.path.join(paths.logs, "wrapper.log"), "this run's", result)

    def start_queue(self, module, python, script, sweep_dir, session, result):
        """Start a sweep's queue detached (output in logs/queue-wrapper.log when the primitive keeps one)."""
        return self.spawn(module, [python, script, sweep_dir], sweep_dir, session,
                          os.path.join(sweep_dir, "logs", "queue-wrapper.log"), "this sweep's queue", result)

    def wait(self, module, paths, attempt, result):
        """After the start: a primitive whose job may wait in a queue ends the module here; the others return."""
        return None

    def spawn(self, module, argv, owner, session, log, whose, result):
        """Start `argv` detached, in the directory `owner` (the run or sweep dir) that owns it; `session` and
        `whose` name it, `log` takes its output."""
        raise NotImplementedError("detach %s starts nothing on the box" % self.name)


class Tmux(Detach):
    """A tmux session named after the run, marked with its run dir (tmux_detached). The wrapper is not our child."""

    name = "tmux"

    def spawn(self, module, argv, owner, session, log, whose, result):
        tmux_detached(module, session, owner, argv, whose, result)
        return None


class Nohup(Detach):
    """A new session (setsid), stdin /dev/null, output appended to the log; returns the child."""

    name = "nohup"

    def spawn(self, module, argv, owner, session, log, whose, result):
        return setsid_detached(argv, log, owner)


class Sbatch(Detach):
    """A Slurm batch job submitted from the login node; a sweep's cells go as one job array (submit_array)."""

    name = "sbatch"
    scheduler = True

    def live(self, module, paths, result):
        """A job of the run that Slurm lists pending (queued) or running: reported, never submitted twice."""
        live = live_sbatch(module, paths, result)
        if not live:
            return None
        queued = live["state"] in rgt_slurm.PENDING
        return dict(state="queued" if queued else "running", detach=self.name, slurm_job_id=live["job_id"],
                    slurm_state=live["state"], slurm_reason=live.get("reason"),
                    msg="Slurm job %s of %s is %s%s: not submitted twice" % (
                        live["job_id"], paths.run_id, live["state"],
                        " (%s)" % live["reason"] if live.get("reason") else ""))

    def start(self, module, paths, python, wrapper, result):
        """Submit the run as a Slurm batch job from the login node: .rgt/sbatch.sh execs the wrapper (so B: signals
        reach it); job name, --output (logs/slurm-%j.out, appended across requeues), --comment (the run dir),
        --signal=B:TERM@<grace_s>, --requeue and the job spec's `slurm` resources (rgt_slurm.sbatch_argv). The job
        id goes atomically into .rgt/slurm.json. Returns None (the wrapper is not our child)."""
        spec = slurm_spec(module)
        script = os.path.join(paths.meta, "sbatch.sh")
        rl.install(script, rgt_slurm.batch_script(python, wrapper, paths.run_dir, self.name), 0o755)
        argv = rgt_slurm.sbatch_argv(self.entry.binaries[0], script, slurm_job_name(paths),
                                     os.path.join(paths.logs, "slurm-%j.out"), paths.run_dir,
                                     module.params["grace_s"], spec.get("requeue", True) is not False, spec)
        job_id = submit(module, argv, "the job of %s" % paths.run_id, result)
        record = rgt_slurm.read_record(paths.meta) or {}
        submits = list(record.get("submits") or [])
        submits.append({"job_id": job_id, "attempt": result["attempt"], "submitted_at": _now()})
        rl.atomic_write_json(rgt_slurm.record_path(paths.meta), {
            "job_id": job_id, "job_name": slurm_job_name(paths), "comment": paths.run_dir, "argv": argv,
            "submits": submits})
        result.update(slurm_job_id=job_id, sbatch_argv=argv)
        return None

    def wait(self, module, paths, attempt, result):
        """After a submit: until the wrapper's heartbeat names the new attempt (running), Slurm keeps the job
        pending (queued, with its reason: a queue may hold it for hours, the call never waits for that), or the job
        ended without a heartbeat (failed, the slurm-<id>.out tail in the message). Exits the module."""
        job_id = result["slurm_job_id"]
        timeout = max(1, module.params["first_heartbeat_timeout_s"])
        started = time.time()
        view = {}
        while True:
            beat = rl.read_json(paths.heartbeat) or {}
            done = rl.read_json(paths.exit) or {}
            if beat.get("attempt") == attempt or done.get("attempt") == attempt:
                result.update(state="running", msg="submitted %s as Slurm job %s: attempt %d runs" % (
                    paths.run_id, job_id, attempt))
                module.exit_json(**result)
            seen = rgt_slurm.show_job(job_id)
            view = seen.get("view") or view
            waited = time.time() - started
            if seen["known"] and view["state"] in rgt_slurm.PENDING and waited >= min(timeout, 5):
                result.update(state="queued", slurm_state=view["state"], slurm_reason=view["reason"],
                              msg="submitted %s as Slurm job %s: queued (%s%s); the wrapper starts attempt %d when "
                                  "it runs" % (paths.run_id, job_id, view["state"],
                                               ", reason " + view["reason"] if view.get("reason") else "", attempt))
                module.exit_json(**result)
            if (seen["known"] and rgt_slurm.ended(view["state"])) or waited > timeout:
                out = tail(os.path.join(paths.logs, "slurm-%s.out" % job_id))
                module.fail_json(msg="Slurm job %s of %s %s without the wrapper reporting attempt %d. slurm-%s.out "
                                     "tail:\n%s\njob.log tail:\n%s" % (
                                         job_id, paths.run_id, "ended (%s)" % view["state"] if seen["known"]
                                         and rgt_slurm.ended(view["state"]) else "runs %ss" % int(waited), attempt,
                                         job_id, out, tail(paths.log)), **result)
            time.sleep(0.2)

    def submit_array(self, module, python, sweep_dir, name, cells, throttle, result):
        """Submit the cells that may start as one Slurm job array from the login node: task i runs cell i of
        .rgt/array-<n>.list (the batch script execs that cell's wrapper, so B: signals reach it), at most
        `throttle` at once (%N), with the job spec's resources per task. Each cell's .rgt/slurm.json records its
        task as `<array id>_<i>` (status, relaunch and teardown read it like any run's job)."""
        if not cells:
            return
        p = module.params
        spec = slurm_spec(module)
        meta = os.path.join(sweep_dir, ".rgt")
        serial = len([n for n in os.listdir(meta) if n.startswith("array-") and n.endswith(".list")]) + 1
        listing = os.path.join(meta, "array-%d.list" % serial)
        rl.atomic_write(listing, ("\n".join(paths.run_dir for _c, paths in cells) + "\n").encode("utf-8"), 0o644)
        script = os.path.join(meta, "array.sh")
        rl.install(script, rgt_slurm.array_script(python, self.name), 0o755)
        argv = rgt_slurm.sbatch_argv(self.entry.binaries[0], script, "rgt-%s-%s" % (p["project"], name),
                                     os.path.join(sweep_dir, "logs", "slurm-%A_%a.out"), sweep_dir, p["grace_s"],
                                     spec.get("requeue", True) is not False, spec)
        argv = argv[:-1] + [rgt_slurm.array_option(len(cells), throttle), script, listing]
        job_id = submit(module, argv, "the array of sweep %s" % name, result)
        at = _now()
        for index, (_cell, paths) in enumerate(cells):
            record = rgt_slurm.read_record(paths.meta) or {}
            task = "%s_%d" % (job_id, index)
            submits = list(record.get("submits") or []) + [{"job_id": task, "submitted_at": at}]
            rl.atomic_write_json(rgt_slurm.record_path(paths.meta), {
                "job_id": task, "array_job_id": job_id, "array_task": index,
                "job_name": argv[2][len("--job-name="):], "comment": sweep_dir, "argv": argv, "submits": submits})
        result.update(changed=True, slurm_job_id=job_id, sbatch_argv=argv)


class K8sJob(Detach):
    """A Kubernetes Job applied from the controller by rgt-run (the claim, the staging ConfigMap and the Job, with
    kubectl: ``started_by``); never started on a box (rgt_launch refuses it first)."""

    name = "k8s-job"
    started_by = "rgt.k8s_run.start_k8s_job"


# The primitives by the registry's name (built from the classes; every built entry of rgt_registry.DETACH_PRIMITIVES
# has its class here: tests/unit/test_registry.py).
DETACHES = dict((cls.name, cls) for cls in (Tmux, Nohup, Sbatch, K8sJob))


def get(name):
    """The primitive registered as `name` (an instance of its class), or None (auto, unregistered, not built)."""
    cls = DETACHES.get(name)
    return cls() if cls is not None else None


def choose(module, primitive, fallback, result):
    """The registered, built primitive to start the wrapper with: `primitive` when its programs are on this box's
    PATH, else `fallback` with a warning; fails when neither can run. (Refusals of unregistered or unbuilt names
    happened before: rgt_registry.launch_problem.)"""
    if primitive == rgt_registry.AUTO:
        primitive, fallback = rgt_registry.AUTO_MEANS
    chosen = None
    for name in (primitive, fallback):
        if name is None:
            continue
        entry = rgt_registry.detach(name)
        missing = [b for b in entry.binaries if not shutil.which(b)]
        if not missing:
            chosen = entry
            break
        if name == primitive and fallback:
            module.warn("%s is not installed on the box: the wrapper runs under %s instead (%s; it does not survive "
                        "what kills the login session on platforms that reap such jobs)"
                        % (", ".join(missing), fallback, rgt_registry.detach(fallback).what))
        elif name == primitive:
            module.fail_json(msg="detach %s but %s is not on PATH and the profile names no fallback: install %s, "
                                 "or give the profile a detach.fallback" % (name, ", ".join(missing),
                                                                           ", ".join(missing)), **result)
    if chosen is None:
        module.fail_json(msg="neither detach %s nor its fallback %s can run on this box (programs missing)"
                             % (primitive, fallback), **result)
    return get(chosen.name)
