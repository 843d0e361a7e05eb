"""The interface every engine implements: how a host's run is planned, launched, looked at, relaunched, read,
pulled and stopped. The commands call these operations on the engine of each host (rgt.engines.engine_of) and
hold no per-engine branch; an engine is a subclass here, chosen through the registry (its detach primitive).

Every operation takes the hosts of its own engine only (rgt.engines.split groups them) and the command's
arguments where a play needs them (the inventory, -v). An operation that does not apply to an engine has the
default below (nothing to refuse, nothing extra to plan).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

from rich.console import Console

from rgt import sshround
from rgt.phases import PhaseResult


@dataclass
class LogSource:
    """One host's log as `rgt-run logs` reads it (rgt.logs prints it): over the status round's SSH connection
    (`target`, `params`: rgt_logread on the box), or, with `argv`, from a program run here (kubectl logs) whose
    failure `explain` reads ({state, error}) and whose output is `what`. The rest is the reading's state."""

    host: str
    target: sshround.Target | None
    params: dict
    argv: list[str] | None = None
    what: str | None = None
    explain: Callable[[list[str], str], dict] | None = None
    prefix: str = ""
    offset: int | None = None
    partial: bytes = b""  # the line being read, up to LINE_CAP bytes
    cut: int = 0  # bytes of that line past LINE_CAP, left out
    lines: list[str] | None = None  # --json: the lines are kept here for the document instead of printed
    header: dict = field(default_factory=dict)


class StopInterrupted(Exception):  # noqa: N818 - it is what happened, not an error
    """Ctrl-C while `stop` ran: rgt.teardown reports, per instance, what the ledger says was requested."""

    def __init__(self, instances: list):
        super().__init__("interrupted")
        self.instances = instances


class Engine:
    """One way of running a job on a host (SkyPilot's Backend, pyinfra's BaseConnector are the models)."""

    name: ClassVar[str]  # for people: the word in docs and messages
    over_ssh: ClassVar[bool] = True  # reached over SSH: host keys pinned, secrets read here, rsync moves files
    programs: ClassVar[tuple[str, ...]] = ()  # controller programs it needs beyond ssh/rsync (rgt.prepare)
    code_in_image: ClassVar[bool] = False  # may a run ship no code (it is in the image)?
    reports_after_pull: ClassVar[bool] = True  # does a verified pull make the run's report (it reads the box)?

    # ------------------------------------------------------------ choice
    @classmethod
    def drives(cls, entry) -> bool:
        """Does this engine run a host whose detach primitive is `entry` (rgt_registry.Entry; None: the profile
        names no registered primitive, e.g. `auto`)?"""
        raise NotImplementedError

    # ------------------------------------------------------------ plan
    def plan(self, stem: str, hosts: list) -> object:
        """Before anything is touched: refuse a playbook this engine does not run on `hosts`, validate what the
        launch needs (InputError: exit 2, nothing changed). Returns what `play` needs of it (None: nothing)."""
        return None

    def plan_manifests(self, host, job: dict, run_paths, scratch_root: str | None, code_src: str | None,
                       ignore_file: str | None) -> dict | None:
        """What `train -C` shows of a host beyond its run's layout (the Kubernetes manifests, validated): None."""
        return None

    # ------------------------------------------------------------ launch
    def play(self, playbook: Path, hosts: list, planned: object, args: argparse.Namespace, extravars: dict,
             ledger: Path, console: Console, limit: str | None) -> PhaseResult:
        """`rgt-run <playbook>` on `hosts`: the play's result, one HostOutcome per host (launches remembered in
        the ledger)."""
        raise NotImplementedError

    def relaunch(self, args: argparse.Namespace, console: Console, hosts: list, extravars: dict,
                 ledger: Path) -> int:
        """watch's auto_resume on `hosts` (prepared as a launch, the code each run ran): the exit code."""
        raise NotImplementedError

    def check_retry(self, cell: str, host) -> None:
        """`rgt-run retry` of a failed run on `host`: raise InputError when this engine never starts one again."""

    # ------------------------------------------------------------ observe
    def observe(self, args: argparse.Namespace, console: Console, hosts: list, extravars: dict,
                ledger: Path) -> dict[str, dict]:
        """One look at each host's run: {host: status document} (rgt.observe's shapes, seen now; rgt.engines.poll
        records them)."""
        raise NotImplementedError

    # ------------------------------------------------------------ logs
    def log_sources(self, args: argparse.Namespace, hosts: list, extravars: dict) -> list[LogSource]:
        """What `rgt-run logs` reads on `hosts` (args.run, args.tail and args.follow checked already)."""
        raise NotImplementedError

    # ------------------------------------------------------------ stop
    def assess(self, instances: list, args: argparse.Namespace, extravars: dict, ledger: Path, runs: Path,
               console: Console, manifest_lib) -> dict[str, dict]:
        """teardown's read-only look: {instance id: its plan} (the verb, the gate over every run it holds, a
        status: ready, refused, unreachable, failed, already gone, in flight). Ctrl-C: KeyboardInterrupt, nothing
        asked or called."""
        raise NotImplementedError

    def stop(self, instances: list, plans: dict[str, dict], confirmed: list[str], resumed: list[str],
             args: argparse.Namespace, extravars: dict, ledger: Path, runs: Path, console: Console, manifest_lib,
             done: Callable[[str, dict], None]) -> list[int]:
        """Stop the `confirmed` instances (after the person typed each id) and poll the `resumed` ones (a stop in
        flight), each looked at and gated again first; `done(instance id, outcome)` as each ends. The exit codes;
        StopInterrupted on Ctrl-C."""
        raise NotImplementedError

    # ------------------------------------------------------------ collect
    def collect(self, playbook: Path, hosts: list, args: argparse.Namespace, extravars: dict, ledger: Path,
                runs: Path, console: Console) -> PhaseResult:
        """`rgt-run pull` of the run each host points at: a PhaseResult whose hosts carry a `collect_report`."""
        raise NotImplementedError

