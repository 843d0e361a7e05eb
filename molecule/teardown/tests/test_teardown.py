"""Verify the teardown scenario: the ledger record says gone, and the fake control plane saw exactly one
terminate (the idempotence converge called nothing). Runs under testinfra with molecule's inventory."""

import json
import os
import time
from pathlib import Path

EPHEMERAL = Path(os.environ["MOLECULE_EPHEMERAL_DIRECTORY"])


def _name(host):
    return host.backend.get_hostname()


def test_ledger_record_says_gone(host):
    hv = host.ansible.get_variables()
    record = json.loads((EPHEMERAL / "ledger" / "teardown" / f"{_name(host)}.json").read_text())
    assert record["instance_id"] == hv["rgt_instance_id"]
    assert record["final_state"] == "gone"
    assert record["verb"] == "terminate" and record["reversible"] is False
    assert {"method": "DELETE", "path": f"/v2/pods/{hv['rgt_instance_id']}", "status": 204} in record["calls"]
    assert record["calls"][-1]["status"] == 404


def test_fake_saw_exactly_one_terminate(host):
    time.sleep(1.5)  # the fake flushes its request log every second
    log = EPHEMERAL / "fake" / "requests.jsonl"
    requests = [json.loads(line) for line in log.read_text().splitlines() if line.strip()]
    pod = host.ansible.get_variables()["rgt_instance_id"]
    assert [r["path"] for r in requests if r["method"] == "DELETE"] == [f"/v2/pods/{pod}"]
    assert all(r["headers"].get("Authorization") == "<redacted>" for r in requests)


def test_the_export_on_the_box_is_untouched(host):
    hv = host.ansible.get_variables()
    assert host.file(f"/workspace/{hv['rgt_project']}/export/{hv['rgt_job']['name']}.manifest.json").is_file
