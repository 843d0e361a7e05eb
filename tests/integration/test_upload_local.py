"""`rgt-run playbooks/train.yml` on the local inventory (this machine, a temp durable root): what upload_resume refuses
to ship and what it tells the user it left out.

A training script with CRLF line ends is named and refused before anything is shipped or launched (bash would hand
the job `ok\\r` as its last argument); the user may opt in. Files skipped while shipping (a symlink, a FIFO) are
named in the human output, not only in --json. Each test gets its own tmux server (TMUX_TMPDIR), killed at the end.
"""

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
RUN_ID = "crlf-run"

pytestmark = [
    pytest.mark.skipif(not (REPO / ".venv" / "bin" / "ansible-playbook").exists(), reason="needs .venv"),
    pytest.mark.skipif(shutil.which("rsync") is None, reason="needs rsync"),
]


class Local:
    """A copy of inventories/local whose durable and scratch roots are temp dirs, and a code dir to ship."""

    def __init__(self, root: Path):
        self.root = root
        self.inv = root / "inv"
        shutil.copytree(REPO / "inventories" / "local", self.inv)
        hosts = yaml.safe_load((self.inv / "hosts.yml").read_text())
        host = hosts["all"]["hosts"]["localhost"]
        self.durable = root / "durable"
        host.update(rgt_durable_root=str(self.durable), rgt_scratch_root=str(root / "scratch"))
        (self.inv / "hosts.yml").write_text(yaml.safe_dump(hosts))
        self.project = host["rgt_project"]
        self.run_dir = self.durable / self.project / "active" / RUN_ID
        self.code = root / "code"
        self.code.mkdir()
        # the script: saved on Windows, its last argument reaches the job as "ok\r"
        (self.code / "train.sh").write_bytes(
            b'#!/bin/bash\r\n"$PY" -c \'import os, sys; open(os.environ["RGT_OUT_DIR"] + "/argv.json", "w")'
            b'.write(repr(sys.argv[1:]))\' --tag ok\r\n')
        (self.code / "table.csv").write_bytes(b"a,b\r\n1,2\r\n")  # data with CRLF: fine
        self.tmux_dir = Path(tempfile.mkdtemp(prefix="rgt-tmux-", dir="/tmp"))

    def job(self):
        return {"name": RUN_ID, "command": "bash train.sh", "python": sys.executable, "code_dir": str(self.code),
                "env": {"PY": sys.executable}, "disk_floor_gib": 0}

    def train(self, rgt, *extra):
        return rgt("playbooks/train.yml", "-i", self.inv, "-e", json.dumps({"rgt_job": self.job()}), *extra,
                   env={"TMUX_TMPDIR": str(self.tmux_dir)}, timeout=300)

    def cleanup(self):
        pid_doc = {}
        try:
            pid_doc = json.loads((self.run_dir / ".rgt" / "pid").read_text())
        except (OSError, ValueError):
            pass
        for pid in (pid_doc.get("wrapper_pid"), pid_doc.get("pgid")):
            if pid:
                try:
                    os.kill(pid, 9)
                except OSError:
                    pass
        if shutil.which("tmux"):
            subprocess.run(["tmux", "kill-server"], capture_output=True,
                           env={**os.environ, "TMUX_TMPDIR": str(self.tmux_dir)})
        shutil.rmtree(self.tmux_dir, ignore_errors=True)


@pytest.fixture
def local(tmp_path):
    box = Local(tmp_path)
    yield box
    box.cleanup()


def test_a_crlf_script_is_named_and_refused_before_anything_is_shipped(rgt, local):
    """The whole train.yml: probe and env_check pass (its CRLF scan is off), upload refuses before sending."""
    result = local.train(rgt)
    assert result.rc == 1, result.stderr
    err = " ".join(result.stderr.split())  # the message may wrap
    assert "CRLF" in err and "train.sh" in err and "table.csv" not in err
    assert "sed -i 's/\\r$//' " + str(local.code / "train.sh") in err
    assert "dos2unix" in err and ".gitattributes" in err and "upload_resume_crlf=allow" in err
    # nothing shipped, nothing launched
    assert not list(local.run_dir.glob("code-*")) and not list(local.run_dir.glob(".code-*"))
    assert not (local.run_dir / ".rgt" / "job.json").exists()
    assert not (local.run_dir / ".rgt" / "wrapper.py").exists()


def test_allowed_crlf_ships_as_is_and_skipped_files_are_named(rgt, local):
    os.symlink("/etc", str(local.code / "etc-link"))
    os.mkfifo(str(local.code / "control.fifo"))
    # the phases that ship and launch (probe and env_check are the first test's business)
    result = local.train(rgt, "-e", "upload_resume_crlf=allow", "-t", "upload_resume,launch_detached")
    assert result.rc == 0, result.stderr
    upload = next(line for line in result.stderr.splitlines() if line.strip().startswith("upload: uploaded"))
    assert "skipped 2 not shipped: control.fifo (not a regular file), etc-link (symlink)" in upload
    assert "shipped with CRLF line ends (allow): train.sh" in upload
    shipped = list(local.run_dir.glob("code-*"))
    assert len(shipped) == 1 and (shipped[0] / "train.sh").read_bytes() == (local.code / "train.sh").read_bytes()
    assert not (shipped[0] / "etc-link").exists() and not (shipped[0] / "control.fifo").exists()
    assert json.loads((local.run_dir / ".rgt" / "job.json").read_text())["code_dir"] == str(shipped[0])
