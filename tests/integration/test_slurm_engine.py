"""sbatch as a launch engine, against a REAL single-node Slurm (tests/slurm/start-slurm.sh, shared fixture in
slurmcluster.py): the login node is localhost (ansible_connection local) with the slurm profile and a temp durable
root. One `rgt-run train` submits three runs of examples/tiny_train at once:

- `requeue`: runs, is requeued mid-run with `scontrol requeue` (status: queued/preempted, Slurm's restart count),
  then runs attempt 2 from its newest checkpoint and finishes with weights byte-identical to an uninterrupted run,
  which `rgt-run pull` seals, pulls and verifies from the login node;
- `pending`: held by `--begin=now+1hour` (rgt_job.slurm.extra): train and status say queued with Slurm's reason,
  and a second launch finds the pending job and submits nothing;
- `timeout`: `--time=1` (rgt_job.slurm.time): Slurm's B:TERM warning reaches the wrapper, the job checkpoints, and
  status says timeout with the advice to checkpoint before the limit (exit 5). Costs up to ~60 s, concurrent with
  the others;
- `sweep`: a 4-cell sweep goes as one job array (`--array=0-3%2`, the throttle from sweep.parallel), each task
  running its cell's wrapper; status tallies the cells against the roster, a second launch submits nothing, and
  `rgt-run pull` verifies every cell.

Needs root (start-slurm.sh). Run: pytest -m slurm tests/integration/test_slurm_engine.py
"""

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
STEPS = "--steps 300 --ckpt-every 10"

pytestmark = [pytest.mark.slurm,
              pytest.mark.skipif(not (REPO / ".venv" / "bin" / "ansible-playbook").exists(),
                                 reason="needs .venv with ansible-core")]


def job(name, command, slurm_spec):
    return {"name": name, "command": command, "python": sys.executable, "code_dir": str(TINY),
            "checkpoint": {"glob": "step_*.ckpt"}, "outputs": ["weights.bin", "metrics.json"],
            "disk_floor_gib": 0, "slurm": slurm_spec}


class Login:
    """localhost as the login node: one inventory host per run, one durable root, one private ledger."""

    def __init__(self, root: Path):
        self.root = root
        self.durable = root / "durable"
        self.ledger = root / "ledger"
        self.inv = root / "hosts.yml"
        # the requeue run trains only once its test opens this gate: on a slow machine the tests before it could
        # otherwise outlast its attempt 1, and there would be nothing left to requeue
        self.gate = root / "requeue.go"
        jobs = {
            "requeue": job("requeue", f"until [ -e {self.gate} ]; do sleep 0.2; done; python3 train.py {STEPS} "
                           "--sleep 0.05", {"cpus_per_task": 1, "time": "10"}),
            "pending": job("pending", f"python3 train.py {STEPS}", {"extra": ["--begin=now+1hour"]}),
            "timeout": job("timeout", "python3 train.py --steps 100000 --ckpt-every 50 --sleep 0.05",
                           {"time": "1", "cpus_per_task": 1}),
        }
        jobs["sweep"] = {**job("arr", "python3 train.py --steps 60 --ckpt-every 10 --sleep 0.02",
                               {"cpus_per_task": 1, "time": "10"}),
                         "sweep": {"matrix": {"seed": [1, 2, 3, 4]}, "args": "--seed {seed}", "parallel": 2}}
        hosts = {name: {"ansible_connection": "local", "ansible_python_interpreter": str(PY), "rgt_profile": "slurm",
                        "rgt_instance_id": "login-1", "rgt_project": "proj", "rgt_durable_root": str(self.durable),
                        "rgt_shared_volume": True, "rgt_job": spec} for name, spec in jobs.items()}
        self.inv.write_text(yaml.safe_dump({"all": {"hosts": hosts}}))

    def run_dir(self, name) -> Path:
        return self.durable / "proj" / "active" / name

    def rgt(self, *args, timeout=300):
        env = {**os.environ, "RGT_LEDGER": str(self.ledger), "ANSIBLE_NOCOLOR": "1"}
        proc = subprocess.run([str(PY), "-m", "rgt.cli", *args, "-i", str(self.inv), "--json"], capture_output=True,
                              text=True, env=env, cwd=REPO, timeout=timeout, stdin=subprocess.DEVNULL)
        lines = [ln for ln in proc.stdout.splitlines() if ln.strip()]
        assert len(lines) == 1, proc.stdout + proc.stderr
        return proc.returncode, json.loads(lines[0]), proc.stderr

    def status(self, name):
        rc, doc, err = self.rgt("status", "-l", name)
        return rc, doc["hosts"][name]

    def job_id(self, name) -> str:
        return json.loads((self.run_dir(name) / ".rgt" / "slurm.json").read_text())["job_id"]

    def attempts(self, name):
        text = (self.run_dir(name) / ".rgt" / "attempts.jsonl").read_text()
        return [json.loads(line) for line in text.splitlines() if line.strip()]


def wait_until(predicate, timeout, what):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.5)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def squeue_names(name):
    out = subprocess.run(["squeue", "-h", "-n", f"rgt-proj-{name}", "-o", "%i"], capture_output=True, text=True)
    return out.stdout.split()


def reference_weights(tmp: Path) -> bytes:
    """tiny_train run once, uninterrupted, outside Slurm: the bytes a resumed run must reproduce."""
    env = {**os.environ, "RGT_CKPT_DIR": str(tmp / "ckpt"), "RGT_OUT_DIR": str(tmp / "out"), "RGT_RESUME_FROM": "",
           "RGT_PREEMPT_FILE": ""}
    subprocess.run([sys.executable, str(TINY / "train.py"), *STEPS.split()], check=True, env=env, cwd=tmp,
                   capture_output=True)
    return (tmp / "out" / "weights.bin").read_bytes()


@pytest.fixture(scope="module")
def login(slurm, tmp_path_factory):  # noqa: F811 (slurm: the cluster fixture imported above)
    node = Login(tmp_path_factory.mktemp("slurm-engine"))
    t0 = time.monotonic()
    rc, doc, err = node.rgt("train", timeout=400)
    print(f"train of 3 runs through sbatch: {time.monotonic() - t0:.1f} s")
    node.train = (rc, doc, err)
    yield node
    for name in ("requeue", "pending", "timeout", "arr"):
        subprocess.run(["scancel", "-n", f"rgt-proj-{name}"], capture_output=True)


def test_train_submits_each_run_with_its_resources_from_the_job_spec(login):
    rc, doc, err = login.train
    assert rc == 0, json.dumps(doc)[:3000] + err[-3000:]
    for name in ("requeue", "timeout"):
        report = doc["hosts"][name]["launch_detached"]
        assert report["detach"] == "sbatch" and report["state"] in ("running", "finished"), report
        assert report["slurm_job_id"] == login.job_id(name)
    record = json.loads((login.run_dir("timeout") / ".rgt" / "slurm.json").read_text())
    assert "--time=1" in record["argv"] and "--cpus-per-task=1" in record["argv"]
    assert "--signal=B:TERM@30" in record["argv"] and "--requeue" in record["argv"]  # slurm profile: spot.grace_s
    assert f"--comment={login.run_dir('timeout')}" in record["argv"]
    script = (login.run_dir("timeout") / ".rgt" / "sbatch.sh").read_text()
    assert script.rstrip().splitlines()[-1].startswith("exec ")  # signals reach the wrapper itself
    start = login.attempts("timeout")[0]
    assert start["detach"] == "sbatch" and start["slurm_job_id"] == login.job_id("timeout")


def test_a_pending_job_is_queued_with_its_reason_and_never_submitted_twice(login):
    report = login.train[1]["hosts"]["pending"]["launch_detached"]
    assert report["state"] == "queued" and report["slurm_reason"] == "BeginTime", report
    job_id = login.job_id("pending")
    rc, doc = login.status("pending")
    assert rc == 0, doc
    assert doc["state"] == "queued" and doc["queue_reason"] == "BeginTime", doc
    assert doc["slurm"]["job_id"] == job_id and doc["slurm"]["state"] == "PENDING"
    rc, again, err = login.rgt("playbooks/launch_detached.yml", "-l", "pending")
    assert rc == 0, json.dumps(again)[:2000] + err[-2000:]
    report = again["hosts"]["pending"]["launch_detached"]
    assert report["state"] == "queued" and report["action"] == "none" and "not submitted twice" in report["msg"]
    assert squeue_names("pending") == [job_id]


def test_a_requeued_job_resumes_from_its_checkpoint_and_finishes_byte_identical(login, tmp_path):
    run = login.run_dir("requeue")
    job_id = login.job_id("requeue")
    login.gate.touch()
    wait_until(lambda: (run / "ckpt" / "step_00000040.ckpt").exists(), 60, "a checkpoint of attempt 1")
    subprocess.run(["scontrol", "requeue", job_id], check=True, capture_output=True)
    # the requeued job waits cred_expire + 1 s (PENDING, BeginTime); a hold keeps it pending however slow this
    # machine is, so status is looked at while Slurm holds it: queued (or preempted while REQUEUED), restarts 1
    wait_until(lambda: subprocess.run(["scontrol", "hold", job_id], capture_output=True).returncode == 0, 10,
               "the requeued job to be pending (scontrol hold)")
    rc, doc = wait_until(lambda: (lambda s: s if s[1]["state"] in ("queued", "preempted") else None)(
        login.status("requeue")), 30, "status queued/preempted after the requeue")
    assert doc["slurm"]["restarts"] == 1 and doc["slurm"]["job_id"] == job_id, doc
    if doc["state"] == "queued":
        assert doc["queue_reason"] in ("JobHeldAdmin", "JobHeldUser", "BeginTime"), doc  # root holds as admin
        assert any("requeued job" in w for w in doc["warnings"]), doc["warnings"]
    # release it without the requeue delay: the job restarts now, from the top of its batch script
    subprocess.run(["scontrol", "release", job_id], check=True, capture_output=True)
    subprocess.run(["scontrol", "update", f"jobid={job_id}", "StartTime=now"], check=True, capture_output=True)
    rc, doc = wait_until(lambda: (lambda s: s if s[1]["state"] == "finished" else None)(login.status("requeue")),
                         90, "the requeued run to finish")
    assert rc == 0 and doc["attempt"] == 2, doc
    starts = [a for a in login.attempts("requeue") if "started_at" in a]
    ends = [a for a in login.attempts("requeue") if "ended_at" in a]
    assert [s["attempt"] for s in starts] == [1, 2] and [e["reason"] for e in ends] == ["preempted", "finished"]
    assert starts[1]["slurm_job_id"] == job_id and starts[1]["slurm_restart_count"] == 1
    assert starts[1]["resume_from"] and Path(starts[1]["resume_from"]).parent == run / "ckpt", starts[1]
    assert "resumed from" in (run / "logs" / "job.log").read_text()
    reference = reference_weights(tmp_path)
    assert (run / "out" / "weights.bin").read_bytes() == reference
    # collect and pull run from the login node, as on any box: sealed, pulled, SHA-256 verified
    runs = login.root / "runs"
    rc, doc, err = login.rgt("pull", "-l", "requeue", "--runs-dir", str(runs))
    assert rc == 0, doc
    assert doc["hosts"]["requeue"]["verified"] is True, doc
    assert (runs / "requeue" / "requeue" / "out" / "weights.bin").read_bytes() == reference
    assert json.loads((runs / "requeue" / "requeue.PULL_VERIFIED.json").read_text())["run_id"] == "requeue"
    # the logs came with it: job.log with both attempts' lines, and Slurm's own output of the batch job
    pulled = runs / "requeue" / "requeue" / "logs"
    log = (pulled / "job.log").read_text()
    assert log == (run / "logs" / "job.log").read_text() and "resumed from" in log
    assert "== rgt attempt 1 started" in log and "== rgt attempt 2 started" in log
    assert (pulled / f"slurm-{job_id}.out").read_bytes() == (run / "logs" / f"slurm-{job_id}.out").read_bytes()
    listed = [e["path"] for e in json.loads((runs / "requeue" / "requeue.manifest.json").read_text())["files"]]
    assert {"logs/job.log", "logs/attempts.jsonl", f"logs/slurm-{job_id}.out"} <= set(listed)


def test_a_job_that_reaches_its_time_limit_is_timeout_with_the_advice_to_checkpoint(login):
    rc, doc = wait_until(lambda: (lambda s: s if s[1]["state"] == "timeout" else None)(login.status("timeout")),
                         120, "status timeout")
    assert rc == 5, doc  # attention
    (item,) = [a for a in doc["attention"] if a["id"] == "timeout"]
    assert "checkpoint before the limit" in item["message"] and item["job_id"] == login.job_id("timeout")
    assert doc["slurm"]["time_limit"] == "00:01:00"
    # the wrapper got Slurm's warning (B:TERM before the limit) and the job saved a checkpoint on it
    assert "preempted: checkpoint" in (login.run_dir("timeout") / "logs" / "job.log").read_text()



def test_a_sweep_runs_as_one_job_array_throttled_and_every_cell_is_pulled_verified(login):
    report = login.train[1]["hosts"]["sweep"]["launch_detached"]
    cells = {c["run_id"]: c for c in report["cells"]}
    assert sorted(cells) == [f"arr--seed={n}" for n in (1, 2, 3, 4)], report
    array = report["slurm_job_id"]
    assert sorted(c["slurm_job_id"] for c in cells.values()) == [f"{array}_{i}" for i in range(4)]
    record = json.loads((login.run_dir("arr--seed=1") / ".rgt" / "slurm.json").read_text())
    assert "--array=0-3%2" in record["argv"] and "--cpus-per-task=1" in record["argv"], record["argv"]
    rc, doc, err = wait_until(lambda: (lambda r: r if r[1]["sweeps"] and r[1]["sweeps"][0]["done"] else None)(
        login.rgt("status", "-l", "sweep")), 180, "every cell of the array to finish")
    assert rc == 0 and doc["sweeps"][0]["counts"] == {"finished": 4}, doc["sweeps"]
    for name in cells:
        (start,) = [a for a in login.attempts(name) if "started_at" in a]
        assert start["detach"] == "sbatch" and start["slurm_job_id"], start  # each task ran its own cell once
    assert "--seed 3" in json.loads((login.run_dir("arr--seed=3") / ".rgt" / "job.json").read_text())["command"]
    rc, again, err = login.rgt("playbooks/launch_detached.yml", "-l", "sweep")
    assert rc == 0, err[-2000:]
    assert again["hosts"]["sweep"]["launch_detached"]["action"] == "none"  # finished cells: nothing submitted
    runs = login.root / "runs"
    rc, doc, err = login.rgt("pull", "-l", "sweep", "--runs-dir", str(runs), timeout=600)
    assert rc == 0, err[-3000:]
    pulled = doc["hosts"]["sweep"]["cells"]
    assert sorted(pulled) == sorted(cells) and all(c["verified"] for c in pulled.values()), pulled
    for name, cell in cells.items():  # each cell's log, and its array task's Slurm output from the sweep's logs/
        logs = runs / name / "sweep" / "logs"
        assert (logs / "job.log").read_bytes() == (login.run_dir(name) / "logs" / "job.log").read_bytes()
        assert (logs / f"slurm-{cell['slurm_job_id']}.out").is_file(), sorted(p.name for p in logs.iterdir())


def test_teardown_cancels_the_job_a_run_left_in_the_queue(login):
    """The meter of a cluster is the jobs: a confirmed teardown of the login node cancels the job every run on it
    submitted that is still queued (the pending one), once, and records each job's end; jobs that already ended
    need nothing, the sweep's array tasks among them. Runs last in this file: the requeued run and the sweep's
    cells are pulled and verified by then (the gate passes)."""
    pending = login.job_id("pending")
    assert squeue_names("pending") == [pending]
    # a job past its limit is signalled, then killed after KillWait: until Slurm lets it go its wrapper is alive
    # and the gate rightly refuses (a live run); the teardown comes after
    wait_until(lambda: squeue_names("timeout") == [] and squeue_names("requeue") == [], 120,
               "the ended jobs to leave the queue")
    rc, doc, err = login.rgt("teardown", "--confirm", "login-1", "--runs-dir", str(login.root / "runs"))
    assert rc == 0, (json.dumps({h: d.get("reasons") for h, d in doc["hosts"].items()}), err[-2000:])
    assert squeue_names("pending") == []
    out = subprocess.run(["scontrol", "show", "job", "-o", pending], capture_output=True, text=True).stdout
    assert "JobState=CANCELLED" in out, out
    (record,) = {json.dumps(json.loads(p.read_text()), sort_keys=True)
                 for p in (login.ledger / "teardown").glob("*.json")}  # one record for the one box, every host
    record = json.loads(record)
    assert record["final_state"] == "gone", record
    states = {job["job_id"]: job["final_state"] for job in record["jobs"]}
    assert states[pending] == "gone" and states["login-1"] == "already gone"
    assert states[login.job_id("requeue")] == states[login.job_id("timeout")] == "already gone"
    arr = json.loads((login.run_dir("arr--seed=1") / ".rgt" / "slurm.json").read_text())["array_job_id"]
    assert all(states[f"{arr}_{i}"] == "already gone" for i in range(4)), states  # the sweep's array tasks
    assert [c["argv"] for c in record["calls"] if c["rc"] is not None] == [["scancel", pending]]
