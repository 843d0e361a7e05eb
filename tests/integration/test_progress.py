"""Long uploads and pulls show live progress (bytes, rate, ETA per host) when rgt-run's stderr is a terminal, and
nothing when it is not, with the same result either way (issue 8).

Driven as a user would: `python -m rgt.cli` as a subprocess, once with stderr on a pseudo-terminal (pty) and once on
plain pipes, on the local profile (connection local, temp durable roots), with a real rsync slowed by --bwlimit so
a transfer lasts a few seconds.
"""

import json
import os
import pty
import re
import select
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b\][^\x07]*\x07")

pytestmark = [
    pytest.mark.skipif(not (REPO / ".venv" / "bin" / "ansible-playbook").exists(), reason="needs .venv"),
    pytest.mark.skipif(shutil.which("rsync") is None, reason="needs rsync"),
]


def run_cli(args, ledger: Path, tty: bool, timeout: int = 120):
    """rgt-run with stderr on a pty (a terminal 160 columns wide) or on a pipe; returns rc, stdout, stderr text."""
    env = {**os.environ, "RGT_LEDGER": str(ledger), "TERM": "xterm-256color", "COLUMNS": "160", "LINES": "40"}
    argv = [sys.executable, "-m", "rgt.cli", *map(str, args)]
    if not tty:
        proc = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=timeout, cwd=REPO)
        return proc.returncode, proc.stdout, proc.stderr
    master, slave = pty.openpty()
    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=slave, env=env, cwd=REPO)
    os.close(slave)
    err, deadline = b"", time.monotonic() + timeout
    while time.monotonic() < deadline:
        ready, _, _ = select.select([master], [], [], 0.2)
        if ready:
            try:
                chunk = os.read(master, 65536)
            except OSError:  # EIO: the child closed the terminal
                break
            if not chunk:
                break
            err += chunk
        elif proc.poll() is not None:
            break
    os.close(master)
    out = proc.stdout.read().decode()
    proc.wait(timeout=10)
    return proc.returncode, out, err.decode("utf-8", "replace")


def progress_lines(stderr: str, host: str, what: str) -> list[str]:
    """Every rendering of the live line that shows a measured rate and an ETA, cut out between control codes."""
    shape = re.compile(rf"^{host}\s+{what}\s+\d+(\.\d)? (B|KiB|MiB) / \d+\.\d MiB\s+\d+(\.\d)? (B|KiB|MiB)/s"
                       rf"\s+ETA \d+:\d\d$")
    uncoloured = re.sub(r"\x1b\[[0-9;]*m", "", stderr)
    pieces = (piece.strip() for piece in re.split(rf"{ANSI.pattern}|\r|\n", uncoloured))
    return [piece for piece in pieces if piece and shape.match(piece)]


def screen(stderr: str) -> list[str]:
    """What the terminal shows at the end: a minimal emulator of what rich writes (text, CR, LF, cursor up,
    erase line; colours and cursor visibility ignored). Lines never wrap: rich's live lines are short."""
    lines, row, col = [""], 0, 0
    for tok in re.split(rf"({ANSI.pattern}|\r|\n)", stderr):
        if not tok:
            continue
        if tok == "\r":
            col = 0
        elif tok == "\n":
            row, col = row + 1, 0
            if row == len(lines):
                lines.append("")
        elif tok.startswith("\x1b["):
            if tok.endswith("A"):
                row = max(0, row - int(tok[2:-1] or 1))
            elif tok.endswith("K"):
                lines[row] = "" if tok[2:-1] == "2" else lines[row][:col]
        elif not tok.startswith("\x1b"):
            line = lines[row].ljust(col)
            lines[row], col = line[:col] + tok + line[col + len(tok):], col + len(tok)
    return [line.rstrip() for line in lines]


def event_lines(lines: list[str]) -> list[str]:
    return [line for line in lines if re.match(r"^  box +(ok|changed|FAILED)", line)]


def local_inventory(root: Path, host: dict) -> Path:
    inv = root / "inv"
    inv.mkdir(parents=True)
    (inv / "hosts.yml").write_text(yaml.safe_dump({"all": {"hosts": {"box": {
        "ansible_connection": "local", "ansible_python_interpreter": sys.executable, "rgt_profile": "local",
        "rgt_instance_id": "box-1", "rgt_project": "proj", **host}}}}))
    return inv


@pytest.fixture(scope="module")
def code(tmp_path_factory):
    """A 1.5 MiB code dir: about 2.5 s at upload_resume_bwlimit=600 (KiB/s)."""
    src = tmp_path_factory.mktemp("code")
    (src / "train.py").write_text("print('hi')\n")
    for i in range(3):
        (src / f"weights{i}.bin").write_bytes(os.urandom(512 * 1024))
    return src


def upload(root: Path, code: Path, tty: bool):
    durable = root / "durable"
    inv = local_inventory(root, {"rgt_durable_root": str(durable)})
    job = {"rgt_job": {"name": "prog-run", "command": "true", "code_dir": str(code)}}
    rc, out, err = run_cli(["playbooks/upload_resume.yml", "-i", inv, "-e", json.dumps(job),
                            "-e", "upload_resume_bwlimit=600", "--json"], root / "ledger", tty)
    reports = [json.loads(line) for line in (root / "ledger" / "uploads" / "box.jsonl").read_text().splitlines()]
    shipped = list((durable / "proj" / "active" / "prog-run").glob("code-*"))
    return rc, out, err, reports, shipped


def test_an_upload_on_a_terminal_shows_a_live_line_and_on_pipes_none_with_the_same_result(tmp_path, code):
    rc, out, err, reports, shipped = upload(tmp_path / "tty", code, tty=True)
    assert rc == 0, err
    lines = progress_lines(err, "box", "upload")
    assert lines, err
    # the total is the manifest's byte count; a measured rate shows at least once during the ~3 s transfer
    total = sum(f.stat().st_size for f in code.iterdir())
    assert all(f"/ {total / 2**20:.1f} MiB" in line for line in lines), lines
    assert any(re.search(r"\s\d+(\.\d)? (KiB|MiB)/s\s", line) and "0.0 MiB /" not in line for line in lines), lines
    # the event lines scroll above the live line, whole, and the live line is gone once the transfer ended
    shown = screen(err)
    assert not [line for line in shown if "/s  ETA" in line or re.match(r"^  box +upload ", line)], shown
    assert "  box              changed 4 Send the code tree with rsync (resumable; each retry continues where the " \
           "last stopped)" in shown, shown

    rc2, out2, err2, reports2, shipped2 = upload(tmp_path / "pipe", code, tty=False)
    assert rc2 == 0, err2
    assert not progress_lines(err2, "box", "upload") and "/s  ETA" not in err2 and "\x1b" not in err2
    # the terminal run printed the same event lines, in the same order, as the run on pipes (every task's line:
    # 10 since the upload's controller scratch dir comes from rgt-run)
    assert event_lines(shown) == event_lines(err2.splitlines()) and len(event_lines(shown)) >= 8
    # the same result: the same code dir, the same bytes counted from rsync's output, one attempt each
    assert [p.name for p in shipped] == [p.name for p in shipped2] and len(shipped) == 1
    assert sorted(f.name for f in shipped[0].iterdir()) == sorted(f.name for f in code.iterdir())
    keep = ("status", "hash8", "files", "bytes", "files_transferred", "attempts")
    assert [{k: r[k] for k in keep} for r in reports] == [{k: r[k] for k in keep} for r in reports2]
    assert reports[0]["status"] == "uploaded" and reports[0]["files_transferred"] == 4
    assert reports[0]["bytes_sent"] >= total and reports2[0]["bytes_sent"] >= total
    assert json.loads(out)["exit_code"] == json.loads(out2)["exit_code"] == 0


def test_a_pull_on_a_terminal_shows_a_live_line_per_host(tmp_path):
    durable = tmp_path / "durable"
    run_dir = durable / "proj" / "active" / "prog-run"
    for sub in (".rgt", "out", "ckpt", "logs"):
        (run_dir / sub).mkdir(parents=True)
    (run_dir / ".rgt" / "attempts.jsonl").write_text(
        json.dumps({"attempt": 1, "started_at": "2026-01-01T00:00:00Z"}) + "\n"
        + json.dumps({"attempt": 1, "ended_at": "2026-01-01T00:10:00Z", "rc": 0, "reason": "finished"}) + "\n")
    (run_dir / ".rgt" / "exit.json").write_text(json.dumps({"attempt": 1, "rc": 0, "signal": None,
                                                             "reason": "finished"}))
    (run_dir / ".rgt" / "job.json").write_text(json.dumps({
        "schema": 1, "run_id": "prog-run", "project": "proj", "run_dir": str(run_dir), "outputs": [],
        "log_patterns": {}, "heartbeat_interval_s": 5}))
    for i in range(3):
        (run_dir / "out" / f"shard{i}.bin").write_bytes(os.urandom(400 * 1024))  # about 2 s at 600 KiB/s
    inv = local_inventory(tmp_path, {"rgt_durable_root": str(durable), "rgt_job": {"name": "prog-run", "outputs": []}})
    rc, out, err = run_cli(["pull", "-i", inv, "--runs-dir", tmp_path / "runs", "-e", "collect_bwlimit=600",
                            "--json"], tmp_path / "ledger", tty=True)
    assert rc == 0, err
    assert json.loads(out)["hosts"]["box"]["verified"] is True
    assert progress_lines(err, "box", "pull"), err
    assert (tmp_path / "runs" / "prog-run" / "box" / "out" / "shard2.bin").read_bytes() == \
        (run_dir / "out" / "shard2.bin").read_bytes()
