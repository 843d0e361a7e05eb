"""Offload cost, as ratios (docs/offload.md; issue 19): never asserted in a test.

1. Offload rate vs a bare `rclone copy`: the same checkpoint entry to the same S3 target (`rclone serve s3` on this
   machine, tests/fakes/s3.py), the bare copy alone vs the offloader's whole copy (hashing, the copy, the manifest,
   the verification: the MD5 the target reports, else a read-back). Medians of --rounds, interleaved.
2. Step-rate cost: a CPU-bound job writing a checkpoint every --ckpt-every-s seconds (atomic rename), its steps per
   second with no offload vs with the offloader pushing every --every s from another process, as the wrapper's thread
   does (the wrapper is its own process).

    .venv/bin/python bench/offload_bench.py --mib 64 --rounds 3 --job-s 20 --pairs 3
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "runner"))

from rgt import paths  # noqa: E402
from tests.fakes.s3 import S3Server, rclone_binary  # noqa: E402

off = paths.module_util("rgt_offload")

JOB = r"""
import os, sys, time
ckpt, size, every, seconds = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4])
os.makedirs(ckpt, exist_ok=True)
steps, start, last, n = 0, time.time(), time.time(), 0
x = 1
while time.time() - start < seconds:
    for _ in range(20000):
        x = (x * 1103515245 + 12345) % 2147483648
    steps += 1
    if time.time() - last >= every:
        n += 1
        tmp = os.path.join(ckpt, "step_%d.tmp" % n)
        with open(tmp, "wb") as f:
            f.write(os.urandom(size))
            f.flush(); os.fsync(f.fileno())
        os.replace(tmp, os.path.join(ckpt, "step_%d" % n))
        last = time.time()
print(steps / (time.time() - start))
"""


def secrets_file(where: Path, env: dict) -> str:
    path = where / "secrets.env"
    path.write_text("".join(f"{k}={v}\n" for k, v in env.items()))
    path.chmod(0o600)
    return str(path)


def rate_ratio(tmp: Path, s3: S3Server, sf: str, mib: int, rounds: int) -> tuple[float, float]:
    rclone = off.Rclone(rclone_binary(), sf)
    boxs = off.Rclone(rclone_binary(), sf, nice=off.NICE)  # the box's pusher's (Offloader.ensure_rclone)
    bare, ours = [], []
    for i in range(rounds):
        run_dir = tmp / "root" / "p" / "active" / f"r{i}"
        entry = run_dir / "ckpt" / "step_1"
        entry.mkdir(parents=True)
        for part in range(4):
            (entry / f"part{part}.bin").write_bytes(os.urandom(mib * (1 << 20) // 4))
        t0 = time.monotonic()
        rc, _out, err = rclone.run("copy", str(entry), f"s3t:rgt/bare/{i}/step_1")
        bare.append(time.monotonic() - t0)
        assert rc == 0, err
        spec = {"command": "x", "secrets_file": sf, "offload": {"to": "s3t:rgt/off", "every": 5}}
        pusher = off.Offloader(str(run_dir), "p", f"r{i}", spec, settle_s=0, rclone=boxs)
        _path, sig, _why = off.pick_entry(str(run_dir / "ckpt"), "*", settle_s=0)
        t0 = time.monotonic()
        record = pusher.copy_entry("checkpoint", str(entry), sig, f"s3t:rgt/off/p/r{i}/checkpoints/step_1")
        ours.append(time.monotonic() - t0)
        assert record["ok"], record
    return statistics.median(bare), statistics.median(ours)


def step_rate(tmp: Path, s3: S3Server, sf: str, with_offload: bool, args, pair: int = 0) -> float:
    run_dir = tmp / "root" / "p" / "active" / f"{'job-on' if with_offload else 'job-off'}-{pair}"
    (run_dir / "ckpt").mkdir(parents=True)
    stopped = threading.Event()
    pusher_proc = None
    if with_offload:  # the pusher in a process of its own, as the wrapper is one
        code = (f"import sys, threading; sys.path[:0] = [{str(REPO)!r}, {str(REPO / 'runner')!r}]\n"
                "from rgt import paths\noff = paths.module_util('rgt_offload')\n"
                f"spec = {{'command': 'x', 'secrets_file': {sf!r}, 'ckpt_glob': 'step_*', "
                f"'offload': {{'to': 's3t:rgt/job', 'every': {args.every}, 'keep': 2}}}}\n"
                f"p = off.Offloader({str(run_dir)!r}, 'p', 'job{pair}', spec, "
                f"rclone=off.Rclone({rclone_binary()!r}, {sf!r}, nice=off.NICE))\n"
                "p.loop(threading.Event())\n")
        pusher_proc = subprocess.Popen([sys.executable, "-c", code])
    out = subprocess.run([sys.executable, "-c", JOB, str(run_dir / "ckpt"), str(args.ckpt_mib << 20),
                          str(args.ckpt_every_s), str(args.job_s)], capture_output=True, text=True, check=True)
    stopped.set()
    if pusher_proc:
        pusher_proc.terminate()
        pusher_proc.wait()
        records = off.read_records(str(run_dir))
        print(f"  offloads during the job: {sum(1 for r in records if r.get('verified'))} verified, "
              f"{sum(1 for r in records if r.get('kind') == 'checkpoint' and not r.get('ok'))} failed")
    return float(out.stdout.strip())


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mib", type=int, default=64, help="size of the entry copied in the rate comparison")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--job-s", type=float, default=20)
    ap.add_argument("--pairs", type=int, default=3, help="step-rate runs without / with offload, interleaved")
    ap.add_argument("--ckpt-mib", type=int, default=16)
    ap.add_argument("--ckpt-every-s", type=float, default=2)
    ap.add_argument("--every", type=float, default=5)
    ap.add_argument("--skip-steps", action="store_true")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmpname:
        tmp = Path(tmpname)
        with S3Server(tmp / "s3") as s3:
            sf = secrets_file(tmp, s3.env("s3t"))
            bare, ours = rate_ratio(tmp, s3, sf, args.mib, args.rounds)
            print(f"rate: {args.mib} MiB entry: bare rclone copy {bare:.2f} s, offload (hash + copy + manifest + "
                  f"verification) {ours:.2f} s: offload moves {bare / ours:.2f}x the bare rate")
            if not args.skip_steps:  # pairs, interleaved: a slow moment of the machine hits both sides alike
                base, with_off = [], []
                for pair in range(args.pairs):
                    base.append(step_rate(tmp, s3, sf, False, args, pair))
                    with_off.append(step_rate(tmp, s3, sf, True, args, pair))
                lost = [100 * (1 - w / b) for b, w in zip(base, with_off, strict=True)]
                print(f"steps: {statistics.median(base):.1f}/s without offload, {statistics.median(with_off):.1f}/s "
                      f"with (medians of {args.pairs} pairs): {statistics.median(lost):.1f}% lost (each pair: "
                      + ", ".join(f"{x:.1f}%" for x in lost) + ")")


if __name__ == "__main__":
    main()
