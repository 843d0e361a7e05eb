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
from clihelp import wait_for

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


# ---------------------------------------------------------------- every run launched to a box, without -e

SWEEP_CELLS = ("abl--seed=1", "abl--seed=2")
FAIL_FLAG = "fail-seed-2"  # in the project dir: cell seed=2 fails while it is there


def _kill_started(durable: Path, tmux_dir: Path) -> None:
    """Every wrapper and job this test started (by the pids they recorded) and its private tmux server."""
    import signal

    for pid_file in durable.glob("*/active/*/.rgt/pid"):
        doc = json.loads(pid_file.read_text() or "{}")
        for key in ("job_pid", "wrapper_pid"):
            try:
                os.killpg(int(doc[key]), signal.SIGKILL) if key == "job_pid" else os.kill(int(doc[key]), 9)
            except (KeyError, TypeError, ValueError, OSError):
                pass
    subprocess.run(["tmux", "kill-server"], capture_output=True, env={**os.environ, "TMUX_TMPDIR": str(tmux_dir)})
    shutil.rmtree(tmux_dir, ignore_errors=True)


def _exit_doc(run_dir: Path) -> dict | None:
    try:
        return json.loads((run_dir / ".rgt" / "exit.json").read_text())
    except (OSError, ValueError):
        return None


def test_every_run_launched_to_a_box_is_remembered_and_acted_on_without_a_job_spec(tmp_path, monkeypatch):
    """A sweep and then a single run on one box (this machine). Without -e every command acts on all of them:
    status lists each and tallies the sweep, watch resumes the preempted single run and restarts the sweep's dead
    queue, retry finds the cell's sweep, pull pulls each; -e narrows to one job (the sweep is not counted
    missing) and lifecycle on a finished run goes straight to pull. A damaged ledger record is refused naming the
    file; a lost roster is not guessed again on a new host: the box's roster wins."""
    import signal
    import tempfile

    tmux_dir = Path(tempfile.mkdtemp(prefix="rgt-tmux-", dir="/tmp"))  # short: a unix socket path
    monkeypatch.setenv("TMUX_TMPDIR", str(tmux_dir))
    proj = tmp_path / "proj"
    (proj / "inventory").mkdir(parents=True)
    shutil.copy(TINY, proj / "train.py")
    durable = proj / "box"

    def box(name: str) -> dict:
        return {"ansible_connection": "local", "ansible_python_interpreter": sys.executable, "rgt_profile": "local",
                "rgt_instance_id": "localhost", "rgt_project": "proj", "rgt_shared_volume": True,
                "rgt_durable_root": str(proj / name)}

    (proj / "inventory" / "hosts.yml").write_text(yaml.safe_dump({"all": {"hosts": {"box1": box("box")}}}))
    base = {"python": sys.executable, "code_dir": ".", "outputs": ["weights.bin"], "auto_resume": True,
            "checkpoint": {"glob": "step_*.ckpt"}, "disk_floor_gib": 0, "gpu": {"count": 0}}
    (proj / "sweep.yml").write_text(yaml.safe_dump({"rgt_job": {
        **base, "name": "abl",
        "command": 'test ! -e "$FAIL" || exit 3; python train.py --steps 8 --ckpt-every 4 --sleep 0.3',
        "sweep": {"matrix": {"seed": [1, 2]}, "args": "--seed {seed}",
                  "env": {"FAIL": f"{proj}/fail-seed-{{seed}}"}, "gpus_per_cell": 0, "parallel": 1, "poll_s": 0.2}}}))
    (proj / "solo.yml").write_text(yaml.safe_dump({"rgt_job": {
        **base, "name": "solo", "command": "python train.py --steps 150 --ckpt-every 5 --sleep 0.05"}}))
    (proj / FAIL_FLAG).write_text("")
    cell_dir = {c: durable / "proj" / "active" / c for c in SWEEP_CELLS}
    solo_dir = durable / "proj" / "active" / "solo"
    launch = ("playbooks/train.yml", "-i", "inventory", "-t", "upload_resume,launch_detached")
    try:
        trained = rgt_in(proj, *launch, "-e", "@sweep.yml", "--json")
        assert trained.returncode == 0, trained.stderr[-3000:]
        # the box's queue dies (killed without a word) while its first cell runs: the other never starts
        queue = json.loads((durable / "proj" / "sweeps" / "abl" / ".rgt" / "queue-state.json").read_text())
        os.kill(queue["pid"], signal.SIGKILL)
        wait_for(lambda: _exit_doc(cell_dir["abl--seed=1"]), 90, "the first cell to finish", 0.2)
        solo = rgt_in(proj, *launch, "-e", "@solo.yml", "--json")
        assert solo.returncode == 0, solo.stderr[-3000:]
        wait_for(lambda: list((solo_dir / "ckpt").glob("step_*.ckpt")), 90, "a first checkpoint of solo", 0.2)
        os.kill(json.loads((solo_dir / ".rgt" / "pid").read_text())["wrapper_pid"], signal.SIGTERM)
        assert wait_for(lambda: _exit_doc(solo_dir), 90, "solo to stop", 0.2)["reason"] == "preempted"

        # no -e: every run of the box, the newest first, and the sweep's tally
        status = rgt_in(proj, "status", "-i", "inventory", "--json")
        doc = one_doc(status)["hosts"]["box1"]
        seen = {doc["run_id"]: doc, **{o["run_id"]: o for o in doc.get("other_runs", [])}}
        assert doc["run_id"] == "solo" and set(seen) == {"solo", *SWEEP_CELLS}, status.stderr[-3000:]
        assert {r: d["state"] for r, d in seen.items()} == {"solo": "preempted", "abl--seed=1": "finished",
                                                            "abl--seed=2": "not_started"}
        assert "gone without a word" in seen["abl--seed=2"]["queue_reason"]
        assert "sweep abl: 1/2 finished, 1 missing (abl--seed=2)" in status.stderr
        assert status.returncode == 1  # a run preempted, a cell never started

        # -e narrows to that job: the sweep's cells were not looked at, so they are not counted missing
        only = one_doc(rgt_in(proj, "status", "-i", "inventory", "-e", "@solo.yml", "--json"))
        assert only["hosts"]["box1"]["run_id"] == "solo" and "other_runs" not in only["hosts"]["box1"]
        assert only["sweeps"] == []

        # a damaged record is refused naming the file; nothing is guessed and nothing overwritten
        record = proj / ".rgt" / "runs" / "box1.json"
        kept = record.read_bytes()
        record.write_bytes(kept[:len(kept) // 2])
        broken = rgt_in(proj, "status", "-i", "inventory", "--json")
        assert broken.returncode == 2 and str(record) in broken.stderr and "move it away" in broken.stderr
        assert one_doc(broken)["exit_code"] == 2 and record.read_bytes() == kept[:len(kept) // 2]
        record.write_bytes(kept)

        # watch resumes the preempted run and starts the sweep's queue again, by run; the failing cell is reported
        watch = rgt_in(proj, "watch", "-i", "inventory", "--interval", "1", "--max-ticks", "90", "--json")
        watched = one_doc(watch)
        assert watch.returncode == 1, watch.stderr[-4000:]
        (relaunch,) = watched["relaunches"]
        assert sorted(relaunch["runs"]) == ["abl--seed=2", "solo"] and relaunch["exit_code"] == 0
        assert watched["sweeps"][0]["counts"] == {"finished": 1, "failed": 1}, watched["sweeps"]
        assert _exit_doc(cell_dir["abl--seed=2"])["rc"] == 3  # it ran once the queue was started again
        assert _exit_doc(solo_dir)["reason"] == "finished" and _exit_doc(solo_dir)["attempt"] == 2

        # retry without -e, as the README writes it: the ledger knows the cell's sweep and box
        (proj / FAIL_FLAG).unlink()
        retried = rgt_in(proj, "retry", "-i", "inventory", "abl--seed=2", "--json")
        assert retried.returncode == 0 and one_doc(retried)["state"] in ("queued", "running"), retried.stderr[-3000:]
        done = rgt_in(proj, "watch", "-i", "inventory", "--interval", "1", "--max-ticks", "60", "--json")
        assert done.returncode == 0 and one_doc(done)["sweeps"][0]["done"] is True, done.stderr[-3000:]

        # pull without -e pulls every run of the box, each verified
        pulled = rgt_in(proj, "pull", "-i", "inventory", "--json")
        assert pulled.returncode == 0, pulled.stderr[-4000:]
        entry = one_doc(pulled)["hosts"]["box1"]
        assert sorted(entry["runs"]) == sorted(["solo", *SWEEP_CELLS]) and entry["verified"] is True
        for run_id in ("solo", *SWEEP_CELLS):
            assert (proj / "runs" / run_id / "box1.PULL_VERIFIED.json").is_file(), run_id
        swept = json.loads((proj / "runs" / "abl" / "box1.SWEEP_VERIFIED.json").read_text())
        assert sorted(swept["cells"]) == list(SWEEP_CELLS)

        # lifecycle again on a finished run: straight to pull (no smoke, probe, env_check or upload again)
        trains = sorted((proj / ".rgt" / "events").glob("*-train-*.jsonl"))
        life = rgt_in(proj, "lifecycle", "-i", "inventory", "-e", "@solo.yml", "--interval", "1", "--json")
        lived = one_doc(life)
        assert life.returncode == 0, life.stderr[-4000:]
        assert lived["resumed_at"] == "pull" and [p["phase"] for p in lived["phases"]] == ["pull", "teardown"]
        assert "resuming at pull (solo: finished)" in life.stderr
        assert sorted((proj / ".rgt" / "events").glob("*-train-*.jsonl")) == trains, "no train play ran"

        # a truncated roster with a new host in the play: refused naming the file, the new box untouched
        (proj / "inventory" / "hosts.yml").write_text(yaml.safe_dump({"all": {"hosts": {
            "box0": box("box0"), "box1": box("box")}}}))
        roster = proj / ".rgt" / "sweeps" / "proj" / "abl.json"
        whole = roster.read_bytes()
        roster.write_bytes(whole[:200])
        again = rgt_in(proj, "playbooks/train.yml", "-i", "inventory", "-t", "launch_detached", "-e", "@sweep.yml",
                       "--json")
        assert again.returncode == 2 and str(roster) in again.stderr, again.stderr[-3000:]
        assert roster.read_bytes() == whole[:200] and not (proj / "box0").exists()
        # the whole ledger's memory of the sweep lost: the box's own roster keeps every cell on box1
        roster.unlink()
        record.unlink()
        again = rgt_in(proj, "playbooks/train.yml", "-i", "inventory", "-t", "launch_detached", "-e", "@sweep.yml",
                       "--json")
        assert "gives this host no cells" in again.stderr, again.stderr[-3000:]
        assert not list((proj / "box0").glob("*/active/*/.rgt/job.json")), "no cell was placed on the new box"
        placed = json.loads(roster.read_text())["hosts"]
        assert placed == {"box0": [], "box1": list(SWEEP_CELLS)}
    finally:
        _kill_started(durable, tmux_dir)
