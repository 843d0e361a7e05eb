"""The stub-host harness on real parts: podman containers reached over real ssh with pinned keys.

Needs podman (Debian 12: scripts/setup-stubs.sh installs and builds everything; the image is
built on first use if missing). Skipped only when podman is not installed.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import time

import pytest

from tests.harness import stubhost as sh

pytestmark = [
    pytest.mark.stubs,
    pytest.mark.skipif(shutil.which("podman") is None, reason="podman is not installed (scripts/setup-stubs.sh)"),
]

GIB = 1024**3
# persist: host tmpfs bind mount, survives stop/start; otherwise a podman tmpfs volume (wiped on stop)
AUTODL_MOUNTS = [
    {"path": "/root/autodl-tmp", "size_mib": 256, "persist": True},
    {"path": "/root/autodl-fs", "size_mib": 64, "inodes": 2000},
]
RUNPOD_MOUNTS = [{"path": "/workspace", "size_mib": 256}]


@pytest.fixture(scope="session")
def stubs(tmp_path_factory, request):
    sh.ensure_image()  # runs scripts/setup-stubs.sh: ~0.2 s when nothing changed
    tag = sh.session_tag("rgtt")
    keydir = tmp_path_factory.mktemp("stubkeys")
    request.addfinalizer(lambda: sh.down(tag=tag))
    t0 = time.monotonic()
    autodl = sh.start_stub(
        "autodl",
        keydir=keydir,
        tag=tag,
        instance_id="autodl-c1a2b3",
        hostname="autodl-container",
        memory="512m",
        mounts=AUTODL_MOUNTS,
    )
    runpod = sh.start_stub(
        "runpod", keydir=keydir, tag=tag, instance_id="pod-x7y8z9", hostname="runpod-pod", mounts=RUNPOD_MOUNTS
    )
    print(f"2 stubs up and answering ssh in {time.monotonic() - t0:.2f}s")
    return {"autodl": autodl, "runpod": runpod, "tag": tag}


def ok(stub: sh.StubHost, cmd: str) -> str:
    cp = stub.ssh(cmd)
    assert cp.returncode == 0, (cmd, cp.returncode, cp.stdout, cp.stderr)
    return cp.stdout


def test_inventory_and_pinned_known_hosts(stubs):
    s = stubs["autodl"]
    inv = s.inventory_vars()
    assert inv["ansible_host"] == "127.0.0.1" and inv["ansible_user"] == "root"
    assert isinstance(inv["ansible_port"], int) and inv["ansible_port"] > 0
    assert inv["rgt_instance_id"] == "autodl-c1a2b3"
    lines = open(s.known_hosts).read().splitlines()
    mine = [ln for ln in lines if ln.split()[0] == "autodl-c1a2b3"]
    assert len(mine) == 1 and mine[0].split()[1] == "ssh-ed25519"
    # the pin is the key sshd really serves
    assert mine[0].split()[2] == s.host_pubkey().split()[1]
    assert ok(s, "hostname").strip() == "autodl-container"
    tools = ok(s, "for t in python3 tmux rsync fuser pkill ip sshd; do command -v $t; done").split()
    assert len(tools) == 7, tools
    # found again from engine labels (what the CLI / molecule destroy use)
    again = sh.load("autodl", stubs["tag"])
    assert (again.port, again.instance_id, again.key_file) == (s.port, s.instance_id, s.key_file)


def test_fake_gpus(stubs):
    s = stubs["autodl"]
    out = ok(s, "nvidia-smi -L").splitlines()
    assert len(out) == 2
    assert out[0].startswith("GPU 0: NVIDIA A100-SXM4-80GB (UUID: GPU-")
    assert (
        ok(s, "nvidia-smi --query-gpu=name,memory.total --format=csv,noheader,nounits")
        == "NVIDIA A100-SXM4-80GB, 81920\nNVIDIA A100-SXM4-80GB, 81920\n"
    )
    assert (
        ok(s, "nvidia-smi --query-gpu=name,memory.total --format=csv -i 1")
        == "name, memory.total [MiB]\nNVIDIA A100-SXM4-80GB, 81920 MiB\n"
    )
    table = ok(s, "nvidia-smi")
    assert "Driver Version: 550.90.07      CUDA Version: 12.4" in table
    assert "No running processes found" in table
    assert all(len(line) == 91 for line in table.splitlines()[1:] if line.startswith(("|", "+")))
    cp = s.ssh("nvidia-smi --query-gpu=index,bogus --format=csv")
    assert cp.returncode == 2 and cp.stdout.startswith('Field "bogus" is not a valid field to query.')


def test_gpu_state_changes(stubs):
    s = stubs["runpod"]
    orig = s.get_gpu_state()
    try:
        s.update_gpu_state(
            gpu={"throttle_reasons": ["sw_thermal_slowdown", "hw_slowdown"], "clocks_sm": 900},
            index=1,
            processes=[{"gpu_index": 1, "pid": 4242, "process_name": "python", "used_memory_mib": 2048}],
        )
        assert (
            ok(s, "nvidia-smi --query-gpu=index,clocks.sm,clocks_event_reasons.active --format=csv,noheader,nounits")
            == "0, 1410, 0x0000000000000000\n1, 900, 0x0000000000000028\n"
        )
        perf = ok(s, "nvidia-smi -q -d PERFORMANCE -i 1")
        assert "        SW Thermal Slowdown               : Active" in perf
        assert "        HW Slowdown                       : Active" in perf
        assert "            HW Thermal Slowdown           : Not Active" in perf
        assert (
            ok(s, "nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv,noheader")
            == "4242, python, 2048 MiB\n"
        )

        s.update_gpu_state(broken=True)
        cp = s.ssh("nvidia-smi")
        assert cp.returncode == 9
        assert cp.stdout.startswith("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.")

        s.update_gpu_state(broken=False, gpus=[])
        cp = s.ssh("nvidia-smi -L")
        assert (cp.returncode, cp.stdout) == (6, "No devices were found\n")
    finally:
        s.set_gpu_state(orig)
    assert len(ok(s, "nvidia-smi -L").splitlines()) == 2


def test_fake_dmesg(stubs):
    s = stubs["runpod"]
    xid = "[12345.678901] NVRM: Xid (PCI:0000:07:00): 79, pid=1234, name=python, GPU has fallen off the bus."
    s.append_dmesg(xid)
    assert ok(s, "dmesg | tail -n 1").strip() == xid
    s.update_gpu_state(dmesg_readable=False)
    try:
        cp = s.ssh("dmesg")
        assert cp.returncode == 1
        assert cp.stderr.strip() == "dmesg: read kernel buffer failed: Operation not permitted"
    finally:
        s.update_gpu_state(dmesg_readable=True)


def test_disk_tiers_and_fill(stubs):
    a, r = stubs["autodl"], stubs["runpod"]
    dfi = ok(a, "df -i /root/autodl-fs | tail -n 1").split()
    assert dfi[0] == "tmpfs" and dfi[1] == "2000"
    dfb = ok(a, "df -B1M --output=size /root/autodl-tmp /root/autodl-fs | tail -n 2").split()
    assert dfb == ["256", "64"]
    assert ok(r, "df -B1M --output=size,target /workspace | tail -n 1").split() == ["256", "/workspace"]
    assert r.exec("test -d /root/autodl-tmp", check=False).returncode != 0
    t0 = time.monotonic()
    st = a.fill("/root/autodl-fs", inode_pct=90, byte_pct=50)
    took = time.monotonic() - t0
    try:
        assert st["inodes_pct"] >= 90 and st["bytes_pct"] >= 50, st
        assert took < 10
        # the inode cap bites: creating more files than remain fails
        cp = a.ssh("cd /root/autodl-fs && for i in $(seq 1 300); do touch extra$i || exit 7; done")
        assert cp.returncode == 7 and "No space left on device" in cp.stderr
    finally:
        a.exec("rm -f /root/autodl-fs/extra*")
        a.unfill("/root/autodl-fs")
    assert a.df("/root/autodl-fs")["inodes_used"] <= 2


def test_memory_limit(stubs):
    s = stubs["autodl"]
    limit = ok(s, "cat /sys/fs/cgroup/memory.max 2>/dev/null || cat /sys/fs/cgroup/memory/memory.limit_in_bytes")
    assert limit.strip() == "536870912"
    memtotal_kib = int(ok(s, "awk '/^MemTotal:/ {print $2}' /proc/meminfo"))
    assert memtotal_kib * 1024 > 536870912  # the container sees the host's RAM, as on AutoDL


def test_host_key_rotation(stubs):
    s = stubs["runpod"]
    old = s.host_pubkey()
    new = s.rotate_host_key()
    assert new.split()[1] != old.split()[1]
    cp = s.ssh("true")
    assert cp.returncode == 255
    assert "REMOTE HOST IDENTIFICATION HAS CHANGED" in cp.stderr or "Host key verification failed" in cp.stderr, (
        cp.stderr
    )
    s.pin()  # accept the new instance
    assert s.ssh("true").returncode == 0


def test_link_cut_and_restore(stubs):
    s = stubs["runpod"]
    s.link_cut()
    try:
        t0 = time.monotonic()
        cp = s.ssh("true", connect_timeout=3, timeout=20)
        took = time.monotonic() - t0
        assert cp.returncode == 255 and "timed out" in cp.stderr, cp.stderr
        assert 2.5 < took < 10
    finally:
        s.link_restore()
    assert s.ssh("true", connect_timeout=3).returncode == 0


def test_rate_limit(stubs):
    s = stubs["runpod"]
    s.rate_limit(rate="2mbit", burst="32kbit")
    try:
        t0 = time.monotonic()
        out = subprocess.run(s.ssh_argv("head -c 400000 /dev/zero"), capture_output=True, timeout=30).stdout
        took = time.monotonic() - t0
        assert len(out) == 400000
        assert took > 1.0, took  # 3.2 Mbit at 2 Mbit/s
    finally:
        s.rate_unlimit()


def test_pause_makes_host_hang(stubs):
    s = stubs["runpod"]
    s.pause()
    try:
        # TCP still connects (the netns kernel answers), sshd is frozen: ssh gives up on the banner
        cp = s.ssh("true", connect_timeout=2, timeout=15)
        assert cp.returncode == 255 and "timed out" in cp.stderr, cp.stderr
    finally:
        s.unpause()
    assert s.ssh("true").returncode == 0


def test_preempt_gives_grace_and_reboot_kills_tmux(stubs):
    s = stubs["autodl"]
    # preempt() SIGTERMs every process at once, the tmux server included, which then SIGHUPs its
    # panes: a job under tmux must handle HUP as well as TERM (as on a real VM shutdown).
    job = (
        "trap 'echo got-term > /root/autodl-tmp/term; exit 0' TERM HUP; "
        "echo started > /root/autodl-tmp/term; while :; do sleep 0.2; done"
    )
    ok(s, f"tmux new-session -d -s job {json.dumps(job)}")
    time.sleep(0.5)
    assert ok(s, "cat /root/autodl-tmp/term").strip() == "started"
    ok(s, "touch /root/autodl-fs/marker")
    res = s.preempt(grace_s=5, restart=True)
    assert res["stopped_after_s"] < 5, res
    assert ok(s, "cat /root/autodl-tmp/term").strip() == "got-term"  # persist tier survives a stop
    assert s.ssh("test -e /root/autodl-fs/marker").returncode == 1  # podman tmpfs volume does not
    assert s.ssh("tmux has-session -t job").returncode != 0  # the session did not
    ok(s, "tmux new-session -d -s job2 'sleep 600'")
    s.reboot()
    assert s.ssh("tmux has-session -t job2").returncode != 0
    assert s.ssh("true").returncode == 0
