#!/usr/bin/env python3
"""How much does `rgt-run pull` of one finished run cost (seal, transfer, verify), against `rsync -a` and
`sha256sum` of every file, and how many times is each byte read on each side?

The `local` profile (ansible_connection local, a temp durable root): the box side (rgt_closeout), the transfer
(rsync) and the controller side (rgt_pull_verify) are the real role; only SSH is absent. Measured in one run,
interleaved round by round (ratios, never a timed assertion):
- rgt: `rgt-run pull --json` of a fresh finished run (the seal copies out/ into the capsule and writes its
  manifest, rsync pulls it, the verification hashes the local copy against the manifest);
- baseline: `rsync -a` of the run's out/ to a fresh directory, then `sha256sum` of every file it holds;
- re-pull (--repull): `rgt-run pull` again over the verified copy (the repair pass and the verification hash the
  local copy; rsync has nothing to send) against `sha256sum` of every file;
- with --count-reads, one more pull under `strace -f` counts the bytes read from the run's files on each side:
  the box (the run dir the seal copies from, the candidate it hashes, the capsule rsync sends) and the controller
  (the local copy), as multiples of the run's bytes.
Usage: python bench/pull_bench.py [--big-mb 300] [--small 2000] [--small-kb 4] [--rounds 3] [--repull]
       [--count-reads]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
RUN_ID = "bench-run"
VENV = REPO / ".venv" / "bin"


def env(work: Path) -> dict:
    return {**os.environ, "PATH": f"{VENV}:{os.environ.get('PATH', '')}", "RGT_LEDGER": str(work / "ledger"),
            "ANSIBLE_CONFIG": str(REPO / "ansible.cfg"), "ANSIBLE_COLLECTIONS_PATH": str(REPO / ".collections")}


def make_source(src: Path, big_mb: int, small: int, small_kb: int) -> int:
    """The run's out/: one big file and `small` small ones; returns the bytes."""
    (src / "small").mkdir(parents=True)
    with open(src / "model.bin", "wb") as handle:
        for _ in range(big_mb):
            handle.write(os.urandom(1 << 20))
    for i in range(small):
        (src / "small" / f"part-{i:05d}.bin").write_bytes(os.urandom(small_kb << 10))
    return big_mb * (1 << 20) + small * (small_kb << 10)


def make_run(root: Path, src: Path) -> Path:
    """A finished run under root/durable (its out/ hard links to src: made in no time, its bytes cached) and
    its inventory; returns the inventory dir."""
    durable = root / "durable"
    run_dir = durable / "proj" / "active" / RUN_ID
    (run_dir / ".rgt").mkdir(parents=True)
    (run_dir / "logs").mkdir()
    subprocess.run(["cp", "-al", str(src), str(run_dir / "out")], check=True)
    (run_dir / ".rgt" / "exit.json").write_text(json.dumps({"attempt": 1, "rc": 0, "signal": None,
                                                            "reason": "finished"}))
    (run_dir / ".rgt" / "attempts.jsonl").write_text(json.dumps({"attempt": 1, "rc": 0, "reason": "finished"}) + "\n")
    (run_dir / "logs" / "job.log").write_text("step=10 loss=0.5\n")
    job = {"name": RUN_ID, "outputs": []}
    (run_dir / ".rgt" / "job.json").write_text(json.dumps({
        "schema": 1, "run_id": RUN_ID, "project": "proj", "run_dir": str(run_dir), "outputs": [],
        "log_patterns": {}, "heartbeat_interval_s": 5}))
    inv = root / "inv"
    inv.mkdir()
    (inv / "hosts.yml").write_text(yaml.safe_dump({"all": {"hosts": {"box": {
        "ansible_connection": "local", "ansible_python_interpreter": sys.executable, "rgt_profile": "local",
        "rgt_instance_id": "inst-1", "rgt_durable_root": str(durable), "rgt_project": "proj", "rgt_job": job}}}}))
    return inv


def rgt_pull(root: Path, work: Path, prefix: list[str] | None = None) -> float:
    argv = [*(prefix or []), str(VENV / "rgt-run"), "pull", "-i", str(root / "inv"), "--runs-dir",
            str(root / "runs"), "--json"]
    t0 = time.perf_counter()
    proc = subprocess.run(argv, capture_output=True, text=True, env=env(work), timeout=1800)
    took = time.perf_counter() - t0
    if proc.returncode != 0:
        sys.exit(f"rgt-run pull failed ({proc.returncode}): {proc.stderr[-2000:]}")
    host = json.loads(proc.stdout)["hosts"]["box"]
    if not host.get("verified"):
        sys.exit(f"rgt-run pull did not verify: {host}")
    return took


def sha_all(root: Path) -> None:
    find = subprocess.Popen(["find", str(root), "-type", "f", "-print0"], stdout=subprocess.PIPE)
    subprocess.run(["xargs", "-0", "sha256sum"], stdin=find.stdout, stdout=subprocess.DEVNULL, check=True)
    find.wait()


def baseline(src: Path, dest: Path) -> float:
    t0 = time.perf_counter()
    subprocess.run(["rsync", "-a", f"{src}/", f"{dest}/"], check=True)
    sha_all(dest)
    return time.perf_counter() - t0


def timed_sha(dest: Path) -> float:
    t0 = time.perf_counter()
    sha_all(dest)
    return time.perf_counter() - t0


READ = re.compile(r'^p?read(?:64)?\((\d+)<([^>]*)>.*\)\s+=\s+(\d+)')


def count_reads(root: Path, work: Path, data_bytes: int) -> dict:
    """One pull under strace: bytes read from each place, as multiples of the run's bytes."""
    traces = work / "strace"
    traces.mkdir()
    rgt_pull(root, work, ["strace", "-ff", "-qq", "-y", "-e", "trace=read,pread64", "-e", "signal=none",
                          "-o", str(traces / "t")])  # one file per process: no call is split
    proj = root / "durable" / "proj"
    places = {"box: the run dir (the seal's copy)": str(proj / "active" / RUN_ID / "out") + "/",
              "box: the candidate (the seal's hash)": str(proj / "export" / ".partial") + "/",
              "box: the capsule (rsync's sender, the manifest)": str(proj / "export" / RUN_ID) + "/",
              "controller: the local copy (repair pass, verification)": str(root / "runs" / RUN_ID / "box") + "/"}
    got = dict.fromkeys(places, 0)
    for trace in traces.iterdir():
        with open(trace, errors="replace") as handle:
            for line in handle:
                m = READ.match(line)
                if not m:
                    continue
                for label, prefix in places.items():
                    if m.group(2).startswith(prefix):
                        got[label] += int(m.group(3))
    shutil.rmtree(traces)
    return {label: round(n / data_bytes, 2) for label, n in got.items()}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--big-mb", type=int, default=300)
    ap.add_argument("--small", type=int, default=2000)
    ap.add_argument("--small-kb", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=3, help="timed rounds (0: only --count-reads)")
    ap.add_argument("--repull", action="store_true", help="also time a second pull over the verified copy")
    ap.add_argument("--count-reads", action="store_true", help="count bytes read per side (strace, one pull)")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="rgt-pull-bench-"))
    try:
        src = work / "src"
        data = make_source(src, args.big_mb, args.small, args.small_kb)
        rows = {"rgt": [], "baseline": [], "repull": [], "repull_baseline": []}
        for i in range(args.rounds):
            root = work / f"r{i}"
            root.mkdir()
            make_run(root, src)
            rows["rgt"].append(rgt_pull(root, work))
            rows["baseline"].append(baseline(src, work / f"b{i}"))
            if args.repull:
                rows["repull"].append(rgt_pull(root, work))
                rows["repull_baseline"].append(timed_sha(work / f"b{i}"))
            shutil.rmtree(root)
            shutil.rmtree(work / f"b{i}")
        med = {k: statistics.median(v) for k, v in rows.items() if v}
        out = {"case": f"{args.big_mb} MB + {args.small} x {args.small_kb} KB", "bytes": data, "rounds": args.rounds}
        if args.rounds:
            out.update(rgt_s=round(med["rgt"], 2), baseline_s=round(med["baseline"], 2),
                       ratio=round(med["rgt"] / med["baseline"], 2))
        if args.repull and args.rounds:
            out.update(repull_s=round(med["repull"], 2), repull_baseline_s=round(med["repull_baseline"], 2),
                       repull_ratio=round(med["repull"] / med["repull_baseline"], 2))
        if args.count_reads:
            root = work / "counted"
            root.mkdir()
            make_run(root, src)
            out["reads_first_pull"] = count_reads(root, work, data)
            out["reads_repull"] = count_reads(root, work, data)
        print(json.dumps(out, indent=1))
        return 0
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
