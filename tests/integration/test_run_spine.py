"""The run spine end to end on a stub: train.yml uploads and launches tiny_train detached; status and watch
reconcile it honestly through a link cut, a preemption with a 5 s grace, NaN, a second launch and code changes."""

import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from clihelp import wait_for
from conftest import stub_inventory

pytestmark = [pytest.mark.stubs, pytest.mark.slow]
REPO = Path(__file__).resolve().parents[2]
TRAIN = REPO / "examples" / "tiny_train" / "train.py"
RUNS = "/workspace/rgt/active"


def job(run_id, steps=200, sleep=0.1, extra="", **kw):
    spec = {"name": run_id, "python": "/usr/bin/python3",
            "command": f"python3 train.py --steps {steps} --ckpt-every 10 --sleep {sleep} {extra}".strip(),
            "code_dir": str(REPO / "examples" / "tiny_train"), "checkpoint": {"glob": "step_*.ckpt"},
            "outputs": ["weights.bin", "metrics.json"], "log_patterns": {"step": r"step=(\d+)"},
            "auto_resume": True, "stall_after_s": 120, "disk_floor_gib": 0.05}
    spec.update(kw)
    return spec


def reference_weights(tmp_path, steps) -> str:
    """sha256 of weights.bin from an uninterrupted local run with the same seed."""
    env = {**os.environ, "RGT_CKPT_DIR": str(tmp_path / "ref-ckpt"), "RGT_OUT_DIR": str(tmp_path / "ref-out"),
           "RGT_RESUME_FROM": ""}
    subprocess.run([sys.executable, str(TRAIN), "--steps", str(steps), "--ckpt-every", "10"], env=env, check=True,
                   capture_output=True, timeout=120)
    return hashlib.sha256((tmp_path / "ref-out" / "weights.bin").read_bytes()).hexdigest()


def train(rgt, inv, spec, **env):
    return rgt("playbooks/train.yml", "-i", inv, "-e", json.dumps({"rgt_job": spec, "rgt_skip_smoke": True}),
               "--json", env=env or None)


def status(rgt, inv, spec):
    return rgt("status", "-i", inv, "-e", json.dumps({"rgt_job": spec}), "--json", timeout=240)


def box(stub, cmd) -> str:
    return stub.exec(["bash", "-c", cmd]).stdout


def last_step(stub, run_id) -> int:
    out = box(stub, f"grep -o 'step=[0-9]*' {RUNS}/{run_id}/logs/job.log | tail -1 | cut -d= -f2")
    return int(out.strip() or 0)


def wrappers(stub, run_id) -> int:
    # the wrapper's own argv starts with the interpreter; tmux's server argv also names the wrapper: not counted
    out = box(stub, f"ps -eo args | grep -c '^[^ ]*python[0-9.]* {RUNS}/{run_id}/.rgt/wrapper.py' || true")
    return int(out.strip() or 0)


@pytest.fixture
def rp(stub_fleet, request):
    stub = stub_fleet["stubs"]["rp"]
    yield stub
    # stop any run a test left behind (tests use distinct run ids; the box is shared within the session)
    stub.exec(["bash", "-c", "pkill -f '[r]gt/active/' || true; tmux kill-server 2>/dev/null || true"])


def test_link_cut_30s_is_unreachable_and_the_job_keeps_running(rgt, stub_fleet, rp, tmp_path):
    spec = job("linkcut", steps=250, sleep=0.12)
    inv = stub_inventory(stub_fleet, ["rp"])
    launched = train(rgt, inv, spec)
    assert launched.rc == 0, launched.stderr
    before = last_step(rp, "linkcut")
    rp.link_cut()
    cut_at = time.monotonic()
    try:
        during = status(rgt, inv, spec)
        assert during.rc == 4, during.stderr
        assert during.doc["hosts"]["rp"]["state"] == "unreachable"
        time.sleep(max(0.0, 30 - (time.monotonic() - cut_at)))
        assert last_step(rp, "linkcut") > before, "the job kept running while the link was cut"
    finally:
        rp.link_restore()
    after = status(rgt, inv, spec)
    assert after.rc in (0,), after.stderr
    assert after.doc["hosts"]["rp"]["state"] in ("running", "finished")
    done = wait_for(lambda: (lambda r: r if r.doc["hosts"]["rp"]["state"] == "finished" else None)(
        status(rgt, inv, spec)), timeout=120, interval=3)
    assert done.doc["hosts"]["rp"]["outputs_missing"] == []


def test_preemption_with_5s_grace_resumes_to_byte_identical_weights(rgt, stub_fleet, rp, tmp_path):
    steps = 200
    spec = job("preempt", steps=steps, sleep=0.1)
    inv = stub_inventory(stub_fleet, ["rp"])
    assert train(rgt, inv, spec).rc == 0
    wait_for(lambda: last_step(rp, "preempt") >= 60, timeout=90, interval=1.0)
    rp.preempt(grace_s=5)
    rp.start()
    inv = stub_inventory(stub_fleet, ["rp"])  # the port can change on restart, as on RunPod
    watch = rgt("watch", "-i", inv, "-e", json.dumps({"rgt_job": spec}), "--interval", "2", "--max-ticks", "60",
                "--json", timeout=600)
    assert watch.rc == 0, watch.stderr
    assert "relaunch" in watch.stderr.lower()
    log = box(rp, f"cat {RUNS}/preempt/logs/job.log")
    assert "resumed from" in log
    resumed_at = int(log.split("resumed from", 1)[1].split("step=", 1)[1].split()[0])
    assert resumed_at > 0
    attempts = box(rp, f"cat {RUNS}/preempt/.rgt/attempts.jsonl")
    assert '"reason": "preempted"' in attempts
    remote = box(rp, f"sha256sum {RUNS}/preempt/out/weights.bin").split()[0]
    assert remote == reference_weights(tmp_path, steps)


def test_nan_is_reported_with_its_step_exit_5_and_never_relaunched(rgt, stub_fleet, rp):
    spec = job("nan", steps=100, sleep=0.02, extra="--nan-at 37")
    inv = stub_inventory(stub_fleet, ["rp"])
    assert train(rgt, inv, spec).rc == 0
    wait_for(lambda: "loss=nan" in box(rp, f"cat {RUNS}/nan/logs/job.log"), timeout=60, interval=1.0)
    watch = rgt("watch", "-i", inv, "-e", json.dumps({"rgt_job": spec}), "--interval", "2", "--max-ticks", "10",
                "--json", timeout=300)
    assert watch.rc == 5, watch.stderr
    st = status(rgt, inv, spec)
    assert st.rc == 5
    host = st.doc["hosts"]["rp"]
    assert host["nonfinite_loss"]["step"] == 37
    assert host["attempt"] == 1, "never relaunched after NaN"


def test_launch_twice_one_process_and_code_change_makes_a_new_dir(rgt, stub_fleet, rp, tmp_path):
    spec = job("twice", steps=4000, sleep=0.1)  # live through two train.yml runs on a loaded machine
    inv = stub_inventory(stub_fleet, ["rp"])
    assert train(rgt, inv, spec).rc == 0
    first_code = json.loads(box(rp, f"cat {RUNS}/twice/.rgt/job.json"))["code_dir"]
    code_sums = box(rp, f"cd {first_code} && sha256sum *")
    # the user edits the code and runs train.yml again while the run is live
    changed = tmp_path / "code"
    subprocess.run(["cp", "-r", str(REPO / "examples" / "tiny_train"), str(changed)], check=True)
    (changed / "NOTE.txt").write_text("changed while the run was live\n")
    again = train(rgt, inv, {**spec, "code_dir": str(changed)})
    assert again.rc == 0, again.stderr
    assert "not started twice" in again.stderr
    assert wrappers(rp, "twice") == 1
    dirs = box(rp, f"ls -d {RUNS}/twice/code-*").split()
    assert len(dirs) == 2, dirs
    assert json.loads(box(rp, f"cat {RUNS}/twice/.rgt/job.json"))["code_dir"] == first_code
    assert box(rp, f"cd {first_code} && sha256sum *") == code_sums, "the live run's files are untouched"


def test_disk_below_floor_is_refused_exit_3_and_nothing_starts(rgt, stub_fleet, rp):
    spec = job("floor", disk_floor_gib=100000)
    inv = stub_inventory(stub_fleet, ["rp"])
    result = train(rgt, inv, spec)
    assert result.rc == 3, result.stderr
    assert box(rp, f"test -e {RUNS}/floor/.rgt/job.json && echo started || echo nothing").strip() == "nothing"
    assert wrappers(rp, "floor") == 0


def test_secret_never_in_ps_ledger_or_json(rgt, stub_fleet, rp):
    secret = "tok-SPINE-5f1e9a-never-print"
    spec = job("secret", steps=150, sleep=0.1, secrets=["RGT_SPINE_SECRET"])
    spec["command"] = 'printf %s "$RGT_SPINE_SECRET" | sha256sum > "$RGT_OUT_DIR/secret.sha"; ' + spec["command"]
    inv = stub_inventory(stub_fleet, ["rp"])
    launched = train(rgt, inv, spec, RGT_SPINE_SECRET=secret)
    assert launched.rc == 0, launched.stderr
    ps = box(rp, "ps -eo args")
    assert secret not in ps
    st = status(rgt, inv, spec)
    for text in (launched.stdout, launched.stderr, st.stdout, st.stderr):
        assert secret not in text
    for path in rgt.ledger.rglob("*"):
        if path.is_file():
            assert secret not in path.read_text(errors="replace"), path
    got = wait_for(lambda: box(rp, f"cat {RUNS}/secret/out/secret.sha 2>/dev/null").split()[:1], timeout=30,
                   interval=1.0)
    assert got[0] == hashlib.sha256(secret.encode()).hexdigest(), "the job received the secret"
