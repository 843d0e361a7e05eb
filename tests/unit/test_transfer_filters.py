"""rsync must reach the box exactly as Ansible does: same port, key, options and host key pins."""

from ansible_collections.rgt.remote_gpu.plugins.filter.transfer import rsync_rsh, rsync_target


def test_rsync_rsh_carries_port_key_and_the_runner_pins():
    pins = "-o StrictHostKeyChecking=yes -o UserKnownHostsFile=/inv/known_hosts -o HostKeyAlias=pod-1"
    rsh = rsync_rsh(2222, "/keys/id ed", "", pins)
    assert rsh.startswith("ssh -p 2222 -i '/keys/id ed' -o BatchMode=yes")
    assert rsh.endswith(pins)


def test_rsync_rsh_without_key_or_args():
    assert rsync_rsh(None) == ("ssh -p 22 -o BatchMode=yes -o ConnectTimeout=15 -o ServerAliveInterval=10 "
                               "-o ServerAliveCountMax=3")


def test_rsync_target_user_host_and_ipv6():
    assert rsync_target("203.0.113.5", "root") == "root@203.0.113.5:"
    assert rsync_target("box") == "box:"
    assert rsync_target("2001:db8::1", "ubuntu") == "ubuntu@[2001:db8::1]:"
