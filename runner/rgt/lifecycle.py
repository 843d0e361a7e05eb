"""`rgt-run lifecycle`: train -> watch -> pull -> teardown, each phase the same command a user could run alone.

Running the lifecycle again resumes where it stopped (`resume_point`): when the ledger remembers the job's runs on
the hosts, one status round looks at them first: every run finished goes straight to pull (no smoke, probe,
env_check or upload again); runs still live (or one that needs attention) go to watch; anything else (never
started, preempted, dead, failed, unreachable) trains again, which resumes what can be resumed. With no job spec at
all (none with -e, none in the inventory) there is nothing to train: the runs the ledger remembers are watched,
pulled and torn down. Every phase is idempotent: a live run is watched, not started twice; a verified pull is
re-verified, not re-sent; teardown still needs the typed confirmation (or `--confirm <instance-id>`), and a
profile whose meter-stop verb is `none` (local) has nothing to stop.
"""

from __future__ import annotations

import argparse

from rich.console import Console

from rgt import errors, memory, output, paths, pull, rosters, status, teardown
from rgt.engines import poll
from rgt.inventory import load_hosts
from rgt.ledger import ledger_dir, runs_dir
from rgt.phases import run_playbook
from rgt.prepare import prepare, prepare_hosts
from rgt.report import first_contact, summarize

HELP = "train, watch, pull and teardown in one go; run it again to resume where it stopped"
DESCRIPTION = """\
The whole life of a run in one command: train (smoke, probe, check, upload, start detached), watch until it
settles, pull and verify the results, then teardown. Each step is the same as the command of that name, and each
is safe to repeat, so running the lifecycle again resumes where it stopped: a finished run goes straight to pull
(nothing is smoked, probed, checked or uploaded again), a live run is watched, not started twice; a verified pull
is checked again, not sent again; teardown still needs the instance id typed (or --confirm INSTANCE_ID). Without
a job spec it acts on the runs rgt remembers on each box (watch, pull, teardown). On a platform with nothing to
stop (your own machine) there is no teardown step."""


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--interval", type=float, default=30.0, metavar="SECONDS",
                   help="seconds between looks while watching (30)")
    p.add_argument("--max-ticks", dest="max_ticks", type=int, default=2880, metavar="N",
                   help="give up watching after this many looks (2880: a day at 30 s)")
    p.add_argument("--runs-dir", metavar="DIR", help="where the results land (default $RGT_RUNS_DIR or ./runs)")
    p.add_argument("--confirm", action="append", default=[], metavar="INSTANCE_ID",
                   help="confirm the teardown of this exact instance (repeat per host)")


def _stop_verbs(args: argparse.Namespace) -> set[str]:
    return {h.profile["meter_stop"]["verb"] for h in load_hosts(args.inventory, args.limit)}


_states = paths.module_util("rgt_states")  # live: the run runs or will run


def _remembered(ledger, hosts: list) -> bool:
    """Did this ledger launch the hosts' job before (a run of its id, or the sweep's roster)?"""
    for host in hosts:
        job = host.vars.get("rgt_job")
        if not isinstance(job, dict):
            continue
        name = job.get("run_id") or job.get("name")
        if job.get("sweep") and rosters.read_roster(ledger, host.project, name) is not None:
            return True
        if any(r.get("project") == host.project and r.get("run_id") == name
               for r in memory.runs_of(ledger, host.name)):
            return True
    return False


def resume_point(runs: list[dict]) -> str:
    """Where a lifecycle run again starts, from the status of the job's runs: "pull" when every one finished,
    "watch" when they are finished or live or one needs attention (watch says so), else "train"."""
    states = [r.get("state") for r in runs]
    if not runs:
        return "train"
    if any(r.get("attention") for r in runs) and all(s == "finished" or _states.is_live(s) for s in states):
        return "watch"
    if all(s == "finished" for s in states):
        return "pull"
    if all(s == "finished" or _states.is_live(s) for s in states):
        return "watch"
    return "train"


def cmd_lifecycle(args: argparse.Namespace, console: Console) -> int:
    quiet = {**vars(args), "json": False}
    done: list[dict] = []

    def step(phase: str, code: int) -> int:
        done.append({"phase": phase, "exit_code": code})
        return code

    # 1. train: smoke -> probe -> env_check -> upload_resume -> launch_detached (unless the runs are past it)
    ns = argparse.Namespace(**quiet, playbook=str(paths.PLAYBOOKS_DIR / "train.yml"), tags=None, check=False,
                            skip_tags=None)
    playbook, hosts, extravars = prepare(ns)
    runs_dir(args.runs_dir)  # a bad --runs-dir is refused now, not after the training
    ledger = ledger_dir(args.ledger)
    first_contact(console, ledger, hosts)
    start = "train"
    if not any(isinstance(h.vars.get("rgt_job"), dict) for h in hosts):
        start = "watch"
        console.print("lifecycle: no job spec given (-e @job.yml) and none in the inventory: nothing to train; "
                      "watching, pulling and tearing down the runs rgt remembers on these hosts")
    elif _remembered(ledger, hosts):  # run again: look at the job's runs before doing anything twice
        looked, look_vars = prepare_hosts(argparse.Namespace(**quiet))
        docs = poll(argparse.Namespace(**quiet), console, looked, look_vars, ledger)
        start = resume_point(status.every_run(docs))
        if start != "train":
            states = ", ".join(f"{r.get('run_id')}: {r.get('state')}" for r in status.every_run(docs))
            console.print(f"lifecycle: resuming at {start} ({states}): smoke, probe, env_check and upload are "
                          "not done again")
    code = errors.OK
    if start == "train":
        console.rule("train")
        result = run_playbook(playbook, args.inventory, hosts, ledger=ledger, console=console, extravars=extravars,
                              limit=args.limit, verbosity=args.verbose)
        code = step("train", summarize(console, result, hosts, ledger, args.inventory)["exit_code"])
    # 2. watch until every run settles (auto-resume relaunches preempted runs)
    if code == errors.OK and start in ("train", "watch"):
        console.rule("watch")
        code = step("watch", status.cmd_watch(argparse.Namespace(**quiet), console))
    # 3. pull the sealed export and verify it locally
    if code == errors.OK:
        console.rule("pull")
        code = step("pull", pull.cmd_pull(argparse.Namespace(**quiet, verify_only=False), console))
    # 4. teardown, gated by the verified pull and the user's confirmation
    if code == errors.OK:
        console.rule("teardown")
        if _stop_verbs(args) == {"none"}:
            console.print("teardown: nothing to stop on this profile (no meter runs); the results are in "
                          f"{runs_dir(args.runs_dir)}")
            step("teardown", errors.OK)
        else:
            code = step("teardown", teardown.cmd_teardown(argparse.Namespace(**quiet), console))
    output.emit({"command": "lifecycle", "phases": done, "resumed_at": start, "exit_code": code}, args.json)
    return code
