"""rgt_pullverify's hash once (plugins/module_utils/rgt_pullverify.py): the repair pass of a re-pull records the
hashes it read, the verification of the same pull takes a file's hash from there only while the file is unchanged,
and every other verification reads every byte. Driven through verify_pull, the module rgt_pull_verify's code."""

from __future__ import annotations

import json
import os
import shutil
import time

import pytest

from ansible_collections.rgt.remote_gpu.plugins.module_utils import rgt_manifest as mf
from ansible_collections.rgt.remote_gpu.plugins.module_utils import rgt_pullverify as pv

RUN_ID = "r1"


@pytest.fixture
def pulled(tmp_path, monkeypatch):
    """A sealed capsule, its manifest in .incoming, and a local copy that already matches it (a re-pull)."""
    capsule = tmp_path / "box" / RUN_ID
    (capsule / "out").mkdir(parents=True)
    (capsule / "out" / "model.bin").write_bytes(os.urandom(2 * mf.CHUNK + 5))
    (capsule / "out" / "metrics.json").write_text('{"loss": 0.5}\n')
    (capsule / "run.json").write_text('{"schema": "rgt/run/v1"}\n')
    raw = mf.dumps(mf.build_manifest(str(capsule), RUN_ID, host="box", instance_id="i-1"))
    base = tmp_path / "runs" / RUN_ID
    (base / ".incoming").mkdir(parents=True)
    shutil.copytree(capsule, base / "box")
    monkeypatch.setattr(mf, "RACY_NS", 0)  # the copy was written just now: settled at once for these tests
    time.sleep(0.05)  # past the timestamps' granularity
    hashed = []
    real = mf.sha256_file
    monkeypatch.setattr(mf, "sha256_file", lambda path: hashed.append(os.path.relpath(path, base / "box")) or
                        real(path))

    def params(**extra):
        p = {"dest": str(base / "box"), "manifest_path": str(base / "box.manifest.json"), "incoming_manifest": None,
             "run_id": RUN_ID, "host": "box", "instance_id": "i-1", "profile": "local", "declared_checkpoints": [],
             "verify_command": None, "verify_timeout_s": 60, "not_pulled": [], "verify": True, "write_marker": True,
             "max_names": 20, "report": None, "reuse_hashes": False}
        p.update(extra)
        return p

    def promote():
        (base / ".incoming" / "box.manifest.json").write_bytes(raw)
        return pv.verify_pull(params(incoming_manifest=str(base / ".incoming" / "box.manifest.json"), verify=False))

    return {"base": base, "params": params, "promote": promote, "hashed": hashed,
            "cache": base / ".incoming" / "box.hashes.json", "marker": base / "box.PULL_VERIFIED.json"}


def test_a_re_pull_reads_each_local_file_once(pulled):
    result, msg = pulled["promote"]()
    assert msg is None and result["repair"] == [] and result["repair_list"] is None
    assert sorted(pulled["hashed"]) == ["out/metrics.json", "out/model.bin", "run.json"]
    doc = json.loads(pulled["cache"].read_text())
    assert doc["schema"] == "rgt/pull-hashes/v1" and sorted(doc["files"]) == sorted(pulled["hashed"])

    del pulled["hashed"][:]
    result, msg = pv.verify_pull(pulled["params"](reuse_hashes=True))
    assert msg is None and result["verified"], msg
    assert pulled["hashed"] == [], "the verification took every hash from the repair pass"
    assert pulled["marker"].is_file() and not pulled["cache"].exists(), "the record serves one verification"


def test_a_file_changed_after_the_repair_pass_is_read_again_and_caught(pulled):
    assert pulled["promote"]()[1] is None
    model = pulled["base"] / "box" / "out" / "model.bin"
    before = os.stat(model)
    time.sleep(0.05)
    with open(model, "r+b") as handle:  # same size, same mtime, same inode: only its ctime says it changed
        handle.seek(mf.CHUNK)
        handle.write(b"\0")
    os.utime(model, ns=(before.st_atime_ns, before.st_mtime_ns))
    del pulled["hashed"][:]
    result, msg = pv.verify_pull(pulled["params"](reuse_hashes=True))
    assert not result["verified"] and result["sha_mismatch"] == ["out/model.bin"]
    assert msg == "PULL NOT VERIFIED for r1/box: SHA-256 differs: out/model.bin"
    assert pulled["hashed"] == ["out/model.bin"] and not pulled["marker"].exists()


def test_a_verify_only_run_reads_every_byte_and_drops_a_cut_pulls_record(pulled):
    assert pulled["promote"]()[1] is None and pulled["cache"].is_file()  # the pull was cut before its verification
    del pulled["hashed"][:]
    result, msg = pv.verify_pull(pulled["params"]())  # reuse_hashes false: rgt-run pull --verify-only
    assert msg is None and result["verified"]
    assert sorted(pulled["hashed"]) == ["out/metrics.json", "out/model.bin", "run.json"]
    assert not pulled["cache"].exists()


def test_a_record_for_another_manifest_is_not_used(pulled):
    assert pulled["promote"]()[1] is None
    doc = json.loads(pulled["cache"].read_text())
    doc["manifest_sha256"] = "0" * 64
    pulled["cache"].write_text(json.dumps(doc))
    del pulled["hashed"][:]
    result, msg = pv.verify_pull(pulled["params"](reuse_hashes=True))
    assert msg is None and len(pulled["hashed"]) == 3 and not pulled["cache"].exists()
