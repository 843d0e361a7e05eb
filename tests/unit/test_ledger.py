"""The ledger's writes when the disk refuses them: one RgtError naming the file and the fix (exit 1), and nothing
half-written (an atomic write keeps the old record, an append is cut back to where it was)."""

import errno
import os

import pytest

from rgt import errors, ledger
from rgt.ledger import append_jsonl, atomic_write_json, ledger_dir


def test_an_append_the_disk_takes_half_of_is_cut_back_and_named(tmp_path, monkeypatch):
    log = tmp_path / "events.jsonl"
    append_jsonl(log, {"n": 1})
    before = log.read_bytes()
    real_write = os.write
    calls = []

    def half_then_full(fd, data):
        calls.append(len(data))
        if len(calls) == 1:
            return real_write(fd, bytes(data[:len(data) // 2]))  # the disk takes half the line...
        raise OSError(errno.ENOSPC, "No space left on device")  # ...then is full

    monkeypatch.setattr(os, "write", half_then_full)
    with pytest.raises(errors.RgtError) as refused:
        append_jsonl(log, {"n": 2, "pad": "x" * 100})
    monkeypatch.undo()
    assert log.read_bytes() == before  # no half line
    assert refused.value.exit_code == errors.FAILED
    assert refused.value.message.startswith(f"could not write {log}: the disk is full (No space left on device)")
    assert f"free space on the disk that holds {tmp_path}" in refused.value.fix


@pytest.mark.parametrize("code, why, fix", [
    (errno.EROFS, "the filesystem is read-only", "writable"),
    (errno.EACCES, "permission denied", "writable"),
    (errno.EDQUOT, "the disk quota is used up", "free space"),
    (errno.EFBIG, "the file size limit", "ulimit -f"),
])
def test_a_refused_record_keeps_the_old_one_and_says_what_to_do(tmp_path, monkeypatch, code, why, fix):
    root = ledger_dir(str(tmp_path / "ledger"))
    record = root / "status" / "box.json"
    atomic_write_json(record, {"state": "running"})
    before = record.read_bytes()
    real = os.fsync

    def refuse(fd):
        raise OSError(code, os.strerror(code))

    monkeypatch.setattr(os, "fsync", refuse)  # the data is written, then the disk refuses it
    with pytest.raises(errors.RgtError) as refused:
        atomic_write_json(record, {"state": "finished"})
    monkeypatch.setattr(os, "fsync", real)
    assert record.read_bytes() == before
    assert sorted(p.name for p in record.parent.iterdir()) == ["box.json"]  # no temp file left
    assert str(record) in refused.value.message and why in refused.value.message
    assert fix in refused.value.fix and "--ledger" in refused.value.fix  # a ledger file: move the ledger


def test_a_file_outside_the_ledger_is_not_told_to_move_the_ledger(tmp_path):
    other = tmp_path / "elsewhere" / "hosts.yml"
    fix = ledger.write_refused(other, OSError(errno.ENOSPC, "No space left on device")).fix
    assert "--ledger" not in fix and "another directory" in fix
