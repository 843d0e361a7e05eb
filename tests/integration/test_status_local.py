"""`status` and `watch` end to end: the runner, monitor.yml, the rgt_status module, against run layouts on disk.

Every host is this machine (connection local) with its own run under a temp durable root; a `sleep` process we
spawn stands in for a live wrapper. One extra host points SSH at a closed port to be unreachable.
"""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
PY = REPO / ".venv" / "bin" / "python"
sys.path.insert(0, str(REPO / ".collections"))
from ansible_collections.rgt.remote_gpu.plugins.module_utils import rgt_runlayout  # noqa: E402

pytestmark = pytest.mark.skipif(not (REPO / ".venv" / "bin" / "ansible-playbook").exists(),
                                reason="needs .venv with ansible-core")

RGT_RUN = [str(PY), "-m", "rgt.cli"]


class Runs:
    def __init__(self, root: Path):
        self.root = root
        self.durable = root / "durable"
        self.inv = root / "inv"
        self.ledger = root / "ledger"
        self.hosts = {}
        self.procs = []
        self.inc = rgt_runlayout.incarnation()

    def paths(self, run_id):
        return rgt_runlayout.RunPaths(str(self.durable), "rgt", run_id)

    def add(self, host, run_id, *, job=True, outputs=(), price=2.0, expected=None, auto_resume=False):
        self.hosts[host] = {"ansible_connection": "local", "ansible_python_interpreter": sys.executable,
                            "rgt_profile": "local", "rgt_instance_id": "localhost",
                            "rgt_durable_root": str(self.durable), "rgt_job": {"name": run_id},
                            "rgt_shared_volume": True}  # every host is this machine: one box, several runs
        p = self.paths(run_id)
        for d in (p.meta, p.logs, p.ckpt, p.out):
            os.makedirs(d, exist_ok=True)
        if job:
            rgt_runlayout.atomic_write_json(p.job, {
                "schema": 1, "run_id": run_id, "project": "rgt", "run_dir": p.run_dir, "outputs": list(outputs),
                "log_patterns": {}, "expected_duration_s": expected, "price_per_hour": price,
                "heartbeat_interval_s": 5, "stall_after_s": 600, "attempt_policy": {"auto_resume": auto_resume}})
        return p

    def wrapper(self, p, *, alive=True, incarnation=None, started=None, attempt=1):
        pid = 999999
        if alive:
            proc = subprocess.Popen(["sleep", "300"])
            self.procs.append(proc)
            pid = proc.pid
        inc = incarnation or self.inc
        rgt_runlayout.atomic_write_json(p.pid, {"wrapper_pid": pid, "job_pid": pid, "pgid": pid,
                                                "attempt": attempt, "incarnation": inc})
        rgt_runlayout.atomic_write_json(p.heartbeat, {"ts": time.time(), "attempt": attempt, "job_alive": alive})
        rgt_runlayout.append_jsonl(p.attempts, {"attempt": attempt, "started_at": started or time.time() - 3600,
                                                "code_dir": p.code_dir("abcd1234"), "resume_from": "",
                                                "incarnation": inc, "detach": "nohup"})

    def exit(self, p, reason, rc=0, attempt=1):
        now = time.time()
        rgt_runlayout.append_jsonl(p.attempts, {"attempt": attempt, "ended_at": now, "rc": rc, "signal": None,
                                                "reason": reason})
        rgt_runlayout.atomic_write_json(p.exit, {"attempt": attempt, "rc": rc, "signal": None, "reason": reason,
                                                 "ended_at": now, "stop_signal": None})

    def log(self, p, text):
        with open(p.log, "a") as fh:
            fh.write(text)

    def unreachable(self, host):
        self.hosts[host] = {"ansible_host": "127.0.0.1", "ansible_port": 1, "ansible_user": "nobody",
                            "rgt_profile": "generic_ssh", "rgt_instance_id": "box-gone",
                            "rgt_durable_root": "/tmp", "rgt_job": {"name": "gone"}}

    def write_inventory(self):
        self.inv.mkdir(parents=True, exist_ok=True)
        (self.inv / "hosts.yml").write_text(yaml.safe_dump({"all": {"hosts": self.hosts}}))
        (self.inv / "known_hosts").write_text("box-gone ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIHw9\n")

    def run(self, command, *args, timeout=180):
        proc = subprocess.run([*RGT_RUN, command, "-i", str(self.inv), "--ledger", str(self.ledger), *args],
                              capture_output=True, text=True, timeout=timeout, cwd=REPO)
        lines = [ln for ln in proc.stdout.splitlines() if ln.strip()]
        doc = None
        if "--json" in args:
            assert len(lines) == 1, f"exactly one JSON document on stdout, got {proc.stdout!r} / {proc.stderr}"
            doc = json.loads(lines[0])
        return proc.returncode, doc, proc.stderr

    def stop(self):
        for proc in self.procs:
            proc.kill()
            proc.wait()


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    r = Runs(tmp_path_factory.mktemp("status"))
    ok = r.add("live", "run-live")
    r.wrapper(ok)
    r.log(ok, "".join(f"step={i} loss={1.0 / i:.4f}\n" for i in range(1, 40)))
    fin = r.add("done", "run-done", outputs=["weights.bin"], expected=3600)
    r.wrapper(fin, alive=False, started=time.time() - 3000)
    (Path(fin.out) / "weights.bin").write_bytes(b"w")
    r.exit(fin, "finished")
    bad = r.add("crash", "run-crash")
    r.wrapper(bad, alive=False)
    r.exit(bad, "failed", rc=1)
    nan = r.add("nan", "run-nan")
    r.wrapper(nan, alive=False)
    r.log(nan, "step=1 loss=0.9\nstep=2 loss=0.8\nstep=3 loss=nan\nstep=4 loss=0.7\n")
    pre = r.add("restarted", "run-pre", auto_resume=True)
    r.wrapper(pre, alive=False, incarnation="other-boot:1")
    nojob = r.add("empty", "run-none", job=False)
    missing = r.add("noout", "run-noout", outputs=["model.pt"])
    r.wrapper(missing, alive=False)
    r.exit(missing, "finished")
    assert not Path(nojob.job).exists(), "the 'empty' host must have no job.json: it stands for a run never started"
    r.unreachable("gone")
    r.write_inventory()
    yield r
    r.stop()


def test_status_all_hosts_one_document_and_a_table(runs):
    rc, doc, err = runs.run("status", "--json")
    hosts = doc["hosts"]
    assert doc["command"] == "status"
    states = {h: d["state"] for h, d in hosts.items()}
    assert states == {"live": "running", "done": "finished", "crash": "failed", "nan": "dead",
                      "restarted": "preempted", "empty": "not_started", "noout": "failed", "gone": "unreachable"}
    assert rc == doc["exit_code"] == 5  # attention outranks failed and unreachable
    assert hosts["nan"]["nonfinite_loss"] == {"step": 3, "value": "nan"}
    assert [a["id"] for a in hosts["noout"]["attention"]] == ["outputs_missing"]
    assert hosts["restarted"]["evidence"]["incarnation_changed"] is True
    assert hosts["restarted"]["auto_resume"] is True
    assert hosts["live"]["step"] == 39 and hosts["live"]["evidence"]["wrapper_pid_alive"] is True
    assert hosts["live"]["cost_so_far"] == pytest.approx(2.0, rel=0.05)
    assert {m["path"] for m in hosts["live"]["mounts"]} == {str(runs.durable), "/"}
    assert "error" in hosts["gone"] and "attempt" not in hosts["gone"]
    for name in ("live", "done", "crash", "nan", "restarted", "empty", "noout", "gone"):
        assert name in err
    assert "nonfinite_loss" in err
    assert json.loads((runs.ledger / "status" / "live.json").read_text())["state"] == "running"
    assert (runs.ledger / "status" / "gone.jsonl").read_text().count("\n") >= 1


def test_exit_0_when_running_or_finished(runs):
    rc, doc, err = runs.run("status", "--json", "-l", "live,done")
    assert rc == 0 and doc["exit_code"] == 0
    assert set(doc["hosts"]) == {"live", "done"}
    assert "running" in err and "finished" in err


def test_exit_1_when_failed(runs):
    rc, doc, _ = runs.run("status", "--json", "-l", "crash")
    assert rc == 1 and doc["hosts"]["crash"]["evidence"]["exit"]["reason"] == "failed"


def test_exit_5_on_nan(runs):
    rc, doc, err = runs.run("status", "--json", "-l", "nan")
    assert rc == 5 and doc["hosts"]["nan"]["nonfinite_loss"]["step"] == 3
    assert "non-finite loss nan at step 3" in err


def test_unreachable_is_never_a_job_state_and_shows_last_seen(runs):
    from rgt.ledger import atomic_write_json

    atomic_write_json(runs.ledger / "status" / "gone.json",
                      {"host": "gone", "state": "running", "seen_at": time.time() - 180, "attempt": 1})
    rc, doc, err = runs.run("status", "--json", "-l", "gone")
    assert rc == 4
    gone = doc["hosts"]["gone"]
    assert gone["state"] == "unreachable"
    assert gone["last_seen"]["state"] == "running"
    assert "last seen: running 3 min ago" in err
    again = json.loads((runs.ledger / "status" / "gone.json").read_text())
    assert again["state"] == "unreachable" and again["last_seen"]["state"] == "running"


def test_watch_stops_when_every_run_is_settled(runs):
    started = time.monotonic()
    rc, doc, err = runs.run("watch", "--json", "-l", "done,crash", "--interval", "2", "--max-ticks", "5")
    assert rc == 1 and doc["command"] == "watch" and doc["ticks"] == 1 and doc["stopped"] == "settled"
    assert time.monotonic() - started < 60
    lines = [ln for ln in err.splitlines() if " done finished" in ln or " crash failed" in ln]
    assert len(lines) == 2


def test_watch_ticks_a_running_run_until_max_ticks(runs):
    rc, doc, err = runs.run("watch", "--json", "-l", "live", "--interval", "2", "--max-ticks", "2")
    assert rc == 0 and doc["ticks"] == 2 and doc["stopped"] == "max_ticks"
    assert len([ln for ln in err.splitlines() if " live running step=39" in ln]) == 2


def test_bad_input_is_exit_2_with_a_json_error(runs, tmp_path):
    proc = subprocess.run([*RGT_RUN, "status", "-i", str(tmp_path / "nope"), "--json"], capture_output=True,
                          text=True, timeout=60, cwd=REPO)
    assert proc.returncode == 2
    assert json.loads(proc.stdout)["command"] == "status"


# ---------------------------------------------------------------- the result on stdout, messages on stderr

def plain(runs, command, *args, timeout=180, preexec_fn=None, ledger=None):
    """rgt-run without --json: (rc, stdout, stderr)."""
    proc = subprocess.run([*RGT_RUN, command, "-i", str(runs.inv), "--ledger", str(ledger or runs.ledger), *args],
                          capture_output=True, text=True, timeout=timeout, cwd=REPO, preexec_fn=preexec_fn)
    return proc.returncode, proc.stdout, proc.stderr


def test_status_prints_its_rows_on_stdout_and_its_messages_on_stderr(runs):
    rc, out, err = plain(runs, "status", "-l", "live,done")
    assert rc == 0, err
    rows = {line.split("│")[0].strip(): line for line in out.splitlines() if "│" in line}
    assert "finished" in rows["done"].split("│")[1] and "running" in rows["live"].split("│")[1], out
    assert rows["live"].split("│")[3].strip() == "39"  # the step, whole
    assert "exit 0 · ledger" in err and "exit 0" not in out
    assert "│" not in err and "finished" not in err


def test_watch_ticks_on_stderr_and_its_final_summary_on_stdout(runs):
    rc, out, err = plain(runs, "watch", "-l", "done", "--interval", "1", "--max-ticks", "2")
    assert rc == 0, err
    assert out.strip().startswith("1/1 finished"), out
    assert " done finished step=" in err and "watch stopped after 1 tick(s): every run is settled" in err
    assert " done finished step=" not in out


# ---------------------------------------------------------------- runs: each run's last known state

def test_runs_shows_a_verified_run_finished_from_its_first_launch_and_counts_only_what_bills(tmp_path):
    """A finished, verified run (the box now gone: its last status is `unreachable` and said `running` before) is
    `finished` from its pull, started at its first launch (not its relaunch), and costs what its attempts took;
    a run never seen since its launch is `running` and counts; one seen failed keeps the cost it was seen at."""
    from rgt import memory
    from rgt.ledger import atomic_write_json

    ledger, pulled = tmp_path / "ledger", tmp_path / "runs"
    launch = {"action": "launch", "attempt": 1, "state": "running"}
    memory.record_launch(ledger, "box", "pod-1", "rgt", {"name": "done-run", "price_per_hour": 2.0}, launch)
    record = ledger / "runs" / "box.json"
    doc = json.loads(record.read_text())
    first = "2026-01-01T00:00:00+00:00"  # a day ago, say: the first launch
    doc["runs"]["rgt/done-run"].update(launched_at=first, first_launched_at=first)
    record.write_text(json.dumps(doc))
    memory.record_launch(ledger, "box", "pod-1", "rgt", {"name": "done-run", "price_per_hour": 2.0},
                         {"action": "relaunch", "attempt": 2, "state": "running"})  # watch relaunched it
    memory.record_launch(ledger, "box", "pod-1", "rgt", {"name": "new-run", "price_per_hour": 2.0}, launch)
    memory.record_launch(ledger, "box", "pod-1", "rgt", {"name": "bad-run", "price_per_hour": 2.0}, launch)
    atomic_write_json(ledger / "status" / "box.json", {
        "host": "box", "state": "unreachable", "error": "Connection refused",
        "last_seen": {"state": "running", "run_id": "done-run", "seen_at": time.time() - 600, "attempt": 2},
        "other_runs": [{"run_id": "bad-run", "state": "failed", "elapsed_s": 90.0, "cost_so_far": 0.05,
                        "attempt": 1}]})
    capsule = pulled / "done-run" / "box"
    capsule.mkdir(parents=True)
    (capsule / "run.json").write_text(json.dumps({"schema": "rgt/run/v1", "run_id": "done-run", "attempts": [
        {"attempt": 1, "started_at": 1000.0, "ended_at": 1600.0, "reason": "preempted"},
        {"attempt": 2, "started_at": 2000.0, "ended_at": 3200.0, "reason": "finished", "rc": 0}],
        "exit": {"attempt": 2, "reason": "finished", "rc": 0}}))
    (pulled / "done-run" / "box.PULL_VERIFIED.json").write_text(json.dumps({"run_id": "done-run", "host": "box"}))
    cmd = [*RGT_RUN, "runs", "--ledger", str(ledger), "--runs-dir", str(pulled)]

    proc = subprocess.run([*cmd, "--json"], capture_output=True, text=True, timeout=60, cwd=REPO)
    assert proc.returncode == 0, proc.stderr
    rows = {r["run_id"]: r for r in json.loads(proc.stdout)["runs"]}
    done = rows["done-run"]
    assert (done["state"], done["state_from"], done["pull"], done["attempts"]) == ("finished", "pull", "verified", 2)
    assert done["started"] == "1970-01-01T00:16:40+00:00"  # attempt 1 started before the first launch was recorded
    assert done["wall_s"] == 1800.0 and done["cost_so_far"] == 1.0  # 600 s + 1200 s at 2.0 per hour
    assert (rows["bad-run"]["state"], rows["bad-run"]["state_from"], rows["bad-run"]["cost_so_far"]) == \
        ("failed", "status", 0.05)
    assert (rows["new-run"]["state"], rows["new-run"]["state_from"]) == ("running", "launch")
    assert rows["new-run"]["wall_s"] is not None and rows["new-run"]["cost_so_far"] is not None

    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=60, cwd=REPO)
    assert proc.returncode == 0, proc.stderr
    row = next(ln for ln in proc.stdout.splitlines() if "done-run" in ln)
    assert "finished" in row and "verified" in row and "1970-01-01T00:16:40+00:00" in row and "1.00" in row, row
    assert "states are the last ones known" in proc.stderr and "done-run" not in proc.stderr


def test_the_first_launch_of_a_run_is_kept_across_relaunches(tmp_path):
    from rgt import memory

    memory.record_launch(tmp_path, "box", "pod-1", "rgt", {"name": "r"}, {"action": "launch", "attempt": 1})
    (first,) = memory.runs_of(tmp_path, "box")
    time.sleep(1.1)
    again = memory.record_launch(tmp_path, "box", "pod-1", "rgt", {"name": "r"}, {"action": "relaunch",
                                                                                   "attempt": 2})
    assert again["first_launched_at"] == first["launched_at"] != again["launched_at"]


# ---------------------------------------------------------------- a full disk under the ledger

def _tiny_fs(where: Path) -> bool:
    """Mount a 64 KiB tmpfs on `where` (True), when this process may (root); else False."""
    try:
        proc = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k,mode=0755", "tmpfs", str(where)],
                              capture_output=True, timeout=30)
    except OSError:
        return False
    return proc.returncode == 0


def test_a_full_disk_under_the_ledger_is_one_message_exit_1_and_the_old_record_stays(runs, tmp_path):
    """A tiny tmpfs filled up (when this process may mount one; else a file size limit below the record's size,
    the same refusal from the same writes): the status write fails, rgt says which file and what to do, exit 1,
    no traceback, and the record written before is byte for byte what it was, with no temp file beside it."""
    import resource

    ledger = tmp_path / "ledger"
    ledger.mkdir()
    mounted = _tiny_fs(ledger)
    try:
        rc, _out, err = plain(runs, "status", "-l", "done", ledger=ledger)
        assert rc == 0, err
        record = ledger / "status" / "done.json"
        before = record.read_bytes()
        limit = None
        if mounted:
            fd = os.open(ledger / "filler", os.O_WRONLY | os.O_CREAT)
            try:  # fill the disk
                while os.write(fd, b"\0" * 4096):
                    pass
            except OSError:
                pass
            finally:
                os.close(fd)
        else:
            limit = len(before) // 2

        def cap_file_size():
            if limit is not None:
                resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

        rc, out, err = plain(runs, "status", "-l", "done", ledger=ledger, preexec_fn=cap_file_size)
        assert rc == 1, err
        assert f"error: could not write {record}: " in err, err
        assert ("the disk is full" if mounted else "the file size limit") in err
        assert "fix: " in err and ("free space on the disk that holds" if mounted else "ulimit -f") in err
        assert "--ledger" in err and "Traceback" not in err + out
        assert record.read_bytes() == before
        assert [p.name for p in record.parent.iterdir() if p.name.startswith(".")] == []
    finally:
        if mounted:
            subprocess.run(["umount", "-l", str(ledger)], capture_output=True, timeout=30)
