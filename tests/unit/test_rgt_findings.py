"""rgt_findings: the one shape of every phase's findings (id, severity, message, fix, data), the verdict over
them, and a fix on every probe finding the user can act on (docs/internals.md "Findings")."""

import pytest

from ansible_collections.rgt.remote_gpu.plugins.module_utils import rgt_envcheck as ec
from ansible_collections.rgt.remote_gpu.plugins.module_utils import rgt_findings as rf
from ansible_collections.rgt.remote_gpu.plugins.module_utils import rgt_gpu
from ansible_collections.rgt.remote_gpu.plugins.module_utils import rgt_probe_eval as ev

SHAPE = {"id", "severity", "message", "fix", "data"}
# findings that state a fact the user cannot change from here: no fix to give
NO_FIX = {"kernel_log_unreadable", "durable_root_absent", "cgroup_oom_baseline", "cuda_version_unknown"}

PROFILE = {
    "name": "autodl",
    "mounts": [{"path": "/", "survives": ["stop"]},
               {"path": "~/data", "survives": ["stop"]},
               {"path": "/root/autodl-fs", "survives": ["stop", "terminate"]}],
    "meter_stop": {"verb": "terminate"},
}


def broken_report(gpu_failure=None, gpus=None):
    """A box where (nearly) everything the probe checks is wrong."""
    gpu = {"index": 0, "name": "NVIDIA A10", "memory_total_mib": 24000,
           "active_reasons": ["hw_thermal_slowdown"], "temperature_c": 91}
    return {
        "host": {"hostname": "b", "home": "/root", "user": "root"},
        "gpu": {"failure": gpu_failure, "gpus": [gpu] if gpus is None else gpus, "cuda_version": None,
                "compute_apps": [{"pid": 7, "used_gpu_memory": 900}]},
        "kernel_log": {"readable": True,
                       "fallen_off_bus": [{"pci": "0000:07:00", "line": "GPU has fallen off the bus"}],
                       "xids": [dict(rgt_gpu.classify_xid(code), pci="0000:07:00", line="Xid %d" % code)
                                for code in (79, 13)]},
        "storage": {"mounts": [{"path": "/root/data", "mountpoint": "/root/data", "bytes_pct": 97, "inodes_pct": 96}],
                    "missing_paths": []},
        "cgroup": {"memory": {"limit_bytes": 4 * 1024 ** 3, "oom_kill": 3}},
        "cpu": {"nproc": 64, "effective_cpus": 4.0},
        "memory": {"mem_total_bytes": 512 * 1024 ** 3},
        "tools": {"tmux": None, "rsync": None, "python3": None, "python": None},
        "layout": {"durable_root": "/root/data/rgt", "durable_root_exists": True, "durable_root_writable": True,
                   "same_filesystem": False, "export_dir": "e", "partial_dir": "e/.partial"},
        "interpreter": {"path": "/opt/py/bin/python", "exists": False},
    }


def all_probe_findings():
    request = {"count": 2, "min_memory_mib": 80000, "name": "H100"}
    found = ev.evaluate(broken_report(), request, PROFILE)["findings"]
    found += ev.evaluate(broken_report(gpus=[]), {"count": 1}, PROFILE)["findings"]
    found += ev.evaluate(broken_report({"kind": "driver_mismatch", "message": "driver/library mismatch"}, []),
                         {"count": 1}, PROFILE)["findings"]
    unwritable = broken_report()
    unwritable["layout"].update(durable_root_exists=False, durable_root_writable=False, anchor="/root")
    found += ev.evaluate(unwritable, {}, PROFILE)["findings"]
    missing = broken_report()
    missing["layout"].update(durable_root_exists=False)
    missing["storage"]["missing_paths"] = ["/root/data"]
    found += ev.evaluate(missing, {}, PROFILE)["findings"]
    unreadable = broken_report()
    unreadable["kernel_log"] = {"readable": False, "error": "dmesg: read kernel buffer failed"}
    unreadable["gpu"]["gpus"][0]["memory_total_mib"] = None
    unreadable["tools"]["python3"] = "/usr/bin/python3"
    unreadable["interpreter"] = {"path": None}
    unreadable["layout"].update(durable_root_exists=False, durable_root_writable=None)
    found += ev.evaluate(unreadable, {"count": 1, "min_memory_mib": 1000}, PROFILE)["findings"]
    found += ev.evaluate(dict(broken_report(), tools={}, interpreter={"path": None}), {}, {})["findings"]
    return found


def env_check_findings():
    torch = {"present": True, "version": "2.5.1", "cuda": "12.8", "available": False, "device_count": 0}
    return (ec.cuda_findings("12.2", torch, True, "12.4") + ec.proxy_findings({"no_proxy": "*"}, ["*.x"])
            + ec.interpreter_findings({"conda_env": "base", "executable": "/c/bin/python"}, True))


def test_every_phase_builds_findings_of_one_shape():
    probe, env = all_probe_findings(), env_check_findings()
    assert probe and env
    for f in probe + env:
        assert set(f) == SHAPE, f
        assert f["severity"] in rf.SEVERITIES
        assert isinstance(f["message"], str) and f["message"]
        assert isinstance(f["fix"], str) and isinstance(f["data"], dict)


def test_every_probe_problem_the_user_can_act_on_names_its_fix():
    found = {f["id"]: f for f in all_probe_findings()}
    # every kind of probe finding is covered here (a new one must say whether it has a fix)
    assert {"gpu_driver_broken", "gpu_none", "gpu_count", "gpu_memory", "gpu_memory_unknown", "gpu_name",
            "gpu_throttle", "gpu_busy", "gpu_fallen_off_bus", "gpu_xid_79", "gpu_xid_13", "kernel_log_unreadable",
            "disk_bytes_full", "disk_inodes_full", "durable_mount_missing", "durable_root_not_writable",
            "durable_root_absent", "durable_root_not_surviving", "export_cross_filesystem", "cpu_quota_below_nproc",
            "cgroup_memory_limit", "cgroup_oom_baseline", "tool_tmux_missing", "tool_rsync_missing",
            "interpreter_missing", "python_missing", "cuda_version_unknown"} <= set(found)
    without = sorted(fid for fid, f in found.items() if not f["fix"].strip())
    assert without == sorted(NO_FIX & set(found)), without
    assert "Re-rent" in found["gpu_none"]["fix"] and "rgt_job.gpu.count" in found["gpu_count"]["fix"]
    assert "/root/data" in found["disk_inodes_full"]["fix"] and "rgt_durable_root" in \
        found["durable_root_not_surviving"]["fix"]
    # the fix is not repeated in the message: the message says what is wrong, the fix what to do
    assert "Re-rent" not in found["gpu_none"]["message"]


def test_finding_fills_the_shape_and_refuses_an_unknown_severity():
    assert rf.finding("x", "info", "m") == {"id": "x", "severity": "info", "message": "m", "fix": "", "data": {}}
    data = {"a": 1}
    made = rf.finding("y", "warning", "m", "do this", data)
    assert made["fix"] == "do this" and made["data"] == data and made["data"] is not data
    with pytest.raises(ValueError, match="severity"):
        rf.finding("z", "fatal", "m")


def test_verdict_and_order():
    info, warn, crit = rf.finding("a", "info", "m"), rf.finding("b", "warning", "m"), rf.finding("c", "critical", "m")
    assert rf.verdict([]) == "ok" and rf.verdict([info]) == "ok"
    assert rf.verdict([warn, info]) == "warn" and rf.verdict([warn, crit]) == "fail"
    info2 = rf.finding("d", "info", "m2")
    assert [f["id"] for f in rf.worst_first([info, warn, info2, crit])] == ["c", "b", "a", "d"]
