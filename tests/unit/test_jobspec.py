"""Relative paths in a job spec follow the user (the file they were written in, else the cwd), never the
installation; the ledger remembers what was launched where; what the schema cannot say is refused at input (exit 2,
the field named)."""

from pathlib import Path

import pytest
import yaml

from rgt import jobspec, memory
from rgt.errors import InputError
from rgt.init import inventory_text, job_text
from rgt.inventory import validate_job
from rgt.profiles import load_profile
from rgt.runs import rows


def test_a_job_file_resolves_against_its_own_directory(tmp_path):
    (tmp_path / "proj" / "src").mkdir(parents=True)
    base = jobspec.origin_dir("-e @proj/job.yml", cwd=tmp_path)
    assert base == (tmp_path / "proj").resolve()
    job = jobspec.resolve_paths({"code_dir": "src", "data_dir": "../data", "name": "x"}, base)
    assert job["code_dir"] == str((tmp_path / "proj" / "src").resolve())
    assert job["data_dir"] == str((tmp_path / "data").resolve())


def test_an_inline_job_resolves_against_the_current_directory(tmp_path):
    assert jobspec.origin_dir("-e on the command line", cwd=tmp_path) == tmp_path.resolve()
    assert jobspec.origin_dir(None, cwd=tmp_path) == tmp_path.resolve()


def test_absolute_paths_and_templates_are_kept(tmp_path):
    job = {"code_dir": "/abs/src", "data_dir": "{{ playbook_dir }}/data"}
    assert jobspec.resolve_paths(job, tmp_path) == job


def test_the_inventory_file_that_defines_the_job_is_the_base(tmp_path):
    inv = tmp_path / "inv"
    (inv / "group_vars").mkdir(parents=True)
    (inv / "host_vars").mkdir()
    (inv / "hosts.yml").write_text("all:\n  hosts:\n    a: {}\n    b: {}\n")
    (inv / "group_vars" / "all.yml").write_text("rgt_job:\n  code_dir: ../src\n")
    (inv / "host_vars" / "b.yml").write_text("rgt_job: {code_dir: mine}\n")
    assert jobspec.inventory_dir_of_job(inv, "a") == inv / "group_vars"
    assert jobspec.inventory_dir_of_job(inv, "b") == inv / "host_vars"
    plain = tmp_path / "plain"
    plain.mkdir()
    (plain / "hosts.yml").write_text("all:\n  hosts:\n    c: {}\n")
    assert jobspec.inventory_dir_of_job(plain / "hosts.yml", "c", cwd=tmp_path) == tmp_path.resolve()


def test_the_ledger_remembers_each_run_of_a_host(tmp_path):
    ledger = tmp_path / "ledger"
    memory.record_launch(ledger, "box", "pod-1", "proj", {"name": "a", "price_per_hour": 2.0},
                         {"action": "launch", "attempt": 1, "state": "running", "session": "rgt-proj/a"})
    memory.record_launch(ledger, "box", "pod-1", "proj", {"name": "b"}, {"action": "launch", "attempt": 1,
                                                                          "state": "running"})
    again = memory.record_launch(ledger, "box", "pod-1", "proj", {"name": "a", "price_per_hour": 2.0},
                                 {"action": "none", "attempt": 1, "state": "running"})
    assert {r["run_id"] for r in memory.runs_of(ledger, "box")} == {"a", "b"}
    assert again["launched_at"] and again["session"] is None
    listed = rows(ledger, tmp_path / "runs", now=9e9)
    assert {(r["host"], r["run_id"], r["pull"]) for r in listed} == {("box", "a", "not pulled"),
                                                                      ("box", "b", "not pulled")}
    priced = next(r for r in listed if r["run_id"] == "a")
    assert priced["cost_so_far"] > 0 and priced["state"] == "running"


def test_a_corrupt_memory_file_is_refused_naming_it(tmp_path):
    (tmp_path / "runs").mkdir()
    (tmp_path / "runs" / "box.json").write_text("{not json")
    with pytest.raises(InputError) as caught:
        memory.runs_of(tmp_path, "box")
    assert str(tmp_path / "runs" / "box.json") in caught.value.message and caught.value.exit_code == 2
    assert "move it away" in caught.value.fix


def test_init_writes_a_valid_inventory_and_job_for_every_profile():
    for name in ("local", "runpod", "autodl", "generic_ssh", "slurm"):
        profile = load_profile(name)
        inv = yaml.safe_load(inventory_text(profile).split("---\n", 1)[1])
        host = inv["all"]["hosts"]["box1"]
        assert host["rgt_profile"] == name and host["rgt_instance_id"]
        job = yaml.safe_load(job_text(profile))["rgt_job"]
        validate_job(job, f"init job.yml ({name})")
        assert Path(job["code_dir"]) == Path(".")


def test_an_unquoted_on_in_a_notify_rule_is_read_as_on():
    """YAML 1.1 reads `on:` as the boolean true (True in a -e file, "true" after ansible-inventory's JSON)."""
    import pytest

    from rgt.errors import InputError

    job = yaml.safe_load("name: x\nnotify:\n  - webhook_env: HOOK\n    on: [finished]\n  - command: 'true'\n")
    assert True in job["notify"][0]
    fixed = jobspec.with_notify_on(job)
    assert fixed["notify"] == [{"webhook_env": "HOOK", "on": ["finished"]}, {"command": "true"}]
    validate_job(fixed)
    assert jobspec.host_vars_notify_on({"rgt_notify": [{"command": "x", "true": ["failed"]}]}) == {
        "rgt_notify": [{"command": "x", "on": ["failed"]}]}
    unchanged = {"name": "x", "notify": [{"command": "x", "on": ["failed"]}]}
    assert jobspec.with_notify_on(unchanged) is unchanged
    with pytest.raises(InputError) as twice:
        jobspec.with_notify_on({"notify": [{"command": "x", "on": ["failed"], True: ["finished"]}]})
    assert twice.value.field == "rgt_job.notify[0].on"


# ---------------------------------------------------------------- refused at input: exit 2, the field named

def _refused(tmp_path, capsys, job: dict) -> dict:
    """`rgt-run train -C` with this job (a dry run: nothing could be touched anyway): exit 2 and one JSON error."""
    import json

    from rgt.cli import main

    spec = tmp_path / "job.yml"
    spec.write_text(yaml.safe_dump({"rgt_job": {"name": "big", "command": "python t.py", "code_dir": ".", **job}}))
    inventory = Path(__file__).resolve().parents[2] / "inventories" / "local"
    rc = main(["train", "-i", str(inventory), "-e", f"@{spec}", "-C", "--json"])
    doc = json.loads(capsys.readouterr().out)
    assert rc == 2 and doc["exit_code"] == 2, doc
    return doc


def test_a_sweep_past_the_cap_is_refused_with_its_count_and_the_cap(tmp_path, capsys):
    from ansible_collections.rgt.remote_gpu.plugins.module_utils import rgt_sweep

    doc = _refused(tmp_path, capsys, {"sweep": {"matrix": {k: list(range(10)) for k in "abcd"}}})
    assert doc["field"] == "rgt_job.sweep"
    assert "10000 cells" in doc["error"] and f"cap of {rgt_sweep.MAX_CELLS}" in doc["error"], doc["error"]
    assert str(rgt_sweep.MAX_CELLS) in doc["fix"]


@pytest.mark.parametrize("extra, index, named", [
    (["--constraint=a100", "--job-name=mine"], 1, "--job-name"),
    (["--comm=x"], 0, "--comment"),             # sbatch takes an unambiguous prefix
    (["--signal=USR1@60"], 0, "--signal"),
    (["--no-requeue"], 0, "rgt_job.slurm.requeue"),
    (["--output=/tmp/x.out"], 0, "--output"),
    (["--array=0-3"], 0, "--array"),
    (["--wrap=hostname"], 0, "--wrap"),
    (["--partition=debug"], 0, "rgt_job.slurm.partition"),
])
def test_a_slurm_extra_option_rgt_sets_itself_is_refused_naming_its_index(tmp_path, capsys, extra, index, named):
    doc = _refused(tmp_path, capsys, {"slurm": {"extra": extra}})
    assert doc["field"] == f"rgt_job.slurm.extra[{index}]"
    assert named in doc["error"] + doc["fix"]


def test_the_init_job_runs_the_interpreter_it_declares():
    """`python3 train.py` beside `python: /usr/bin/python3`: the name is looked up in that directory first (a box
    without /usr/bin/python would run another `python`)."""
    for name in ("local", "runpod", "autodl", "generic_ssh", "slurm"):
        job = yaml.safe_load(job_text(load_profile(name)))["rgt_job"]
        assert job["command"].split()[0] == Path(job["python"]).name, (name, job)
