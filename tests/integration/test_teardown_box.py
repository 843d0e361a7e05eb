"""`rgt-run teardown` looks at the whole box (rgt issue 7): every run under <durable_root>/*/active/* and every
sealed export, of every project, decides the gate, not only the run of one job spec.

The box is this machine (connection local) with a temp durable root; runs are laid out by hand the way the wrapper
and closeout leave them (.rgt/attempts.jsonl + exit.json, export/<run_id>/ + its manifest), verified pulls by
tests/fakes/capsule.py, a live run by a process we start that holds the run's flock (as the wrapper does). The
control plane is a local fake (RunPod v2 through RUNPOD_API_URL, AutoDL): a refusal must leave it with zero calls.
"""

import json
import os
import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.fakes.capsule import make_pull
from tests.fakes.control_planes import RunPodV2

REPO = Path(__file__).resolve().parents[2]
PY = REPO / ".venv" / "bin" / "python"
TOKEN = "rp-box-token"
FAST = json.dumps({"teardown_poll_interval_s": 0.3, "teardown_poll_timeout_s": 20})

pytestmark = pytest.mark.skipif(not (REPO / ".venv" / "bin" / "ansible-playbook").exists(),
                                reason="needs .venv with ansible-core")

HOLD = ("import fcntl, sys, time\n"
        "handle = open(sys.argv[1], 'a+')\n"
        "fcntl.flock(handle.fileno(), fcntl.LOCK_EX)\n"
        "print('held', flush=True)\n"
        "time.sleep(600)\n")


class Box:
    """One instance (this machine) with a durable root holding several runs, and the controller's runs root."""

    def __init__(self, tmp_path: Path, profile: str, instance_id: str, hosts=("box",)):
        self.instance_id = instance_id
        self.durable = tmp_path / "durable"
        self.runs = tmp_path / "runs"
        self.inv = tmp_path / "hosts.yml"
        hv = {"ansible_connection": "local", "ansible_python_interpreter": str(PY), "rgt_profile": profile,
              "rgt_instance_id": instance_id, "rgt_durable_root": str(self.durable)}
        if len(hosts) > 1:
            hv["rgt_shared_volume"] = True
        self.inv.write_text(json.dumps({"all": {"hosts": {name: dict(hv) for name in hosts}}}))

    def run_dir(self, project: str, run_id: str) -> Path:
        return self.durable / project / "active" / run_id

    def attempt(self, project: str, run_id: str, reason: str | None, attempt: int = 1) -> Path:
        meta = self.run_dir(project, run_id) / ".rgt"
        meta.mkdir(parents=True, exist_ok=True)
        (meta / "attempts.jsonl").write_text(json.dumps({"attempt": attempt, "started_at": "2026-11-30T00:00:00Z"})
                                             + "\n")
        if reason:
            (meta / "exit.json").write_text(json.dumps({"attempt": attempt, "rc": 0, "reason": reason}))
        return meta

    def sealed(self, project: str, run_id: str, host: str = "box", instance_id: str | None = None,
               pulled: bool = True) -> None:
        """A finished run, sealed on the box, and (pulled=True) its verified pull on the controller."""
        self.attempt(project, run_id, "finished")
        raw, files = make_pull(self.runs, run_id, host, instance_id or self.instance_id)
        export = self.durable / project / "export"
        for rel, data in files.items():
            (export / run_id / rel).parent.mkdir(parents=True, exist_ok=True)
            (export / run_id / rel).write_bytes(data)
        (export / f"{run_id}.manifest.json").write_bytes(raw)
        if not pulled:
            for name in (f"{host}.PULL_VERIFIED.json", f"{host}.manifest.json"):
                (self.runs / run_id / name).unlink()

    @contextmanager
    def live(self, project: str, run_id: str):
        """A running wrapper, as far as anyone can tell: a process holding the run's .rgt/lock."""
        meta = self.attempt(project, run_id, None)
        proc = subprocess.Popen([sys.executable, "-c", HOLD, str(meta / "lock")], stdout=subprocess.PIPE, text=True)
        try:
            assert proc.stdout.readline().strip() == "held"
            yield proc
        finally:
            proc.kill()
            proc.wait()

    def record(self, ledger: Path, host: str = "box") -> dict | None:
        path = ledger / "teardown" / f"{host}.json"
        return json.loads(path.read_text()) if path.exists() else None


def runpod_env(fake) -> dict:
    return {"RUNPOD_API_KEY": TOKEN, "RUNPOD_API_URL": fake.url}


def test_a_live_run_of_another_job_refuses_and_calls_nothing(rgt, tmp_path):
    box = Box(tmp_path, "runpod", "pod-live-1")
    box.sealed("proj", "a")
    with RunPodV2(token=TOKEN) as fake, box.live("proj", "b"):
        fake.add_pod(box.instance_id)
        result = rgt("teardown", "-i", box.inv, "--runs-dir", box.runs, "--confirm", box.instance_id, "-e", FAST,
                     "--json", env=runpod_env(fake))
        assert result.rc == 3, result.stderr
        assert "run proj/b is running (attempt 1)" in result.stderr
        assert fake.calls() == []
    gate = result.doc["instances"]["pod-live-1"]["gate"]
    assert {(r["project"], r["run_id"], r["state"], r["pull"]) for r in gate["runs"]} == {
        ("proj", "a", "finished", "verified"), ("proj", "b", "live", "-")}
    assert gate["reasons"] == ["run proj/b is running (attempt 1)"]
    assert box.record(rgt.ledger) is None


def test_a_finished_run_that_was_not_pulled_refuses_naming_it(rgt, tmp_path):
    box = Box(tmp_path, "runpod", "pod-unpulled-1")
    box.sealed("proj", "a")
    box.attempt("other", "c", "finished")  # finished, never sealed
    box.sealed("proj", "d", pulled=False)  # sealed, never pulled
    with RunPodV2(token=TOKEN) as fake:
        fake.add_pod(box.instance_id)
        result = rgt("teardown", "-i", box.inv, "--runs-dir", box.runs, "--confirm", box.instance_id, "-e", FAST,
                     "--json", env=runpod_env(fake))
        assert result.rc == 3, result.stderr
        assert fake.calls() == []
    assert "run other/c finished but its export is not sealed: run `rgt-run pull`" in result.stderr
    assert "run proj/d (finished) is sealed, not pulled" in result.stderr
    rows = {r["run_id"]: r for r in result.doc["instances"]["pod-unpulled-1"]["gate"]["runs"]}
    assert rows["a"]["pull"] == "verified" and rows["a"]["blocks"] is False
    assert rows["c"]["pull"] == "not sealed" and rows["c"]["blocks"] is True
    assert rows["d"]["pull"] == "sealed, not pulled" and rows["d"]["blocks"] is True
    assert result.doc["hosts"]["box"]["refused"] is True


def test_every_run_verified_lists_them_all_then_terminates_once(rgt, tmp_path):
    box = Box(tmp_path, "runpod", "pod-ok-1")
    box.sealed("proj", "a")
    box.sealed("other", "b")
    box.attempt("proj", "c", "failed", attempt=2)  # does not block; its files go with the box
    with RunPodV2(token=TOKEN) as fake:
        fake.add_pod(box.instance_id)
        result = rgt("teardown", "-i", box.inv, "--runs-dir", box.runs, "--confirm", box.instance_id, "-e", FAST,
                     "--json", env=runpod_env(fake))
        assert result.rc == 0, result.stderr
        deletes = fake.mutating_calls()
        assert [(c["method"], c["path"]) for c in deletes] == [("DELETE", "/v2/pods/pod-ok-1")]
    plan, _, after = result.stderr.partition("teardown of 1 instance(s)")
    assert "proj/a" in plan and "other/b" in plan and plan.count("verified (3 files") == 2
    assert "run proj/c (failed) is not pulled; its files go with the box: Terminate deletes /" in plan
    item = result.doc["instances"]["pod-ok-1"]
    assert {(r["project"], r["run_id"], r["pull"]) for r in item["gate"]["runs"]} == {
        ("proj", "a", "verified"), ("other", "b", "verified"), ("proj", "c", "not pulled")}
    assert item["gate"]["passed"] is True and item["outcome"]["final_state"] == "gone"
    assert result.doc["hosts"]["box"]["final_state"] == "gone"
    assert box.record(rgt.ledger)["final_state"] == "gone"
    assert TOKEN not in result.stdout + result.stderr


def test_a_manifest_written_on_another_instance_refuses_naming_the_run(rgt, tmp_path):
    box = Box(tmp_path, "runpod", "pod-mine-1")
    box.sealed("proj", "a")
    box.sealed("proj", "moved", instance_id="pod-elsewhere-9")  # a capsule copied here from another box
    with RunPodV2(token=TOKEN) as fake:
        fake.add_pod(box.instance_id)
        result = rgt("teardown", "-i", box.inv, "--runs-dir", box.runs, "--confirm", box.instance_id, "-e", FAST,
                     "--json", env=runpod_env(fake))
        assert result.rc == 3, result.stderr
        assert fake.calls() == []
    reason = "run proj/moved (finished): its manifest was written on instance 'pod-elsewhere-9', not on 'pod-mine-1'"
    assert reason in result.stderr
    assert any(r.startswith(reason) for r in result.doc["instances"]["pod-mine-1"]["reasons"])


def test_two_hosts_sharing_one_instance_are_one_teardown_with_one_meter_stop(rgt, tmp_path):
    box = Box(tmp_path, "runpod", "pod-shared-1", hosts=("left", "right"))
    box.sealed("proj", "run-left", host="left")
    box.sealed("proj", "run-right", host="right")
    with RunPodV2(token=TOKEN) as fake:
        fake.add_pod(box.instance_id)
        result = rgt("teardown", "-i", box.inv, "--runs-dir", box.runs, "--confirm", box.instance_id, "-e", FAST,
                     "--json", env=runpod_env(fake))
        assert result.rc == 0, result.stderr
        assert [(c["method"], c["path"]) for c in fake.mutating_calls()] == [("DELETE", "/v2/pods/pod-shared-1")]
    item = result.doc["instances"]["pod-shared-1"]
    assert item["hosts"] == ["left", "right"] and list(result.doc["instances"]) == ["pod-shared-1"]
    assert sorted(r["run_id"] for r in item["gate"]["runs"]) == ["run-left", "run-right"]  # each run once
    assert {r["host"] for r in item["gate"]["runs"]} == {"left", "right"}
    for host in ("left", "right"):
        assert box.record(rgt.ledger, host)["final_state"] == "gone"
        assert result.doc["hosts"][host]["final_state"] == "gone"


def test_the_teardown_playbook_through_rgt_run_gets_the_same_plan_and_gate(rgt, tmp_path):
    box = Box(tmp_path, "runpod", "pod-pb-1")
    box.sealed("proj", "a")
    with RunPodV2(token=TOKEN) as fake:
        fake.add_pod(box.instance_id)
        result = rgt("playbooks/teardown.yml", "-i", box.inv, "--runs-dir", box.runs, "-e", FAST, "--json",
                     env=runpod_env(fake))
        assert result.rc == 3, result.stderr
        assert fake.calls() == []
    assert "runs on the box" in result.stderr and "proj/a" in result.stderr
    assert "no terminal to ask on: pass --confirm pod-pb-1" in result.stderr
    assert result.doc["instances"]["pod-pb-1"]["gate"]["passed"] is True
    assert result.doc["hosts"]["box"]["refused"] is True
    assert box.record(rgt.ledger) is None


def test_autodl_without_a_token_gives_the_console_steps_and_the_15_day_clock(rgt, tmp_path):
    box = Box(tmp_path, "autodl", "autodl-box-1")
    box.sealed("proj", "a")
    env = {k: v for k, v in os.environ.items() if k != "AUTODL_TOKEN"}
    proc = subprocess.run([sys.executable, "-m", "rgt.cli", "teardown", "-i", str(box.inv), "--runs-dir",
                           str(box.runs), "--confirm", box.instance_id, "--json"], capture_output=True, text=True,
                          env={**env, "RGT_LEDGER": str(rgt.ledger)}, cwd=REPO, timeout=300)
    assert proc.returncode == 0, proc.stderr
    plan, _, after = proc.stderr.partition("teardown of 1 instance(s)")
    for text in (plan, after):
        assert "容器实例" in text and "click 关机 (power off)" in text  # the console steps
        assert "released after 15 days" in text  # the clock a powered-off box now runs
    assert "AUTODL_TOKEN is not set" in plan
    doc = json.loads(proc.stdout)
    item = doc["instances"]["autodl-box-1"]
    assert item["console_steps"] is True and any("关机" in s for s in item["manual_steps"])
    assert any("15 days" in c for c in item["clocks"])
    assert item["outcome"]["final_state"].startswith("manual") and item["outcome"]["calls"] == []
    assert any("15 days" in c for c in item["outcome"]["report"]["clocks"])
