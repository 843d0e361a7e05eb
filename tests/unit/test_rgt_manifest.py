"""rgt_manifest: build (refusals, order), validate, compare, checkpoint loaders."""

import json
import os
import time

import pytest

from ansible_collections.rgt.remote_gpu.plugins.module_utils import rgt_manifest as mf


def capsule(tmp_path):
    root = tmp_path / "cap"
    (root / "out").mkdir(parents=True)
    (root / "ckpt").mkdir()
    (root / "out" / "weights.bin").write_bytes(os.urandom(3 * mf.CHUNK + 17))
    (root / "out" / "metrics.json").write_text('{"loss": 0.1}\n')
    (root / "ckpt" / "step_00000010.ckpt").write_bytes(b"ck")
    (root / "run.json").write_text("{}\n")
    return root


def test_build_sorted_with_totals_and_valid(tmp_path):
    root = capsule(tmp_path)
    doc = mf.build_manifest(str(root), "r1", host="h", instance_id="i")
    paths = [f["path"] for f in doc["files"]]
    assert paths == sorted(paths) == ["ckpt/step_00000010.ckpt", "out/metrics.json", "out/weights.bin", "run.json"]
    assert doc["totals"] == {"files": 4, "bytes": sum(f["bytes"] for f in doc["files"])}
    assert mf.validate_manifest(json.loads(mf.dumps(doc)), "r1") == []
    assert mf.top_level_entries(doc) == ["ckpt", "out", "run.json"]
    assert mf.compare(str(root), doc)["ok"]


def test_symlinks_anywhere_are_refused(tmp_path):
    root = capsule(tmp_path)
    os.symlink("weights.bin", root / "out" / "alias.bin")
    with pytest.raises(mf.ManifestError, match="symlink: out/alias.bin"):
        mf.build_manifest(str(root), "r1")
    os.unlink(root / "out" / "alias.bin")
    os.symlink(str(tmp_path), root / "escape")  # a directory symlink pointing outside
    with pytest.raises(mf.ManifestError, match="symlink: escape"):
        mf.build_manifest(str(root), "r1")


def test_empty_capsule_and_bad_run_id_are_refused(tmp_path):
    (tmp_path / "empty" / "sub").mkdir(parents=True)
    with pytest.raises(mf.ManifestError, match="empty"):
        mf.build_manifest(str(tmp_path / "empty"), "r1")
    with pytest.raises(mf.ManifestError, match="run id"):
        mf.build_manifest(str(capsule(tmp_path)), "../x")


@pytest.mark.parametrize("path", ["/etc/passwd", "../x", "a/../b", "a//b", "./a", "C:/x", "a\\b"])
def test_path_escapes_are_invalid(path):
    doc = {"schema": mf.SCHEMA, "run_id": "r1", "files": [{"path": path, "bytes": 1, "sha256": "0" * 64}],
           "totals": {"files": 1, "bytes": 1}}
    assert any("path" in p for p in mf.validate_manifest(doc, "r1"))


def test_validate_names_every_problem():
    doc = {"schema": "x", "run_id": "r2", "totals": {"files": 2, "bytes": 0},
           "files": [{"path": "b", "bytes": 1, "sha256": "A" * 64}, {"path": "b", "bytes": -1, "sha256": "0" * 64}]}
    problems = " | ".join(mf.validate_manifest(doc, "r1"))
    for needle in ("schema", "expected 'r1'", "duplicate path b", "64 lowercase hex", "non-negative", "totals"):
        assert needle in problems


def test_compare_names_changed_extra_and_missing_files(tmp_path):
    root = capsule(tmp_path)
    doc = mf.build_manifest(str(root), "r1")
    data = bytearray((root / "out" / "weights.bin").read_bytes())
    data[mf.CHUNK + 5] ^= 1  # one byte, same size
    (root / "out" / "weights.bin").write_bytes(bytes(data))
    (root / "out" / "extra.txt").write_text("x")
    (root / "run.json").unlink()
    (root / "ckpt" / "step_00000010.ckpt").write_bytes(b"longer")
    res = mf.compare(str(root), doc)
    assert not res["ok"]
    assert res["sha_mismatch"] == ["out/weights.bin"]
    assert res["unexpected"] == ["out/extra.txt"]
    assert res["missing"] == ["run.json"]
    assert res["size_mismatch"] == ["ckpt/step_00000010.ckpt"]
    text = mf.describe_problems(res)
    assert "SHA-256 differs: out/weights.bin" in text and "unexpected local file: out/extra.txt" in text


def test_compare_counts_a_local_symlink_as_unexpected(tmp_path):
    root = capsule(tmp_path)
    doc = mf.build_manifest(str(root), "r1")
    os.symlink("/etc/hostname", root / "out" / "link")
    assert mf.compare(str(root), doc)["unexpected"] == ["out/link"]


def test_unknown_checkpoint_type_has_no_loader(tmp_path):
    path = tmp_path / "step_1.ckpt"
    path.write_bytes(b"x")
    assert mf.load_checkpoint(str(path), "ckpt/step_1.ckpt") == {
        "path": "ckpt/step_1.ckpt", "loader": None, "ok": None, "detail": "no loader for this file type"}


def test_safetensors_header_is_checked_without_the_library(tmp_path):
    header = json.dumps({"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}).encode()
    good = tmp_path / "good.safetensors"
    good.write_bytes(len(header).to_bytes(8, "little") + header + b"\0" * 8)
    assert mf.load_checkpoint(str(good))["ok"] is True
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(len(header).to_bytes(8, "little") + header + b"\0" * 4)  # truncated data
    res = mf.load_checkpoint(str(bad))
    assert res["ok"] is False and "outside the data" in res["detail"]


def test_numpy_loader(tmp_path):
    numpy = pytest.importorskip("numpy", reason="numpy is not installed in this venv (the loader is optional)")
    good = tmp_path / "w.npy"
    numpy.save(good, numpy.arange(4.0))
    assert mf.load_checkpoint(str(good))["ok"] is True
    bad = tmp_path / "o.npy"
    numpy.save(bad, numpy.array([{"a": 1}], dtype=object), allow_pickle=True)
    assert mf.load_checkpoint(str(bad))["ok"] is False  # allow_pickle=False refuses object arrays


def test_torch_file_without_torch_has_no_loader(tmp_path):
    path = tmp_path / "best.pth"
    path.write_bytes(b"PK\x03\x04")
    res = mf.load_checkpoint(str(path))
    if res["loader"] is None:
        assert res["ok"] is None and "torch" in res["detail"]


def test_the_logs_record_is_kept_and_a_sealed_log_it_names_must_be_listed(tmp_path):
    root = capsule(tmp_path)
    (root / "logs").mkdir()
    (root / "logs" / "job.log").write_text("step=1 loss=2.0\n")
    logs = {"max_bytes": 1 << 20, "files": [
        {"path": "logs/job.log", "source": "/box/run/logs/job.log", "source_bytes": 16, "bytes": 16, "sealed": True,
         "capped": False, "omitted": None, "reason": None},
        {"path": None, "source": "/box/run/logs/tb", "source_bytes": None, "bytes": 0, "sealed": False,
         "capped": False, "omitted": None, "reason": "not sealed: it is a directory"}]}
    doc = mf.build_manifest(str(root), "r1", logs=logs)
    assert doc["logs"] == logs and "logs/job.log" in [f["path"] for f in doc["files"]]
    assert mf.validate_manifest(json.loads(mf.dumps(doc)), "r1") == []
    assert "logs" not in mf.build_manifest(str(root), "r1"), "no record: an export sealed before logs were in it"
    doc["logs"]["files"][0]["path"] = "logs/other.log"
    assert mf.validate_manifest(doc, "r1") == [
        "logs.files[0] says 'logs/other.log' is sealed, but the manifest does not list it"]
    doc["logs"] = ["job.log"]
    assert mf.validate_manifest(doc, "r1") == ["logs must be an object with a list of files"]


def test_a_recorded_hash_is_reused_only_while_the_file_is_unchanged(tmp_path, monkeypatch):
    root = capsule(tmp_path)
    doc = mf.build_manifest(str(root), "r1")
    monkeypatch.setattr(mf, "RACY_NS", 0)  # the files were written just now: settled at once for this test
    time.sleep(0.05)  # past the timestamps' granularity (what RACY_NS stands for in a real pull)
    record = {}
    assert mf.compare(str(root), doc, record=record)["ok"]
    assert sorted(record) == [e["path"] for e in doc["files"]]
    hashed = []
    real = mf.sha256_file
    monkeypatch.setattr(mf, "sha256_file", lambda path: hashed.append(os.path.basename(path)) or real(path))
    assert mf.compare(str(root), doc, known=record)["ok"] and hashed == [], "nothing is read twice"

    # rewritten in place with the same size and the same mtime: its ctime moved, so it is read and caught
    weights = root / "out" / "weights.bin"
    before = os.stat(weights)
    time.sleep(0.05)
    with open(weights, "r+b") as handle:
        handle.write(b"X")
    os.utime(weights, ns=(before.st_atime_ns, before.st_mtime_ns))
    after = os.stat(weights)
    assert (after.st_ino, after.st_size, after.st_mtime_ns) == (before.st_ino, before.st_size, before.st_mtime_ns)
    res = mf.compare(str(root), doc, known=record)
    assert res["sha_mismatch"] == ["out/weights.bin"] and hashed == ["weights.bin"]


def test_a_hash_read_just_after_a_change_is_not_recorded(tmp_path):
    root = capsule(tmp_path)
    doc = mf.build_manifest(str(root), "r1")
    record = {}
    assert mf.compare(str(root), doc, record=record)["ok"]
    assert record == {}, "changed under RACY_NS ago: a later write could keep the same mtime and ctime"
    forged = {"run.json": [[0, 0, 3, 0, 0], "0" * 64]}  # another file's key: never trusted
    assert mf.compare(str(root), doc, known=forged)["ok"]
