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
    and a message containing C(DISK_GATE), nothing written), the layout directories, the wrapper bundle
    (O(wrapper_bundle), each file written only when different), and C(job.json) (atomic)."
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
  host:
    description:
      - The inventory host name; job.json's C(seal) carries it so that the wrapper seals a finished run with an
        offload exactly as a pull's closeout would (module_utils/rgt_seal, docs/offload.md).
    type: str
  instance_id:
    description: The box's instance id (C(rgt_instance_id), else the host name), for the same seal.
    type: str
  rclone:
    description:
      - The launch role's word on the offload's rclone (module_utils rgt_offload.ship_plan, filter
        C(rgt.remote_gpu.rclone_ship)). C(action=refuse) fails the launch with its C(msg) (rc_hint 2) before
        anything is written; C(action=ship) requires the shipped binary at C(path) with C(sha256) and names it in
        job.json's C(offload.rclone).
    type: dict
  inbox_stop:
    description:
      - "The copy of this instance's authorisation that lets the box stop its own meter (C(rgt-run train --down)
        with C(rgt_job.offload.stop_box)): C(authorisation) (as the ledger keeps it, with its SHA-256),
        C(command) (the profile's C(meter_stop.in_box.command)) and C(self_id_env). Written into job.json's
        C(inbox_stop); the wrapper decides with module_utils/rgt_inbox after its export is offloaded and
        verified."
    type: dict
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
  wrapper_bundle:
    description:
      - The job wrapper as the flat bundle C(wrapper) of the lookup C(rgt.remote_gpu.rgt_bundle) - C(entry)
        (C(wrapper.py)), C(files) (each file name mapped to its source - the role's C(files/rgt_wrapper.py) as
        C(wrapper.py) and the module_utils it imports, each by its own name), C(digest), C(name).
      - Installed into C(<run_dir>/.rgt/) at launch, the entry mode 0755, the module_utils 0644, each file only when
        different.
    type: dict
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
        run once more), C(poll_s), C(parallel) (under sbatch the array's throttle), C(budget_resume) (C(rgt-run
        retry) with a higher budget - removes the sweep's budget marker C(.rgt/BUDGET_STOP) and retries its
        budget_stopped cells; while the marker is there and this is not set, no cell is laid out or started).
      - Writes C(job.json) of each cell that may start (never ran, preempted, killed, dead; failed only when in
        C(retry)), never touching a live or finished cell, then C(.rgt/queue.json) of the sweep (a new
        generation) and starts the sweep's queue (O(queue_bundle), C(.rgt/queue.py)) under O(detach) when it is
        not running. The queue starts each cell's wrapper on a free slot, never twice. Under detach sbatch the
        cells that may start go as one Slurm job array instead (C(--array=0-<n-1>%<parallel>), task i execs the
        wrapper of line i+1 of C(.rgt/array-<k>.list)); each cell's C(.rgt/slurm.json) records its task
        C(<array id>_<i>), and a cell whose task is pending or running is never submitted again. Other primitives
        do not run sweeps (C(rc_hint=2)). O(code_dir) is the sweep's own C(code-<hash8>), uploaded once per box.
    type: dict
  queue_bundle:
    description:
      - The sweep queue as the flat bundle C(queue) of the lookup C(rgt.remote_gpu.rgt_bundle) (the role's
        C(files/rgt_queue.py) as C(queue.py) and the module_utils it imports), installed into
        C(<sweep_dir>/.rgt/) like O(wrapper_bundle). Required with O(sweep).
    type: dict
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
    wrapper_bundle: "{{ lookup('rgt.remote_gpu.rgt_bundle', 'wrapper') }}"
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
  description: 3 when the disk gate refused the launch; 2 when the detach primitive is not registered or not built,
    or when the offload needs an rclone the box lacks and the controller cannot ship (another os/arch).
  returned: on failure
  type: int
"""

import os

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.rgt.remote_gpu.plugins.module_utils import rgt_detach, rgt_offload, rgt_registry
from ansible_collections.rgt.remote_gpu.plugins.module_utils import rgt_launchplan as lp
from ansible_collections.rgt.remote_gpu.plugins.module_utils import rgt_launchsweep as ls
from ansible_collections.rgt.remote_gpu.plugins.module_utils import rgt_runlayout as rl


def launch_sweep(module, root, python, inc):
    """This host's cells of a sweep: each cell is an ordinary run (active/<cell id>) with its own job.json; a queue
    per sweep on this box (files/rgt_queue.py, under the sweep's own flock) starts them as slots free, or, under
    detach sbatch, one Slurm job array per launch runs the cells that may start. Live (or pending in Slurm) and
    finished cells are never touched; a failed cell is left failed unless named in `sweep.retry`. Exits the
    module."""
    p = module.params
    # 1. validate: the share, the primitive, the retry, each cell
    sweep = ls.Sweep(module, root)
    result = ls.first_result(sweep)
    requested = rgt_detach.get(p["detach"])  # None for auto (tmux, else nohup)
    array = requested is not None and requested.entry.sweeps == "array"  # a Slurm job array instead of a queue
    ls.refuse(module, sweep, result)
    views = ls.cell_views(module, root, sweep, array, inc, result)

    # 2. decide: the code, the cells that may start, the gates, the threads per cell, the primitive
    code_dir = ls.code_dir_of(module, sweep, views, result)
    to_write = ls.budget_hold(module, sweep, views, result)  # the sweep's budget marker: nothing starts while held
    secrets_file = lp.preflight(module, root, python, result, disk_gate=bool(to_write))
    omp = lp.omp_threads(p["omp_num_threads"], p["job"], array, slots=len(sweep.slots))
    detach = rgt_detach.choose(module, p["detach"], p["detach_fallback"], result)
    result.update(detach=detach.name, code_dir=code_dir, omp_num_threads=omp)
    if module.check_mode:
        module.exit_json(**ls.would(sweep, views, to_write, result))

    # 3. lay out: the sweep's files, each cell's job.json (only cells that may start)
    ls.lay_out(module, sweep, to_write, code_dir, omp, python, secrets_file, result)

    # 4. start and 5. wait: one job array of the cells that may start, or the sweep's queue
    if array:
        requested.submit_array(module, python, sweep.dir, sweep.name, [(c, pa) for c, pa, _s, _a in to_write],
                               sweep.parallel, result)
        module.exit_json(**ls.array_report(module, sweep, views, result))
    generation = ls.write_queue(module, sweep, root, python, result)
    proc, started = ls.start_queue(module, sweep, detach, python, result)
    seen, started = ls.wait_queue(module, sweep, detach, python, generation, proc, started, result)
    module.exit_json(**ls.queue_report(sweep, views, to_write, seen, started, inc, result))


def ship_rclone(module):
    """The offload's rclone (roles/launch_detached, module_utils rgt_offload.ship_plan): a refusal fails the launch
    before anything on the box is written (exit 2); the rclone the role shipped must be there with the
    controller's SHA-256, and job.json's offload.rclone names it (the wrapper's pusher runs it)."""
    p = module.params
    plan = p["rclone"] or {}
    if plan.get("action") == "refuse":
        module.fail_json(msg=plan.get("msg"), field=plan.get("field"), rc_hint=2, changed=False)
    if plan.get("action") == "ship":
        problem = rgt_offload.shipped_problem(plan)
        if problem:
            module.fail_json(msg="rgt_job.offload: %s: launch again (the launch ships it again)" % problem,
                             changed=False)
        p["job"] = dict(p["job"], offload=dict(p["job"].get("offload") or {},
                                               rclone=os.path.expanduser(plan["path"])))


def main():
    module = AnsibleModule(
        argument_spec=dict(
            rl.RUN_LAYOUT_ARGS,
            job=dict(type="dict", required=True),
            code_dir=dict(type="path"),
            use_new_code=dict(type="bool", default=True),
            secrets_file=dict(type="str"),
            proxy_hook=dict(type="str", no_log=True),
            host=dict(type="str"),
            instance_id=dict(type="str"),
            network_env=dict(type="dict", default={}),
            grace_s=dict(type="int", default=30),
            omp_num_threads=dict(type="int"),
            disk_floor_gib=dict(type="float", default=1.0),
            detach=dict(type="str", default=rgt_registry.AUTO),
            detach_fallback=dict(type="str"),
            wrapper_src=dict(type="path"),
            wrapper_bundle=dict(type="dict"),
            relaunch=dict(type="bool", default=True),
            relaunch_failed=dict(type="bool", default=False),
            first_heartbeat_timeout_s=dict(type="int", default=30),
            sweep=dict(type="dict"),
            queue_bundle=dict(type="dict"),
            rclone=dict(type="dict"),
            inbox_stop=dict(type="dict"),
        ),
        supports_check_mode=True,
    )
    p = module.params
    # 1. validate: bad input is refused before anything on the box is read or written
    root, paths, python = lp.validate(module)
    ship_rclone(module)
    if p["sweep"]:
        launch_sweep(module, root, python, rl.incarnation())
    lp.refuse_sweep_cell(module, paths)

    # 2. decide: live (never started twice), ended (reported), else attempt n+1 of which code, with what
    inc = rl.incarnation()
    records = lp.Records(paths)
    result = lp.first_result(paths, records)
    requested = rgt_detach.get(p["detach"])  # None for auto
    scheduler = requested is not None and requested.scheduler  # a Slurm job pending or running is live too
    if scheduler and not lp.wrapper_alive(paths, records.pid, inc):
        live = requested.live(module, paths, result)
        if live:
            module.exit_json(**dict(result, **live))
    if lp.wrapper_alive(paths, records.pid, inc):
        module.exit_json(**dict(result, **lp.running(paths, records, result["attempt"])))
    state = rl.last_state(records.attempts, records.exit)
    end = rl.last_end(records.attempts, records.exit) or {}  # exit.json, or the attempt's end line without it
    warning = lp.missing_exit(paths, records, end)
    if warning:
        result["exit"] = end
        module.warn(warning)
    report = lp.not_started(paths, state, end, p["relaunch"], p["relaunch_failed"])
    if report:
        module.exit_json(**dict(result, **report))
    code_dir, problem = lp.code_dir_of(state, records.job, p)
    if problem:
        module.fail_json(msg=problem, **result)
    secrets_file = lp.preflight(module, root, python, result)  # the secrets file, the interpreter, the disk gate
    omp = lp.omp_threads(p["omp_num_threads"], p["job"], scheduler)
    detach = rgt_detach.choose(module, p["detach"], p["detach_fallback"], result)
    action = "launch" if state == "never" else "relaunch"
    attempt = max(result["attempt"] or 0, rl.attempts_before(p["job"])) + 1  # the wrapper's number (a move's too)
    result.update(changed=True, action=action, attempt=attempt, detach=detach.name, code_dir=code_dir,
                  omp_num_threads=omp)
    if module.check_mode:
        result.update(state=lp.shown_state(state), msg="would %s %s as attempt %d (%s)" % (
            action, p["run_id"], attempt, detach.name))
        module.exit_json(**result)

    # 3. lay out: the run's directories, its box-side files, job.json
    wrapper = lp.lay_out(module, paths, code_dir, omp, python, secrets_file, result)

    # 4. start detached
    proc = detach.start(module, paths, python, wrapper, result)

    # 5. wait: a scheduler's job may wait in its queue (never waited for); else the first heartbeat of this attempt
    detach.wait(module, paths, attempt, result)
    lp.wait_first_heartbeat(module, paths, attempt, proc, result)
    module.exit_json(**dict(result, **lp.started(paths, attempt, action, detach.name)))


if __name__ == "__main__":
    main()
