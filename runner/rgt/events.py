"""Turn ansible-runner events into live progress on stderr, a ledger line each, and a per-host outcome."""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, field
from pathlib import Path

from rich.console import Console

from rgt.errors import RgtError
from rgt.ledger import append_jsonl

HOST_KEY_PATTERNS = ("Host key verification failed", "REMOTE HOST IDENTIFICATION HAS CHANGED",
                     "No ED25519 host key is known", "host key for", "No matching host key")
# The one channel from the box to the runner (docs/internals.md "Box to runner"): each role publishes what the
# runner reads as one fact named here, set with set_fact; the runner keeps the last value of each per host from
# the runner_on_ok events. No other fact is read, and nothing is read back from disk. A role that publishes a new
# report adds its name here (tests/unit/test_report_channel.py holds roles and this list together).
REPORT_FACTS = (
    "probe_report",             # probe: the box's report with findings, verdict, host, instance_id, profile
    "env_check_report",         # env_check: interpreter, torch, driver/CUDA, findings, verdict
    "upload_resume_report",     # upload_resume: code hash8, files, bytes, skipped, what was sent
    "launch_detached_report",   # launch_detached: the launch module's result (state, attempt, run_dir, session)
    "monitor_status_report",    # monitor: the status document (docs/internals.md "Status document")
    "collect_report",           # collect: sealed, verified, files, bytes, failure (rgt_pull_verify.build_report)
    "teardown_box_report",      # teardown: what is on the box and the gate's verdict, before any call
    "teardown_outcome_report",  # teardown: what the meter stop did (calls, final_state, clocks)
)
_SECRETISH = re.compile(r"(?i)(token|secret|password|passwd|api[_-]?key)=\S+")


@dataclass
class HostOutcome:
    ok: int = 0
    changed: int = 0
    failed: bool = False
    unreachable: bool = False
    host_key_mismatch: bool = False
    gate_refused: bool = False  # a task failed with rc_hint 3: disk floor, unverified upload, live-run mutation
    bad_input: bool = False  # a task failed with rc_hint 2: a module refused its input (e.g. an unbuilt primitive)
    messages: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    results: dict = field(default_factory=dict)  # the REPORT_FACTS this host published, by name

    def as_dict(self) -> dict:
        return {"ok": self.ok, "changed": self.changed, "failed": self.failed, "unreachable": self.unreachable,
                "host_key_mismatch": self.host_key_mismatch, "gate_refused": self.gate_refused,
                "bad_input": self.bad_input,
                "messages": self.messages, "warnings": self.warnings}


def _scrub(text: str) -> str:
    return _SECRETISH.sub(lambda m: m.group(0).split("=", 1)[0] + "=***", text)


def _msg(res: dict) -> str:
    if res.get("censored"):
        return "(output hidden: no_log)"
    parts = [str(res.get("msg") or "").strip()]
    if not parts[0]:
        parts = [str(res.get("stderr") or res.get("module_stderr") or "").strip()]
    return _scrub(" ".join(p for p in parts if p))[:2000]


class EventSink:
    """Callable handed to ansible-runner as event_handler. Cheap and non-blocking on purpose (#1343)."""

    def __init__(self, console: Console, ledger_file: Path, quiet: bool = False):
        self.console = console
        self.ledger_file = ledger_file
        self.quiet = quiet
        self.hosts: dict[str, HostOutcome] = {}
        self.stats: dict = {}
        self._task_started = time.monotonic()
        self.ledger_error: RgtError | None = None  # the event log could not be written (rgt.phases raises it after)

    def host(self, name: str) -> HostOutcome:
        return self.hosts.setdefault(name, HostOutcome())

    def _say(self, text: str) -> None:
        if not self.quiet:
            self.console.print(text, highlight=False)

    def __call__(self, event: dict) -> bool:
        kind = event.get("event", "")
        data = event.get("event_data", {}) or {}
        host = data.get("host") or data.get("remote_addr")
        task = data.get("task") or ""
        res = data.get("res") or {}
        record = {"t": event.get("created"), "event": kind, "host": host, "task": task}
        if kind == "playbook_on_play_start":
            self._say(f"[bold]▶ {data.get('play', '')}[/bold]")
        elif kind == "playbook_on_task_start":
            self._task_started = time.monotonic()
        elif kind == "runner_on_ok":
            out = self.host(host)
            out.ok += 1
            out.changed += int(bool(res.get("changed")))
            for warning in res.get("warnings", []) or []:
                out.warnings.append(_scrub(str(warning)))
            facts = res.get("ansible_facts")
            if isinstance(facts, dict):
                out.results.update({key: facts[key] for key in REPORT_FACTS if isinstance(facts.get(key), dict)})
            mark = "[yellow]changed[/yellow]" if res.get("changed") else "[green]ok[/green]"
            self._say(f"  {host:<16} {mark:<8} {task}")
            record["changed"] = bool(res.get("changed"))
        elif kind == "runner_on_failed":
            out = self.host(host)
            msg = _msg(res)
            if data.get("ignore_errors"):
                self._say(f"  {host:<16} [dim]failed (ignored)[/dim] {task}")
            else:
                out.failed = True
                out.gate_refused = out.gate_refused or res.get("rc_hint") == 3
                out.bad_input = out.bad_input or res.get("rc_hint") == 2
                out.messages.append(f"{task}: {msg}")
                self._say(f"  {host:<16} [red]FAILED[/red]  {task}: {msg}")
            record["msg"] = msg
        elif kind == "runner_on_unreachable":
            out = self.host(host)
            msg = _msg(res)
            out.unreachable = True
            if any(p.lower() in msg.lower() for p in HOST_KEY_PATTERNS):
                out.host_key_mismatch = True
            out.messages.append(msg)
            self._say(f"  {host:<16} [magenta]UNREACHABLE[/magenta] {msg.splitlines()[0] if msg else ''}")
            record["msg"] = msg
        elif kind == "runner_on_skipped":
            self.host(host)
        elif kind == "playbook_on_stats":
            self.stats = {k: data.get(k, {}) for k in ("ok", "changed", "failures", "dark", "skipped", "rescued")}
        elif kind == "warning":
            self._say(f"  [yellow]warning[/yellow] {_scrub(event.get('stdout', '').strip())}")
        else:
            return True
        if self.ledger_error is None:
            try:
                append_jsonl(self.ledger_file, record)
            except RgtError as exc:  # a full disk: the play goes on (raising here would orphan it), reported after
                self.ledger_error = exc
        return True
