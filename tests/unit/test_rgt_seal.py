"""The seal (plugins/module_utils/rgt_seal.py), the closeout's logic without Ansible, on a temp durable root, with
the run's logs (whole, capped, cut to a nearly full disk, a link, a Slurm array task's output, an export sealed
before logs were part of it); and its standalone entry (module_utils/rgt_k8s_seal.py, as the flat bundle
`k8s_seal` of module_utils/rgt_bundle) run the way the seal pod runs it: a plain interpreter with only the
ConfigMap's flat directory to import from (no Ansible, no collection)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from ansible_collections.rgt.remote_gpu.plugins.module_utils import rgt_bundle, rgt_seal
from ansible_collections.rgt.remote_gpu.plugins.module_utils import rgt_manifest as mf

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "plugins" / "module_utils" / "rgt_k8s_seal.py"
RUN_ID = "run.1"
LOG = ("== rgt attempt 1 started 2026-01-01T00:00:00Z resume_from=none\nstep=1 loss=2.0\n"
       "preempted: checkpoint\n== rgt attempt 1 ended 2026-01-01T00:05:00Z reason=preempted rc=143\n"
       "== rgt attempt 2 started 2026-01-01T00:06:00Z resume_from=ckpt/step-10\nresumed from step 10\n"
       "step=20 loss=0.5\ndone\n== rgt attempt 2 ended 2026-01-01T00:10:00Z reason=finished rc=0\n")


def make_run(root: Path, finished: bool = True) -> Path:
    """A run at <root>/proj/active/run.1 as the wrapper leaves it: attempts, exit.json, job.json, out/, ckpt/."""
    run = root / "proj" / "active" / RUN_ID
    for sub in (".rgt", "out", "ckpt/step-10", "logs", "code-abcd1234"):
        (run / sub).mkdir(parents=True, exist_ok=True)
    (run / ".rgt" / "attempts.jsonl").write_text(
        json.dumps({"attempt": 1, "started_at": "2026-01-01T00:00:00Z"}) + "\n"
        + json.dumps({"attempt": 1, "ended_at": "2026-01-01T00:10:00Z", "rc": 0, "reason": "finished"}) + "\n")
    (run / ".rgt" / "exit.json").write_text(json.dumps({"attempt": 1, "rc": 0 if finished else 1,
                                                         "reason": "finished" if finished else "failed"}))
    (run / ".rgt" / "job.json").write_text(json.dumps({"command": "python train.py",
                                                       "code_dir": str(run / "code-abcd1234")}))
    (run / "out" / "metrics.json").write_text('{"loss": 0.5}\n')
    (run / "out" / "model.bin").write_bytes(os.urandom(4096))
    (run / "ckpt" / "step-10" / "weights.bin").write_bytes(b"w" * 100)
    (run / "logs" / "job.log").write_text(LOG)
    return run


def params(root: Path, **extra) -> dict:
    doc = {"durable_root": str(root), "project": "proj", "run_id": RUN_ID, "host": "cluster",
           "instance_id": "gke-ml", "job_name": None, "outputs": [], "declared_checkpoints": [], "attempt": None,
           "force_unfinished": False, "loader_python": None}
    doc.update(extra)
    return doc


def test_seal_builds_the_capsule_and_its_manifest_and_names_what_it_leaves(tmp_path):
    make_run(tmp_path)
    got = rgt_seal.seal(params(tmp_path, outputs=["metrics.json", "model.bin"], declared_checkpoints=["step-10/"]))
    capsule = tmp_path / "proj" / "export" / RUN_ID
    assert got["changed"] and got["sealed"] and got["msg"] == f"sealed {capsule}" and got["attempt"] == 1
    assert got["capsule"] == str(capsule) and got["manifest_path"] == f"{capsule}.manifest.json"
    doc, raw = mf.load_manifest(got["manifest_path"], RUN_ID)
    assert sorted(e["path"] for e in doc["files"]) == ["ckpt/step-10/weights.bin", "logs/attempts.jsonl",
                                                       "logs/job.log", "out/metrics.json", "out/model.bin", "run.json"]
    assert doc["host"] == "cluster" and doc["instance_id"] == "gke-ml"
    assert got["manifest_sha256"] == mf.sha256_bytes(raw) and got["files"] == 6
    run_doc = json.loads((capsule / "run.json").read_text())
    assert run_doc["code_hash8"] == "abcd1234" and run_doc["job_name"] == RUN_ID and run_doc["attempts"][0]["rc"] == 0
    # the logs as the box has them, byte for byte: both attempts' lines, the raw attempt records
    run = tmp_path / "proj" / "active" / RUN_ID
    assert (capsule / "logs" / "job.log").read_text() == LOG
    assert (capsule / "logs" / "attempts.jsonl").read_bytes() == (run / ".rgt" / "attempts.jsonl").read_bytes()
    sealed = {e["path"]: e for e in doc["files"]}
    assert sealed["logs/job.log"]["sha256"] == mf.sha256_bytes(LOG.encode())
    records = {r["path"]: r for r in doc["logs"]["files"]}
    assert doc["logs"] == run_doc["logs"] == got["logs"] and doc["logs"]["max_bytes"] == 256 << 20
    assert records["logs/job.log"] == {"path": "logs/job.log", "source": str(run / "logs" / "job.log"),
                                       "source_bytes": len(LOG), "bytes": len(LOG), "sealed": True, "capped": False,
                                       "omitted": None, "reason": None}
    assert rgt_seal.log_warnings(got["logs"]) == []
    left = {e["path"]: e["reason"] for e in got["not_pulled"]}
    assert set(left) == {".rgt/", "code-abcd1234/"}
    assert "logs/attempts.jsonl" in left[".rgt/"]
    assert not (tmp_path / "proj" / "export" / ".partial" / RUN_ID).exists()


def test_a_second_seal_is_a_no_op_and_never_rewrites_the_manifest(tmp_path):
    make_run(tmp_path)
    first = rgt_seal.seal(params(tmp_path))
    before = Path(first["manifest_path"]).read_bytes()
    second = rgt_seal.seal(params(tmp_path))
    assert not second["changed"] and second["sealed"] and second["msg"] == f"already sealed: {first['capsule']}"
    assert second["manifest_sha256"] == first["manifest_sha256"] and second["files"] == first["files"]
    assert Path(first["manifest_path"]).read_bytes() == before
    assert second["logs"] == first["logs"] and second["not_pulled"] == first["not_pulled"]
    # a seal cut between the rename and the manifest: the next one writes the manifest, nothing else
    os.unlink(first["manifest_path"])
    third = rgt_seal.seal(params(tmp_path))
    assert third["changed"] and third["msg"] == "sealed earlier; manifest written now"
    rewritten = mf.load_manifest(first["manifest_path"], RUN_ID)[0]
    assert rewritten["totals"]["files"] == first["files"] and rewritten["logs"] == first["logs"]


def test_a_symlink_in_the_outputs_quarantines_the_candidate_naming_it(tmp_path):
    run = make_run(tmp_path)
    (tmp_path / "secret.txt").write_text("outside the run")
    os.symlink(tmp_path / "secret.txt", run / "out" / "leak.txt")
    with pytest.raises(rgt_seal.SealError) as err:
        rgt_seal.seal(params(tmp_path))
    quarantine = tmp_path / "proj" / "quarantine" / f"{RUN_ID}--1"
    assert err.value.quarantine == str(quarantine) and "leak.txt" in err.value.reason
    assert err.value.msg.startswith(f"closeout of {RUN_ID} failed, candidate moved to {quarantine}: ")
    assert err.value.result["changed"] and not err.value.result["sealed"]
    assert "leak.txt" in (quarantine / "REASON.txt").read_text()
    assert not list(quarantine.rglob("secret.txt")) and not (tmp_path / "proj" / "export" / RUN_ID).exists()
    with pytest.raises(rgt_seal.SealError) as again:  # an earlier quarantine is never overwritten
        rgt_seal.seal(params(tmp_path))
    assert again.value.quarantine == f"{quarantine}.2"


def test_a_missing_output_is_refused_and_quarantined(tmp_path):
    make_run(tmp_path)
    with pytest.raises(rgt_seal.SealError) as err:
        rgt_seal.seal(params(tmp_path, outputs=["metrics.json", "final/model.safetensors"]))
    assert "final/model.safetensors" in err.value.reason and err.value.quarantine.endswith(f"{RUN_ID}--1")
    assert not (tmp_path / "proj" / "export" / RUN_ID).exists()


def test_unfinished_missing_and_badly_named_runs_are_refused_before_anything_is_written(tmp_path):
    make_run(tmp_path, finished=False)
    with pytest.raises(rgt_seal.SealError) as err:
        rgt_seal.seal(params(tmp_path))
    assert "run is not finished" in err.value.msg and err.value.result["exit"]["reason"] == "failed"
    assert err.value.quarantine is None and not (tmp_path / "proj" / "export").exists()
    assert rgt_seal.seal(params(tmp_path, force_unfinished=True))["sealed"]
    with pytest.raises(rgt_seal.SealError) as err:
        rgt_seal.seal(params(tmp_path, run_id="other"))
    assert err.value.msg.startswith("no run other on this box")
    with pytest.raises(rgt_seal.SealError) as err:
        rgt_seal.seal(params(tmp_path, run_id="../x"))
    assert err.value.msg.startswith("nothing sealed: ") and err.value.result == {}
    with pytest.raises(rgt_seal.SealError) as err:
        rgt_seal.seal(params(tmp_path, outputs=["../etc/passwd"]))
    assert err.value.msg.startswith("outputs entry '../etc/passwd' is refused")


def test_check_mode_writes_nothing(tmp_path):
    make_run(tmp_path)
    got = rgt_seal.seal(params(tmp_path), check_mode=True)
    assert got["changed"] and got["msg"].startswith("would seal ") and not (tmp_path / "proj" / "export").exists()


# ---------------------------------------------------------------- the logs

def lines(n: int, width: int = 100) -> bytes:
    return b"".join(b"line %08d " % i + b"x" * (width - 15) + b"\n" for i in range(n))


def test_a_log_over_its_cap_keeps_its_head_and_tail_and_says_what_it_left_out(tmp_path):
    run = make_run(tmp_path)
    log = lines(30_000)  # 3 MB, capped at 1 MiB
    (run / "logs" / "job.log").write_bytes(log)
    got = rgt_seal.seal(params(tmp_path, log_max_mb=1))
    assert got["sealed"], got
    kept = (Path(got["capsule"]) / "logs" / "job.log").read_bytes()
    (rec,) = [r for r in got["logs"]["files"] if r["path"] == "logs/job.log"]
    start, end = rec["omitted"]
    assert rec["capped"] and rec["sealed"] and rec["source_bytes"] == len(log) and rec["bytes"] == len(kept)
    assert kept.startswith(log[:start]) and kept.endswith(log[end:]), "the first and the last lines, whole"
    assert log[start - 1:start] == b"\n" and log[end - 1:end] == b"\n", "cut at line ends"
    assert (start + len(log) - end) <= 1 << 20 < len(kept) < (1 << 20) + 400
    middle = kept[start:len(kept) - (len(log) - end)].decode()
    assert middle == (f"== rgt: bytes {start} to {end} of this log ({end - start} of its {len(log)} bytes) are not in "
                      f"the export: it is capped at 1.0 MiB (collect_log_max_mb); the whole log stays on the box at "
                      f"{run / 'logs' / 'job.log'} until teardown ==\n")
    assert rec["reason"] == (f"capped: bytes {start} to {end} ({(end - start) / 2**20:.1f} MiB of 2.9 MiB) are not "
                             "in the export: it is capped at 1.0 MiB (collect_log_max_mb)")
    doc = mf.load_manifest(got["manifest_path"], RUN_ID)[0]
    assert doc["logs"]["max_bytes"] == 1 << 20 and rec in doc["logs"]["files"]
    assert next(e for e in doc["files"] if e["path"] == "logs/job.log")["sha256"] == mf.sha256_bytes(kept)
    assert {"path": "logs/job.log", "reason": rec["reason"]} in got["not_pulled"]
    assert rgt_seal.log_warnings(got["logs"]) == [f"{run / 'logs' / 'job.log'}: {rec['reason']}"]
    assert (run / "logs" / "job.log").read_bytes() == log, "the box's log is never touched"
    with pytest.raises(rgt_seal.SealError, match=r"log_max_mb \(collect_log_max_mb\) is 0: give a whole number"):
        rgt_seal.seal(params(tmp_path, run_id="other", log_max_mb=0))


@pytest.fixture
def small_disk(tmp_path, tmpfs):
    """A 16 MiB tmpfs (unmounted afterwards); skipped where mounting is not allowed."""
    return tmpfs(tmp_path / f"disk-{uuid.uuid4().hex[:6]}", "size=16m")


def free_bytes(path: Path) -> int:
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


def test_a_log_on_a_nearly_full_disk_is_cut_to_the_room_left_and_never_fills_it(small_disk):
    run = make_run(small_disk)
    log = lines(100_000)  # 10 MB of a 16 MiB disk: a whole copy does not fit
    (run / "logs" / "job.log").write_bytes(log)
    floor = int(16 * 2**20 * 0.05)  # 5% of a disk smaller than 1.25 GiB (64 MiB on a larger one)
    got = rgt_seal.seal(params(small_disk))
    assert got["sealed"] and got["files"] == 5, got["logs"]
    (rec,) = [r for r in got["logs"]["files"] if r["path"] == "logs/job.log"]
    assert rec["capped"] and "the box's disk has room for only" in rec["reason"] and "819.2 KiB is left free" in \
        rec["reason"], rec
    kept = (Path(got["capsule"]) / "logs" / "job.log").read_bytes()
    assert kept.startswith(log[:rec["omitted"][0]]) and kept.endswith(log[rec["omitted"][1]:])
    assert free_bytes(small_disk) >= floor - 64 * 1024, "the floor is left free (less the manifest's few KiB)"

    # a disk with less room than is worth a copy: the log is not sealed, said so, and the seal goes on
    shutil.rmtree(run.parents[1] / "export" / RUN_ID)  # as if not sealed yet
    os.unlink(run.parents[1] / "export" / f"{RUN_ID}.manifest.json")
    with open(small_disk / "filler", "wb") as handle:
        handle.write(b"\0" * max(0, free_bytes(small_disk) - floor - 16 * 1024))
    again = rgt_seal.seal(params(small_disk))
    assert again["sealed"], again
    (rec,) = [r for r in again["logs"]["files"] if r["source"].endswith("/logs/job.log")]
    assert rec["path"] is None and not rec["sealed"] and rec["source_bytes"] == len(log)
    assert rec["reason"].startswith("not sealed: it has 9.5 MiB and the box's disk has room for ")
    assert rec["reason"].endswith("it stays on the box until teardown (`rgt-run logs --all` prints a run's job.log)")
    assert not (Path(again["capsule"]) / "logs" / "job.log").exists()
    doc = mf.load_manifest(again["manifest_path"], RUN_ID)[0]
    assert "logs/job.log" not in [e["path"] for e in doc["files"]] and rec in doc["logs"]["files"]
    assert {"path": "logs/job.log", "reason": rec["reason"]} in again["not_pulled"]


def test_a_log_that_is_a_link_or_a_directory_is_named_never_followed_and_the_seal_goes_on(tmp_path):
    run = make_run(tmp_path)
    (tmp_path / "secret.txt").write_text("not the run's\n")
    (run / "logs" / "job.log").unlink()
    os.symlink(tmp_path / "secret.txt", run / "logs" / "job.log")
    (run / "logs" / "tensorboard").mkdir()
    (run / "logs" / "wrapper.log").write_text("rgt wrapper: started\n")
    got = rgt_seal.seal(params(tmp_path))
    capsule = Path(got["capsule"])
    assert got["sealed"] and not (capsule / "logs" / "job.log").exists()
    assert (capsule / "logs" / "wrapper.log").read_text() == "rgt wrapper: started\n"
    left = {e["path"]: e["reason"] for e in got["not_pulled"]}
    assert left["logs/job.log"] == f"not sealed: it is a symlink -> {tmp_path / 'secret.txt'} (nothing is followed)"
    assert left["logs/tensorboard"] == "not sealed: it is a directory (the files at the top of logs/ are sealed)"
    assert not list(capsule.rglob("secret.txt")) and "not the run's" not in json.dumps(got)


def test_the_slurm_outputs_of_a_run_and_of_an_array_task_are_sealed_with_its_logs(tmp_path):
    run = make_run(tmp_path)
    (run / "logs" / "slurm-12.out").write_text("slurmstepd: *** JOB 12 CANCELLED DUE TO TIME LIMIT ***\n")
    sweep = tmp_path / "proj" / "sweeps" / "grid"
    (sweep / "logs").mkdir(parents=True)
    (sweep / "logs" / "slurm-40_3.out").write_text("task 3 of array 40\n")
    (sweep / "logs" / "slurm-40_2.out").write_text("another cell's task\n")
    (run / ".rgt" / "slurm.json").write_text(json.dumps({
        "job_id": "40_3", "array_job_id": "40", "array_task": 3, "comment": str(sweep),
        "submits": [{"job_id": "40_3", "submitted_at": "2026-01-01T00:00:00Z"}]}))
    got = rgt_seal.seal(params(tmp_path))
    capsule = Path(got["capsule"])
    assert (capsule / "logs" / "slurm-12.out").read_text().startswith("slurmstepd: *** JOB 12 CANCELLED")
    assert (capsule / "logs" / "slurm-40_3.out").read_text() == "task 3 of array 40\n"
    assert not (capsule / "logs" / "slurm-40_2.out").exists(), "only this cell's task"
    listed = [e["path"] for e in mf.load_manifest(got["manifest_path"], RUN_ID)[0]["files"]]
    assert {"logs/slurm-12.out", "logs/slurm-40_3.out", "logs/job.log"} <= set(listed)
    sources = {r["path"]: r["source"] for r in got["logs"]["files"]}
    assert sources["logs/slurm-40_3.out"] == str(sweep / "logs" / "slurm-40_3.out")


def test_a_run_with_only_logs_has_nothing_to_export(tmp_path):
    run = make_run(tmp_path)
    for name in ("metrics.json", "model.bin"):
        (run / "out" / name).unlink()
    with pytest.raises(rgt_seal.SealError) as err:
        rgt_seal.seal(params(tmp_path))
    assert "nothing to export" in err.value.reason
    assert not (Path(err.value.quarantine) / "logs").exists(), "no log is copied for a candidate without results"


def test_an_export_sealed_before_logs_were_part_of_it_is_left_as_it_is(tmp_path):
    make_run(tmp_path)
    capsule = tmp_path / "proj" / "export" / RUN_ID
    (capsule / "out").mkdir(parents=True)
    (capsule / "out" / "metrics.json").write_text('{"loss": 0.5}\n')
    (capsule / "run.json").write_text(json.dumps({"schema": "rgt/run/v1", "run_id": RUN_ID}) + "\n")
    raw = mf.dumps(mf.build_manifest(str(capsule), RUN_ID, host="cluster", instance_id="gke-ml"))
    Path(f"{capsule}.manifest.json").write_bytes(raw)
    got = rgt_seal.seal(params(tmp_path))
    assert not got["changed"] and got["msg"] == f"already sealed: {capsule}" and got["logs"] is None
    assert Path(f"{capsule}.manifest.json").read_bytes() == raw and not (capsule / "logs").exists()
    left = {e["path"]: e["reason"] for e in got["not_pulled"]}
    assert left["logs/"] == "logs stay on the box (this export was sealed before logs were part of it)"


# ---------------------------------------------------------------- the flat entry, as the seal pod runs it

def flat_dir(tmp_path: Path) -> Path:
    """The seal ConfigMap's directory: the entry script and the module_utils it imports, side by side (the bundle
    `k8s_seal`, as runner/rgt/k8s_engine.seal_files puts it in the ConfigMap)."""
    flat = tmp_path / "rgt-seal"
    flat.mkdir()
    for name, text in rgt_bundle.build("k8s_seal").files.items():
        (flat / name).write_text(text)
    flat.chmod(0o555)  # a ConfigMap mount is read-only
    return flat


def run_flat(flat: Path, *args: str, env: dict | None = None) -> tuple[int, dict, str]:
    """The script under a plain python3 with -S -E (no site-packages, no PYTHONPATH): only its own directory (and
    the stdlib) to import from. (rc, the one JSON line, stderr)."""
    proc = subprocess.run(["/usr/bin/python3", "-S", "-E", str(flat / SCRIPT.name), *args], capture_output=True,
                          text=True, cwd=flat.parent, env={"PATH": "/usr/bin:/bin", **(env or {})}, timeout=60)
    lines = proc.stdout.splitlines()
    assert len(lines) == 1, proc.stdout + proc.stderr
    return proc.returncode, json.loads(lines[0]), proc.stderr


@pytest.mark.skipif(not Path("/usr/bin/python3").exists(), reason="needs /usr/bin/python3")
def test_the_entry_script_seals_with_only_its_flat_directory_to_import_from(tmp_path):
    flat = flat_dir(tmp_path)
    durable = tmp_path / "durable"
    make_run(durable)
    probe = subprocess.run(["/usr/bin/python3", "-S", "-E", "-c", "import ansible_collections"], cwd=flat.parent,
                           capture_output=True)
    assert probe.returncode != 0, "the flat run must not see the collection"
    (tmp_path / "params.json").write_text(json.dumps(params(durable, outputs=["metrics.json"])))
    rc, doc, _err = run_flat(flat, str(tmp_path / "params.json"))
    assert rc == 0 and doc["sealed"] and doc["msg"].startswith("sealed ") and doc["files"] == 4
    assert (Path(doc["capsule"]) / "logs" / "job.log").read_text() == LOG
    assert mf.load_manifest(doc["manifest_path"], RUN_ID)[0]["host"] == "cluster"
    assert not list(flat.rglob("__pycache__"))
    # the params from the environment; a second seal says so
    rc, doc, _err = run_flat(flat, env={"RGT_SEAL_PARAMS": json.dumps(params(durable))})
    assert rc == 0 and doc["msg"].startswith("already sealed: ") and not doc["changed"]


@pytest.mark.skipif(not Path("/usr/bin/python3").exists(), reason="needs /usr/bin/python3")
def test_the_entry_script_fails_in_one_json_line_with_the_quarantine(tmp_path):
    flat = flat_dir(tmp_path)
    durable = tmp_path / "durable"
    run = make_run(durable)
    os.symlink("/etc/hostname", run / "out" / "leak.txt")
    (tmp_path / "params.json").write_text(json.dumps(params(durable)))
    rc, doc, _err = run_flat(flat, str(tmp_path / "params.json"))
    assert rc == 1 and doc["failed"] and doc["quarantine"].endswith(f"{RUN_ID}--1") and "leak.txt" in doc["reason"]
    assert doc["msg"].startswith(f"closeout of {RUN_ID} failed, candidate moved to ")
    rc, doc, _err = run_flat(flat)
    assert rc == 1 and doc == {"failed": True, "msg": "nothing sealed: no params: give a JSON file as the argument "
                                                      "or the JSON text in $RGT_SEAL_PARAMS"}
    (tmp_path / "bad.json").write_text("[1, 2]")
    rc, doc, _err = run_flat(flat, str(tmp_path / "bad.json"))
    assert rc == 1 and "not a JSON object" in doc["msg"]


# ---------------------------------------------------------------- the checkpoint loader (the bundle ckpt_loader)

OTHER_PYTHON = "/usr/bin/python3"  # an interpreter without numpy: what a load check gives there tells where it ran
needs_other_python = pytest.mark.skipif(
    not Path(OTHER_PYTHON).exists() or subprocess.run([OTHER_PYTHON, "-c", "import numpy"],
                                                      capture_output=True).returncode == 0,
    reason=f"needs {OTHER_PYTHON} without numpy")


def npy_run(root: Path) -> Path:
    """A finished run whose declared checkpoint step-10/ holds a .npy (numpy loads it; without numpy: no loader)."""
    numpy = pytest.importorskip("numpy")
    run = make_run(root)
    numpy.save(run / "ckpt" / "step-10" / "weights.npy", numpy.arange(6, dtype="float32"))
    return run


def load_checks(result: dict) -> dict:
    return {c["path"]: (c["ok"], c["detail"]) for c in result["checkpoints"] if c["path"].endswith(".npy")}


@needs_other_python
def test_the_closeout_runs_the_load_checks_under_the_jobs_python_from_the_loader_bundle(tmp_path):
    """rgt_closeout (this interpreter, with numpy) installs loader_bundle in a temp dir and runs the checkpoint load
    check under loader_python (no numpy there); without the bundle the check runs here."""
    def closeout(root: Path, **extra) -> dict:
        npy_run(root)
        args = tmp_path / f"{root.name}.json"
        args.write_text(json.dumps({"ANSIBLE_MODULE_ARGS": dict(
            params(root, declared_checkpoints=["step-10/"], loader_python=OTHER_PYTHON), **extra)}))
        proc = subprocess.run([sys.executable, str(REPO / "plugins" / "modules" / "rgt_closeout.py"), str(args)],
                              capture_output=True, text=True, timeout=120,
                              env={**os.environ, "PYTHONPATH": str(REPO / ".collections"), "TMPDIR": str(tmp_path)})
        assert proc.returncode == 0, proc.stdout + proc.stderr
        return json.loads(proc.stdout)

    there = closeout(tmp_path / "there", loader_bundle=rgt_bundle.build("ckpt_loader").as_dict())
    assert load_checks(there) == {"ckpt/step-10/weights.npy": (None, "numpy is not importable")}
    assert not list(tmp_path.glob("rgt-ckpt-loader-*")), "the loader's temp dir is removed"
    here = closeout(tmp_path / "here")
    assert load_checks(here) == {"ckpt/step-10/weights.npy": (True, "array float32 (6,)")}


@pytest.mark.skipif(not Path("/usr/bin/python3").exists(), reason="needs /usr/bin/python3")
def test_the_seal_pod_runs_the_load_checks_under_loader_python_from_its_own_directory(tmp_path):
    """In the seal pod the checkpoint loader is the ConfigMap's rgt_manifest.py: loader_python (here the test's
    interpreter, with numpy) loads the .npy that the pod's plain python3 could not."""
    flat = flat_dir(tmp_path)
    durable = tmp_path / "durable"
    npy_run(durable)
    (tmp_path / "params.json").write_text(json.dumps(params(durable, declared_checkpoints=["step-10/"],
                                                            loader_python=sys.executable)))
    rc, doc, _err = run_flat(flat, str(tmp_path / "params.json"))
    assert rc == 0 and doc["sealed"], doc
    assert load_checks(doc) == {"ckpt/step-10/weights.npy": (True, "array float32 (6,)")}


def test_the_seal_hashes_each_file_while_it_copies_it_and_never_reads_the_candidate_back(tmp_path, monkeypatch):
    run = make_run(tmp_path)
    (run / "logs" / "job.log").write_bytes(lines(30_000))  # capped: its manifest hash is the kept bytes'
    (run / "logs" / "wrapper.log").write_text("wrapper\n")
    read_back = []
    real = mf.sha256_file
    monkeypatch.setattr(mf, "sha256_file", lambda path: read_back.append(path) or real(path))
    got = rgt_seal.seal(params(tmp_path, declared_checkpoints=["step-10/"], log_max_mb=1))
    assert got["sealed"], got
    capsule = Path(got["capsule"])
    assert [os.path.basename(p) for p in read_back] == ["run.json"], "only the file the seal wrote itself"
    doc = mf.load_manifest(got["manifest_path"], RUN_ID)[0]
    assert {e["path"] for e in doc["files"]} >= {"out/model.bin", "ckpt/step-10/weights.bin", "logs/job.log",
                                                 "logs/wrapper.log", "logs/attempts.jsonl"}
    for entry in doc["files"]:  # every hash is the sealed file's own
        assert entry["sha256"] == mf.sha256_bytes((capsule / entry["path"]).read_bytes()), entry["path"]
