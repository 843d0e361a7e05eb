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
    # a probe that found a blocking problem is never reused as a pass: train probes again and refuses again
    again = rgt("train", "-i", inv, "-e", json.dumps(job), "--tags", "probe", "--json")
    assert again.rc == 1 and "reused" not in again.doc["hosts"]["box"]["probe"], again.stderr[-3000:]
    assert "probe: reused" not in again.stderr


def test_train_reuses_a_recent_probe_of_the_same_box_and_says_so(rgt, tmp_path):
    inv = write_inventory(tmp_path / "inv", {"box": {**LOCAL, "rgt_durable_root": str(tmp_path / "durable")}})
    job = {"rgt_job": {"name": "cpu-job", "python": "/usr/bin/python3"}}
    record = rgt.ledger / "probe" / "box.json"

    def train(*extra):
        result = rgt("train", "-i", inv, "-e", json.dumps(job), "--tags", "probe", "--json", *extra)
        assert result.rc == 0, result.stderr[-3000:]
        return result

    # a standalone probe always looks, and leaves its record in the ledger
    assert rgt("probe", "-i", inv, "-e", json.dumps(job), "--json").rc == 0
    taken = json.loads(record.read_text())["probed"]["at"]
    reused = train()
    assert reused.doc["hosts"]["box"]["probe"]["reused"] is True
    assert "probe: reused, taken" in reused.stderr
    assert json.loads(record.read_text())["probed"]["at"] == taken  # read, not taken again
    # asked to probe again, it does (and says nothing of a reuse)
    fresh = train("-e", "rgt_probe_again=true")
    assert "reused" not in fresh.doc["hosts"]["box"]["probe"]
    assert json.loads(record.read_text())["probed"]["at"] > taken
    # an older record than the window is probed again
    doc = json.loads(record.read_text())
    doc["probed"]["at"] -= 301
    record.write_text(json.dumps(doc))
    stale = train()
    assert "reused" not in stale.doc["hosts"]["box"]["probe"] and "probe: reused" not in stale.stderr


def test_train_reuses_a_recent_env_check_of_the_same_box_and_says_so(rgt, tmp_path):
    inv = write_inventory(tmp_path / "inv", {"box": {**LOCAL, "rgt_durable_root": str(tmp_path / "durable")}})
    job = {"rgt_job": {"name": "cpu-job", "python": "/usr/bin/python3"}}
    record = rgt.ledger / "env_check" / "box.json"

    def train(*extra, job=job):
        result = rgt("train", "-i", inv, "-e", json.dumps(job), "--tags", "probe,env_check", "--json", *extra)
        assert result.rc == 0, result.stderr[-3000:]
        return result.doc["hosts"]["box"]["env_check"], result.stderr

    # a standalone env_check always looks, and leaves its record in the ledger
    assert rgt("playbooks/env_check.yml", "-i", inv, "-e", json.dumps(job), "--json").rc == 0
    taken = json.loads(record.read_text())["checked"]["at"]
    env, said = train()
    assert env["reused"] is True and env["interpreter"] == "/usr/bin/python3" and "env_check: reused, checked" in said
    assert json.loads(record.read_text())["checked"]["at"] == taken  # read, not checked again
    # asked to check again, it does; another interpreter is another question; an old record is checked again
    env, said = train("-e", "rgt_env_check_again=true")
    assert "reused" not in env and "env_check: reused" not in said
    env, _said = train(job={"rgt_job": {**job["rgt_job"], "python": sys.executable}})
    assert "reused" not in env and env["interpreter"] == sys.executable
    doc = json.loads(record.read_text())
    doc["checked"]["at"] -= 301
    record.write_text(json.dumps(doc))
    env, _said = train(job={"rgt_job": {**job["rgt_job"], "python": sys.executable}})
    assert "reused" not in env
    # a check that stopped the play is never reused as a pass
    doc = json.loads(record.read_text())
    doc["result"]["stop"], doc["result"]["stop_msg"] = True, "env_check verdict is fail: (recorded)"
    record.write_text(json.dumps(doc))
    env, _said = train(job={"rgt_job": {**job["rgt_job"], "python": sys.executable}})
    assert "reused" not in env
