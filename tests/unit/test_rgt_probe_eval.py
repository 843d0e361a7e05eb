"""rgt_probe_eval: findings and verdicts for probe reports built from real captures."""

import copy
import re
from pathlib import Path

import pytest

from ansible_collections.rgt.remote_gpu.plugins.module_utils import rgt_gpu, rgt_host
from ansible_collections.rgt.remote_gpu.plugins.module_utils import rgt_probe_eval as ev

SAMPLES = Path(__file__).resolve().parents[1] / "fixtures" / "samples"
GIB = 1024**3

AUTODL_PROFILE = {
    "name": "autodl",
    "roots": {"durable": "/root/autodl-tmp", "scratch": "/root/autodl-tmp"},
    "mounts": [
        {"path": "/", "role": "system", "survives": ["stop"]},
        {"path": "/root/autodl-tmp", "role": "data", "survives": ["stop"]},
        {"path": "/root/autodl-fs", "role": "shared", "survives": ["stop", "terminate"]},
    ],
    "meter_stop": {"verb": "stop", "label": "关机", "reversible": True},
}


def sample(name):
    with open(SAMPLES / name, newline="") as handle:
        return handle.read().split("\n", 1)[1]


def gpus_from_table(name):
    """The report's gpu list shape, filled from a real default table."""
    table = rgt_gpu.parse_smi_table(sample(name))
    return table, [
        {
            "index": g["index"],
            "name": g["name"],
            "memory_total_mib": g["memory_total_mib"],
            "memory_used_mib": g["memory_used_mib"],
            "temperature_c": g["temperature_c"],
            "active_reasons": [],
        }
        for g in table["gpus"]
    ]


def healthy_report():
    """AutoDL RTX 4090 box: real table, real df -h rows, real cgroup files, everything fine."""
    table, gpus = gpus_from_table("nvidia-smi_580.76.05_autodl_RTX4090_noprocs.txt")
    mounts = rgt_host.combine_df(rgt_host.parse_df(sample("df-h_autodl_overlay-root_md0-autodl-tmp.txt")), [])
    memory = rgt_host.memory_summary(
        2,
        sample("cgroup-v2_memory.max_unlimited.txt"),
        sample("cgroup-v2_memory.current.txt"),
        "oom_kill 0\n",
    )
    return {
        "schema_version": 1,
        "host": {"hostname": "autodl-container", "home": "/root", "uptime_s": 100.0},
        "gpu": {
            "failure": None,
            "driver_version": table["driver_version"],
            "cuda_version": table["cuda_version"],
            "gpus": gpus,
            "compute_apps": [],
        },
        "kernel_log": dict(rgt_gpu.scan_kernel_log(""), readable=True, source="dmesg"),
        "storage": {"mounts": mounts},
        "cgroup": {"version": 2, "memory": memory, "cpu": {"quota_us": None, "period_us": 100000}},
        "cpu": {"nproc": 16, "cpu_count": 16, "effective_cpus": None},
        "memory": {"mem_total_bytes": 64 * GIB},
        "tools": {
            "tmux": "/usr/bin/tmux",
            "rsync": "/usr/bin/rsync",
            "python3": "/usr/bin/python3",
            "python": None,
        },
        "layout": {
            "durable_root": "/root/autodl-tmp",
            "durable_root_exists": True,
            "durable_root_writable": True,
            "same_filesystem": True,
            "export_dir": "/root/autodl-tmp/p/export",
            "partial_dir": "/root/autodl-tmp/p/export/.partial",
        },
        "interpreter": {"path": None, "exists": None},
    }


def ids(result):
    return [f["id"] for f in result["findings"]]


def test_healthy_box_is_ok_with_exit_hint_zero():
    result = ev.evaluate(healthy_report(), {"count": 1, "min_memory_mib": 20000}, AUTODL_PROFILE)
    assert result["findings"] == []
    assert (result["verdict"], result["exit_hint"]) == ("ok", 0)


def test_broken_driver_fails_and_says_re_rent():
    report = healthy_report()
    report["gpu"] = {
        "failure": rgt_gpu.classify_smi_failure(
            9, "", "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver."
        ),
        "gpus": [],
    }
    result = ev.evaluate(report, {"count": 1}, AUTODL_PROFILE)
    assert result["verdict"] == "fail" and result["exit_hint"] == 1
    (first,) = [f for f in result["findings"] if f["id"] == "gpu_driver_broken"]
    assert first["severity"] == "critical"
    assert "Re-rent this box" in first["fix"]


def test_zero_gpus_when_gpus_requested_fails():
    report = healthy_report()
    report["gpu"] = {"failure": rgt_gpu.classify_smi_failure(6, "No devices were found", ""), "gpus": []}
    result = ev.evaluate(report, {"count": 1}, AUTODL_PROFILE)
    assert "gpu_none" in ids(result) and result["verdict"] == "fail"


def test_zero_gpus_without_a_request_is_not_a_failure():
    report = healthy_report()
    report["gpu"] = {
        "failure": {"kind": "not_installed", "message": "nvidia-smi is not installed"},
        "gpus": [],
    }
    result = ev.evaluate(report, {}, AUTODL_PROFILE)
    assert result["verdict"] == "ok"


def test_fewer_gpus_than_requested_fails():
    result = ev.evaluate(healthy_report(), {"count": 8}, AUTODL_PROFILE)
    (f,) = [f for f in result["findings"] if f["id"] == "gpu_count"]
    assert f["data"] == {"wanted": 8, "found": 1}
    assert result["verdict"] == "fail"


def test_vram_below_request_fails_with_sizes():
    _, gpus = gpus_from_table("nvidia-smi_450.80.02_8xA100-SXM4-40GB_MIG-mixed.txt")
    report = healthy_report()
    report["gpu"]["gpus"] = gpus
    result = ev.evaluate(report, {"count": 8, "min_memory_mib": 80000}, AUTODL_PROFILE)
    (f,) = [f for f in result["findings"] if f["id"] == "gpu_memory"]
    assert f["severity"] == "critical"
    assert f["data"]["sizes_mib"] == [40537]
    assert "40537" in f["message"]


def test_gb10_unknown_vram_is_a_warning_not_a_failure():
    _, gpus = gpus_from_table("nvidia-smi_580.126.09_GB10_memory-NotSupported.txt")
    report = healthy_report()
    report["gpu"]["gpus"] = gpus
    result = ev.evaluate(report, {"count": 1, "min_memory_mib": 40000}, AUTODL_PROFILE)
    assert "gpu_memory_unknown" in ids(result)
    assert result["verdict"] == "warn"


def test_gpu_name_mismatch_is_a_warning():
    result = ev.evaluate(healthy_report(), {"count": 1, "name": "H100"}, AUTODL_PROFILE)
    (f,) = [f for f in result["findings"] if f["id"] == "gpu_name"]
    assert f["severity"] == "warning"
    assert "NVIDIA GeForce RTX 4090" in f["message"]


@pytest.mark.parametrize(
    "log,code",
    [
        ("dmesg_xid79_sxid20034_raw.log", 79),
        ("syslog_xid48_xid64_rminitadapter.log", 48),
        ("dmesg_xid119_gsp-timeout_ctime.log", 119),
    ],
)
def test_re_rent_xids_fail_the_probe(log, code):
    report = healthy_report()
    report["kernel_log"] = dict(rgt_gpu.scan_kernel_log(sample(log)), readable=True)
    result = ev.evaluate(report, {"count": 1}, AUTODL_PROFILE)
    (f,) = [f for f in result["findings"] if f["id"] == "gpu_xid_%d" % code]
    assert f["severity"] == "critical" and f["data"]["re_rent"] is True
    assert "re-rent" in f["fix"].lower()
    assert result["verdict"] == "fail"


def test_fallen_off_bus_without_xid_fails():
    report = healthy_report()
    report["kernel_log"] = dict(
        rgt_gpu.scan_kernel_log(sample("dmesg_fallen-off-bus_noXid_570.log")), readable=True
    )
    result = ev.evaluate(report, {"count": 1}, AUTODL_PROFILE)
    assert "gpu_fallen_off_bus" in ids(result)
    assert "0000:b3:00.0" in result["findings"][0]["message"]
    assert result["verdict"] == "fail"


def test_application_xids_are_info_only():
    report = healthy_report()
    report["kernel_log"] = dict(
        rgt_gpu.scan_kernel_log(sample("dmesg_xid13_xid43_decode-iso.log")), readable=True
    )
    result = ev.evaluate(report, {"count": 1}, AUTODL_PROFILE)
    assert {f["severity"] for f in result["findings"]} == {"info"}
    assert result["verdict"] == "ok"


def test_unreadable_kernel_log_warns_verdict_non_authoritative():
    report = healthy_report()
    report["kernel_log"] = {
        "readable": False,
        "error": "dmesg: read kernel buffer failed: Operation not permitted",
    }
    result = ev.evaluate(report, {"count": 1}, AUTODL_PROFILE)
    (f,) = [f for f in result["findings"] if f["id"] == "kernel_log_unreadable"]
    assert "non-authoritative" in f["message"]
    assert result["verdict"] == "warn"


def test_thermal_throttle_is_a_warning():
    report = healthy_report()
    text = re.sub(
        r"(SW Thermal Slowdown\s+: )Not Active",
        r"\1Active",
        sample("nvidia-smi-q-i0_525.105.17_H800_clocks-throttle-reasons.txt"),
    )
    report["gpu"]["gpus"][0]["active_reasons"] = rgt_gpu.parse_query_q(text)["gpus"][0]["active_reasons"]
    result = ev.evaluate(report, {"count": 1}, AUTODL_PROFILE)
    (f,) = [f for f in result["findings"] if f["id"] == "gpu_throttle"]
    assert f["severity"] == "warning" and f["data"]["reasons"] == ["sw_thermal_slowdown"]


def test_idle_reason_alone_is_not_throttling():
    report = healthy_report()
    report["gpu"]["gpus"][0]["active_reasons"] = ["gpu_idle"]
    assert ev.evaluate(report, {"count": 1}, AUTODL_PROFILE)["verdict"] == "ok"


def test_inodes_at_96_percent_warn_with_inodes_first_message():
    report = healthy_report()
    report["storage"]["mounts"] = [
        {"path": "/root/autodl-fs", "mountpoint": "/root/autodl-fs", "bytes_pct": 34, "inodes_pct": 96}
    ]
    result = ev.evaluate(report, {"count": 1}, AUTODL_PROFILE)
    (f,) = [f for f in result["findings"] if f["id"] == "disk_inodes_full"]
    assert f["severity"] == "warning" and f["data"]["level"] == "high"
    assert f["message"].startswith(
        "/root/autodl-fs has 4% of its inodes left (96% used) — inodes, not bytes, will run out first"
    )
    assert result["verdict"] == "warn"


def test_bytes_at_90_percent_warn_elevated():
    report = healthy_report()
    report["storage"]["mounts"][1]["bytes_pct"] = 91
    (f,) = [
        f
        for f in ev.evaluate(report, {"count": 1}, AUTODL_PROFILE)["findings"]
        if f["id"] == "disk_bytes_full"
    ]
    assert f["data"]["level"] == "elevated"
    assert f["message"].startswith("/root/autodl-tmp has 9% of its space left (91% used)")


def test_runpod_tmpfs_at_100_percent_is_reported_only_if_probed():
    mounts = rgt_host.combine_df(
        rgt_host.parse_df(sample("df-h_runpod_B300_overlay_workspace-volume.txt")), []
    )
    report = healthy_report()
    report["storage"]["mounts"] = [m for m in mounts if m["mountpoint"] in ("/", "/workspace")]
    assert not [f for f in ev.evaluate(report, {}, {})["findings"] if f["id"].startswith("disk_")]


def test_durable_root_on_a_missing_mount_fails():
    report = healthy_report()
    report["layout"]["durable_root_exists"] = False
    report["storage"]["missing_paths"] = ["/root/autodl-tmp"]
    (f,) = [f for f in ev.evaluate(report, {}, AUTODL_PROFILE)["findings"] if f["severity"] == "critical"]
    assert f["id"] == "durable_mount_missing"
    assert "/root/autodl-tmp" in f["message"] and "Re-rent" in f["fix"]


def test_durable_root_not_created_yet_under_an_existing_mount_is_only_info():
    report = healthy_report()
    report["layout"]["durable_root_exists"] = False
    report["layout"]["anchor"] = "/root/autodl-tmp"
    result = ev.evaluate(report, {}, AUTODL_PROFILE)
    assert "durable_root_absent" in ids(result)
    assert result["verdict"] != "fail"


def test_durable_root_not_writable_fails_but_check_mode_none_does_not():
    report = healthy_report()
    report["layout"]["durable_root_writable"] = False
    report["layout"]["write_error"] = "[Errno 30] Read-only file system"
    result = ev.evaluate(report, {}, AUTODL_PROFILE)
    assert "durable_root_not_writable" in ids(result) and result["verdict"] == "fail"
    report["layout"]["durable_root_writable"] = None
    assert ev.evaluate(report, {}, AUTODL_PROFILE)["verdict"] == "ok"


def test_durable_root_that_does_not_survive_terminate_names_the_surviving_mount():
    profile = copy.deepcopy(AUTODL_PROFILE)
    profile["meter_stop"].update(verb="release", label="释放", reversible=False)
    result = ev.evaluate(healthy_report(), {}, profile)
    (f,) = [f for f in result["findings"] if f["id"] == "durable_root_not_surviving"]
    assert f["severity"] == "warning"
    assert f["data"]["survivors"] == ["/root/autodl-fs"]
    assert "/root/autodl-fs would survive it" in f["message"]


def test_durable_root_on_stop_surviving_mount_is_fine_for_stop_verb():
    assert "durable_root_not_surviving" not in ids(ev.evaluate(healthy_report(), {}, AUTODL_PROFILE))


def test_runpod_container_disk_does_not_survive_stop():
    profile = {
        "meter_stop": {"verb": "stop", "reversible": True},
        "mounts": [{"path": "/", "survives": []}, {"path": "/workspace", "survives": ["stop"]}],
    }
    report = healthy_report()
    report["layout"]["durable_root"] = "/root/rgt"
    (f,) = [
        f for f in ev.evaluate(report, {}, profile)["findings"] if f["id"] == "durable_root_not_surviving"
    ]
    assert f["data"]["mount"] == "/" and f["data"]["survivors"] == ["/workspace"]


def test_home_relative_profile_mount_paths_expand():
    profile = {
        "meter_stop": {"verb": "terminate"},
        "mounts": [{"path": "~", "survives": ["stop", "terminate"]}],
    }
    report = healthy_report()
    report["layout"]["durable_root"] = "/root/work"
    assert "durable_root_not_surviving" not in ids(ev.evaluate(report, {}, profile))


def test_export_and_partial_on_different_filesystems_is_a_warning():
    report = healthy_report()
    report["layout"]["same_filesystem"] = False
    (f,) = [
        f for f in ev.evaluate(report, {}, AUTODL_PROFILE)["findings"] if f["id"] == "export_cross_filesystem"
    ]
    assert f["severity"] == "warning"
    assert "/root/autodl-tmp/p/export/.partial" in f["message"]


def test_cpu_quota_below_nproc_advises_omp_threads():
    report = healthy_report()
    quota, period = rgt_host.parse_cpu_max(sample("cgroup-v2_cpu.max_quota_2.5cpu.txt"))
    report["cpu"] = {"nproc": 128, "effective_cpus": rgt_host.effective_cpus(quota, period, 128)}
    (f,) = [
        f for f in ev.evaluate(report, {}, AUTODL_PROFILE)["findings"] if f["id"] == "cpu_quota_below_nproc"
    ]
    assert f["severity"] == "info"
    assert f["data"]["omp_num_threads"] == 2
    assert "OMP_NUM_THREADS=2" in f["fix"]


def test_cgroup_limit_differs_from_host_memtotal():
    report = healthy_report()
    # free -h in the AutoDL sample shows the host's 1.0Ti; the container is limited to 4 GiB.
    assert "1.0Ti" in sample("free-h_autodl_container_shows_host_ram.txt")
    report["memory"]["mem_total_bytes"] = 1024 * GIB
    report["cgroup"]["memory"] = rgt_host.memory_summary(
        1, sample("cgroup-v1_memory.limit_in_bytes_4GiB.txt"), "0\n", oom_control_text="oom_kill 0\n"
    )
    (f,) = [
        f for f in ev.evaluate(report, {}, AUTODL_PROFILE)["findings"] if f["id"] == "cgroup_memory_limit"
    ]
    assert f["message"].startswith("free shows the host's 1024.0 GiB; your container has 4.0 GiB")


def test_oom_kill_baseline_is_info():
    report = healthy_report()
    report["cgroup"]["memory"] = rgt_host.memory_summary(
        2,
        sample("cgroup-v2_memory.max_100MiB.txt"),
        "0\n",
        sample("cgroup-v2_memory.events_ecs-task-slice_oom.txt"),
    )
    result = ev.evaluate(report, {}, AUTODL_PROFILE)
    (f,) = [f for f in result["findings"] if f["id"] == "cgroup_oom_baseline"]
    assert f["data"]["oom_kill"] == 93


def test_missing_tmux_and_rsync_warn():
    report = healthy_report()
    report["tools"].update({"tmux": None, "rsync": None})
    result = ev.evaluate(report, {}, AUTODL_PROFILE)
    assert {"tool_tmux_missing", "tool_rsync_missing"} <= set(ids(result))
    assert "nohup" in [f for f in result["findings"] if f["id"] == "tool_tmux_missing"][0]["message"]
    assert result["verdict"] == "warn"


def test_no_python_on_path_warns_unless_interpreter_given():
    report = healthy_report()
    report["tools"].update({"python3": None, "python": None})
    assert "python_missing" in ids(ev.evaluate(report, {}, AUTODL_PROFILE))
    report["interpreter"] = {"path": "/root/miniconda3/bin/python", "exists": True}
    assert "python_missing" not in ids(ev.evaluate(report, {}, AUTODL_PROFILE))


def test_missing_explicit_interpreter_warns():
    report = healthy_report()
    report["interpreter"] = {"path": "/root/miniconda3/envs/x/bin/python", "exists": False}
    (f,) = [
        f for f in ev.evaluate(report, {}, AUTODL_PROFILE)["findings"] if f["id"] == "interpreter_missing"
    ]
    assert f["severity"] == "warning"


def test_other_processes_holding_vram_warn():
    report = healthy_report()
    report["gpu"]["compute_apps"] = rgt_gpu.parse_compute_apps(
        sample_csv("nvidia-smi_query-compute-apps_csv_595.80_L40S_load.csv")
    )
    (f,) = [f for f in ev.evaluate(report, {"count": 1}, AUTODL_PROFILE)["findings"] if f["id"] == "gpu_busy"]
    assert "2 process(es) already hold 1219 MiB" in f["message"]


def test_cuda_version_na_is_info():
    table, gpus = gpus_from_table("nvidia-smi_470.82.01_A100-PCIE_cudaNA_k8s.txt")
    report = healthy_report()
    report["gpu"].update({"gpus": gpus, "cuda_version": table["cuda_version"]})
    result = ev.evaluate(report, {"count": 1}, AUTODL_PROFILE)
    assert "cuda_version_unknown" in ids(result) and result["verdict"] == "ok"


def test_findings_are_sorted_worst_first():
    report = healthy_report()
    report["tools"]["tmux"] = None
    report["cpu"] = {"nproc": 128, "effective_cpus": 2.5}
    report["kernel_log"] = dict(
        rgt_gpu.scan_kernel_log(sample("dmesg_xid79_sxid20034_raw.log")), readable=True
    )
    severities = [f["severity"] for f in ev.evaluate(report, {"count": 1}, AUTODL_PROFILE)["findings"]]
    assert severities == sorted(severities, key=["critical", "warning", "info"].index)
    assert severities[0] == "critical" and severities[-1] == "info"


def sample_csv(name):
    with open(SAMPLES / name) as handle:
        return handle.read()
