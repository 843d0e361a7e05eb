"""A sweep's budget under Slurm, against a REAL single-node Slurm (tests/slurm/start-slurm.sh, slurmcluster.py): 3
cells of tiny_train as one job array throttled to one task at once (`%1`), so two tasks wait PENDING. At 100% of
the sweep's budget watch holds the sweep (<sweep_dir>/.rgt/BUDGET_STOP), scancels the two pending array tasks and
stops the running one (RGT_PREEMPT_FILE): the running cell ends budget_stopped, the two that never ran show
budget_stopped with stop_reason budget_held, and nothing of them ran. The running cell runs 3000 steps of 50 ms
(150 s and more); the budget is spent after 20 s of it.

Needs root (start-slurm.sh). Run: pytest -m slurm tests/integration/test_budget_slurm.py"""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from slurmcluster import slurm  # noqa: F401 (the module's cluster fixture)

REPO = Path(__file__).resolve().parents[2]
PY = REPO / ".venv" / "bin" / "python"
TINY = REPO / "examples" / "tiny_train"
CELLS = [f"bsl--seed={s}" for s in (1, 2, 3)]

pytestmark = [pytest.mark.slurm,
              pytest.mark.skipif(not (REPO / ".venv" / "bin" / "ansible-playbook").exists(),
                                 reason="needs .venv with ansible-core")]


@pytest.fixture
def login(slurm, tmp_path):  # noqa: F811 (slurm: the cluster fixture imported above)
    durable = tmp_path / "durable"
    spec = {"name": "bsl", "python": sys.executable, "code_dir": str(TINY),
            "command": "python3 train.py --steps 3000 --ckpt-every 10 --sleep 0.05",
            "checkpoint": {"glob": "step_*.ckpt"}, "disk_floor_gib": 0, "price_per_hour": 360.0, "budget_usd": 2.0,
            "slurm": {"cpus_per_task": 1, "time": "10"},
            "sweep": {"matrix": {"seed": [1, 2, 3]}, "args": "--seed {seed}", "parallel": 1}}
    inv = tmp_path / "hosts.yml"
    inv.write_text(yaml.safe_dump({"all": {"hosts": {"login": {
        "ansible_connection": "local", "ansible_python_interpreter": str(PY), "rgt_profile": "slurm",
        "rgt_instance_id": "login-1", "rgt_project": "proj", "rgt_durable_root": str(durable),
        "rgt_shared_volume": True, "rgt_job": spec}}}}))

    def rgt(*args, timeout=300):
        env = {**os.environ, "RGT_LEDGER": str(tmp_path / "ledger"), "ANSIBLE_NOCOLOR": "1"}
        proc = subprocess.run([str(PY), "-m", "rgt.cli", *args, "-i", str(inv), "--json"], capture_output=True,
                              text=True, env=env, cwd=REPO, timeout=timeout, stdin=subprocess.DEVNULL)
        lines = [ln for ln in proc.stdout.splitlines() if ln.strip()]
        assert len(lines) == 1, proc.stdout + proc.stderr
        return proc.returncode, json.loads(lines[0]), proc.stderr

    rgt.run_dir = lambda name: durable / "proj" / "active" / name
    rgt.sweep_dir = durable / "proj" / "sweeps" / "bsl"
    yield rgt
    subprocess.run(["scancel", "-n", "rgt-proj-bsl"], capture_output=True)


def test_a_sweep_array_over_budget_cancels_its_pending_tasks_and_holds_them(login):
    rc, doc, err = login("train", timeout=400)
    assert rc == 0, err[-3000:]
    job_ids = {c["run_id"]: c["slurm_job_id"] for c in doc["hosts"]["login"]["launch_detached"]["cells"]}
    deadline = time.monotonic() + 120
    while not (login.run_dir(CELLS[0]) / ".rgt" / "attempts.jsonl").exists() and time.monotonic() < deadline:
        time.sleep(0.5)  # the first task started (the others wait for the throttle)

    rc, doc, err = login("watch", "--interval", "1", "--max-ticks", "150", timeout=900)
    runs = {r["run_id"]: r for r in (doc["hosts"]["login"], *(doc["hosts"]["login"].get("other_runs") or []))}
    assert rc == 1 and {runs[c]["state"] for c in CELLS} == {"budget_stopped"}, err[-4000:]
    assert "cancelled pending Slurm task(s)" in err, err[-3000:]
    for cell in CELLS[1:]:
        assert job_ids[cell] in err and runs[cell]["stop_reason"] == "budget_held", runs[cell]
        assert not (login.run_dir(cell) / ".rgt" / "attempts.jsonl").exists(), f"{cell} never ran"
    exit_doc = json.loads((login.run_dir(CELLS[0]) / ".rgt" / "exit.json").read_text())
    assert exit_doc["reason"] == "budget_stopped", exit_doc
    assert json.loads((login.sweep_dir / ".rgt" / "BUDGET_STOP").read_text())["budget_usd"] == 2.0
    left = subprocess.run(["squeue", "-h", "-n", "rgt-proj-bsl", "-o", "%i %T"], capture_output=True, text=True)
    assert left.stdout.strip() == "", left.stdout  # nothing of the sweep is left in Slurm's queue
