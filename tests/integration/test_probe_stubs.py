"""The probe and env_check phases through `rgt-run`, on podman stub GPU hosts over real, pinned SSH."""

import subprocess

import pytest
from conftest import stub_inventory

pytestmark = pytest.mark.stubs
A100_JOB = {"name": "t", "python": "/usr/bin/python3", "gpu": {"count": 2, "min_memory_mib": 40000, "name": "A100"}}


def finding_ids(doc, host):
    return {f["id"]: f for f in doc["hosts"][host]["probe"]["findings"]}


def test_probe_two_profiles_in_one_run(rgt, stub_fleet):
    inv = stub_inventory(stub_fleet, ["adl", "rp"], A100_JOB)
    result = rgt("probe", "-i", inv, "--json")
    assert result.rc == 0, result.stderr
    doc = result.doc
    assert set(doc["hosts"]) == {"adl", "rp"}
    for host in ("adl", "rp"):
        assert doc["hosts"][host]["probe"]["verdict"] in ("ok", "warn")
        report = (rgt.ledger / "probe" / f"{host}.json").read_text()
        assert "A100" in report
    # first contact is recorded per instance id, danger clocks told once
    assert (rgt.ledger / "hosts" / "autodl-7f3a21.json").exists()
    assert "15 days" in result.stderr
    again = rgt("probe", "-i", inv)
    assert again.rc == 0 and "15 days" not in again.stderr


def test_probe_warns_and_names_inodes_when_data_disk_inodes_run_out(rgt, stub_fleet):
    stub = stub_fleet["stubs"]["adl"]
    stub.fill("/root/autodl-tmp", inode_pct=96, byte_pct=10)
    try:
        inv = stub_inventory(stub_fleet, ["adl"], A100_JOB)
        result = rgt("probe", "-i", inv, "--json")
    finally:
        stub.unfill("/root/autodl-tmp")
    assert result.rc == 0, result.stderr  # a warning, not a refusal
    inode = [f for f in result.doc["hosts"]["adl"]["probe"]["findings"]
             if f["severity"] == "warning" and "inode" in f["message"] and "/root/autodl-tmp" in f["message"]]
    assert inode, result.doc["hosts"]["adl"]["probe"]["findings"]
    assert "inodes" in result.stderr and "/root/autodl-tmp" in result.stderr
    assert not [f for f in result.doc["hosts"]["adl"]["probe"]["findings"]
                if "space left" in f["message"] and "/root/autodl-tmp" in f["message"]], "bytes are fine (10%)"


def test_probe_reports_cgroup_memory_while_free_shows_the_host(rgt, stub_fleet):
    import json

    stub = stub_fleet["stubs"]["adl"]
    inv = stub_inventory(stub_fleet, ["adl"], A100_JOB)
    result = rgt("probe", "-i", inv, "--json")
    assert result.rc == 0, result.stderr
    report = json.loads((rgt.ledger / "probe" / "adl.json").read_text())
    assert report["cgroup"]["memory"]["limit_bytes"] == 512 * 1024 * 1024
    free_total = int(stub.ssh("free -b | awk '/^Mem:/ {print $2}'").stdout)
    assert free_total > 2 * 1024**3, "free shows the host's memory, not the container's"
    assert report["memory"]["mem_total_bytes"] == pytest.approx(free_total, rel=0.01)
    assert "512" in result.stderr and "free" in result.stderr


@pytest.mark.parametrize("fault", ["broken_driver", "xid79"])
def test_fatal_gpu_fault_fails_with_rerent_exit_1(rgt, stub_fleet, fault):
    stub = stub_fleet["stubs"]["flt"]
    if fault == "broken_driver":
        stub.update_gpu_state(broken=True)
    else:
        stub.append_dmesg("[ 8841.123456] NVRM: Xid (PCI:0000:07:00): 79, pid=2811, name=python, "
                          "GPU has fallen off the bus.")
    try:
        inv = stub_inventory(stub_fleet, ["flt"], A100_JOB)
        result = rgt("probe", "-i", inv, "--json")
    finally:
        stub.update_gpu_state(broken=False)
        stub.clear_dmesg()
    assert result.rc == 1, result.stderr
    assert "re-rent" in result.stderr.lower()
    assert result.doc["hosts"]["flt"]["probe"]["verdict"] == "fail"


def test_changed_host_key_fails_closed_and_accepts_nothing(rgt, stub_fleet):
    stub = stub_fleet["stubs"]["flt"]
    inv = stub_inventory(stub_fleet, ["flt"], A100_JOB)
    pinned = (inv / "known_hosts").read_bytes()
    # a re-created instance: new keys and a restart (an open ControlPersist master dies with the old box)
    stub.rotate_host_key(mode="restart")
    try:
        result = rgt("probe", "-i", inv, "--json")
        assert result.rc == 3, result.stderr
        assert "flt" in result.stderr and "pinned" in result.stderr
        assert result.doc["hosts"]["flt"]["host_key_mismatch"] is True
        assert (inv / "known_hosts").read_bytes() == pinned, "nothing may be accepted"
        # pin refuses to replace silently, and replaces only the named instance
        refused = rgt("pin", "-i", inv, "--limit", "flt", "--json")
        assert refused.rc == 3 and (inv / "known_hosts").read_bytes() == pinned
        replaced = rgt("pin", "-i", inv, "--limit", "flt", "--replace", "box-faulty", "--json")
        assert replaced.rc == 0, replaced.stderr
        assert replaced.doc["hosts"][0]["action"] == "replaced"
    finally:
        stub.pin()  # the harness re-pins from the engine so later tests connect
    assert rgt("probe", "-i", inv).rc == 0


def test_env_check_places_secret_without_leaking_it(rgt, stub_fleet):
    secret = "s3cr3t-Value-7781-do-not-print"
    inv = stub_inventory(stub_fleet, ["rp"], {**A100_JOB, "secrets": ["RGT_TEST_TOKEN"]})
    result = rgt("env_check", "-i", inv, "--json", "-vvv", env={"RGT_TEST_TOKEN": secret})
    assert result.rc == 0, result.stderr
    stub = stub_fleet["stubs"]["rp"]
    listing = stub.ssh("stat -c '%a %U %n' /root/.rgt-secrets/*.env; cat /root/.rgt-secrets/*.env").stdout
    assert listing.startswith("600 root /root/.rgt-secrets/")
    assert secret in listing and "RGT_TEST_TOKEN=" in listing
    assert secret not in result.stdout and secret not in result.stderr
    for path in rgt.ledger.rglob("*"):
        if path.is_file():
            assert secret not in path.read_text(errors="replace"), path
    assert "/workspace" not in listing, "never on the network volume"
    # the interpreter the job uses is the one reported (explicit, not discovered)
    assert result.doc["hosts"]["rp"]["env_check"]["interpreter"] == "/usr/bin/python3"


def test_train_playbook_runs_probe_then_env_check(rgt, stub_fleet):
    inv = stub_inventory(stub_fleet, ["adl", "rp"], A100_JOB)
    # (upload and launch are the run spine's: tests/integration/test_run_spine.py)
    result = rgt("playbooks/train.yml", "-i", inv, "--tags", "probe,env_check", "--json")
    assert result.rc == 0, result.stderr
    events = sorted((rgt.ledger / "events").glob("*-train-*.jsonl"))[-1].read_text()
    assert events.index("Probe the box") < events.index("Check interpreter")


def test_unreachable_host_is_exit_4_not_a_job_state(rgt, stub_fleet):
    stub = stub_fleet["stubs"]["rp"]
    inv = stub_inventory(stub_fleet, ["rp"], A100_JOB)
    stub.link_cut()
    try:
        result = rgt("probe", "-i", inv, "--json", timeout=180)
    finally:
        stub.link_restore()
    assert result.rc == 4, result.stderr
    assert result.doc["hosts"]["rp"]["unreachable"] is True
    assert "UNREACHABLE" in result.stderr
    assert subprocess.run(stub.ssh_argv("true"), capture_output=True, timeout=30).returncode == 0
