"""The seal (plugins/module_utils/rgt_seal.py), the closeout's logic without Ansible, on a temp durable root; and
its standalone entry (roles/collect/files/rgt_k8s_seal.py) run the way the seal pod runs it: a plain interpreter
with only the ConfigMap's flat directory to import from (no Ansible, no collection)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from ansible_collections.rgt.remote_gpu.plugins.module_utils import rgt_manifest as mf
from ansible_collections.rgt.remote_gpu.plugins.module_utils import rgt_seal

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "roles" / "collect" / "files" / "rgt_k8s_seal.py"
RUN_ID = "run.1"


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
    (run / "logs" / "job.log").write_text("done\n")
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
    assert sorted(e["path"] for e in doc["files"]) == ["ckpt/step-10/weights.bin", "out/metrics.json",
                                                       "out/model.bin", "run.json"]
    assert doc["host"] == "cluster" and doc["instance_id"] == "gke-ml"
    assert got["manifest_sha256"] == mf.sha256_bytes(raw) and got["files"] == 4
    run_doc = json.loads((capsule / "run.json").read_text())
    assert run_doc["code_hash8"] == "abcd1234" and run_doc["job_name"] == RUN_ID and run_doc["attempts"][0]["rc"] == 0
    left = {e["path"]: e["reason"] for e in got["not_pulled"]}
    assert set(left) == {".rgt/", "code-abcd1234/", "logs/"}
    assert not (tmp_path / "proj" / "export" / ".partial" / RUN_ID).exists()


def test_a_second_seal_is_a_no_op_and_never_rewrites_the_manifest(tmp_path):
    make_run(tmp_path)
    first = rgt_seal.seal(params(tmp_path))
    before = Path(first["manifest_path"]).read_bytes()
    second = rgt_seal.seal(params(tmp_path))
    assert not second["changed"] and second["sealed"] and second["msg"] == f"already sealed: {first['capsule']}"
    assert second["manifest_sha256"] == first["manifest_sha256"] and second["files"] == first["files"]
    assert Path(first["manifest_path"]).read_bytes() == before
    # a seal cut between the rename and the manifest: the next one writes the manifest, nothing else
    os.unlink(first["manifest_path"])
    third = rgt_seal.seal(params(tmp_path))
    assert third["changed"] and third["msg"] == "sealed earlier; manifest written now"
    assert mf.load_manifest(first["manifest_path"], RUN_ID)[0]["totals"]["files"] == first["files"]


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


# ---------------------------------------------------------------- the flat entry, as the seal pod runs it

def flat_dir(tmp_path: Path) -> Path:
    """The seal ConfigMap's directory: the entry script and the module_utils it imports, side by side."""
    flat = tmp_path / "rgt-seal"
    flat.mkdir()
    shutil.copy(SCRIPT, flat / SCRIPT.name)
    for name in rgt_seal.FLAT_MODULE_UTILS:
        shutil.copy(REPO / "plugins" / "module_utils" / f"{name}.py", flat / f"{name}.py")
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
    assert rc == 0 and doc["sealed"] and doc["msg"].startswith("sealed ") and doc["files"] == 2
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
