"""rgt_gpu parsers on real nvidia-smi and kernel-log captures (tests/fixtures/samples, see its README)."""

from pathlib import Path

import pytest

from ansible_collections.rgt.remote_gpu.plugins.module_utils import rgt_gpu

SAMPLES = Path(__file__).resolve().parents[1] / "fixtures" / "samples"
# The nine reasons every driver's `-q` "Clocks Throttle/Event Reasons" section lists (NVML's reason bits).
REASON_NAMES = ("gpu_idle", "applications_clocks_setting", "sw_power_cap", "hw_slowdown", "sync_boost",
                "sw_thermal_slowdown", "hw_thermal_slowdown", "hw_power_brake_slowdown", "display_clock_setting")


def sample(name):
    """Sample text; .txt/.log files carry a '# source:' first line that is not output."""
    with open(SAMPLES / name, newline="") as handle:
        text = handle.read()
    if name.endswith((".txt", ".log")):
        text = text.split("\n", 1)[1]
    return text


# ---------------------------------------------------------------- --query-gpu CSV


def test_query_gpu_not_supported_fields_become_none():
    fields = [
        "gpu_name",
        "utilization.gpu",
        "utilization.memory",
        "temperature.gpu",
        "power.draw",
        "power.limit",
        "fan.speed",
        "pstate",
        "clocks.current.graphics",
        "clocks.current.memory",
        "power.max_limit",
        "power.default_limit",
    ]
    (row,) = rgt_gpu.parse_query_gpu(
        sample("nvidia-smi_query-gpu_noheader_win_GTX770_NotSupported.csv"), fields
    )
    assert row["gpu_name"] == "GeForce GTX 770"
    assert row["utilization.gpu"] is None
    assert row["power.draw"] is None
    assert row["temperature.gpu"] == 52
    assert row["fan.speed"] == 52  # "52 %" with the unit kept
    assert row["pstate"] == "P0"


@pytest.mark.parametrize(
    "name",
    [
        "nvidia-smi_query-gpu_noheader-nounits_pre2020_NotSupported.csv",
        "nvidia-smi_query-gpu_noheader-nounits_2020_NA.csv",
    ],
)
def test_query_gpu_na_and_not_supported_read_the_same_before_and_after_2020(name):
    fields = [
        "memory.total",
        "memory.free",
        "memory.used",
        "temperature.gpu",
        "fan.speed",
        "utilization.gpu",
        "utilization.memory",
    ]
    (row,) = rgt_gpu.parse_query_gpu(sample(name), fields)
    assert row == {
        "memory.total": 2004,
        "memory.free": 2004,
        "memory.used": 0,
        "temperature.gpu": 44,
        "fan.speed": None,
        "utilization.gpu": 0,
        "utilization.memory": 0,
    }


def test_query_gpu_gb10_memory_fields_are_none():
    fields = ["index", "name", "memory.total", "memory.used", "memory.free"]
    (row,) = rgt_gpu.parse_query_gpu(
        sample("nvidia-smi_query-gpu_noheader-nounits_580.95.05_GB10_NA.csv"), fields
    )
    assert row == {
        "index": 0,
        "name": "NVIDIA GB10",
        "memory.total": None,
        "memory.used": None,
        "memory.free": None,
    }


def test_query_gpu_values_with_units_are_numbers():
    fields = [
        "timestamp",
        "name",
        "utilization.gpu",
        "utilization.memory",
        "memory.used",
        "memory.total",
        "power.draw",
        "temperature.gpu",
    ]
    (row,) = rgt_gpu.parse_query_gpu(sample("nvidia-smi_query-gpu_noheader_thundercompute_A100.csv"), fields)
    assert row["utilization.gpu"] == 92
    assert row["memory.used"] == 75351
    assert row["memory.total"] == 81920
    assert row["power.draw"] == pytest.approx(312.13)
    assert row["timestamp"] == "2026/08/01 18:51:16.773"


def test_query_gpu_header_with_units_names_the_columns():
    (row,) = rgt_gpu.parse_query_gpu(sample("nvidia-smi_query-gpu_csv-nounits_TeslaP100.csv"))
    assert row["name"] == "Tesla P100-PCIE-16GB"
    assert row["fan.speed"] is None
    assert row["memory.free"] == 16280
    assert row["clocks.current.sm"] == 405


def test_query_gpu_header_only_utilization_not_supported():
    assert rgt_gpu.parse_query_gpu(
        sample("nvidia-smi_query-gpu_utilization_csv_GTX650_NotSupported.csv")
    ) == [{"utilization.gpu": None}]


def test_query_gpu_single_not_supported_value_without_header():
    text = sample("nvidia-smi_query-gpu_fanspeed_noheader-nounits_NotSupported.csv")
    assert rgt_gpu.parse_query_gpu(text, ["fan.speed"]) == [{"fan.speed": None}]


def test_query_gpu_all_fields_keep_versions_as_text_and_drop_deprecated_markers():
    (row,) = rgt_gpu.parse_query_gpu(sample("nvidia-smi_query-gpu_allfields_csv_590.48.01_H100_MIG_load.csv"))
    assert row["driver_version"] == "590.48.01"
    assert row["memory.total"] == 81559
    assert row["clocks.max.sm"] == 1980
    assert row["mig.mode.current"] == "Enabled"
    assert row["clocks_event_reasons.active"] == "0x0000000000000000"


def test_query_gpu_595_prints_kmd_version_as_text():
    (row,) = rgt_gpu.parse_query_gpu(sample("nvidia-smi_query-gpu_allfields_csv_595.80_L40S_idle.csv"))
    assert row["driver_version"] == "595.80"
    assert row["kmd_version"] == "595.80"
    assert row["name"] == "NVIDIA L40S"


def test_empty_query_output_is_no_rows():
    assert rgt_gpu.parse_query_gpu("", ["index"]) == []


# ---------------------------------------------------------------- --query-compute-apps


def test_compute_apps_header_only_means_idle():
    assert (
        rgt_gpu.parse_compute_apps(
            sample("nvidia-smi_query-compute-apps_csv_590.48.01_H200_idle_headeronly.csv")
        )
        == []
    )


def test_compute_apps_rows_under_load():
    rows = rgt_gpu.parse_compute_apps(sample("nvidia-smi_query-compute-apps_csv_590.48.01_H100_MIG_load.csv"))
    assert [(r["pid"], r["process_name"], r["used_gpu_memory"]) for r in rows] == [
        (21180, "/root/tools/memhog", 2296),
        (21181, "/root/tools/memhog", 1272),
        (21198, "./gpu_burn", 7484),
    ]


def test_compute_apps_used_memory_alias_maps_to_printed_header_name():
    rows = rgt_gpu.parse_compute_apps(
        sample("nvidia-smi_query-compute-apps_pid-used_memory_csv_k8s-pod.csv"), ["pid", "used_memory"]
    )
    assert rows == [
        {"pid": 12201, "used_gpu_memory": 25},
        {"pid": 11509, "used_gpu_memory": 2539},
        {"pid": 14466, "used_gpu_memory": 3713},
    ]


def test_compute_apps_noheader_uses_field_list_with_aliases():
    text = "21180, /root/tools/memhog, 2296, GPU-00000000-0000-0000-0000-000000000000\n"
    (row,) = rgt_gpu.parse_compute_apps(text, ["pid", "process_name", "used_memory", "gpu_uuid"])
    assert row == {
        "pid": 21180,
        "process_name": "/root/tools/memhog",
        "used_gpu_memory": 2296,
        "gpu_uuid": "GPU-00000000-0000-0000-0000-000000000000",
    }


def test_compute_apps_vgpu_process_name():
    rows = rgt_gpu.parse_compute_apps(sample("nvidia-smi_query-compute-apps_gpu_uuid-name_csv_vgpu.csv"))
    assert len(rows) == 3
    assert {r["process_name"] for r in rows} == {"vgpu"}
    assert rows[0]["gpu_uuid"] == "GPU-d0180485-9584-433c-6782-c335d5df2cb3"


def test_compute_apps_empty_noheader_output_is_no_rows():
    assert rgt_gpu.parse_compute_apps("", ["pid", "process_name"]) == []


# ---------------------------------------------------------------- default table


def test_table_418_old_layout_processes_without_gi_ci():
    table = rgt_gpu.parse_smi_table(sample("nvidia-smi_418.67_4xP100_procs_oldlayout.txt"))
    assert (table["driver_version"], table["cuda_version"]) == ("418.67", "10.1")
    assert len(table["gpus"]) == 4
    gpu0 = table["gpus"][0]
    assert gpu0["name"] == "Tesla P100-PCIE..." and gpu0["name_truncated"] is True
    assert (gpu0["memory_used_mib"], gpu0["memory_total_mib"]) == (15757, 16280)
    assert (gpu0["temperature_c"], gpu0["utilization_pct"], gpu0["power_w"]) == (48, 74, 80.0)
    assert gpu0["mig_mode"] is None
    assert table["processes_state"] == "listed"
    assert [(p["gpu"], p["pid"], p["used_memory_mib"]) for p in table["processes"]] == [
        (0, 32636, 15747),
        (1, 29633, 15743),
        (2, 19218, 15709),
        (3, 419, 15747),
    ]


def test_table_450_mig_mixed_gpus_and_mig_devices():
    table = rgt_gpu.parse_smi_table(sample("nvidia-smi_450.80.02_8xA100-SXM4-40GB_MIG-mixed.txt"))
    assert table["driver_version"] == "450.80.02"
    assert len(table["gpus"]) == 8
    assert table["gpus"][0]["mig_mode"] == "Disabled"
    assert [g["mig_mode"] for g in table["gpus"][1:]] == ["Enabled"] * 7
    assert table["gpus"][1]["utilization_pct"] is None  # N/A under MIG
    assert table["mig_devices"] == [
        {
            "gpu": 7,
            "gi": 13,
            "ci": 0,
            "mig_dev": 0,
            "memory_used_mib": 3,
            "memory_total_mib": 4864,
            "sm_count": 14,
            "bar1_used_mib": 0,
            "bar1_total_mib": 8191,
        }
    ]
    assert table["processes_state"] == "none"


def test_table_470_k8s_cuda_na_is_none():
    table = rgt_gpu.parse_smi_table(sample("nvidia-smi_470.82.01_A100-PCIE_cudaNA_k8s.txt"))
    assert table["driver_version"] == "470.82.01"
    assert table["cuda_version"] is None
    assert table["gpus"][0]["memory_total_mib"] == 40536


def test_table_525_crlf_eight_training_processes():
    table = rgt_gpu.parse_smi_table(sample("nvidia-smi_525.105.17_8xH800_procs.txt"))
    assert table["cuda_version"] == "12.0"
    assert len(table["gpus"]) == 8
    assert len(table["processes"]) == 8
    assert table["processes"][0]["process_name"] == "...nv-py310-cu118/bin/python"
    assert table["processes"][7]["pid"] == 112530


def test_table_530_wsl_smi_and_driver_versions_differ():
    table = rgt_gpu.parse_smi_table(sample("nvidia-smi_530.47_wsl_RTX3070_firstwide.txt"))
    assert (table["smi_version"], table["driver_version"], table["cuda_version"]) == (
        "530.47",
        "531.68",
        "12.1",
    )
    assert table["processes"][0]["used_memory_mib"] is None  # "N/A" on WSL


def test_table_535_container_empty_process_box_is_empty_not_none():
    table = rgt_gpu.parse_smi_table(sample("nvidia-smi_535.247.01_vastai_8xA100_container_emptyprocs.txt"))
    assert table["processes_state"] == "empty"
    assert table["processes"] == []
    assert table["gpus"][0]["power_w"] == 405.0 and table["gpus"][0]["power_cap_w"] == 400.0


def test_table_550_no_process_section_is_absent():
    table = rgt_gpu.parse_smi_table(sample("nvidia-smi_550.90.07_8xH100_noprocsection.txt"))
    assert table["processes_state"] == "absent"
    assert len(table["gpus"]) == 8
    assert table["gpus"][0]["bus_id"] == "00000000:53:00.0"


@pytest.mark.parametrize(
    "name,pid",
    [("nvidia-smi_550.144.03_2xV100_procs.txt", 2412), ("nvidia-smi_570.133.20_2xV100_procs.txt", 3486)],
)
def test_table_process_pid_column_before_and_after_570_widening(name, pid):
    table = rgt_gpu.parse_smi_table(sample(name))
    assert [p["pid"] for p in table["processes"]] == [pid, pid]
    assert table["gpus"][0]["name"] == "Tesla V100-SXM2-16GB"


def test_table_575_seven_digit_pid():
    table = rgt_gpu.parse_smi_table(sample("nvidia-smi_575.51.03_A100-80GB-PCIe_proc.txt"))
    assert table["processes"][0]["pid"] == 2308208


def test_table_580_gb10_memory_not_supported_and_power_cap_na():
    table = rgt_gpu.parse_smi_table(sample("nvidia-smi_580.126.09_GB10_memory-NotSupported.txt"))
    assert table["cuda_version"] == "13.0"
    (gpu,) = table["gpus"]
    assert gpu["name"] == "NVIDIA GB10"
    assert gpu["memory_used_mib"] is None and gpu["memory_total_mib"] is None
    assert gpu["power_w"] == 3.0 and gpu["power_cap_w"] is None


def test_table_590_mig_devices_and_processes_with_gi_ci():
    table = rgt_gpu.parse_smi_table(sample("nvidia-smi_590.48.01_H100_MIG_procs.txt"))
    assert table["cuda_version"] == "13.1"
    assert [(d["gi"], d["memory_total_mib"]) for d in table["mig_devices"]] == [
        (2, 40448),
        (3, 20096),
        (9, 9984),
        (10, 9984),
    ]
    assert [(p["gi"], p["ci"], p["pid"], p["process_name"]) for p in table["processes"]] == [
        (2, 0, 21180, "/root/tools/memhog"),
        (2, 0, 21181, "/root/tools/memhog"),
        (2, 0, 21198, "./gpu_burn"),
    ]


def test_table_590_compute_instance_split_rows():
    table = rgt_gpu.parse_smi_table(sample("nvidia-smi_590.48.01_H200_MIG_noprocs.txt"))
    assert [(d["gi"], d["ci"]) for d in table["mig_devices"]] == [(2, 0), (2, 1), (3, 0), (9, 0), (10, 0)]
    assert table["gpus"][0]["memory_total_mib"] == 143771


@pytest.mark.parametrize(
    "name,driver",
    [
        ("nvidia-smi_610.57.04_RTX2080S_kmd-umd-header.txt", "610.57.04"),
        ("nvidia-smi_610.43.02_thundercompute_A100_truncated.txt", "610.43.02"),
    ],
)
def test_table_610_kmd_umd_banner(name, driver):
    table = rgt_gpu.parse_smi_table(sample(name))
    assert table["driver_version"] == driver
    assert table["cuda_version"] == "13.3"
    assert len(table["gpus"]) == 1


def test_table_610_truncated_without_closing_border_still_yields_gpu():
    table = rgt_gpu.parse_smi_table(sample("nvidia-smi_610.43.02_thundercompute_A100_truncated.txt"))
    assert table["gpus"][0]["memory_total_mib"] == 81920
    assert table["gpus"][0]["mig_mode"] == "Disabled"


@pytest.mark.parametrize(
    "name,cuda",
    [
        ("nvidia-smi_515.65.01_TitanV_oldlayout.txt", "11.7"),
        ("nvidia-smi_525.125.06_vastai_1xA100_hostproc.txt", "12.0"),
        ("nvidia-smi_545.23.08_H100_noprocs.txt", "12.3"),
        ("nvidia-smi_575.57.08_8xB200_noprocsection.txt", "12.9"),
        ("nvidia-smi_580.126.09_runpod_B300_truncated.txt", "13.0"),
        ("nvidia-smi_580.173.02_H200_noprocs.txt", "13.0"),
        ("nvidia-smi_580.76.05_autodl_RTX4090_noprocs.txt", "13.0"),
    ],
)
def test_table_cuda_version_from_every_banner_generation(name, cuda):
    table = rgt_gpu.parse_smi_table(sample(name))
    assert table["cuda_version"] == cuda
    assert table["gpus"] and all(g["name"] for g in table["gpus"])


def test_table_b200_four_digit_power_cap():
    table = rgt_gpu.parse_smi_table(sample("nvidia-smi_575.57.08_8xB200_noprocsection.txt"))
    assert table["gpus"][0]["power_cap_w"] == 1000.0
    assert table["gpus"][0]["memory_total_mib"] == 183359


# ---------------------------------------------------------------- -q


@pytest.mark.parametrize(
    "name,section,driver",
    [
        ("nvidia-smi-q_418.67_V100_clocks-throttle-reasons.txt", "throttle", "418.67"),
        ("nvidia-smi-q-i0_525.105.17_H800_clocks-throttle-reasons.txt", "throttle", "525.105.17"),
        ("nvidia-smi-a_545.23.08_H100_clocks-event-reasons.txt", "event", "545.23.08"),
        ("nvidia-smi-q_590.48.01_H100_load_clocks-event-reasons-counters.txt", "event", "590.48.01"),
    ],
)
def test_q_reads_old_throttle_and_new_event_reason_sections(name, section, driver):
    parsed = rgt_gpu.parse_query_q(sample(name))
    assert parsed["driver_version"] == driver
    gpu = parsed["gpus"][0]
    assert gpu["reasons_section"] == section
    assert set(gpu["reasons"]) == set(REASON_NAMES)
    assert gpu["reasons"]["hw_thermal_slowdown"] is False


def test_q_idle_gpu_reports_gpu_idle_active():
    parsed = rgt_gpu.parse_query_q(sample("nvidia-smi-q_418.67_V100_clocks-throttle-reasons.txt"))
    assert parsed["cuda_version"] == "10.1"
    assert parsed["attached_gpus"] == 4
    gpu = parsed["gpus"][0]
    assert gpu["bus_id"] == "00000004:04:00.0"
    assert gpu["product_name"] == "Tesla V100-SXM2-32GB"
    assert gpu["active_reasons"] == ["gpu_idle"]


def test_q_loaded_gpu_has_no_active_reasons_and_full_clocks():
    parsed = rgt_gpu.parse_query_q(
        sample("nvidia-smi-q_590.48.01_H100_load_clocks-event-reasons-counters.txt")
    )
    gpu = parsed["gpus"][0]
    assert gpu["active_reasons"] == []
    assert (gpu["clocks_sm_mhz"], gpu["clocks_max_sm_mhz"]) == (1980, 1980)
    assert gpu["temperature_c"] == 59


def test_q_thermal_slowdown_active_is_reported():
    text = sample("nvidia-smi-q-i0_525.105.17_H800_clocks-throttle-reasons.txt").replace(
        "HW Thermal Slowdown           : Not Active", "HW Thermal Slowdown           : Active"
    )
    gpu = rgt_gpu.parse_query_q(text)["gpus"][0]
    assert gpu["active_reasons"] == ["gpu_idle", "hw_thermal_slowdown"]


# ---------------------------------------------------------------- failures


def test_failure_driver_unreachable_message():
    stderr = (
        "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
        "Make sure that the latest NVIDIA driver is installed and running.\n"
    )
    assert rgt_gpu.classify_smi_failure(9, "", stderr)["kind"] == "driver_unreachable"


def test_failure_rc9_alone_means_driver_unreachable():
    assert rgt_gpu.classify_smi_failure(9, "", "")["kind"] == "driver_unreachable"


def test_failure_no_devices_found():
    assert rgt_gpu.classify_smi_failure(6, "No devices were found\n", "")["kind"] == "no_devices"


def test_failure_not_installed_and_success():
    assert (
        rgt_gpu.classify_smi_failure(127, "", "bash: nvidia-smi: command not found")["kind"]
        == "not_installed"
    )
    assert rgt_gpu.classify_smi_failure(0, "0, NVIDIA H100\n", "") is None


# ---------------------------------------------------------------- kernel log


def test_xid79_found_in_raw_dmesg_and_sxid_ignored():
    scan = rgt_gpu.scan_kernel_log(sample("dmesg_xid79_sxid20034_raw.log"))
    assert scan["codes"] == [79]
    (xid,) = scan["xids"]
    assert xid["pci"] == "0000:91:00"
    assert xid["pid"] is None and xid["name"] is None
    assert xid["message"] == "GPU has fallen off the bus."
    assert xid["severity"] == "critical" and xid["re_rent"] is True
    assert xid["lineno"] == 3
    assert rgt_gpu.gpu_health_verdict(scan) == "critical"


def test_fallen_off_bus_without_xid_is_critical():
    scan = rgt_gpu.scan_kernel_log(sample("dmesg_fallen-off-bus_noXid_570.log"))
    assert scan["xids"] == []
    assert [f["pci"] for f in scan["fallen_off_bus"]] == ["0000:b3:00.0"]
    assert rgt_gpu.gpu_health_verdict(scan) == "critical"


def test_xid48_and_64_from_syslog_prefix():
    scan = rgt_gpu.scan_kernel_log(sample("syslog_xid48_xid64_rminitadapter.log"))
    assert scan["codes"] == [48, 64]
    dbe = scan["xids"][0]
    assert dbe["pci"] == "0000:07:00"
    assert dbe["message"].startswith("An uncorrectable double bit error (DBE)")
    assert dbe["re_rent"] is True
    assert scan["xids"][1]["severity"] == "warning"


def test_xid119_ctime_prefix_with_pid_and_name():
    scan = rgt_gpu.scan_kernel_log(sample("dmesg_xid119_gsp-timeout_ctime.log"))
    assert scan["codes"] == [119]
    assert len(scan["xids"]) == 5
    assert (scan["xids"][0]["pid"], scan["xids"][0]["name"]) == (2024380, "nvidia-smi")
    assert scan["xids"][3]["name"] == "cache_mgr_main"
    assert rgt_gpu.gpu_health_verdict(scan) == "critical"


def test_xid13_43_iso_prefix_are_application_errors():
    scan = rgt_gpu.scan_kernel_log(sample("dmesg_xid13_xid43_decode-iso.log"))
    assert scan["codes"] == [13, 43]
    assert len(scan["xids"]) == 17
    assert scan["xids"][-1]["name"] == "pt_main_thread"
    assert rgt_gpu.gpu_health_verdict(scan) == "info"


def test_xid13_109_ctime_unknown_pid_quoted():
    scan = rgt_gpu.scan_kernel_log(sample("dmesg_xid13_xid109_ctime.log"))
    assert scan["codes"] == [13, 109]
    assert scan["xids"][0]["pid"] is None
    assert scan["xids"][-1]["pid"] == 1797828


def test_xid31_new_595_channel_format():
    (xid,) = rgt_gpu.scan_kernel_log(sample("dmesg_xid31_595-openkm_newformat.log"))["xids"]
    assert (xid["code"], xid["pid"], xid["name"]) == (31, 13705, "UnrealEditor")
    assert xid["message"].startswith("channel 0x0000000c")
    assert xid["severity"] == "info"


def test_xid31_62_45_raw_counts():
    scan = rgt_gpu.scan_kernel_log(sample("dmesg_xid31_xid62_xid45_raw.log"))
    assert scan["codes"] == [31, 45, 62]
    assert sum(1 for x in scan["xids"] if x["code"] == 45) == 8
    assert rgt_gpu.gpu_health_verdict(scan) == "warning"


def test_xid45_journal_caused_by_previous_xid():
    scan = rgt_gpu.scan_kernel_log(sample("journal_xid45_causedby_xid145_149.log"))
    assert scan["codes"] == [45]
    assert scan["xids"][0]["message"] == "Ch 00000001 caused by previous Xid 149"
    assert {x["pci"] for x in scan["xids"]} == {"0000:dc:00", "0000:ed:00", "0000:ba:00", "0000:97:00"}


def test_xid63_inside_alert_wrapper_without_name_field():
    (xid,) = rgt_gpu.scan_kernel_log(sample("alert_xid63_rowremapper_wrapped-syslog.log"))["xids"]
    assert (xid["code"], xid["pci"], xid["pid"], xid["name"]) == (63, "0000:10:1c", 1850, None)
    assert xid["message"].startswith("Row Remapper: New row marked for remapping")


def test_xid94_95_driver_examples_gpu_instance_and_severity():
    scan = rgt_gpu.scan_kernel_log(sample("driversrc-example_xid94_xid95_error-containment.log"))
    assert [x["code"] for x in scan["xids"]] == [94, 94, 95]
    assert scan["xids"][0]["gpu_instance"] == "05"
    assert scan["xids"][0]["pci"] == "0000:01:00"
    assert scan["xids"][0]["severity"] == "warning"
    assert scan["xids"][2]["severity"] == "critical"


@pytest.mark.parametrize("code", [48, 74, 79, 92, 95, 119])
def test_re_rent_codes_are_critical(code):
    cls = rgt_gpu.classify_xid(code)
    assert cls["severity"] == "critical" and cls["re_rent"] is True
    assert cls["advice"].startswith("re-rent")


@pytest.mark.parametrize("code", [13, 31, 43, 45])
def test_application_codes_are_info(code):
    assert rgt_gpu.classify_xid(code)["severity"] == "info"


def test_unknown_xid_is_a_warning():
    assert rgt_gpu.classify_xid(999)["severity"] == "warning"


def test_clean_log_is_ok():
    assert rgt_gpu.gpu_health_verdict(rgt_gpu.scan_kernel_log("[    1.0] usb 1-1: new device\n")) == "ok"
