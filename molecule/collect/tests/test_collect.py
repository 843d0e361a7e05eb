"""Verify the collect scenario: on the box the run is sealed as export/mol-col/ with export/mol-col.manifest.json
beside it, export/.partial is empty and nothing was quarantined; on the controller <runs>/mol-col/<host>/ holds
the capsule, the run's logs included (logs/job.log, logs/attempts.jsonl, byte for byte the box's), and
<host>.PULL_VERIFIED.json names the SHA-256 of the manifest now on the box. Runs under testinfra with molecule's
inventory."""

import hashlib
import json
import os
from pathlib import Path

import pytest

EPHEMERAL = Path(os.environ["MOLECULE_EPHEMERAL_DIRECTORY"])
RUN_ID = "mol-col"
PROJECT_DIRS = {"adl": "/root/autodl-tmp/mol", "rp": "/workspace/mol"}
CAPSULE_FILES = ["ckpt/step_00000010.ckpt", "logs/attempts.jsonl", "logs/job.log", "out/metrics.json",
                 "out/weights.bin", "run.json"]


def _name(host):
    return host.backend.get_hostname()


def _export(host):
    return PROJECT_DIRS[_name(host)] + "/export"


def _local_base():
    return EPHEMERAL / "runs" / RUN_ID


@pytest.fixture
def box_manifest(host):
    f = host.file(f"{_export(host)}/{RUN_ID}.manifest.json")
    assert f.is_file
    return f.content  # bytes


def test_export_is_sealed_with_its_manifest_beside_it(host, box_manifest):
    assert host.file(f"{_export(host)}/{RUN_ID}").is_directory
    doc = json.loads(box_manifest)
    assert doc["schema"] == "rgt/manifest/v1" and doc["run_id"] == RUN_ID and doc["host"] == _name(host)
    assert [e["path"] for e in doc["files"]] == CAPSULE_FILES  # the undeclared rolling checkpoint stays out
    out = host.check_output(f"cd {_export(host)}/{RUN_ID} && find . -type f -printf '%P\\n' | LC_ALL=C sort")
    assert out.split() == CAPSULE_FILES


def test_partial_dir_is_empty_and_nothing_quarantined(host):
    partial = f"{_export(host)}/.partial"
    assert host.check_output(f"find {partial} -mindepth 1 2>/dev/null || true") == ""
    assert not host.file(PROJECT_DIRS[_name(host)] + "/quarantine").exists


def test_pull_verified_names_the_box_manifest(host, box_manifest):
    marker = _local_base() / f"{_name(host)}.PULL_VERIFIED.json"
    assert marker.is_file(), f"no marker at {marker}"
    doc = json.loads(marker.read_text())
    assert doc["schema"] == "rgt/pull-verified/v1" and doc["run_id"] == RUN_ID and doc["host"] == _name(host)
    assert doc["manifest_sha256"] == hashlib.sha256(box_manifest).hexdigest()
    assert doc["instance_id"] == host.ansible.get_variables()["rgt_instance_id"]
    assert doc["files"] == len(CAPSULE_FILES)
    # the box's sha256sum agrees with the controller's hash of the fetched bytes
    assert host.check_output(f"sha256sum {_export(host)}/{RUN_ID}.manifest.json").split()[0] == doc["manifest_sha256"]


def test_local_copy_equals_the_manifest(host, box_manifest):
    base = _local_base()
    assert (base / f"{_name(host)}.manifest.json").read_bytes() == box_manifest
    dest = base / _name(host)
    local = sorted(p.relative_to(dest).as_posix() for p in dest.rglob("*") if p.is_file())
    assert local == CAPSULE_FILES
    for entry in json.loads(box_manifest)["files"]:
        data = (dest / entry["path"]).read_bytes()
        assert len(data) == entry["bytes"] and hashlib.sha256(data).hexdigest() == entry["sha256"]


def test_the_logs_are_pulled_as_the_box_has_them(host, box_manifest):
    dest = _local_base() / _name(host)
    run_dir = PROJECT_DIRS[_name(host)] + f"/active/{RUN_ID}"
    for rel, on_box in (("logs/job.log", "logs/job.log"), ("logs/attempts.jsonl", ".rgt/attempts.jsonl")):
        assert (dest / rel).read_bytes() == host.file(f"{run_dir}/{on_box}").content
    logs = json.loads(box_manifest)["logs"]
    assert [(r["path"], r["sealed"], r["capped"]) for r in logs["files"]] == [
        ("logs/job.log", True, False), ("logs/attempts.jsonl", True, False)]


def test_provenance_names_what_stayed_on_the_box(host):
    prov = (_local_base() / f"{_name(host)}.PROVENANCE.md").read_text()
    assert "ckpt/step_00000005.ckpt" in prov
