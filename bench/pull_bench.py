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
- over SSH (--ssh): the same run on a stub box (tests/harness, podman, real sshd), pulled by the pull round
  (rgt.pullround: one seal call, one rsync over the ControlMaster, the verification here) against `rsync -a` over
  ssh + `sha256sum`;
- a sweep (--sweep 24,48,192): a finished sweep of that many cells (each `--cell-kb` KB in 4 files plus its
  logs) on 2 stub boxes, remembered in the ledger as rgt-run train records it, pulled by `rgt-run pull` (every
  cell sealed, pulled, verified, SWEEP_VERIFIED) against one `rsync -a` per box (in parallel) + `sha256sum` of
  every file; and the cost of each extra cell. `--play` also times the collect play for the smallest sweep
  (one play per cell index: the path before the round).
Usage: python bench/pull_bench.py [--big-mb 300] [--small 2000] [--small-kb 4] [--rounds 3] [--repull]
       [--count-reads] [--ssh [--hosts N]] [--sweep 24,48,192 [--cell-kb 64] [--play]]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
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


# ---------------------------------------------------------------- over SSH: stub boxes

def stubs_up(work: Path, count: int):
    """`count` stub boxes (tests/harness, their own session tag) and the inventory dir; (harness, tag, stubs,
    inv)."""
    sys.path.insert(0, str(REPO))
    from tests.harness import stubhost as sh

    sh.ensure_image()
    tag = sh.session_tag("rgtp")
    inv = work / "inv"
    inv.mkdir()
    sh.ensure_keypair(work / "keys")
    stubs = []
    try:
        for i in range(count):
            stubs.append(sh.start_stub(f"p{i}", keydir=work / "keys", known_hosts=inv / "known_hosts", tag=tag,
                                       instance_id=f"pull-bench-{i}"))
    except BaseException:
        sh.down(tag=tag)
        raise
    return sh, tag, stubs, inv


def write_inventory(inv: Path, stubs: list, job: dict | None) -> None:
    hosts = {}
    for s in stubs:
        hv = {k: v for k, v in s.inventory_vars().items() if k != "ansible_ssh_common_args"}
        hosts[s.name] = {**hv, "rgt_profile": "runpod", "ansible_python_interpreter": "/usr/bin/python3",
                         "rgt_durable_root": BOX_ROOT, "rgt_project": "proj", **({"rgt_job": job} if job else {})}
    (inv / "hosts.yml").write_text(yaml.safe_dump({"all": {"hosts": hosts}}))


BOX_ROOT = "/root/bench"
FINISHED = ('printf \'%s\\n\' \'{"attempt": 1, "started_at": "2026-01-01T00:00:00Z"}\' '
            '\'{"attempt": 1, "ended_at": "2026-01-01T00:10:00Z", "rc": 0, "reason": "finished"}\' '
            '> "$r/.rgt/attempts.jsonl"; echo \'{"attempt": 1, "rc": 0, "signal": null, "reason": "finished"}\' '
            '> "$r/.rgt/exit.json"; printf \'== rgt attempt 1 started 2026-01-01T00:00:00Z resume_from=\\n'
            'step=10 loss=0.5\\n\' > "$r/logs/job.log"; printf \'{"schema": 1, "run_id": "%s", "project": "proj", '
            '"run_dir": "%s", "outputs": [], "log_patterns": {}, "heartbeat_interval_s": 5}\' "$id" "$r" '
            '> "$r/.rgt/job.json"')


def box_runs(stub, run_ids: list[str], make_out: str) -> None:
    """Finished runs on a stub box: for each id, `make_out` (sh, $r the run dir) fills out/."""
    script = "set -e\nfor id in " + " ".join(run_ids) + "; do\n" + \
        f'r={BOX_ROOT}/proj/active/$id; mkdir -p "$r/.rgt" "$r/out" "$r/logs"\n{make_out}\n{FINISHED}\ndone\n'
    stub.exec(script, timeout=1800)


def ssh_rsync_sha(stub, src: str, dest: Path) -> None:
    rsh = " ".join(shlex.quote(a) for a in stub.ssh_argv()[:-1])
    dest.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run(["rsync", "-a", "-e", rsh, f"{stub.ssh_argv()[-1]}:{src}/", f"{dest}/"], check=True)
    sha_all(dest)


# `rgt-run pull` itself (rgt.cli.main in a fresh process), with the time of the report it writes after the verified
# pull (runreport.after_pull) said on stderr: the pull's own time is the rest
TIMED_PULL = """import sys, time
from rgt import runreport
from rgt.cli import main
inner = runreport.after_pull
def after_pull(*args, **kwargs):
    t0 = time.perf_counter()
    try:
        return inner(*args, **kwargs)
    finally:
        sys.stderr.write("RGT_BENCH_REPORT_S=%.4f\\n" % (time.perf_counter() - t0))
runreport.after_pull = after_pull
sys.exit(main(sys.argv[1:]))
"""


def rgt_pull_inv(inv: Path, runs: Path, work: Path, *extra: str) -> tuple[float, float, dict]:
    """(seconds, of which the report, the --json document) of one `rgt-run pull`."""
    argv = [str(VENV / "python"), "-c", TIMED_PULL, "pull", "-i", str(inv), "--runs-dir", str(runs), "--json",
            *extra]
    t0 = time.perf_counter()
    proc = subprocess.run(argv, capture_output=True, text=True, env=env(work), timeout=3600)
    took = time.perf_counter() - t0
    if proc.returncode != 0:
        sys.exit(f"rgt-run pull failed ({proc.returncode}): {proc.stderr[-3000:]}")
    found = re.findall(r"RGT_BENCH_REPORT_S=([\d.]+)", proc.stderr)
    return took, float(found[-1]) if found else 0.0, json.loads(proc.stdout)


def ssh_single(args, work: Path) -> dict:
    """One run of --big-mb + --small files on each of --hosts stub boxes: the pull round (every host in parallel)
    vs rsync over ssh + sha256sum per host (in parallel too)."""
    sh, tag, stubs, inv = stubs_up(work, args.hosts)
    try:
        make = (f'head -c {args.big_mb * 1048576} /dev/urandom > "$r/out/model.bin"; mkdir -p "$r/out/small"; '
                f'i=0; while [ $i -lt {args.small} ]; do head -c {args.small_kb * 1024} /dev/urandom '
                f'> "$r/out/small/part-$i.bin"; i=$((i+1)); done')
        rows = {"rgt": [], "baseline": []}
        with ThreadPoolExecutor(max_workers=min(16, len(stubs))) as pool:
            for i in range(args.rounds):
                run_id = f"bench-ssh-{i}"
                list(pool.map(lambda stub, run_id=run_id: box_runs(stub, [run_id], make), stubs))
                write_inventory(inv, stubs, {"name": run_id, "outputs": []})
                took, _report, doc = rgt_pull_inv(inv, work / f"runs{i}", work)
                assert all(doc["hosts"][stub.name]["verified"] for stub in stubs), doc
                rows["rgt"].append(took)
                t0 = time.perf_counter()
                list(pool.map(lambda stub, run_id=run_id, i=i: ssh_rsync_sha(
                    stub, f"{BOX_ROOT}/proj/active/{run_id}/out", work / f"b{i}" / stub.name), stubs))
                rows["baseline"].append(time.perf_counter() - t0)
                shutil.rmtree(work / f"runs{i}")
                shutil.rmtree(work / f"b{i}")
                list(pool.map(lambda stub, run_id=run_id: stub.exec(
                    f"rm -rf {BOX_ROOT}/proj/active/{run_id} {BOX_ROOT}/proj/export/{run_id}*"), stubs))
        med = {k: statistics.median(v) for k, v in rows.items()}
        return {"case": f"over ssh: {args.big_mb} MB + {args.small} x {args.small_kb} KB, {args.hosts} host(s)",
                "rounds": args.rounds, "rgt_s": round(med["rgt"], 2), "baseline_s": round(med["baseline"], 2),
                "ratio": round(med["rgt"] / med["baseline"], 2), "every_host_verified": True}
    finally:
        sh.down(tag=tag)


def remember_sweep(ledger: Path, name: str, size: int, stubs: list, cells: dict) -> None:
    """The ledger's records of a sweep as `rgt-run train` leaves them: its roster, and each cell as a run."""
    from rgt import memory, rosters
    from rgt.ledger import atomic_write_json

    job = {"name": name, "outputs": [], "sweep": {"matrix": {"seed": list(range(size))}}}
    atomic_write_json(rosters.roster_path(ledger, "proj", name), {
        "schema": rosters.ROSTER_SCHEMA, "sweep": name, "project": "proj", "job": job,
        "created_at": "2026-12-02T00:00:00+00:00",
        "cells": [{"id": c, "host": s.name, "params": {"seed": int(c.rsplit("=", 1)[1])}}
                  for s in stubs for c in cells[s.name]]})
    for s in stubs:
        for cell in cells[s.name]:
            memory.record_launch(ledger, s.name, s.instance_id, "proj", {"name": cell, "outputs": []},
                                 {"state": "finished", "attempt": 1, "action": "launched", "detach": "nohup"},
                                 sweep=name)


def sweep(args, work: Path) -> dict:
    """A finished sweep of each size on 2 stub boxes: `rgt-run pull` (every cell) vs one rsync per box + sha256sum."""
    sys.path.insert(0, str(REPO / "runner"))

    sizes = [int(n) for n in args.sweep.split(",")]
    sh, tag, stubs, inv = stubs_up(work, 2)
    write_inventory(inv, stubs, None)
    kb = max(4, args.cell_kb // 4)
    make = (f'for f in a b c d; do head -c {kb * 1024} /dev/urandom > "$r/out/$f.bin"; done; '
            'echo \'{"loss": 0.5}\' > "$r/out/metrics.json"')
    out = {"case": f"sweep on 2 stub boxes, cells of 4 x {kb} KB + metrics + logs", "rounds": args.rounds,
           "sizes": {}}
    try:
        for size in sizes:
            rows = {"rgt": [], "baseline": [], "play": [], "report": []}
            for i in range(args.rounds + (1 if args.play and size == sizes[0] else 0)):
                name = f"sw{size}r{i}"
                ledger = work / "ledger"
                shutil.rmtree(ledger, ignore_errors=True)
                cells = {s.name: [f"{name}--seed={k}" for k in range(j, size, len(stubs))]
                         for j, s in enumerate(stubs)}
                with ThreadPoolExecutor(max_workers=2) as pool:
                    list(pool.map(box_runs, stubs, [cells[s.name] for s in stubs], [make] * len(stubs)))
                remember_sweep(ledger, name, size, stubs, cells)
                # the sweep was watched to its end: the ledger holds each box's settled status (the report reuses it)
                subprocess.run([str(VENV / "rgt-run"), "status", "-i", str(inv), "--json"], capture_output=True,
                               env=env(work), timeout=600, check=False)
                runs = work / f"runs-{name}"
                play = args.play and i == args.rounds
                took, report, doc = rgt_pull_inv(inv, runs, work,
                                                 *(["-e", f"collect_runs_dir={runs}"] if play else []))
                verified = [c for h in doc["hosts"].values() for c, d in (h.get("cells") or {}).items()
                            if d.get("verified")]
                assert len(verified) == size, doc
                rows["play" if play else "rgt"].append(took)
                if not play:
                    rows["report"].append(report)
                    t0 = time.perf_counter()
                    with ThreadPoolExecutor(max_workers=2) as pool:
                        list(pool.map(lambda s: ssh_rsync_sha(s, f"{BOX_ROOT}/proj/active", work / f"b-{s.name}"),
                                      stubs))
                    rows["baseline"].append(time.perf_counter() - t0)
                for s in stubs:
                    shutil.rmtree(work / f"b-{s.name}", ignore_errors=True)
                    s.exec(f"rm -rf {BOX_ROOT}/proj/active/{name}-* {BOX_ROOT}/proj/export/{name}-*")
                shutil.rmtree(runs, ignore_errors=True)
            med = {k: statistics.median(v) for k, v in rows.items() if v}
            bare = statistics.median(a - b for a, b in zip(rows["rgt"], rows["report"], strict=True))
            out["sizes"][size] = {"rgt_s": round(med["rgt"], 2), "report_s": round(med["report"], 2),
                                  "rgt_without_report_s": round(bare, 2), "baseline_s": round(med["baseline"], 2),
                                  "ratio": round(med["rgt"] / med["baseline"], 2),
                                  "ratio_without_report": round(bare / med["baseline"], 2),
                                  **({"play_s": round(med["play"], 2)} if "play" in med else {})}
        if len(sizes) > 1:
            lo, hi = sizes[0], sizes[-1]
            out["per_extra_cell_s"] = round((out["sizes"][hi]["rgt_s"] - out["sizes"][lo]["rgt_s"]) / (hi - lo), 4)
            out["per_extra_cell_without_report_s"] = round(
                (out["sizes"][hi]["rgt_without_report_s"] - out["sizes"][lo]["rgt_without_report_s"]) / (hi - lo), 4)
            out["baseline_per_extra_cell_s"] = round(
                (out["sizes"][hi]["baseline_s"] - out["sizes"][lo]["baseline_s"]) / (hi - lo), 4)
        return out
    finally:
        sh.down(tag=tag)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--big-mb", type=int, default=300)
    ap.add_argument("--small", type=int, default=2000)
    ap.add_argument("--small-kb", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=3, help="timed rounds (0: only --count-reads)")
    ap.add_argument("--repull", action="store_true", help="also time a second pull over the verified copy")
    ap.add_argument("--count-reads", action="store_true", help="count bytes read per side (strace, one pull)")
    ap.add_argument("--ssh", action="store_true", help="the run on a stub box, pulled by the pull round")
    ap.add_argument("--hosts", type=int, default=1, help="with --ssh: that many stub boxes, one run each")
    ap.add_argument("--sweep", metavar="N,N,...", help="finished sweeps of N cells on 2 stub boxes")
    ap.add_argument("--cell-kb", type=int, default=64, help="a sweep cell's outputs, KB")
    ap.add_argument("--play", action="store_true", help="with --sweep: also time the collect play, smallest sweep")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="rgt-pull-bench-"))
    if args.ssh or args.sweep:
        try:
            print(json.dumps(sweep(args, work) if args.sweep else ssh_single(args, work), indent=1))
            return 0
        finally:
            shutil.rmtree(work, ignore_errors=True)
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
