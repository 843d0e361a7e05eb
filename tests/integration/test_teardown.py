"""`rgt-run teardown` (python -m rgt.cli teardown) on a podman stub (runpod profile) against a fake RunPod v2.

The box holds a sealed export and its manifest (made by hand, tests/fakes/capsule.py) under a durable root of its
own (the stub is shared with other tests, whose runs would rightly block a box-wide gate); the controller holds
the matching pull and PULL_VERIFIED.json. No job spec is given: the gate judges every run on the box. The fake
records every request: a refusal must leave it with zero calls.
"""

import base64
import json
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest
from conftest import STUB_LAYOUTS, stub_inventory

from tests.fakes.capsule import make_pull
from tests.fakes.control_planes import RunPodV2

REPO = Path(__file__).resolve().parents[2]
PY = REPO / ".venv" / "bin" / "python"
TEARDOWN = "teardown"
TOKEN = "rp-test-token"
INSTANCE = STUB_LAYOUTS["rp"]["instance_id"]
RUN_ID = "tdrun"

pytestmark = [pytest.mark.stubs, pytest.mark.skipif(not PY.exists(), reason="needs .venv")]


class Teardown:
    def __init__(self, fleet, tmp_path: Path, fake: RunPodV2):
        self.fake = fake
        self.stub = fleet["stubs"]["rp"]
        self.root = "/workspace/td-" + uuid.uuid4().hex[:6]
        self.runs = tmp_path / "runs"
        self.ledger = tmp_path / "ledger"
        self.inv = stub_inventory(fleet, ["rp"])
        raw, files = make_pull(self.runs, RUN_ID, "rp", INSTANCE)
        export = f"{self.root}/proj/export"
        for rel, data in files.items():
            self.put(f"{export}/{RUN_ID}/{rel}", data)
        self.put(f"{export}/{RUN_ID}.manifest.json", raw)

    def put(self, path: str, data: bytes) -> None:
        self.stub.exec(f"mkdir -p \"$(dirname {path})\" && base64 -d > {path}",
                       input=base64.b64encode(data).decode())

    def run(self, *args: str, key: str = TOKEN, entry: str = TEARDOWN, timeout: int = 300, **evars):
        env = {"PATH": str(PY.parent) + ":/usr/bin:/bin", "HOME": str(Path.home()),
               "RUNPOD_API_URL": self.fake.url, "RUNPOD_API_KEY": key, "RGT_LEDGER": str(self.ledger)}
        extra = json.dumps({"rgt_durable_root": self.root, "teardown_poll_interval_s": 1,
                            "teardown_poll_timeout_s": 60, **evars})
        t0 = time.monotonic()
        # `rgt-run teardown ...` (the cli's subcommand) or `rgt-run <playbook> ...` (the generic path)
        first = ["teardown"] if entry == TEARDOWN else []
        proc = subprocess.run([str(PY), "-m", "rgt.cli", *first, *args, "-i", str(self.inv), "-e", extra, "--json"],
                              capture_output=True, text=True, env=env, timeout=timeout, cwd=REPO,
                              stdin=subprocess.DEVNULL)
        proc.elapsed = time.monotonic() - t0
        return proc

    def record(self) -> dict | None:
        path = self.ledger / "teardown" / "rp.json"
        return json.loads(path.read_text()) if path.exists() else None


@pytest.fixture
def td(stub_fleet, tmp_path):
    with RunPodV2(token=TOKEN, lag_s=2) as fake:
        fake.add_pod(INSTANCE)
        yield Teardown(stub_fleet, tmp_path, fake)


def doc_of(proc) -> dict:
    lines = [ln for ln in proc.stdout.splitlines() if ln.strip()]
    assert len(lines) == 1, proc.stdout + proc.stderr
    return json.loads(lines[0])


def test_teardown_refuses_without_confirm_when_not_interactive(td):
    proc = td.run("--runs-dir", str(td.runs))
    assert proc.returncode == 3, proc.stderr
    assert f"--confirm {INSTANCE}" in proc.stderr
    assert td.fake.calls() == []
    assert td.record() is None


def test_teardown_refuses_a_wrong_instance_id(td):
    proc = td.run("--runs-dir", str(td.runs), "--confirm", "pod-someone-else")
    assert proc.returncode == 3, proc.stderr
    assert "does not name the instance 'pod-9k2m4x'" in proc.stderr
    assert td.fake.calls() == []


def test_teardown_refuses_when_one_byte_differs(td):
    pulled = td.runs / RUN_ID / "rp" / "out" / "metrics.json"
    data = bytearray(pulled.read_bytes())
    data[2] ^= 0x01
    pulled.write_bytes(bytes(data))
    proc = td.run("--runs-dir", str(td.runs), "--confirm", INSTANCE)
    assert proc.returncode == 3, proc.stderr
    assert "out/metrics.json" in proc.stderr
    assert td.fake.calls() == []
    doc = doc_of(proc)
    assert doc["hosts"]["rp"]["refused"] is True


def test_teardown_refuses_when_the_box_manifest_changed_after_the_pull(td):
    td.stub.exec(f"echo ' ' >> {td.root}/proj/export/{RUN_ID}.manifest.json")
    proc = td.run("--runs-dir", str(td.runs), "--confirm", INSTANCE)
    assert proc.returncode == 3, proc.stderr
    assert f"run proj/{RUN_ID} (exported) was pulled, but the manifest on the box changed since" in proc.stderr
    assert td.fake.calls() == []


def test_teardown_terminates_once_polls_until_404_and_records_gone(td):
    proc = td.run("--runs-dir", str(td.runs), "--confirm", INSTANCE)
    assert proc.returncode == 0, proc.stderr
    deletes = td.fake.calls("DELETE")
    assert len(deletes) == 1 and deletes[0]["path"] == f"/v2/pods/{INSTANCE}"
    assert td.fake.calls()[-1]["status"] == 404
    rec = td.record()
    assert rec["final_state"] == "gone" and rec["instance_id"] == INSTANCE and rec["verb"] == "terminate"
    assert rec["reversible"] is False and rec["keeps_billing"]
    assert {"method": "DELETE", "path": f"/v2/pods/{INSTANCE}", "status": 204} in rec["calls"]
    assert TOKEN not in proc.stderr + proc.stdout + json.dumps(rec)
    doc = doc_of(proc)
    assert doc["hosts"]["rp"]["final_state"] == "gone"
    # a second run finds the ledger record: nothing is called again
    before = len(td.fake.calls())
    again = td.run("--runs-dir", str(td.runs), "--confirm", INSTANCE)
    assert again.returncode == 0, again.stderr
    assert "already gone" in again.stderr
    assert len(td.fake.calls()) == before


def test_teardown_poll_timeout_is_unknown_and_a_rerun_polls_without_calling_again(stub_fleet, tmp_path):
    # the pod stays listed after the terminate until the rerun has looked at it once (so the rerun must poll, not
    # call, however long its read-only look at the box took); then it goes
    with RunPodV2(token=TOKEN, lag_s=3600) as fake:
        fake.add_pod(INSTANCE)
        t = Teardown(stub_fleet, tmp_path, fake)
        proc = t.run("--runs-dir", str(t.runs), "--confirm", INSTANCE, teardown_poll_timeout_s=2)
        assert proc.returncode == 1, proc.stderr
        assert "check the console" in proc.stderr
        assert t.record()["final_state"].startswith("unknown")
        seen = len(fake.calls())

        def release_after_the_rerun_looked():
            deadline = time.monotonic() + 300
            while not any("status" in c for c in fake.calls()[seen:]) and time.monotonic() < deadline:
                time.sleep(0.1)
            fake.lag_s = 0

        threading.Thread(target=release_after_the_rerun_looked, daemon=True).start()
        again = t.run("--runs-dir", str(t.runs), "--confirm", INSTANCE)
        assert again.returncode == 0, again.stderr
        assert t.record()["final_state"] == "gone"
        assert len(fake.calls("DELETE")) == 1


def test_teardown_401_exits_1_naming_the_key_variable(td):
    proc = td.run("--runs-dir", str(td.runs), "--confirm", INSTANCE, key="wrong-key")
    assert proc.returncode == 1, proc.stderr
    assert "RUNPOD_API_KEY" in proc.stderr
    assert "wrong-key" not in proc.stderr + proc.stdout
    assert td.fake.mutating_calls() == []


def test_generic_playbook_path_refuses_without_confirmation(td):
    proc = td.run("playbooks/teardown.yml", "--runs-dir", str(td.runs), entry="cli")
    assert proc.returncode == 3, proc.stderr
    assert "runs on the box" in proc.stderr  # the same plan as `rgt-run teardown`, the gate passed ...
    assert "no confirmation" in proc.stderr  # ... and no one confirmed
    assert td.fake.calls() == []


if __name__ == "__main__":  # pragma: no cover
    sys.exit(pytest.main([__file__, "-v"]))
