"""`rgt-run teardown` with the slurm profile against a REAL single-node Slurm (slurmctld + slurmd + munged from
Debian packages, started by tests/slurm/start-slurm.sh): the login node is localhost (ansible_connection local),
the instance id is a live `sbatch --wrap 'sleep 600'` job. Without --confirm the runner refuses (exit 3) and the
job keeps running; with `--confirm <job id>` the role runs `scancel <job id>` and Slurm reports the job CANCELLED.

Needs root (apt-get, /etc/slurm/slurm.conf, munged). Run: pytest -m slurm tests/integration/test_slurm_teardown.py
"""

import json
import os
import subprocess
import time
from pathlib import Path

import pytest
from slurmcluster import job_state, slurm, squeue_state  # noqa: F401 (slurm: the module's cluster fixture)

from tests.fakes.capsule import make_pull

REPO = Path(__file__).resolve().parents[2]
PY = REPO / ".venv" / "bin" / "python"
RUN_ID = "slurm-run"
HOST = "localhost"

pytestmark = [pytest.mark.slurm, pytest.mark.usefixtures("slurm"),
              pytest.mark.skipif(not (REPO / ".venv" / "bin" / "ansible-playbook").exists(),
                                 reason="needs .venv with ansible-core")]


class LoginNode:
    """localhost as the slurm login node: a sealed export under a tmp durable root, its verified local pull,
    and an inventory naming the job as the instance."""

    def __init__(self, tmp_path: Path, job_id: str):
        self.job_id = job_id
        self.durable = tmp_path / "durable"
        self.runs = tmp_path / "runs"
        self.ledger = tmp_path / "ledger"
        raw, files = make_pull(self.runs, RUN_ID, HOST, job_id)
        export = self.durable / "proj" / "export"
        for rel, data in files.items():
            (export / RUN_ID / rel).parent.mkdir(parents=True, exist_ok=True)
            (export / RUN_ID / rel).write_bytes(data)
        (export / f"{RUN_ID}.manifest.json").write_bytes(raw)
        # an absolute rgt_durable_root keeps the test off /scratch ({user} in the profile root is expanded on the box)
        self.inv = tmp_path / "hosts.yml"
        self.inv.write_text(json.dumps({"all": {"hosts": {HOST: {
            "ansible_connection": "local", "ansible_python_interpreter": str(PY),
            "rgt_profile": "slurm", "rgt_instance_id": job_id, "rgt_durable_root": str(self.durable),
            "rgt_project": "proj", "rgt_job": {"name": RUN_ID}}}}}))

    def teardown(self, *args: str) -> subprocess.CompletedProcess:
        env = {**os.environ, "RGT_LEDGER": str(self.ledger), "ANSIBLE_NOCOLOR": "1"}
        t0 = time.monotonic()
        proc = subprocess.run([str(PY), "-m", "rgt.cli", "teardown", "-i", str(self.inv), "--json",
                               "--runs-dir", str(self.runs), *args], capture_output=True, text=True, env=env,
                              cwd=REPO, timeout=300, stdin=subprocess.DEVNULL)
        proc.elapsed = time.monotonic() - t0
        return proc

    def record(self) -> dict | None:
        path = self.ledger / "teardown" / f"{HOST}.json"
        return json.loads(path.read_text()) if path.exists() else None


def doc_of(proc) -> dict:
    lines = [ln for ln in proc.stdout.splitlines() if ln.strip()]
    assert len(lines) == 1, proc.stdout + proc.stderr
    return json.loads(lines[0])


def test_scancel_is_gated_then_cancels_the_real_job(tmp_path):
    sub = subprocess.run(["sbatch", "--parsable", "-J", RUN_ID, "-o", str(tmp_path / "slurm-%j.out"),
                          "--wrap", "sleep 600"], capture_output=True, text=True, check=True, cwd=tmp_path)
    job_id = sub.stdout.strip().split(";")[0]
    assert job_id.isdigit(), sub.stdout
    try:
        node = LoginNode(tmp_path, job_id)

        # (a) no confirmation: refused by the runner, nothing called, the job still runs
        refused = node.teardown()
        print(f"refused teardown: {refused.elapsed:.2f} s")
        assert refused.returncode == 3, refused.stdout + refused.stderr
        doc = doc_of(refused)
        assert doc["hosts"][HOST]["refused"] is True
        assert squeue_state(job_id) in ("RUNNING", "PENDING"), job_state(job_id)
        assert node.record() is None

        # (b) confirmed: scancel <job id> on the login node; Slurm reports the job CANCELLED
        done = node.teardown("--confirm", job_id)
        print(f"confirmed teardown: {done.elapsed:.2f} s")
        assert done.returncode == 0, done.stdout + done.stderr
        entry = doc_of(done)["hosts"][HOST]
        assert entry["refused"] is False and entry["verb"] == "scancel", entry
        t0 = time.monotonic()
        while time.monotonic() - t0 < 30:
            state = job_state(job_id)
            if state == "CANCELLED" or (not state and not squeue_state(job_id)):
                break
            time.sleep(0.5)
        print(f"job {job_id} state {state!r} {time.monotonic() - t0:.2f} s after teardown returned")
        assert state in ("CANCELLED", ""), state
        rec = node.record()
        assert rec is not None and rec["verb"] == "scancel" and rec["instance_id"] == job_id, rec
        # the ledger records what Slurm reported, not just that scancel was asked
        assert rec["final_state"] == "gone" and "CANCELLED" in rec["slurm_state"], rec
    finally:
        subprocess.run(["scancel", job_id], capture_output=True)


def test_teardown_of_an_unknown_job_calls_nothing_and_records_already_gone(tmp_path):
    # scancel exits 0 for an unknown job id; the role must look first, not report a cancel it never made
    node = LoginNode(tmp_path, "999999")
    done = node.teardown("--confirm", "999999")
    assert done.returncode == 0, done.stdout + done.stderr
    rec = node.record()
    assert rec["final_state"] == "already gone" and rec["calls"][0]["rc"] is None, rec
