"""Notification rules against a real local HTTP receiver: one message per transition, nothing twice after a restart
(the ledger remembers), capped retries that never block, unreachable_for_s, and the URL never shown."""

import http.server
import json
import threading
import time

import pytest
from rich.console import Console

from rgt import notify

SECRET = "T0/B0/zzSECRETzz"


class Receiver(http.server.ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, fail_first=0, delay=0.0):
        super().__init__(("127.0.0.1", 0), Handler)
        self.messages, self.fail_first, self.delay, self.calls = [], fail_first, delay, 0
        threading.Thread(target=self.serve_forever, daemon=True).start()

    @property
    def url(self):
        return f"http://127.0.0.1:{self.server_address[1]}/services/{SECRET}"


class Handler(http.server.BaseHTTPRequestHandler):
    def do_POST(self):  # noqa: N802 - http.server's name
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)))
        self.server.calls += 1
        time.sleep(self.server.delay)
        if self.server.calls <= self.server.fail_first:
            self.send_response(500)
            self.end_headers()
            return
        self.server.messages.append(body)
        self.send_response(200)
        self.end_headers()

    def log_message(self, *_args):
        pass


class Clock:
    def __init__(self):
        self.now = 1_000_000.0

    def __call__(self):
        return self.now


@pytest.fixture
def receiver():
    server = Receiver()
    yield server
    server.shutdown()


def make(tmp_path, url, on=("running", "preempted", "finished", "attention"), clock=None, extra_rules=(), **kw):
    console = Console(file=open(tmp_path / "console.txt", "a"), width=200)  # noqa: SIM115
    rules = {"box": [{"webhook_env": "HOOK", "on": list(on)}, *extra_rules]}
    sender = notify.Sender(env={"HOOK": url}, http_timeout=kw.pop("http_timeout", 2.0))
    return notify.Notifier(tmp_path / "ledger", rules, console, sender=sender, clock=clock or time.time, **kw)


def doc(state, attempt=1, step=10, **extra):
    return {"host": "box", "run_id": "r1", "state": state, "attempt": attempt, "step": step, "loss": 0.5,
            "cost_so_far": 0.25, **extra}


def tick(n, state, **kw):
    n.observe({"box": doc(state, **kw)}, summary="1/1 running")
    n.deliver()


def test_one_message_per_transition_and_none_again_after_a_restart(tmp_path, receiver):
    n = make(tmp_path, receiver.url)
    for state, attempt in (("running", 1), ("running", 1), ("preempted", 1), ("running", 2)):
        tick(n, state, attempt=attempt)
    again = make(tmp_path, receiver.url)  # a new watch: the ledger says what was seen and sent
    for state, attempt in (("running", 2), ("finished", 2), ("finished", 2)):
        tick(again, state, attempt=attempt)
    got = [(m["attachments"][0]["fields"], m["text"]) for m in receiver.messages]
    states = [({f["title"]: f["value"] for f in fields}["state"], {f["title"]: f["value"] for f in fields}["attempt"])
              for fields, _ in got]
    assert states == [("running", "1"), ("preempted", "1"), ("running", "2"), ("finished", "2")]
    assert got[-1][1] == "rgt: box r1 finished (attempt 2): step 10, loss 0.5\n1/1 running"
    ledger = (tmp_path / "ledger" / "notify" / "box.json").read_text()
    assert SECRET not in ledger and "127.0.0.1" not in ledger


def test_only_the_events_a_rule_asks_for(tmp_path, receiver):
    n = make(tmp_path, receiver.url, on=("failed",))
    tick(n, "running")
    tick(n, "stalled", attention=[{"id": "stalled", "message": "log quiet"}])
    tick(n, "failed")
    texts = [m["text"].split("\n")[0] for m in receiver.messages]
    assert texts == ["rgt: box r1 failed (attempt 1): step 10, loss 0.5"]


def test_a_new_attention_id_is_one_message_even_when_the_state_does_not_change(tmp_path, receiver):
    n = make(tmp_path, receiver.url, on=("attention",))
    tick(n, "running")
    tick(n, "running", attention=[{"id": "loss_spike", "message": "loss 90 at step 10"}])
    tick(n, "running", attention=[{"id": "loss_spike", "message": "loss 90 at step 10"}])
    assert len(receiver.messages) == 1 and "loss_spike: loss 90 at step 10" in receiver.messages[0]["text"]


def test_a_failed_delivery_is_retried_with_backoff_and_sent_once(tmp_path):
    server = Receiver(fail_first=2)
    clock = Clock()
    try:
        n = make(tmp_path, server.url, clock=clock)
        tick(n, "finished")
        assert server.calls == 1 and not server.messages
        n.deliver()
        assert server.calls == 1, "not again before the backoff is over"
        clock.now += notify.BACKOFF_BASE_S
        n.deliver()
        clock.now += notify.BACKOFF_BASE_S * 2
        n.deliver()
        n.deliver()
        assert server.calls == 3 and len(server.messages) == 1
    finally:
        server.shutdown()
    out = (tmp_path / "console.txt").read_text()
    assert "did not go out (HTTP 500); trying again later" in out and SECRET not in out


def test_a_receiver_that_hangs_never_blocks_the_watch_for_long(tmp_path):
    server = Receiver(delay=3.0)
    try:
        n = make(tmp_path, server.url, http_timeout=0.5, tick_budget_s=1.0)
        n.observe({"box": doc("running")})
        n.observe({"box": doc("finished")})
        started = time.monotonic()
        n.deliver()
        assert time.monotonic() - started < 2.5, "one try per tick, bounded by the timeout and the tick budget"
        started = time.monotonic()
        left = n.flush(deadline_s=1.0)
        assert time.monotonic() - started < 3.0 and left >= 1
    finally:
        server.shutdown()
    out = (tmp_path / "console.txt").read_text()
    assert SECRET not in out and "message(s) not delivered yet" in out


def test_unreachable_for_s_fires_once_per_outage(tmp_path, receiver):
    clock = Clock()
    n = make(tmp_path, receiver.url, on=("finished", {"unreachable_for_s": 900}), clock=clock)
    tick(n, "running")
    for _ in range(3):
        n.observe({"box": {"host": "box", "state": "unreachable", "error": "ssh: timed out"}})
        n.deliver()
        clock.now += 600
    assert len(receiver.messages) == 1
    assert receiver.messages[0]["text"].startswith("rgt: box r1 unreachable (attempt 1): no answer for 1200 s")
    tick(n, "running")
    n.observe({"box": {"host": "box", "state": "unreachable"}})
    clock.now += 901
    n.observe({"box": {"host": "box", "state": "unreachable"}})
    n.deliver()
    assert len(receiver.messages) == 2, "a second outage is a second message"


def test_an_unset_variable_is_named_and_the_command_rule_gets_the_message(tmp_path):
    out = tmp_path / "got.json"
    console_file = tmp_path / "console.txt"
    rules = {"box": [{"webhook_env": "NOT_SET_HOOK", "on": ["finished"]},
                     {"command": f"cat > {out}; test \"$RGT_NOTIFY_STATE\" = finished", "on": ["finished"]}]}
    with open(console_file, "w") as fh:
        n = notify.Notifier(tmp_path / "ledger", rules, Console(file=fh, width=200), sender=notify.Sender(env={}))
        n.observe({"box": doc("finished")})
        n.deliver()
    assert json.loads(out.read_text())["event"] == "r1#1:finished"
    text = console_file.read_text()
    assert "$NOT_SET_HOOK is not set in this shell" in text
    state = json.loads((tmp_path / "ledger" / "notify" / "box.json").read_text())
    slots = list(state["events"][0]["deliveries"].values())
    assert sorted(s["ok"] for s in slots) == [False, True]


def test_the_url_is_scrubbed_from_a_network_error():
    url = "http://127.0.0.1:9/services/T0/B0/zzSECRETzz"
    text = notify._scrub(f"network: cannot reach {url} (services/T0/B0/zzSECRETzz)", url)
    assert "zzSECRETzz" not in text
