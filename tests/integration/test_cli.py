"""`rgt-run` follows its ecosystem: a listing of subcommands when none is given, `--version`, help in the user's
words, shell completion (argcomplete), and `-C` on train as a real dry run (the plan per host, nothing touched).
Everything here runs on this machine (local profile), as a user would run it: `python -m rgt.cli`."""

import json
import os
import subprocess
import sys
import tomllib
from importlib import metadata
from pathlib import Path

from clihelp import write_inventory

REPO = Path(__file__).resolve().parents[2]
LOCAL_INV = REPO / "inventories" / "local"
SUBCOMMANDS = ["init", "profiles", "pin", "smoke", "probe", "env_check", "train", "status", "watch", "pull",
               "teardown", "lifecycle", "runs"]
# what a --help must not say: design-doc references, rgt's module names, the variables the runner sets itself
INTERNALS = ["design.md", "§", "internals.md", "rgt_status", "rgt_gate", "rgt_tree", "teardown_plan_only",
             "module", "rgt.cli", "monitor.yml", "launch_detached.yml"]


def tree_lib():
    from rgt import paths

    return paths.module_util("rgt_tree")


# ---------------------------------------------------------------- listing, errors, version, help

def test_no_command_lists_every_subcommand_with_one_line_and_exits_2(rgt):
    result = rgt()
    assert result.rc == 2, result.stderr
    lines = result.stderr.splitlines()
    for name in SUBCOMMANDS:
        row = [ln for ln in lines if ln.startswith(f"  {name} ")]
        assert row and len(row[0].split(None, 1)) == 2, f"no one-line entry for {name}:\n{result.stderr}"
    assert "no command given" in result.stderr and "Traceback" not in result.stderr


def test_no_command_under_json_is_one_error_document(rgt):
    result = rgt("--json")
    assert result.rc == 2
    doc = result.doc
    assert set(doc) == {"command", "error", "fix", "field", "exit_code"}
    assert doc["exit_code"] == 2 and doc["field"] == "command" and "status" in doc["fix"]
    assert "  status " in result.stderr  # the listing goes to people, on stderr


def test_an_unknown_command_lists_the_subcommands_and_suggests_the_closest(rgt):
    result = rgt("lifecyle", "--json")
    assert result.rc == 2
    assert "did you mean `lifecycle`" in result.doc["fix"]
    assert "  lifecycle " in result.stderr and "  pull " in result.stderr


def test_version_prints_the_package_version(rgt):
    try:
        expected = metadata.version("rgt")
    except metadata.PackageNotFoundError:
        expected = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    result = rgt("--version")
    assert result.rc == 0, result.stderr
    assert result.stdout.strip() == f"rgt-run {expected}"


def test_a_subcommand_help_speaks_the_users_words(rgt):
    """(every subcommand's --help is checked in-process by tests/unit/test_cli_parser.py; this one end to end)"""
    result = rgt("teardown", "--help")
    assert result.rc == 0, result.stderr
    assert result.stdout.startswith("usage: rgt-run teardown") and "--confirm INSTANCE_ID" in result.stdout
    for word in INTERNALS:
        assert word not in result.stdout, f"`rgt-run teardown --help` says {word!r}:\n{result.stdout}"


# ---------------------------------------------------------------- shell completion

def complete(line: str, tmp_path: Path, cwd: Path = REPO) -> list[str]:
    """What the shell would offer for `line` (argcomplete's protocol: the answer is written to fd 8)."""
    out = tmp_path / "completion.out"
    env = {**os.environ, "_ARGCOMPLETE": "1", "COMP_LINE": line, "COMP_POINT": str(len(line)),
           "_ARGCOMPLETE_IFS": "\n"}
    proc = subprocess.run(["bash", "-c", 'exec 8>"$1"; shift; exec "$@"', "_", str(out), sys.executable, "-m",
                           "rgt.cli"], env=env, capture_output=True, text=True, timeout=60, cwd=cwd)
    assert proc.returncode == 0, proc.stderr
    return [item.strip() for item in out.read_text().split("\n") if item.strip()]


def test_completion_offers_subcommands(tmp_path):
    assert complete("rgt-run st", tmp_path) == ["status"]
    assert set(SUBCOMMANDS) <= set(complete("rgt-run ", tmp_path))


def test_completion_offers_profile_names(tmp_path):
    assert complete("rgt-run init --profile run", tmp_path) == ["runpod"]
    assert "vastai" in complete("rgt-run profiles show v", tmp_path)


def test_completion_offers_the_hosts_of_the_inventory_given_with_i(tmp_path):
    inv = write_inventory(tmp_path / "inv", {"gpu-a": {"rgt_profile": "local"}, "gpu-b": {}, "cpu-c": {}})
    assert complete(f"rgt-run status -i {inv} -l gpu", tmp_path) == ["gpu-a", "gpu-b"]
    assert complete(f"rgt-run pull -i {inv} -l gpu-a,", tmp_path) == ["gpu-a,cpu-c", "gpu-a,gpu-b"]


# ---------------------------------------------------------------- -C: the plan of a fresh run

def test_check_on_train_prints_the_plan_and_touches_nothing(rgt, tmp_path):
    """-C on the embedded local inventory: code-<hash8> as the upload would name it, exit 0, no durable root made,
    no ledger entry (no upload, no phase event)."""
    expected = tree_lib().build_manifest(str(REPO / "examples" / "tiny_train"))
    result = rgt("train", "-i", LOCAL_INV, "-C", "--json", cwd=tmp_path)
    assert result.rc == 0, result.stderr
    doc = result.doc
    assert doc["command"] == "plan" and doc["exit_code"] == 0
    plan = doc["hosts"]["localhost"]
    assert plan["hash8"] == expected["hash8"]
    assert (plan["files"], plan["bytes"]) == (expected["files"], expected["bytes"])
    durable = tmp_path / ".rgt" / "local-box" / "durable"
    assert plan["run_dir"] == str(durable / "tiny_train" / "active" / "tiny-train")
    assert plan["code_dir"] == f"{plan['run_dir']}/code-{expected['hash8']}"
    assert plan["command"].startswith("python train.py") and plan["disk_floor_gib"] == 0.1
    assert f"code-{expected['hash8']}" in result.stderr
    assert not durable.exists() and not (tmp_path / ".rgt" / "local-box").exists()
    assert not (rgt.ledger / "uploads").exists() and not (rgt.ledger / "events").exists()


def test_check_on_an_unreachable_box_still_plans_with_price_and_cost(rgt, tmp_path):
    """No box is contacted: a box whose SSH port is closed gets its plan all the same, priced."""
    code = tmp_path / "code"
    code.mkdir()
    (code / "train.py").write_text("print('hi')\n")
    job = {"name": "priced", "command": "python train.py", "python": "/usr/bin/python3", "code_dir": str(code),
           "price_per_hour": 2.0, "expected_duration_s": 5400}
    inv = write_inventory(tmp_path / "inv", {"gone": {
        "ansible_host": "127.0.0.1", "ansible_port": 1, "ansible_user": "nobody", "rgt_profile": "runpod",
        "rgt_instance_id": "pod-gone"}})
    (inv / "known_hosts").write_text("pod-gone ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIHw9\n")
    result = rgt("playbooks/train.yml", "-i", inv, "-e", json.dumps({"rgt_job": job}), "-C", "--json", timeout=120)
    assert result.rc == 0, result.stderr
    plan = result.doc["hosts"]["gone"]
    assert plan["hash8"] == tree_lib().build_manifest(str(code))["hash8"]
    assert plan["durable_root"] == "/workspace"  # the runpod profile's durable root
    assert plan["run_dir"] == "/workspace/rgt/active/priced"
    assert plan["price_per_hour"] == 2.0 and plan["expected_cost"] == 3.0 and plan["disk_floor_gib"] == 1
    assert "3.00" in result.stderr
    assert not (rgt.ledger / "events").exists()


def test_check_on_train_prints_the_plan_on_stdout_and_its_messages_on_stderr(rgt, tmp_path):
    """The plan is the command's result: stdout, whole rows (no fold in a pipe); the header and the exit line are
    messages: stderr."""
    expected = tree_lib().build_manifest(str(REPO / "examples" / "tiny_train"))
    result = rgt("train", "-i", LOCAL_INV, "-C", cwd=tmp_path)
    assert result.rc == 0, result.stderr
    run_dir = tmp_path / ".rgt" / "local-box" / "durable" / "tiny_train" / "active" / "tiny-train"
    rows = result.stdout.splitlines()
    assert any(row.startswith("code dir") and row.rstrip().endswith(f"{run_dir}/code-{expected['hash8']}")
               for row in rows), result.stdout
    assert any(row.startswith("run dir") and str(run_dir) in row for row in rows), result.stdout
    assert "rgt plan for train" in result.stderr and "exit 0" in result.stderr
    assert f"code-{expected['hash8']}" not in result.stderr and "rgt plan" not in result.stdout


# ---------------------------------------------------------------- results on stdout, messages on stderr

def table_rows(text: str) -> dict[str, str]:
    """{first cell: the whole line} of a rich table's rows."""
    return {line.split("│")[1].strip(): line for line in text.splitlines() if line.count("│") >= 3}


def test_profiles_in_a_pipe_prints_whole_rows_on_stdout_and_nothing_on_stderr(rgt):
    result = rgt("profiles")
    assert result.rc == 0, result.stderr
    assert result.stderr == ""
    rows = table_rows(result.stdout)
    assert {"autodl", "runpod", "kubernetes", "local"} <= set(rows), result.stdout
    # one row per profile, every word whole on it (`rgt-run profiles | grep autodl` finds the whole row)
    assert [ln for ln in result.stdout.splitlines() if "autodl" in ln] == [rows["autodl"]]
    assert "ssh-rental" in rows["runpod"] and "terminate" in rows["runpod"] and "2026-06" in rows["runpod"]
    assert "power_off (关机)" in rows["autodl"]


def test_profiles_show_fills_every_placeholder_and_json_keeps_stdout_for_the_document(rgt):
    result = rgt("profiles", "show", "runpod")
    assert result.rc == 0, result.stderr
    assert result.stderr == ""
    assert "needs env RUNPOD_API_KEY; profile meter_stop.api.base_url" in result.stdout
    assert "<meter_stop" not in result.stdout
    # a long cell stays on its row in a pipe
    assert any("4 TB soft ceiling" in ln and "high-performance $0.14" in ln for ln in result.stdout.splitlines())
    as_json = rgt("profiles", "show", "runpod", "--json")
    assert as_json.rc == 0, as_json.stderr
    doc = as_json.doc
    assert doc["profile"]["engines"]["meter_stop"]["env"] == ["RUNPOD_API_KEY"]
    assert "needs env RUNPOD_API_KEY" in as_json.stderr  # the human rendering goes to stderr under --json


def test_init_for_kubernetes_writes_a_cluster_whose_next_steps_work(rgt, tmp_path):
    """No SSH host or port, the kubeconfig and context named, the job's k8s block; the plan it points to exits 0."""
    import shlex

    import yaml

    init = rgt("init", "--profile", "kubernetes", "--json", cwd=tmp_path)
    assert init.rc == 0, init.stderr
    text = (tmp_path / "inventory" / "hosts.yml").read_text()
    ((name, host),) = yaml.safe_load(text)["all"]["hosts"].items()
    assert host["rgt_profile"] == "kubernetes" and host["rgt_instance_id"]
    assert not [key for key in host if key.startswith("ansible_")], host
    assert "# rgt_kubeconfig:" in text and "# rgt_kube_context:" in text
    job = yaml.safe_load((tmp_path / "job.yml").read_text())["rgt_job"]
    assert job["k8s"]["image"] and job["k8s"]["pvc"] == {"storage": "50Gi"}
    steps = init.doc["next"]
    assert not [s for s in steps if " pin " in s or "probe" in s], steps
    (plan_step,) = [s for s in steps if s.endswith(" -C")]
    plan = rgt(*shlex.split(plan_step)[1:], cwd=tmp_path, timeout=120)
    assert plan.rc == 0, plan.stdout + plan.stderr
    assert f"{name} (kubernetes, instance {host['rgt_instance_id']})" in plan.stdout
    assert "kubernetes manifests for /checkpoints/rgt/active/my-run/.rgt/k8s/" in plan.stdout


def test_a_missing_controller_program_is_named_before_any_box_is_touched(rgt, tmp_path):
    """rsync (train moves the code with it), ssh (status reaches a box with it), kubectl (a cluster): exit 2 with
    the program and the Debian package, before anything is written or contacted."""
    bare = tmp_path / "bin"  # a PATH without them (rgt's own Ansible is found beside its Python)
    bare.mkdir()
    env = {"PATH": str(bare)}
    train = rgt("train", "-i", LOCAL_INV, "--json", env=env, cwd=tmp_path)
    assert train.rc == 2, train.stderr
    assert train.doc["field"] == "rsync" and "rsync is not installed" in train.doc["error"]
    assert "apt-get install rsync" in train.doc["fix"] and "Traceback" not in train.stderr
    assert not (tmp_path / ".rgt").exists() and not rgt.ledger.exists()

    inv = write_inventory(tmp_path / "inv", {
        "gone": {"ansible_host": "127.0.0.1", "ansible_port": 1, "rgt_profile": "generic_ssh",
                 "rgt_instance_id": "box-gone", "rgt_job": {"name": "r"}},
        "cluster": {"rgt_profile": "kubernetes", "rgt_instance_id": "gke", "rgt_job": {"name": "r"}}})
    (inv / "known_hosts").write_text("box-gone ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIHw9\n")
    status = rgt("status", "-i", inv, "-l", "gone", "--json", env={**env, "RGT_KUBECTL": ""}, cwd=tmp_path)
    assert status.rc == 2 and status.doc["field"] == "ssh", status.stderr
    assert "apt-get install openssh-client" in status.doc["fix"] and "gone" in status.doc["error"]
    cluster = rgt("status", "-i", inv, "-l", "cluster", "--json", env={**env, "RGT_KUBECTL": ""}, cwd=tmp_path)
    assert cluster.rc == 2 and cluster.doc["field"] == "kubectl", cluster.stderr
    assert "kubernetes-client" in cluster.doc["fix"]
    assert not rgt.ledger.exists()
