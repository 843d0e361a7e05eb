"""Verify the upload_resume scenario: exactly one code-<hash8> dir under <durable>/rgt/active/mol-up/, holding
exactly the files of examples/tiny_train with the same SHA-256, no staging dir left, and the box's upload record
(.rgt/uploads.jsonl, one line: idempotence did not upload again). Runs under testinfra with molecule's inventory."""

import hashlib
import json
import os
from pathlib import Path

import pytest

SRC = Path(os.environ["MOLECULE_PROJECT_DIRECTORY"]) / "examples" / "tiny_train"
EPHEMERAL = Path(os.environ["MOLECULE_EPHEMERAL_DIRECTORY"])
RUN_DIRS = {"adl": "/root/autodl-tmp/rgt/active/mol-up", "rp": "/workspace/rgt/active/mol-up"}


def _name(host):
    return host.backend.get_hostname()


def _run_dir(host):
    return RUN_DIRS[_name(host)]


def _local_files():
    """relpath -> sha256 of every file of the local tree (it has no .rgtignore/.gitignore: all are shipped)."""
    return {
        p.relative_to(SRC).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(SRC.rglob("*"))
        if p.is_file()
    }


def _code_dirs(host):
    out = host.check_output(f"find {_run_dir(host)} -mindepth 1 -maxdepth 1 -type d -name 'code-*' -printf '%f\\n'")
    return sorted(line for line in out.splitlines() if line)


@pytest.fixture
def code_dir(host):
    dirs = _code_dirs(host)
    assert len(dirs) == 1, f"expected exactly one code-* dir, found {dirs}"
    return _run_dir(host) + "/" + dirs[0]


def test_one_code_dir_named_by_its_hash8(host, code_dir):
    name = code_dir.rsplit("/", 1)[1]
    assert len(name) == len("code-") + 8
    int(name[len("code-") :], 16)  # eight hex digits


def test_code_dir_files_match_the_local_tree(host, code_dir):
    local = _local_files()
    assert local, f"no files under {SRC}"
    remote = {}
    out = host.check_output(f"cd {code_dir} && find . -type f -print0 | xargs -0 -r sha256sum")
    for line in out.splitlines():
        digest, rel = line.split(None, 1)
        remote[rel.strip()[2:]] = digest  # strip "./"
    assert remote == local


def test_no_staging_dir_left(host):
    out = host.check_output(f"find {_run_dir(host)} -mindepth 1 -maxdepth 1 -name '.code-*.partial'")
    assert out.strip() == ""


def test_upload_recorded_once_on_the_box(host, code_dir):
    f = host.file(_run_dir(host) + "/.rgt/uploads.jsonl")
    assert f.is_file
    lines = [json.loads(ln) for ln in f.content_string.splitlines() if ln.strip()]
    assert len(lines) == 1, lines  # the second converge found the dir present and did not upload again
    assert lines[0]["code_dir"] == code_dir
    assert lines[0]["files"] == len(_local_files())


def test_controller_ledger_has_the_upload(host, code_dir):
    path = EPHEMERAL / "ledger" / "uploads" / f"{_name(host)}.jsonl"
    assert path.is_file(), f"no ledger at {path}"
    lines = [json.loads(ln) for ln in path.read_text().splitlines() if ln.strip()]
    assert lines[0]["status"] == "uploaded" and lines[0]["code_dir"] == code_dir
