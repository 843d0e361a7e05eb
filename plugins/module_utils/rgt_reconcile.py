# -*- coding: utf-8 -*-
# Copyright: rgt contributors
# SPDX-License-Identifier: Apache-2.0
"""Liveness reconciliation: raw facts of one run -> state, evidence and attention (docs/internals.md "Status").

Pure logic, no I/O: the rgt_status module reads the files and processes on the box and hands them here; the
unit tests hand the same facts in directly. For a run submitted through Slurm the facts carry Slurm's view
(`slurm`: rgt_slurm.observe, read by rgt_statusdoc), because on the login node the wrapper's pids mean nothing;
`with_slurm` then decides the state from Slurm's view and the wrapper's records. Python 3.6+ standard library only
(module_utils run on the box).

States (docs/internals.md "Status document"): the exit record of the current attempt decides when there is one
(exit.json, or the attempt's end line in attempts.jsonl when exit.json is missing: a wrapper on a full disk);
otherwise a live wrapper pid under the same incarnation means running (or stalled), a dead wrapper under another
incarnation means the box restarted (preempted), and a dead wrapper under the same incarnation is dead.
"""

from __future__ import absolute_import, division, print_function

import calendar
import math
import re
import time

__metaclass__ = type

from ansible_collections.rgt.remote_gpu.plugins.module_utils import rgt_runlayout, rgt_slurm, rgt_states

# the states this module decides are rgt_states.BOX_STATES (queued, timeout and oom: with_slurm and with_queue)
DEFAULT_STALL_AFTER_S = 600
NO_PROGRESS_AFTER_S = 300  # a running attempt whose log shows no step or loss by then gets one warning
DISK_PCT_MAX = 95
SPIKE_FACTOR = 10.0
SPIKE_WINDOW = 20
FAST_FINISH_FRACTION = 0.5
GPU_IDLE_PCT = 5


# ---------------------------------------------------------------- small parsers

_ISO = re.compile(r"^(\d{4})-(\d{2})-(\d{2})[T ](\d{2}):(\d{2}):(\d{2})(\.\d+)?(Z|[+-]\d{2}:?\d{2})?$")


def to_epoch(value):
    """Epoch seconds from a number or an ISO-8601 string (naive = UTC); None when unreadable."""
    if value is None or isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return float(value)
    text = str(value).strip()
    try:
        return float(text)
    except ValueError:
        pass
    match = _ISO.match(text)
    if not match:
        return None
    parts = [int(match.group(i)) for i in range(1, 7)]
    seconds = calendar.timegm((parts[0], parts[1], parts[2], parts[3], parts[4], parts[5], 0, 0, 0))
    if match.group(7):
        seconds += float(match.group(7))
    zone = match.group(8)
    if zone and zone != "Z":
        sign = -1 if zone[0] == "-" else 1
        digits = zone[1:].replace(":", "")
        seconds -= sign * (int(digits[:2]) * 3600 + int(digits[2:4]) * 60)
    return float(seconds)


def parse_loss(text):
    """A captured loss string -> float (nan/inf included) or None when it is no number."""
    text = (text or "").strip().rstrip(".,;")
    try:
        return float(text)
    except ValueError:
        return None


def json_number(value):
    """JSON has no NaN/Infinity: non-finite floats travel as the strings "nan", "inf", "-inf"."""
    if isinstance(value, float) and not math.isfinite(value):
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")
    return value


def _median(values):
    ordered = sorted(values)
    n = len(ordered)
    mid = n // 2
    return ordered[mid] if n % 2 else (ordered[mid - 1] + ordered[mid]) / 2.0


# ---------------------------------------------------------------- the log's step, loss and metrics
# One home for how job.log is read: the status scan below and the report's history (rgt_history) both use
# LogReader. Built-in rules cover the common trainers' formats (docs/job-spec.md "Log patterns"); the job's
# log_patterns.step / .loss replace the built-in step / loss rules, its `metrics` the built-in metrics.

NUMBER = r"(?:tensor\()?['\"]?([-+]?(?:\d+\.?\d*(?:[eE][-+]?\d+)?|\.\d+(?:[eE][-+]?\d+)?|nan|inf(?:inity)?))"
KEY_SEP = r"['\"]?(?:\s*[=:]\s*|\s+)"  # key=value, key: value, 'key': value, "key": value, key value
NOT_INSIDE = r"(?<![\w./-])"  # a key of its own: not the tail of eval_loss, val/loss, max_steps
# step=N, Step N, step: N, 'step': N, "step": N, global_step=N, iter N, iteration N, Step [N/M]; never "steps"
STEP_RULE = re.compile(r"(?i)" + NOT_INSIDE + r"['\"]?(?:global[_ ]?)?(?:step|iter|iteration)" + KEY_SEP
                       + r"\[?(\d+)(?![\w.])")
# loss=, loss:, 'loss':, "loss":, train_loss= (Lightning), train/loss; never eval_loss, val_loss, loss_scale
LOSS_RULE = re.compile(r"(?i)" + NOT_INSIDE + r"['\"]?(?:train[_/])?loss(?:_step)?" + KEY_SEP + NUMBER)
# a tqdm bar "<desc>: 12%|##  | 60/500 [00:30<03:40, 2.00it/s, loss=0.3]": HF Trainer's training bar has no desc,
# Lightning's is "Epoch E"; any other desc (Map, Validation, Loading, Downloading) is not training progress
BAR_RULE = re.compile(r"^(?P<desc>.*?)\s*\d{1,3}%\|[^|]*\|\s*(?P<n>\d+)/(?P<total>\d+)\s*\[[^\]]*?(?:it/s|s/it)")
EPOCH_DESC = re.compile(r"(?i)^epoch\s+(\d+)(?:/\d+)?$")
# a line about resuming or loading a checkpoint names an old step, not progress ("Resuming from global_step=135",
# "loaded checkpoint ... step 135", HF's "Continuing training from global step 135", Lightning's "Restoring ...")
RESUME_LINE = re.compile(r"(?i)\b(?:resum(?:e|es|ed|ing)\b|restor(?:e|es|ed|ing)\b|continu(?:e|es|ed|ing) training"
                         r"|load(?:s|ed|ing)?\b.{0,80}?\bcheckpoint|skip(?:s|ped|ping)? the first)")
SUMMARY_LINE = "train_runtime"  # HF Trainer's end-of-run summary: its train_loss is the mean over the run
DEFAULT_METRICS = {
    "eval_loss": r"(?i)" + NOT_INSIDE + r"['\"]?(?:eval|val|valid|validation)[_/ ]loss" + KEY_SEP + NUMBER,
    "lr": r"(?i)" + NOT_INSIDE + r"['\"]?(?:learning_rate|lr)" + KEY_SEP + NUMBER,
}
# words a line must hold (lower-cased) before a built-in rule's regex runs on it: a 256 KiB tail costs milliseconds
RESUME_WORDS = ("resum", "restor", "continu", "load", "skip")
STEP_WORDS = ("step", "iter")
METRIC_WORDS = {"eval_loss": ("loss",), "lr": ("lr", "learning_rate")}
MAX_METRICS = 8
# what job.json said before the built-in rules (the runner wrote these two out): they mean "the built-in rules"
LEGACY_PATTERNS = {"step": r"step[=: ]\s*(\d+)", "loss": r"loss[=: ]\s*([-+0-9.eEnaNinfINF]+)"}
ATTEMPT_MARKER = re.compile(r"^== rgt attempt (\d+) started")


def _user_rule(patterns, key):
    """The job's own regex for `key` (log_patterns), compiled, or None for the built-in rules. The runner refuses
    a bad regex before anything runs (exit 2); one in an old job.json falls back to the built-in rules."""
    value = (patterns or {}).get(key)
    if not value or value == LEGACY_PATTERNS.get(key):
        return None
    try:
        return re.compile(value)
    except (re.error, TypeError):
        return None


def metric_rules(metrics=None):
    """[(name, compiled regex)]: the job's `metrics` ({name: regex}, at most MAX_METRICS), else DEFAULT_METRICS;
    {} declares none."""
    return [(name, rule) for name, rule, _words in _metric_rules(metrics)]


def _metric_rules(metrics):
    """metric_rules with the words a line must hold for each rule (None: the job's own rule, no shortcut)."""
    spec = DEFAULT_METRICS if metrics is None else metrics
    out = []
    for name, pattern in list((spec or {}).items())[:MAX_METRICS]:
        try:
            out.append((str(name), re.compile(pattern), METRIC_WORDS.get(name) if metrics is None else None))
        except (re.error, TypeError):
            continue
    return out


def _holds(low, words):
    return words is None or any(word in low for word in words)


def _captured(match):
    return match.group(1) if match.groups() else match.group(0)


class LogReader(object):
    """Reads the step, loss and metrics of job.log lines, one attempt at a time (a new reader per attempt).

    read(line) -> (step or None, loss or None, [(metric, value)]). The reader keeps the latest step seen
    (`step`) and which progress bar is the training bar: the first unlabelled tqdm bar of the attempt (HF
    Trainer's); an unlabelled bar with another total (HF's evaluation bar) is not progress."""

    def __init__(self, patterns=None, metrics=None):
        self.step_re = _user_rule(patterns, "step")
        self.loss_re = _user_rule(patterns, "loss")
        self._metrics = _metric_rules(metrics)
        self.metrics = [(name, rule) for name, rule, _words in self._metrics]
        self.bar_total = None
        self.step = None

    @staticmethod
    def quiet(line, low=None):
        """A line that shows no progress whatever it holds: the wrapper's markers, resume and load messages."""
        low = line.lower() if low is None else low
        return line.startswith("== rgt attempt ") or (_holds(low, RESUME_WORDS) and RESUME_LINE.search(line)
                                                      is not None)

    def step_of(self, line, commit=True):
        """The step a line shows, or None. commit=False: look without taking the line's bar as the training bar."""
        low = line.lower()
        return None if self.quiet(line, low) else self._step(line, low, commit)

    def _step(self, line, low, commit):
        if self.step_re is not None:
            match = self.step_re.search(line)
            return _int(_captured(match)) if match else None
        match = STEP_RULE.search(line) if _holds(low, STEP_WORDS) else None
        if match:
            return int(match.group(1))
        bar = BAR_RULE.search(line) if "%|" in line else None
        if not bar:
            return None
        desc, n, total = bar.group("desc").strip().rstrip(":").strip(), int(bar.group("n")), int(bar.group("total"))
        epoch = EPOCH_DESC.match(desc)
        if epoch:  # Lightning counts batches per epoch: epoch E, batch n of N is step E x N + n
            return int(epoch.group(1)) * total + n
        if desc:
            return None
        if self.bar_total is None and commit:
            self.bar_total = total
        return n if total == (self.bar_total if self.bar_total is not None else total) else None

    def read(self, line):
        low = line.lower()
        if self.quiet(line, low):
            return None, None, []
        step = self._step(line, low, True)
        if step is not None:
            self.step = step
        loss = None
        if self.loss_re is not None:
            match = self.loss_re.search(line)
            loss = parse_loss(_captured(match)) if match else None
        elif "loss" in low and SUMMARY_LINE not in line:
            match = LOSS_RULE.search(line)
            loss = parse_loss(match.group(1)) if match else None
        values = []
        for name, rule, words in self._metrics:
            match = rule.search(line) if _holds(low, words) else None
            value = parse_loss(_captured(match)) if match else None
            if value is not None:
                values.append((name, value))
        return step, loss, values


def _int(text):
    try:
        return int(text)
    except (TypeError, ValueError):
        return None


def current_attempt_lines(lines, attempt=None):
    """The lines of the current attempt: after the wrapper's last `== rgt attempt N started` marker (for N =
    attempt when given). job.log is appended by every attempt; without a marker in the tail, all of it."""
    for index in range(len(lines) - 1, -1, -1):
        match = ATTEMPT_MARKER.match(lines[index])
        if match and (attempt is None or int(match.group(1)) == attempt):
            return lines[index + 1:]
    return lines


def scan_log(text, patterns=None, partial_first_line=False, attempt=None):
    """Read step/loss lines of a log tail (the current attempt's part of it), with LogReader's rules.

    Returns {step, loss, nonfinite (first non-finite loss {step, value}), spike (latest loss > 10x the median
    of the previous 20 finite losses {step, value, median}), lines_with_loss, lines (the attempt's lines read)}.
    The first non-finite loss is kept even when finite lines follow it (a NaN that "recovered" is still a NaN).
    """
    reader = LogReader(patterns, {})
    lines = (text or "").splitlines()
    if partial_first_line and lines:
        lines = lines[1:]  # the tail began mid-line
    lines = current_attempt_lines(lines, attempt)
    result = {"step": None, "loss": None, "nonfinite": None, "spike": None, "lines_with_loss": 0,
              "lines": sum(1 for line in lines if line.strip() and not line.startswith("== rgt attempt "))}
    window = []
    for line in lines:
        _found, loss, _values = reader.read(line)
        step = reader.step
        result["step"] = step
        if loss is None:
            continue
        result["lines_with_loss"] += 1
        result["loss"] = loss
        if not math.isfinite(loss):
            if result["nonfinite"] is None:
                result["nonfinite"] = {"step": step, "value": json_number(loss),
                                       "line": line.strip()[:200]}
            continue
        if len(window) >= SPIKE_WINDOW:
            median = _median(window)
            if median > 0 and loss > SPIKE_FACTOR * median:
                result["spike"] = {"step": step, "value": loss, "median": median,
                                   "line": line.strip()[:200]}
        window.append(loss)
        if len(window) > SPIKE_WINDOW:
            window.pop(0)
    return result


def no_progress_warning(scan, attempt_age_s, patterns=None):
    """One warning for a running attempt whose log, NO_PROGRESS_AFTER_S into the attempt, has lines but shows
    no step or no loss (the rules do not fit this job's format), naming the fix; None otherwise."""
    if attempt_age_s is None or attempt_age_s < NO_PROGRESS_AFTER_S or not scan.get("lines"):
        return None
    missing = [key for key in ("step", "loss") if scan.get(key) is None]
    if not missing:
        return None
    after = "after %d min" % (attempt_age_s // 60)
    if len(missing) == 2:
        return ("no step/loss seen in logs/job.log %s: set rgt_job.log_patterns (a regex with one group each for "
                "the step and the loss your job prints; docs/job-spec.md)" % after)
    key = missing[0]
    seen = "steps were seen, the latest %s" % scan["step"] if key == "loss" else "loss lines were seen"
    fix = "set rgt_job.log_patterns.%s to" % key
    if _user_rule(patterns, key) is not None:
        fix = "rgt_job.log_patterns.%s matches no line: make it" % key
    return "no %s seen in logs/job.log %s (%s): %s a regex with one group for the %s your job prints" % (
        key, after, seen, fix, key)


def latest_gpu(samples):
    """Latest sample per GPU index, in index order; keys index, util_pct, mem_used_mib, mem_total_mib."""
    latest = {}
    for row in samples or []:
        index = row.get("index")
        if index is None:
            continue
        latest[index] = row
    out = []
    for index in sorted(latest, key=lambda i: (str(type(i)), i)):
        row = latest[index]
        out.append({"index": index, "util_pct": row.get("util_pct"), "mem_used_mib": row.get("mem_used_mib"),
                    "mem_total_mib": row.get("mem_total_mib")})
    return out


def gpu_idle(samples):
    """True when GPUs were sampled and none was busy in the recent samples; None when unknown (no GPU)."""
    utils = [row.get("util_pct") for row in samples or [] if isinstance(row.get("util_pct"), (int, float))]
    if not utils:
        return None
    return max(utils) <= GPU_IDLE_PCT


# ---------------------------------------------------------------- attempts

def attempt_records(attempts):
    """{attempt: {"start": record or None, "end": record or None}} from attempts.jsonl lines."""
    table = {}
    for record in attempts or []:
        number = record.get("attempt")
        if number is None:
            continue
        slot = table.setdefault(number, {"start": None, "end": None})
        if "started_at" in record:
            slot["start"] = record
        if "ended_at" in record:
            slot["end"] = record
    return table


def current_attempt(pid_doc, attempts, exit_doc):
    """The attempt the run is on: the pid file's, else the newest attempt line's, else the exit record's."""
    candidates = []
    if pid_doc and isinstance(pid_doc.get("attempt"), int):
        candidates.append(pid_doc["attempt"])
    candidates.extend(n for n in attempt_records(attempts) if isinstance(n, int))
    if candidates:
        return max(candidates)
    if exit_doc and isinstance(exit_doc.get("attempt"), int):
        return exit_doc["attempt"]
    return None


def wrapper_clock(facts, attempt, now):
    """(now, last sign of life of `attempt`) on the clock of the machine the wrapper runs on: every duration is
    one clock's end minus the same clock's start, never the reader's time minus the wrapper's records. On a box
    the status is read where the wrapper runs: `now` and now - the heartbeat's age. Under Slurm it is read on the
    login node, whose clock need not be the compute node's: the wrapper's own heartbeat time `ts` is both (at
    most a heartbeat interval old), None when the heartbeat is not this attempt's."""
    if facts.get("slurm"):
        beat = facts.get("heartbeat") or {}
        ts = to_epoch(beat.get("ts")) if beat.get("attempt") in (None, attempt) else None
        return ts, ts
    age = facts.get("heartbeat_age_s")
    return now, (now - age if isinstance(age, (int, float)) else None)


def wall_seconds(attempts, now, current=None, alive=False, last_alive_at=None):
    """Summed wall seconds of all attempts: ended ones by their end line, the current one up to now when alive,
    else up to the last sign of life (heartbeat) when known. `now` and `last_alive_at` are on the wrapper's clock
    (wrapper_clock); now None: the current attempt's time so far is not known."""
    total = 0.0
    for number, slot in attempt_records(attempts).items():
        start = to_epoch((slot["start"] or {}).get("started_at"))
        if start is None:
            continue
        end = to_epoch((slot["end"] or {}).get("ended_at"))
        if end is None:
            if number == current and alive and now is not None:
                end = max(start, now)
            elif last_alive_at is not None and number == current:
                end = max(start, last_alive_at)
            else:
                end = start
        total += max(0.0, end - start)
    return total


def end_line_exit(records, attempt):
    """The exit record of `attempt` rebuilt from its end line in attempts.jsonl (the wrapper writes the end line
    before exit.json, so a wrapper that ran out of disk may leave only the line), or None. A `dead` line is not an
    exit record: a later wrapper writes it for an attempt that vanished without one."""
    end = (records.get(attempt) or {}).get("end") if attempt is not None else None
    if not end or end.get("reason") in (None, "dead"):
        return None
    doc = dict((key, end.get(key)) for key in ("attempt", "rc", "signal", "reason", "ended_at"))
    doc["source"] = "attempts.jsonl"
    return doc


# ---------------------------------------------------------------- reconcile

def _attention(ident, message, **data):
    item = {"id": ident, "message": message}
    item.update(data)
    return item


def reconcile(facts):
    """Decide the status document of one run from its raw facts.

    facts keys (all optional except now): host, run_id, job (job.json or None), pid (pid doc), heartbeat (doc),
    heartbeat_age_s, exit (exit.json), attempts (list), incarnation (now), wrapper_alive, job_alive (liveness of
    the recorded pids, already False when the pid doc is from another incarnation), session_alive (None when
    not applicable), log_tail (text), log_tail_partial (bool), log_age_s, ckpt_age_s, outputs_present
    ({relpath: bool}), mounts ([{path, bytes_pct, inodes_pct}]), cgroup ({mem_limit_bytes, mem_usage_bytes,
    oom_kill}), oom_kill_baseline, gpu_samples ([{index, util_pct, mem_used_mib, mem_total_mib}], recent rows),
    now (epoch seconds), warnings (list of strings collected while reading), slurm (rgt_slurm.observe's view, or
    None for a run not submitted through Slurm), queue (rgt_runlayout.sweep_queue's view, or None for a run that
    is no sweep cell).
    """
    doc = _reconcile(facts)
    doc = with_queue(doc, facts.get("queue"))
    doc = with_slurm(doc, facts.get("slurm"), facts.get("job"))
    return with_budget_hold(doc, facts.get("queue"))


# what a cell held by its sweep's budget would otherwise show: nothing of it runs, and nothing will start it
HELD_STATES = ("not_started", "preempted", "dead")
BUDGET_HELD = "budget_held"  # a status document's stop_reason: its sweep's budget marker holds the cell


def with_budget_hold(doc, queue):
    """A sweep cell that does not run while its sweep is held at its budget (rgt_runlayout.budget_held: watch at
    100% of the sweep's budget_usd) is `budget_stopped` with stop_reason budget_held: its queue (or a launch) will
    not start it, and only `rgt-run retry` with a higher budget_usd does. doc unchanged otherwise (a cell still
    queued in Slurm stays queued: its pending task was not cancelled yet)."""
    held = (queue or {}).get("held")
    if held is None or doc["state"] not in HELD_STATES:
        return doc
    doc["state"] = "budget_stopped"
    doc["stop_reason"] = BUDGET_HELD
    spent = held.get("spent_usd")
    of = held.get("budget_usd")
    money = " ($%.2f of $%.2f)" % (spent, of) if isinstance(spent, (int, float)) and isinstance(of, (int, float)) \
        else ""
    doc["queue_reason"] = ("%s: the budget of sweep %s is spent%s: its queue starts no more cells; `rgt-run retry %s` "
                           "with a higher rgt_job.budget_usd resumes them" % (BUDGET_HELD, queue.get("sweep"), money,
                                                                              queue.get("sweep")))
    return doc


def with_queue(doc, queue):
    """A sweep cell: `sweep` names its sweep and `queue_alive` says whether its queue runs; a cell its sweep's live
    queue will still start (never ran, or preempted or dead and due again) is `queued`, waiting for a free slot, not
    not_started or preempted; a cell the launch prepared that no queue ever started (no slot.json) is
    `not_started` with the queue's story in `queue_reason`, not `dead` (nothing of it ran, so nothing died). doc
    unchanged for a run that is no cell."""
    if not queue:
        return doc
    doc["sweep"] = queue.get("sweep")
    doc["queue_alive"] = bool(queue.get("alive"))
    if rgt_runlayout.will_start(queue, doc.get("run_id")) \
            and doc["state"] in rgt_states.RESTARTABLE:
        doc["state"] = "queued"
        doc["queue_reason"] = "waiting for a free slot in the queue of sweep %s" % queue.get("sweep")
    elif doc["state"] == "dead" and doc.get("attempt") is None and not queue.get("tried"):
        # prepared by the launch (job.json) but no queue ever started its wrapper: it did not die, it never ran
        doc["state"] = "not_started"
        doc["warnings"] = [w for w in doc.get("warnings") or [] if not w.startswith("job.json present but no ")]
        if queue.get("alive"):
            why = "its queue will not start it"
        elif queue.get("ended") == "done":
            why = "the queue of the sweep on this box ended"
        elif queue.get("ended"):
            why = "the queue of the sweep on this box was stopped by %s" % queue["ended"]
        else:
            why = "the queue of the sweep on this box is gone without a word (killed, or the box restarted)"
        doc["queue_reason"] = "never started: %s; `rgt-run watch` or `rgt-run train` starts it again" % why
    return doc


def _reconcile(facts):
    now = facts.get("now") or time.time()
    job = facts.get("job")
    warnings = list(facts.get("warnings") or [])
    pid_doc = facts.get("pid") or None
    attempts = facts.get("attempts") or []
    exit_doc = facts.get("exit") or None
    incarnation = facts.get("incarnation")
    gpu_samples = facts.get("gpu_samples") or []
    mounts = facts.get("mounts") or []
    cgroup = facts.get("cgroup") or {"mem_limit_bytes": None, "mem_usage_bytes": None, "oom_kill": None}
    doc = {
        "schema": 1, "host": facts.get("host"), "run_id": facts.get("run_id") or (job or {}).get("run_id"),
        "state": "not_started", "attempt": None,
        "evidence": {"wrapper_pid_alive": bool(facts.get("wrapper_alive")),
                     "job_pid_alive": bool(facts.get("job_alive")),
                     "session_alive": facts.get("session_alive"), "incarnation_changed": None,
                     "heartbeat_age_s": _round(facts.get("heartbeat_age_s")),
                     "log_age_s": _round(facts.get("log_age_s")), "ckpt_age_s": _round(facts.get("ckpt_age_s")),
                     "exit": None},
        "step": None, "loss": None, "nonfinite_loss": None, "loss_spike": None,
        "gpu": latest_gpu(gpu_samples), "mounts": mounts, "cgroup": cgroup, "outputs_missing": [],
        "elapsed_s": None, "expected_duration_s": None, "cost_so_far": None, "auto_resume": False,
        "attention": [], "warnings": warnings,
    }
    attention = doc["attention"]
    _disk_full(facts, attention)
    if not job:
        return doc
    policy = job.get("attempt_policy") or {}
    doc["auto_resume"] = bool(policy.get("auto_resume", job.get("auto_resume", False)))
    doc["expected_duration_s"] = job.get("expected_duration_s")
    stall_after = job.get("stall_after_s") or DEFAULT_STALL_AFTER_S

    attempt = current_attempt(pid_doc, attempts, exit_doc)
    doc["attempt"] = attempt
    records = attempt_records(attempts)
    start = (records.get(attempt) or {}).get("start") or {}
    start_incarnation = start.get("incarnation") or (pid_doc or {}).get("incarnation")
    changed = None
    if start_incarnation and incarnation:
        changed = start_incarnation != incarnation
    doc["evidence"]["incarnation_changed"] = changed
    baseline = facts.get("oom_kill_baseline")
    if baseline is None:
        baseline = start.get("oom_kill", start.get("oom_kill_baseline"))
    if changed:
        baseline = 0  # a new container starts a new cgroup: its counter started again from 0
    _oom(facts, attention, baseline if isinstance(baseline, int) else 0)

    exit_current = None
    if exit_doc:
        if exit_doc.get("attempt") in (None, attempt):
            exit_current = exit_doc
        else:
            warnings.append("exit.json is from attempt %s, the run is on attempt %s" % (exit_doc.get("attempt"),
                                                                                        attempt))
    if exit_current is None:
        exit_current = end_line_exit(records, attempt)
        if exit_current is not None:
            warnings.append("exit.json of attempt %s is missing (the wrapper could not write it: a full disk?); "
                            "its end line in attempts.jsonl says %s rc %s" % (attempt, exit_current.get("reason"),
                                                                              exit_current.get("rc")))
    doc["evidence"]["exit"] = exit_current

    wrapper_alive = bool(facts.get("wrapper_alive")) and changed is not True
    job_alive = bool(facts.get("job_alive")) and changed is not True
    alive = False
    if exit_current:
        reason = exit_current.get("reason")
        if reason == "finished":
            present = facts.get("outputs_present") or {}
            missing = [p for p in job.get("outputs") or [] if not present.get(p)]
            doc["outputs_missing"] = missing
            if missing:
                doc["state"] = "failed"
                attention.append(_attention("outputs_missing", "the job reported success but declared outputs "
                                            "are missing under out/: " + ", ".join(missing), paths=missing))
            else:
                doc["state"] = "finished"
        elif reason in ("preempted", "budget_stopped"):
            doc["state"] = reason
        else:  # failed, killed, or a reason this version does not know
            doc["state"] = "failed"
            if reason not in rgt_states.FAILED_ENDS:
                warnings.append("unknown exit reason %r counted as failed" % (reason,))
    elif wrapper_alive:
        doc["state"] = "running"
        alive = True
    elif job_alive:
        doc["state"] = "running"
        alive = True
        warnings.append("the wrapper is gone but the job process is alive: no exit record will be written")
    elif not pid_doc and not records:
        if facts.get("session_alive"):
            doc["state"] = "running"
            alive = True
            warnings.append("job.json present, the wrapper has not recorded a pid yet (starting)")
        else:
            doc["state"] = "dead"
            warnings.append("job.json present but no wrapper ever recorded a pid or an attempt")
    elif changed:
        doc["state"] = "preempted"
        warnings.append("the box restarted since attempt %s started (incarnation changed)" % attempt)
    else:
        doc["state"] = "dead"

    if alive:
        _heartbeat_check(doc, facts, job, warnings)

    scan = scan_log(facts.get("log_tail"), job.get("log_patterns"), facts.get("log_tail_partial", False), attempt)
    doc["step"] = scan["step"]
    doc["loss"] = json_number(scan["loss"])
    if scan["nonfinite"]:
        doc["nonfinite_loss"] = {"step": scan["nonfinite"]["step"], "value": scan["nonfinite"]["value"]}
        attention.append(_attention("nonfinite_loss", "non-finite loss %s at step %s" % (
            scan["nonfinite"]["value"], scan["nonfinite"]["step"]), step=scan["nonfinite"]["step"],
            value=scan["nonfinite"]["value"]))
    if scan["spike"]:
        spike = scan["spike"]
        doc["loss_spike"] = {"step": spike["step"], "value": spike["value"], "median": spike["median"]}
        attention.append(_attention("loss_spike", "loss %.6g at step %s is more than %gx the median %.6g of the "
                                    "previous %d losses" % (spike["value"], spike["step"], SPIKE_FACTOR,
                                                            spike["median"], SPIKE_WINDOW),
                                    step=spike["step"], value=spike["value"]))

    clock_now, last_alive_at = wrapper_clock(facts, attempt, now)
    attempt_started = to_epoch(start.get("started_at"))
    if alive and clock_now is not None and attempt_started is not None:
        warning = no_progress_warning(scan, clock_now - attempt_started, job.get("log_patterns"))
        if warning:
            warnings.append(warning)

    if alive:
        log_age = facts.get("log_age_s")
        if log_age is None and attempt_started is not None:
            log_age = now - attempt_started
        ckpt_age = facts.get("ckpt_age_s")
        idle = gpu_idle(gpu_samples)
        quiet_log = log_age is not None and log_age > stall_after
        quiet_ckpt = ckpt_age is None or ckpt_age > stall_after
        if quiet_log and quiet_ckpt and idle is not False:
            doc["state"] = "stalled"
            attention.append(_attention(
                "stalled", "alive but the log is %ds old%s (stall_after_s %s)%s" % (
                    log_age, "" if ckpt_age is None else " and the newest checkpoint %ds" % ckpt_age, stall_after,
                    ", GPUs idle" if idle else ""), log_age_s=_round(log_age), ckpt_age_s=_round(ckpt_age)))
        elif quiet_log and not quiet_ckpt:
            warnings.append("the log is quiet but checkpoints advance: block-buffered stdout?")
        elif quiet_log and idle is False:
            warnings.append("the log is quiet but a GPU is busy: not counted as a stall")

    if exit_current and to_epoch(exit_current.get("ended_at")) is not None:
        last_alive_at = to_epoch(exit_current.get("ended_at"))
    elapsed = wall_seconds(attempts, clock_now, attempt, alive, last_alive_at)
    doc["elapsed_s"] = _round(elapsed) if records else None
    price = job.get("price_per_hour")
    if isinstance(price, (int, float)) and not isinstance(price, bool) and records:
        doc["cost_so_far"] = round(price * elapsed / 3600.0, 4)
    expected = job.get("expected_duration_s")
    if (doc["state"] == "finished" and isinstance(expected, (int, float)) and expected > 0 and records
            and elapsed < FAST_FINISH_FRACTION * expected):
        attention.append(_attention("fast_finish", "finished in %ds, under %d%% of the expected %ds: probable "
                                    "failure, verify before trusting" % (elapsed, FAST_FINISH_FRACTION * 100,
                                                                         expected),
                                    elapsed_s=_round(elapsed), expected_duration_s=expected))
    return doc


def _heartbeat_check(doc, facts, job, warnings):
    age = facts.get("heartbeat_age_s")
    interval = job.get("heartbeat_interval_s") or 5
    limit = max(10 * interval, 120)
    if age is not None and age > limit:
        warnings.append("the wrapper pid is alive but its heartbeat is %ds old (hung wrapper or a reused pid?)"
                        % age)


def _disk_full(facts, attention):
    full = []
    for mount in facts.get("mounts") or []:
        for key, label in (("bytes_pct", "bytes"), ("inodes_pct", "inodes")):
            value = mount.get(key)
            if isinstance(value, (int, float)) and value >= DISK_PCT_MAX:
                full.append("%s %s %s%%" % (mount.get("path"), label, value))
    if full:
        attention.append(_attention("disk_full", "disk at or above %d%%: %s (prune scratch or expand; a save may "
                                    "fail mid-write)" % (DISK_PCT_MAX, "; ".join(full)), mounts=full))


def _oom(facts, attention, baseline):
    now_kills = (facts.get("cgroup") or {}).get("oom_kill")
    if isinstance(now_kills, int) and now_kills > baseline:
        attention.append(_attention("oom_kill", "the cgroup OOM-killed %d process(es) since launch (oom_kill %d, "
                                    "baseline %d): host-RAM OOM, size num_workers vs memory.max"
                                    % (now_kills - baseline, now_kills, baseline),
                                    oom_kill=now_kills, baseline=baseline))


def _round(value):
    if isinstance(value, float):
        return round(value, 1)
    return value


# ---------------------------------------------------------------- Slurm (detach sbatch)

SLURM_PREEMPTED = ("PREEMPTED", "NODE_FAIL", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED")
TIMEOUT_ADVICE = ("checkpoint before the limit: the wrapper forwards Slurm's --signal=B:TERM@<grace_s> warning, "
                  "so save at the next step boundary on SIGTERM, or ask for more time (rgt_job.slurm.time)")
NEAR_LIMIT_S = 90  # Slurm checks limits and --signal about every 30 s; the warning may come up to 60 s early


def _near_limit(slurm, job):
    """True when the job ran to within grace_s + NEAR_LIMIT_S of its time limit (the B:TERM warning's window)."""
    limit = rgt_slurm.duration_s(slurm.get("time_limit"))
    ran = rgt_slurm.duration_s(slurm.get("run_time"))
    if limit is None or ran is None:
        return False
    grace = (job or {}).get("grace_s") or 30
    return ran >= limit - (grace + NEAR_LIMIT_S)


def with_slurm(doc, slurm, job=None):
    """The status of a run under Slurm: Slurm's view (rgt_slurm.observe) reconciled with the wrapper's records on
    the shared filesystem. PENDING is `queued` with Slurm's reason; PREEMPTED, NODE_FAIL and the REQUEUE states
    are `preempted`; RUNNING is `running` (or `stalled` by the log, as on any box); TIMEOUT, or a job whose
    wrapper stopped on Slurm's warning signal near the time limit, is `timeout` (attention, with the advice to
    checkpoint before the limit); OUT_OF_MEMORY is `oom` (attention); an ended job otherwise keeps the state its
    exit record gives (finished, failed), and one with no exit record is failed (it ended non-zero) or dead. The
    login node's pids and boot id say nothing about a compute node: their evidence is not used. doc unchanged
    when slurm is None (the run was not submitted through Slurm)."""
    if not slurm:
        return doc
    warnings = doc["warnings"]
    attention = doc["attention"]
    doc["slurm"] = dict((k, slurm.get(k)) for k in ("job_id", "known", "state", "reason", "exit_rc", "exit_signal",
                                                     "restarts", "time_limit", "run_time", "nodes", "error"))
    if slurm.get("known") is None:
        warnings.append("Slurm could not say what job %s is doing (%s): the state comes from the wrapper's records "
                        "alone" % (slurm.get("job_id"), slurm.get("error")))
        return doc
    # the login node is not the compute node: a changed boot id or a dead pid there is no evidence here
    warnings[:] = [w for w in warnings if not w.startswith("the box restarted since attempt")
                   and not w.startswith("the wrapper is gone but the job process")]
    exit_doc = (doc.get("evidence") or {}).get("exit") or {}
    reason = exit_doc.get("reason")
    state = slurm.get("state") if slurm.get("known") else None
    restarts = slurm.get("restarts") or 0
    if state in SLURM_PREEMPTED:
        doc["state"] = "preempted"
    elif state in rgt_slurm.PENDING:
        doc["state"] = "queued"
        doc["queue_reason"] = slurm.get("reason")
        if restarts:
            warnings.append("Slurm requeued job %s (%d restart%s): the next attempt resumes from the newest "
                            "checkpoint when it runs" % (slurm["job_id"], restarts, "" if restarts == 1 else "s"))
    elif state in rgt_slurm.ACTIVE:
        if reason not in rgt_states.SELF_ENDS and doc["state"] != "stalled":
            doc["state"] = "running"  # also between two attempts of a requeue: the new wrapper is starting
    elif state == "TIMEOUT" or (state in ("COMPLETED", "FAILED") and reason == "preempted"
                                and _near_limit(slurm, job)):
        doc["state"] = "timeout"
        attention.append(_attention("timeout", "Slurm job %s reached its time limit (%s, ran %s): %s"
                                    % (slurm["job_id"], slurm.get("time_limit"), slurm.get("run_time"),
                                       TIMEOUT_ADVICE), job_id=slurm["job_id"]))
    elif state == "OUT_OF_MEMORY":
        doc["state"] = "oom"
        attention.append(_attention("oom", "Slurm job %s ran out of memory: raise rgt_job.slurm.mem (MaxRSS x 1.2) "
                                    "or lower the job's memory use" % slurm["job_id"], job_id=slurm["job_id"]))
    elif exit_doc and reason in rgt_states.SELF_ENDS:
        pass  # the wrapper's exit record already decided finished / failed
    elif state == "CANCELLED":
        doc["state"] = "dead"
        warnings.append("Slurm job %s was cancelled (scancel)" % slurm["job_id"])
    elif state in ("COMPLETED", "FAILED", "BOOT_FAIL", "DEADLINE", "SPECIAL_EXIT") or state is None:
        if not exit_doc:
            failed = state in ("FAILED", "BOOT_FAIL", "DEADLINE") or (slurm.get("exit_rc") or 0) != 0
            doc["state"] = "failed" if failed else "dead"
            warnings.append("Slurm job %s %s without the wrapper's exit record%s" % (
                slurm["job_id"], "is %s" % state if state else "is no longer known to Slurm",
                " (exit %s:%s)" % (slurm.get("exit_rc"), slurm.get("exit_signal")) if state else ""))
    return doc
