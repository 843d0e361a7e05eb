"""`rgt-run logs` on the local profile: the newest attempt by default with its boundary marked, --all, --tail,
host prefixes, and -f that survives a dropped link (the reader's connection is killed mid-stream) without showing
a line twice; a durable root that is an Ansible template; a 200 MB line read in bounded memory. Every host is this
machine (connection local) with its own run under a temp durable root."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from clihelp import wait_for, write_inventory

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / ".collections"))
from ansible_collections.rgt.remote_gpu.plugins.module_utils import rgt_logread, rgt_runlayout  # noqa: E402

RGT_RUN = [sys.executable, "-m", "rgt.cli"]
ATTEMPT_1 = ["== rgt attempt 1 started 2026-12-01T00:00:00Z resume_from=", "step=1 loss=0.9", "step=2 loss=0.8",
             "== rgt attempt 1 ended 2026-12-01T00:10:00Z reason=preempted rc=None"]
ATTEMPT_2 = ["== rgt attempt 2 started 2026-12-01T00:20:00Z resume_from=ckpt/step-2", "step=3 loss=0.7",
             "step=4 loss=0.6", "step=5 loss=0.5"]


def local_host(durable, run_id):
    return {"ansible_connection": "local", "ansible_python_interpreter": sys.executable, "rgt_profile": "local",
            "rgt_instance_id": "localhost", "rgt_durable_root": str(durable), "rgt_job": {"name": run_id},
            "rgt_shared_volume": True}


def run_paths(durable, run_id):
    p = rgt_runlayout.RunPaths(str(durable), "rgt", run_id)
    for d in (p.meta, p.logs):
        os.makedirs(d, exist_ok=True)
    return p


@pytest.fixture(scope="module")
def boxes(tmp_path_factory):
    root = tmp_path_factory.mktemp("logs")
    durable = root / "durable"
    a = run_paths(durable, "run-a")
    Path(a.log).write_text("\n".join(ATTEMPT_1 + ATTEMPT_2) + "\n")
    b = run_paths(durable, "run-b")
    Path(b.log).write_text("== rgt attempt 1 started 2026-12-01T00:00:00Z resume_from=\nhello from b\n")
    hosts = {"a": local_host(durable, "run-a"), "b": local_host(durable, "run-b"),
             "gone": {"ansible_host": "127.0.0.1", "ansible_port": 1, "ansible_user": "nobody",
                      "rgt_profile": "generic_ssh", "rgt_instance_id": "box-gone", "rgt_durable_root": "/tmp",
                      "rgt_job": {"name": "gone"}}}
    inv = write_inventory(root / "inv", hosts)
    (inv / "known_hosts").write_text("box-gone ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIHw9\n")
    env = {**os.environ, "RGT_LEDGER": str(root / "ledger"), "XDG_CACHE_HOME": str(root / "cache")}
    return {"inv": inv, "durable": durable, "a": a, "env": env}


def logs(boxes, *args, timeout=60):
    proc = subprocess.run([*RGT_RUN, "logs", "-i", str(boxes["inv"]), *args], capture_output=True, text=True,
                          env=boxes["env"], timeout=timeout, cwd=REPO)
    return proc.returncode, proc.stdout.splitlines(), proc.stderr


def test_the_newest_attempt_by_default_with_its_boundary_marked(boxes):
    rc, out, err = logs(boxes, "-l", "a")
    assert rc == 0, err
    assert out == [f"──── {ATTEMPT_2[0]} ────", *ATTEMPT_2[1:]]
    assert "attempt 2 of 2" in err


def test_all_attempts_tail_and_host_prefixes(boxes):
    rc, out, _ = logs(boxes, "-l", "a", "--all")
    assert rc == 0
    assert [ln for ln in out if ln.startswith("────")] == [f"──── {ln} ────" for ln in (ATTEMPT_1[0], ATTEMPT_1[3],
                                                                                        ATTEMPT_2[0])]
    assert len(out) == len(ATTEMPT_1) + len(ATTEMPT_2)
    rc, out, _ = logs(boxes, "-l", "a,b", "--tail", "1")
    assert rc == 0 and out == ["a | step=5 loss=0.5", "b | hello from b"]


def test_an_unreachable_box_is_exit_4_and_the_others_still_print(boxes):
    rc, out, err = logs(boxes, "-l", "b,gone", "--json")
    assert rc == 4, err
    doc = json.loads(out[0])
    assert doc["hosts"]["gone"]["state"] == "unreachable"
    assert doc["hosts"]["b"]["lines"][-1] == "hello from b"


def test_a_bad_run_name_is_exit_2_and_touches_nothing(boxes):
    rc, _out, err = logs(boxes, "-l", "a", "--run", "../etc")
    assert rc == 2 and "--run" in err


def _children(pid):
    kids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                kids.append(int(entry.name))
    return kids


def test_follow_survives_a_dropped_link_without_repeating_a_line(boxes):
    p = run_paths(boxes["durable"], "run-f")
    Path(p.log).write_text("== rgt attempt 1 started 2026-12-01T00:00:00Z resume_from=\nline 1\n")
    inv = write_inventory(boxes["inv"].parent / "inv-f", {"f": local_host(boxes["durable"], "run-f")})
    follower = subprocess.Popen([*RGT_RUN, "logs", "-i", str(inv), "-f"], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, env=boxes["env"], cwd=REPO)
    try:
        first = follower.stdout.readline()
        assert first.startswith("──── == rgt attempt 1 started")
        assert follower.stdout.readline() == "line 1\n"
        with open(p.log, "a") as fh:
            fh.write("line 2\n")
        assert follower.stdout.readline() == "line 2\n"
        reader = wait_for(lambda: _children(follower.pid), what="the reader process")
        for pid in reader:  # the link drops: the reading end dies mid-stream
            os.kill(pid, signal.SIGKILL)
        with open(p.log, "a") as fh:
            fh.write("line 3\nline 4 without newline yet")
        time.sleep(0.3)
        with open(p.log, "a") as fh:
            fh.write(" - done\n")
        rgt_runlayout.atomic_write_json(p.exit, {"attempt": 1, "rc": 0, "reason": "finished"})  # the run ends
        rest, err = follower.communicate(timeout=30)
    finally:
        if follower.poll() is None:
            follower.kill()
    assert follower.returncode == 0, err
    assert rest.splitlines() == ["line 3", "line 4 without newline yet - done"]
    assert "link lost" in err and "reconnected; resuming at byte" in err


def test_tail_offset_counts_lines_from_the_end(tmp_path):
    log = tmp_path / "job.log"
    log.write_bytes(b"a\nbb\nccc\n")
    assert rgt_logread.tail_offset(str(log), 1) == 5
    assert rgt_logread.tail_offset(str(log), 2) == 2
    assert rgt_logread.tail_offset(str(log), 10) == 0
    assert rgt_logread.tail_offset(str(log), 1, floor=6) == 6
    log.write_bytes(b"a\nbb\nccc")  # an unfinished last line is a line
    assert rgt_logread.tail_offset(str(log), 1) == 5


def test_attempt_markers_are_found_across_blocks_and_past_long_lines(tmp_path, monkeypatch):
    """The box's scan reads by blocks: a marker cut by a block boundary, on the first line, or after a line many
    blocks long is found once, at its offset."""
    log = tmp_path / "job.log"
    lines = [b"== rgt attempt 1 started a", b"x" * 1000, b"== rgt attempt 2 started b", b"== rgt attempt bad",
             b"y== rgt attempt 3 started no", b"== rgt attempt 3 started c"]
    log.write_bytes(b"\n".join(lines))
    offsets = [sum(len(ln) + 1 for ln in lines[:i]) for i in (0, 2, 5)]
    for chunk in (1, 7, 16, 64 * 1024):
        monkeypatch.setattr(rgt_logread, "CHUNK", chunk)
        assert rgt_logread.attempt_offsets(str(log)) == [
            (offsets[0], "== rgt attempt 1 started a"), (offsets[1], "== rgt attempt 2 started b"),
            (offsets[2], "== rgt attempt 3 started c")], chunk


def test_logs_reads_a_box_whose_durable_root_is_a_template(tmp_path):
    """The built-in local inventory (durable root `{{ lookup('env', 'PWD') }}/.rgt/...`) and the one `init --profile
    local` writes (`{{ inventory_dir }}/../.rgt/...`): Ansible renders the root here, then the log is read."""
    work = Path.cwd()  # the test's own directory: the built-in inventory's runs live under it
    builtin = rgt_runlayout.RunPaths(str(work / ".rgt" / "local-box" / "durable"), "tiny_train", "tiny-train")
    os.makedirs(builtin.logs)
    Path(builtin.log).write_text("== rgt attempt 1 started 2026-12-01T00:00:00Z resume_from=\nstep=1 loss=0.9\n")
    env = {**os.environ, "RGT_LEDGER": str(tmp_path / "ledger")}
    proc = subprocess.run([*RGT_RUN, "logs", "-i", str(REPO / "inventories" / "local")], capture_output=True,
                          text=True, env=env, timeout=120, cwd=work)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == ["──── == rgt attempt 1 started 2026-12-01T00:00:00Z resume_from= ────",
                                        "step=1 loss=0.9"]
    assert builtin.log in proc.stderr

    proj = tmp_path / "proj"
    init = subprocess.run([*RGT_RUN, "init", "--profile", "local", "--dir", str(proj)], capture_output=True,
                          text=True, env=env, timeout=60, cwd=work)
    assert init.returncode == 0, init.stderr
    mine = rgt_runlayout.RunPaths(str(proj / ".rgt" / "local-box" / "durable"), "rgt", "my-run")
    os.makedirs(mine.logs)
    Path(mine.log).write_text("hello from my project\n")
    proc = subprocess.run([*RGT_RUN, "logs", "-i", str(proj / "inventory"), "-e", f"@{proj / 'job.yml'}"],
                          capture_output=True, text=True, env=env, timeout=120, cwd=work)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == ["hello from my project"]


MEASURE = """\
import resource, subprocess, sys
with open(sys.argv[1], "wb") as out:
    rc = subprocess.run(sys.argv[2:], stdout=out, stderr=subprocess.PIPE).returncode
print(rc, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)
"""


def test_a_200_mb_line_is_cut_and_memory_stays_bounded(boxes, tmp_path):
    """One 200 MB line: printed cut at the cap with a marker, the lines around it whole, and neither this
    machine's reader nor the box's (this machine too, on the local profile) holds it: peak RSS of the whole
    `rgt-run logs` tree stays under 300 MB (it was gigabytes)."""
    from rgt.logs import LINE_CAP

    p = run_paths(boxes["durable"], "run-big")
    size = 200 << 20
    with open(p.log, "wb") as fh:
        fh.write(b"== rgt attempt 1 started 2026-12-01T00:00:00Z resume_from=\nstep=1 loss=0.9\n")
        for _ in range(size >> 20):
            fh.write(b"x" * (1 << 20))
        fh.write(b"\nstep=2 loss=0.8\n")
    inv = write_inventory(tmp_path / "inv", {"big": local_host(boxes["durable"], "run-big")})
    try:
        for extra in ((), ("--json",)):
            printed = tmp_path / "out.txt"
            proc = subprocess.run([sys.executable, "-c", MEASURE, str(printed), *RGT_RUN, "logs", "-i", str(inv),
                                   *extra], capture_output=True, text=True, env=boxes["env"], timeout=300, cwd=REPO)
            rc, peak_kib = (int(v) for v in proc.stdout.split())
            assert rc == 0, proc.stderr
            assert peak_kib < 300 * 1024, f"peak RSS {peak_kib // 1024} MB for a {size >> 20} MB line"
            cut = f"{'x' * LINE_CAP} [… {size - LINE_CAP} more bytes of this line not shown]"
            text = printed.read_text()
            if extra:
                lines = json.loads(text)["hosts"]["big"]["lines"]
                assert lines == ["== rgt attempt 1 started 2026-12-01T00:00:00Z resume_from=", "step=1 loss=0.9", cut,
                                 "step=2 loss=0.8"]
            else:
                assert text.splitlines() == ["──── == rgt attempt 1 started 2026-12-01T00:00:00Z resume_from= ────",
                                             "step=1 loss=0.9", cut, "step=2 loss=0.8"]
    finally:
        os.unlink(p.log)
