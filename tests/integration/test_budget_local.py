"""Budgets through `rgt-run`, on the local profile (the box is this machine): a job with a price and a tiny budget
is stopped by watch at 100% (RGT_PREEMPT_FILE with the budget marker), ends `budget_stopped`, is notified at 50, 80
and 100% once each (a restarted watch sends nothing again), and only a retry with a higher budget resumes it from
its checkpoint. The job is examples/tiny_train (it checkpoints and exits on RGT_PREEMPT_FILE); the notify rule is
a local command that appends each message it gets to a file."""

import json
import shutil
import sys
import tempfile
from pathlib import Path

import pytest
import yaml
from clihelp import end_local_runs, read_json, wait_for

REPO = Path(__file__).resolve().parents[2]
TINY = REPO / "examples" / "tiny_train" / "train.py"

pytestmark = [pytest.mark.skipif(shutil.which("tmux") is None, reason="needs tmux"),
              pytest.mark.skipif(not (REPO / ".venv" / "bin" / "ansible-playbook").exists(),
                                 reason="needs .venv with ansible-core")]


@pytest.fixture
def project(tmp_path):
    (tmp_path / "code").mkdir()
    shutil.copy(TINY, tmp_path / "code" / "train.py")
    durable = tmp_path / "durable"
    (tmp_path / "inv").mkdir()
    (tmp_path / "inv" / "hosts.yml").write_text(yaml.safe_dump({"all": {"hosts": {"box": {
        "ansible_connection": "local", "ansible_python_interpreter": sys.executable, "rgt_profile": "local",
        "rgt_instance_id": "localhost", "rgt_durable_root": str(durable), "rgt_project": "demo"}}}}))
    notes = tmp_path / "notes.jsonl"

    def job(budget: float) -> str:
        name = f"job-{budget:g}.yml"
        # $360/h is $0.10 a second: a $2 budget is spent in 20 s of the job's wall time
        (tmp_path / name).write_text(yaml.safe_dump({"rgt_job": {
            "name": "capped", "python": sys.executable, "code_dir": "code",
            "command": "python train.py --steps 3000 --ckpt-every 10 --sleep 0.05",
            "checkpoint": {"glob": "step_*.ckpt"}, "price_per_hour": 360.0, "budget_usd": budget,
            "disk_floor_gib": 0.01,
            "notify": [{"command": f"cat >> {notes}; echo >> {notes}", "on": ["budget"]}]}}))
        return "@" + name

    tmux_dir = Path(tempfile.mkdtemp(prefix="rgt-tmux-", dir="/tmp"))
    run_dir = durable / "demo" / "active" / "capped"
    env = {"TMUX_TMPDIR": str(tmux_dir)}
    yield {"root": tmp_path, "run_dir": run_dir, "env": env, "job": job, "notes": notes}
    end_local_runs(run_dir, tmux_dir)


def _thresholds(notes: Path) -> list[str]:
    if not notes.exists():
        return []
    return [json.loads(line)["event"].rsplit(":", 1)[1] for line in notes.read_text().splitlines() if line.strip()]


def test_watch_stops_a_run_at_its_budget_and_only_a_higher_budget_resumes_it(rgt, project):
    root, run_dir, env, job = project["root"], project["run_dir"], project["env"], project["job"]
    meta = run_dir / ".rgt"
    train = rgt("train", "-i", "inv", "-e", job(2), env=env, cwd=root, timeout=300)
    assert train.rc == 0, train.stderr[-3000:]

    watch = rgt("watch", "-i", "inv", "-e", job(2), "--interval", "1", "--max-ticks", "90", "--json", env=env,
                cwd=root, timeout=300)
    doc = watch.doc["hosts"]["box"]
    assert watch.rc == 1 and doc["state"] == "budget_stopped", watch.stderr[-3000:]
    assert doc["budget"]["budget_usd"] == 2.0 and doc["budget"]["spent_usd"] >= 2.0
    assert "budget 50%" in watch.stderr and "budget 100%" in watch.stderr
    assert "asked box:capped to checkpoint and stop" in watch.stderr
    done = read_json(meta / "exit.json")
    assert done["reason"] == "budget_stopped" and done["rc"] == 0, done
    assert read_json(meta / "BUDGET_STOP")["budget_usd"] == 2.0
    assert list((run_dir / "ckpt").glob("step_*.ckpt"))
    assert _thresholds(project["notes"]) == ["50", "80", "100"]

    # a watch started again notifies nothing twice, and resumes nothing; status shows spend/budget
    again = rgt("watch", "-i", "inv", "-e", job(2), "--interval", "1", "--max-ticks", "3", "--json", env=env,
                cwd=root, timeout=120)
    assert again.rc == 1 and again.doc["relaunches"] == [] and again.doc["ticks"] == 1, again.stderr[-2000:]
    assert _thresholds(project["notes"]) == ["50", "80", "100"]
    status = rgt("status", "-i", "inv", "-e", job(2), env=env, cwd=root, timeout=120)
    assert "budget_stopped" in status.stdout and "/$2.00 (" in status.stdout, status.stdout

    # train never starts it; a retry with the same budget is refused before anything runs; a higher one resumes
    refused = rgt("retry", "-i", "inv", "-e", job(2), "capped", "--json", env=env, cwd=root, timeout=120)
    assert refused.rc == 3 and "retry it with a higher budget" in refused.stderr + refused.stdout
    retry = rgt("retry", "-i", "inv", "-e", job(100), "capped", "--json", env=env, cwd=root, timeout=300)
    assert retry.rc == 0 and retry.doc["state"] == "running", retry.stderr[-3000:]
    starts = [json.loads(ln) for ln in (meta / "attempts.jsonl").read_text().splitlines() if "started_at" in ln]
    assert len(starts) == 2 and starts[1]["resume_from"].startswith(str(run_dir / "ckpt" / "step_"))
    wait_for(lambda: "resumed from" in (run_dir / "logs" / "job.log").read_text(), 30, what="attempt 2 to resume")
    assert not (meta / "BUDGET_STOP").exists() and not (meta / "PREEMPT").exists()
