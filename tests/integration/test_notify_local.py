"""Notifications and box text through `rgt-run`, on the local profile (every host is this machine).

Each run is laid out under a temp durable root as the wrapper leaves it when the job has ended (job.json, the
attempt records, exit.json, logs/job.log); `rgt-run status`, `logs` and `watch` read it with the box's own code
(the status round's zipapp). A box that lies is a `python3` on it that forges the status document it prints (the
box runs whatever interpreter it has). The webhooks are local fakes: one that answers a byte every 3 s, one that
never answers, one that records what it gets.
"""

import http.server
import json
import os
import re
import socket
import stat
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
from clihelp import write_inventory

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / ".collections"))
from ansible_collections.rgt.remote_gpu.plugins.module_utils import rgt_runlayout  # noqa: E402

pytestmark = pytest.mark.skipif(not (REPO / ".venv" / "bin" / "ansible-inventory").exists(),
                                reason="needs .venv with ansible-core")

SECRET = "T0/B0/zzNOTIFYzz"
CONTROL = (b"\x1b", b"\x07", b"\x9b", "\x9b".encode(), "\x9d".encode(), b"\r")
# the documented bound of watch's notifications: a tick spends at most 15 s on them, the end of watch at most 15 s
# (docs/report.md); with Python and Ansible starting, far below the 261 s a trickling webhook once held it for
WATCH_BOUND_S = 120


def lay_out(durable: Path, run_id: str, reason: str = "finished", rc: int = 0, log: str = "") -> None:
    """A run whose job has ended, as the wrapper leaves it."""
    p = rgt_runlayout.RunPaths(str(durable), "rgt", run_id)
    for d in (p.meta, p.logs, p.ckpt, p.out):
        os.makedirs(d, exist_ok=True)
    rgt_runlayout.atomic_write_json(p.job, {
        "schema": 1, "run_id": run_id, "project": "rgt", "run_dir": p.run_dir, "outputs": [], "log_patterns": {},
        "price_per_hour": 1.0, "heartbeat_interval_s": 5, "stall_after_s": 600, "attempt_policy": {}})
    now = time.time()
    inc = rgt_runlayout.incarnation()
    rgt_runlayout.atomic_write_json(p.pid, {"wrapper_pid": 999999, "job_pid": 999999, "pgid": 999999,
                                            "attempt": 1, "incarnation": inc})
    rgt_runlayout.atomic_write_json(p.heartbeat, {"ts": now - 5, "attempt": 1, "job_alive": False})
    rgt_runlayout.append_jsonl(p.attempts, {"attempt": 1, "started_at": now - 600, "code_dir": p.code_dir("abcd1234"),
                                            "resume_from": "", "incarnation": inc, "detach": "nohup"})
    rgt_runlayout.append_jsonl(p.attempts, {"attempt": 1, "ended_at": now - 10, "rc": rc, "signal": None,
                                            "reason": reason})
    rgt_runlayout.atomic_write_json(p.exit, {"attempt": 1, "rc": rc, "signal": None, "reason": reason,
                                             "ended_at": now - 10, "stop_signal": None})
    with open(p.log, "wb") as fh:
        fh.write(("== rgt attempt 1 started 2026-12-01T00:00:00Z resume_from=none\nstep=1 loss=0.9\n" + log)
                 .encode())


def local_host(durable: Path, job: dict, python: str = sys.executable) -> dict:
    return {"ansible_connection": "local", "ansible_python_interpreter": python, "rgt_profile": "local",
            "rgt_instance_id": "localhost", "rgt_durable_root": str(durable), "rgt_job": job,
            "rgt_shared_volume": True}


class Hold(threading.Thread):
    """A webhook that answers one byte every `gap` s, or never (`gap=None`); it reads nothing."""

    def __init__(self, gap):
        super().__init__(daemon=True)
        self.gap, self.sock, self.conns = gap, socket.create_server(("127.0.0.1", 0)), []
        self.start()

    @property
    def url(self):
        return f"http://127.0.0.1:{self.sock.getsockname()[1]}/services/{SECRET}"

    def run(self):
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.conns.append(conn)
            if self.gap is not None:
                threading.Thread(target=self.trickle, args=(conn,), daemon=True).start()

    def trickle(self, conn):
        for byte in b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok":
            time.sleep(self.gap)
            try:
                conn.sendall(bytes([byte]))
            except OSError:
                return

    def close(self):
        self.sock.close()
        for conn in self.conns:
            conn.close()


class Receiver(http.server.ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self):
        super().__init__(("127.0.0.1", 0), Handler)
        self.messages = []
        threading.Thread(target=self.serve_forever, daemon=True).start()

    @property
    def url(self):
        return f"http://127.0.0.1:{self.server_address[1]}/services/{SECRET}"


class Handler(http.server.BaseHTTPRequestHandler):
    def do_POST(self):  # noqa: N802 - http.server's name
        self.server.messages.append(json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0))))
        self.send_response(200)
        self.end_headers()

    def log_message(self, *_args):
        pass


def state_of(message):
    return {f["title"]: f["value"] for f in message["attachments"][0]["fields"]}["state"]


# ---------------------------------------------------------------- watch always ends

def test_watch_ends_within_its_bound_whatever_the_webhooks_do(tmp_path, rgt, monkeypatch):
    durable = tmp_path / "durable"
    lay_out(durable, "run-done")
    trickle, silent = Hold(3.0), Hold(None)
    rules = [{"webhook_env": "RGT_TRICKLE_HOOK", "on": ["finished"]},
             {"webhook_env": "RGT_SILENT_HOOK", "on": ["finished"]},
             {"webhook_env": "RGT_UNSET_HOOK", "on": ["finished"]}]
    inv = write_inventory(tmp_path / "inv", {"box": local_host(durable, {"name": "run-done", "notify": rules})})
    env = {"RGT_TRICKLE_HOOK": trickle.url, "RGT_SILENT_HOOK": silent.url}
    monkeypatch.delenv("RGT_UNSET_HOOK", raising=False)
    try:
        started = time.monotonic()
        # the subprocess timeout is the assertion that watch ended: well above the bound, far below 261 s
        res = rgt("watch", "-i", inv, "--interval", "1", "--max-ticks", "1", "--json", env=env,
                  timeout=WATCH_BOUND_S)
        took = time.monotonic() - started
    finally:
        trickle.close()
        silent.close()
    assert res.rc == 0, res.stderr
    assert res.doc["stopped"] == "settled" and res.doc["hosts"]["box"]["state"] == "finished"
    assert "1/1 finished" in res.stderr and "exit 0" in res.stderr
    assert res.stderr.count("$RGT_UNSET_HOOK is not set in this shell") == 1
    assert "no complete answer within 5 s" in res.stderr and "message(s) not delivered yet" in res.stderr
    assert SECRET not in res.stdout + res.stderr
    state = json.loads((rgt.ledger / "notify" / "box.json").read_text())
    (event,) = state["events"]
    slots = sorted((s["gave_up"], s["ok"], s["tries"], s["error"]) for s in event["deliveries"].values())
    assert slots[0][:2] == slots[1][:2] == (False, False) and slots[0][2] >= 1 and slots[1][2] >= 1
    assert all(s[3].startswith("no complete answer within ") for s in slots[:2]), slots
    assert slots[2] == (True, False, 0, "$RGT_UNSET_HOOK is not set in this shell")
    print(f"watch with a trickling, a silent and an unset webhook ended in {took:.0f} s")


# ---------------------------------------------------------------- every run on its own

def test_every_run_of_a_host_gets_its_messages_and_a_failed_one_says_why(tmp_path, rgt):
    """Two runs remembered on one box (the ledger's runs/<host>.json, as two launches leave it): watch looks at
    both in one round trip (the newer one and other_runs) and notifies each, once across watch restarts."""
    from rgt.ledger import atomic_write_json

    durable = tmp_path / "durable"
    lay_out(durable, "run-old")
    lay_out(durable, "run-new", reason="failed", rc=1, log="Traceback (most recent call last):\nKeyError: 'lr'\n")
    atomic_write_json(rgt.ledger / "runs" / "box.json", {"schema": "rgt/runs/v1", "host": "box",
                                                         "instance_id": "localhost", "runs": {
        f"rgt/{run}": {"run_id": run, "project": "rgt", "job": {"name": run}, "launched_at": at, "attempt": 1,
                       "state": "running", "detach": "nohup", "session": None, "code_dir": None, "recorded_at": at}
        for run, at in (("run-old", "2026-01-01T00:00:00+00:00"), ("run-new", "2026-01-02T00:00:00+00:00"))}})
    got = tmp_path / "messages.txt"
    host = {k: v for k, v in local_host(durable, {}).items() if k != "rgt_job"}
    host["rgt_notify"] = [{"command": f"printf '%s\\n' \"$RGT_NOTIFY_TEXT\" | head -n 1 >> {got}",
                           "on": ["finished", "failed"]}]
    inv = write_inventory(tmp_path / "inv", {"box": host})
    for _watch in range(2):
        res = rgt("watch", "-i", inv, "--interval", "1", "--max-ticks", "1", "--json", timeout=120)
        assert res.rc == 1, res.stdout + res.stderr
        runs = {r["run_id"]: r["state"] for r in (res.doc["hosts"]["box"], *res.doc["hosts"]["box"]["other_runs"])}
        assert runs == {"run-new": "failed", "run-old": "finished"}
    assert sorted(got.read_text().splitlines()) == [
        "rgt: box run-new failed (attempt 1): step 1, loss 0.9, exit 1, Traceback in log: KeyError: 'lr'",
        "rgt: box run-old finished (attempt 1): step 1, loss 0.9"]


# ---------------------------------------------------------------- docs/report.md's example works as written

def docs_notify_example() -> str:
    """The YAML block of docs/report.md's notify section, as the docs print it."""
    text = (REPO / "docs" / "report.md").read_text()
    section = text.split("## Notifications", 1)[1]
    block = re.search(r"```yaml\n(.*?)```", section, re.S).group(1)
    assert block.startswith("rgt_job:\n  notify:\n") and "\n      on: [" in block, block
    return block


def test_the_notify_example_of_the_docs_works_as_written(tmp_path, rgt):
    example = docs_notify_example()
    durable = tmp_path / "durable"
    lay_out(durable, "run-done")
    lay_out(durable, "run-crash", reason="failed", rc=1, log="Traceback (most recent call last):\nKeyError: 'lr'\n")
    bindir = tmp_path / "bin"
    bindir.mkdir()
    sent = tmp_path / "notify-send.txt"
    fake = bindir / "notify-send"  # the example's command: a stand-in that records what it was given
    fake.write_text(f"#!/bin/sh\nprintf '%s|%s\\n' \"$1\" \"$(printf '%s' \"$2\" | head -n 1)\" >> {sent}\n")
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    receiver = Receiver()
    env = {"SLACK_WEBHOOK_URL": receiver.url, "PATH": f"{bindir}{os.pathsep}{os.environ['PATH']}"}

    # in the inventory, each host's job with the example's notify block (ansible-inventory: `on:` -> "true")
    inv = tmp_path / "inv"
    inv.mkdir()
    hosts = "all:\n  hosts:\n"
    for host, run in (("done", "run-done"), ("crash", "run-crash")):
        hosts += f"    {host}:\n" + "".join(f"      {k}: {json.dumps(v)}\n" for k, v in
                                           local_host(durable, {}).items() if k != "rgt_job")
        hosts += f"      rgt_job:\n        name: {run}\n" + textwrap.indent(example.split("\n", 1)[1], " " * 6)
    (inv / "hosts.yml").write_text(hosts)
    try:
        res = rgt("watch", "-i", inv, "--interval", "1", "--max-ticks", "1", "--json", env=env, timeout=120)
        assert res.rc == 1, res.stdout + res.stderr  # a failed run; refused input would be 2
        assert {h: d["state"] for h, d in res.doc["hosts"].items()} == {"done": "finished", "crash": "failed"}
        # rule 1 (on: [finished, failed, ...]) got both; rule 2 (on: [finished]) only the finished run
        assert sorted(state_of(m) for m in receiver.messages) == ["failed", "finished"]
        assert sent.read_text().splitlines() == ["rgt|rgt: done run-done finished (attempt 1): step 1, loss 0.9"]

        # the same example as the job file of `-e @job.yml` (PyYAML: `on:` -> True), in a ledger of its own
        job_file = tmp_path / "job.yml"
        job_file.write_text(example.replace("rgt_job:\n", "rgt_job:\n  name: run-done\n", 1))
        again = rgt("watch", "-i", inv, "-l", "done", "-e", f"@{job_file}", "--ledger", tmp_path / "ledger-e",
                    "--interval", "1", "--max-ticks", "1", "--json", env=env, timeout=120)
        assert again.rc == 0, again.stdout + again.stderr
        assert sorted(state_of(m) for m in receiver.messages) == ["failed", "finished", "finished"]
        assert len(sent.read_text().splitlines()) == 2
    finally:
        receiver.shutdown()
    assert SECRET not in res.stdout + res.stderr + again.stdout + again.stderr


# ---------------------------------------------------------------- a box's control sequences reach nothing

EVIL_LOSS = "\x1b[2J\x1b[H\x1b]0;rgt: pwned\x07verified: 999 files\nPULL VERIFIED\x9b1A"
LIAR = """#!{python}
# the box's python3: runs the real one, then forges the status document it prints
import json, subprocess, sys
proc = subprocess.run([{real!r}, *sys.argv[1:]], stdin=sys.stdin, stdout=subprocess.PIPE)
out = proc.stdout
try:
    doc = json.loads(out.splitlines()[-1])
    status = doc["status"]
    status["loss"] = {loss!r}
    status["attention"] = [{{"id": "loss_spike\\x1b[8m", "message": {loss!r}}}]
    status["warnings"] = ["\\x1b]0;title\\x07disk \\x1b[5mfine\\x1b[0m"]
    out = (json.dumps(doc) + "\\n").encode()
except (ValueError, IndexError, KeyError, TypeError):
    pass
sys.stdout.buffer.write(out)
sys.exit(proc.returncode)
"""


def no_control(data: bytes, what: str) -> None:
    for byte in CONTROL:
        assert byte not in data, f"{what} holds {byte!r}: {data[:2000]!r}"
    assert b"pwned" not in data, f"{what} shows an OSC title's text"


def test_a_box_s_control_sequences_reach_no_terminal_and_no_notification(tmp_path, rgt):
    durable = tmp_path / "durable"
    log = ("\x1b[2J\x1b[H\x1b[1;32mverified: 999 files, SHA-256 match\x1b[0m\r\n"
           "\x1b]0;rgt: all verified\x07step=2 loss=0.8\n"
           "Traceback (most recent call last):\n"
           "RuntimeError: \x1b]2;pwned\x07\x1b[1Aboom\n")
    lay_out(durable, "run-evil", reason="failed", rc=1, log=log)
    liar = tmp_path / "python3"
    liar.write_text(LIAR.format(python=sys.executable, real=sys.executable, loss=EVIL_LOSS))
    liar.chmod(0o755)
    got = tmp_path / "notification.txt"
    job = {"name": "run-evil", "notify": [{"command": f"env | grep '^RGT_NOTIFY_' >> {got}; cat >> {got}",
                                           "on": ["failed", "attention"]}]}
    inv = write_inventory(tmp_path / "inv", {"box": local_host(durable, job, python=str(liar))})
    env = {"COLUMNS": "250"}

    status = rgt("status", "-i", inv, env=env, timeout=120)
    shown = (status.stdout + status.stderr).encode()
    assert status.rc == 5, status.stderr  # the forged attention; the run failed
    no_control(shown, "rgt-run status")
    assert "verified: 999 files\\nPULL VERIFIED" in status.stdout + status.stderr, "one field, one line"
    assert not [ln for ln in (status.stdout + status.stderr).splitlines()
                if ln.lstrip().startswith(("verified", "PULL VERIFIED"))]

    logs = rgt("logs", "-i", inv, env=env, timeout=120)
    assert logs.rc == 0, logs.stderr
    no_control((logs.stdout + logs.stderr).encode(), "rgt-run logs")
    assert logs.stdout.splitlines() == [
        "──── == rgt attempt 1 started 2026-12-01T00:00:00Z resume_from=none ────", "step=1 loss=0.9",
        "verified: 999 files, SHA-256 match", "step=2 loss=0.8", "Traceback (most recent call last):",
        "RuntimeError: boom"]

    watch = rgt("watch", "-i", inv, "--interval", "1", "--max-ticks", "1", env=env, timeout=120)
    assert watch.rc == 5, watch.stderr
    no_control((watch.stdout + watch.stderr).encode(), "rgt-run watch")
    sent = got.read_bytes()
    no_control(sent, "the notification command's environment and stdin")
    assert b"RGT_NOTIFY_KIND=failed" in sent and b"RGT_NOTIFY_KIND=attention" in sent
    assert b"RuntimeError: boom" in sent and b"verified: 999 files\\nPULL VERIFIED" in sent
