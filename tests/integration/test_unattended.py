"""A meter stop authorised at launch (`rgt-run train --down`) and carried out by the watcher (rgt issue 20).

The box is this machine (connection local, a temp durable root) with the RunPod profile; its control plane is the
local fake (RUNPOD_API_URL). The first test launches a real run (examples/tiny_train) with --down and lets `rgt-run
watch` pull, verify and stop it, and measures from the job's exit to the instance's terminal state. The second
lays one finished run out by hand and drives the hostile cases through `rgt-run watch`: none of them may call the
control plane's DELETE, except the last (a watcher killed mid-stop and started again), which must call it once.
"""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from clihelp import wait_for

from ansible_collections.rgt.remote_gpu.plugins.module_utils import rgt_cloud
from rgt import unattended, watchlock
from tests.fakes.control_planes import RunPodV2

REPO = Path(__file__).resolve().parents[2]
TOKEN = "rp-down-token"
FAST = json.dumps({"teardown_poll_interval_s": 0.3, "teardown_poll_timeout_s": 30})

pytestmark = pytest.mark.skipif(not (REPO / ".venv" / "bin" / "ansible-playbook").exists(),
                                reason="needs .venv with ansible-core")


def inventory(tmp_path: Path, instance_id: str, job: dict | None = None) -> Path:
    hv = {"ansible_connection": "local", "ansible_python_interpreter": sys.executable, "rgt_profile": "runpod",
          "rgt_instance_id": instance_id, "rgt_durable_root": str(tmp_path / "durable"), "rgt_project": "proj"}
    if job:
        hv["rgt_job"] = job
    inv = tmp_path / "hosts.yml"
    inv.write_text(json.dumps({"all": {"hosts": {"box": hv}}}))
    return inv


def env_for(fake, tmp_path: Path) -> dict:
    return {"RUNPOD_API_KEY": TOKEN, "RUNPOD_API_URL": fake.url, "RGT_RUNS_DIR": str(tmp_path / "runs"),
            "TMUX_TMPDIR": str(tmp_path / "tmux")}


def deletes(fake) -> list:
    return [(c["method"], c["path"]) for c in fake.mutating_calls()]


def test_train_down_then_the_watcher_pulls_verifies_and_stops_the_meter_within_minutes(rgt, tmp_path):
    t0 = time.monotonic()
    (tmp_path / "tmux").mkdir()
    code = REPO / "examples" / "tiny_train"
    job = {"name": "down-run", "command": f"{sys.executable} train.py --steps 30 --ckpt-every 10 --sleep 0.1",
           "python": sys.executable, "code_dir": str(code), "gpu": {"count": 0},
           "outputs": ["weights.bin", "metrics.json"], "checkpoint": {"glob": "step_*.ckpt", "every_steps": 10},
           "disk_floor_gib": 0.01}
    inv = inventory(tmp_path, "pod-down-1", job)
    with RunPodV2(token=TOKEN) as fake:
        fake.add_pod("pod-down-1")
        env = env_for(fake, tmp_path)
        # an id that is not one of the boxes: exit 2 naming it, nothing launched
        bad = rgt("train", "-i", inv, "--down", "--down-confirm", "pod-nope", "--json", env=env)
        assert bad.rc == 2 and bad.doc["field"] == "--down-confirm", bad.stderr
        assert "'pod-nope' is not one of the boxes" in bad.doc["error"] and "pod-down-1" in bad.doc["fix"]
        # no id and no terminal to type it on: exit 2 with the flag to pass
        untyped = rgt("train", "-i", inv, "--down", "--json", env=env)
        assert untyped.rc == 2 and untyped.doc["fix"] == "--down-confirm pod-down-1", untyped.stderr
        # nothing would verify the results (no watcher, none installed, no offload): exit 3, nothing launched
        alone = rgt("train", "-i", inv, "--down", "--down-confirm", "pod-down-1", "--json", env=env)
        assert alone.rc == 3, alone.stderr
        assert "nothing would verify the results" in alone.doc["error"]
        assert not (tmp_path / "durable").exists() and not (rgt.ledger / "authorisations").exists()
        # a watcher holds the ledger: the plan, then the launch, then the authorisation
        with watchlock.acquire(rgt.ledger, "service"):
            train = rgt("train", "-i", inv, "--down", "--down-confirm", "pod-down-1", env=env)
        assert train.rc == 0, train.stderr
        assert "Terminate (terminate), IRREVERSIBLE" in train.stderr
        assert "keeps billing: Network Volumes" in train.stderr
        auth = json.loads(unattended.auth_path(rgt.ledger, "pod-down-1").read_text())
        assert auth["instance_id"] == "pod-down-1" and auth["runs"] == [
            {"project": "proj", "run_id": "down-run", "host": "box"}]
        assert auth["sha256"] == unattended.digest(auth) and auth["expires_ts"] - auth["created_ts"] == 7 * 86400
        assert fake.calls() == []
        t1 = time.monotonic()
        watch = rgt("watch", "-i", inv, "--interval", "1", "--max-ticks", "30", "-e", FAST, env=env)
        print(f"refusals+launch {t1 - t0:.1f} s, watch {time.monotonic() - t1:.1f} s")
        assert watch.rc == 0, watch.stderr
        assert deletes(fake) == [("DELETE", "/v2/pods/pod-down-1")]
    assert "verified: " in watch.stderr and "meter stopped: pod-down-1 gone" in watch.stderr
    assert watch.stderr.index("verified: ") < watch.stderr.index("meter stopped")  # the pull verified first
    receipt = json.loads(unattended.receipt_path(rgt.ledger, "pod-down-1").read_text())
    assert receipt["final_state"] == "gone" and receipt["authorisation"] == auth["sha256"]
    assert any("Network Volumes" in line for line in receipt["keeps_billing"])
    assert [(r["run_id"], r["pull"]) for r in receipt["runs"]] == [("down-run", "verified")]
    attempts = (tmp_path / "durable" / "proj" / "active" / "down-run" / ".rgt" / "attempts.jsonl").read_text()
    ended = [json.loads(line) for line in attempts.splitlines() if "ended_at" in line][-1]["ended_at"]
    exited = time.mktime(time.strptime(ended, "%Y-%m-%dT%H:%M:%SZ")) - time.timezone
    # from the job's exit to the instance's terminal state, at a 1 s interval: what the watcher adds to the
    # interval (bench/README.md: the default interval is 90 s, so this must leave room under 3 minutes)
    overhead = receipt["stopped_ts"] - exited
    print(f"job exit -> instance gone: {overhead:.1f} s at --interval 1")
    assert overhead < 90, overhead
    assert TOKEN not in watch.stdout + watch.stderr + json.dumps(receipt) + json.dumps(auth)


def kill_tree(pid: int) -> None:
    """SIGKILL a process and every process below it (by pid, from /proc), the deepest first."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                ppid = int(Path("/proc", entry, "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry))
    order, todo = [], [pid]
    while todo:
        here = todo.pop()
        order.append(here)
        todo += children.get(here, [])
    for victim in reversed(order):
        try:
            os.kill(victim, signal.SIGKILL)
        except OSError:
            pass


RUN = "hold-run"


def finished_run(durable: Path, project: str, run_id: str) -> Path:
    """A run the wrapper left finished (its output, log and attempt records), not sealed yet."""
    run_dir = durable / project / "active" / run_id
    for sub in (".rgt", "out", "logs"):
        (run_dir / sub).mkdir(parents=True, exist_ok=True)
    (run_dir / ".rgt" / "attempts.jsonl").write_text(
        json.dumps({"attempt": 1, "started_at": "2026-01-01T00:00:00Z"}) + "\n"
        + json.dumps({"attempt": 1, "ended_at": "2026-01-01T00:10:00Z", "rc": 0, "reason": "finished"}) + "\n")
    (run_dir / ".rgt" / "exit.json").write_text(json.dumps({"attempt": 1, "rc": 0, "signal": None,
                                                             "reason": "finished"}))
    (run_dir / ".rgt" / "job.json").write_text(json.dumps({
        "schema": 1, "run_id": run_id, "project": project, "run_dir": str(run_dir), "outputs": ["model.bin"],
        "log_patterns": {}, "heartbeat_interval_s": 5}))
    (run_dir / "logs" / "job.log").write_bytes(b"step=1 loss=1\n")
    (run_dir / "out" / "model.bin").write_bytes(b"weights " * 64)
    return run_dir


def authorise(ledger: Path, instance_id: str, names: str = "pod-hold-1", expires_in: float = 3600, **edit) -> dict:
    """An authorisation as `train --down` keeps it (the same digest), for `names`; `edit` changes it afterwards,
    as a hand would (its SHA-256 left as it was)."""
    now = time.time()
    doc = {"schema": unattended.SCHEMA, "instance_id": names, "hosts": ["box"], "profile": "runpod",
           "verb": "terminate", "label": "Terminate", "runs": [{"project": "proj", "run_id": RUN, "host": "box"}],
           "created_at": "2026-01-01T00:00:00Z", "created_ts": now - 60, "expires_at": "soon",
           "expires_ts": now + expires_in}
    doc["sha256"] = unattended.digest(doc)
    doc.update(edit)
    path = unattended.auth_path(ledger, instance_id)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc))
    return doc


def test_hostile_cases_never_stop_the_meter_and_a_killed_stop_is_polled_not_called_again(rgt, tmp_path):
    durable = tmp_path / "durable"
    finished_run(durable, "proj", RUN)
    notes = tmp_path / "notified.txt"
    job = {"name": RUN, "outputs": ["model.bin"],
           "notify": [{"command": f"echo \"$RGT_NOTIFY_KIND\" >> {notes}", "on": ["dead"]}]}
    inv = inventory(tmp_path, "pod-hold-1", job)
    ledger = rgt.ledger

    def watch(fake, *extra):
        return rgt("watch", "-i", inv, "--interval", "1", "--max-ticks", "1", "-e", FAST, *extra,
                   env=env_for(fake, tmp_path))

    with RunPodV2(token=TOKEN, lag_s=6) as fake:
        fake.add_pod("pod-hold-1")
        # an authorisation for another instance (its file copied here), and one kept for another box only
        authorise(ledger, "pod-other-2", names="pod-other-2")
        authorise(ledger, "pod-hold-1", names="pod-other-2")
        res = watch(fake)
        assert "names instance 'pod-other-2', not 'pod-hold-1'" in res.stderr, res.stderr
        # an expired one
        authorise(ledger, "pod-hold-1", expires_in=-1)
        res = watch(fake)
        assert "the authorisation expired" in res.stderr, res.stderr
        # edited by hand: a later expiry written in, the digest left as it was
        authorise(ledger, "pod-hold-1", expires_in=-1, expires_ts=time.time() + 86400)
        res = watch(fake)
        assert "changed after it was made (its SHA-256 does not match" in res.stderr, res.stderr
        assert deletes(fake) == [] and not (tmp_path / "runs").exists()  # refused before any pull
        # the same refusal again: not said or notified twice
        res = watch(fake)
        assert "NOT stopped" not in res.stderr, res.stderr

        # an unexpected run on the box (finished, and pulled too): the authorisation does not cover it
        authorise(ledger, "pod-hold-1")
        stray = finished_run(durable, "proj", "stray-run")
        res = watch(fake)
        assert "verified: " in res.stderr, res.stderr  # the watcher pulled its own run first
        assert "run proj/stray-run is on the box and the authorisation does not cover it" in res.stderr, res.stderr
        assert deletes(fake) == []
        subprocess.run(["rm", "-rf", str(stray)], check=True)

        # a byte changed on the box after the pull: the watcher's pull verifies again and fails; no stop
        model = durable / "proj" / "export" / RUN / "out" / "model.bin"
        good = model.read_bytes()
        model.write_bytes(b"X" + good[1:])
        res = watch(fake)
        assert "NOT verified" in res.stderr and "the pull before the stop did not verify" in res.stderr, res.stderr
        assert deletes(fake) == []
        assert not (tmp_path / "runs" / RUN / "box.PULL_VERIFIED.json").exists()
        model.write_bytes(good)
        assert not unattended.receipt_path(ledger, "pod-hold-1").exists()
        said = notes.read_text().split()
        assert said == ["meter_stop_refused"] * 5, said  # one message per refusal, none twice

        # the watcher killed mid-stop (the pod lingers 6 s after DELETE), then started again: polled, never
        # called again
        proc = subprocess.Popen([sys.executable, "-m", "rgt.cli", "watch", "-i", str(inv), "--interval", "1",
                                 "--max-ticks", "1", "-e", FAST], cwd=REPO, start_new_session=True,
                                env={**os.environ, "RGT_LEDGER": str(ledger), **env_for(fake, tmp_path)},
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            wait_for(lambda: deletes(fake), timeout=120, what="the DELETE")
            kill_tree(proc.pid)  # the watcher and the play it runs (ansible-runner gives it a session of its own)
        finally:
            proc.kill()
            proc.wait()
        record = json.loads((ledger / "teardown" / "box.json").read_text())
        assert rgt_cloud.record_state(record, "pod-hold-1") == rgt_cloud.RECORD_IN_FLIGHT, record
        assert not unattended.receipt_path(ledger, "pod-hold-1").exists()
        res = watch(fake)
        assert res.rc == 0, res.stderr
        assert "polling the stop in flight" in res.stderr, res.stderr
        assert deletes(fake) == [("DELETE", "/v2/pods/pod-hold-1")]  # once, by the killed watcher
    receipt = json.loads(unattended.receipt_path(ledger, "pod-hold-1").read_text())
    assert receipt["final_state"] == "gone" and receipt["status"] == "done"
