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
