"""The env_check role, run for real with ansible-playbook against localhost (connection local).

A fake `nvidia-smi` (put on PATH by the profile's proxy hook) and a fake `torch` package (put on
PYTHONPATH by the profile's network env) stand in for the GPU stack, so the torch/CUDA/driver triangle
is exercised end to end without a GPU.
"""

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
COLLECTIONS = REPO / ".collections"
ANSIBLE_PLAYBOOK = REPO / ".venv" / "bin" / "ansible-playbook"

SECRET_NAME = "RGT_TEST_TOKEN"
SECRET_VALUE = "tok-Secret-Value-9f1b 'quoted' $HOME"
PROXY_PASSWORD = "PROXY-PASS-7c2e"
OMIT = object()  # play(name=OMIT) leaves a variable to the role's default

pytestmark = pytest.mark.skipif(not ANSIBLE_PLAYBOOK.exists(), reason="needs .venv with ansible-core")

FAKE_SMI = """#!/bin/sh
# Minimal nvidia-smi: the header line the module parses, and -L.
if [ "$1" = "-L" ]; then
  echo "GPU 0: NVIDIA A100-SXM4-80GB (UUID: GPU-00000000-0000-0000-0000-000000000000)"
  exit 0
fi
echo "| NVIDIA-SMI 550.90.07              Driver Version: 550.90.07      CUDA Version: 12.4     |"
"""

FAKE_TORCH = '''
import json, os, warnings
_s = json.load(open(os.path.join(os.path.dirname(__file__), "state.json")))
__version__ = _s["version"]

class version:
    cuda = _s["cuda"]

class cuda:
    @staticmethod
    def is_available():
        if _s.get("warning"):
            warnings.warn(_s["warning"])
        return _s["available"]

    @staticmethod
    def device_count():
        return _s["device_count"]

    @staticmethod
    def get_device_capability(index=0):
        return tuple(_s["capability"])

    @staticmethod
    def get_arch_list():
        return list(_s["arch_list"])
'''

PLAYBOOK = """
- name: env_check on this machine
  hosts: box
  gather_facts: false
  tasks:
    - name: Run the role, keep the report whatever happens
      block:
        - name: env_check
          ansible.builtin.include_role:
            name: rgt.remote_gpu.env_check
      always:
        - name: Save the report for the test
          ansible.builtin.copy:
            content: "{{ env_check_result.env_report | default({}) | to_nice_json }}"
            dest: "{{ report_path }}"
            mode: "0644"
          changed_when: false
"""


class Box:
    """A temp dir holding the fake GPU stack, the profile, the inventory and the playbook."""

    def __init__(self, root: Path):
        self.root = root
        self.bin = root / "bin"
        self.bin.mkdir()
        smi = self.bin / "nvidia-smi"
        smi.write_text(FAKE_SMI)
        smi.chmod(0o755)
        self.pylib = root / "pylib"
        (self.pylib / "torch").mkdir(parents=True)
        (self.pylib / "torch" / "__init__.py").write_text(FAKE_TORCH)
        self.set_torch(cuda="12.1", available=True)
        self.home = root / "home"
        self.home.mkdir()
        self.shared = root / "shared"
        self.shared.mkdir()
        self.scripts = root / "code"
        self.scripts.mkdir()
        (self.scripts / "ok.sh").write_bytes(b"#!/bin/bash\necho ok\n")
        self.report_path = root / "report.json"
        self.secrets_file = self.home / ".rgt-secrets" / "demo.env"
        (root / "inventory.yml").write_text(yaml.safe_dump({"all": {"hosts": {"box": {
            "ansible_connection": "local", "ansible_python_interpreter": sys.executable}}}}))
        (root / "play.yml").write_text(PLAYBOOK)
        self.profile = {
            "name": "local", "title": "test box", "kind": "ssh", "verified": "none",
            "roots": {"durable": str(root / "durable"), "scratch": str(root / "scratch")},
            "mounts": [{"path": str(self.shared), "role": "shared", "survives": ["stop", "terminate"]},
                       {"path": str(root), "role": "system", "survives": []}],
            "network": {
                "proxy_hook": "export PATH=%s:$PATH https_proxy=http://rgtuser:%s@proxy.invalid:3128"
                              % (self.bin, PROXY_PASSWORD),
                "env": {"PYTHONPATH": str(self.pylib), "HF_HOME": "{scratch_root}/hf"},
                "no_proxy": ["*.tuna.tsinghua.edu.cn", ".hf-mirror.com"],
                "notes": "",
            },
            "env_contract": {"interpreter": None, "kind": "system", "never_create_env": True},
            "secrets": {"dir": str(self.home)},
        }

    def set_torch(self, **state):
        base = {"version": "2.3.1+cu121", "cuda": "12.1", "available": True, "device_count": 1,
                "capability": [8, 0], "arch_list": ["sm_70", "sm_80", "sm_90"], "warning": None}
        base.update(state)
        (self.pylib / "torch" / "state.json").write_text(json.dumps(base))

    def play(self, verbosity: int = 1, env: dict | None = None, check: bool = False, **extra_vars):
        job = {"python": sys.executable, "secrets": [SECRET_NAME]}
        job.update(extra_vars.pop("rgt_job", {}))
        variables = {"env_check_profile": self.profile, "rgt_project": "demo", "rgt_job": job,
                     "report_path": str(self.report_path)}
        variables.update(extra_vars)
        variables = {name: value for name, value in variables.items() if value is not OMIT}
        vars_file = self.root / "vars.json"
        vars_file.write_text(json.dumps(variables))
        if self.report_path.exists():
            self.report_path.unlink()
        full_env = dict(os.environ)
        full_env.update({
            "ANSIBLE_COLLECTIONS_PATH": str(COLLECTIONS),
            "ANSIBLE_PIPELINING": "True",
            "ANSIBLE_NOCOLOR": "1",
            "ANSIBLE_FORCE_COLOR": "0",
            "ANSIBLE_RETRY_FILES_ENABLED": "False",
            "ANSIBLE_LOCAL_TEMP": str(self.root / ".ansible-local"),
            SECRET_NAME: SECRET_VALUE,
        })
        if (REPO / "ansible.cfg").exists():
            full_env["ANSIBLE_CONFIG"] = str(REPO / "ansible.cfg")
        full_env.update(env or {})
        argv = [str(ANSIBLE_PLAYBOOK), "-i", str(self.root / "inventory.yml"), str(self.root / "play.yml"),
                "-e", "@" + str(vars_file)]
        if verbosity:
            argv.append("-" + "v" * verbosity)
        if check:
            argv.append("--check")
        proc = subprocess.run(argv, capture_output=True, text=True, env=full_env, cwd=self.root, timeout=300)
        report = json.loads(self.report_path.read_text()) if self.report_path.exists() else {}
        return proc, report


def recap_changed(stdout: str) -> int:
    line = next(ln for ln in stdout.splitlines() if ln.startswith("box ") and "changed=" in ln)
    return int(line.split("changed=")[1].split()[0])


def assert_no_leak(proc):
    for stream in (proc.stdout, proc.stderr):
        assert SECRET_VALUE not in stream
        assert "Secret-Value-9f1b" not in stream
        assert PROXY_PASSWORD not in stream


@pytest.fixture
def box(tmp_path):
    link = COLLECTIONS / "ansible_collections" / "rgt" / "remote_gpu"
    if not link.exists():
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to("../../..")
    return Box(tmp_path)


def test_secret_file_is_0600_in_a_0700_dir_and_the_value_is_never_printed(box):
    proc, report = box.play(verbosity=3)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert_no_leak(proc)
    st = box.secrets_file.stat()
    assert stat.S_IMODE(st.st_mode) == 0o600
    assert stat.S_IMODE(box.secrets_file.parent.stat().st_mode) == 0o700
    script = 'set -a; . "$1"; printf "%s" "$' + SECRET_NAME + '"'
    sourced = subprocess.run(["bash", "-c", script, "_", str(box.secrets_file)], capture_output=True,
                             text=True, env={"PATH": "/usr/bin:/bin"})
    assert sourced.stdout == SECRET_VALUE
    assert box.secrets_file.read_text().startswith(SECRET_NAME + "=")
    assert [p.name for p in box.secrets_file.parent.iterdir()] == ["demo.env"]  # no temp files left


def test_report_names_interpreter_torch_driver_and_proxy_vars_without_values(box):
    # `python3` in the command is looked up where the job looks: rgt_job.python's directory first
    proc, report = box.play(rgt_job={"command": "python3 train.py && python eval.py"})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert report["verdict"] == "ok", report["findings"]
    assert report["interpreter"]["path"] == sys.executable
    assert report["torch"]["present"] is True and report["torch"]["cuda"] == "12.1"
    assert report["torch"]["available"] is True and report["torch"]["device_count"] == 1
    assert report["driver_cuda"] == "12.4" and report["gpu_count"] == 1
    assert "https_proxy" in report["proxy"]["vars_present"]
    assert {"no_proxy", "NO_PROXY"} <= set(report["proxy"]["vars_present"])
    assert report["proxy"]["no_proxy_applied"] is True
    assert set(report["proxy"]["hook"]["exports"]) == {"PATH", "https_proxy"}
    assert report["network_env"] == {"names": ["HF_HOME", "PYTHONPATH"]}
    assert PROXY_PASSWORD not in json.dumps(report)
    assert "verdict ok" in proc.stdout


def test_second_run_changes_nothing(box):
    first, _ = box.play()
    assert first.returncode == 0, first.stdout + first.stderr
    assert recap_changed(first.stdout) == 1
    second, _ = box.play()
    assert second.returncode == 0, second.stdout + second.stderr
    assert recap_changed(second.stdout) == 0


def test_changed_secret_value_rewrites_the_file(box):
    box.play()
    proc, _ = box.play(env={SECRET_NAME: "another-value"})
    assert proc.returncode == 0
    assert recap_changed(proc.stdout) == 1
    assert "another-value" in box.secrets_file.read_text()


def test_missing_interpreter_fails_naming_the_variable(box):
    proc, _ = box.play(rgt_job={"python": str(box.root / "no-such-env" / "bin" / "python")})
    assert proc.returncode != 0
    out = proc.stdout + proc.stderr
    assert "rgt_job.python" in out and "does not exist or is not executable" in out
    assert not box.secrets_file.exists()


def test_no_interpreter_anywhere_fails_before_touching_the_box(box):
    proc, _ = box.play(rgt_job={"python": None})
    assert proc.returncode != 0
    out = proc.stdout + proc.stderr
    assert "rgt_job.python" in out and "never guesses" in out


def test_missing_secret_env_var_fails_naming_it(box):
    proc, _ = box.play(rgt_job={"secrets": [SECRET_NAME, "RGT_TEST_UNSET_VAR"]},
                       env={"RGT_TEST_UNSET_VAR": ""})
    assert proc.returncode != 0
    assert "RGT_TEST_UNSET_VAR" in proc.stdout and "missing or empty" in proc.stdout
    assert not box.secrets_file.exists()
    assert_no_leak(proc)


def test_crlf_script_is_reported_by_path_and_fails(box):
    """upload_resume's rule (rgt_tree.is_script): a shell suffix or a shebang is a script; CRLF data is fine."""
    bad = box.scripts / "sub" / "train.sh"
    bad.parent.mkdir()
    bad.write_bytes(b"#!/bin/bash\r\necho hi\r\n")
    tool = box.scripts / "launch"
    tool.write_bytes(b"#!/usr/bin/env python3\r\nprint(1)\n")
    (box.scripts / "table.csv").write_bytes(b"a,b\r\n1,2\r\n")
    proc, report = box.play(env_check_scripts_dir=str(box.scripts))
    assert proc.returncode != 0
    assert report["crlf"] == [{"path": str(tool), "lines": [1], "count": 1},
                              {"path": str(bad), "lines": [1, 2], "count": 2}]
    assert str(bad) in proc.stdout and "CRLF" in proc.stdout and "table.csv" not in proc.stdout
    assert "sed -i" in proc.stdout and "dos2unix" in proc.stdout


def test_torch_built_for_newer_cuda_than_driver_fails_with_804(box):
    box.set_torch(version="2.7.0+cu128", cuda="12.8", available=False, device_count=0,
                  warning="CUDA initialization: The NVIDIA driver on your system is too old "
                          "(found version 12040)")
    proc, report = box.play()
    assert proc.returncode != 0
    assert report["verdict"] == "fail"
    critical = [f["id"] for f in report["findings"] if f["severity"] == "critical"]
    assert critical == ["torch_cuda_newer_than_driver"]
    assert "804" in proc.stdout and "driver" in proc.stdout


def test_cpu_torch_on_gpu_box_warns_but_passes_by_default(box):
    box.set_torch(version="2.3.1+cpu", cuda=None, available=False, device_count=0)
    # and a command that runs an interpreter the declared one's directory does not have
    proc, report = box.play(rgt_job={"command": "python2.7 train.py"})
    assert proc.returncode == 0, proc.stdout
    assert report["verdict"] == "warn"
    assert "WARNING:" in proc.stdout
    assert {f["id"] for f in report["findings"]} >= {"torch_cpu_build", "command_interpreter"}
    assert "rgt_job.command runs `python2.7`" in proc.stdout
    strict, _ = box.play(env_check_fail_on="warning")
    assert strict.returncode != 0


def test_secret_under_a_shared_mount_is_refused(box):
    proc, _ = box.play(env_check_secrets_file=str(box.shared / "demo.env"))
    assert proc.returncode != 0
    assert not (box.shared / "demo.env").exists()
    assert_no_leak(proc)


def test_check_mode_writes_nothing(box):
    proc, _ = box.play(verbosity=0, check=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert not box.secrets_file.exists()


def test_shipped_local_profile_works_through_the_lookup(box, tmp_path):
    home = tmp_path / "login-home"
    home.mkdir()
    proc, report = box.play(env={"HOME": str(home)}, rgt_profile="local", env_check_profile=OMIT)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert report["interpreter"]["path"] == sys.executable
    secret = home / ".rgt-secrets" / "demo.env"
    assert stat.S_IMODE(secret.stat().st_mode) == 0o600
    assert_no_leak(proc)

