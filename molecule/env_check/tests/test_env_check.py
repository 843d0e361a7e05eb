"""Verify the env_check scenario: the job's secret sits in a box-local 0600 file owned by root under
/root/.rgt-secrets/, never on the shared or network volumes. Runs under testinfra with molecule's inventory."""

import os
from pathlib import Path

EPHEMERAL = Path(os.environ["MOLECULE_EPHEMERAL_DIRECTORY"])
SECRETS_FILE = "/root/.rgt-secrets/rgt.env"


def _vars(host):
    return host.ansible.get_variables()


def test_testinfra_uses_pinned_ssh(host):
    hv = _vars(host)
    ssh_host = host.backend.ansible_runner.get_host(host.backend.get_hostname())
    assert ssh_host is not None and ssh_host.backend.NAME == "ssh"
    args = ssh_host.backend.ssh_extra_args
    assert "StrictHostKeyChecking=yes" in args and "StrictHostKeyChecking=no" not in args
    assert f"HostKeyAlias={hv['rgt_instance_id']}" in args
    assert f"UserKnownHostsFile={EPHEMERAL}/known_hosts" in args


def test_secrets_dir_is_private(host):
    d = host.file("/root/.rgt-secrets")
    assert d.is_directory
    assert d.user == "root" and d.mode == 0o700


def test_secrets_file_is_0600_root(host):
    f = host.file(SECRETS_FILE)
    assert f.is_file
    assert f.user == "root" and f.group == "root"
    assert f.mode == 0o600


def test_secrets_file_holds_the_token(host):
    content = host.file(SECRETS_FILE).content_string
    assert "RGT_MOLECULE_TOKEN=" in content
    assert "molecule-dummy-token" in content  # the scenario's dummy value, shell-quoted


def test_no_secret_on_shared_or_network_volumes(host):
    for root in ("/workspace", "/root/autodl-fs", "/root/autodl-tmp"):
        if host.file(root).exists:
            out = host.run(f"grep -rl RGT_MOLECULE_TOKEN {root}")
            assert out.stdout.strip() == "", f"secret found under {root}: {out.stdout}"
    assert not SECRETS_FILE.startswith(("/workspace/", "/root/autodl-fs/"))
