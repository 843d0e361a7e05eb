"""How a run's last attempt ended by a signal, in the user's words, and the command that comes next (docs/job-spec.md
"How a run ends"). `status` and `watch` print one line per such run and put the command in its document
(`next`); the rule of what starts a run again is the box's (rgt_runlayout.may_start): a preempted run resumes with
`train` (or `watch`, when the job says auto_resume), a killed one only with `retry`."""

from __future__ import annotations

import shlex
import signal

from rich.markup import escape

from rgt import paths

_states = paths.module_util("rgt_states")  # signal_shown: the states of a run a signal may have ended
STOP_SIGNALS = ("SIGTERM", "SIGINT", "SIGHUP")  # the wrapper's (roles/launch_detached/files/rgt_wrapper.py)


def signal_name(number: object) -> str:
    try:
        return signal.Signals(int(number)).name
    except (TypeError, ValueError):
        return f"signal {number}"


def how_it_ended(exit_doc: dict) -> str | None:
    """What ended the attempt, when a signal did (a stop, or a death by another signal); None otherwise."""
    reason, rc, sig, stop = (exit_doc.get(k) for k in ("reason", "rc", "signal", "stop_signal"))
    if reason == "preempted":
        if stop:
            return (f"the wrapper got {stop} (a stop: the platform, a container stop, Ctrl-C in its tmux pane) and "
                    f"passed it to the job (rc {rc})")
        if sig:
            return (f"the job ended by {signal_name(sig)} (rc {rc}): only the job's own processes got the stop "
                    "signal")
        return f"RGT_PREEMPT_FILE appeared and the job stopped (rc {rc})"
    if reason == "killed" and sig:
        why = ": the OOM killer or `kill -9`" if signal_name(sig) == "SIGKILL" else ""
        return f"the job was killed by {signal_name(sig)} (rc {rc}{why})"
    return None


def _args(args, host) -> str:
    """`-i INV` and the -e the user gave (else `-e @job.yml` for a run remembered from the ledger: train needs its
    job spec again; an inventory's own job needs none)."""
    words = ["-i", str(args.inventory)]
    extra = list(getattr(args, "extra_vars", None) or [])
    for value in extra:
        words += ["-e", value]
    if not extra and host is not None and getattr(host, "recalled", None):
        words += ["-e", "@job.yml"]
    return " ".join(shlex.quote(w) for w in words)


def next_step(doc: dict, args, host=None, watching: bool = False) -> tuple[str, str] | None:
    """(what happened, the command to run) for a run whose last attempt ended by a signal; None for any other."""
    exit_doc = (doc.get("evidence") or {}).get("exit") or {}
    what = how_it_ended(exit_doc)
    if what is None or doc.get("state") not in _states.SIGNAL_SHOWN:
        return None
    attempt = exit_doc.get("attempt") or doc.get("attempt")
    run = str(doc.get("run_id") or "")
    if doc["state"] == "preempted":
        train = f"rgt-run train {_args(args, host)}"
        if doc.get("auto_resume") and not watching:
            command = (f"rgt-run watch -i {shlex.quote(str(args.inventory))} resumes it from its newest checkpoint "
                       f"(auto_resume), or `{train}` now")
        else:
            command = f"`{train}` resumes it from its newest checkpoint"
        return f"attempt {attempt} preempted: {what}", command
    inv = shlex.quote(str(args.inventory))
    return (f"attempt {attempt} failed: {what}",
            f"read `rgt-run logs -i {inv} --run {shlex.quote(run)}`, then `rgt-run retry -i {inv} {shlex.quote(run)}` "
            "runs it once more from its newest checkpoint (train never does)")


def annotate(docs: dict[str, dict], hosts: list, args, console, watching: bool = False) -> None:
    """Print `HOST: what happened. next: command` for every run (a host's, and the other runs seen on it) that ended
    by a signal, and put the command in its document as `next`."""
    by_name = {h.name: h for h in hosts}
    for name, host_doc in sorted(docs.items()):
        runs = [host_doc, *(host_doc.get("other_runs") or [])]
        for doc in runs:
            found = next_step(doc, args, by_name.get(name), watching)
            if found is None:
                continue
            what, command = found
            doc["next"] = command
            label = name if len(runs) == 1 else f"{name}:{doc.get('run_id')}"
            console.print(f"  [yellow]{escape(label)}[/yellow]: {escape(what)}. next: {escape(command)}",
                          highlight=False)
