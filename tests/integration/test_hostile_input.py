"""Careless or hostile input to `rgt-run`: one message naming the thing and the fix, the documented exit code, a
JSON error document under --json, and nothing touched (no phase runs, no ledger events, no box dir)."""

import json
import time

import pytest
from clihelp import write_inventory

LOCAL = {"ansible_connection": "local", "rgt_profile": "local", "rgt_instance_id": "localhost"}


def refused(result, *words, field=None):
    """exit 2, every word in the human message, one JSON error document naming the field."""
    assert result.rc == 2, result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    for word in words:
        assert word in result.stderr, result.stderr
    doc = result.doc
    assert doc["exit_code"] == 2 and doc["error"] and doc["fix"]
    if field:
        assert field in (doc["field"] or ""), doc
    return doc


def nothing_ran(rgt, tmp_path):
    assert not (rgt.ledger / "events").exists(), "no playbook may run on bad input"
    assert not (tmp_path / "durable").exists(), "nothing may be written on the box"


def inventory(tmp_path, **host):
    return write_inventory(tmp_path / "inv", {"box": {**LOCAL, "rgt_durable_root": str(tmp_path / "durable"),
                                                      **host}})


def good_job(**over):
    job = {"name": "ok-run", "command": "python train.py", "python": "/usr/bin/python3",
           "code_dir": "examples/tiny_train"}
    job.update(over)
    return {"rgt_job": job}


# ---------------------------------------------------------------- names that become paths and sessions

@pytest.mark.parametrize("run_id", ["..", ".", "ok\n", ".partial", "a/b", "x" * 129])
def test_run_ids_that_escape_the_layout_are_refused(rgt, tmp_path, run_id):
    result = rgt("playbooks/train.yml", "-i", inventory(tmp_path), "-e", json.dumps(good_job(run_id=run_id)),
                 "--json")
    refused(result, "run", field="rgt_job.run_id")
    nothing_ran(rgt, tmp_path)


def test_a_run_name_in_the_inventory_is_checked_the_same_way(rgt, tmp_path):
    inv = inventory(tmp_path, rgt_job={"name": "..", "command": "true"})
    refused(rgt("status", "-i", inv, "--json"), "'..'", field="rgt_job.name")
    nothing_ran(rgt, tmp_path)


@pytest.mark.parametrize("host", ["../../x", ".hidden", "a\nb"])
def test_host_names_used_in_ledger_paths_are_refused(rgt, tmp_path, host):
    inv = write_inventory(tmp_path / "inv", {host: {**LOCAL}})
    refused(rgt("status", "-i", inv, "--json"), "host name", field="host")
    nothing_ran(rgt, tmp_path)
    # where <ledger>/status/<host>.json would have landed for ../../x
    assert not (tmp_path / "x.json").exists() and not (rgt.ledger / "status").exists()


def test_a_project_of_dot_dot_is_refused(rgt, tmp_path):
    refused(rgt("status", "-i", inventory(tmp_path, rgt_project=".."), "--json"), field="rgt_project")


def test_env_names_are_posix_names(rgt, tmp_path):
    result = rgt("playbooks/train.yml", "-i", inventory(tmp_path),
                 "-e", json.dumps(good_job(env={"BAD=KEY": "1"})), "--json")
    refused(result, "BAD=KEY", field="rgt_job.env")
    nothing_ran(rgt, tmp_path)


# ---------------------------------------------------------------- files and paths in the job spec

@pytest.mark.parametrize("outputs", [["../secrets.txt"], ["/etc/passwd"], ["ok.bin", "a/../../b"]])
def test_outputs_outside_the_run_are_refused_before_anything_runs(rgt, tmp_path, outputs):
    result = rgt("playbooks/train.yml", "-i", inventory(tmp_path), "-e", json.dumps(good_job(outputs=outputs)),
                 "--json")
    refused(result, "outputs", field="rgt_job.outputs")
    nothing_ran(rgt, tmp_path)


def test_a_missing_code_dir_is_refused_before_the_smoke(rgt, tmp_path):
    spec = good_job(code_dir=str(tmp_path / "nope"), smoke_command=f"touch {tmp_path / 'smoked'}")
    result = rgt("playbooks/train.yml", "-i", inventory(tmp_path), "-e", json.dumps(spec), "--json")
    refused(result, "does not exist", field="rgt_job.code_dir")
    assert not (tmp_path / "smoked").exists()
    nothing_ran(rgt, tmp_path)


def test_a_smoke_with_no_smoke_command_says_so_instead_of_passing(rgt, tmp_path):
    result = rgt("smoke", "-e", json.dumps(good_job()), "--json")
    refused(result, "nothing to smoke", field="rgt_job.smoke_command")


def test_a_code_dir_that_is_a_file_is_refused(rgt, tmp_path):
    (tmp_path / "train.py").write_text("print(1)\n")
    result = rgt("smoke", "-e", json.dumps(good_job(code_dir=str(tmp_path / "train.py"), smoke_command="true")),
                 "--json")
    refused(result, "is a file", field="rgt_job.code_dir")


@pytest.mark.parametrize("field, value", [
    ("expected_duration_s", ".nan"), ("price_per_hour", ".inf"), ("disk_floor_gib", "-.inf"),
    ("expected_duration_s", "1.0e+300"), ("max_attempts", "100000000"), ("stall_after_s", "1.0e+30"),
])
def test_nan_infinities_and_absurd_numbers_are_refused(rgt, tmp_path, field, value):
    job = tmp_path / "job.yml"
    job.write_text(f"rgt_job:\n  name: ok-run\n  {field}: {value}\n")
    refused(rgt("status", "-i", inventory(tmp_path), "-e", f"@{job}", "--json"), field=f"rgt_job.{field}")


# ---------------------------------------------------------------- the -e file itself

def test_extra_vars_that_are_not_utf8_are_refused(rgt, tmp_path):
    job = tmp_path / "job.yml"
    job.write_bytes(b"rgt_job:\n  name: caf\xe9\n")
    refused(rgt("status", "-i", inventory(tmp_path), "-e", f"@{job}", "--json"), "UTF-8", "line 2", field="-e")


def test_a_yaml_alias_bomb_is_refused_quickly(rgt, tmp_path):
    lines = ['a: &a ["x","x","x","x","x","x","x","x","x"]']
    for prev, name in zip("abcdefgh", "bcdefghi", strict=True):
        lines.append(f"{name}: &{name} [" + ",".join([f"*{prev}"] * 9) + "]")
    bomb = tmp_path / "bomb.yml"
    bomb.write_text("\n".join(lines) + "\n")  # 9**9 = 387 million values once expanded
    started = time.monotonic()
    result = rgt("status", "-i", inventory(tmp_path), "-e", f"@{bomb}", "--json", timeout=120)
    refused(result, "aliases", field="-e")
    assert time.monotonic() - started < 60


def test_a_recursive_alias_is_refused(rgt, tmp_path):
    loop = tmp_path / "loop.yml"
    loop.write_text("rgt_loop: &l [*l]\n")
    refused(rgt("status", "-i", inventory(tmp_path), "-e", f"@{loop}", "--json"), "recursive", field="-e")


def test_extra_vars_file_missing_or_a_directory(rgt, tmp_path):
    refused(rgt("status", "-i", inventory(tmp_path), "-e", f"@{tmp_path / 'nope.yml'}", "--json"), "does not exist")
    refused(rgt("status", "-i", inventory(tmp_path), "-e", f"@{tmp_path}", "--json"), "not a file")


# ---------------------------------------------------------------- commands and flags

def test_a_mistyped_subcommand_lists_the_names(rgt, tmp_path):
    doc = refused(rgt("stauts", "-i", inventory(tmp_path), "--json"), "stauts", "status")
    assert "did you mean `status`" in doc["fix"] and "teardown" in doc["fix"] and "train" in doc["fix"]
    doc = refused(rgt("stauts", "--json"), "stauts")  # no -i: still the unknown command, not "-i is required"
    assert "status" in doc["fix"]


def test_no_command_and_bad_flags_are_input_errors(rgt, tmp_path):
    refused(rgt("--json"), "no command")
    refused(rgt("status", "--json"), "-i/--inventory")
    refused(rgt("watch", "-i", inventory(tmp_path), "--interval", "soon", "--json"), "--interval")
    refused(rgt("playbooks/nope.yml", "-i", inventory(tmp_path), "--json"), "nope.yml")


def test_a_runs_dir_that_is_a_file_is_refused_before_the_box_is_touched(rgt, tmp_path):
    runs = tmp_path / "runs-file"
    runs.write_text("not a dir")
    refused(rgt("pull", "-i", inventory(tmp_path), "--runs-dir", runs, "--json"), "is a file", field="--runs-dir")
    nothing_ran(rgt, tmp_path)


@pytest.mark.parametrize("argv, words", [
    (["watch", "--max-ticks", "0"], ["--max-ticks"]),
    (["status", "-e", '{"rgt_job": {"name": "x", "log_patterns": {"step": "("}}}'], ["regex"]),
    (["status", "-e", '{"rgt_job": {"name": "x", "python": "/usr/bin/python3\\n"}}'], ["control character"]),
])
def test_flags_and_fields_that_would_fail_late_are_refused_early(rgt, tmp_path, argv, words):
    refused(rgt(argv[0], "-i", inventory(tmp_path), *argv[1:], "--json"), *words)
    nothing_ran(rgt, tmp_path)


def test_an_empty_inventory_path_is_refused(rgt, tmp_path):
    refused(rgt("status", "-i", "", "--json", cwd=tmp_path), "does not exist", field="-i")


@pytest.mark.parametrize("record", [b'{"host": "gone", "state": "runn', b"\xff\xfe not json", b""])
def test_a_corrupt_ledger_record_does_not_hide_an_unreachable_host(rgt, tmp_path, record):
    """A truncated or garbled status record is not a fact: the unreachable host is still exit 4, and the record
    is rewritten whole."""
    inv = write_inventory(tmp_path / "inv", {"gone": {
        "ansible_host": "127.0.0.1", "ansible_port": 1, "ansible_user": "nobody", "rgt_profile": "generic_ssh",
        "rgt_instance_id": "box-gone", "rgt_durable_root": "/tmp", "rgt_job": {"name": "gone"}}})
    (inv / "known_hosts").write_text("box-gone ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIHw9\n")
    (rgt.ledger / "status").mkdir(parents=True)
    (rgt.ledger / "status" / "gone.json").write_bytes(record)
    result = rgt("status", "-i", inv, "--json")
    assert result.rc == 4, result.stderr
    assert "Traceback" not in result.stderr
    assert result.doc["hosts"]["gone"]["state"] == "unreachable"
    assert json.loads((rgt.ledger / "status" / "gone.json").read_text())["state"] == "unreachable"


def test_a_ledger_that_is_a_file_is_refused(rgt, tmp_path):
    ledger = tmp_path / "ledger-file"
    ledger.write_text("not a dir")
    refused(rgt("status", "-i", inventory(tmp_path), "--ledger", ledger, "--json"), "is a file", field="--ledger")
    assert ledger.read_text() == "not a dir"


# ---------------------------------------------------------------- secrets and confirmations

def test_a_missing_secret_is_named_before_anything_runs(rgt, tmp_path):
    spec = good_job(secrets=["RGT_TEST_MISSING_TOKEN"])
    result = rgt("playbooks/train.yml", "-i", inventory(tmp_path), "-e", json.dumps(spec), "--json",
                 env={"RGT_TEST_MISSING_TOKEN": ""})
    doc = refused(result, "RGT_TEST_MISSING_TOKEN", field="rgt_job.secrets")
    assert "RGT_TEST_MISSING_TOKEN" in doc["error"]
    nothing_ran(rgt, tmp_path)


@pytest.mark.parametrize("over, field", [
    ({"secrets": ["hf_Zq8pLmN3vXc7Rt2Wy5Ab9Kd4Ef6Gh1Jk"]}, "rgt_job.secrets"),  # passes the name pattern
    ({"secrets": ["sk-ant-Zq8pLmN3vXc7Rt2Wy5Ab9Kd4Ef6Gh1Jk"]}, "rgt_job.secrets[0]"),
    ({"env": {"HF_TOKEN": ["hf_Zq8pLmN3vXc7Rt2Wy5Ab9Kd4Ef6Gh1Jk"]}}, "rgt_job.env.HF_TOKEN"),
    ({"name": "hf_Zq8pLmN3vXc7Rt2Wy5Ab9Kd4Ef6Gh1Jk!"}, "rgt_job.name"),
])
def test_a_key_pasted_into_the_wrong_field_is_refused_without_repeating_it(rgt, tmp_path, over, field):
    result = rgt("playbooks/train.yml", "-i", inventory(tmp_path), "-e", json.dumps(good_job(**over)), "--json")
    refused(result, field=field)
    assert "Zq8pLmN3vXc7" not in result.stdout + result.stderr
    nothing_ran(rgt, tmp_path)


def test_a_teardown_confirmation_stored_in_the_inventory_is_refused(rgt, tmp_path):
    inv = write_inventory(tmp_path / "inv", {"box": {**LOCAL}}, group_vars={"rgt_teardown_confirm": "localhost"})
    result = rgt("teardown", "-i", inv, "--confirm", "localhost", "--json")
    refused(result, "group_vars", field="rgt_teardown_confirm")
    assert str(inv / "group_vars" / "all.yml") in result.doc["error"]
    nothing_ran(rgt, tmp_path)


def test_a_teardown_confirmation_in_a_vars_file_is_refused(rgt, tmp_path):
    vars_file = tmp_path / "vars.yml"
    vars_file.write_text("rgt_teardown_confirms: {box: localhost}\n")
    result = rgt("playbooks/teardown.yml", "-i", inventory(tmp_path), "-e", f"@{vars_file}", "--json")
    refused(result, str(vars_file), field="rgt_teardown_confirms")
    nothing_ran(rgt, tmp_path)


def test_two_hosts_sharing_an_instance_id_are_refused_unless_declared(rgt, tmp_path):
    hosts = {"a": {**LOCAL, "rgt_instance_id": "pod-1"}, "b": {**LOCAL, "rgt_instance_id": "pod-1"}}
    inv = write_inventory(tmp_path / "inv", hosts)
    refused(rgt("status", "-i", inv, "--json"), "share rgt_instance_id 'pod-1'", field="rgt_instance_id")
    declared = {name: {**hv, "rgt_shared_volume": True} for name, hv in hosts.items()}
    inv = write_inventory(tmp_path / "inv2", declared)
    result = rgt("status", "-i", inv, "-e", json.dumps({"rgt_job": {"name": "none-yet"}}), "--json")
    assert result.rc != 2, result.stderr  # accepted: the play runs (no run there yet)
