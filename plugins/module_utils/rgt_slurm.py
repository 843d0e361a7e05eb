# -*- coding: utf-8 -*-
# Copyright: rgt contributors
# SPDX-License-Identifier: Apache-2.0
"""Slurm on the login node: read a job's state (``scontrol show job``), cancel it once and watch it end (teardown),
submit a run's batch script (rgt_launch's sbatch primitive) and look a run's job up again (status, idempotent
launch). The parsers are pure and unit tested with real ``scontrol`` text (tests/unit/test_rgt_slurm.py); the calls
take a ``run`` function (argv -> (rc, stdout, stderr)) so tests and modules share them.

Facts this relies on (measured on Slurm 22.05, docs/slurm.md): ``scancel`` exits 0 for an unknown job id, so only
``scontrol``'s view says what happened; a job Slurm no longer knows answers "Invalid job id" (any other scontrol
error says nothing about the job); ``scontrol show job`` lists key=value pairs, several per line, continuation lines
indented (``-o``: one line per job); JobState may carry a suffix ("CANCELLED by 0").

Python 3.6+, stdlib only, no import of another module_util (the modules and the wrapper's side both load it).
"""

from __future__ import absolute_import, division, print_function

import json
import os
import re
import subprocess
import time

__metaclass__ = type

# JobState values after which the job never runs again (unless requeued by hand).
ENDED = ("CANCELLED", "COMPLETED", "FAILED", "TIMEOUT", "OUT_OF_MEMORY", "NODE_FAIL", "PREEMPTED", "BOOT_FAIL",
         "DEADLINE", "SPECIAL_EXIT")
PENDING = ("PENDING", "REQUEUE_HOLD", "REQUEUE_FED", "REQUEUED", "RESV_DEL_HOLD", "SUSPENDED")
ACTIVE = ("RUNNING", "CONFIGURING", "COMPLETING", "RESIZING", "STAGE_OUT", "SIGNALING", "STOPPED")
UNKNOWN_JOB = "Invalid job id"
RECORD = "slurm.json"  # <run_dir>/.rgt/slurm.json: the submitted job of a run
CALL_TIMEOUT_S = 30

_KEY = re.compile(r"(?:^|\s)([A-Za-z][A-Za-z0-9_:/]*)=")


# ---------------------------------------------------------------- pure parsers

def parse_jobs(text):
    """``scontrol show job`` output (plain, ``-o`` or ``-dd``) -> one {key: value} per job, in order. A value runs to
    the next key (so it may hold spaces, e.g. a Command with arguments) but never past its line; text before the
    first JobId= (a comment, an error) is ignored."""
    jobs = []
    for block in re.split(r"(?=(?:^|\s)JobId=)", text or ""):
        block = block.strip()
        if not block.startswith("JobId="):
            continue
        fields = {}
        marks = list(_KEY.finditer(block))
        for index, mark in enumerate(marks):
            end = marks[index + 1].start() if index + 1 < len(marks) else len(block)
            value = block[mark.end():end].strip()
            value = value.split("\n", 1)[0].strip()
            key = mark.group(1)
            if key not in fields:  # the -dd per-node detail line (Nodes=... Mem=...) never overrides the job's
                fields[key] = value
        jobs.append(fields)
    return jobs


def base_state(value):
    """The bare state word: "CANCELLED by 0" -> CANCELLED, sacct's "CANCELLED+" -> CANCELLED; '' for none."""
    word = (value or "").strip().split(" ", 1)[0].rstrip("+")
    return word.upper()


def exit_code(value):
    """ExitCode "rc:signal" -> (rc, signal) as ints; (None, None) when unreadable."""
    parts = (value or "").strip().split(":")
    try:
        return int(parts[0]), int(parts[1]) if len(parts) > 1 else 0
    except (ValueError, IndexError):
        return None, None


def _int(value):
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


def _none(value):
    return None if value in (None, "", "(null)", "None", "N/A", "Unknown") else value


def job_view(fields):
    """The parts of one job (parse_jobs) that rgt uses: id, name, state, reason, exit rc/signal, restarts, requeue
    allowed, time limit, run time, comment, node list, stdout path."""
    rc, sig = exit_code(fields.get("ExitCode"))
    return {
        "job_id": fields.get("JobId"), "name": fields.get("JobName"), "state": base_state(fields.get("JobState")),
        "reason": _none(fields.get("Reason")), "exit_rc": rc, "exit_signal": sig,
        "restarts": _int(fields.get("Restarts")) or 0, "requeue": fields.get("Requeue") == "1",
        "time_limit": _none(fields.get("TimeLimit")), "run_time": _none(fields.get("RunTime")),
        "comment": _none(fields.get("Comment")), "nodes": _none(fields.get("NodeList")),
        "stdout": _none(fields.get("StdOut")), "partition": _none(fields.get("Partition")),
    }


def ended(state):
    return base_state(state) in ENDED


def parse_submit(text):
    """``sbatch --parsable`` output ("123" or "123;cluster") -> the job id, or None."""
    for line in (text or "").splitlines():
        word = line.strip().split(";", 1)[0]
        if word.isdigit():
            return word
    return None


def parse_squeue(text):
    """``squeue -h -o %i|%T|%k`` rows -> [{job_id, state, comment}] (comment '(null)' -> None)."""
    rows = []
    for line in (text or "").splitlines():
        cells = line.strip().split("|", 2)
        if len(cells) == 3 and cells[0].strip():
            rows.append({"job_id": cells[0].strip(), "state": base_state(cells[1]), "comment": _none(cells[2])})
    return rows


# ---------------------------------------------------------------- calls (run: argv -> (rc, out, err))

def run_argv(argv, timeout=CALL_TIMEOUT_S, env=None):
    """Run argv, never through a shell: (rc, stdout, stderr); rc 127 when the program is missing, 124 on timeout."""
    try:
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
                                universal_newlines=True, env=env)
    except OSError as exc:
        return 127, "", "%s: %s" % (argv[0], exc)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        return 124, out, (err or "") + "\n%s timed out after %ss" % (argv[0], timeout)
    return proc.returncode, out, err


def show_job(job_id, run=run_argv):
    """scontrol's view of one job: {"known": True, "view": job_view, "raw": fields} | {"known": False} (Slurm no
    longer knows the id) | {"known": None, "error": text} (scontrol could not say: slurmctld down, a timeout)."""
    rc, out, err = run(["scontrol", "show", "job", "-o", str(job_id)])
    if rc == 0:
        jobs = [j for j in parse_jobs(out) if j.get("JobId") == str(job_id)] or parse_jobs(out)
        if jobs:
            return {"known": True, "view": job_view(jobs[0]), "raw": jobs[0]}
        return {"known": None, "error": "scontrol printed no job: %s" % (out.strip()[:200] or "(nothing)")}
    text = (err or out or "").strip()
    if UNKNOWN_JOB in text:
        return {"known": False}
    return {"known": None, "error": text[:300] or "scontrol exited %s" % rc}


def cancel(job_id, argv, timeout_s, interval_s, look_tries=5, look_delay_s=3.0, run=run_argv, sleep=time.sleep,
           clock=time.time):
    """Teardown's scancel, decided here: look at the job first (a scontrol that cannot say is asked again, at most
    look_tries times, never guessed), cancel once with argv unless it already ended or Slurm no longer knows it,
    then wait (bounded by timeout_s, polling every interval_s) until Slurm reports it ended.

    Returns {ok, final_state ('gone' | 'already gone' | 'unknown — check squeue' | None when nothing was
    decided), slurm_state ('JobState=X' or 'unknown'), calls [{argv, rc}], msg}. ok False with final_state None:
    Slurm could not say, nothing was cancelled."""
    before = show_job(job_id, run)
    tries = 1
    while before["known"] is None and tries < max(1, look_tries):
        sleep(look_delay_s)
        before = show_job(job_id, run)
        tries += 1
    calls = [{"argv": list(argv), "rc": None}]
    if before["known"] is None:
        return {"ok": False, "final_state": None, "slurm_state": "unknown", "calls": calls,
                "msg": "%s: scontrol could not show the job (%s): nothing was cancelled; run the teardown again "
                       "when slurmctld answers" % (job_id, before.get("error"))}
    if before["known"] is False or ended(before["view"]["state"]):
        state = before["view"]["state"] if before["known"] else None
        return {"ok": True, "final_state": "already gone", "calls": calls,
                "slurm_state": "JobState=%s" % state if state else "unknown",
                "msg": "%s: %s: nothing was cancelled" % (job_id, "already ended (%s)" % state if state
                                                          else "Slurm does not know this job")}
    rc, out, err = run(list(argv))
    calls[0]["rc"] = rc
    deadline = clock() + max(0.0, float(timeout_s))
    interval = max(0.1, float(interval_s))
    while True:
        after = show_job(job_id, run)
        if after["known"] is False or (after["known"] and ended(after["view"]["state"])):
            state = after["view"]["state"] if after["known"] else None
            return {"ok": True, "final_state": "gone", "calls": calls,
                    "slurm_state": "JobState=%s" % state if state else "unknown",
                    "msg": "%s: cancelled (%s)" % (job_id, state or "Slurm no longer knows it")}
        if clock() >= deadline:
            state = after["view"]["state"] if after["known"] else None
            return {"ok": False, "final_state": "unknown — check squeue", "calls": calls,
                    "slurm_state": "JobState=%s" % state if state else "unknown",
                    "msg": "%s: Slurm did not report the job ended within %s s (%s; scancel rc %s: %s); not "
                           "cancelling again — check squeue" % (job_id, timeout_s, state or after.get("error"),
                                                                rc, (err or out).strip()[:200])}
        sleep(interval)


def cancel_jobs(jobs, timeout_s, interval_s, look_tries=5, look_delay_s=3.0, run=run_argv, sleep=time.sleep,
                clock=time.time):
    """cancel() for each of jobs ([{job_id, argv}]: the instance id and the jobs the runs on the box submitted),
    each looked at, cancelled once and waited for; one outcome for the teardown record. final_state: None when
    Slurm could not say for a job (that job is not cancelled; the others are), else "unknown — check squeue" when
    one never ended, "already gone" when none needed a cancel, else "gone". slurm_state is the job's JobState for
    one job, "<id>: JobState=X; ..." for several."""
    outcomes = [dict(cancel(job["job_id"], job["argv"], timeout_s, interval_s, look_tries, look_delay_s, run, sleep,
                            clock), job_id=job["job_id"]) for job in jobs]
    finals = [o["final_state"] for o in outcomes]
    if None in finals:
        final = None
    elif any(f not in ("gone", "already gone") for f in finals):
        final = "unknown — check squeue"
    else:
        final = "already gone" if all(f == "already gone" for f in finals) else "gone"
    states = [o["slurm_state"] for o in outcomes]
    return {"ok": all(o["ok"] for o in outcomes), "final_state": final,
            "slurm_state": states[0] if len(states) == 1 else "; ".join(
                "%s: %s" % (o["job_id"], o["slurm_state"]) for o in outcomes),
            "calls": [c for o in outcomes for c in o["calls"]], "jobs": outcomes,
            "msg": "; ".join(o["msg"] for o in outcomes)}


def cancel_pending(meta_dirs, run=run_argv):
    """A sweep held at its budget (rgt.budget): scancel the recorded job (.rgt/slurm.json: a cell's array task
    <array id>_<i>) of each run whose job Slurm still holds pending, so none of them starts; a running task is left
    to the stop its wrapper was sent (RGT_PREEMPT_FILE). Runs without a record are skipped (nothing is asked of
    Slurm). Returns {"cancelled": [job id, ...], "errors": ["<job id>: why", ...]}."""
    cancelled, errors = [], []
    for meta in meta_dirs:
        job_id = (read_record(meta) or {}).get("job_id")
        if not job_id:
            continue
        seen = show_job(job_id, run=run)
        if seen["known"] is None:
            errors.append("%s: %s" % (job_id, seen["error"]))
            continue
        if not seen["known"] or seen["view"]["state"] not in PENDING:
            continue
        rc, out, err = run(["scancel", str(job_id)])
        if rc == 0:
            cancelled.append(str(job_id))
        else:
            errors.append("%s: scancel rc %s: %s" % (job_id, rc, (err or out).strip()[:200]))
    return {"cancelled": cancelled, "errors": errors}


# ---------------------------------------------------------------- a run's job (launch, status)

def record_path(meta_dir):
    return os.path.join(meta_dir, RECORD)


def read_record(meta_dir):
    """<run_dir>/.rgt/slurm.json ({job_id, job_name, submitted_at, submits: [...]}) or None."""
    try:
        with open(record_path(meta_dir)) as handle:
            doc = json.load(handle)
    except (IOError, OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) else None


def live_jobs(job_name, comment, run=run_argv):
    """(rows, error): the jobs squeue lists under this name whose comment is this run's (the run dir), pending or
    running; error is squeue's message when it could not answer (then rows is None: never guess 'none')."""
    rc, out, err = run(["squeue", "-h", "-n", job_name, "-o", "%i|%T|%k"])
    if rc != 0:
        return None, (err or out or "squeue exited %s" % rc).strip()[:300]
    return [r for r in parse_squeue(out) if r["comment"] == comment], None


# rgt_job.slurm's resource fields, each one sbatch option (rgt_launch passes only the fields set)
RESOURCE_FLAGS = (("partition", "--partition"), ("gres", "--gres"), ("cpus_per_task", "--cpus-per-task"),
                  ("mem", "--mem"), ("time", "--time"), ("account", "--account"), ("qos", "--qos"))
ARRAY_OPTION = "--array"  # a sweep's cells as one job array (rgt_detach.Sbatch.submit_array)
WRAP_OPTION = "--wrap"  # a command sbatch would run instead of the batch script rgt passes
# sbatch's one-letter forms of the options above (sbatch(1))
SHORT_FORMS = {"-J": "--job-name", "-o": "--output", "-p": "--partition", "-c": "--cpus-per-task", "-t": "--time",
               "-A": "--account", "-q": "--qos", "-a": ARRAY_OPTION}


def sbatch_argv(program, script, job_name, output, comment, grace_s, requeue, spec):
    """The sbatch command line for a run: job name, output (appended across requeues), the run dir as comment
    (how a later launch finds the live job), --signal=B:TERM@<grace> (the batch shell execs the wrapper, so the
    wrapper gets it), --requeue or --no-requeue, then the job spec's slurm block. program: the sbatch binary (the
    registry's entry names it). Values go as separate argv words: nothing passes through a shell."""
    spec = spec or {}
    argv = [program, "--parsable", "--job-name=" + job_name, "--output=" + output, "--open-mode=append",
            "--comment=" + comment, "--signal=B:TERM@%d" % max(1, int(grace_s)),
            "--requeue" if requeue else "--no-requeue"]
    for key, flag in RESOURCE_FLAGS:
        value = spec.get(key)
        if value is not None and value != "":
            argv.append("%s=%s" % (flag, value))
    argv.extend(str(x) for x in spec.get("extra") or [])
    argv.append(script)
    return argv


def array_option(count, throttle=None):
    """The option that submits `count` cells as one job array, at most `throttle` at once."""
    return "%s=0-%d%s" % (ARRAY_OPTION, count - 1, "%%%d" % int(throttle) if throttle else "")


def reserved_options():
    """The sbatch options rgt passes itself, read off sbatch_argv's own command line (every resource field set,
    both requeue forms), the job array's and --wrap (a command instead of rgt's batch script). sbatch keeps the
    last of a repeated option: one in rgt_job.slurm.extra would override rgt's."""
    spec = dict((key, "x") for key, _flag in RESOURCE_FLAGS)
    names = set([ARRAY_OPTION, WRAP_OPTION])
    for requeue in (True, False):
        names.update(word.split("=", 1)[0] for word in sbatch_argv("program", "script", "name", "out", "dir", 30,
                                                                    requeue, spec)[1:-1])
    return sorted(names)


def extra_problem(extra):
    """(index, message, fix) for the first word of rgt_job.slurm.extra that sets an option rgt sets itself
    (reserved_options), in full, abbreviated (sbatch takes any unambiguous prefix: --job, --comm) or in its
    one-letter form (-J, -o, -a, ...); None when no word does. A resource option names its rgt_job.slurm field; the
    others are how rgt finds the run's job again (job name, comment), where its log goes, how the wrapper gets its
    stop signal and whether Slurm requeues it: overriding them breaks status and can submit the run twice."""
    reserved = reserved_options()
    fields = dict((flag, key) for key, flag in RESOURCE_FLAGS)
    fields.update({"--requeue": "requeue", "--no-requeue": "requeue"})
    for index, word in enumerate(extra or []):
        word = str(word)
        if word.startswith("--"):
            name = word.split("=", 1)[0]
            hits = [r for r in reserved if r == name or (len(name) > 2 and r.startswith(name))]
        elif word.startswith("-") and word[:2] in SHORT_FORMS:
            name, hits = word[:2], [SHORT_FORMS[word[:2]]]
        else:
            continue
        if not hits:
            continue
        option = name if name in hits else hits[0]
        if name == option:
            what = "sets %s" % option
        elif name in SHORT_FORMS:
            what = "sets %s (%s)" % (option, name)
        else:
            what = "abbreviates %s" % " or ".join(hits)
        if option == WRAP_OPTION:
            what += ", which replaces the batch script rgt submits"
        else:
            what += ", an option rgt passes itself (sbatch keeps the last of a repeated option: rgt's would be lost)"
        message = "rgt_job.slurm.extra[%d] %r %s" % (index, word, what)
        if option in fields:
            fix = "remove it and set rgt_job.slurm.%s instead" % fields[option]
        else:
            fix = ("remove it: rgt sets %s itself and finds the run's job again by its name and comment "
                   "(docs/slurm.md)" % ", ".join(r for r in reserved if r not in fields and r != WRAP_OPTION))
        return index, message, fix
    return None


def batch_script(python, wrapper, run_dir, detach):
    """The batch script: the run dir as cwd, then `exec` the wrapper so Slurm's B: signals reach it (bash defers
    traps while a foreground child runs; an exec'd wrapper gets TERM itself). A requeue runs it again from the
    top: the wrapper then starts the next attempt from the newest checkpoint. RGT_DETACH names the primitive for the
    wrapper's attempt record."""
    from shlex import quote
    lines = ["#!/bin/bash", "# written by rgt (rgt_launch, detach sbatch): runs the rgt job wrapper of this run",
             "cd %s || exit 97" % quote(run_dir), "export RGT_DETACH=%s" % quote(detach)]
    lines.append("exec %s %s %s" % (quote(python), quote(wrapper), quote(run_dir)))
    return "\n".join(lines) + "\n"


def teardown_jobs(instance_id, box_runs):
    """The Slurm jobs a scancel teardown ends: the instance id, then the job each run on the box submitted through
    sbatch (.rgt/slurm.json; a sweep cell's array task as <array id>_<i>; a job still queued or running would go on
    billing the allocation), each once: [{job_id, argv}]. The runner shows the same list before the confirmation."""
    ids = [instance_id] + [run.get("slurm_job_id") for box in box_runs or [] if isinstance(box, dict)
                           for run in box.get("runs") or [] if isinstance(run, dict)]
    out = []
    for job_id in ids:
        if job_id and str(job_id) not in [j["job_id"] for j in out]:
            out.append({"job_id": str(job_id), "argv": ["scancel", str(job_id)]})
    return out


def array_script(python, detach):
    """The batch script of a sweep's job array: task i runs the cell on line i+1 of the list file given as its
    argument ($1): cd to its run dir, then `exec` its wrapper (so B: signals reach the wrapper), as batch_script."""
    from shlex import quote
    return "\n".join([
        "#!/bin/bash",
        "# written by rgt (rgt_launch, a sweep under detach sbatch): array task i runs line i+1 of the list",
        'RUN_DIR=$(sed -n "$((SLURM_ARRAY_TASK_ID + 1))p" "$1")',
        '[ -n "$RUN_DIR" ] || { echo "no cell for array task $SLURM_ARRAY_TASK_ID in $1" >&2; exit 97; }',
        'cd "$RUN_DIR" || exit 97',
        "export RGT_DETACH=%s" % quote(detach),
        'exec %s "$RUN_DIR/.rgt/wrapper.py" "$RUN_DIR"' % quote(python)]) + "\n"


def observe(run_dir, run=run_argv):
    """Slurm's view of a run's job for status, or None when the run was never submitted through Slurm (no
    .rgt/slurm.json). {job_id, known (True / False: Slurm no longer knows the id / None: it could not say), error,
    and job_view's keys when known}."""
    record = read_record(os.path.join(run_dir, ".rgt")) if run_dir else None
    if not record or not record.get("job_id"):
        return None
    seen = show_job(record["job_id"], run)
    out = {"job_id": str(record["job_id"]), "known": seen["known"], "error": seen.get("error")}
    if seen["known"]:
        out.update(seen["view"])
    return out


def duration_s(value):
    """Slurm's [D-]HH:MM:SS / MM:SS / MM -> seconds; None for UNLIMITED, INFINITE or anything unreadable."""
    text = (value or "").strip()
    days = 0
    if "-" in text:
        head, text = text.split("-", 1)
        if not head.isdigit():
            return None
        days = int(head)
    parts = text.split(":")
    if not parts or not all(p.isdigit() for p in parts) or len(parts) > 3:
        return None
    numbers = [int(p) for p in parts]
    if len(numbers) == 1:
        seconds = numbers[0] * 60  # a bare number is minutes (sbatch --time=90)
    elif len(numbers) == 2:
        seconds = numbers[0] * 60 + numbers[1]
    else:
        seconds = numbers[0] * 3600 + numbers[1] * 60 + numbers[2]
    return days * 86400 + seconds
