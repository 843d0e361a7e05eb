"""Unit tests for the env_check decision logic (plugins/module_utils/rgt_envcheck.py)."""

import sys
from pathlib import Path

import pytest

COLLECTIONS = Path(__file__).resolve().parents[2] / ".collections"
if str(COLLECTIONS) not in sys.path:  # tests/conftest.py normally does this
    sys.path.insert(0, str(COLLECTIONS))

from ansible_collections.rgt.remote_gpu.plugins.module_utils import rgt_envcheck as ec  # noqa: E402
from ansible_collections.rgt.remote_gpu.plugins.module_utils import rgt_findings  # noqa: E402

SMI_HEADER = """Mon Nov 30 09:33:26 2026
+-----------------------------------------------------------------------------------------+
| NVIDIA-SMI 550.90.07              Driver Version: 550.90.07      CUDA Version: 12.4     |
|-----------------------------------------+------------------------+----------------------+
"""


def torch_info(cuda="12.1", available=True, device_count=1, **extra):
    info = {"present": True, "version": "2.3.1", "cuda": cuda, "available": available,
            "device_count": device_count}
    info.update(extra)
    return info


def ids(findings):
    return [f["id"] for f in findings]


def severity_of(findings, fid):
    return next(f["severity"] for f in findings if f["id"] == fid)


# ---- nvidia-smi parsing ----------------------------------------------------------------------

def test_header_gives_driver_cuda_and_driver_version():
    assert ec.parse_nvidia_smi_header(SMI_HEADER) == {"cuda": "12.4", "driver": "550.90.07"}


def test_header_without_cuda_field_gives_none():
    assert ec.parse_nvidia_smi_header("NVIDIA-SMI has failed because it couldn't communicate") == {
        "cuda": None, "driver": None}


def test_gpu_list_counts_gpu_lines_only():
    text = ("GPU 0: NVIDIA A100 (UUID: GPU-1)\n  MIG 1g.10gb Device 0: (UUID: MIG-1)\n"
            "GPU 1: NVIDIA A100 (UUID: GPU-2)\n")
    assert ec.count_gpus_from_list(text) == 2


@pytest.mark.parametrize("text,expected", [
    ("12.4", (12, 4)), ("11", (11, 0)), ("cu121", (12, 1)), ("cu118", (11, 8)), (" 12.1.105", (12, 1)),
    (None, None), ("", None), ("n/a", None),
])
def test_cuda_version_parsing(text, expected):
    assert ec.parse_cuda_version(text) == expected


# ---- the triangle --------------------------------------------------------------------------------

def test_matching_triangle_has_no_findings():
    assert ec.cuda_findings("12.4", torch_info("12.1"), gpus_present=True) == []


def test_torch_major_newer_than_driver_is_critical_804_even_if_available():
    out = ec.cuda_findings("11.8", torch_info("12.1", available=True), gpus_present=True)
    assert ids(out) == ["torch_cuda_newer_than_driver"]
    assert out[0]["severity"] == "critical"
    assert "804" in out[0]["message"] and "too old" in out[0]["message"]
    assert "11.8" in out[0]["fix"]


def test_torch_minor_newer_and_unavailable_is_critical_driver_too_old():
    warning = "CUDA initialization: The NVIDIA driver on your system is too old (found version 12020)."
    out = ec.cuda_findings("12.2", torch_info("12.4", available=False, device_count=0, cuda_warning=warning),
                           gpus_present=True)
    assert ids(out) == ["torch_cuda_newer_than_driver"]
    assert "found version 12020" in out[0]["message"]
    assert rgt_findings.verdict(out) == "fail"


def test_torch_minor_newer_but_available_is_only_a_warning():
    out = ec.cuda_findings("12.2", torch_info("12.4", available=True), gpus_present=True)
    assert ids(out) == ["torch_cuda_minor_newer_than_driver"]
    assert rgt_findings.verdict(out) == "warn"


def test_unavailable_with_gpus_present_is_critical():
    out = ec.cuda_findings("12.4", torch_info("12.1", available=False, device_count=0), gpus_present=True)
    assert ids(out) == ["cuda_unavailable"]
    assert out[0]["severity"] == "critical"


def test_unavailable_without_gpus_is_fine_cpu_box():
    assert ec.cuda_findings(None, torch_info("12.1", available=False, device_count=0),
                            gpus_present=None) == []


def test_cpu_build_on_gpu_box_is_a_warning():
    out = ec.cuda_findings("12.4", torch_info(None, available=False, device_count=0), gpus_present=True)
    assert ids(out) == ["torch_cpu_build"]
    assert out[0]["severity"] == "warning"


def test_cpu_build_on_cpu_box_is_fine():
    assert ec.cuda_findings(None, torch_info(None, available=False), gpus_present=False) == []


def test_torch_missing_on_gpu_box_warns_and_skips_the_rest():
    out = ec.cuda_findings("12.4", {"present": False, "import_error": "ModuleNotFoundError: torch"}, True)
    assert ids(out) == ["torch_missing"]
    assert "ModuleNotFoundError" in out[0]["message"]


def test_torch_missing_without_gpus_is_silent():
    assert ec.cuda_findings(None, {"present": False}, None) == []


def test_driver_below_expected_cuda_is_critical():
    out = ec.cuda_findings("12.0", torch_info("11.8"), True, expected_cuda_driver="12.1")
    assert ids(out) == ["driver_older_than_expected"]


def test_expected_cuda_with_unknown_driver_warns():
    out = ec.cuda_findings(None, torch_info("12.1", available=False), None, expected_cuda_driver="12.1")
    assert ids(out) == ["driver_cuda_unknown"]
    assert out[0]["severity"] == "warning"


@pytest.mark.parametrize("capability,arch_list,ok", [
    ([8, 0], ["sm_70", "sm_80", "sm_90"], True),
    ([8, 6], ["sm_70", "sm_80"], True),          # same major, older minor: binary compatible
    ([9, 0], ["sm_70", "sm_80", "compute_80"], True),  # PTX JIT
    ([12, 0], ["sm_50", "sm_80", "sm_90"], False),  # Blackwell on an old wheel: no kernel image
    ([8, 0], ["sm_86", "sm_90"], False),
])
def test_no_kernel_image_detection(capability, arch_list, ok):
    out = ec.cuda_findings("12.8", torch_info("12.1", capability=capability, arch_list=arch_list), True)
    assert ("no_kernel_image" not in ids(out)) == ok


# ---- verdict and policy --------------------------------------------------------------------------

@pytest.mark.parametrize("verdict,policy,stops", [
    ("fail", "critical", True), ("warn", "critical", False), ("warn", "warning", True),
    ("ok", "warning", False), ("fail", "never", False),
])
def test_fail_on_policy(verdict, policy, stops):
    assert ec.fails_on(verdict, policy) is stops


def test_unknown_severity_is_rejected():
    with pytest.raises(ValueError):
        ec.finding("x", "fatal", "m")


# ---- interpreter ---------------------------------------------------------------------------------

@pytest.mark.parametrize("prefix,meta,default_env,expected", [
    ("/root/miniconda3", True, "base", "base"),
    ("/root/miniconda3", True, None, "base"),
    ("/root/miniconda3/envs/myconda", True, "myconda", "myconda"),
    ("/opt/venv", False, None, None),
])
def test_conda_env_name(prefix, meta, default_env, expected):
    assert ec.conda_env_name(prefix, meta, default_env) == expected


def test_conda_base_refused_only_when_asked():
    info = {"executable": "/root/miniconda3/bin/python", "conda_env": "base"}
    assert ec.interpreter_findings(info, refuse_conda_base=False) == []
    assert ids(ec.interpreter_findings(info, refuse_conda_base=True)) == ["conda_base"]


# ---- proxies and no_proxy ------------------------------------------------------------------------

def test_no_proxy_not_set_when_no_proxy_exported():
    assert ec.compute_no_proxy({"PATH": "/bin"}, [".tuna.tsinghua.edu.cn"]) == {}
    assert ec.compute_no_proxy({"http_proxy": ""}, [".tuna.tsinghua.edu.cn"]) == {}


@pytest.mark.parametrize("var", ["http_proxy", "https_proxy", "HTTPS_PROXY", "ALL_PROXY", "all_proxy"])
def test_any_proxy_variable_triggers_no_proxy(var):
    out = ec.compute_no_proxy({var: "http://proxy:3128"}, [])
    assert out["no_proxy"] == out["NO_PROXY"] == "127.0.0.1,localhost"


def test_no_proxy_rules_leading_dot_no_star_both_casings_loopback_first():
    env = {"https_proxy": "http://u:p@proxy.invalid:3128", "no_proxy": "modelscope.com,*.example.org"}
    out = ec.compute_no_proxy(env, ["*.tuna.tsinghua.edu.cn", ".aliyuncs.com", "hf-mirror.com", "*",
                                    "10.0.0.0/8", "localhost", "metadata", "[::1]"])
    value = out["no_proxy"]
    assert out["NO_PROXY"] == value
    entries = value.split(",")
    assert entries[:2] == ["127.0.0.1", "localhost"]
    assert "*" not in value
    assert ".modelscope.com" in entries and ".example.org" in entries
    assert ".tuna.tsinghua.edu.cn" in entries and ".aliyuncs.com" in entries and ".hf-mirror.com" in entries
    assert "10.0.0.0/8" in entries and "metadata" in entries and "[::1]" in entries
    assert len(entries) == len(set(entries))


def test_no_proxy_merges_both_existing_casings():
    env = {"http_proxy": "http://p:1", "no_proxy": ".a.cn", "NO_PROXY": ".b.cn"}
    entries = ec.compute_no_proxy(env, [".c.cn"])["no_proxy"].split(",")
    assert entries == ["127.0.0.1", "localhost", ".a.cn", ".b.cn", ".c.cn"]


def test_proxy_var_names_are_names_only_and_skip_empty():
    env = {"https_proxy": "http://user:hunter2@proxy:3128", "NO_PROXY": "x", "http_proxy": "", "PATH": "/"}
    names = ec.proxy_var_names(env)
    assert names == ["NO_PROXY", "https_proxy"]
    assert "hunter2" not in repr(names)


def test_proxy_findings_never_quote_values():
    env = {"https_proxy": "http://user:hunter2@proxy:3128", "no_proxy": "*.corp.example", "NO_PROXY": ""}
    out = ec.proxy_findings(env, ["*.x.cn"])
    assert {"no_proxy_casing", "no_proxy_wildcard"} <= set(ids(out))
    assert "hunter2" not in repr(out) and "corp.example" not in repr(out)


def test_stale_no_proxy_without_proxy_is_reported():
    assert ids(ec.proxy_findings({"no_proxy": ".a.cn"}, [])) == ["no_proxy_without_proxy"]


def test_env_changes_lists_names_and_ignores_shell_bookkeeping():
    before = {"PATH": "/bin", "PWD": "/", "HOME": "/root"}
    after = {"PATH": "/opt/bin:/bin", "PWD": "/tmp", "HOME": "/root", "https_proxy": "http://x", "SHLVL": "2"}
    assert ec.env_changes(before, after) == ["PATH", "https_proxy"]


def test_parse_env0_handles_values_with_equals_and_newlines():
    data = b"A=1\0B=x=y\0C=line1\nline2\0BASH_FUNC_f%%=() {  true\n}\0"
    env = ec.parse_env0(data)
    assert env["A"] == "1" and env["B"] == "x=y" and env["C"] == "line1\nline2"


@pytest.mark.parametrize("name,ok", [("WANDB_API_KEY", True), ("_x1", True), ("1ABC", False),
                                     ("A-B", False), ("A B", False), ("", False)])
def test_valid_env_name(name, ok):
    assert ec.valid_env_name(name) is ok


# CRLF: the rule lives in rgt_tree (tests/unit/test_rgt_tree.py), shared with upload_resume.


# ---------------------------------------------------------------- the interpreter the command runs

@pytest.mark.parametrize("command, words", [
    ("python train.py --steps 3", ["python"]),
    ("CUDA_VISIBLE_DEVICES=0 python3 train.py && python3.11 eval.py | tee log", ["python3", "python3.11"]),
    ("cd sub; exec python -m pkg", ["python"]),
    ("env FOO=1 time python a.py --mode python", ["python"]),
    ("/usr/bin/python3 prep.py\npython train.py", ["/usr/bin/python3", "python"]),
    ("torchrun --nproc_per_node 2 train.py", []),
    ("bash -c 'python inner.py'", []),   # inside another shell: not judged
    ("echo 'open quote", []),
])
def test_the_interpreters_a_command_runs_by_name(command, words):
    assert ec.command_interpreters(command) == words


def test_an_interpreter_outside_the_declared_directory_is_a_warning(tmp_path):
    where = {"python": "/root/.pyenv/shims/python", "python3": "/usr/bin/python3"}
    found = ec.command_findings("python train.py && python3 eval.py", "/usr/bin/python3", where.get)
    assert [(f["id"], f["severity"], f["data"]["word"]) for f in found] == [("command_interpreter", "warning",
                                                                              "python")]
    assert "/root/.pyenv/shims/python on the job's PATH" in found[0]["message"]
    assert "python3 train.py" in found[0]["fix"]
    missing = ec.command_findings("python train.py", "/usr/bin/python3", lambda word: None)
    assert "not found on the job's PATH" in missing[0]["message"]
    # the declared directory has the name: the job runs the interpreter env_check examined
    assert ec.command_findings("python train.py", "/opt/env/bin/python3", {"python": "/opt/env/bin/python"}.get) == []
    assert ec.command_findings("./venv/bin/python x.py", "/usr/bin/python3", lambda word: None) == []
