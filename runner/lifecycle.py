"""`rgt-run lifecycle`: train -> watch -> pull -> teardown, each phase the same command a user could run alone.

Every phase is idempotent, so running the lifecycle again resumes where it stopped: a live run is watched, not
started twice; a verified pull is re-verified, not re-sent; teardown still needs the typed confirmation (or
`--confirm <instance-id>`), and a profile whose meter-stop verb is `none` (local) has nothing to stop.
"""

from __future__ import annotations

import argparse
import json
import sys

from rich.console import Console

from rgt import errors, paths

HELP = "train, watch, pull and teardown in one go; run it again to resume where it stopped"
DESCRIPTION = """\
The whole life of a run in one command: train (smoke, probe, check, upload, start detached), watch until it
settles, pull and verify the results, then teardown. Each step is the same as the command of that name, and each
is safe to repeat, so running the lifecycle again resumes where it stopped: a live run is watched, not started
twice; a verified pull is checked again, not sent again; teardown still needs the instance id typed (or
--confirm INSTANCE_ID). On a platform with nothing to stop (your own machine) there is no teardown step."""


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--interval", type=float, default=30.0, metavar="SECONDS",
                   help="seconds between looks while watching (30)")
    p.add_argument("--max-ticks", dest="max_ticks", type=int, default=2880, metavar="N",
                   help="give up watching after this many looks (2880: a day at 30 s)")
    p.add_argument("--runs-dir", metavar="DIR", help="where the results land (default $RGT_RUNS_DIR or ./runs)")
    p.add_argument("--confirm", action="append", default=[], metavar="INSTANCE_ID",
                   help="confirm the teardown of this exact instance (repeat per host)")


def _stop_verbs(args: argparse.Namespace) -> set[str]:
    from rgt.inventory import load_hosts

    return {h.profile["meter_stop"]["verb"] for h in load_hosts(args.inventory, args.limit)}


def cmd_lifecycle(args: argparse.Namespace, console: Console) -> int:
    from rgt import pull, status, teardown
    from rgt.cli import prepare
    from rgt.ledger import ledger_dir, runs_dir
    from rgt.phases import run_playbook
    from rgt.report import first_contact, summarize

    quiet = {**vars(args), "json": False}
    done: list[dict] = []

    def step(phase: str, code: int) -> int:
        done.append({"phase": phase, "exit_code": code})
        return code

    # 1. train: smoke -> probe -> env_check -> upload_resume -> launch_detached
    console.rule("train")
    ns = argparse.Namespace(**quiet, playbook=str(paths.PLAYBOOKS_DIR / "train.yml"), tags=None, check=False,
                            skip_tags=None)
    playbook, hosts, extravars = prepare(ns)
    runs_dir(args.runs_dir)  # a bad --runs-dir is refused now, not after the training
    ledger = ledger_dir(args.ledger)
    first_contact(console, ledger, hosts)
    result = run_playbook(playbook, args.inventory, hosts, ledger=ledger, console=console, extravars=extravars,
                          limit=args.limit, verbosity=args.verbose)
    code = step("train", summarize(console, result, hosts, ledger, args.inventory)["exit_code"])
    # 2. watch until every run settles (auto-resume relaunches preempted runs)
    if code == errors.OK:
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
    if args.json:
        sys.stdout.write(json.dumps({"command": "lifecycle", "phases": done, "exit_code": code}) + "\n")
    return code
