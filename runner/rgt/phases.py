"""Build the ansible-runner call for one playbook, run it in a fresh private data dir, and classify the result."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from rich.console import Console

from rgt import confirmation, errors, memory, paths
from rgt.events import EventSink, HostOutcome
from rgt.inventory import Host, ansible_env, known_hosts_file
from rgt.progress import ProgressTail

_layout = paths.module_util("rgt_runlayout")

# Per-host SSH options: pin by instance id (ports and IPs change on rentals, the instance does not).
SSH_PIN_ARGS = ("-o StrictHostKeyChecking=yes -o UserKnownHostsFile={known_hosts} "
                "-o HostKeyAlias={{{{ rgt_instance_id }}}}")


@dataclass
class PhaseResult:
    playbook: str
    ident: str
    rc: int
    status: str
    hosts: dict[str, HostOutcome] = field(default_factory=dict)
    stats: dict = field(default_factory=dict)
    started: float = 0.0

    @property
    def exit_code(self) -> int:
        """Map what happened to the exit codes (docs/internals.md "Exit codes").

        Identity failures outrank transport failures.
        """
        outcomes = self.hosts.values()
        if any(o.host_key_mismatch or o.gate_refused for o in outcomes):
            return errors.REFUSED
        if any(o.bad_input for o in outcomes):
            return errors.BAD_INPUT
        if any(o.failed for o in outcomes):
            return errors.FAILED
        if any(o.unreachable for o in outcomes):
            return errors.UNREACHABLE
        if self.rc != 0:
            return errors.FAILED
        return errors.OK

    def as_dict(self) -> dict:
        return {"playbook": self.playbook, "ident": self.ident, "status": self.status, "rc": self.rc,
                "exit_code": self.exit_code, "hosts": {h: o.as_dict() for h, o in sorted(self.hosts.items())}}


class Interrupt:
    """Ctrl-C (SIGINT, or SIGTERM) while a play runs: passed on to ansible-playbook as SIGINT, so Ansible stops its
    workers and the modules they run itself. ansible-runner's own cancel SIGKILLs ansible-playbook only, and each
    worker, in a session of its own, would go on running its task in the background (a teardown's poll, an
    rsync). Killed only when the play is still running GRACE_S later, or at a second Ctrl-C."""

    GRACE_S = 20.0
    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self) -> None:
        self.pid: int | None = None  # ansible-playbook's, from its first event
        self.since: float | None = None
        self._saved: dict = {}

    def events(self, handler):
        def on_event(event: dict) -> bool:
            if self.pid is None and isinstance(event.get("pid"), int):
                self.pid = event["pid"]
            return handler(event)
        return on_event

    def _signal(self, signum, frame) -> None:
        if self.since is not None:  # the second Ctrl-C: now
            self.since = float("-inf")
            return
        self.since = time.monotonic()
        if self.pid:
            try:
                os.kill(self.pid, signal.SIGINT)
            except OSError:
                pass

    def __enter__(self) -> Interrupt:
        if threading.current_thread() is not threading.main_thread():
            return self  # only the main thread may handle signals
        self._saved = {sig: signal.getsignal(sig) for sig in self.SIGNALS}
        for sig in self.SIGNALS:
            signal.signal(sig, self._signal)
        return self

    def __exit__(self, *exc) -> None:
        for sig, handler in self._saved.items():
            signal.signal(sig, handler)

    def __call__(self) -> bool:
        """ansible-runner's cancel callback: True kills the play now."""
        if self.since is None:
            return False
        return self.pid is None or time.monotonic() - self.since > self.GRACE_S

    @property
    def interrupted(self) -> bool:
        return self.since is not None


def new_ident(playbook: Path) -> str:
    return f"{datetime.now(UTC).strftime('%Y%m%dT%H%M%SZ')}-{playbook.stem}-{uuid.uuid4().hex[:6]}"


def pin_identity(inventory: str, host: Host) -> str:
    """The identity of the host key pinned for the host's instance (sha256 of its known_hosts lines), which a
    reused probe must have met (roles/probe, rgt_probe_eval.reuse); "local" for a host reached without SSH, ""
    when nothing is pinned (never reused)."""
    if host.is_local:
        return "local"
    alias = host.vars.get("rgt_instance_id")
    try:
        lines = sorted(line.strip() for line in known_hosts_file(inventory, host).read_text().splitlines()
                       if line.strip() and line.split(" ", 1)[0] == alias)
    except OSError:
        return ""
    return hashlib.sha256("\n".join(lines).encode()).hexdigest() if lines else ""


def _overlay_vars(host: Host, inventory: str) -> dict:
    out = {"rgt_profile_data": host.profile, "rgt_pin_id": pin_identity(inventory, host)}
    if host.recalled:
        out.update(rgt_job=host.recalled["job"], monitor_other_run_ids=host.other_runs)
    out.update(host.overlay)
    return out


def run_playbook(playbook: Path, inventory: str, hosts: list[Host], *, ledger: Path, console: Console,
                 extravars: dict | None = None, limit: str | None = None, tags: str | None = None,
                 skip_tags: str | None = None, check: bool = False, quiet: bool = False,
                 verbosity: int = 0) -> PhaseResult:
    """Run one playbook; never leaves secrets or artifacts behind in the private data dir."""
    # ansible_runner: 15 ms of every rgt-run start; only a play needs it (status over the SSH round, logs, runs,
    # profiles and --help run none)
    import ansible_runner

    ident = new_ident(playbook)
    started = time.time()
    ledger_events = ledger / "events" / f"{ident}.jsonl"
    sink = EventSink(console, ledger_events, quiet=quiet)
    private = Path(tempfile.mkdtemp(prefix="rgt-run-"))
    # ansible-runner installs its own SIGINT handler and does not restore it (#1075); ours is passed on (Interrupt)
    saved_sigint = signal.getsignal(signal.SIGINT)
    interrupt = Interrupt()
    env = ansible_env()
    env_overrides = {k: env[k] for k in ("ANSIBLE_CONFIG", "ANSIBLE_COLLECTIONS_PATH", "PATH", "PWD")}
    env_overrides["ANSIBLE_FORCE_COLOR"] = "0"
    # rgt's own virtual environment, named for the local connection's launch: the job wrapper keeps it (and every
    # ANSIBLE_* variable) out of the job's environment (rgt_runlayout.job_base_env)
    if _layout.is_venv(sys.prefix):
        env_overrides[_layout.RUNNER_PREFIX_ENV] = sys.prefix
    evars = dict(extravars or {})
    # a meter stop's confirmation only from `rgt-run teardown` (its channel), whatever the play sets or includes
    evars.update(confirmation.pins(evars.get(confirmation.CHANNEL)))
    evars["rgt_ledger_dir"] = str(ledger)
    # controller scratch files of the roles (upload_resume's file lists): removed with the private dir
    evars["rgt_controller_scratch_dir"] = str(private / "scratch")
    # on a terminal only: the roles' rsync writes progress files there and a live line per host shows them
    tail = ProgressTail(console, private / "progress")
    evars.update(tail.extravars())
    cmdline = []
    if tags:
        cmdline += ["--tags", tags]
    if skip_tags:
        cmdline += ["--skip-tags", skip_tags]
    if check:
        cmdline += ["--check", "--diff"]
    ssh_hosts = [h for h in hosts if not h.is_local]
    if ssh_hosts:
        # one known_hosts per inventory; a host with its own rgt_known_hosts gets it through its host var
        kh = known_hosts_file(inventory, ssh_hosts[0])
        evars.setdefault("ansible_ssh_extra_args", SSH_PIN_ARGS.format(
            known_hosts="{{ rgt_known_hosts | default('%s') }}" % kh))
    # A second inventory source, the runner's (it wins over the user's for these host vars): each host's profile
    # as validated once by load_hosts (roles/run_context uses it instead of loading and validating it again),
    # and, for a host with no job spec, its run remembered in the ledger (rgt.memory).
    overlay = private / "runner-inventory.json"
    overlay.write_text(json.dumps({"all": {"hosts": {h.name: _overlay_vars(h, inventory) for h in hosts}}}))
    sources = [str(Path(inventory).resolve()), str(overlay)]
    try:
        tail.start()
        with interrupt:
            runner = ansible_runner.run(
                private_data_dir=str(private),
                project_dir=str(paths.REPO_ROOT),
                playbook=str(playbook),
                inventory=sources,
                limit=limit,
                extravars=evars,
                envvars=env_overrides,
                cmdline=" ".join(cmdline) or None,
                event_handler=interrupt.events(sink),
                cancel_callback=interrupt,
                quiet=True,
                suppress_env_files=True,
                rotate_artifacts=1,
                verbosity=verbosity or None,
                settings={"suppress_ansible_output": True},
            )
        result = PhaseResult(playbook=str(playbook.relative_to(paths.REPO_ROOT)
                                          if playbook.is_relative_to(paths.REPO_ROOT) else playbook),
                             ident=ident, rc=runner.rc, hosts=sink.hosts,
                             status="canceled" if interrupt.interrupted else runner.status,
                             stats=sink.stats, started=started)
    finally:
        tail.stop()
        signal.signal(signal.SIGINT, saved_sigint)
        shutil.rmtree(private, ignore_errors=True)
    memory.remember_launches(ledger, hosts, result)
    if sink.ledger_error is not None:
        raise sink.ledger_error
    return result
