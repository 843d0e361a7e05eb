"""Relative paths in a job spec follow the user (the file they were written in, else the cwd), never the
installation; the ledger remembers what was launched where."""

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
