"""The upload_resume role, run with ansible-playbook: on a podman stub host over real, pinned SSH (marked stubs)
and on the controller itself (connection local).

The SSH pins are passed the way runner/rgt/phases.py passes them (extra var ansible_ssh_extra_args).
"""

import hashlib
import json
import os
import random
import subprocess
import threading
import time
import uuid
from pathlib import Path

import pytest
import yaml
from conftest import stub_inventory

REPO = Path(__file__).resolve().parents[2]
ANSIBLE_PLAYBOOK = REPO / ".venv" / "bin" / "ansible-playbook"
PROJECT = "uptest"
MIB = 1024 * 1024

pytestmark = pytest.mark.skipif(not ANSIBLE_PLAYBOOK.exists(), reason="needs .venv with ansible-core")

PLAYBOOK = """
- name: upload_resume under test
  hosts: all
  gather_facts: false
  roles:
    - rgt.remote_gpu.upload_resume
  post_tasks:
    - name: Save the report for the test
      ansible.builtin.copy:
        content: "{{ upload_resume_report | to_nice_json }}"
        dest: "{{ report_path }}"
        mode: "0644"
      delegate_to: localhost
"""


def make_tree(root: Path, files: int, size: int, seed: int) -> Path:
    rng = random.Random(seed)
    root.mkdir(parents=True, exist_ok=True)
    for i in range(files):
        (root / f"part-{i:03d}.bin").write_bytes(rng.randbytes(size))
    return root


def local_hashes(root: Path) -> dict:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def remote_hashes(stub, directory: str) -> dict:
    out = stub.exec(f"cd {directory} && find . -type f -print0 | sort -z | xargs -0 -r sha256sum").stdout
    return {line.split(None, 1)[1][2:]: line.split(None, 1)[0] for line in out.splitlines() if line.strip()}


def ledger_lines(ledger: Path, host: str) -> list:
    path = ledger / "uploads" / f"{host}.jsonl"
    return [json.loads(ln) for ln in path.read_text().splitlines()] if path.exists() else []


class Runner:
    """Writes the test playbook once and runs it against one inventory with per-run variables."""

    def __init__(self, tmp: Path, inventory: Path, extra: dict):
        self.tmp = tmp
        self.inventory = inventory
        self.extra = extra
        self.ledger = tmp / "ledger"
        self.report_path = tmp / "report.json"
        (tmp / "play.yml").write_text(PLAYBOOK)

    def run(self, timeout: int = 300, **variables):
        evars = {"rgt_project": PROJECT, "rgt_ledger_dir": str(self.ledger), "report_path": str(self.report_path),
                 **self.extra, **variables}
        vars_file = self.tmp / f"vars-{uuid.uuid4().hex[:6]}.json"
        vars_file.write_text(json.dumps(evars))
        if self.report_path.exists():
            self.report_path.unlink()
        env = {**os.environ, "ANSIBLE_CONFIG": str(REPO / "ansible.cfg"),
               "ANSIBLE_COLLECTIONS_PATH": str(REPO / ".collections"), "ANSIBLE_NOCOLOR": "1",
               "ANSIBLE_FORCE_COLOR": "0", "ANSIBLE_LOCAL_TEMP": str(self.tmp / ".ansible-local")}
        t0 = time.monotonic()
        proc = subprocess.run([str(ANSIBLE_PLAYBOOK), "-i", str(self.inventory), str(self.tmp / "play.yml"),
                               "-e", "@" + str(vars_file)], capture_output=True, text=True, env=env, cwd=REPO,
                              timeout=timeout)
        proc.seconds = time.monotonic() - t0
        proc.report = json.loads(self.report_path.read_text()) if self.report_path.exists() else None
        return proc


def stub_runner(stub_fleet, tmp_path, job):
    inv = stub_inventory(stub_fleet, ["rp"], job)
    pins = ("-o StrictHostKeyChecking=yes -o UserKnownHostsFile=%s -o HostKeyAlias={{ rgt_instance_id }}"
            % (stub_fleet["inv"] / "known_hosts"))
    return Runner(tmp_path, inv, {"ansible_ssh_extra_args": pins})


@pytest.fixture
def rp_run(stub_fleet):
    """A unique run id on the rp stub; its run dir is removed afterwards (/workspace is a shared 128 MiB tmpfs)."""
    stub = stub_fleet["stubs"]["rp"]
    run_id = f"up-{uuid.uuid4().hex[:8]}"
    yield stub, run_id, f"/workspace/{PROJECT}/active/{run_id}"
    stub.link_restore()
    stub.exec(f"rm -rf /workspace/{PROJECT}/active/{run_id}", check=False)


def wait_no_rsync(stub, timeout: float = 40) -> None:
    """The box's rsync of a cut transfer exits on its own --timeout and moves its partial file aside."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if stub.exec("pgrep -x rsync", check=False).returncode != 0:
            return
        time.sleep(0.5)
    raise AssertionError("rsync still running on the box")


@pytest.mark.stubs
@pytest.mark.slow
def test_cut_upload_resumes_and_sends_only_what_was_missing(stub_fleet, rp_run, tmp_path):
    stub, run_id, run_dir = rp_run
    tree = make_tree(tmp_path / "code", files=40, size=1_300_000, seed=20260601)
    total = 40 * 1_300_000
    runner = stub_runner(stub_fleet, tmp_path, {"name": run_id, "code_dir": str(tree)})

    cut_at = {}

    def cut_when_some_files_landed():
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            out = stub.exec(f"find {run_dir} -path '*.partial/*' -type f 2>/dev/null | wc -l", check=False).stdout
            if out.strip().isdigit() and int(out) >= 6:
                stub.link_cut()
                cut_at["t"] = time.monotonic()
                return
            time.sleep(0.2)

    cutter = threading.Thread(target=cut_when_some_files_landed, daemon=True)
    cutter.start()
    first = runner.run(upload_resume_retries=0, upload_resume_bwlimit=4000, upload_resume_timeout_s=5)
    cutter.join(timeout=5)
    stub.link_restore()
    out = first.stdout + first.stderr
    assert "t" in cut_at, "the link was never cut"
    assert first.returncode != 0, out
    assert "re-run to resume" in out, out
    wait_no_rsync(stub)
    landed = int(stub.exec(f"find {run_dir} -type f -path '*.partial/*' -printf '%s\\n' | "
                           "awk '{s+=$1} END {print s+0}'").stdout)
    assert 0 < landed < total
    failed = ledger_lines(runner.ledger, "rp")
    assert [ln["status"] for ln in failed] == ["failed"]
    first_sent = failed[0]["bytes_sent"]
    assert first_sent >= landed > 0

    second = runner.run()
    assert second.returncode == 0, second.stdout + second.stderr
    report = second.report
    assert report["status"] == "uploaded" and report["attempts"] == 1
    second_sent = report["bytes_sent"]
    lines = ledger_lines(runner.ledger, "rp")
    assert [ln["status"] for ln in lines] == ["failed", "uploaded"]
    assert lines[1]["bytes_sent"] == second_sent
    print(f"\nupload of {total} bytes: first run sent {first_sent} ({landed} landed), "
          f"second run sent {second_sent}; {first.seconds:.1f}s + {second.seconds:.1f}s")
    assert second_sent < total - 4 * MIB, "the second run must not start from zero"
    assert abs(second_sent - (total - landed)) < 0.03 * total + MIB, (second_sent, total, landed)
    assert 0.98 * total <= first_sent + second_sent <= 1.1 * total + 4 * MIB
    code_dir = f"{run_dir}/code-{report['hash8']}"
    assert report["code_dir"] == code_dir
    assert remote_hashes(stub, code_dir) == local_hashes(tree)
    assert stub.exec(f"ls -A {run_dir}").stdout.split() == [".rgt", f"code-{report['hash8']}"]
    remote_log = [json.loads(ln) for ln in stub.exec(f"cat {run_dir}/.rgt/uploads.jsonl").stdout.splitlines()]
    assert [(r["code_dir"], r["hash8"], r["files"], r["bytes"]) for r in remote_log] == [
        (code_dir, report["hash8"], 40, total)]


@pytest.mark.stubs
def test_changed_tree_gets_a_new_code_dir_and_the_old_one_is_untouched(stub_fleet, rp_run, tmp_path):
    stub, run_id, run_dir = rp_run
    tree = tmp_path / "code"
    (tree / "pkg").mkdir(parents=True)
    (tree / "train.py").write_text("print('v1')\n")
    (tree / "pkg" / "model.py").write_text("W = 1\n")
    (tree / "run.sh").write_bytes(b"#!/bin/bash\r\npython train.py\r\n")
    (tree / "notes.log").write_text("ignored\n")
    (tree / ".gitignore").write_text("*.log\n")
    runner = stub_runner(stub_fleet, tmp_path, {"name": run_id, "code_dir": str(tree)})

    refused = runner.run()  # a CRLF script is refused by default, before anything is sent
    assert refused.returncode != 0 and "run.sh" in refused.stdout and "sed -i" in refused.stdout
    assert stub.exec(f"test -e {run_dir}", check=False).returncode != 0

    runner.extra["upload_resume_crlf"] = "allow"  # the user ships it as it is
    first = runner.run()
    assert first.returncode == 0, first.stdout + first.stderr
    old = first.report
    assert old["status"] == "uploaded" and old["files"] == 4 and old["ignored_count"] == 1
    assert old["crlf_scripts"] == ["run.sh"] and "CRLF line ends in run.sh" in first.stdout
    old_dir = old["code_dir"]
    before = remote_hashes(stub, old_dir)
    assert before == {k: v for k, v in local_hashes(tree).items() if k != "notes.log"}
    stamp = stub.exec(f"find {old_dir} -type f -printf '%p %T@ %i\\n' | sort").stdout

    same = runner.run()
    assert same.returncode == 0, same.stdout
    assert same.report["status"] == "present" and same.report["bytes_sent"] == 0
    assert same.report["code_dir"] == old_dir

    (tree / "train.py").write_text("print('v2')\n")
    second = runner.run()
    assert second.returncode == 0, second.stdout + second.stderr
    new = second.report
    assert new["status"] == "uploaded" and new["hash8"] != old["hash8"]
    assert new["code_dir"] == f"{run_dir}/code-{new['hash8']}"
    assert remote_hashes(stub, new["code_dir"])["train.py"] == hashlib.sha256(b"print('v2')\n").hexdigest()
    assert remote_hashes(stub, old_dir) == before
    assert stub.exec(f"find {old_dir} -type f -printf '%p %T@ %i\\n' | sort").stdout == stamp
    dirs = sorted(stub.exec(f"ls -A {run_dir}").stdout.split())
    assert dirs == sorted([".rgt", f"code-{old['hash8']}", f"code-{new['hash8']}"])
    assert [ln["status"] for ln in ledger_lines(runner.ledger, "rp")] == ["refused", "uploaded", "present", "uploaded"]


@pytest.mark.stubs
def test_tampered_code_dir_is_refused_with_rc_hint_3_and_never_overwritten(stub_fleet, rp_run, tmp_path):
    stub, run_id, run_dir = rp_run
    tree = tmp_path / "code"
    tree.mkdir()
    (tree / "train.py").write_text("print('real')\n")
    (tree / "util.py").write_text("X = 1\n")
    runner = stub_runner(stub_fleet, tmp_path, {"name": run_id, "code_dir": str(tree)})
    first = runner.run()
    assert first.returncode == 0, first.stdout + first.stderr
    code_dir = first.report["code_dir"]
    stub.exec(f"printf 'import evil\\n' >> {code_dir}/train.py && rm {code_dir}/util.py")
    tampered = stub.exec(f"cat {code_dir}/train.py").stdout

    again = runner.run()
    out = again.stdout + again.stderr
    assert again.returncode != 0, out
    assert "NOT DEPLOYED" in out and "train.py (size differs)" in out and "missing: util.py" in out
    assert "rc_hint: 3" in out
    assert stub.exec(f"cat {code_dir}/train.py").stdout == tampered, "an existing code dir is never overwritten"
    assert stub.exec(f"test -e {code_dir}/util.py", check=False).returncode != 0
    last = ledger_lines(runner.ledger, "rp")[-1]
    assert last["status"] == "not_deployed" and last["rc_hint"] == 3
    assert last["mismatches"] == ["train.py"] and last["missing"] == ["util.py"]


def test_local_connection_upload_with_data_dir(tmp_path):
    code = tmp_path / "repo" / "src"
    (code / "sub").mkdir(parents=True)
    (code / "train.py").write_text("print(1)\n")
    (code / "sub" / "conf.yaml").write_text("a: 1\n")
    os.symlink("train.py", str(code / "alias.py"))
    data = make_tree(tmp_path / "repo" / "data", files=3, size=200_000, seed=7)
    durable = tmp_path / "durable"
    inv = tmp_path / "inv.yml"
    inv.write_text(yaml.safe_dump({"all": {"hosts": {"box": {
        "ansible_connection": "local", "ansible_python_interpreter": str(REPO / ".venv" / "bin" / "python"),
        "rgt_profile": "local", "rgt_durable_root": str(durable)}}}}))
    # relative paths resolve against upload_resume_base_dir
    runner = Runner(tmp_path, inv, {"upload_resume_base_dir": str(tmp_path / "repo")})
    job = {"name": "loc-1", "code_dir": "src", "data_dir": "data"}
    proc = runner.run(rgt_job=job)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = proc.report
    run_dir = durable / PROJECT / "active" / "loc-1"
    assert report["code_dir"] == str(run_dir / f"code-{report['hash8']}")
    assert local_hashes(Path(report["code_dir"])) == {k: v for k, v in local_hashes(code).items() if k != "alias.py"}
    assert report["symlinks_skipped"] == ["alias.py"] and "skipping symlink alias.py" in proc.stdout + proc.stderr
    assert local_hashes(run_dir / "data") == local_hashes(data)
    assert report["data"]["verified"] is True and report["data"]["files"] == 3
    assert report["data"]["files_transferred"] == 3
    assert not list(run_dir.glob(".code-*.partial"))
    again = runner.run(rgt_job=job)
    assert again.returncode == 0, again.stdout
    assert again.report["status"] == "present"
    assert again.report["data"]["files_transferred"] == 0
    assert [ln["status"] for ln in ledger_lines(runner.ledger, "box")] == ["uploaded", "present"]

