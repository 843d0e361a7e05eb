"""Verify the launch_detached scenario: exactly one wrapper per run, its tmux session alive (or the run already
ended with an exit.json), job.log with step lines, one attempt only (idempotence did not relaunch). Runs under
testinfra with molecule's inventory."""

import json

RUN_DIRS = {"adl": "/root/autodl-tmp/mol/active/mol-launch", "rp": "/workspace/mol/active/mol-launch"}
SESSION = "rgt-mol/mol-launch"  # rgt-<project>/<run_id>


def _run_dir(host):
    return RUN_DIRS[host.backend.get_hostname()]


def _wrapper_pids(host):
    """pids whose argv is <python> <run_dir>/.rgt/wrapper.py <run_dir> (the tmux server's argv names it too)."""
    run_dir = _run_dir(host)
    pids = []
    for line in host.check_output("ps -eww -o pid=,args=").splitlines():
        fields = line.split()
        if len(fields) >= 4 and fields[2] == run_dir + "/.rgt/wrapper.py" and fields[3] == run_dir:
            pids.append(int(fields[0]))
    return pids


def _exit(host):
    f = host.file(_run_dir(host) + "/.rgt/exit.json")
    return json.loads(f.content_string) if f.exists else None


def test_one_wrapper_and_a_live_session_or_an_exit_record(host):
    ended = _exit(host)
    pids = _wrapper_pids(host)
    if ended is None:
        assert len(pids) == 1, pids
        assert host.run(f"tmux has-session -t ={SESSION}").rc == 0
        pid_doc = json.loads(host.file(_run_dir(host) + "/.rgt/pid").content_string)
        assert pid_doc["wrapper_pid"] == pids[0] and pid_doc["attempt"] == 1
    else:
        assert pids == [] and ended["reason"] == "finished"


def test_job_log_has_step_lines(host):
    log = host.file(_run_dir(host) + "/logs/job.log").content_string
    assert "== rgt attempt 1 started" in log
    assert "step=" in log


def test_only_one_attempt_was_started(host):
    lines = host.file(_run_dir(host) + "/.rgt/attempts.jsonl").content_string.splitlines()
    starts = [json.loads(ln) for ln in lines if ln.strip() and "started_at" in json.loads(ln)]
    assert [s["attempt"] for s in starts] == [1]
    assert starts[0]["detach"] == "tmux" and starts[0]["code_dir"] == _run_dir(host) + "/code-test"


def test_job_json_and_wrapper_files(host):
    meta = _run_dir(host) + "/.rgt"
    job = json.loads(host.file(meta + "/job.json").content_string)
    assert job["run_id"] == "mol-launch" and job["python"] == "/usr/bin/python3"
    assert job["grace_s"] == (5 if host.backend.get_hostname() == "rp" else 30)
    assert host.file(meta + "/job.json").mode == 0o600
    assert host.file(meta + "/wrapper.py").mode == 0o755
    assert host.file(meta + "/rgt_runlayout.py").is_file
    beat = json.loads(host.file(meta + "/heartbeat").content_string)
    assert beat["attempt"] == 1
