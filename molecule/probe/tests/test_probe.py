"""Verify the probe scenario: the probe changed nothing on the box, and wrote a report per host to the
controller's ledger (<ephemeral>/ledger/probe/<host>.json). Runs under testinfra with molecule's inventory."""

import json
import os
from pathlib import Path

import pytest

EPHEMERAL = Path(os.environ["MOLECULE_EPHEMERAL_DIRECTORY"])


def _name(host):
    return host.backend.get_hostname()


def _vars(host):
    return host.ansible.get_variables()


@pytest.fixture
def report(host):
    path = EPHEMERAL / "ledger" / "probe" / f"{_name(host)}.json"
    assert path.is_file(), f"no probe report at {path}"
    return json.loads(path.read_text())


def test_testinfra_uses_pinned_ssh(host):
    """testinfra reaches the box over plain ssh built from the inventory, with the pinned host key."""
    hv = _vars(host)
    ssh_host = host.backend.ansible_runner.get_host(_name(host))
    assert ssh_host is not None and ssh_host.backend.NAME == "ssh"
    args = ssh_host.backend.ssh_extra_args
    assert "StrictHostKeyChecking=yes" in args and "StrictHostKeyChecking=no" not in args
    assert f"HostKeyAlias={hv['rgt_instance_id']}" in args
    assert f"UserKnownHostsFile={EPHEMERAL}/known_hosts" in args
    pinned = [ln.split() for ln in (EPHEMERAL / "known_hosts").read_text().splitlines() if ln.strip()]
    box_key = host.file("/etc/ssh/ssh_host_ed25519_key.pub").content_string.split()
    assert [hv["rgt_instance_id"], box_key[0], box_key[1]] in [p[:3] for p in pinned]


def test_sshd_is_running(host):
    assert host.process.filter(comm="sshd")


def test_probe_created_no_layout(host, report):
    """probe_create_layout is false: no run directories under the durable root."""
    layout = report["layout"]
    assert layout["created"] is False
    assert not host.file(layout["durable_root"] + "/rgt").exists
    # the stub's disk tiers start empty and the probe leaves nothing in them
    for mount in ("/root/autodl-tmp", "/root/autodl-fs", "/workspace"):
        if host.file(mount).is_directory:
            assert host.check_output(f"ls -A {mount}") == "", mount
    assert not host.file("/root/autodl-tmp/rgt").exists
    assert not host.file("/workspace/rgt").exists


def test_report_verdict_and_gpu(host, report):
    assert report["verdict"] in ("ok", "warn"), report["findings"]
    assert report["host"] == _name(host)
    assert report["instance_id"] == _vars(host)["rgt_instance_id"]
    assert report["profile"] == _vars(host)["rgt_profile"]
    gpus = report["gpu"]["gpus"]
    assert len(gpus) == 2
    assert all("A100" in g["name"] for g in gpus), [g["name"] for g in gpus]


def test_report_cgroup_memory(host, report):
    limit = report["cgroup"]["memory"]["limit_bytes"]
    if _name(host) == "adl":
        assert limit == 536870912
    else:
        assert limit != 536870912
