"""rgt used from the user's own project, as a user would: `rgt-run init` there, relative paths that follow the
file they were written in (never rgt's checkout or the cwd by accident), state under the user's directory, and
a run remembered in the ledger so later commands need no `-e @job.yml` again. Local profile only: seconds each."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]
TINY = REPO / "examples" / "tiny_train" / "train.py"


def rgt_in(cwd: Path, *args: str, timeout: int = 600) -> subprocess.CompletedProcess:
    """rgt-run from `cwd` with the user's defaults: no RGT_LEDGER/RGT_RUNS_DIR, so ./.rgt and ./runs apply."""
    env = {k: v for k, v in os.environ.items() if k not in ("RGT_LEDGER", "RGT_RUNS_DIR")}
    env["PWD"] = str(cwd)
    return subprocess.run([sys.executable, "-m", "rgt.cli", *map(str, args)], capture_output=True, text=True,
                          cwd=cwd, env=env, timeout=timeout, stdin=subprocess.DEVNULL)


def one_doc(proc: subprocess.CompletedProcess) -> dict:
    lines = [ln for ln in proc.stdout.splitlines() if ln.strip()]
    assert len(lines) == 1, proc.stdout + proc.stderr[-3000:]
    return json.loads(lines[0])


def make_project(root: Path, job_overrides: dict) -> Path:
    """`rgt-run init --profile local` in `root`, the example trainer as the user's code, job.yml edited."""
    root.mkdir(parents=True, exist_ok=True)
    init = rgt_in(root, "init", "--profile", "local")
    assert init.returncode == 0, init.stderr
    shutil.copy(TINY, root / "train.py")
    job_file = root / "job.yml"
    doc = yaml.safe_load(job_file.read_text())
    doc["rgt_job"].update(job_overrides)
    job_file.write_text(yaml.safe_dump(doc))
    return root


def test_init_writes_a_project_and_never_overwrites(tmp_path):
    proj = tmp_path / "proj"
    init = rgt_in(tmp_path, "init", "--profile", "runpod", "--dir", "proj", "--json")
    assert init.returncode == 0, init.stderr
    files = {Path(p).relative_to(proj).as_posix() for p in one_doc(init)["files"]}
    assert files == {"inventory/hosts.yml", "job.yml", ".rgtignore"}
    hosts = yaml.safe_load((proj / "inventory" / "hosts.yml").read_text())["all"]["hosts"]
    (host,) = hosts.values()
    assert host["rgt_profile"] == "runpod" and host["ansible_user"] == "root"
    job = yaml.safe_load((proj / "job.yml").read_text())["rgt_job"]
    assert job["code_dir"] == "." and job["secrets"] == []
    # the commented job.yml is a valid job spec as written
    from rgt.inventory import validate_job
    validate_job(job, "job.yml", proj)

    before = {p: p.read_bytes() for p in proj.rglob("*") if p.is_file()}
    again = rgt_in(tmp_path, "init", "--profile", "local", "--dir", "proj")
    assert again.returncode == 2 and "already exist" in again.stderr and "nothing was written" in again.stderr
    assert {p: p.read_bytes() for p in proj.rglob("*") if p.is_file()} == before


def test_the_whole_lifecycle_from_a_user_project_keeps_everything_in_that_project(tmp_path):
    proj = make_project(tmp_path / "proj", {
        "name": "mine", "command": "python train.py --steps 40 --ckpt-every 10 --sleep 0.05",
        "python": sys.executable, "outputs": ["weights.bin", "metrics.json"],
        "checkpoint": {"glob": "step_*.ckpt"}, "expected_duration_s": 2,
        "smoke_command": "python train.py --steps 2 --ckpt-every 1", "disk_floor_gib": 0.05})
    repo_runs = sorted(p.name for p in (REPO / "runs").iterdir()) if (REPO / "runs").is_dir() else []

    life = rgt_in(proj, "lifecycle", "-i", "inventory", "-e", "@job.yml", "--interval", "1", "--json")
    assert life.returncode == 0, life.stderr[-4000:]
    assert [p["phase"] for p in one_doc(life)["phases"]][:3] == ["train", "watch", "pull"]
    # state, ledger and the verified pull live in the user's project
    verified = json.loads((proj / "runs" / "mine" / "box1.PULL_VERIFIED.json").read_text())
    assert verified["run_id"] == "mine"
    assert (proj / "runs" / "mine" / "box1" / "out" / "weights.bin").is_file()
    assert list((proj / ".rgt" / "local-box" / "durable").glob("*/export/mine"))
    assert (proj / ".rgt" / "runs" / "box1.json").is_file()
    assert (sorted(p.name for p in (REPO / "runs").iterdir()) if (REPO / "runs").is_dir() else []) == repo_runs

    # remembered: runs lists it from the ledger, status finds it with no job spec given
    runs = one_doc(rgt_in(proj, "runs", "--json"))
    (row,) = runs["runs"]
    assert (row["host"], row["run_id"], row["state"], row["pull"], row["attempts"]) == \
        ("box1", "mine", "finished", "verified", 1)
    status = rgt_in(proj, "status", "-i", "inventory", "--json")
    assert status.returncode == 0, status.stderr[-3000:]
    doc = one_doc(status)["hosts"]["box1"]
    assert (doc["run_id"], doc["state"]) == ("mine", "finished")


def test_a_relative_code_dir_follows_the_job_file_not_the_current_directory(tmp_path):
    job_dir = tmp_path / "proj" / "jobs"
    (job_dir / "code").mkdir(parents=True)
    (job_dir / "job.yml").write_text(yaml.safe_dump({"rgt_job": {
        "name": "rel", "code_dir": "code", "smoke_command": "touch smoked-here", "smoke_timeout_s": 30}}))
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "code").mkdir()  # a same-named dir under the cwd must not be picked

    smoke = rgt_in(elsewhere, "smoke", "-e", f"@{job_dir / 'job.yml'}")
    assert smoke.returncode == 0, smoke.stderr[-3000:]
    assert (job_dir / "code" / "smoked-here").is_file()
    assert not (elsewhere / "code" / "smoked-here").exists()

    # a missing one is named with the path it resolved to
    (job_dir / "bad.yml").write_text(yaml.safe_dump({"rgt_job": {"name": "rel", "code_dir": "nope",
                                                                 "smoke_command": "true"}}))
    bad = rgt_in(elsewhere, "smoke", "-e", f"@{job_dir / 'bad.yml'}")
    assert bad.returncode == 2 and str(job_dir / "nope") in bad.stderr, bad.stderr


def test_an_inventory_job_resolves_against_the_file_that_defines_it(tmp_path):
    inv = tmp_path / "proj" / "inventory"
    (inv / "group_vars").mkdir(parents=True)
    (tmp_path / "proj" / "src").mkdir()
    (inv / "hosts.yml").write_text(yaml.safe_dump({"all": {"hosts": {"here": {
        "ansible_connection": "local", "ansible_python_interpreter": sys.executable,
        "rgt_profile": "local", "rgt_instance_id": "localhost"}}}}))
    (inv / "group_vars" / "all.yml").write_text(yaml.safe_dump({"rgt_job": {
        "name": "inv-job", "code_dir": "../../src", "smoke_command": "touch smoked-here", "smoke_timeout_s": 30}}))
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()

    smoke = rgt_in(elsewhere, "smoke", "-i", str(inv))
    assert smoke.returncode == 0, smoke.stderr[-3000:]
    assert (tmp_path / "proj" / "src" / "smoked-here").is_file()


def test_two_runs_on_one_box_are_both_remembered_and_shown_without_a_job_spec(tmp_path):
    proj = make_project(tmp_path / "proj", {"python": sys.executable, "outputs": ["weights.bin"],
                                            "checkpoint": {"glob": "step_*.ckpt"},
                                            "smoke_command": "python train.py --steps 1 --ckpt-every 1"})
    base = yaml.safe_load((proj / "job.yml").read_text())
    for name, steps in (("first", 20), ("second", 30)):
        spec = {"rgt_job": {**base["rgt_job"], "name": name,
                            "command": f"python train.py --steps {steps} --ckpt-every 10 --sleep 0.02"}}
        (proj / f"{name}.yml").write_text(yaml.safe_dump(spec))
        train = rgt_in(proj, "train", "-i", "inventory", "-e", f"@{name}.yml", "--json")
        assert train.returncode == 0, train.stderr[-3000:]

    listed = {(r["run_id"], r["host"]) for r in one_doc(rgt_in(proj, "runs", "--json"))["runs"]}
    assert listed == {("first", "box1"), ("second", "box1")}

    # no -e: the newest run, and the other one from the same round trip
    for _ in range(30):
        status = rgt_in(proj, "status", "-i", "inventory", "--json")
        doc = one_doc(status)["hosts"]["box1"]
        seen = {doc["run_id"]: doc["state"], **{o["run_id"]: o["state"] for o in doc.get("other_runs", [])}}
        if set(seen.values()) == {"finished"}:
            break
    assert seen == {"second": "finished", "first": "finished"}, seen
    assert doc["run_id"] == "second" and status.returncode == 0, status.stderr[-3000:]
    assert "first" in status.stderr and "second" in status.stderr  # both rows in the table

    # a job spec given still wins: only that run
    only = one_doc(rgt_in(proj, "status", "-i", "inventory", "-e", "@first.yml", "--json"))["hosts"]["box1"]
    assert only["run_id"] == "first" and "other_runs" not in only
