# -*- coding: utf-8 -*-
# Copyright: rgt contributors
# SPDX-License-Identifier: Apache-2.0
"""The run-state vocabulary, one home (docs/internals.md "Run states", generated from this file).

Four vocabularies, every word with what it means and who says it, then the groups each rule uses, the maps from one
vocabulary to another and the display styles:
- run states: a status document's `state`: the box's (rgt_reconcile, with_slurm and with_queue on the box;
  rgt.k8s_engine.job_state for a Kubernetes Job) and the runner's own two (unreachable, error);
- end reasons: how one attempt ended (exit.json and the end lines of attempts.jsonl, written by the wrapper), and
  `never` for a run that never started (rgt_runlayout.last_state's words);
- gate states: a run as the teardown gate judges it (rgt_box_runs lists them, rgt_gate.judge_run judges them);
- cell states: a sweep cell in its sweep's tally (rgt.sweeps.tally).

A new run state is one RunState entry here (its meaning, who reports it, its style, its cell and gate words) plus
the groups it joins, the code that produces it, and the generated table in docs/internals.md.

Python 3.6+, standard library only: it runs on the box too (rgt_runlayout and rgt_reconcile import it; the launch
installs it beside the wrapper and the sweep queue, the Kubernetes stage and seal ConfigMaps carry it).
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

from collections import namedtuple

# ---------------------------------------------------------------- run states

class RunState(namedtuple("RunState", "name means by style notify_color cell gate")):
    """One word of a status document's `state`: what it means, who reports it (`by`), how status shows it
    (`style`: a rich colour) and notify (`notify_color`: an attachment colour of Slack-compatible webhooks), and
    what it is to a sweep's tally (`cell`: CELL_STATES) and to the teardown gate for a run the runner looked at
    itself (`gate`: GATE_STATES, a Kubernetes Job: rgt.k8s_run)."""

    __slots__ = ()


GREY = "#9e9e9e"  # a notification with no colour of its own

RUN_STATES = (
    RunState("running",
             "an attempt is under way: its wrapper (or, with a warning, the job alone) is alive under this boot, "
             "or the scheduler runs it",
             "the box (rgt_reconcile; under Slurm RUNNING, COMPLETING, ...: with_slurm); Kubernetes (a Running pod: "
             "rgt.k8s_engine.job_state); the launch's result",
             "green", "#1565c0", "running", "live"),
    RunState("stalled",
             "alive, but the log and the newest checkpoint are older than stall_after_s and no GPU is busy "
             "(attention `stalled`)",
             "the box (rgt_reconcile)",
             "yellow", "warning", "running", "live"),
    RunState("finished",
             "the last attempt exited 0, no stop reached it, and every declared output is there",
             "the box (its exit record: rgt_reconcile; under Slurm COMPLETED with it); Kubernetes (the Job is "
             "Complete); the launch's result (a run that finished is never started again)",
             "green", "good", "finished", "finished"),
    RunState("failed",
             "the last attempt exited non-zero or was killed by a signal that is no stop signal, or said success "
             "with a declared output missing (attention `outputs_missing`); only `rgt-run retry` starts it again",
             "the box (rgt_reconcile; under Slurm FAILED without an exit record: with_slurm); Kubernetes (a Failed "
             "Job); the launch's result",
             "red", "danger", "failed", "failed"),
    RunState("preempted",
             "a stop reached the last attempt (a stop signal, RGT_PREEMPT_FILE) or the box restarted under it; "
             "under Slurm PREEMPTED, NODE_FAIL or a REQUEUE state; on Kubernetes its pod was evicted or preempted. "
             "`rgt-run train` resumes it, `watch` too when the job says auto_resume",
             "the box (rgt_reconcile, with_slurm); Kubernetes (rgt.k8s_engine.job_state); the launch's result",
             "yellow", "warning", "preempted", "preempted"),
    RunState("budget_stopped",
             "the run's spend reached rgt_job.budget_usd: watch asked it to checkpoint and stop (RGT_PREEMPT_FILE "
             "with the budget marker) and it stopped. Only `rgt-run retry` with a higher budget_usd starts it "
             "again (from its newest checkpoint); train and watch never do",
             "the box (rgt_reconcile: the wrapper's end reason budget_stopped; a sweep cell its sweep's budget "
             "marker holds, stop_reason budget_held: with_budget_hold); watch's stop (rgt.budget)",
             "yellow", "warning", "budget_stopped", "budget_stopped"),
    RunState("dead",
             "the wrapper vanished without an exit record under the same boot (SIGKILL, the OOM killer took the "
             "wrapper); under Slurm CANCELLED, or ended without an exit record and exit 0. `rgt-run train` resumes "
             "it",
             "the box (rgt_reconcile, with_slurm); the launch's result",
             "red", "danger", "preempted", "dead"),
    RunState("not_started",
             "nothing of the run ever ran: job.json with no attempt (a sweep cell no queue started), a Kubernetes "
             "Job that does not exist, a Kubernetes host with no run launched from this ledger",
             "the box (rgt_reconcile, with_queue); Kubernetes (no such Job); the runner (rgt.k8s_run); the "
             "launch's result (nothing started)",
             "dim", GREY, "missing", "never"),
    RunState("queued",
             "waiting to start: Slurm PENDING (queue_reason says why), a Kubernetes Job with no running pod yet, a "
             "sweep cell its sweep's live queue will start",
             "the box (with_slurm, with_queue); Kubernetes (rgt.k8s_engine.job_state); the launch's result",
             "cyan", GREY, "queued", "live"),
    RunState("timeout",
             "the scheduler ended it at its time limit (Slurm TIMEOUT, or the wrapper stopped on Slurm's warning "
             "signal near the limit; Kubernetes activeDeadlineSeconds): attention `timeout`",
             "the box (with_slurm); Kubernetes (rgt.k8s_engine.job_state)",
             "red", GREY, "failed", "failed"),
    RunState("oom",
             "out of memory: Slurm OUT_OF_MEMORY, or a Kubernetes container OOMKilled (attention `oom`)",
             "the box (with_slurm); Kubernetes (rgt.k8s_engine.job_state)",
             "red", GREY, "failed", "failed"),
    RunState("unreachable",
             "the runner could not reach the host (SSH failed, the cluster did not answer): it says nothing about "
             "the job, and is never turned into a job state",
             "the runner (rgt.status, rgt.k8s_run, rgt.logs)",
             "magenta", "#9c27b0", "unreachable", "unknown"),
    RunState("error",
             "the runner reached the host but got no status document (a module error, a play that returned "
             "nothing)",
             "the runner (rgt.status, rgt.k8s_run, rgt.logs)",
             "red", GREY, "failed", "unknown"),
)
STATE = dict((s.name, s) for s in RUN_STATES)
STATES = tuple(s.name for s in RUN_STATES)
# what the box (or the cluster) says of a run: rgt_reconcile's states, Slurm's and Kubernetes' mapped ones
BOX_STATES = ("running", "stalled", "finished", "failed", "preempted", "budget_stopped", "dead", "not_started",
              "queued", "timeout", "oom")
RUNNER_STATES = ("unreachable", "error")  # the runner's own words for a host it got no document from

# the map of every run state to a sweep cell's word (rgt.sweeps.tally), and to the teardown gate's (rgt.k8s_run)
CELL_VIEW = dict((s.name, s.cell) for s in RUN_STATES)
GATE_VIEW = dict((s.name, s.gate) for s in RUN_STATES)
STYLE = dict((s.name, s.style) for s in RUN_STATES)
STYLE_OTHER = "white"  # a word this version does not know (a newer box's)


# ---------------------------------------------------------------- groups of run states

GROUPS = []  # (name, members, what it means and who uses it): docs/internals.md "Run states" lists them


def _group(name, members, means):
    GROUPS.append((name, tuple(members), means))
    return tuple(members)


TERMINAL = _group("terminal", ("finished", "failed", "preempted", "budget_stopped", "dead", "not_started", "timeout",
                               "oom", "error"),
                  "ended: nothing more happens without someone starting it again; watch stops looking at it (a "
                  "preempted run it resumes first, when the job says auto_resume: rgt.status.is_terminal)")
FAILED = _group("failed", ("failed", "preempted", "budget_stopped", "dead", "not_started", "timeout", "oom",
                           "error"),
                "ended without finishing: status and watch exit 1 (rgt.status.exit_code)")
LIVE = _group("live", ("running", "stalled", "queued"),
              "not ended: it runs or will run (lifecycle goes on to watch, not pull; a retry that left it so worked)")
ACTIVE = _group("active", ("running", "stalled"),
                "an attempt's process is alive now: its wall time and the box's bill grow (rgt.runs, rgt.runreport)")
SETTLED = _group("settled", ("finished", "failed", "dead"),
                 "nothing on the box can change its figures any more: the report reuses the document saved last "
                 "(rgt.runreport)")
EXPLAINED = _group("explained", ("failed", "dead", "error"),
                   "the one-glance line and watch's end say why (its exit code, its log's last error: "
                   "rgt.runreport.failure_bits)")
GLANCE = _group("glance", ("running", "stalled", "preempted", "budget_stopped", "failed", "dead", "not_started",
                          "error", "unreachable"),
                "counted by the one-glance line after `n/N finished`, in this order (rgt.runreport.glance)")
NOTIFY_STATES = _group("notify", ("running", "stalled", "finished", "failed", "preempted", "budget_stopped", "dead",
                                  "not_started"),
                       "a notify rule may ask for it in `on` (rgt.notify; the job schema's enum is filled in "
                       "from it)")
NOTIFY_DEFAULT = _group("notify_default", ("finished", "failed", "preempted", "budget_stopped", "dead"),
                        "sent by a notify rule that names no `on` (with attention)")
SWEEP_SHARE_ENDS = _group("share_ends", ("failed", "preempted", "dead"),
                          "a host's share of a sweep that settled unfinished reads as the first of these its cells "
                          "show, else not_started (rgt_launch.sweep_state)")
NO_START_SEEN = _group("no_start_seen", ("not_started", "unreachable"),
                       "a document in one of these says nothing of a run having started there (rgt.sweeps.tally: "
                       "a cell started on two hosts is a duplicate)")


# ---------------------------------------------------------------- end reasons

class EndReason(namedtuple("EndReason", "name means by shown color")):
    """One word of an attempt's end `reason` (or last_state's `never`): what it means, who writes it, the run
    state status shows for a run whose last attempt ended so (`shown`) and its colour in the report's attempt
    bars (`color`)."""

    __slots__ = ()


WRAPPER = "the wrapper (rgt_wrapper.classify): exit.json and the attempt's end line in attempts.jsonl"

END_REASONS_TABLE = (
    EndReason("finished", "the command exited 0 and no stop reached it", WRAPPER, "finished", "#2e7d32"),
    EndReason("failed", "any other exit status (1, 2, 98 an unreadable secrets file, 97 a missing code dir, ...)",
              WRAPPER, "failed", "#c62828"),
    EndReason("preempted", "a stop reached the attempt, whatever the job's exit status then: a stop signal (SIGTERM, "
              "SIGINT, SIGHUP) to the wrapper or to the job alone, or RGT_PREEMPT_FILE", WRAPPER, "preempted",
              "#f9a825"),
    EndReason("budget_stopped", "RGT_PREEMPT_FILE reached the attempt with the budget marker beside it (watch "
              "stopped the run at 100% of rgt_job.budget_usd: rgt.budget)", WRAPPER, "budget_stopped", "#ef6c00"),
    EndReason("killed", "the job died of a signal that is no stop signal: SIGKILL (the OOM killer, kill -9), "
              "SIGSEGV, SIGABRT, ...", WRAPPER, "failed", "#c62828"),
    EndReason("dead", "the attempt vanished without an end record (the box rebooted, the wrapper was SIGKILLed)",
              "the next wrapper notes it in attempts.jsonl; rgt_runlayout.last_state for a started attempt with no "
              "end record", "dead", "#6d4c41"),
    EndReason("never", "no attempt ever started (not an end reason: rgt_runlayout.last_state's word)",
              "rgt_runlayout.last_state", "not_started", None),
)
REASON = dict((r.name, r) for r in END_REASONS_TABLE)
NEVER = "never"
EXIT_REASONS = ("finished", "failed", "preempted", "budget_stopped", "killed")  # what exit.json may say
END_REASONS = EXIT_REASONS + ("dead",)  # what an attempt's end line may say
LAST_STATES = (NEVER,) + END_REASONS  # rgt_runlayout.last_state: how a run that is not live ended
SHOWN = dict((r.name, r.shown) for r in END_REASONS_TABLE)  # the run state status shows for each
# the report's attempt bars: each end reason's colour, the attempt still running, an end it cannot read
REPORT_COLORS = dict([(r.name, r.color) for r in END_REASONS_TABLE if r.color]
                     + [("running", "#1565c0"), ("unknown", GREY)])

REASON_GROUPS = []


def _reasons(name, members, means):
    REASON_GROUPS.append((name, tuple(members), means))
    return tuple(members)


RESUMED_ENDS = _reasons("resumed", ("preempted", "dead"),
                        "`rgt-run train` starts it again (attempt n+1, from its newest checkpoint), `watch` a "
                        "preempted one with auto_resume (rgt_runlayout.may_start)")
FAILED_ENDS = _reasons("failed", ("failed", "killed"),
                       "status shows `failed`; only `rgt-run retry` starts it again (rgt_runlayout.may_start)")
RETRY_ENDS = _reasons("retry_only", FAILED_ENDS + ("budget_stopped",),
                      "only `rgt-run retry` starts it again (rgt_runlayout.may_start); a budget_stopped run only "
                      "with a budget_usd above what it spent (rgt.budget.check_retry)")
STARTABLE = _reasons("startable", (NEVER,) + RESUMED_ENDS,
                     "a run that is not live and ended so starts again without a retry (rgt_runlayout.may_start, "
                     "the sweep queue)")
SELF_ENDS = _reasons("self_ends", ("finished",) + FAILED_ENDS,
                     "the job ended on its own, no stop reached it: its exit record decides the state whatever the "
                     "scheduler says (rgt_reconcile.with_slurm)")
BILLED_AFTER_END = _reasons("billed_after_end", ("finished", "failed", "budget_stopped", "dead", "killed"),
                            "the last attempt ended so and the box kept billing until its teardown (a preempted "
                            "box went away: rgt.runreport)")
LOST_REASONS = _reasons("lost", ("preempted", "budget_stopped", "killed", "dead", "failed"),
                        "an attempt that ended so and was followed by another lost the steps after its newest "
                        "checkpoint: they were computed again (rgt.runreport's compute lost)")
SIGNAL_ENDS = _reasons("signal_ends", ("preempted", "killed"),
                       "a signal may have ended it: status says which and what comes next (rgt.endings)")


def _shown(words):
    out = []
    for word in words:
        if SHOWN[word] not in out:
            out.append(SHOWN[word])
    return tuple(out)


# the run states of those ends, as status shows them
RESUMED = _group("resumed", _shown(RESUMED_ENDS),
                 "`rgt-run train` starts it again (on Kubernetes: its ended Job is replaced: rgt.k8s_run)")
RESTARTABLE = _group("restartable", _shown(STARTABLE + RETRY_ENDS),
                 "a sweep cell in one of these that its sweep's live queue will start is shown queued "
                 "(rgt_reconcile.with_queue)")
SIGNAL_SHOWN = _group("signal_shown", _shown(SIGNAL_ENDS),
                      "a run whose last attempt a signal may have ended: status says what happened and what comes "
                      "next (rgt.endings.next_step)")


# ---------------------------------------------------------------- notify's events

ATTENTION = "attention"  # a notify event that is no state: a new attention id on a run
BUDGET = "budget"  # a run (or sweep) reached 50, 80 or 100% of rgt_job.budget_usd (rgt.budget)
IDLE_METER = "idle_meter"  # a box with no live run, everything pulled and verified, still billing (rgt.budget)
MOVED = "moved"  # watch moved a run to a spare by itself (offload.spares; rgt.automove), or found no free spare
FENCED = "fenced"  # watch stopped a moved run's stale attempt on a box that came back (rgt.move.fence)
NOTIFY_EVENTS = NOTIFY_STATES + (ATTENTION, BUDGET, IDLE_METER, MOVED, FENCED)  # a notify rule's `on` (job schema)
DEFAULT_ON = NOTIFY_DEFAULT + (ATTENTION, BUDGET, IDLE_METER, MOVED, FENCED)  # a rule that names no `on`
NOTIFY_COLORS = dict([(s.name, s.notify_color) for s in RUN_STATES]
                     + [(ATTENTION, "danger"), (BUDGET, "warning"), (IDLE_METER, "warning"), (MOVED, "warning"),
                        (FENCED, "warning")])


# ---------------------------------------------------------------- gate states

class GateState(namedtuple("GateState", "name means by blocks")):
    """One word of a run as the teardown gate judges it (rgt_gate.judge_run): what it means, who says it, and
    when it refuses the teardown (`blocks`: always, unless_pulled, or exported: only with a sealed export or a
    manifest that no verified pull here matches)."""

    __slots__ = ()


BOX_RUNS = "rgt_box_runs (its last attempt: rgt_runlayout.last_state)"

GATE_STATES_TABLE = (
    GateState("live", "its wrapper holds the run's lock; a Kubernetes Job that runs or is queued",
              "rgt_box_runs (rgt_runlayout.lock_held); rgt.k8s_run", "always"),
    GateState("queued", "a sweep cell its sweep's live queue will still start", "rgt_box_runs "
              "(rgt_runlayout.will_start)", "always"),
    GateState("finished", "its last attempt finished: its result must be pulled first", BOX_RUNS + "; rgt.k8s_run",
              "unless_pulled"),
    GateState("failed", "its last attempt failed", BOX_RUNS + "; rgt.k8s_run", "exported"),
    GateState("preempted", "its last attempt was stopped", BOX_RUNS + "; rgt.k8s_run", "exported"),
    GateState("budget_stopped", "its last attempt was stopped at its budget", BOX_RUNS, "exported"),
    GateState("killed", "its last attempt was killed by a signal that is no stop signal", BOX_RUNS, "exported"),
    GateState("dead", "its last attempt vanished without an end record", BOX_RUNS, "exported"),
    GateState("never", "it never started", BOX_RUNS + "; rgt.k8s_run (not_started)", "exported"),
    GateState("exported", "a sealed export whose run dir is gone", "rgt_box_runs", "exported"),
    GateState("unknown", "no state known: a listing that names none; a Kubernetes run the runner could not read (it "
              "refuses the teardown before any run is judged)", "rgt_gate.judge_run; rgt.k8s_run", "exported"),
)
GATE_STATES = tuple(g.name for g in GATE_STATES_TABLE)


# ---------------------------------------------------------------- cell states

class CellState(namedtuple("CellState", "name means named bad")):
    """One word of a sweep cell in its sweep's tally (rgt.sweeps.tally): what it means and whether the tally line
    names the cells (`named`: failed, missing, duplicate; and the line is red) or the sweep page marks its row
    (`bad`)."""

    __slots__ = ()


CELL_STATES_TABLE = (  # in the order the tally line counts them
    CellState("finished", "its run finished (`n/N finished`; the sweep is done when every cell is)", False, False),
    CellState("running", "its run is running or stalled", False, False),
    CellState("queued", "its run waits for a slot or for the scheduler", False, False),
    CellState("failed", "its run failed, timed out, ran out of memory, or its host gave no document (error): "
              "`rgt-run retry` starts it again",
              named=True, bad=True),
    CellState("budget_stopped", "its run was stopped at the sweep's budget, or its sweep's budget holds it before "
              "it started (budget_held): `rgt-run retry SWEEP` with a higher budget_usd resumes it",
              named=True, bad=True),
    CellState("preempted", "its run was preempted or died: train resumes it", False, False),
    CellState("missing", "seen nowhere on its host, or never started (exit 1)", named=True, bad=True),
    CellState("duplicate", "seen started on two hosts (exit 5)", named=True, bad=True),
    CellState("unreachable", "its host did not answer", False, bad=True),
)
CELL_STATES = tuple(c.name for c in CELL_STATES_TABLE)
CELL_NAMED = tuple(c.name for c in CELL_STATES_TABLE if c.named)
CELL_BAD = tuple(c.name for c in CELL_STATES_TABLE if c.bad)


# ---------------------------------------------------------------- predicates

def is_terminal(state):
    """The run ended (TERMINAL): watch stops looking at it."""
    return state in TERMINAL


def is_failed(state):
    """The run ended without finishing (FAILED): status and watch exit 1."""
    return state in FAILED


def is_live(state):
    """The run runs or will run (LIVE)."""
    return state in LIVE


def from_the_box(state):
    """A state the box itself reported: not the runner's unreachable or error, nor none at all."""
    return state is not None and state not in RUNNER_STATES


def cell_state(state):
    """The word a sweep's tally counts a run in `state` as (a word this version does not know: as it is)."""
    return CELL_VIEW.get(state, state)


def gate_state(state):
    """The gate's word for a run the runner looked at itself in `state` (a word this version does not know: as
    it is)."""
    return GATE_VIEW.get(state, state)


def shown(last_state):
    """The run state status shows for a run that is not live, from rgt_runlayout.last_state's word: never is
    not_started, killed is failed."""
    return SHOWN.get(last_state, last_state)


def style(state):
    """rgt-run status's colour for a state."""
    return STYLE.get(state, STYLE_OTHER)


def notify_color(kind):
    """A notification's attachment colour for its kind (a state, attention, unreachable)."""
    return NOTIFY_COLORS.get(kind, GREY)
