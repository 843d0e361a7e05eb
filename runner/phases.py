"""Build the ansible-runner call for one playbook, run it in a fresh private data dir, and classify the result."""

from __future__ import annotations

import json
import shutil
import signal
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import ansible_runner
from rich.console import Console

from rgt import errors, memory, paths
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


def new_ident(playbook: Path) -> str:
    return f"{datetime.now(UTC).strftime('%Y%m%dT%H%M%SZ')}-{playbook.stem}-{uuid.uuid4().hex[:6]}"


def _overlay_vars(host: Host) -> dict:
    out = {"rgt_profile_data": host.profile}
    if host.recalled:
        out.update(rgt_job=host.recalled["job"], monitor_other_run_ids=host.other_runs)
    out.update(host.overlay)
    return out


def run_playbook(playbook: Path, inventory: str, hosts: list[Host], *, ledger: Path, console: Console,
                 extravars: dict | None = None, limit: str | None = None, tags: str | None = None,
                 skip_tags: str | None = None, check: bool = False, quiet: bool = False,
                 verbosity: int = 0) -> PhaseResult:
    """Run one playbook; never leaves secrets or artifacts behind in the private data dir."""
    ident = new_ident(playbook)
    started = time.time()
    ledger_events = ledger / "events" / f"{ident}.jsonl"
    sink = EventSink(console, ledger_events, quiet=quiet)
    private = Path(tempfile.mkdtemp(prefix="rgt-run-"))
    # ansible-runner installs its own SIGINT handler and does not restore it (#1075)
    saved_sigint = signal.getsignal(signal.SIGINT)
    env = ansible_env()
    env_overrides = {k: env[k] for k in ("ANSIBLE_CONFIG", "ANSIBLE_COLLECTIONS_PATH", "PATH", "PWD")}
    env_overrides["ANSIBLE_FORCE_COLOR"] = "0"
    # rgt's own virtual environment, named for the local connection's launch: the job wrapper keeps it (and every
    # ANSIBLE_* variable) out of the job's environment (rgt_runlayout.job_base_env)
    if _layout.is_venv(sys.prefix):
        env_overrides[_layout.RUNNER_PREFIX_ENV] = sys.prefix
    evars = dict(extravars or {})
    evars["rgt_ledger_dir"] = str(ledger)
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
    overlay.write_text(json.dumps({"all": {"hosts": {h.name: _overlay_vars(h) for h in hosts}}}))
    sources = [str(Path(inventory).resolve()), str(overlay)]
    try:
        tail.start()
        runner = ansible_runner.run(
            private_data_dir=str(private),
            project_dir=str(paths.REPO_ROOT),
            playbook=str(playbook),
            inventory=sources,
            limit=limit,
            extravars=evars,
            envvars=env_overrides,
            cmdline=" ".join(cmdline) or None,
            event_handler=sink,
            quiet=True,
            suppress_env_files=True,
            rotate_artifacts=1,
            verbosity=verbosity or None,
            settings={"suppress_ansible_output": True},
        )
        result = PhaseResult(playbook=str(playbook.relative_to(paths.REPO_ROOT)
                                          if playbook.is_relative_to(paths.REPO_ROOT) else playbook),
                             ident=ident, rc=runner.rc, status=runner.status, hosts=sink.hosts,
                             stats=sink.stats, started=started)
    finally:
        tail.stop()
        signal.signal(signal.SIGINT, saved_sigint)
        shutil.rmtree(private, ignore_errors=True)
    memory.remember_launches(ledger, hosts, result)
    return result
