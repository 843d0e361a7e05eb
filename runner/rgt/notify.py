"""Notifications from `watch`: one message per state transition per run, deduplicated through the ledger.

Rules come from the job spec (`rgt_job.notify`), else the inventory host's `rgt_notify` (schemas:
runner/rgt/schemas/job.schema.json `notify`; an unquoted `on:` key, which YAML 1.1 reads as true, is read as `on`:
rgt.jobspec.notify_rule). Each rule is a Slack-compatible webhook (`webhook_env`: the NAME of an environment
variable holding the URL, a secret never printed, logged or written) or a local `command` (run with bash, the
message in RGT_NOTIFY_* variables and as JSON on stdin), and the events it wants (`on`): job states, `attention`,
`unreachable_for_s: N`.

Every run is followed on its own: a host's run, each of its `other_runs`, each cell of a sweep (the status round
reports a sweep host's cells as its run and `other_runs`). `<ledger>/notify/<host>.json` (atomic, schema
rgt/notify/v2) holds the last state seen per run and the undelivered events, so a watch started again sends
nothing twice and retries what did not go out (a v1 file, one last state per host, is read as that one run's).

Delivery never blocks or fails the watch: each try has a deadline for the whole of it (a POST in a thread whose
socket is shut at the deadline, however slowly the receiver answers; a command whose process group is killed),
a tick spends at most TICK_BUDGET_S on deliveries and the end of watch at most FLUSH_S; a failed delivery is
tried again later with capped backoff and given up after MAX_TRIES (named in a warning, never the URL). A webhook
whose variable is not set is said once, when watch starts, and its messages are given up (never retried).
Every text a message carries is rgt.safetext.printable: box text never brings a control sequence along.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from rich.console import Console
from rich.markup import escape

from rgt import jobspec, paths, runreport
from rgt.ledger import atomic_write_json, read_json
from rgt.safetext import printable

if TYPE_CHECKING:  # imported where a webhook is posted: urllib, http.client and ssl are 9 ms of every start
    import http.client
    import urllib.request

SCHEMA = "rgt/notify/v2"
SCHEMA_V1 = "rgt/notify/v1"  # {"last": {run, attempt, state, attention, seen_at}}: one run per host
_states = paths.module_util("rgt_states")  # the states a rule may ask for, the default `on`, the colours
HTTP_TIMEOUT_S = 5.0  # the whole POST: connect, send, the answer
COMMAND_TIMEOUT_S = 10.0
TICK_BUDGET_S = 15.0
FLUSH_S = 15.0
MIN_TRY_S = 0.5  # a try is not started with less time than this left in the budget
MIN_WAIT_S = 0.1
BACKOFF_BASE_S = 5.0
BACKOFF_CAP_S = 300.0
MAX_TRIES = 8
KEEP_EVENTS = 100


def rule_key(rule: dict) -> str:
    """A rule's identity in the ledger: its content (so editing a rule never inherits another's deliveries)."""
    return hashlib.sha256(json.dumps(rule, sort_keys=True).encode()).hexdigest()[:12]


def rule_label(rule: dict) -> str:
    return f"webhook ${rule['webhook_env']}" if rule.get("webhook_env") else "command"


def wants(rule: dict, kind: str, threshold: float | None = None) -> bool:
    on = rule.get("on") or list(_states.DEFAULT_ON)
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
    return [jobspec.notify_rule(r) for r in rules or [] if isinstance(r, dict)]


# ---------------------------------------------------------------- delivery (bounded, never raises)

class _Connections:
    """The HTTP connections one request opened, so that its deadline can shut their sockets under a blocked
    read (a receiver that trickles its answer a byte at a time never trips a per-read timeout)."""

    def __init__(self) -> None:
        self.items: list[http.client.HTTPConnection] = []
        self.lock = threading.Lock()
        self.shut = False

    def _tracked(self, http_class):
        def make(*args, **kwargs):
            conn = http_class(*args, **kwargs)
            with self.lock:
                if self.shut:
                    raise OSError("the deadline has passed")
                self.items.append(conn)
            return conn
        return make

    def opener(self) -> urllib.request.OpenerDirector:
        """urllib's opener (proxies from the environment, redirects) whose connections are tracked."""
        import urllib.request  # 9 ms with http.client and ssl: only a webhook's post needs it

        tracker = self

        class Http(urllib.request.HTTPHandler):
            def do_open(self, http_class, req, **kwargs):
                return super().do_open(tracker._tracked(http_class), req, **kwargs)

        class Https(urllib.request.HTTPSHandler):
            def do_open(self, http_class, req, **kwargs):
                return super().do_open(tracker._tracked(http_class), req, **kwargs)

        return urllib.request.build_opener(Http(), Https())

    def shut_all(self) -> None:
        with self.lock:
            self.shut = True
            items = list(self.items)
        for conn in items:
            sock = getattr(conn, "sock", None)
            if sock is not None:
                try:
                    sock.shutdown(socket.SHUT_RDWR)  # wakes the reader; it closes the connection itself
                except OSError:
                    pass


class Sender:
    """Sends one message to one rule within a deadline; returns None on success, else a short reason with no
    secret in it."""

    def __init__(self, env: dict | None = None, http_timeout: float = HTTP_TIMEOUT_S,
                 command_timeout: float = COMMAND_TIMEOUT_S):
        self.env = os.environ if env is None else env
        self.http_timeout = http_timeout
        self.command_timeout = command_timeout

    def unset(self, rule: dict) -> str | None:
        """The name of the rule's webhook variable when it is not set in this environment."""
        name = rule.get("webhook_env")
        return name if name and not self.env.get(name) else None

    def send(self, rule: dict, message: dict, budget_s: float | None = None) -> str | None:
        try:
            if rule.get("webhook_env"):
                limit = min(self.http_timeout, budget_s) if budget_s is not None else self.http_timeout
                return self._post(rule["webhook_env"], message, max(limit, 0.0))
            if rule.get("command"):
                limit = min(self.command_timeout, budget_s) if budget_s is not None else self.command_timeout
                return self._command(rule["command"], message, max(limit, 0.0))
            return "the rule has neither webhook_env nor command"
        except Exception as exc:  # noqa: BLE001 - a notification never fails the watch
            return f"{type(exc).__name__}"

    def _post(self, name: str, message: dict, limit: float) -> str | None:
        url = self.env.get(name) or ""
        if not url:
            return f"${name} is not set in this shell"
        body = json.dumps({"text": message["text"], "attachments": [{
            "color": _states.notify_color(message["kind"]), "fallback": message["text"],
            "fields": [{"title": k, "value": str(v), "short": len(str(v)) < 40}
                       for k, v in message["fields"].items()]}]}).encode()
        import urllib.request  # 9 ms with http.client and ssl: only a webhook's post needs it

        request = urllib.request.Request(url, data=body, method="POST",
                                         headers={"Content-Type": "application/json", "User-Agent": "rgt-notify"})
        connections = _Connections()
        answer: dict[str, str | None] = {}

        def post() -> None:
            answer["error"] = _request(connections, request, url, limit)

        # the whole request runs against one wall-clock deadline: at the deadline its socket is shut and the
        # thread (a daemon: it never holds up the exit) is left to end on its own
        worker = threading.Thread(target=post, name="rgt-notify-post", daemon=True)
        worker.start()
        worker.join(limit)
        if worker.is_alive() or "error" not in answer:
            connections.shut_all()
            return f"no complete answer within {limit:g} s"
        return answer["error"]

    def _command(self, command: str, message: dict, limit: float) -> str | None:
        env = {**self.env, "RGT_NOTIFY_TEXT": message["text"], "RGT_NOTIFY_KIND": message["kind"],
               "RGT_NOTIFY_EVENT": message["event"], "RGT_NOTIFY_SUMMARY": message.get("summary") or "",
               **{f"RGT_NOTIFY_{k.upper().replace(' ', '_')}": str(v) for k, v in message["fields"].items()}}
        proc = subprocess.Popen(["bash", "-c", command], stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL, env=env, start_new_session=True)
        try:
            proc.communicate(json.dumps(message).encode(), timeout=limit)
        except subprocess.TimeoutExpired:
            try:
                os.killpg(proc.pid, signal.SIGKILL)  # its own session: the command and what it started
            except OSError:
                pass
            proc.wait()
            return f"timed out after {limit:g} s"
        return None if proc.returncode == 0 else f"exit {proc.returncode}"


def _request(connections: _Connections, request: urllib.request.Request, url: str, limit: float) -> str | None:
    import http.client  # 9 ms with urllib and ssl: only a webhook's post needs it
    import urllib.error

    try:
        # each socket operation may take a little longer than the deadline: the deadline itself (the caller's
        # join) is what ends a request, with one message for a slow and a silent receiver
        with connections.opener().open(request, timeout=limit + 1.0) as response:
            response.read(1024)
            return None
    except urllib.error.HTTPError as exc:
        return f"HTTP {exc.code}"
    except urllib.error.URLError as exc:
        return _scrub(f"network: {exc.reason}", url)
    except (TimeoutError, OSError, http.client.HTTPException) as exc:
        return _scrub(f"network: {exc or type(exc).__name__}", url)
    except Exception as exc:  # noqa: BLE001 - a notification never fails the watch
        return type(exc).__name__


def _scrub(text: str, url: str) -> str:
    """An error text with the URL (and its path, where Slack keeps the secret) taken out."""
    if url:
        text = text.replace(url, "<webhook>")
        path = url.split("://", 1)[-1].partition("/")[2]
        if path:
            text = text.replace(path, "<webhook>")
    return printable(text)[:200]


# ---------------------------------------------------------------- transitions

def _run_id(doc: dict) -> str:
    return printable(doc.get("run_id") if doc.get("run_id") is not None else "?")


def _fields(doc: dict) -> dict:
    """The message's fields from one run's document, every value printable text."""
    fields = {"host": doc.get("host"), "run": doc.get("run_id"), "state": doc.get("state"),
              "attempt": doc.get("attempt"), "step": doc.get("step"), "loss": doc.get("loss")}
    if isinstance(doc.get("cost_so_far"), (int, float)):
        fields["cost"] = f"${doc['cost_so_far']:.2f}"
    if _states.from_the_box(doc.get("state")):
        try:
            lost = runreport.run_facts(doc).get("lost_s")
        except Exception:  # noqa: BLE001 - a figure a box's odd document cannot give is left out
            lost = None
        if lost:
            fields["compute lost"] = f"{lost / 60:.0f} min"
    return {k: printable(v) for k, v in fields.items() if v is not None}


def _text(kind: str, doc: dict, detail: str, summary: str) -> str:
    attempt = f" (attempt {printable(doc['attempt'])})" if doc.get("attempt") is not None else ""
    line = f"rgt: {printable(doc.get('host'))} {_run_id(doc)} {printable(kind)}{attempt}"
    line += f": {printable(detail)}" if detail else ""
    return f"{line}\n{printable(summary)}" if summary else line


def _message(event: dict) -> dict:
    """What a rule is sent for one event (printable again: an event queued by an older rgt may not be)."""
    return {"event": printable(event["id"]), "kind": printable(event["kind"]),
            "text": printable(event["text"], multiline=True), "summary": printable(event.get("summary") or ""),
            "fields": {printable(k): printable(v) for k, v in (event.get("fields") or {}).items()}}


def _state_detail(doc: dict) -> str:
    state = doc.get("state")
    bits = []
    if doc.get("step") is not None:
        bits.append(f"step {doc['step']}")
    if doc.get("loss") is not None:
        bits.append(f"loss {doc['loss']}")
    if state in _states.EXPLAINED:
        bits.extend(runreport.failure_bits(doc))  # why: its exit code, the last error line of its log
    if state == "preempted" and doc.get("auto_resume"):
        bits.append("auto_resume: relaunching")
    return printable(", ".join(str(b) for b in bits))


def _runs(doc: dict) -> list[dict]:
    """The runs one host's document shows: its run and each of its other runs (a sweep's cells)."""
    return [r for r in (doc, *(doc.get("other_runs") or [])) if isinstance(r, dict)]


class Notifier:
    """Per-host rules, the ledger of what was seen (per run) and sent, and bounded delivery."""

    def __init__(self, ledger: Path, rules: dict[str, list[dict]], console: Console,
                 sender: Sender | None = None, clock: Callable[[], float] = time.time,
                 tick_budget_s: float = TICK_BUDGET_S, monotonic: Callable[[], float] = time.monotonic):
        self.dir = ledger / "notify"
        self.rules = {h: r for h, r in rules.items() if r}
        self.console = console
        self.sender = sender or Sender()
        self.clock = clock  # timestamps and backoff (the ledger's)
        self.monotonic = monotonic  # the time budgets
        self.tick_budget_s = tick_budget_s
        unset: dict[str, list[str]] = {}
        for host, host_rules_ in sorted(self.rules.items()):
            for rule in host_rules_:
                name = self.sender.unset(rule)
                if name and host not in unset.setdefault(name, []):
                    unset[name].append(host)
        for name, hosts in sorted(unset.items()):  # said once; its messages are given up, never retried
            console.print(f"[yellow]notify[/yellow]: ${name} is not set in this shell: webhook messages for "
                          f"{', '.join(hosts)} are not sent (export it and run watch again for the next ones)",
                          highlight=False)

    @property
    def active(self) -> bool:
        return bool(self.rules)

    def _load(self, host: str) -> dict:
        doc = read_json(self.dir / f"{host}.json")
        fresh = {"schema": SCHEMA, "host": host, "runs": {}, "primary": None, "others": [],
                 "unreachable_since": None, "unreachable_sent": [], "events": []}
        if not isinstance(doc, dict) or not isinstance(doc.get("events", []), list):
            return fresh
        if doc.get("schema") == SCHEMA_V1:  # one last state per host: that run's
            last = doc.get("last") if isinstance(doc.get("last"), dict) else {}
            runs = {printable(last["run"]): {k: last.get(k) for k in ("run", "attempt", "state", "attention",
                                                                      "seen_at")}} if last.get("run") else {}
            return {**fresh, "runs": runs, "primary": last.get("run"),
                    "unreachable_since": doc.get("unreachable_since"),
                    "unreachable_sent": list(doc.get("unreachable_sent") or []), "events": doc.get("events") or []}
        if doc.get("schema") != SCHEMA or not isinstance(doc.get("runs"), dict):
            return fresh
        return {**fresh, **doc}

    def _save(self, host: str, state: dict) -> None:
        state["events"] = state["events"][-KEEP_EVENTS:]
        atomic_write_json(self.dir / f"{host}.json", state)

    def observe(self, docs: dict[str, dict], summary: str = "") -> None:
        """Record the transitions these documents show, per run, and queue one event per transition for the rules
        that want it."""
        now = self.clock()
        for host, doc in docs.items():
            rules = self.rules.get(host)
            if not rules:
                continue
            state = self._load(host)
            for kind, event_id, detail, threshold, view in self._transitions(doc, state, now, rules):
                self._append(state, rules, now, kind, event_id, detail, threshold, view, summary)
            self._save(host, state)

    def queue(self, host: str, kind: str, event_id: str, view: dict, detail: str, summary: str = "") -> None:
        """One event that is no state transition (rgt.budget: a budget threshold, an idle meter) for the rules of
        `host` that want `kind`; the caller keeps it to once (its own ledger state)."""
        rules = self.rules.get(host)
        if not rules:
            return
        state = self._load(host)
        self._append(state, rules, self.clock(), kind, event_id, detail, None, view, summary)
        self._save(host, state)

    @staticmethod
    def _append(state: dict, rules: list[dict], now: float, kind: str, event_id: str, detail: str,
                threshold: float | None, view: dict, summary: str) -> None:
        targets = [rule_key(r) for r in rules if wants(r, kind, threshold)]
        if not targets:
            return
        state["events"].append({
            "id": printable(event_id), "kind": kind, "created_at": now,
            "text": _text(kind, view, detail, summary), "summary": printable(summary),
            "fields": _fields(view),
            "deliveries": {k: {"ok": False, "tries": 0, "next_at": now, "error": None, "gave_up": False}
                           for k in targets}})

    def _transitions(self, doc: dict, state: dict, now: float, rules: list[dict]) -> list[tuple]:
        if doc.get("state") == "unreachable":
            return self._unreachable(doc, state, now, rules)
        state["unreachable_since"] = None
        runs = [r for r in _runs(doc) if _states.from_the_box(r.get("state"))]
        if runs:
            state["primary"] = doc.get("run_id")
            state["others"] = [r.get("run_id") for r in runs if r is not doc]
        events = []
        for run in runs:
            rid = _run_id(run)
            current = {"run": run.get("run_id"), "attempt": run.get("attempt"), "state": run.get("state"),
                       "attention": sorted({a.get("id") for a in run.get("attention") or []
                                            if isinstance(a, dict) and a.get("id")})}
            last = state["runs"].get(rid) or {}
            if (last.get("attempt"), last.get("state")) != (current["attempt"], current["state"]):
                events.append((current["state"], f"{rid}#{current['attempt']}:{current['state']}",
                               _state_detail(run), None, run))
            seen = set(last.get("attention") or []) if last.get("attempt") == current["attempt"] else set()
            fresh = [a for a in run.get("attention") or []
                     if isinstance(a, dict) and a.get("id") and a.get("id") not in seen]
            if fresh:
                ids = ",".join(sorted({str(a["id"]) for a in fresh}))
                events.append(("attention", f"{rid}#{current['attempt']}:attention:{ids}",
                               "; ".join(f"{a['id']}: {a.get('message')}" for a in fresh), None, run))
            state["runs"][rid] = {**current, "seen_at": now}
        return events

    def _unreachable(self, doc: dict, state: dict, now: float, rules: list[dict]) -> list[tuple]:
        """Once per outage and threshold, for the host (its runs cannot be seen): the run it showed last."""
        since = state.get("unreachable_since") or now
        state["unreachable_since"] = since
        primary = state.get("primary")
        last = state["runs"].get(printable(primary)) if primary is not None else None
        last = last or {}
        also = [f"{printable(r)} ({(state['runs'].get(printable(r)) or {}).get('state') or '?'})"
                for r in state.get("others") or []]
        events = []
        for threshold in thresholds(rules):
            key = f"{since}:{threshold}"
            if now - since >= threshold and key not in state["unreachable_sent"]:
                state["unreachable_sent"] = [*state["unreachable_sent"][-20:], key]
                view = {**doc, "run_id": primary, "attempt": last.get("attempt")}
                detail = f"no answer for {int(now - since)} s (last seen {last.get('state') or '?'})"
                if also:
                    detail += f"; also on it: {', '.join(also[:3])}{' ...' if len(also) > 3 else ''}"
                events.append(("unreachable", f"unreachable:{key}", detail, threshold, view))
        return events

    def announce(self, host: str, event_id: str, kind: str, text: str) -> None:
        """Queue one message of the runner's own (rgt.unattended: an authorised meter stop refused) for every rule
        of `host`, whatever its `on`; sent with the next deliveries."""
        rules = self.rules.get(host)
        if not rules:
            return
        now = self.clock()
        state = self._load(host)
        state["events"].append({
            "id": printable(event_id), "kind": kind, "created_at": now, "text": printable(text), "summary": "",
            "fields": {"host": printable(host)},
            "deliveries": {rule_key(r): {"ok": False, "tries": 0, "next_at": now, "error": None, "gave_up": False}
                           for r in rules}})
        self._save(host, state)

    def deliver(self, budget_s: float | None = None) -> None:
        """Try every due delivery once, within the time budget (every try bounded by what is left of it); later
        ones wait for the next tick."""
        budget = self.tick_budget_s if budget_s is None else budget_s
        end = self.monotonic() + budget
        for host in sorted(self.rules):
            state = self._load(host)
            rules = {rule_key(r): r for r in self.rules[host]}
            changed = False
            out_of_time = False
            for event in state["events"]:
                for key, slot in event["deliveries"].items():
                    if slot["ok"] or slot["gave_up"] or slot["next_at"] > self.clock():
                        continue
                    rule = rules.get(key)
                    if rule is None:
                        slot.update(gave_up=True, error="the rule is no longer in the job spec")
                        changed = True
                        continue
                    unset = self.sender.unset(rule)
                    if unset:  # named once when watch started: not a delivery to retry
                        slot.update(gave_up=True, error=f"${unset} is not set in this shell")
                        changed = True
                        continue
                    left = end - self.monotonic()
                    if left < MIN_TRY_S:
                        out_of_time = True
                        break
                    error = self.sender.send(rule, _message(event), left)
                    self._record(host, rule, event, slot, error)
                    changed = True
                if out_of_time:
                    break
            if changed:
                self._save(host, state)
            if out_of_time:
                return

    def _record(self, host: str, rule: dict, event: dict, slot: dict, error: str | None) -> None:
        slot["tries"] += 1
        slot["error"] = error
        if error is None:
            slot.update(ok=True, sent_at=self.clock())
            return
        what = f"the {escape(rule_label(rule))} message for {escape(host)} ({escape(printable(event['id']))})"
        if slot["tries"] >= MAX_TRIES:
            slot["gave_up"] = True
            self.console.print(f"[yellow]notify[/yellow]: gave up on {what} after {slot['tries']} tries: "
                               f"{escape(printable(error))}", highlight=False)
            return
        slot["next_at"] = self.clock() + min(BACKOFF_BASE_S * 2 ** (slot["tries"] - 1), BACKOFF_CAP_S)
        if slot["tries"] == 1:
            self.console.print(f"[yellow]notify[/yellow]: {what} did not go out ({escape(printable(error))}); "
                               "trying again later", highlight=False)

    def pending(self) -> list[tuple[str, str, float]]:
        """(host, event id, next try) of every delivery still to make (not those of an unset webhook variable:
        they are given up)."""
        out = []
        for host in sorted(self.rules):
            rules = {rule_key(r): r for r in self.rules[host]}
            for event in self._load(host)["events"]:
                for key, slot in event["deliveries"].items():
                    if slot["ok"] or slot["gave_up"] or (key in rules and self.sender.unset(rules[key])):
                        continue
                    out.append((host, event["id"], slot["next_at"]))
        return out

    def flush(self, deadline_s: float = FLUSH_S, sleep: Callable[[float], None] = time.sleep) -> int:
        """At the end of watch: deliver what is due, waiting for backoff only within deadline_s (wall clock, every
        try and wait included). Returns how many deliveries are still pending (they go out with the next watch)."""
        end = self.monotonic() + deadline_s
        slept = 0.0

        def left() -> float:  # the waits count even where a test's sleep lets no time pass
            return min(end - self.monotonic(), deadline_s - slept)

        while True:
            if left() >= MIN_TRY_S:
                self.deliver(left())
            waiting = self.pending()
            if not waiting:
                return 0
            wait = max(min(t for _h, _e, t in waiting) - self.clock(), MIN_WAIT_S)
            if wait + MIN_TRY_S > left():
                self.console.print(f"[yellow]notify[/yellow]: {len(waiting)} message(s) not delivered yet; the next "
                                   "`rgt-run watch` tries again", highlight=False)
                return len(waiting)
            sleep(wait)
            slept += wait


def notifier_for(ledger: Path, hosts: list, extravars: dict, console: Console) -> Notifier:
    return Notifier(ledger, {h.name: host_rules(h, extravars) for h in hosts}, console)
