# -*- coding: utf-8 -*-
# Copyright: rgt contributors
# SPDX-License-Identifier: Apache-2.0
"""What rgt_launch does for one run, step by step: validate the input (before anything on the box is read or
written), decide from the run's records whether to start it and with which code, lay out the run (directories, the
box-side files, job.json), and wait for the wrapper's first heartbeat after the start (the start itself is the
detach primitive's: rgt_detach). The rules are in docs/internals.md "Run spine" and docs/job-spec.md "How a run
ends"; the module's own documentation (plugins/modules/rgt_launch.py) says what each step refuses.

Functions that end the task take the module (``params``, ``check_mode``, ``warn``, ``fail_json``, ``exit_json``);
the others are pure or read the box only. Box-side (rgt_launch imports it): Python 3.6+, stdlib only.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import os
import signal
import time

from ansible_collections.rgt.remote_gpu.plugins.module_utils import rgt_host, rgt_registry, rgt_slurm, rgt_states
from ansible_collections.rgt.remote_gpu.plugins.module_utils import rgt_runlayout as rl
from ansible_collections.rgt.remote_gpu.plugins.module_utils.rgt_detach import tail
from ansible_collections.rgt.remote_gpu.plugins.module_utils.rgt_proc import read

CGROUP_ROOT = "/sys/fs/cgroup"


# ---------------------------------------------------------------- what the box says (CPUs, disk, a live wrapper)

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


def omp_threads(explicit, job, scheduler, slots=1, quota=cgroup_cpu_quota):
    """OMP_NUM_THREADS for the job (None: not set). A scheduler's job gets rgt_job.slurm.cpus_per_task (the login
    node's CPUs and cgroup say nothing about it); else the option omp_num_threads (0 or less: not set), else the
    cgroup CPU quota (omp_from_quota), shared by the `slots` cells of a sweep that run at once (at least 1 each)."""
    if scheduler:
        return (job.get("slurm") or {}).get("cpus_per_task") or None
    omp = explicit
    if omp is None:
        omp = omp_from_quota(*quota())
    if omp is not None and omp <= 0:
        omp = None
    if omp:
        omp = max(1, omp // slots)
    return omp


free_gib = rl.free_gib  # (free GiB, the directory measured): the disk gate and watch's spare check


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


def expand_env(env):
    out = {}
    for name, value in (env or {}).items():
        out[str(name)] = rl.expand_user("" if value is None else str(value))  # `{user}`, a leading `~`
    return out


# ---------------------------------------------------------------- how a run that is not live reads

def shown_state(state):
    """How a run that is not live reads in the result, as status shows it (rgt_states.shown: last_state's never is
    not_started; killed, a death by a signal that is no stop signal, is failed)."""
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


# ---------------------------------------------------------------- 1. validate

def validate(module):
    """Refuse bad input before anything on the box is read or written: an unregistered or unbuilt primitive, or
    one the controller starts (rc_hint 2, field), a bad `slurm` block (check_slurm), a project or run id that is
    no plain name, a bad environment variable name, no command, no absolute interpreter. Returns (durable root
    expanded, the run's RunPaths, the interpreter expanded)."""
    p = module.params
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
    return root, paths, rl.expand_root(python)


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


def refuse_sweep_cell(module, paths):
    """A sweep cell's run dir (.rgt/sweep.json) starts through its sweep's queue, never alone (rc_hint 2)."""
    marker = rl.read_json(os.path.join(paths.meta, "sweep.json"))
    if isinstance(marker, dict) and marker.get("sweep"):
        module.fail_json(msg="nothing launched: %s is a cell of sweep %s; it starts through its sweep (`rgt-run train` "
                             "with the sweep's job, `rgt-run retry -i INVENTORY %s` when it failed)"
                             % (paths.run_id, marker["sweep"], paths.run_id), field="rgt_job.run_id", rc_hint=2,
                         changed=False)


# ---------------------------------------------------------------- 2. decide

class Records(object):
    """A run's records on the box as the launch reads them once: attempts.jsonl, exit.json, pid, job.json."""

    def __init__(self, paths):
        self.attempts = rl.read_jsonl(paths.attempts)
        self.exit = rl.read_json(paths.exit)
        self.pid = rl.read_json(paths.pid)
        self.job = rl.read_json(paths.job) or {}

    def started(self):
        """The number of the newest attempt started (how many, unless the run was moved: rgt_runlayout.last_attempt)."""
        return rl.last_attempt(self.attempts)


def first_result(paths, records):
    """The module's result before anything is decided: what the records say now."""
    return dict(changed=False, run_dir=paths.run_dir, session=paths.session(), detach=None, exit=records.exit,
                code_dir=records.job.get("code_dir"), omp_num_threads=records.job.get("omp_num_threads"),
                attempt=records.started(), action="none")


def running(paths, records, attempt):
    """The result of a run whose wrapper is alive: reported, never started twice."""
    attempt = (records.pid or {}).get("attempt") or attempt
    return dict(state="running", attempt=attempt, pid=(records.pid or {}).get("wrapper_pid"),
                msg="live run %s (attempt %s) is running: not started twice" % (paths.run_id, attempt))


def missing_exit(paths, records, end):
    """The warning when the last attempt's end comes from its end line in attempts.jsonl because exit.json is
    missing or older (the wrapper could not write it, e.g. on a full disk), else None."""
    if end and end is not records.exit and end.get("reason") != "dead":
        return ("exit.json of attempt %s is missing (the wrapper could not write it: a full disk?); the end "
                "line in %s says %s" % (end.get("attempt"), paths.attempts, end.get("reason")))
    return None


def not_started(paths, state, end, relaunch, relaunch_failed):
    """The result of a run that is not live and is not started now, or None when it may start (the one rule of
    docs/job-spec.md "How a run ends", rgt_runlayout.may_start): finished; failed, killed or budget_stopped without
    relaunch_failed; preempted or dead with relaunch off."""
    run_id = paths.run_id
    if state == "finished":
        return dict(state="finished", msg="run %s finished (attempt %s): pass a new rgt_job.run_id to start "
                    "another run" % (run_id, end.get("attempt")))
    shown = shown_state(state)
    if state == "budget_stopped" and not relaunch_failed:
        return dict(state=shown, msg="run %s was stopped at its budget (attempt %s): not relaunched; `rgt-run retry "
                    "-i INVENTORY %s` with a higher rgt_job.budget_usd resumes it from its newest checkpoint"
                    % (run_id, end.get("attempt"), run_id))
    if state in rgt_states.FAILED_ENDS and not relaunch_failed:
        return dict(state=shown, msg="run %s %s (attempt %s, %s): not relaunched; read %s, then `rgt-run retry "
                    "-i INVENTORY %s` runs it once more from its newest checkpoint (or start a new "
                    "rgt_job.run_id)" % (run_id, "was killed" if state == "killed" else "failed",
                                         end.get("attempt"), end_words(end), paths.log, run_id))
    if state in rgt_states.RESUMED_ENDS and not relaunch:
        return dict(state=shown, msg="run %s is %s; relaunch is off: nothing started" % (run_id, shown))
    return None


def code_dir_of(state, old_job, params):
    """(the code directory this attempt runs, expanded; None) or (None, why there is none). A relaunch keeps
    job.json's unless code_dir is given and use_new_code is on."""
    code_dir = old_job.get("code_dir") if state != "never" else None
    if params["code_dir"] and (params["use_new_code"] or not code_dir):
        code_dir = params["code_dir"]
    if not code_dir:
        return None, ("code_dir is required for the first launch of %s (the code-<hash8> dir upload_resume "
                      "shipped)" % params["run_id"])
    code_dir = rl.expand_root(code_dir)
    if not os.path.isdir(code_dir):
        return None, "code_dir %s does not exist on the box (run upload_resume first)" % code_dir
    return code_dir, None


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


# ---------------------------------------------------------------- 3. lay out

def install_box_files(module, meta, bundle, result):
    """The box-side code of a run (the wrapper bundle) or of a sweep (the queue bundle) into its .rgt dir `meta`:
    the entry (wrapper.py, queue.py) mode 0755 and the module_utils it imports beside it 0644, each only when
    different (rgt_runlayout.install_bundle). No bundle installs nothing; a malformed one fails, nothing written."""
    if not bundle:
        return
    try:
        rl.install_bundle(meta, bundle["files"], bundle["entry"])
    except (KeyError, TypeError, AttributeError, ValueError) as exc:
        name = bundle.get("name") if isinstance(bundle, dict) else "?"
        module.fail_json(msg="nothing installed in %s: the bundle %s is not one of the lookup "
                             "rgt.remote_gpu.rgt_bundle (entry, files): %s" % (meta, name, exc), **result)


def make_run_dirs(paths):
    for directory in (paths.meta, paths.ckpt, paths.out, paths.logs):
        if not os.path.isdir(directory):
            os.makedirs(directory)


def job_document(module, paths, job, code_dir, omp, python, secrets_file):
    """job.json of this launch (rgt_runlayout.job_document) with this box's network env expanded ({user}, ~)."""
    p = module.params
    env = expand_env(p["network_env"])
    env.update(dict((str(k), "" if v is None else str(v)) for k, v in (job.get("env") or {}).items()))
    doc = rl.job_document(paths, job, code_dir, omp, python, secrets_file, env, p["proxy_hook"], p["grace_s"])
    # the virtual environments rgt runs from on this box: the wrapper keeps them out of the job's environment
    doc["rgt_prefixes"] = rl.own_prefixes()
    doc["seal"] = seal_document(p.get("host"), p.get("instance_id"), job)
    # train --down with offload.stop_box: the authorisation's copy the box stops its own meter by (rgt_inbox)
    doc["inbox_stop"] = p.get("inbox_stop") or None
    return doc


def seal_document(host, instance_id, job):
    """job.json's `seal`: what the wrapper's seal at a finished run's end needs (module_utils/rgt_seal, the same
    options roles/collect gives the closeout: instance_id defaults to the host name, job_name to the run id), or
    None without a host name."""
    if not host:
        return None
    return {"host": host, "instance_id": instance_id or host, "job_name": job.get("name"),
            "declared_checkpoints": list((job.get("checkpoint") or {}).get("declared") or []),
            "loader_python": job.get("python")}


def lay_out(module, paths, code_dir, omp, python, secrets_file, result):
    """The run's directories, its box-side files (install_box_files) and job.json (atomic, mode 0600: the proxy
    hook may carry credentials). Returns the wrapper to run (O(wrapper_src), else .rgt/wrapper.py)."""
    p = module.params
    make_run_dirs(paths)
    wrapper = p["wrapper_src"] or paths.wrapper
    install_box_files(module, paths.meta, p["wrapper_bundle"], result)
    if not os.path.isfile(wrapper):
        module.fail_json(msg="no wrapper at %s (pass wrapper_bundle or wrapper_src)" % wrapper, **result)
    doc = job_document(module, paths, p["job"], code_dir, omp, python, secrets_file)
    rl.atomic_write_json(paths.job, doc, 0o600)
    return wrapper


# ---------------------------------------------------------------- 5. wait

def wait_first_heartbeat(module, paths, attempt, proc, result):
    """Until the wrapper's heartbeat (or exit record) names `attempt`, at most first_heartbeat_timeout_s (sooner
    when our own child `proc` exited without a heartbeat); fails with the logs' tails. Never waits for the job."""
    p = module.params
    deadline = time.time() + max(1, p["first_heartbeat_timeout_s"])
    while True:
        beat = rl.read_json(paths.heartbeat) or {}
        done = rl.read_json(paths.exit) or {}
        if beat.get("attempt") == attempt or done.get("attempt") == attempt:
            return
        if proc is not None and proc.poll() is not None and not os.path.exists(paths.heartbeat):
            deadline = min(deadline, time.time() + 1)
        if time.time() > deadline:
            module.fail_json(msg="the wrapper of %s did not report attempt %d within %ss. job.log tail:\n%s\n"
                                 "wrapper.log tail:\n%s" % (p["run_id"], attempt, p["first_heartbeat_timeout_s"],
                                                            tail(paths.log),
                                                            tail(os.path.join(paths.logs, "wrapper.log"))),
                             **result)
        time.sleep(0.1)


def started(paths, attempt, action, detach):
    """The result of a started attempt, from what the wrapper wrote (pid, exit.json, its start line)."""
    pid_doc = rl.read_json(paths.pid) or {}
    starts = [r for r in rl.read_jsonl(paths.attempts) if r.get("attempt") == attempt and "started_at" in r]
    return dict(state="running", pid=pid_doc.get("wrapper_pid"), exit=rl.read_json(paths.exit),
                resume_from=starts[-1].get("resume_from") if starts else None,
                msg="%s %s: attempt %d under %s (session %s)%s"
                    % ("launched" if action == "launch" else "relaunched", paths.run_id, attempt, detach,
                       paths.session() if detach == "tmux" else "-",
                       ", resuming from " + starts[-1]["resume_from"]
                       if starts and starts[-1].get("resume_from") else ""))
