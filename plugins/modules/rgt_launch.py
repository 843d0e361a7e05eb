#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: rgt contributors
# SPDX-License-Identifier: Apache-2.0
"""Ansible module: launch (or relaunch) a run's job wrapper detached, exactly once (rgt launch_detached)."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: rgt_launch
short_description: Launch a training run detached on the box, never twice (tmux or setsid)
version_added: "0.1.0"
description:
  - Decides from the run's records on the box (C(<run_dir>/.rgt/)) whether to start the job wrapper, and
    starts it detached so the call returns at once. The layout and file contracts are in
    C(docs/internals.md) ("Run spine").
  - A live run (the wrapper's lock is held, or its pid is alive under the same incarnation) is reported and
    left alone (C(changed=false), C(state=running)). A finished run is reported (C(state=finished)); pass a new
    C(rgt_job.run_id) to start another. A failed or killed run (a death by a signal that is no stop signal) is
    reported (C(state=failed)) and started again only with O(relaunch_failed=true), which C(rgt-run retry) passes
    (the one rule of docs/job-spec.md "How a run ends", C(rgt_runlayout.may_start)).
  - How the last attempt ended comes from C(exit.json), or, when that is missing or older than the attempt (the
    wrapper could not write it, e.g. on a full disk), from the attempt's end line in C(attempts.jsonl); a job that
    exited 1 is C(failed) either way, and never relaunched without O(relaunch_failed=true).
  - A run never launched is launched as attempt 1. A preempted or dead run (wrapper gone without an exit record
    or an end line, for example after a reboot) is relaunched as attempt n+1 when O(relaunch=true); the job
    resumes from the newest complete checkpoint (C(RGT_RESUME_FROM)).
  - A sweep cell's run dir (C(.rgt/sweep.json)) is never started alone (C(rc_hint=2)); its sweep's queue starts it.
  - C(job.json) names the virtual environments rgt runs from on this box (C(rgt_prefixes)); the wrapper keeps
    them, and every C(ANSIBLE_*) variable, out of the job's environment and puts C(rgt_job.python)'s directory
    first on C(PATH).
  - "Before a launch: the disk gate (free GiB on the durable root below O(disk_floor_gib) fails with C(rc_hint: 3)
    and a message containing C(DISK_GATE), nothing written), the layout directories, the wrapper files
    (O(wrapper_content), O(runlayout_content), O(states_content), written only when different), and C(job.json)
    (atomic)."
  - After the start it waits until the wrapper's heartbeat names the new attempt (at most
    O(first_heartbeat_timeout_s)); it never waits for the job itself.
  - Secrets never reach an argv; the wrapper sources O(secrets_file) inside bash.
extends_documentation_fragment:
  - rgt.remote_gpu.run_layout
options:
  job:
    description:
      - The job spec (C(rgt_job)). Used keys - C(command) (required), C(python) (absolute interpreter path,
        required; runs the wrapper too), C(env), C(checkpoint.glob), C(outputs), C(log_patterns), C(metrics),
        C(expected_duration_s), C(price_per_hour), C(auto_resume), C(heartbeat_interval_s),
        C(gpu_sample_interval_s), C(stall_after_s), C(slurm) (detach sbatch - partition, gres, cpus_per_task, mem,
        time, account, qos, requeue, extra). Other keys are ignored.
    type: dict
    required: true
  code_dir:
    description:
      - Absolute path of the C(code-<hash8>) directory to run. Required for a first launch.
      - A relaunch keeps C(job.json)'s code_dir unless this is given and O(use_new_code=true).
    type: path
  use_new_code:
    description: On a relaunch, run O(code_dir) instead of the code the run started with.
    type: bool
    default: true
  secrets_file:
    description: Box-local secrets file (C(NAME=value) lines) the wrapper sources; must exist when given.
    type: str
  proxy_hook:
    description: Shell line run before the command (profile C(network.proxy_hook)); may carry credentials.
    type: str
  network_env:
    description: Profile network environment (merged under the job's C(env)); a leading C(~) is expanded.
    type: dict
    default: {}
  grace_s:
    description: Seconds the job gets between the forwarded SIGTERM and SIGKILL on a stop.
    type: int
    default: 30
  omp_num_threads:
    description: C(OMP_NUM_THREADS) for the job. Null computes it from the cgroup CPU quota (floor, at least 1;
      unset when there is no quota).
    type: int
  disk_floor_gib:
    description: Minimum free GiB on the durable root for a launch (the disk gate). 0 disables it.
    type: float
    default: 1.0
  detach:
    description:
      - The detach primitive (the profile's C(detach.primitive)), a name registered in
        C(plugins/module_utils/rgt_registry.py) (C(tmux), C(nohup), ...). C(auto) is tmux with the fallback nohup.
      - A name that is not registered, a registered primitive that is not built (the registry's C(built);
        C(rgt-run profiles show NAME) says), or one started from the controller (the Kubernetes Job), fails before
        anything is read or written on the box (C(rc_hint=2), C(field)); the job is never run under another
        primitive instead.
      - When the primitive's programs are missing on the box (tmux not on PATH), O(detach_fallback) is used with a
        warning, else the task fails.
      - C(sbatch) runs on the login node and submits the run as a Slurm batch job (C(.rgt/sbatch.sh) execs the
        wrapper; job name C(rgt-<project>-<run_id>), C(--comment=<run_dir>), C(--output=<run_dir>/logs/slurm-%j.out)
        appended across requeues, C(--signal=B:TERM@<grace_s>), C(--requeue) unless C(rgt_job.slurm.requeue) is
        false, and the resources of C(rgt_job.slurm)); the job id goes into C(.rgt/slurm.json). A job of the run
        that Slurm lists pending or running is live (C(state=queued) or C(running)), never submitted twice. After a
        submit the call returns C(running) at the first heartbeat, or C(queued) with Slurm's reason while the job
        waits. OMP_NUM_THREADS is C(rgt_job.slurm.cpus_per_task) (the login node's CPUs say nothing).
    type: str
    default: auto
  detach_fallback:
    description: The primitive used when O(detach) cannot run on this box (the profile's C(detach.fallback));
      null for none. Refused like O(detach) when not registered or not built.
    type: str
  wrapper_src:
    description: Path on the box of the wrapper to run; default C(<run_dir>/.rgt/wrapper.py).
    type: path
  wrapper_content:
    description: Source of the wrapper (the role's C(files/rgt_wrapper.py)); installed as
      C(<run_dir>/.rgt/wrapper.py), mode 0755, at launch when different.
    type: str
  runlayout_content:
    description: Source of C(rgt_runlayout.py), installed next to the wrapper (mode 0644) at launch when different.
    type: str
  states_content:
    description: Source of C(rgt_states.py) (the run-state vocabulary C(rgt_runlayout.py) imports), installed next
      to it (mode 0644) at launch when different.
    type: str
  relaunch:
    description: Relaunch a preempted or dead run as attempt n+1.
    type: bool
    default: true
  relaunch_failed:
    description: Relaunch a run whose last attempt failed (non-zero exit) or was killed (a signal that is no stop
      signal) as attempt n+1 (what C(rgt-run retry) asks for).
    type: bool
    default: false
  first_heartbeat_timeout_s:
    description: Seconds to wait for the wrapper's first heartbeat of the new attempt.
    type: int
    default: 30
  sweep:
    description:
      - This host's share of a sweep (docs/internals.md "Sweeps"), computed by rgt-run from C(rgt_job.sweep) -
        C(name) (the sweep, a plain name), C(cells) (C([{id, command, env, params}]), in roster order, each an
        ordinary run C(active/<id>)), C(slots) (C(CUDA_VISIBLE_DEVICES) of each slot, e.g. C(["0", "1"])),
        C(roster) (written to C(<durable_root>/<project>/sweeps/<name>/roster.json)), C(retry) (failed cells to
        run once more), C(poll_s), C(parallel) (under sbatch the array's throttle).
      - Writes C(job.json) of each cell that may start (never ran, preempted, killed, dead; failed only when in
        C(retry)), never touching a live or finished cell, then C(.rgt/queue.json) of the sweep (a new
        generation) and starts the sweep's queue (O(queue_content), C(.rgt/queue.py)) under O(detach) when it is
        not running. The queue starts each cell's wrapper on a free slot, never twice. Under detach sbatch the
        cells that may start go as one Slurm job array instead (C(--array=0-<n-1>%<parallel>), task i execs the
        wrapper of line i+1 of C(.rgt/array-<k>.list)); each cell's C(.rgt/slurm.json) records its task
        C(<array id>_<i>), and a cell whose task is pending or running is never submitted again. Other primitives
        do not run sweeps (C(rc_hint=2)). O(code_dir) is the sweep's own C(code-<hash8>), uploaded once per box.
    type: dict
  queue_content:
    description: Source of the sweep queue (the role's C(files/rgt_queue.py)), installed as
      C(<sweep_dir>/.rgt/queue.py) when different. Required with O(sweep).
    type: str
notes:
  - Check mode is supported; it reports what would be done and writes nothing.
  - C(nohup) detaching runs the wrapper in a new session (C(setsid)), stdin C(/dev/null), output appended to
    C(logs/wrapper.log); a new session has no controlling terminal, so no hangup reaches it.
author:
  - rgt contributors
"""

EXAMPLES = r"""
- name: Launch the run (or report it live/finished)
  rgt.remote_gpu.rgt_launch:
    durable_root: /root/autodl-tmp
    project: demo
    run_id: tiny-001
    job:
      command: python train.py --steps 2000
      python: /root/miniconda3/bin/python
    code_dir: /root/autodl-tmp/demo/active/tiny-001/code-1a2b3c4d
    wrapper_content: "{{ lookup('ansible.builtin.file', 'rgt_wrapper.py', rstrip=false) }}"
  register: launch
"""

RETURN = r"""
state:
  description: running (started now or already live), queued (detach sbatch - Slurm holds the job pending),
    finished, failed, preempted, dead or not_started (the last three only when nothing was started, for example
    O(relaunch=false) or check mode).
  returned: always
  type: str
action:
  description: What the call did - C(launch), C(relaunch) or C(none).
  returned: always
  type: str
attempt:
  description: The attempt now running (or the last one).
  returned: always
  type: int
run_dir:
  description: The run directory on the box (roots expanded).
  returned: always
  type: str
session:
  description: The tmux session name of the run (C(rgt-<project>/<run_id>), each C(.) written as C(+)).
  returned: always
  type: str
detach:
  description: The primitive used for this launch (tmux or nohup), or null when nothing was started.
  returned: always
  type: str
field:
  description: The refused field (C(detach.primitive) or C(detach.fallback)) when the primitive is not registered
    or not built.
  returned: on refusal
  type: str
pid:
  description: The wrapper's pid.
  returned: when known
  type: int
omp_num_threads:
  description: The OMP_NUM_THREADS written into job.json (null = not set).
  returned: always
  type: int
resume_from:
  description: The checkpoint the new attempt resumes from (null for none).
  returned: on launch
  type: str
code_dir:
  description: The code directory the run uses.
  returned: always
  type: str
exit:
  description:
    - The last attempt's exit record, when there is one - C(exit.json), or that attempt's end line in
      C(attempts.jsonl) when C(exit.json) is missing (a wrapper that could not write it on a full disk).
  returned: always
  type: dict
slurm_job_id:
  description: The Slurm job id of the run (detach sbatch), submitted now or found pending or running.
  returned: detach sbatch
  type: str
slurm_reason:
  description: Why Slurm keeps the job pending (Priority, Resources, BeginTime, ...), null when it is not.
  returned: detach sbatch, when queued
  type: str
cells:
  description: With O(sweep) - each cell of this host, C({run_id, state, attempt, run_dir, written}); state is
    running, queued (waiting for a slot), finished, failed, preempted, dead or not_started.
  returned: with sweep
  type: list
  elements: dict
sweep_dir:
  description: With O(sweep) - C(<durable_root>/<project>/sweeps/<name>) (code, data, roster, queue).
  returned: with sweep
  type: str
rc_hint:
  description: 3 when the disk gate refused the launch; 2 when the detach primitive is not registered or not built.
  returned: on failure
  type: int
"""

import os
import shutil
import signal
import subprocess
import time
from shlex import quote

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.rgt.remote_gpu.plugins.module_utils import (
    rgt_host,
    rgt_registry,
    rgt_slurm,
    rgt_states,
    rgt_sweep,
)
from ansible_collections.rgt.remote_gpu.plugins.module_utils import rgt_runlayout as rl
from ansible_collections.rgt.remote_gpu.plugins.module_utils.rgt_proc import read

CGROUP_ROOT = "/sys/fs/cgroup"




def cgroup_cpu_quota():
    """(quota_us, period_us) of this process's cgroup (v2 cpu.max, v1 cfs), (None, None) when unlimited."""
    own = rgt_host.parse_proc_cgroup(read("/proc/self/cgroup") or "")
    if os.path.exists(os.path.join(CGROUP_ROOT, "cgroup.controllers")):
        candidates = []
        if own["v2"]:
            candidates.append(os.path.join(CGROUP_ROOT, own["v2"].lstrip("/"), "cpu.max"))
        candidates.append(os.path.join(CGROUP_ROOT, "cpu.max"))
        for path in candidates:
            text = read(path)
            if text:
                return rgt_host.parse_cpu_max(text)
        return None, None
    for sub in ("cpu", "cpu,cpuacct", "cpuacct,cpu"):
        base = os.path.join(CGROUP_ROOT, sub)
        quota = read(os.path.join(base, "cpu.cfs_quota_us"))
        if quota is not None:
            return rgt_host.parse_cfs(quota, read(os.path.join(base, "cpu.cfs_period_us")))
    return None, None


def omp_from_quota(quota, period):
    """floor(quota / period), at least 1; None when there is no quota."""
    if not quota or not period or quota <= 0:
        return None
    return max(1, int(quota // period))


def free_gib(path):
    probe = path
    while probe and not os.path.exists(probe):
        parent = os.path.dirname(probe)
        if parent == probe:
            break
        probe = parent
    st = os.statvfs(probe or "/")
    return st.f_bavail * st.f_frsize / float(1 << 30), probe


def wrapper_alive(paths, pid_doc, current_incarnation):
    if rl.lock_held(paths.lock):
        return True
    if not pid_doc or pid_doc.get("incarnation") != current_incarnation:
        return False
    pid = pid_doc.get("wrapper_pid")
    if not rl.pid_alive(pid):
        return False
    cmdline = read("/proc/%d/cmdline" % int(pid)) or ""
    return paths.run_dir in cmdline


def tail(path, lines=20):
    text = read(path) or ""
    return "\n".join(text.splitlines()[-lines:])


def expand_env(env):
    out = {}
    for name, value in (env or {}).items():
        out[str(name)] = rl.expand_user("" if value is None else str(value))  # `{user}`, a leading `~`
    return out


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


def start_tmux(module, paths, python, wrapper, result):
    """Start the wrapper in a new tmux session marked with its run dir (tmux_detached). Returns None (the wrapper
    is not our child)."""
    tmux_detached(module, paths.session(), paths.run_dir, (python, wrapper, paths.run_dir), "this run's", result)
    return None


def start_nohup(module, paths, python, wrapper, result):
    """Start the wrapper in a new session (setsid), stdin /dev/null, output appended to logs/wrapper.log; returns
    the child (its early exit shortens the wait for the first heartbeat)."""
    return setsid_detached([python, wrapper, paths.run_dir], os.path.join(paths.logs, "wrapper.log"), paths.run_dir)


def slurm_job_name(paths):
    """The Slurm job name of a run (the run dir, its --comment, is what identifies it)."""
    return "rgt-%s-%s" % (paths.project, paths.run_id)


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


def slurm_spec(module, result):
    """The job spec's `slurm` block (resources per job or array task), checked by check_slurm before anything on
    the box was read or written."""
    return module.params["job"].get("slurm") or {}


def check_slurm(module):
    """Refuse (rc_hint 2, the field named, nothing read or written) a `slurm` block that is not a mapping, or whose
    `extra` sets an option rgt passes itself (rgt_slurm.extra_problem: sbatch would keep the user's, and the run's
    job would no longer be found)."""
    spec = module.params["job"].get("slurm") or {}
    if not isinstance(spec, dict):
        module.fail_json(msg="rgt_job.slurm must be a mapping (partition, gres, cpus_per_task, mem, time, account, "
                             "qos, requeue, extra): nothing was submitted", field="rgt_job.slurm", rc_hint=2,
                         changed=False)
    refused = rgt_slurm.extra_problem(spec.get("extra"))
    if refused:
        index, message, fix = refused
        module.fail_json(msg="%s: nothing was submitted. Fix: %s" % (message, fix),
                         field="rgt_job.slurm.extra[%d]" % index, rc_hint=2, changed=False)


def submit(module, argv, what, result):
    """Run sbatch and return the job id it printed; the task fails naming `what` and sbatch's words otherwise."""
    rc, out, err = rgt_slurm.run_argv(argv, timeout=60)
    job_id = rgt_slurm.parse_submit(out) if rc == 0 else None
    if not job_id:
        module.fail_json(msg="sbatch refused %s (rc %s): %s" % (what, rc, (err or out).strip()), sbatch_argv=argv,
                         **result)
    return job_id


def start_sbatch(module, paths, python, wrapper, result):
    """Submit the run as a Slurm batch job from the login node: .rgt/sbatch.sh execs the wrapper (so B: signals
    reach it); job name, --output (logs/slurm-%j.out, appended across requeues), --comment (the run dir),
    --signal=B:TERM@<grace_s>, --requeue and the job spec's `slurm` resources (rgt_slurm.sbatch_argv). The job id
    goes atomically into .rgt/slurm.json. Returns None (the wrapper is not our child)."""
    entry = rgt_registry.detach(module.params["detach"])
    spec = slurm_spec(module, result)
    script = os.path.join(paths.meta, "sbatch.sh")
    rl.install(script, rgt_slurm.batch_script(python, wrapper, paths.run_dir, entry.name), 0o755)
    argv = rgt_slurm.sbatch_argv(entry.binaries[0], script, slurm_job_name(paths),
                                 os.path.join(paths.logs, "slurm-%j.out"), paths.run_dir, module.params["grace_s"],
                                 spec.get("requeue", True) is not False, spec)
    job_id = submit(module, argv, "the job of %s" % paths.run_id, result)
    record = rgt_slurm.read_record(paths.meta) or {}
    submits = list(record.get("submits") or [])
    submits.append({"job_id": job_id, "attempt": result["attempt"],
                    "submitted_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())})
    rl.atomic_write_json(rgt_slurm.record_path(paths.meta), {
        "job_id": job_id, "job_name": slurm_job_name(paths), "comment": paths.run_dir, "argv": argv,
        "submits": submits})
    result.update(slurm_job_id=job_id, sbatch_argv=argv)
    return None


def wait_sbatch(module, paths, attempt, result):
    """After a submit: until the wrapper's heartbeat names the new attempt (running), Slurm keeps the job pending
    (queued, with its reason: a queue may hold it for hours, the call never waits for that), or the job ended
    without a heartbeat (failed, the slurm-<id>.out tail in the message). Exits the module."""
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
                          msg="submitted %s as Slurm job %s: queued (%s%s); the wrapper starts attempt %d when it "
                              "runs" % (paths.run_id, job_id, view["state"],
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


def choose_detach(module, primitive, fallback, result):
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
    return chosen


# ---------------------------------------------------------------- a host's share of a sweep (option `sweep`)

def shown_state(state):
    """How a run that is not live reads in the result, as status shows it (rgt_states.shown: last_state's never
    is not_started; killed, a death by a signal that is no stop signal, is failed)."""
    return rgt_states.shown(state)


def end_words(end):
    """An attempt's end record in a few words: `rc 3`, `SIGKILL (rc 137)`."""
    sig = end.get("signal")
    if sig:
        try:
            name = signal.Signals(int(sig)).name
        except (TypeError, ValueError):
            name = "signal %s" % sig
        return "%s (rc %s)" % (name, end.get("rc"))
    return "rc %s" % end.get("rc")


def sweep_state(counts, total, settled):
    """The state of a host's share of a sweep from its cells' shown states: finished when every cell is, running
    while any runs or waits, else the first of failed, preempted, dead, else not_started."""
    if counts.get("finished") == total:
        return "finished"
    if not settled:
        return "running"
    return next((s for s in rgt_states.SWEEP_SHARE_ENDS if counts.get(s)), "not_started")


def preflight(module, root, python, result, disk_gate=True):
    """Before anything is started: the secrets file exists (returned, expanded), the interpreter runs, and (when
    something will start) the disk gate: free GiB on the durable root below disk_floor_gib fails with rc_hint 3
    and DISK_GATE, nothing written."""
    p = module.params
    secrets_file = rl.expand_root(p["secrets_file"]) if p["secrets_file"] else None
    if secrets_file and not os.path.isfile(secrets_file):
        module.fail_json(msg="secrets file %s is missing: run env_check (it writes it)" % secrets_file, **result)
    if not (os.path.isfile(python) and os.access(python, os.X_OK)):
        module.fail_json(msg="rgt_job.python %s does not exist or is not executable" % python, **result)
    if disk_gate and p["disk_floor_gib"] and p["disk_floor_gib"] > 0:
        free, measured = free_gib(root)
        if free < p["disk_floor_gib"]:
            module.fail_json(msg="DISK_GATE: %.2f GiB free on %s is below the floor of %.2f GiB: nothing started. "
                                 "Free space (prune old checkpoints, caches) or lower disk_floor_gib."
                                 % (free, measured, p["disk_floor_gib"]), rc_hint=3, free_gib=round(free, 2),
                             **result)
    return secrets_file


def install_layout(meta, p):
    """rgt_runlayout.py and the rgt_states.py it imports, side by side in `meta` (beside the wrapper or the queue:
    both import them from their own directory), each written only when different."""
    rl.install(os.path.join(meta, "rgt_runlayout.py"), p["runlayout_content"], 0o644)
    rl.install(os.path.join(meta, "rgt_states.py"), p["states_content"], 0o644)


def cell_view(paths, inc):
    """(state, attempt): live, or how the cell's last attempt ended (rgt_runlayout.last_state)."""
    records = rl.read_jsonl(paths.attempts)
    attempt = len([r for r in records if "started_at" in r])
    if wrapper_alive(paths, rl.read_json(paths.pid), inc):
        return "live", attempt
    return rl.last_state(records, rl.read_json(paths.exit)), attempt


def launch_queue(module, entry, python, script, sweep_dir, session, result):
    """Start the sweep's queue detached: a tmux session marked with the sweep dir (a leftover of this sweep's own
    queue is replaced, anything else refused), or a new session (setsid) with output in logs/queue-wrapper.log."""
    argv = [python, script, sweep_dir]
    if entry.impl == "tmux":
        tmux_detached(module, session, sweep_dir, argv, "this sweep's queue", result)
        return None
    return setsid_detached(argv, os.path.join(sweep_dir, "logs", "queue-wrapper.log"), sweep_dir)


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


def submit_array(module, entry, python, sweep_dir, name, cells, throttle, result):
    """Submit the cells that may start as one Slurm job array from the login node: task i runs cell i of
    .rgt/array-<n>.list (the batch script execs that cell's wrapper, so B: signals reach it), at most `throttle`
    at once (%N), with the job spec's resources per task. Each cell's .rgt/slurm.json records its task as
    `<array id>_<i>` (status, relaunch and teardown read it like any run's job)."""
    if not cells:
        return
    p = module.params
    spec = slurm_spec(module, result)
    meta = os.path.join(sweep_dir, ".rgt")
    serial = len([n for n in os.listdir(meta) if n.startswith("array-") and n.endswith(".list")]) + 1
    listing = os.path.join(meta, "array-%d.list" % serial)
    rl.atomic_write(listing, ("\n".join(paths.run_dir for _c, paths in cells) + "\n").encode("utf-8"), 0o644)
    script = os.path.join(meta, "array.sh")
    rl.install(script, rgt_slurm.array_script(python, entry.name), 0o755)
    argv = rgt_slurm.sbatch_argv(entry.binaries[0], script, "rgt-%s-%s" % (p["project"], name),
                                 os.path.join(sweep_dir, "logs", "slurm-%A_%a.out"), sweep_dir, p["grace_s"],
                                 spec.get("requeue", True) is not False, spec)
    argv = argv[:-1] + [rgt_slurm.array_option(len(cells), throttle), script, listing]
    job_id = submit(module, argv, "the array of sweep %s" % name, result)
    at = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    for index, (_cell, paths) in enumerate(cells):
        record = rgt_slurm.read_record(paths.meta) or {}
        task = "%s_%d" % (job_id, index)
        submits = list(record.get("submits") or []) + [{"job_id": task, "submitted_at": at}]
        rl.atomic_write_json(rgt_slurm.record_path(paths.meta), {
            "job_id": task, "array_job_id": job_id, "array_task": index, "job_name": argv[2][len("--job-name="):],
            "comment": sweep_dir, "argv": argv, "submits": submits})
    result.update(changed=True, slurm_job_id=job_id, sbatch_argv=argv)


def report_array(module, name, views, result):
    """The cells of a sweep run as a Slurm array, as Slurm and their records say now; exits the module."""
    counts = {}
    for cell, paths, _state, _attempt in views:
        records = rl.read_jsonl(paths.attempts)
        attempt = len([r for r in records if "started_at" in r])
        live = slurm_live(module, paths, result)
        state = ("queued" if live["state"] in rgt_slurm.PENDING else "running") if live else \
            shown_state(rl.last_state(records, rl.read_json(paths.exit)))
        counts[state] = counts.get(state, 0) + 1
        result["cells"].append({"run_id": cell["id"], "state": state, "attempt": attempt, "run_dir": paths.run_dir,
                                "slurm_job_id": (rgt_slurm.read_record(paths.meta) or {}).get("job_id")})
    settled = not counts.get("queued") and not counts.get("running")
    result.update(state=sweep_state(counts, len(views), settled),
                  action="launch" if result.get("slurm_job_id") else "none",
                  msg="sweep %s as a Slurm array: %s%s" % (name, ", ".join("%d %s" % (n, s) for s, n in
                                                                           sorted(counts.items())),
                                                           " (array job %s submitted now)" % result["slurm_job_id"]
                                                           if result.get("slurm_job_id") else ""))
    module.exit_json(**result)


def launch_sweep(module, root, python, inc):
    """This host's cells of a sweep: each cell is an ordinary run (active/<cell id>) with its own job.json; a queue
    per sweep on this box (files/rgt_queue.py, under the sweep's own flock) starts them as slots free, or, under
    detach sbatch, one Slurm job array per launch runs the cells that may start. Live (or pending in Slurm) and
    finished cells are never touched; a failed cell is left failed unless named in `sweep.retry`."""
    p = module.params
    sweep = p["sweep"]
    job = p["job"]
    name = sweep.get("name")
    problem = rl.check_name(name, "run id")  # the sweep name is the run id its cells start with
    if problem:
        module.fail_json(msg="nothing launched: %s" % problem, field="rgt_job.name", rc_hint=2)
    cells = sweep.get("cells") or []
    slots = [str(s) for s in (sweep.get("slots") or [])]
    if not cells or not slots:
        module.fail_json(msg="nothing launched: sweep %s gives this host no cells or no slots" % name, rc_hint=2)
    sweep_dir = rl.RunPaths(root, p["project"], name).sweep_dir(name)
    meta = os.path.join(sweep_dir, ".rgt")
    session = rl.session_name(p["project"], name + "--queue")
    result = dict(changed=False, run_dir=sweep_dir, sweep_dir=sweep_dir, session=session, detach=None,
                  action="none", attempt=None, exit=None, code_dir=None, omp_num_threads=None, cells=[])
    requested = rgt_registry.detach(p["detach"])  # None for auto (tmux, else nohup)
    array = requested is not None and requested.sweeps == "array"  # a Slurm job array instead of a queue
    if not rgt_registry.runs_sweeps(p["detach"]):
        module.fail_json(msg="rgt_job.sweep: detach %s does not run sweeps (rgt_registry: sweeps). Fix: run the "
                             "sweep on a profile that detaches with tmux, nohup or sbatch, or each cell as a job of "
                             "its own" % p["detach"], field="rgt_job.sweep", rc_hint=2, **result)
    retry = set(sweep.get("retry") or [])
    unknown = sorted(retry - set(c.get("id") for c in cells))
    if unknown:
        module.fail_json(msg="retry names %s, not a cell of sweep %s on this host" % (", ".join(unknown), name),
                         field="cell", rc_hint=2, **result)
    views = []
    for cell in cells:
        try:
            paths = rl.RunPaths(root, p["project"], cell.get("id"))
        except ValueError as exc:
            module.fail_json(msg="nothing launched: sweep %s: %s" % (name, exc), rc_hint=2, **result)
        for var in (cell.get("env") or {}):
            problem = rl.check_env_name(var)
            if problem:
                module.fail_json(msg="nothing launched: rgt_job.sweep env: %s" % problem, rc_hint=2, **result)
        state, attempt = cell_view(paths, inc)
        if array and state != "live" and slurm_live(module, paths, result):
            state = "live"  # its array task is pending or running: never submitted twice
        views.append((cell, paths, state, attempt))

    code_dir = rl.expand_root(p["code_dir"]) if p["code_dir"] else None
    if not code_dir:  # a relaunch or a retry without an upload: the code the cells were given
        code_dir = next((doc.get("code_dir") for doc in (rl.read_json(pa.job) for _c, pa, _s, _a in views)
                         if isinstance(doc, dict) and doc.get("code_dir")), None)
    if not code_dir or not os.path.isdir(code_dir):
        module.fail_json(msg="code_dir %s does not exist on the box (run upload_resume first: a sweep's code is "
                             "uploaded once per box into %s)" % (code_dir, sweep_dir), **result)
    to_write = [(c, pa, st, at) for c, pa, st, at in views if st != "live" and rl.may_start(st, c["id"] in retry)]
    secrets_file = preflight(module, root, python, result, disk_gate=bool(to_write))
    omp = p["omp_num_threads"]
    if omp is None:
        omp = omp_from_quota(*cgroup_cpu_quota())
    if omp is not None and omp <= 0:
        omp = None
    if omp:  # the box's CPUs are shared by the cells that run at once
        omp = max(1, omp // len(slots))
    if array:  # each array task gets its own allocation: the login node's CPUs say nothing
        omp = (job.get("slurm") or {}).get("cpus_per_task") or None
    entry = choose_detach(module, p["detach"], p["detach_fallback"], result)
    queue_alive = rl.lock_held(os.path.join(meta, "queue.lock"))  # for check mode; looked at again before a start
    result.update(detach=entry.name, code_dir=code_dir, omp_num_threads=omp)
    if module.check_mode:
        result.update(state="running" if queue_alive else "not_started", changed=bool(to_write or not queue_alive),
                      cells=[{"run_id": c["id"], "state": st, "attempt": at, "run_dir": pa.run_dir}
                             for c, pa, st, at in views],
                      msg="would queue %d cell(s) of sweep %s" % (len(to_write), name))
        module.exit_json(**result)

    # the sweep's files, each cell's job.json (only cells that may start), then the queue
    for directory in (meta, os.path.join(sweep_dir, "logs")):
        if not os.path.isdir(directory):
            os.makedirs(directory)
    if isinstance(sweep.get("roster"), dict):
        rl.atomic_write_json(os.path.join(sweep_dir, "roster.json"), sweep["roster"])
    data_dir = os.path.join(sweep_dir, "data")
    for cell, paths, state, attempt in to_write:
        for directory in (paths.meta, paths.ckpt, paths.out, paths.logs):
            if not os.path.isdir(directory):
                os.makedirs(directory)
        rl.install(paths.wrapper, p["wrapper_content"], 0o755)
        install_layout(paths.meta, p)
        old = rl.read_json(paths.job) or {}
        cell_code = code_dir if (p["use_new_code"] or state == "never") else old.get("code_dir") or code_dir
        doc = job_document(module, paths, rgt_sweep.cell_job(job, cell), cell_code, omp, python, secrets_file)
        doc["sweep"] = {"name": name, "dir": sweep_dir, "params": cell.get("params") or {}}
        if os.path.isdir(data_dir):
            doc["data_dir"] = data_dir
        rl.atomic_write_json(paths.job, doc, 0o600)
        rl.atomic_write_json(os.path.join(paths.meta, "sweep.json"), {"sweep": name, "sweep_dir": sweep_dir})
        if state in rgt_states.FAILED_ENDS:
            rl.atomic_write_json(os.path.join(paths.meta, "retry.json"),
                                 {"after_attempt": attempt, "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())})
    if array:
        submit_array(module, requested, python, sweep_dir, name, [(c, pa) for c, pa, _s, _a in to_write],
                     sweep.get("parallel"), result)
        report_array(module, name, views, result)
    script = os.path.join(meta, "queue.py")
    rl.install(script, p["queue_content"], 0o755)
    install_layout(meta, p)
    if not os.path.isfile(script):
        module.fail_json(msg="no sweep queue at %s (pass queue_content)" % script, **result)
    spec_path = os.path.join(meta, "queue.json")
    generation = int((rl.read_json(spec_path) or {}).get("generation") or 0) + 1
    rl.atomic_write_json(spec_path, {"project": p["project"], "durable_root": root, "python": python,
                                     "sweep": name, "cells": [c["id"] for c in cells], "slots": slots,
                                     "generation": generation, "poll_s": sweep.get("poll_s") or 1.0})
    lock = os.path.join(meta, "queue.lock")
    proc, started = None, not rl.lock_held(lock)  # looked at after queue.json: a live queue reads the new one
    if started:
        proc = launch_queue(module, entry, python, script, sweep_dir, session, result)
    # the queue has looked once at this generation: the cells it could start hold their locks (or ended)
    state_path = os.path.join(meta, "queue-state.json")
    deadline = time.time() + max(1, p["first_heartbeat_timeout_s"])
    while True:
        seen = rl.read_json(state_path) or {}
        if seen.get("generation") == generation:
            break
        if not started and seen.get("ended") and not rl.lock_held(lock):
            started = True  # the queue ended just before it could read this generation: start another
            proc = launch_queue(module, entry, python, script, sweep_dir, session, result)
        if proc is not None and proc.poll() is not None:
            deadline = min(deadline, time.time() + 1)
        if time.time() > deadline:
            module.fail_json(msg="the queue of sweep %s did not answer within %ss. queue.log tail:\n%s\n"
                                 "queue-wrapper.log tail:\n%s" % (name, p["first_heartbeat_timeout_s"],
                                                                  tail(os.path.join(sweep_dir, "logs", "queue.log")),
                                                                  tail(os.path.join(sweep_dir, "logs",
                                                                                    "queue-wrapper.log"))),
                             **result)
        time.sleep(0.1)
    pending = set(seen.get("pending") or [])
    counts = {}
    for cell, paths, _state, _attempt in views:
        state, attempt = cell_view(paths, inc)
        shown = "running" if state == "live" else "queued" if cell["id"] in pending else shown_state(state)
        counts[shown] = counts.get(shown, 0) + 1
        result["cells"].append({"run_id": cell["id"], "state": shown, "attempt": attempt, "run_dir": paths.run_dir,
                                "written": any(c is cell for c, _p, _s, _a in to_write)})
    ended = not seen.get("pending") and not seen.get("running")
    result.update(changed=bool(to_write) or started, action="launch" if to_write else "none",
                  state=sweep_state(counts, len(cells), ended), pid=seen.get("pid"),
                  msg="sweep %s on this box: %s (queue %s, %d slot(s): %s)" % (
                      name, ", ".join("%d %s" % (n, s) for s, n in sorted(counts.items())),
                      "started" if started else "running" if not ended else "done", len(slots),
                      " ".join("CUDA_VISIBLE_DEVICES=%s" % (s or "''") for s in slots)))
    module.exit_json(**result)


def job_document(module, paths, job, code_dir, omp, python, secrets_file):
    """job.json of this launch (rgt_runlayout.job_document) with this box's network env expanded ({user}, ~)."""
    p = module.params
    env = expand_env(p["network_env"])
    env.update(dict((str(k), "" if v is None else str(v)) for k, v in (job.get("env") or {}).items()))
    doc = rl.job_document(paths, job, code_dir, omp, python, secrets_file, env, p["proxy_hook"], p["grace_s"])
    # the virtual environments rgt runs from on this box: the wrapper keeps them out of the job's environment
    doc["rgt_prefixes"] = rl.own_prefixes()
    return doc


def main():
    module = AnsibleModule(
        argument_spec=dict(
            rl.RUN_LAYOUT_ARGS,
            job=dict(type="dict", required=True),
            code_dir=dict(type="path"),
            use_new_code=dict(type="bool", default=True),
            secrets_file=dict(type="str"),
            proxy_hook=dict(type="str", no_log=True),
            network_env=dict(type="dict", default={}),
            grace_s=dict(type="int", default=30),
            omp_num_threads=dict(type="int"),
            disk_floor_gib=dict(type="float", default=1.0),
            detach=dict(type="str", default=rgt_registry.AUTO),
            detach_fallback=dict(type="str"),
            wrapper_src=dict(type="path"),
            wrapper_content=dict(type="str"),
            runlayout_content=dict(type="str"),
            states_content=dict(type="str"),
            relaunch=dict(type="bool", default=True),
            relaunch_failed=dict(type="bool", default=False),
            first_heartbeat_timeout_s=dict(type="int", default=30),
            sweep=dict(type="dict"),
            queue_content=dict(type="str"),
        ),
        supports_check_mode=True,
    )
    p = module.params
    # an unregistered or unbuilt primitive is refused before anything on the box is read or written
    refused = rgt_registry.launch_problem(p["detach"], p["detach_fallback"], where="box")
    if refused:
        field, message, fix = refused
        module.fail_json(msg="%s: %s. Fix: %s" % (field, message, fix), field=field, rc_hint=2, changed=False)
    job = p["job"]
    check_slurm(module)
    root = rl.expand_root(p["durable_root"])
    try:
        paths = rl.RunPaths(root, p["project"], p["run_id"])
    except ValueError as exc:
        module.fail_json(msg="nothing launched: %s" % exc)
    for field, names in (("rgt_job.env", job.get("env") or {}), ("network_env", p["network_env"] or {})):
        for name in names:
            problem = rl.check_env_name(name)
            if problem:
                module.fail_json(msg="nothing launched: %s: %s" % (field, problem))
    if not job.get("command"):
        module.fail_json(msg="rgt_job.command is required: the shell command that trains (run in code_dir)")
    python = job.get("python")
    if not python or not os.path.isabs(rl.expand_root(python)):
        module.fail_json(msg="rgt_job.python must be the absolute path of the box's interpreter (never guessed)")
    python = rl.expand_root(python)
    if p["sweep"]:
        launch_sweep(module, root, python, rl.incarnation())

    marker = rl.read_json(os.path.join(paths.meta, "sweep.json"))
    if isinstance(marker, dict) and marker.get("sweep"):  # a cell starts through its sweep's queue, never alone
        module.fail_json(msg="nothing launched: %s is a cell of sweep %s; it starts through its sweep (`rgt-run train` "
                             "with the sweep's job, `rgt-run retry -i INVENTORY %s` when it failed)"
                             % (p["run_id"], marker["sweep"], p["run_id"]), field="rgt_job.run_id", rc_hint=2,
                         changed=False)
    session = paths.session()
    inc = rl.incarnation()
    records = rl.read_jsonl(paths.attempts)
    exit_doc = rl.read_json(paths.exit)
    pid_doc = rl.read_json(paths.pid)
    old_job = rl.read_json(paths.job) or {}
    result = dict(changed=False, run_dir=paths.run_dir, session=session, detach=None, exit=exit_doc,
                  code_dir=old_job.get("code_dir"), omp_num_threads=old_job.get("omp_num_threads"),
                  attempt=len([r for r in records if "started_at" in r]), action="none")

    # 1. live: never started twice (a Slurm job pending or running is live too, wherever its wrapper is)
    requested = rgt_registry.detach(p["detach"])  # None for auto
    live_check = globals().get("live_%s" % requested.impl) if requested is not None and requested.impl else None
    if live_check is not None and not wrapper_alive(paths, pid_doc, inc):
        live = live_check(module, paths, result)
        if live:
            queued = live["state"] in rgt_slurm.PENDING
            result.update(state="queued" if queued else "running", detach=requested.name, slurm_job_id=live["job_id"],
                          slurm_state=live["state"], slurm_reason=live.get("reason"),
                          msg="Slurm job %s of %s is %s%s: not submitted twice" % (
                              live["job_id"], p["run_id"], live["state"],
                              " (%s)" % live["reason"] if live.get("reason") else ""))
            module.exit_json(**result)
    if wrapper_alive(paths, pid_doc, inc):
        attempt = (pid_doc or {}).get("attempt") or result["attempt"]
        result.update(state="running", attempt=attempt, pid=(pid_doc or {}).get("wrapper_pid"),
                      msg="live run %s (attempt %s) is running: not started twice" % (p["run_id"], attempt))
        module.exit_json(**result)

    state = rl.last_state(records, exit_doc)
    end = rl.last_end(records, exit_doc) or {}  # exit.json, or the attempt's end line when exit.json is missing
    if end and end is not exit_doc and end.get("reason") != "dead":
        result["exit"] = end
        module.warn("exit.json of attempt %s is missing (the wrapper could not write it: a full disk?); the end "
                    "line in %s says %s" % (end.get("attempt"), paths.attempts, end.get("reason")))
    if state == "finished":
        result.update(state="finished", msg="run %s finished (attempt %s): pass a new rgt_job.run_id to start "
                      "another run" % (p["run_id"], end.get("attempt")))
        module.exit_json(**result)
    shown = shown_state(state)
    if state in rgt_states.FAILED_ENDS and not p["relaunch_failed"]:
        result.update(state=shown, msg="run %s %s (attempt %s, %s): not relaunched; read %s, then `rgt-run retry "
                      "-i INVENTORY %s` runs it once more from its newest checkpoint (or start a new "
                      "rgt_job.run_id)" % (p["run_id"], "was killed" if state == "killed" else "failed",
                                           end.get("attempt"), end_words(end), paths.log, p["run_id"]))
        module.exit_json(**result)
    if state in rgt_states.RESUMED_ENDS and not p["relaunch"]:
        result.update(state=shown, msg="run %s is %s; relaunch is off: nothing started" % (p["run_id"], shown))
        module.exit_json(**result)

    # 2. what to run
    code_dir = old_job.get("code_dir") if state != "never" else None
    if p["code_dir"] and (p["use_new_code"] or not code_dir):
        code_dir = p["code_dir"]
    if not code_dir:
        module.fail_json(msg="code_dir is required for the first launch of %s (the code-<hash8> dir upload_resume "
                             "shipped)" % p["run_id"], **result)
    code_dir = rl.expand_root(code_dir)
    if not os.path.isdir(code_dir):
        module.fail_json(msg="code_dir %s does not exist on the box (run upload_resume first)" % code_dir, **result)
    # 3. the secrets file, the interpreter and the disk gate
    secrets_file = preflight(module, root, python, result)

    omp = p["omp_num_threads"]
    if live_check is not None:  # a scheduler's job: the login node's CPUs and cgroup say nothing about it
        omp = (job.get("slurm") or {}).get("cpus_per_task") or None
    elif omp is None:
        omp = omp_from_quota(*cgroup_cpu_quota())
    elif omp <= 0:
        omp = None

    entry = choose_detach(module, p["detach"], p["detach_fallback"], result)
    detach = entry.name

    action = "launch" if state == "never" else "relaunch"
    attempt = result["attempt"] + 1
    result.update(changed=True, action=action, attempt=attempt, detach=detach, code_dir=code_dir,
                  omp_num_threads=omp)
    if module.check_mode:
        result.update(state=shown, msg="would %s %s as attempt %d (%s)" % (action, p["run_id"], attempt, detach))
        module.exit_json(**result)

    # 4. layout, wrapper files, job.json
    for directory in (paths.meta, paths.ckpt, paths.out, paths.logs):
        if not os.path.isdir(directory):
            os.makedirs(directory)
    wrapper = p["wrapper_src"] or paths.wrapper
    rl.install(paths.wrapper, p["wrapper_content"], 0o755)
    install_layout(paths.meta, p)
    if not os.path.isfile(wrapper):
        module.fail_json(msg="no wrapper at %s (pass wrapper_content or wrapper_src)" % wrapper, **result)
    doc = job_document(module, paths, job, code_dir, omp, python, secrets_file)
    rl.atomic_write_json(paths.job, doc, 0o600)  # the proxy hook may carry credentials

    # 5. start detached, then wait for the first heartbeat of this attempt
    proc = globals()["start_" + entry.impl](module, paths, python, wrapper, result)
    waiter = globals().get("wait_" + entry.impl)
    if waiter is not None:  # a scheduler's job: it may wait in the queue; never wait for that
        waiter(module, paths, attempt, result)
    deadline = time.time() + max(1, p["first_heartbeat_timeout_s"])
    while True:
        beat = rl.read_json(paths.heartbeat) or {}
        done = rl.read_json(paths.exit) or {}
        if beat.get("attempt") == attempt or done.get("attempt") == attempt:
            break
        if proc is not None and proc.poll() is not None and not os.path.exists(paths.heartbeat):
            deadline = min(deadline, time.time() + 1)
        if time.time() > deadline:
            module.fail_json(msg="the wrapper of %s did not report attempt %d within %ss. job.log tail:\n%s\n"
                                 "wrapper.log tail:\n%s" % (p["run_id"], attempt, p["first_heartbeat_timeout_s"],
                                                            tail(paths.log),
                                                            tail(os.path.join(paths.logs, "wrapper.log"))),
                             **result)
        time.sleep(0.1)

    pid_doc = rl.read_json(paths.pid) or {}
    starts = [r for r in rl.read_jsonl(paths.attempts) if r.get("attempt") == attempt and "started_at" in r]
    result.update(state="running", pid=pid_doc.get("wrapper_pid"), exit=rl.read_json(paths.exit),
                  resume_from=starts[-1].get("resume_from") if starts else None,
                  msg="%s %s: attempt %d under %s (session %s)%s"
                      % ("launched" if action == "launch" else "relaunched", p["run_id"], attempt, detach,
                         session if detach == "tmux" else "-",
                         ", resuming from " + starts[-1]["resume_from"]
                         if starts and starts[-1].get("resume_from") else ""))
    module.exit_json(**result)


if __name__ == "__main__":
    main()
