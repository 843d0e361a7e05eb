"""The probe phase through `rgt-run`, on the local profile (this machine is the box; seconds): every finding
reaches the user with its fix, on the console and in --json (docs/internals.md "Findings")."""

import json
import sys

from clihelp import write_inventory

LOCAL = {"ansible_connection": "local", "ansible_python_interpreter": sys.executable, "rgt_profile": "local",
         "rgt_instance_id": "localhost"}


def test_a_probe_finding_reaches_the_user_with_its_fix(rgt, tmp_path):
    # a job that asks for a GPU on a box without nvidia-smi: the probe refuses the box and says what to do
    inv = write_inventory(tmp_path / "inv", {"box": {**LOCAL, "rgt_durable_root": str(tmp_path / "durable")}})
    job = {"rgt_job": {"name": "gpu-job", "python": "/usr/bin/python3", "gpu": {"count": 1}}}
    result = rgt("playbooks/probe.yml", "-i", inv, "-e", json.dumps(job), "--json")
    assert result.rc == 1, result.stderr[-3000:]
    probe = result.doc["hosts"]["box"]["probe"]
    assert probe["verdict"] == "fail"
    (gpu,) = [f for f in probe["findings"] if f["id"] == "gpu_none"]
    assert gpu["severity"] == "critical" and "Re-rent this box" in gpu["fix"]
    assert set(gpu) == {"id", "severity", "message", "fix", "data"}
    assert f"fix: {gpu['fix']}" in result.stderr  # the console line the user reads
