"""rgt_host parsers on real df / cgroup / free captures (tests/fixtures/samples, see its README)."""

from pathlib import Path

import pytest

from ansible_collections.rgt.remote_gpu.plugins.module_utils import rgt_host

SAMPLES = Path(__file__).resolve().parents[1] / "fixtures" / "samples"
GIB = 1024**3


def sample(name):
    """Sample text without its '# source:' first line."""
    with open(SAMPLES / name, newline="") as handle:
        return handle.read().split("\n", 1)[1]


# ---------------------------------------------------------------- df


def test_df_h_autodl_overlay_root_and_data_disk():
    rows = rgt_host.parse_df(sample("df-h_autodl_overlay-root_md0-autodl-tmp.txt"))
    assert [(r["filesystem"], r["mountpoint"], r["pct"]) for r in rows] == [
        ("overlay", "/", 6),
        ("/dev/md0", "/root/autodl-tmp", 9),
    ]
    assert rows[0]["kind"] == "bytes"
    assert rows[0]["total"] == 30 * GIB
    assert rows[1]["free"] == 135 * GIB
    assert rows[0]["used"] == int(round(1.8 * GIB))


def test_df_h_runpod_tmpfs_hook_at_100_percent_and_workspace_volume():
    rows = rgt_host.parse_df(sample("df-h_runpod_B300_overlay_workspace-volume.txt"))
    by_mount = {r["mountpoint"]: r for r in rows}
    assert by_mount["/workspace"]["filesystem"] == "/dev/mapper/pod-opf9hiftvk2n1j"
    assert by_mount["/workspace"]["pct"] == 2
    hook = [r for r in rows if r["mountpoint"].startswith("/run/nvidia-ctk-hook")][0]
    assert hook["pct"] == 100 and hook["free"] == 0
    assert by_mount["/dev/shm"]["used"] == 84 * 1024


def test_df_h_moosefs_network_volume_petabytes():
    (row,) = rgt_host.parse_df(sample("df-h_runpod_workspace_moosefs-network-volume.txt"))
    assert row["filesystem"] == "mfs#euro.runpod.net:9421"
    assert row["total"] == int(round(2.3 * 1024**5))
    assert row["pct"] == 77


def test_df_i_docker_overlay_long_bind_source():
    rows = rgt_host.parse_df(sample("df-i_docker-container_overlay.txt"))
    assert rows[0] == {
        "filesystem": "overlay",
        "fstype": None,
        "kind": "inodes",
        "total": 3907584,
        "used": 33104,
        "free": 3874480,
        "pct": 1,
        "mountpoint": "/",
    }
    assert rows[4]["filesystem"] == "/run/host_mark/Users/speykious/docker-conf"
    assert rows[4]["mountpoint"] == "/etc/mysql/conf.d/my.cnf"
    assert rows[4]["total"] == 1021530273


def test_df_wrapped_device_name_joins_next_line():
    # Older non-POSIX df put a too-long device on its own line; same values as the df -i sample.
    text = (
        "Filesystem                                     Inodes   IUsed      IFree IUse% Mounted on\n"
        "/run/host_mark/Users/speykious/docker-conf\n"
        "                                          1021530273 1072993 1020457280    1% "
        "/etc/mysql/conf.d/my.cnf\n"
        "tmpfs                                         1003656       1    1003655    1% /sys/firmware\n"
    )
    rows = rgt_host.parse_df(text)
    assert [(r["filesystem"], r["mountpoint"], r["used"]) for r in rows] == [
        ("/run/host_mark/Users/speykious/docker-conf", "/etc/mysql/conf.d/my.cnf", 1072993),
        ("tmpfs", "/sys/firmware", 1),
    ]


def test_df_posix_bytes_with_type_column_and_dash_inodes():
    bytes_text = (
        "Filesystem     Type    1-blocks       Used  Available Capacity Mounted on\n"
        "/dev/md0       xfs 156766306304 12884901888 144955146240       9% /root/autodl-tmp\n"
        "/dev/sdb1      btrfs 1000000000 960000000   40000000      96% /data\n"
    )
    inode_text = (
        "Filesystem      Inodes  IUsed   IFree IUse% Mounted on\n"
        "/dev/md0       76546048 73000000 3546048 96% /root/autodl-tmp\n"
        "/dev/sdb1             0      0       0     - /data\n"
    )
    mounts = rgt_host.combine_df(
        rgt_host.parse_df(bytes_text), rgt_host.parse_df(inode_text), ["/root/autodl-tmp/proj", "/data"]
    )
    assert mounts[0]["path"] == "/root/autodl-tmp/proj"
    assert mounts[0]["fstype"] == "xfs"
    assert mounts[0]["bytes_total"] == 156766306304
    assert (mounts[0]["inodes_pct"], mounts[0]["inodes_free"]) == (96, 3546048)
    assert mounts[1]["bytes_pct"] == 96
    assert mounts[1]["inodes_total"] is None and mounts[1]["inodes_pct"] is None


def test_combine_df_matches_rows_by_mountpoint_without_paths():
    byte_rows = rgt_host.parse_df(sample("df-h_autodl_overlay-root_md0-autodl-tmp.txt"))
    inode_rows = [
        {
            "mountpoint": "/root/autodl-tmp",
            "total": 200000,
            "used": 192000,
            "free": 8000,
            "pct": 96,
            "fstype": None,
        }
    ]
    mounts = rgt_host.combine_df(byte_rows, inode_rows)
    assert mounts[0]["inodes_pct"] is None
    assert mounts[1]["path"] == "/root/autodl-tmp"
    assert mounts[1]["inodes_pct"] == 96


def test_df_without_header_is_empty():
    assert rgt_host.parse_df("df: /nope: No such file or directory\n") == []


# ---------------------------------------------------------------- cgroup memory


@pytest.mark.parametrize(
    "name",
    [
        "cgroup-v2_memory.max_unlimited.txt",
        "cgroup-v1_memory.limit_in_bytes_unlimited_pagecountermax.txt",
        "cgroup-v1_memory.limit_in_bytes_unlimited_u64max.txt",
    ],
)
def test_memory_limit_unlimited_spellings_are_none(name):
    assert rgt_host.parse_memory_limit(sample(name)) is None


def test_memory_limit_v2_100mib_and_v1_4gib():
    assert rgt_host.parse_memory_limit(sample("cgroup-v2_memory.max_100MiB.txt")) == 104857600
    assert rgt_host.parse_memory_limit(sample("cgroup-v1_memory.limit_in_bytes_4GiB.txt")) == 4 * GIB


def test_memory_summary_v2_oom_kill_from_events():
    summary = rgt_host.memory_summary(
        2,
        sample("cgroup-v2_memory.max_100MiB.txt"),
        sample("cgroup-v2_memory.current.txt"),
        sample("cgroup-v2_memory.events_ecs-task-slice_oom.txt"),
    )
    assert summary["limit_bytes"] == 104857600
    assert summary["usage_bytes"] == 528384
    assert summary["oom_kill"] == 93
    assert summary["events"]["max"] == 9295
    assert summary["unlimited"] is False


def test_memory_summary_container_scope_counts_oom_kill_while_max_is_zero():
    summary = rgt_host.memory_summary(
        2,
        sample("cgroup-v2_memory.max_unlimited.txt"),
        "0\n",
        sample("cgroup-v2_memory.events_ecs-container-scope.txt"),
    )
    assert summary["unlimited"] is True and summary["limit_bytes"] is None
    assert summary["oom_kill"] == 47
    assert summary["events"]["max"] == 0


def test_memory_summary_v1_oom_control():
    summary = rgt_host.memory_summary(
        1,
        sample("cgroup-v1_memory.limit_in_bytes_4GiB.txt"),
        "1048576\n",
        oom_control_text="oom_kill_disable 0\nunder_oom 0\noom_kill 3\n",
    )
    assert (summary["limit_bytes"], summary["usage_bytes"], summary["oom_kill"]) == (4 * GIB, 1048576, 3)


def test_swap_events_parse_as_flat_keys():
    assert rgt_host.parse_flat_keyed(sample("cgroup-v2_memory.swap.events_ecs-task-slice.txt")) == {
        "high": 0,
        "max": 0,
        "fail": 0,
    }


def test_cpu_stat_throttling_counters():
    stat = rgt_host.parse_flat_keyed(sample("cgroup-v2_cpu.stat.txt"))
    assert stat["usage_usec"] == 47463760172
    assert stat["nr_throttled"] == 0


# ---------------------------------------------------------------- cgroup cpu


def test_cpu_max_unlimited_has_no_quota():
    assert rgt_host.parse_cpu_max(sample("cgroup-v2_cpu.max_unlimited.txt")) == (None, 100000)
    assert rgt_host.effective_cpus(None, 100000, 64) is None


def test_cpu_max_quota_is_two_and_a_half_cpus():
    quota, period = rgt_host.parse_cpu_max(sample("cgroup-v2_cpu.max_quota_2.5cpu.txt"))
    assert (quota, period) == (250000, 100000)
    assert rgt_host.effective_cpus(quota, period, 128) == 2.5


def test_cfs_quota_six_cpus_and_unlimited():
    assert rgt_host.parse_cfs(sample("cgroup-v1_cpu.cfs_quota_us_6cpu.txt"), "100000\n") == (600000, 100000)
    assert rgt_host.effective_cpus(600000, 100000, 96) == 6.0
    assert rgt_host.parse_cfs(sample("cgroup-v1_cpu.cfs_quota_us_unlimited.txt"), "100000\n") == (
        None,
        100000,
    )


def test_effective_cpus_capped_by_nproc():
    assert rgt_host.effective_cpus(800000, 100000, 4) == 4.0


def test_proc_self_cgroup_v2_and_v1():
    assert (
        rgt_host.parse_proc_cgroup("0::/system.slice/docker-abc.scope\n")["v2"]
        == "/system.slice/docker-abc.scope"
    )
    v1 = rgt_host.parse_proc_cgroup("4:memory:/docker/abc\n3:cpu,cpuacct:/docker/abc\n")
    assert v1["v2"] is None and v1["v1"]["cpuacct"] == "/docker/abc"


# ---------------------------------------------------------------- /proc


def test_meminfo_total_in_bytes():
    info = rgt_host.parse_meminfo(
        "MemTotal:       1056426164 kB\nMemFree:        108000000 kB\nHugePages_Total:       0\n"
    )
    assert info["MemTotal"] == 1056426164 * 1024
    assert info["HugePages_Total"] == 0


def test_uptime_seconds():
    assert rgt_host.parse_uptime("6781741.54 4520000.10\n") == pytest.approx(6781741.54)
    assert rgt_host.parse_uptime("") is None
