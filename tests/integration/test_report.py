"""A run preempted once, watched to the end, pulled and reported, with notifications, on a stub box.

`rgt-run train` ships examples/tiny_train to the runpod-like stub (real sshd, tmux, rsync) and the real wrapper
runs it; the box is preempted mid-run (5 s grace) and started again; `rgt-run watch` sees the preemption and
relaunches it (auto_resume); `rgt-run pull` seals, pulls, verifies and writes the report beside the pull; the page
is opened in a real headless browser (Debian's chromium). A local HTTP receiver stands in for Slack: it must get
exactly one message per transition across three watch runs, and the webhook URL (a secret) must appear in no output
and no file, here or on the box.

The box's clock is a day behind the controller's: every `rgt-run` of the scenario runs under libfaketime a day
ahead (LD_PRELOAD on the controller only: the box, reached over ssh, keeps its own clock). The cost and the wall
time must still be the box's minutes, never the day between the clocks.
"""

import http.server
import json
import os
import re
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import yaml
from clihelp import read_json, wait_for
from conftest import stub_inventory

REPO = Path(__file__).resolve().parents[2]
TINY = REPO / "examples" / "tiny_train" / "train.py"
RUN_ID = "rep-run"
BOX_RUNS = "/workspace/rgt/active"
SECRET = "XOXB-SECRET-7f3a9c"
PRICE = 3.6
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
FAKETIME = next(iter(sorted(Path("/usr/lib").glob("*/faketime/libfaketimeMT.so.1"))), None)  # Debian's libfaketime
DAY = 86400

pytestmark = [
    pytest.mark.skipif(not (REPO / ".venv" / "bin" / "ansible-playbook").exists(),
                       reason="needs .venv with ansible-core"),
    pytest.mark.skipif(shutil.which("tmux") is None, reason="needs tmux (the local profile detaches with it)"),
]

REPORT = [sys.executable, "-m", "rgt.cli", "report"]


class Receiver(http.server.ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self):
        super().__init__(("127.0.0.1", 0), Handler)
        self.messages = []
        self.thread = threading.Thread(target=self.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self):
        return f"http://127.0.0.1:{self.server_address[1]}/services/T0/B0/{SECRET}"


class Handler(http.server.BaseHTTPRequestHandler):
    def do_POST(self):  # noqa: N802 - http.server's name
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.server.messages.append({"path": self.path, "doc": json.loads(body)})
        self.send_response(200)
        self.end_headers()
        self.wfile.write(b"ok")

    def log_message(self, *_args):
        pass


def steps_of(log_text, attempt):
    """Steps the log shows for one attempt (between its start marker and the next marker)."""
    part = log_text.split(f"== rgt attempt {attempt} started", 1)[1].split("== rgt attempt", 1)[0]
    return [int(s) for s in re.findall(r"^step=(\d+) loss=", part, re.M)]


def fields(message):
    return {f["title"]: f["value"] for f in message["doc"]["attachments"][0]["fields"]}


@pytest.fixture
def lab(tmp_path, stub_fleet):
    """The runpod-like stub box (real sshd, tmux, rsync): a job priced and with notify rules, a local receiver."""
    stub = stub_fleet["stubs"]["rp"]
    receiver = Receiver()
    events = tmp_path / "events.txt"
    job = {"name": RUN_ID, "python": "/usr/bin/python3", "auto_resume": True, "price_per_hour": PRICE,
           "code_dir": str(TINY.parent), "outputs": ["weights.bin", "metrics.json"],
           "checkpoint": {"glob": "step_*.ckpt"}, "stall_after_s": 120, "disk_floor_gib": 0.01,
           "command": "python3 train.py --steps 300 --ckpt-every 10 --sleep 0.05 --seed 7",
           "notify": [{"webhook_env": "RGT_TEST_WEBHOOK", "on": ["running", "preempted", "finished", "attention"]},
                      {"command": f"printf '%s\\n' \"$RGT_NOTIFY_EVENT\" >> {events}", "on": ["finished"]}]}
    env = {"RGT_TEST_WEBHOOK": receiver.url, "RGT_RUNS_DIR": str(tmp_path / "runs")}
    if FAKETIME is not None:  # the controller a day ahead of the box: the same skew as a box a day behind
        env.update(LD_PRELOAD=str(FAKETIME), FAKETIME="+1d")
    yield {"tmp": tmp_path, "stub": stub, "fleet": stub_fleet, "job": job, "run_dir": f"{BOX_RUNS}/{RUN_ID}",
           "env": env, "receiver": receiver, "events": events, "runs": tmp_path / "runs", "skewed": bool(FAKETIME)}
    receiver.shutdown()
    stub.exec(["bash", "-c", f"pkill -f '[r]gt/active/{RUN_ID}' || true"], check=False)


def on_box(lab, cmd) -> str:
    return lab["stub"].exec(["bash", "-c", cmd], check=False).stdout


def box_json(lab, path):
    text = on_box(lab, f"cat {path} 2>/dev/null")
    try:
        return json.loads(text)
    except ValueError:
        return None


@pytest.mark.stubs
def test_a_preempted_run_is_watched_pulled_and_reported_with_one_message_per_transition(lab, rgt):
    env, receiver, run_dir = lab["env"], lab["receiver"], lab["run_dir"]
    outputs = []
    inv = stub_inventory(lab["fleet"], ["rp"], lab["job"])

    def call(*args, timeout=180):
        res = rgt(*args, env=env, timeout=timeout)
        outputs.append(res.stdout + res.stderr)
        return res

    launch = call("playbooks/train.yml", "-i", inv, "-e", "rgt_skip_smoke=true", timeout=300)
    assert launch.rc == 0, launch.stdout + launch.stderr
    ckpt = f"{run_dir}/ckpt"
    wait_for(lambda: on_box(lab, f"test -e {ckpt}/step_00000030.ckpt && echo y").strip(), 90,
             "the third checkpoint", interval=0.5)

    first = call("watch", "-i", inv, "--interval", "1", "--max-ticks", "1", "--json")
    assert first.rc == 0 and first.doc["hosts"]["rp"]["state"] == "running", first.stderr
    assert [fields(m)["state"] for m in receiver.messages] == ["running"]

    # the box is preempted mid-run (5 s grace: the wrapper forwards TERM, the job checkpoints and stops), and the
    # newest checkpoints are lost with it, so the relaunch resumes from step 20 and recomputes what came after
    lab["stub"].preempt(grace_s=5)
    lab["stub"].start()
    inv = stub_inventory(lab["fleet"], ["rp"], lab["job"])  # the port can change on restart, as on RunPod
    assert box_json(lab, f"{run_dir}/.rgt/exit.json")["reason"] == "preempted"
    on_box(lab, f"cd {ckpt} && for f in step_*.ckpt; do n=${{f#step_}}; n=${{n%.ckpt}}; "
                f"[ $((10#$n)) -gt 20 ] && rm -f $f; done; ls")

    second = call("watch", "-i", inv, "--interval", "1", "--max-ticks", "60", "--json", timeout=300)
    assert second.rc == 0, second.stderr
    assert second.doc["stopped"] == "settled" and second.doc["hosts"]["rp"]["state"] == "finished"
    assert [r["attempt"] for r in second.doc["relaunches"]] == [1]
    third = call("watch", "-i", inv, "--interval", "1", "--max-ticks", "1", "--json")
    assert third.rc == 0

    # exactly one message per transition, across three watch runs
    seen = [(fields(m)["state"], fields(m)["attempt"]) for m in receiver.messages]
    assert seen == [("running", "1"), ("preempted", "1"), ("running", "2"), ("finished", "2")], seen
    assert lab["events"].read_text().splitlines() == [f"{RUN_ID}#2:finished"]
    finished = receiver.messages[-1]["doc"]["text"]
    assert finished.startswith(f"rgt: rp {RUN_ID} finished (attempt 2)")
    assert "1/1 finished; 1 preemption" in finished and "so far" in finished
    so_far = float(re.search(r"\$([0-9.]+) so far", finished).group(1))
    assert so_far < PRICE * 600 / 3600, f"minutes of the box's time, not the day between the clocks: {finished}"

    log = on_box(lab, f"cat {run_dir}/logs/job.log")
    last1, steps2 = max(steps_of(log, 1)), steps_of(log, 2)
    assert steps2[0] == 21 and steps2[-1] == 300, "attempt 2 resumed from the step-20 checkpoint"
    assert "; 1 preemption, " in third.doc["summary"] and third.doc["summary"].startswith("1/1 finished")
    assert third.doc["summary"] in third.stderr

    pull = call("pull", "-i", inv, "--runs-dir", lab["runs"], "--json", timeout=240)
    assert pull.rc == 0, pull.stderr
    html_path = lab["runs"] / RUN_ID / "report.html"
    assert pull.doc["hosts"]["rp"]["report"] == str(html_path) and html_path.is_file(), pull.stderr
    assert f"report: {html_path}" in pull.stderr
    pulled = read_json(lab["runs"] / RUN_ID / "rp.report.json")["facts"]  # the pull's report, from watch's status
    assert pulled["idle_after_end_s"] < 600 and pulled["cost"] < PRICE * 900 / 3600, pulled

    # the report command itself (the same data, fetched again in the status round trip)
    res = subprocess.run([*REPORT, "-i", inv, "--run", RUN_ID, "--json"], capture_output=True, text=True,
                         env={**os.environ, "RGT_LEDGER": str(rgt.ledger), **env}, cwd=REPO, timeout=180)
    outputs.append(res.stdout + res.stderr)
    assert res.returncode == 0, res.stderr
    facts = json.loads(res.stdout)["reports"][0]["hosts"]["rp"]

    # the numbers against the ledger: the box's attempts.jsonl, the log, the price, the pull's marker
    records = [json.loads(ln) for ln in on_box(lab, f"cat {run_dir}/.rgt/attempts.jsonl").splitlines()]
    ends = [r for r in records if "ended_at" in r]
    assert [a["reason"] for a in facts["attempts"]] == [e["reason"] for e in ends] == ["preempted", "finished"]
    a1, a2 = facts["attempts"]
    assert a1["last_step"] == last1 and a2["resumed_from_step"] == 20 and a2["last_step"] == 300
    assert a1["recomputed_steps"] == facts["recomputed_steps"] == last1 - 20 > 0
    assert facts["lost_s"] == pytest.approx(a1["recomputed_steps"] * a1["wall_s"] / last1)
    from rgt import paths

    to_epoch = paths.module_util("rgt_reconcile").to_epoch
    starts = {r["attempt"]: to_epoch(r["started_at"]) for r in records if "started_at" in r}
    wall = sum(to_epoch(e["ended_at"]) - starts[e["attempt"]] for e in ends)
    assert facts["wall_s"] == pytest.approx(wall)
    assert facts["attempts_cost"] == pytest.approx(PRICE * wall / 3600, abs=1e-4)
    assert facts["cost"] > facts["attempts_cost"] and facts["idle_after_end_s"] > 0, "the box bills after the end"
    # one clock per duration: the box's end to its collected_at, then the controller's own time since the document
    # arrived; a minute or so here, never the day between the two clocks
    assert facts["idle_after_end_s"] < 600, facts["idle_after_end_s"]
    assert facts["cost"] == pytest.approx(facts["attempts_cost"] + PRICE * facts["idle_after_end_s"] / 3600, abs=1e-3)
    assert abs(facts["clock_offset_s"] - (DAY if lab["skewed"] else 0)) < 60, facts["clock_offset_s"]
    marker = read_json(lab["runs"] / RUN_ID / "rp.PULL_VERIFIED.json")
    # the log is part of the result: pulled beside the outputs, both attempts' lines, in the manifest
    pulled = lab["runs"] / RUN_ID / "rp"
    logs = sorted(p.name for p in (pulled / "logs").iterdir())
    assert {"job.log", "attempts.jsonl"} <= set(logs), logs
    pulled_log = (pulled / "logs" / "job.log").read_text()
    assert pulled_log == log and max(steps_of(pulled_log, 1)) == last1 and steps_of(pulled_log, 2)[-1] == 300
    assert [json.loads(ln) for ln in (pulled / "logs" / "attempts.jsonl").read_text().splitlines()] == records
    listed = [e["path"] for e in read_json(lab["runs"] / RUN_ID / "rp.manifest.json")["files"]]
    assert [p for p in listed if p.startswith("logs/")] == [f"logs/{n}" for n in logs]
    assert facts["verified"]["files"] == marker["files"] == 3 + len(logs)
    assert facts["verified"]["bytes"] == marker["bytes"]

    page = html_path.read_text()
    assert ('data-k="clock_offset_h">-24.00 h<' in page) is lab["skewed"], "the page names a skewed box clock"

    # a real browser: the page renders, every image loads, the numbers shown are the ledger's
    if CHROMIUM is None:
        pytest.skip("chromium is not installed (apt-get install chromium); the browser check did not run")
    probe = lab["tmp"] / "probe.html"
    probe.write_text(html_path.read_text().replace("</body>", (
        "<script>window.addEventListener('load',function(){var i=document.images,n=0;for(var k=0;k<i.length;k++)"
        "{if(i[k].complete&&i[k].naturalWidth>0)n++;}document.title='images '+n+'/'+i.length;});</script></body>")))
    dom = subprocess.run([CHROMIUM, "--headless", "--disable-gpu", "--no-sandbox", "--dump-dom",
                          f"file://{probe}"], capture_output=True, text=True, timeout=60).stdout
    loaded = re.search(r"<title>images (\d+)/(\d+)</title>", dom)
    assert loaded and loaded.group(1) == loaded.group(2) and int(loaded.group(2)) >= 2, dom[:300]

    def shown(key, where=dom):
        return [html_unescape(v) for v in re.findall(rf'data-k="{key}">([^<]*)<', where)]

    assert shown("attempts") == ["2"] and shown("preemptions") == ["1"]
    assert shown("reason") == ["preempted", "finished"]
    assert shown("resumed_from_step") == ["0", "20"] and shown("recomputed_steps")[0] == str(last1 - 20)
    assert shown("verified_files") == [str(marker["files"])] and shown("verified_bytes") == [str(marker["bytes"])]
    assert [float(v) for v in shown("attempt_cost")] == pytest.approx([a1["cost"], a2["cost"]], abs=1e-4)
    assert float(shown("cost")[0]) == pytest.approx(facts["cost"], abs=1e-4)
    assert float(shown("attempts_cost")[0]) == pytest.approx(PRICE * wall / 3600, abs=1e-4)
    assert 'data-plot="steps"' in dom and 'data-plot="time"' in dom
    assert 'href="rp/logs/job.log"' in dom and 'href="rp/logs/attempts.jsonl"' in dom  # relative to the page

    # a report that cannot be written never fails a verified pull: a warning, the pull's own exit code
    blocker = lab["runs"] / RUN_ID / "report-rp-steps.png"
    blocker.unlink()
    blocker.mkdir()
    again = call("pull", "-i", inv, "--runs-dir", lab["runs"], "--json", timeout=240)
    assert again.rc == 0 and again.doc["hosts"]["rp"]["verified"] is True, again.stderr
    assert "the report could not be written" in again.stderr and "the pull itself is verified" in again.stderr
    assert "report" not in again.doc["hosts"]["rp"]

    # the webhook URL is a secret: in no output and no file rgt wrote
    for text in outputs:
        assert SECRET not in text
    for root in (rgt.ledger, lab["runs"]):
        for path in Path(root).rglob("*"):
            if path.is_file():
                assert SECRET.encode() not in path.read_bytes(), path
    assert on_box(lab, f"grep -rl {SECRET} {run_dir} /tmp 2>/dev/null || true").strip() == "", "not on the box"
    if not lab["skewed"]:
        pytest.skip("libfaketime is not installed (apt-get install libfaketime): the clock-skew part did not run")


def html_unescape(text):
    import html

    return html.unescape(text).strip()


def test_a_notify_rule_with_an_unknown_event_is_refused_before_anything_runs(tmp_path, rgt):
    inv = tmp_path / "inv"
    inv.mkdir()
    (inv / "hosts.yml").write_text(yaml.safe_dump({"all": {"hosts": {"box": {
        "ansible_connection": "local", "rgt_profile": "local", "rgt_instance_id": "localhost",
        "rgt_durable_root": str(tmp_path / "d"),
        "rgt_job": {"name": "x", "notify": [{"webhook_env": "SLACK_WEBHOOK_URL", "on": ["finishd"]}]}}}}}))
    res = rgt("watch", "-i", inv, "--json", timeout=60)
    assert res.rc == 2
    assert res.doc["field"] == "rgt_job.notify[0].on[0]" and "finishd" in res.doc["error"]
    assert not (tmp_path / "d").exists() and not (rgt.ledger / "notify").exists()


def test_a_webhook_url_pasted_where_its_variable_name_goes_is_refused_and_never_echoed(tmp_path, rgt):
    url = "https://hooks.example.invalid/services/T000/B000/SECRETPART"
    inv = tmp_path / "inv"
    inv.mkdir()
    (inv / "hosts.yml").write_text(yaml.safe_dump({"all": {"hosts": {"box": {
        "ansible_connection": "local", "rgt_profile": "local", "rgt_instance_id": "localhost",
        "rgt_durable_root": str(tmp_path / "d"),
        "rgt_job": {"name": "x", "notify": [{"webhook_env": url, "on": ["finished"]}]}}}}}))
    res = rgt("watch", "-i", inv, "--json", timeout=60)
    assert res.rc == 2 and res.doc["field"] == "rgt_job.notify[0].webhook_env"
    assert "NAME of an environment variable" in res.doc["error"]
    assert "SECRETPART" not in res.stdout + res.stderr


@pytest.mark.parametrize("field,value,words", [
    ("metrics", {"eval_loss": "eval_loss=(["}, ["rgt_job.metrics.eval_loss", "regex"]),
    ("metrics", {"eval loss": "x=(\\d+)"}, ["rgt_job.metrics", "eval loss"]),
    ("log_patterns", {"loss": "loss=(["}, ["rgt_job.log_patterns.loss", "regex"]),
])
def test_a_log_pattern_or_metric_that_is_no_regex_is_refused_before_anything_runs(tmp_path, rgt, field, value,
                                                                                  words):
    inv = tmp_path / "inv"
    inv.mkdir()
    (inv / "hosts.yml").write_text(yaml.safe_dump({"all": {"hosts": {"box": {
        "ansible_connection": "local", "rgt_profile": "local", "rgt_instance_id": "localhost",
        "rgt_durable_root": str(tmp_path / "d"), "rgt_job": {"name": "x", field: value}}}}}))
    res = rgt("report", "-i", inv, "--json", timeout=60)
    assert res.rc == 2, res.stdout + res.stderr
    assert res.doc["field"] == words[0] and all(w in res.doc["error"] for w in words[1:]), res.doc
    assert not (tmp_path / "d").exists() and not (rgt.ledger / "status").exists()
