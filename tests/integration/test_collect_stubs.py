"""collect (closeout -> manifest -> pull -> verify) on the rp podman stub over real, pinned SSH, through the
runner as a user runs it (`python -m rgt.cli pull`). Marked stubs."""

import hashlib
import json
import os
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest
from conftest import stub_inventory

REPO = Path(__file__).resolve().parents[2]
PROJECT = "coltest"
RGT_PULL = [sys.executable, "-m", "rgt.cli", "pull"]

pytestmark = [pytest.mark.stubs]


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def make_run(stub, run_id: str, outputs_ok: bool = True, weights_mib: int = 2) -> str:
    run_dir = f"/workspace/{PROJECT}/active/{run_id}"
    metrics = f"echo '{{\"loss\": 0.5}}' > {run_dir}/out/metrics.json" if outputs_ok else "true"
    script = f"""set -e
mkdir -p {run_dir}/.rgt {run_dir}/out {run_dir}/ckpt {run_dir}/logs
head -c {weights_mib * 1048576} /dev/urandom > {run_dir}/out/weights.bin
{metrics}
echo ckpt10 > {run_dir}/ckpt/step_00000010.ckpt
echo ckpt20 > {run_dir}/ckpt/step_00000020.ckpt
echo 'step=20 loss=0.5' > {run_dir}/logs/job.log
printf '%s\\n' '{{"attempt": 1, "started_at": "2026-01-01T00:00:00Z"}}' \
  '{{"attempt": 1, "ended_at": "2026-01-01T00:10:00Z", "rc": 0, "reason": "finished"}}' > {run_dir}/.rgt/attempts.jsonl
echo '{{"attempt": 1, "rc": 0, "signal": null, "reason": "finished"}}' > {run_dir}/.rgt/exit.json
"""
    stub.exec(script)
    return run_dir


class Pull:
    def __init__(self, stub_fleet, tmp: Path, run_id: str):
        self.job = {"name": run_id, "outputs": ["weights.bin", "metrics.json"],
                    "checkpoint": {"declared": ["step_00000010.ckpt"]}}
        self.inv = stub_inventory(stub_fleet, ["rp"])
        self.runs = tmp / "runs"
        self.ledger = tmp / "ledger"
        self.base = self.runs / run_id
        self.dest = self.base / "rp"
        self.marker = self.base / "rp.PULL_VERIFIED.json"
        (tmp / "job.json").write_text(json.dumps({"rgt_job": self.job, "rgt_project": PROJECT}))
        self.vars = tmp / "job.json"

    def __call__(self, *extra: str, timeout: int = 300):
        t0 = time.monotonic()
        proc = subprocess.run([*RGT_PULL, "-i", str(self.inv), "-e", "@" + str(self.vars),
                               "--runs-dir", str(self.runs), "--ledger", str(self.ledger), "--json", *extra],
                              capture_output=True, text=True, timeout=timeout, cwd=REPO,
                              env={**os.environ, "PYTHONPATH": str(REPO)})
        proc.seconds = time.monotonic() - t0
        lines = [ln for ln in proc.stdout.splitlines() if ln.strip()]
        proc.doc = json.loads(lines[-1]) if lines else {}
        proc.host = proc.doc.get("hosts", {}).get("rp", {})
        proc.out = proc.stdout + proc.stderr
        return proc


@pytest.fixture
def rp_run(stub_fleet, tmp_path):
    stub = stub_fleet["stubs"]["rp"]
    run_id = f"col-{uuid.uuid4().hex[:8]}"
    yield stub, run_id, Pull(stub_fleet, tmp_path, run_id)
    stub.link_restore()
    stub.rate_unlimit()
    stub.exec(f"rm -rf /workspace/{PROJECT}/active/{run_id} /workspace/{PROJECT}/export/{run_id}* "
              f"/workspace/{PROJECT}/quarantine/{run_id}--*", check=False)


def remote_sha(stub, path: str) -> str:
    return stub.exec(f"find {path} -type f -print0 | sort -z | xargs -0 sha256sum").stdout


def test_pull_verifies_rerun_is_a_noop_and_tampering_is_named(stub_fleet, rp_run):
    stub, run_id, pull = rp_run
    make_run(stub, run_id)
    first = pull()
    assert first.returncode == 0, first.out
    assert "verified: 6 files" in first.out and "SHA-256 match" in first.out
    export = f"/workspace/{PROJECT}/export/{run_id}"
    listing = stub.exec(f"cd {export} && find . -type f | sort").stdout.split()
    assert listing == ["./ckpt/step_00000010.ckpt", "./logs/attempts.jsonl", "./logs/job.log", "./out/metrics.json",
                       "./out/weights.bin", "./run.json"]
    run_dir = f"/workspace/{PROJECT}/active/{run_id}"
    for rel, on_box in (("logs/job.log", "logs/job.log"), ("logs/attempts.jsonl", ".rgt/attempts.jsonl")):
        assert (pull.dest / rel).read_text() == stub.exec(f"cat {run_dir}/{on_box}").stdout
    assert stub.exec(f"test -f {export}.manifest.json && test ! -e {export}/{run_id}.manifest.json",
                     check=False).returncode == 0
    box_manifest = stub.exec(f"cat {export}.manifest.json").stdout
    local_manifest = (pull.base / "rp.manifest.json").read_text()
    assert local_manifest == box_manifest
    for entry in json.loads(local_manifest)["files"]:
        assert sha(pull.dest / entry["path"]) == entry["sha256"]
    marker = json.loads(pull.marker.read_text())
    assert marker["run_id"] == run_id and marker["instance_id"] == "pod-9k2m4x"
    assert marker["manifest_sha256"] == hashlib.sha256(box_manifest.encode()).hexdigest()
    assert marker["checkpoints"] == [{"path": "ckpt/step_00000010.ckpt", "loader": None, "ok": None}]
    prov = (pull.base / "rp.PROVENANCE.md").read_text()
    assert "ckpt/step_00000020.ckpt" in prov and "`logs/`" not in prov, "the logs are pulled, not left on the box"
    assert not list(pull.dest.rglob(".*")), "no rsync leftovers inside the capsule copy"
    box_before = remote_sha(stub, export)
    marker_bytes = pull.marker.read_bytes()

    again = pull()
    assert again.returncode == 0, again.out
    assert again.doc["phase"]["hosts"]["rp"]["changed"] == 0, again.out
    assert pull.marker.read_bytes() == marker_bytes
    assert remote_sha(stub, export) == box_before, "a sealed export is never touched"
    assert "already sealed" in again.host["closeout"]

    weights = pull.dest / "out" / "weights.bin"
    good = sha(weights)
    before = weights.stat()
    data = bytearray(weights.read_bytes())
    data[123456] ^= 0xFF
    weights.write_bytes(bytes(data))
    os.utime(weights, ns=(before.st_atime_ns, before.st_mtime_ns))  # size and mtime kept: rsync's quick check passes
    log = pull.dest / "logs" / "job.log"
    log.write_text(log.read_text().replace("loss=0.5", "loss=0.4"))
    tampered = pull("--verify-only")
    assert tampered.returncode == 1, tampered.out
    assert "SHA-256 differs: logs/job.log, out/weights.bin" in tampered.host["error"]
    assert "content differs from the box's (SHA-256): logs/job.log, out/weights.bin" in tampered.out
    assert tampered.host["sha_mismatch"] == ["logs/job.log", "out/weights.bin"] and not pull.marker.exists()

    repaired = pull()  # re-sends exactly the corrupted files over the pinned SSH options, then verifies
    assert repaired.returncode == 0, repaired.out
    assert repaired.host["repaired"] == ["logs/job.log", "out/weights.bin"] and sha(weights) == good
    assert "re-sent 2 file(s) changed locally: logs/job.log, out/weights.bin" in repaired.out and pull.marker.exists()

    weights.unlink()
    missing = pull("--verify-only")
    assert missing.returncode == 1 and "1 file(s) missing here: out/weights.bin" in missing.out

    (pull.dest / "out" / "stale.txt").write_text("from an older pull")
    extra = pull()  # the pull restores weights.bin, never deletes the stale file
    assert extra.returncode == 1, extra.out
    assert "unexpected here (never deleted; move it away): out/stale.txt" in extra.out and not pull.marker.exists()
    assert sha(weights) == next(e["sha256"] for e in json.loads(local_manifest)["files"]
                                if e["path"] == "out/weights.bin")
    (pull.dest / "out" / "stale.txt").unlink()
    healed = pull()
    assert healed.returncode == 0 and pull.marker.exists(), healed.out
    print(f"\ncollect timings: first {first.seconds:.1f}s, re-run {again.seconds:.1f}s, "
          f"verify-only {tampered.seconds:.1f}s")


@pytest.mark.slow
def test_cut_pull_leaves_no_marker_and_rerun_completes(stub_fleet, rp_run):
    stub, run_id, pull = rp_run
    make_run(stub, run_id, weights_mib=4)
    cut = {}

    def cutter():
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            out_dir = pull.dest / "out"
            if out_dir.is_dir() and any(p.name.startswith(".weights.bin.") for p in out_dir.iterdir()):
                time.sleep(0.5)
                stub.link_cut()
                cut["t"] = time.monotonic()
                return
            time.sleep(0.05)

    stub.rate_limit("2mbit")
    thread = threading.Thread(target=cutter, daemon=True)
    thread.start()
    first = pull("-e", "collect_retries=0", "-e", "collect_timeout_s=4")
    thread.join(timeout=5)
    stub.link_restore()
    stub.rate_unlimit()
    assert "t" in cut, "the link was never cut: " + first.out
    assert first.returncode != 0, first.out
    assert not pull.marker.exists()
    assert "re-run to resume" in first.out.lower() or "rsync failed" in first.out
    partial = list((pull.base / ".rsync-partial-rp").glob("*")) if (pull.base / ".rsync-partial-rp").exists() else []
    second = pull()
    assert second.returncode == 0, second.out
    assert pull.marker.exists()
    print(f"\ncut pull: {first.seconds:.1f}s (partial kept: {[p.name for p in partial]}), "
          f"resumed {second.seconds:.1f}s")


def test_missing_output_goes_to_quarantine(stub_fleet, rp_run):
    stub, run_id, pull = rp_run
    make_run(stub, run_id, outputs_ok=False)
    res = pull()
    assert res.returncode == 1, res.out
    assert "required output out/metrics.json is missing" in res.out
    qdir = f"/workspace/{PROJECT}/quarantine/{run_id}--1"
    assert "metrics.json is missing" in stub.exec(f"cat {qdir}/REASON.txt").stdout
    assert stub.exec(f"test -e /workspace/{PROJECT}/export/{run_id}", check=False).returncode != 0
    again = pull()  # a second failure never overwrites the first quarantine
    assert again.returncode == 1
    assert stub.exec(f"test -f {qdir}.2/REASON.txt", check=False).returncode == 0
    assert not pull.marker.exists()


def test_symlink_in_capsule_is_refused(stub_fleet, rp_run):
    stub, run_id, pull = rp_run
    run_dir = make_run(stub, run_id)
    pull.job["outputs"] = []  # all of out/
    pull.vars.write_text(json.dumps({"rgt_job": pull.job, "rgt_project": PROJECT}))
    stub.exec(f"ln -s /etc/passwd {run_dir}/out/passwd")
    res = pull()
    assert res.returncode == 1, res.out
    assert "symlink" in res.out and "out/passwd" in res.out
    assert stub.exec(f"test -e /workspace/{PROJECT}/export/{run_id}", check=False).returncode != 0


def test_unfinished_run_is_refused(stub_fleet, rp_run):
    stub, run_id, pull = rp_run
    run_dir = make_run(stub, run_id)
    stub.exec(f"rm {run_dir}/.rgt/exit.json")
    res = pull()
    assert res.returncode == 1 and "run is not finished" in res.out, res.out


def test_user_check_command_must_pass_for_the_pull_to_verify(stub_fleet, rp_run, tmp_path):
    stub, run_id, pull = rp_run
    make_run(stub, run_id)
    # a check that fails: every SHA-256 matches, and still no PULL_VERIFIED.json
    pull.job["verify_command"] = "test -s out/weights.bin && python3 -c 'import sys; sys.exit(7)'"
    pull.vars.write_text(json.dumps({"rgt_job": pull.job, "rgt_project": PROJECT}))
    failed = pull()
    assert failed.returncode == 1, failed.out
    assert not pull.marker.exists()
    # the same pull with a check that passes verifies
    pull.job["verify_command"] = "test -s out/weights.bin && test -s out/metrics.json"
    pull.vars.write_text(json.dumps({"rgt_job": pull.job, "rgt_project": PROJECT}))
    ok = pull()
    assert ok.returncode == 0, ok.out
    assert json.loads(pull.marker.read_text())["run_id"] == run_id


def records(runs: Path, run_id: str) -> dict:
    """What a pull of rp leaves here: every file's bytes (the marker without its verified_at; not the report, which
    the same code writes after either)."""
    out = {}
    for path in sorted((runs / run_id).rglob("*")):
        report = path.name.startswith(("report.", "report-", "rp.report."))  # its pages, figures and records
        if path.is_file() and ".incoming" not in path.parts and not report:
            data = path.read_bytes()
            if path.name == "rp.PULL_VERIFIED.json":
                data = json.dumps({k: v for k, v in json.loads(data).items() if k != "verified_at"}).encode()
            out[str(path.relative_to(runs))] = data
    return out


def test_the_collect_role_and_the_pull_round_give_the_same_records(stub_fleet, rp_run, tmp_path):
    stub, run_id, pull = rp_run
    make_run(stub, run_id, weights_mib=1)
    sealed = pull()  # the round seals it
    assert sealed.returncode == 0 and sealed.doc["phase"]["playbook"] == "pull round", sealed.out
    assert sealed.host["sealed"] and "already sealed" not in sealed.host["closeout"]
    role_runs, round_runs = tmp_path / "runs-role", tmp_path / "runs-pull"  # of one length: the same lines
    # a collect setting only the role reads (here the runs root pull writes into anyway) keeps the collect play
    by_role = pull("--runs-dir", str(role_runs), "-e", f"collect_runs_dir={role_runs}")
    by_round = pull("--runs-dir", str(round_runs))
    assert by_role.returncode == by_round.returncode == 0, by_role.out + by_round.out
    assert by_role.doc["phase"]["playbook"] == "playbooks/collect.yml" and \
        by_round.doc["phase"]["playbook"] == "pull round"
    assert records(role_runs, run_id) == records(round_runs, run_id) != {}
    assert json.dumps(by_role.doc["hosts"]).replace(str(role_runs), "RUNS") == \
        json.dumps(by_round.doc["hosts"]).replace(str(round_runs), "RUNS")
    line = next(ln for ln in by_round.out.splitlines() if "verified: 6 files" in ln)
    assert line.replace(str(round_runs), "RUNS") in by_role.out.replace(str(role_runs), "RUNS")
