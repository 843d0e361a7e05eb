"""Notification rules against a real local HTTP receiver: one message per transition of each run (a host's other
runs and a sweep's cells too), nothing twice after a restart (the ledger remembers, an old-shape ledger too), capped
retries, one deadline per try however the receiver answers, a flush that always ends, unreachable_for_s, no control
sequence from the box in a message, and the URL never shown."""

import http.server
import json
import socket
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


def doc(state, attempt=1, step=10, run_id="r1", **extra):
    return {"host": "box", "run_id": run_id, "state": state, "attempt": attempt, "step": step, "loss": 0.5,
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


# ---------------------------------------------------------------- every delivery has a deadline; flush always ends

class Trickle:
    """A receiver that answers one byte every `gap` s (the status line never completes in time), or never answers
    at all (`gap=None`): either way a per-read timeout never trips."""

    def __init__(self, gap=None):
        self.gap, self.sock = gap, socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(8)
        self.open = []
        threading.Thread(target=self._serve, daemon=True).start()

    @property
    def url(self):
        return f"http://127.0.0.1:{self.sock.getsockname()[1]}/services/{SECRET}"

    def _serve(self):
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.open.append(conn)
            threading.Thread(target=self._answer, args=(conn,), daemon=True).start()

    def _answer(self, conn):
        if self.gap is None:
            return  # holds the connection open, says nothing
        for byte in b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok":
            time.sleep(self.gap)
            try:
                conn.sendall(bytes([byte]))
            except OSError:
                return

    def close(self):
        self.sock.close()
        for conn in self.open:
            conn.close()


@pytest.mark.parametrize("gap", [0.3, None], ids=["trickles", "never-answers"])
def test_a_post_has_one_deadline_for_the_whole_request(gap):
    server = Trickle(gap)
    try:
        sender = notify.Sender(env={"HOOK": server.url}, http_timeout=1.0)
        started = time.monotonic()
        error = sender.send({"webhook_env": "HOOK"}, {"event": "e", "kind": "finished", "text": "t", "fields": {}})
        took = time.monotonic() - started
    finally:
        server.close()
    assert error == "no complete answer within 1 s"
    assert took < 3.0, f"a byte every {gap} s never trips a per-read timeout; the deadline must ({took:.1f} s)"
    assert SECRET not in error


def test_flush_ends_when_a_retry_falls_due_at_the_deadline(tmp_path):
    """The retry falls due just before the deadline and the sleep overshoots it: flush used to call deliver with a
    zero budget and sleep 0 forever."""
    clock = Clock()
    sleeps = []

    def overshooting_sleep(seconds):
        sleeps.append(seconds)
        assert len(sleeps) < 100, "flush keeps looping"
        clock.now += seconds + 1.0

    console_file = tmp_path / "console.txt"
    with open(console_file, "w") as fh:
        n = notify.Notifier(tmp_path / "ledger", {"box": [{"command": "exit 1", "on": ["finished"]}]},
                            Console(file=fh, width=200), sender=notify.Sender(env={}), clock=clock, monotonic=clock)
        n.observe({"box": doc("finished")})
        n.deliver()
        clock.now += 0.2
        assert n.flush(deadline_s=notify.BACKOFF_BASE_S + 0.3, sleep=overshooting_sleep) == 1
    assert len(sleeps) <= 2
    assert "1 message(s) not delivered yet" in console_file.read_text()


def test_an_unset_webhook_variable_is_said_once_and_given_up_not_retried(tmp_path):
    console_file = tmp_path / "console.txt"
    with open(console_file, "w") as fh:
        n = notify.Notifier(tmp_path / "ledger", {"box": [{"webhook_env": "NOT_SET_HOOK", "on": ["running",
                                                                                               "finished"]}]},
                            Console(file=fh, width=200), sender=notify.Sender(env={}))
        for state in ("running", "finished"):
            n.observe({"box": doc(state)})
            n.deliver()
        started = time.monotonic()
        assert n.flush(deadline_s=30.0, sleep=lambda _s: pytest.fail("nothing to wait for")) == 0
        assert time.monotonic() - started < 1.0
    text = console_file.read_text()
    assert text.count("$NOT_SET_HOOK is not set in this shell") == 1 and "trying again" not in text
    slots = [s for e in json.loads((tmp_path / "ledger" / "notify" / "box.json").read_text())["events"]
             for s in e["deliveries"].values()]
    assert [(s["gave_up"], s["tries"], s["error"]) for s in slots] == [
        (True, 0, "$NOT_SET_HOOK is not set in this shell")] * 2


def test_a_command_that_hangs_is_killed_at_the_tick_budget(tmp_path):
    out = tmp_path / "started"
    n = notify.Notifier(tmp_path / "ledger", {"box": [{"command": f"touch {out}; sleep 30", "on": ["finished"]}]},
                        Console(file=open(tmp_path / "c.txt", "w")), sender=notify.Sender(env={}),  # noqa: SIM115
                        tick_budget_s=1.0)
    n.observe({"box": doc("finished")})
    started = time.monotonic()
    n.deliver()
    assert time.monotonic() - started < 3.0 and out.exists()
    slot = next(iter(json.loads((tmp_path / "ledger" / "notify" / "box.json").read_text())["events"][0]
                     ["deliveries"].values()))
    assert slot["error"].startswith("timed out after") and not slot["ok"]


# ---------------------------------------------------------------- every run on its own

def test_every_run_of_a_host_is_notified_and_a_failed_cell_says_why(tmp_path, receiver):
    n = make(tmp_path, receiver.url, on=("running", "finished", "failed"))

    def host(states):
        first, *others = [doc(s, run_id=r) for r, s in states]
        failed = {"evidence": {"exit": {"rc": 1}},
                  "history": {"log_error": {"line": "KeyError: 'lr'", "traceback": True}}}
        return {**first, "other_runs": [{**o, **(failed if o["state"] == "failed" else {})} for o in others]}

    n.observe({"box": host([("sw--lr=1", "running"), ("sw--lr=2", "running"), ("sw--lr=3", "running")])})
    n.deliver()
    n.observe({"box": host([("sw--lr=1", "finished"), ("sw--lr=2", "failed"), ("sw--lr=3", "running")])})
    n.deliver()
    again = make(tmp_path, receiver.url, on=("running", "finished", "failed"))  # a new watch: nothing twice
    again.observe({"box": host([("sw--lr=1", "finished"), ("sw--lr=2", "failed"), ("sw--lr=3", "finished")])})
    again.deliver()
    texts = [m["text"] for m in receiver.messages]
    assert [t.split(" (")[0] for t in texts] == [
        "rgt: box sw--lr=1 running", "rgt: box sw--lr=2 running", "rgt: box sw--lr=3 running",
        "rgt: box sw--lr=1 finished", "rgt: box sw--lr=2 failed", "rgt: box sw--lr=3 finished"]
    assert texts[4] == ("rgt: box sw--lr=2 failed (attempt 1): step 10, loss 0.5, exit 1, "
                        "Traceback in log: KeyError: 'lr'")
    runs = json.loads((tmp_path / "ledger" / "notify" / "box.json").read_text())["runs"]
    assert {r: v["state"] for r, v in runs.items()} == {"sw--lr=1": "finished", "sw--lr=2": "failed",
                                                       "sw--lr=3": "finished"}


def test_a_ledger_of_the_old_shape_still_deduplicates(tmp_path, receiver):
    from rgt.ledger import atomic_write_json

    atomic_write_json(tmp_path / "ledger" / "notify" / "box.json", {
        "schema": "rgt/notify/v1", "host": "box", "unreachable_since": None, "unreachable_sent": [], "events": [],
        "last": {"run": "r1", "attempt": 1, "state": "running", "attention": [], "seen_at": 1.0}})
    n = make(tmp_path, receiver.url)
    tick(n, "running")
    assert receiver.messages == [], "r1's running was seen by the watch before the upgrade"
    tick(n, "finished")
    assert [m["text"].split("\n")[0] for m in receiver.messages] == ["rgt: box r1 finished (attempt 1): step 10, "
                                                                     "loss 0.5"]
    assert json.loads((tmp_path / "ledger" / "notify" / "box.json").read_text())["schema"] == "rgt/notify/v2"


def test_box_text_in_a_message_carries_no_control_sequence(tmp_path):
    out = tmp_path / "got"
    rules = {"box": [{"command": f"env | grep ^RGT_NOTIFY_ > {out}; cat >> {out}", "on": ["failed", "attention"]}]}
    n = notify.Notifier(tmp_path / "ledger", rules, Console(file=open(tmp_path / "c.txt", "w")),  # noqa: SIM115
                        sender=notify.Sender(env={"PATH": "/usr/bin:/bin"}))
    evil = "\x1b[2J\x1b[H\x1b]0;pwned\x07verified: 999 files\nforged line\x9b1A"
    n.observe({"box": doc("failed", loss=evil, run_id="r\x1b[31m1",
                          attention=[{"id": "nan\x1b[0m", "message": evil}],
                          history={"log_error": {"line": f"RuntimeError: {evil}", "traceback": False}})},
              summary=f"0/1 finished, 1 failed (box: {evil})")
    n.deliver()
    got = out.read_bytes()
    assert b"verified: 999 files" in got and b"RGT_NOTIFY_KIND=attention" in got
    for byte in (b"\x1b", b"\x07", "\x9b".encode(), b"\r"):
        assert byte not in got
    assert b"pwned" not in got and b"files\\nforged line" in got
