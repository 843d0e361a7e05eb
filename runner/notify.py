"""Notifications from `watch`: one message per state transition per run, deduplicated through the ledger.

Rules come from the job spec (`rgt_job.notify`), else the inventory host's `rgt_notify` (schemas:
runner/schemas/job.schema.json `notify`). Each rule is a Slack-compatible webhook (`webhook_env`: the NAME of an
environment variable holding the URL, a secret never printed, logged or written) or a local `command` (run with
bash, the message in RGT_NOTIFY_* variables and as JSON on stdin), and the events it wants (`on`): job states,
`attention`, `unreachable_for_s: N`.

`<ledger>/notify/<host>.json` (atomic) holds the last state seen per host and the undelivered events, so a watch
started again sends nothing twice and retries what did not go out. Delivery never blocks or fails the watch: each
try is bounded (HTTP and command timeouts), a tick spends at most TICK_BUDGET_S on deliveries, a failed delivery
is tried again later with capped backoff and given up after MAX_TRIES (named in a warning, never the URL).
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path

from rich.console import Console
from rich.markup import escape

from rgt.ledger import atomic_write_json, read_json

SCHEMA = "rgt/notify/v1"
STATES = ("running", "stalled", "finished", "failed", "preempted", "dead", "not_started")
DEFAULT_ON = ("finished", "failed", "preempted", "dead", "attention")
HTTP_TIMEOUT_S = 5.0
COMMAND_TIMEOUT_S = 10.0
TICK_BUDGET_S = 15.0
BACKOFF_BASE_S = 5.0
BACKOFF_CAP_S = 300.0
MAX_TRIES = 8
KEEP_EVENTS = 100
COLORS = {"finished": "good", "running": "#1565c0", "preempted": "warning", "stalled": "warning",
          "attention": "danger", "failed": "danger", "dead": "danger", "unreachable": "#9c27b0"}


def rule_key(rule: dict) -> str:
    """A rule's identity in the ledger: its content (so editing a rule never inherits another's deliveries)."""
    return hashlib.sha256(json.dumps(rule, sort_keys=True).encode()).hexdigest()[:12]


def rule_label(rule: dict) -> str:
    return f"webhook ${rule['webhook_env']}" if rule.get("webhook_env") else "command"


def wants(rule: dict, kind: str, threshold: float | None = None) -> bool:
    on = rule.get("on") or list(DEFAULT_ON)
    if kind == "unreachable":
        return any(isinstance(item, dict) and item.get("unreachable_for_s") == threshold for item in on)
    return kind in on


def thresholds(rules: list[dict]) -> list[float]:
    return sorted({item["unreachable_for_s"] for rule in rules for item in rule.get("on") or []
                   if isinstance(item, dict) and "unreachable_for_s" in item})


def host_rules(host, extravars: dict) -> list[dict]:
    """The job's notify rules (the -e job, the inventory's, the remembered one), else the host's rgt_notify."""
    host_vars = getattr(host, "vars", None) or {}
    job = extravars.get("rgt_job") if isinstance(extravars.get("rgt_job"), dict) else None
    job = job or host_vars.get("rgt_job") or (getattr(host, "recalled", None) or {}).get("job") or {}
    rules = job.get("notify") if isinstance(job, dict) and "notify" in job else host_vars.get("rgt_notify")
    return [r for r in rules or [] if isinstance(r, dict)]


# ---------------------------------------------------------------- delivery (bounded, never raises)

class Sender:
    """Sends one message to one rule; returns None on success, else a short reason with no secret in it."""

    def __init__(self, env: dict | None = None, http_timeout: float = HTTP_TIMEOUT_S,
                 command_timeout: float = COMMAND_TIMEOUT_S):
        self.env = os.environ if env is None else env
        self.http_timeout = http_timeout
        self.command_timeout = command_timeout

    def send(self, rule: dict, message: dict) -> str | None:
        try:
            if rule.get("webhook_env"):
                return self._post(rule["webhook_env"], message)
            if rule.get("command"):
                return self._command(rule["command"], message)
            return "the rule has neither webhook_env nor command"
        except Exception as exc:  # noqa: BLE001 - a notification never fails the watch
            return f"{type(exc).__name__}"

    def _post(self, name: str, message: dict) -> str | None:
        url = self.env.get(name) or ""
        if not url:
            return f"${name} is not set in this shell"
        body = json.dumps({"text": message["text"], "attachments": [{
            "color": COLORS.get(message["kind"], "#9e9e9e"), "fallback": message["text"],
            "fields": [{"title": k, "value": str(v), "short": len(str(v)) < 40}
                       for k, v in message["fields"].items()]}]}).encode()
        request = urllib.request.Request(url, data=body, method="POST",
                                         headers={"Content-Type": "application/json", "User-Agent": "rgt-notify"})
        try:
            with urllib.request.urlopen(request, timeout=self.http_timeout) as response:  # noqa: S310
                response.read(1024)
                return None
        except urllib.error.HTTPError as exc:
            return f"HTTP {exc.code}"
        except urllib.error.URLError as exc:
            return _scrub(f"network: {exc.reason}", url)
        except (TimeoutError, OSError) as exc:
            return _scrub(f"network: {exc}", url)

    def _command(self, command: str, message: dict) -> str | None:
        env = {**self.env, "RGT_NOTIFY_TEXT": message["text"], "RGT_NOTIFY_KIND": message["kind"],
               "RGT_NOTIFY_EVENT": message["event"], "RGT_NOTIFY_SUMMARY": message.get("summary") or "",
               **{f"RGT_NOTIFY_{k.upper()}": str(v) for k, v in message["fields"].items()}}
        proc = subprocess.Popen(["bash", "-c", command], stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL, env=env, start_new_session=True)
        try:
            proc.communicate(json.dumps(message).encode(), timeout=self.command_timeout)
        except subprocess.TimeoutExpired:
            try:
                os.killpg(proc.pid, signal.SIGKILL)  # its own session: the command and what it started
            except OSError:
                pass
            proc.wait()
            return f"timed out after {self.command_timeout:g} s"
        return None if proc.returncode == 0 else f"exit {proc.returncode}"


def _scrub(text: str, url: str) -> str:
    """An error text with the URL (and its path, where Slack keeps the secret) taken out."""
    if url:
        text = text.replace(url, "<webhook>")
        path = url.split("://", 1)[-1].partition("/")[2]
        if path:
            text = text.replace(path, "<webhook>")
    return text[:200]


# ---------------------------------------------------------------- transitions

def _fields(doc: dict, facts: dict | None) -> dict:
    fields = {"host": doc.get("host"), "run": doc.get("run_id"), "state": doc.get("state"),
              "attempt": doc.get("attempt"), "step": doc.get("step"), "loss": doc.get("loss")}
    if doc.get("cost_so_far") is not None:
        fields["cost"] = f"${doc['cost_so_far']:.2f}"
    if facts and facts.get("lost_s"):
        fields["compute lost"] = f"{facts['lost_s'] / 60:.0f} min"
    return {k: v for k, v in fields.items() if v is not None}


def _text(kind: str, doc: dict, detail: str) -> str:
    run = doc.get("run_id") or "?"
    attempt = f" (attempt {doc['attempt']})" if doc.get("attempt") is not None else ""
    return f"rgt: {doc.get('host')} {run} {kind}{attempt}{': ' + detail if detail else ''}"


class Notifier:
    """Per-host rules, the ledger of what was seen and sent, and bounded delivery."""

    def __init__(self, ledger: Path, rules: dict[str, list[dict]], console: Console,
                 sender: Sender | None = None, clock: Callable[[], float] = time.time,
                 tick_budget_s: float = TICK_BUDGET_S):
        self.dir = ledger / "notify"
        self.rules = {h: r for h, r in rules.items() if r}
        self.console = console
        self.sender = sender or Sender()
        self.clock = clock
        self.tick_budget_s = tick_budget_s
        self.warned: set[str] = set()
        for host, host_rules_ in sorted(self.rules.items()):
            for rule in host_rules_:
                name = rule.get("webhook_env")
                if name and not self.sender.env.get(name) and name not in self.warned:
                    self.warned.add(name)
                    console.print(f"[yellow]notify[/yellow]: ${name} is not set in this shell: webhook messages "
                                  f"for {host} cannot be sent (export it and run watch again)", highlight=False)

    @property
    def active(self) -> bool:
        return bool(self.rules)

    def _load(self, host: str) -> dict:
        doc = read_json(self.dir / f"{host}.json")
        if not isinstance(doc, dict) or doc.get("schema") != SCHEMA:
            doc = {"schema": SCHEMA, "host": host, "last": None, "unreachable_since": None,
                   "unreachable_sent": [], "events": []}
        return doc

    def _save(self, host: str, state: dict) -> None:
        state["events"] = state["events"][-KEEP_EVENTS:]
        atomic_write_json(self.dir / f"{host}.json", state)

    def observe(self, docs: dict[str, dict], facts: dict[str, dict] | None = None, summary: str = "") -> None:
        """Record the transitions these documents show and queue one event per transition and rule set."""
        now = self.clock()
        for host, doc in docs.items():
            rules = self.rules.get(host)
            if not rules:
                continue
            state = self._load(host)
            new = self._transitions(host, doc, state, now, rules)
            for kind, event_id, detail, threshold, view in new:
                targets = [rule_key(r) for r in rules if wants(r, kind, threshold)]
                if not targets:
                    continue
                fields = _fields(view, (facts or {}).get(host))
                text = _text(kind, view, detail)
                if summary:
                    text += f"\n{summary}"
                state["events"].append({
                    "id": event_id, "kind": kind, "created_at": now, "text": text, "summary": summary,
                    "fields": fields, "deliveries": {k: {"ok": False, "tries": 0, "next_at": now, "error": None,
                                                         "gave_up": False} for k in targets}})
            self._save(host, state)

    def _transitions(self, host: str, doc: dict, state: dict, now: float, rules: list[dict]):
        events = []
        if doc.get("state") == "unreachable":
            since = state.get("unreachable_since") or now
            state["unreachable_since"] = since
            last = state.get("last") or {}
            for threshold in thresholds(rules):
                key = f"{since}:{threshold}"
                if now - since >= threshold and key not in state["unreachable_sent"]:
                    state["unreachable_sent"] = [*state["unreachable_sent"][-20:], key]
                    view = {**doc, "run_id": last.get("run"), "attempt": last.get("attempt")}
                    events.append(("unreachable", f"unreachable:{key}",
                                   f"no answer for {int(now - since)} s (last seen {last.get('state') or '?'})",
                                   threshold, view))
            return events
        state["unreachable_since"] = None
        if doc.get("state") in (None, "error"):
            return events
        current = {"run": doc.get("run_id"), "attempt": doc.get("attempt"), "state": doc.get("state"),
                   "attention": sorted({a.get("id") for a in doc.get("attention") or [] if a.get("id")})}
        last = state.get("last") or {}
        same_run = last.get("run") == current["run"]
        if not same_run or (last.get("attempt"), last.get("state")) != (current["attempt"], current["state"]):
            events.append((current["state"], f"{current['run']}#{current['attempt']}:{current['state']}",
                           _state_detail(doc), None, doc))
        seen = set(last.get("attention") or []) if same_run and last.get("attempt") == current["attempt"] else set()
        fresh = [a for a in doc.get("attention") or [] if a.get("id") and a.get("id") not in seen]
        if fresh:
            ids = ",".join(sorted({a["id"] for a in fresh}))
            events.append(("attention", f"{current['run']}#{current['attempt']}:attention:{ids}",
                           "; ".join(f"{a['id']}: {a.get('message')}" for a in fresh), None, doc))
        state["last"] = {**current, "seen_at": now}
        return events

    def deliver(self, budget_s: float | None = None) -> None:
        """Try every due delivery once, within the time budget; later ones wait for the next tick."""
        budget = self.tick_budget_s if budget_s is None else budget_s
        started = self.clock()
        for host in sorted(self.rules):
            state = self._load(host)
            rules = {rule_key(r): r for r in self.rules[host]}
            changed = False
            for event in state["events"]:
                for key, slot in event["deliveries"].items():
                    if slot["ok"] or slot["gave_up"] or slot["next_at"] > self.clock():
                        continue
                    rule = rules.get(key)
                    if rule is None:
                        slot.update(gave_up=True, error="the rule is no longer in the job spec")
                        changed = True
                        continue
                    if self.clock() - started >= budget:
                        break
                    message = {"event": event["id"], "kind": event["kind"], "text": event["text"],
                               "summary": event.get("summary"), "fields": event["fields"]}
                    error = self.sender.send(rule, message)
                    slot["tries"] += 1
                    slot["error"] = error
                    changed = True
                    if error is None:
                        slot.update(ok=True, sent_at=self.clock())
                    elif slot["tries"] >= MAX_TRIES:
                        slot["gave_up"] = True
                        self.console.print(f"[yellow]notify[/yellow]: gave up on the {escape(rule_label(rule))} "
                                           f"message for {host} ({escape(event['id'])}) after {slot['tries']} "
                                           f"tries: {escape(error)}", highlight=False)
                    else:
                        slot["next_at"] = self.clock() + min(BACKOFF_BASE_S * 2 ** (slot["tries"] - 1),
                                                             BACKOFF_CAP_S)
                        if slot["tries"] == 1:
                            self.console.print(f"[yellow]notify[/yellow]: the {escape(rule_label(rule))} message "
                                               f"for {host} did not go out ({escape(error)}); trying again later",
                                               highlight=False)
            if changed:
                self._save(host, state)

    def pending(self) -> list[tuple[str, str, float]]:
        """(host, event id, next try) of every delivery still to make."""
        out = []
        for host in sorted(self.rules):
            for event in self._load(host)["events"]:
                for slot in event["deliveries"].values():
                    if not slot["ok"] and not slot["gave_up"]:
                        out.append((host, event["id"], slot["next_at"]))
        return out

    def flush(self, deadline_s: float = TICK_BUDGET_S, sleep: Callable[[float], None] = time.sleep) -> int:
        """At the end of watch: deliver what is due, waiting for backoff only within deadline_s. Returns how many
        deliveries are still pending (they go out with the next watch)."""
        end = self.clock() + deadline_s
        while True:
            self.deliver(max(0.0, end - self.clock()))
            left = self.pending()
            if not left:
                return 0
            due = min(t for _h, _e, t in left)
            if due >= end:
                self.console.print(f"[yellow]notify[/yellow]: {len(left)} message(s) not delivered yet; the next "
                                   "`rgt-run watch` tries again", highlight=False)
                return len(left)
            sleep(max(0.0, due - self.clock()))


def _state_detail(doc: dict) -> str:
    state = doc.get("state")
    bits = []
    if doc.get("step") is not None:
        bits.append(f"step {doc['step']}")
    if doc.get("loss") is not None:
        bits.append(f"loss {doc['loss']}")
    exit_doc = (doc.get("evidence") or {}).get("exit") or {}
    if state in ("failed", "dead") and exit_doc.get("rc") is not None:
        bits.append(f"exit {exit_doc['rc']}")
    log_error = (doc.get("history") or {}).get("log_error") or {}
    if state in ("failed", "dead") and log_error.get("line"):
        bits.append(f"log: {log_error['line']}")
    if state == "preempted" and doc.get("auto_resume"):
        bits.append("auto_resume: relaunching")
    return ", ".join(bits)


def notifier_for(ledger: Path, hosts: list, extravars: dict, console: Console) -> Notifier:
    return Notifier(ledger, {h.name: host_rules(h, extravars) for h in hosts}, console)
