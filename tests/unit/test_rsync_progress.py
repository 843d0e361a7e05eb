"""rsync with progress (plugins/module_utils/rgt_rsync.py: run_rsync with a Progress, what rgt_transfer runs) with a
real, slowed rsync, and the runner's reading of its files (rgt.progress).

The transfer counts what every attempt sent from rsync's log and stdout and retries on its exit status, so the
progress run must hand back rsync's stdout (--stats) and exit status unchanged while it diverts the progress lines
to a file.
"""

import json
import os
import re
import shutil
import subprocess

import pytest

from ansible_collections.rgt.remote_gpu.plugins.module_utils.rgt_rsync import Progress, run_rsync
from rgt.progress import ProgressTail, Transfer, clock, human_bytes

pytestmark = pytest.mark.skipif(shutil.which("rsync") is None, reason="needs rsync")


@pytest.fixture
def tree(tmp_path):
    """Six random files of 256 KiB: at --bwlimit=1000 rsync needs about 1.5 s for them."""
    src = tmp_path / "src"
    src.mkdir()
    for i in range(6):
        (src / f"part{i}.bin").write_bytes(os.urandom(256 * 1024))
    return src


def wrapped(out, *rsync_args, total=None):
    """rsync ARGS run as rgt_transfer runs it with progress: --info=progress2 added, the lines diverted to `out`."""
    rc, stdout, stderr = run_rsync(["rsync", "--info=progress2", *map(str, rsync_args)],
                                   Progress(str(out), "box1", "upload", "code", total))
    return subprocess.CompletedProcess(["rsync", *rsync_args], rc, stdout, stderr)


def records(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def stats_only(text: bytes) -> str:
    """rsync's --stats block with the lines that measure time blanked (they differ between two runs)."""
    return re.sub(r"(?m)^(File list (generation|transfer) time|sent ).*$", "<timing>", text.decode())


def test_a_slow_transfer_writes_growing_progress_and_passes_stats_and_status_through(tmp_path, tree):
    total = sum(f.stat().st_size for f in tree.iterdir())
    out = tmp_path / "box1.upload.jsonl"
    wrapper = wrapped(out, "-a", "--stats", "--bwlimit=1000", f"{tree}/", f"{tmp_path / 'dst'}/", total=total)
    assert wrapper.returncode == 0, wrapper.stderr
    plain = subprocess.run(["rsync", "-a", "--stats", f"{tree}/", f"{tmp_path / 'dst-plain'}/"],
                           capture_output=True, timeout=60)
    # the stdout the roles parse is rsync's own: the same --stats block, no progress line, no carriage return
    assert b"\r" not in wrapper.stdout and b"xfr#" not in wrapper.stdout
    assert stats_only(wrapper.stdout) == stats_only(plain.stdout)
    assert "Number of regular files transferred: 6" in wrapper.stdout.decode()
    assert wrapper.stderr == plain.stderr == b""
    # the progress stream: start, growing byte counts that reach the whole tree, end with rsync's status
    recs = records(out)
    assert recs[0]["event"] == "start" and recs[-1] == {**recs[-1], "event": "end", "rc": 0}
    sizes = [r["bytes"] for r in recs if r["event"] == "progress"]
    assert len(sizes) >= 3 and sizes == sorted(sizes) and len(set(sizes)) >= 3, sizes
    assert sizes[-1] == total
    assert all(r["host"] == "box1" and r["what"] == "upload" and r["part"] == "code" and r["total"] == total
               for r in recs)
    assert (tmp_path / "dst" / "part5.bin").read_bytes() == (tree / "part5.bin").read_bytes()


def test_rsyncs_exit_status_and_stderr_come_back_unchanged(tmp_path):
    missing = tmp_path / "no-such-dir"
    plain = subprocess.run(["rsync", "-a", "--stats", f"{missing}/", f"{tmp_path / 'dst'}/"], capture_output=True)
    out = tmp_path / "p.jsonl"
    wrapper = wrapped(out, "-a", "--stats", f"{missing}/", f"{tmp_path / 'dst'}/")
    assert plain.returncode == 23 and wrapper.returncode == 23
    assert b"No such file or directory" in wrapper.stderr
    assert stats_only(wrapper.stdout) == stats_only(plain.stdout)
    assert records(out)[-1]["rc"] == 23
    bad = wrapped(out, "--no-such-option", f"{tmp_path}/", f"{tmp_path / 'dst'}/")
    assert bad.returncode == subprocess.run(["rsync", "--no-such-option"], capture_output=True).returncode != 0


def test_a_progress_file_that_cannot_be_written_never_stops_the_transfer(tmp_path, tree):
    wrapper = wrapped(tmp_path / "gone" / "p.jsonl", "-a", f"{tree}/", f"{tmp_path / 'dst'}/")
    assert wrapper.returncode == 0, wrapper.stderr
    assert sorted(p.name for p in (tmp_path / "dst").iterdir()) == sorted(p.name for p in tree.iterdir())


def test_the_runner_sums_parts_restarts_a_retried_part_and_waits_for_whole_lines(tmp_path):
    tail = ProgressTail.__new__(ProgressTail)  # the reading half only: no console, no thread
    tail.directory, tail.transfers, tail._offsets, tail._rests = tmp_path, {}, {}, {}
    f = tmp_path / "box1.pull.jsonl"

    def add(text):
        with f.open("a") as handle:
            handle.write(text)

    base = {"host": "box1", "what": "pull", "total": 10 * 2**20}
    add(json.dumps({**base, "event": "start", "part": "out", "t": 100.0}) + "\n")
    add(json.dumps({**base, "event": "progress", "part": "out", "bytes": 2 * 2**20, "t": 101.0}) + "\n")
    add(json.dumps({**base, "event": "end", "part": "out", "rc": 0, "t": 101.0}) + "\n")
    add(json.dumps({**base, "event": "start", "part": "ckpt", "t": 101.5}) + "\n")
    add(json.dumps({**base, "event": "progress", "part": "ckpt", "bytes": 3 * 2**20, "t": 102.0})[:20])
    tail.poll(now=50.0)
    pull = tail.transfers[("box1", "pull")]
    assert pull.done == 2 * 2**20 and pull.running == {"ckpt"}  # the half-written line waits
    add(json.dumps({**base, "event": "progress", "part": "ckpt", "bytes": 3 * 2**20, "t": 102.0})[20:] + "\n")
    tail.poll(now=51.0)
    assert pull.done == 5 * 2**20
    shown = [str(t) for t in tail.lines(now=51.0)]
    assert shown == ["  box1             pull    5.0 MiB / 10.0 MiB  2.5 MiB/s  ETA 0:02"]
    # a retry of ckpt starts from rsync's zero again; an ended transfer shows no line
    add(json.dumps({**base, "event": "start", "part": "ckpt", "t": 110.0}) + "\n")
    add(json.dumps({**base, "event": "end", "part": "ckpt", "rc": 0, "t": 110.2}) + "\n")
    tail.poll(now=52.0)
    assert pull.done == 2 * 2**20 and tail.lines(now=52.0) == []


def test_a_transfer_line_shows_after_half_a_second_and_its_rate_falls_to_zero_when_stalled():
    t = Transfer("b", "upload")
    t.apply({"event": "start", "part": "code", "t": 0.0}, now=10.0)
    t.apply({"event": "progress", "part": "code", "bytes": 1024, "t": 1.0}, now=10.2)
    assert not t.visible(10.3) and t.visible(10.6)
    assert str(t.line(10.6)) == "  b                upload  1.0 KiB  1.0 KiB/s  ETA -"
    assert t.rate(20.0) == 0.0
    assert human_bytes(512) == "512 B" and human_bytes(3 * 2**30) == "3.0 GiB"
    assert clock(7) == "0:07" and clock(3725) == "1:02:05"
