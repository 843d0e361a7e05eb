"""The teardown role and playbook run alone with ansible-playbook (no runner) on the controller (connection local):
the role gates itself on every run of the box (a live run of another job refuses even a confirmed teardown), the
reversible AutoDL 关机 against a fake, manual and `none` verbs call nothing, and check mode reports without
calling. No job spec is needed: the gate is box-wide."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.fakes.capsule import make_pull
from tests.fakes.control_planes import AutoDL, RunPodV2

REPO = Path(__file__).resolve().parents[2]
ANSIBLE_PLAYBOOK = REPO / ".venv" / "bin" / "ansible-playbook"
RUN_ID = "loc-run"

pytestmark = pytest.mark.skipif(not ANSIBLE_PLAYBOOK.exists(), reason="needs .venv with ansible-core")


class Box:
    def __init__(self, tmp_path: Path, profile: str, instance_id: str):
        self.tmp = tmp_path
        self.instance_id = instance_id
        self.durable = tmp_path / "durable"
        self.runs = tmp_path / "runs"
        self.ledger = tmp_path / "ledger"
        raw, files = make_pull(self.runs, RUN_ID, "box", instance_id)
        export = self.durable / "proj" / "export"
        for rel, data in files.items():
            (export / RUN_ID / rel).parent.mkdir(parents=True, exist_ok=True)
            (export / RUN_ID / rel).write_bytes(data)
        (export / f"{RUN_ID}.manifest.json").write_bytes(raw)
        inv = tmp_path / "hosts.yml"
        inv.write_text(json.dumps({"all": {"hosts": {"box": {
            "ansible_connection": "local", "ansible_python_interpreter": str(REPO / ".venv" / "bin" / "python"),
            "rgt_profile": profile, "rgt_instance_id": instance_id, "rgt_durable_root": str(self.durable),
            "rgt_project": "proj"}}}}))
        self.inv = inv

    def play(self, *args: str, env: dict | None = None, **evars) -> subprocess.CompletedProcess:
        extra = {"rgt_ledger_dir": str(self.ledger), "rgt_runs_dir": str(self.runs), "teardown_poll_interval_s": 0.3,
                 "teardown_poll_timeout_s": 20, **evars}
        full_env = {**os.environ, "ANSIBLE_CONFIG": str(REPO / "ansible.cfg"),
                    "ANSIBLE_COLLECTIONS_PATH": str(REPO / ".collections"), "ANSIBLE_NOCOLOR": "1", **(env or {})}
        return subprocess.run([str(ANSIBLE_PLAYBOOK), "-i", str(self.inv), str(REPO / "playbooks" / "teardown.yml"),
                               "-e", json.dumps(extra), *args], capture_output=True, text=True, env=full_env,
                              cwd=REPO, timeout=300)

    def record(self) -> dict | None:
        path = self.ledger / "teardown" / "box.json"
        return json.loads(path.read_text()) if path.exists() else None


def test_playbook_alone_refuses_without_confirmation(tmp_path):
    box = Box(tmp_path, "runpod", "pod-local-1")
    with RunPodV2(token="t") as fake:
        fake.add_pod("pod-local-1")
        proc = box.play(env={"RUNPOD_API_KEY": "t"}, teardown_base_url=fake.url)
        assert proc.returncode != 0
        assert "no confirmation" in proc.stdout and "rc_hint" in proc.stdout
        assert fake.calls() == []
    assert box.record() is None


def test_playbook_alone_refuses_a_live_run_on_the_box_even_when_confirmed(tmp_path):
    box = Box(tmp_path, "runpod", "pod-local-live")
    meta = box.durable / "other" / "active" / "b" / ".rgt"
    meta.mkdir(parents=True)
    (meta / "attempts.jsonl").write_text(json.dumps({"attempt": 1, "started_at": "2026-11-30T00:00:00Z"}) + "\n")
    hold = ("import fcntl, sys, time\nh = open(sys.argv[1], 'a+')\nfcntl.flock(h.fileno(), fcntl.LOCK_EX)\n"
            "print('held', flush=True)\ntime.sleep(600)\n")
    holder = subprocess.Popen([sys.executable, "-c", hold, str(meta / "lock")], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with RunPodV2(token="t") as fake:
            fake.add_pod("pod-local-live")
            proc = box.play(env={"RUNPOD_API_KEY": "t"}, teardown_base_url=fake.url,
                            rgt_teardown_confirm="pod-local-live")
            assert proc.returncode != 0
            assert "run other/b is running (attempt 1)" in proc.stdout and "rc_hint" in proc.stdout
            assert fake.calls() == []
    finally:
        holder.kill()
        holder.wait()
    assert box.record() is None


def test_check_mode_reports_and_calls_nothing(tmp_path):
    box = Box(tmp_path, "runpod", "pod-local-2")
    with RunPodV2(token="t") as fake:
        fake.add_pod("pod-local-2")
        proc = box.play("--check", env={"RUNPOD_API_KEY": "t"}, teardown_base_url=fake.url,
                        rgt_teardown_confirm="pod-local-2")
        assert proc.returncode == 0, proc.stdout
        assert "would terminate pod-local-2" in proc.stdout
        assert fake.calls() == []
    assert box.record() is None


def test_autodl_power_off_is_reversible_and_waits_for_shutdown(tmp_path):
    box = Box(tmp_path, "autodl", "adl-local-1")
    with AutoDL(token="adl-token", lag_s=1.0) as fake:
        fake.add_instance("adl-local-1")
        # an ops team's own play confirms the role with its own variable (rgt-run refuses it and asks instead)
        proc = box.play(env={"AUTODL_TOKEN": "adl-token"}, teardown_base_url=fake.url, teardown_confirm="adl-local-1")
        assert proc.returncode == 0, proc.stdout
        assert len(fake.calls("POST")) == 1
        assert all(r["headers"]["Authorization"] == "<redacted>" for r in fake.calls())
    rec = box.record()
    assert rec["final_state"] == "stopped" and rec["reversible"] is True and rec["verb"] == "power_off"
    assert any("autodl-tmp" in line for line in rec["keeps_billing"])
    assert "adl-token" not in proc.stdout + json.dumps(rec)


@pytest.mark.parametrize("profile, expect", [("generic_ssh", "manual"), ("local", "nothing to stop")])
def test_verbs_without_an_api_call_nothing(tmp_path, profile, expect):
    box = Box(tmp_path, profile, "box-1")
    proc = box.play(rgt_teardown_confirm="box-1")
    assert proc.returncode == 0, proc.stdout
    rec = box.record()
    assert expect in rec["final_state"] and rec["calls"] == []


def test_autodl_without_a_token_gives_the_console_steps_for_power_off(tmp_path):
    # 关机 is reversible and, for most AutoDL users, a console click: no token means steps, not an error
    box = Box(tmp_path, "autodl", "autodl-notoken")
    env = {k: v for k, v in os.environ.items() if k != "AUTODL_TOKEN"}
    proc = subprocess.run([str(ANSIBLE_PLAYBOOK), "-i", str(box.inv), str(REPO / "playbooks" / "teardown.yml"),
                           "-e", json.dumps({"rgt_ledger_dir": str(box.ledger), "rgt_runs_dir": str(box.runs),
                                             "rgt_teardown_confirm": "autodl-notoken"})],
                          capture_output=True, text=True, cwd=REPO, timeout=300,
                          env={**env, "ANSIBLE_CONFIG": str(REPO / "ansible.cfg"),
                               "ANSIBLE_COLLECTIONS_PATH": str(REPO / ".collections"), "ANSIBLE_NOCOLOR": "1"})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "AUTODL_TOKEN is not set" in proc.stdout and "关机" in proc.stdout
    assert box.record()["final_state"].startswith("manual")


def test_playbook_alone_resumes_a_stop_in_flight_by_polling_without_a_confirmation(tmp_path):
    """An earlier run recorded its terminate and was killed while it polled: the role polls the same pod to the
    end without listing the box, asking or calling again, and keeps the earlier call in the record."""
    box = Box(tmp_path, "runpod", "pod-local-resume")
    delete = {"method": "DELETE", "path": "/v2/pods/pod-local-resume", "status": 204}
    (box.ledger / "teardown").mkdir(parents=True)
    (box.ledger / "teardown" / "box.json").write_text(json.dumps({
        "instance_id": "pod-local-resume", "verb": "terminate", "reversible": False, "keeps_billing": [],
        "final_state": "requested — not reported gone yet", "requested_at": "2026-12-01T06:43:00+00:00",
        "calls": [{"method": "GET", "path": "/v2/pods/pod-local-resume", "status": 200}, delete]}))
    with RunPodV2(token="t", lag_s=1.0) as fake:
        fake.add_pod("pod-local-resume")
        fake.mark_gone("pod-local-resume")  # terminated by the earlier run; still listed for a second
        proc = box.play(env={"RUNPOD_API_KEY": "t"}, teardown_base_url=fake.url)
        assert proc.returncode == 0, proc.stdout
        assert fake.mutating_calls() == [] and fake.calls("GET")
    assert re.search(r"List every run on the box[^\n]*\nskipping: \[box\]", proc.stdout), proc.stdout
    rec = box.record()
    assert rec["final_state"] == "gone" and rec["requested_at"] == "2026-12-01T06:43:00+00:00"
    assert rec["calls"][:2] == [{"method": "GET", "path": "/v2/pods/pod-local-resume", "status": 200}, delete]
    assert rec["calls"][-1]["status"] == 404
