#!/usr/bin/env python3
"""How long does `rgt-run train` take to a run's first heartbeat on a stub box, against a hand-written launch?

Measured in one run on the same stub, interleaved round by round (medians; ratios, never a timed assertion):
- first contact: `rgt-run train` with an empty ledger (smoke skipped): probe, env_check, upload, launch;
- seen before: `rgt-run train` of a new run on the same box with the ledger of the rounds before (a probe and an
  env_check of this instance younger than their reuse windows are in it);
- baseline: `rsync -a` of the code dir to the box, then `ssh box tmux new -d ...` (the same pinned SSH options),
  returning once the job's first line is on the box (rgt's train returns once the run's wrapper heartbeats): cold
  (two fresh SSH connections, as a hand-typed launch pays; the issue's baseline) and over a warm ControlMaster.
Every run is a new run id (a fresh run dir: the code is uploaded and verified every round); each is stopped after.
Where the time goes: each task's duration from rgt's own event timestamps (<ledger>/events/*.jsonl), --tasks.
With --compare DIR (a checkout of another commit, e.g. `git archive BASE | tar -x -C DIR`), that commit's runner
and collection (PYTHONPATH=DIR/runner) are measured too, interleaved in the same rounds: before/after in one run.
Usage: python bench/launch_bench.py [--rounds 3] [--tasks] [--compare DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.harness import stubhost as sh  # noqa: E402

CODE = REPO / "examples" / "tiny_train"
RUNS = "/workspace/rgt/active"


def job(run_id: str) -> dict:
    return {"name": run_id, "python": "/usr/bin/python3", "code_dir": str(CODE),
            "command": "python3 train.py --steps 100000 --ckpt-every 1000 --sleep 0.5",
            "checkpoint": {"glob": "step_*.ckpt"}, "outputs": ["weights.bin"], "disk_floor_gib": 0.05}


def task_times(events: Path) -> list[tuple[str, float]]:
    """(task, seconds) for each task of the newest train event log, from one task start to the next."""
    log = sorted(events.glob("*-train-*.jsonl"))[-1]
    starts = []
    for line in log.read_text().splitlines():
        rec = json.loads(line)
        if rec["event"] in ("playbook_on_task_start", "playbook_on_stats") and rec.get("t"):
            starts.append((rec["task"], datetime.fromisoformat(rec["t"]).timestamp()))
    return [(t, round(b - a, 3)) for (t, a), (_, b) in zip(starts, starts[1:], strict=False)]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--tasks", action="store_true", help="print each task's duration of the last rounds")
    ap.add_argument("--compare", type=Path, help="a checkout of another commit, measured interleaved")
    args = ap.parse_args()
    sh.ensure_image()
    tag = sh.session_tag("rgtl")
    work = Path(tempfile.mkdtemp(prefix="rgt-launch-bench-"))
    inv = work / "inv"
    inv.mkdir()
    try:
        sh.ensure_keypair(work / "keys")
        stub = sh.start_stub("lb", keydir=work / "keys", known_hosts=inv / "known_hosts", tag=tag,
                             instance_id="bench-launch", mounts=[{"path": "/workspace", "size_mib": 128}])
        hv = {k: v for k, v in stub.inventory_vars().items() if k != "ansible_ssh_common_args"}
        import yaml
        (inv / "hosts.yml").write_text(yaml.safe_dump({"all": {"hosts": {"lb": {
            **hv, "rgt_profile": "runpod", "ansible_python_interpreter": "/usr/bin/python3", "rgt_project": "rgt"}}}}))
        seen = work / "ledger-seen"
        counter = iter(range(10_000))

        def stop_runs() -> None:
            stub.exec(["bash", "-c", "pkill -f '[r]gt/active/' || true; pkill -f '[b]ench-base' || true; "
                                     "tmux kill-server 2>/dev/null || true"])

        def rgt_train(ledger: Path, code: Path | None = None) -> float:
            run_id = f"lb{next(counter)}"
            env = {**os.environ, "RGT_LEDGER": str(ledger)}
            if code:
                env["PYTHONPATH"] = str(code.resolve() / "runner")
            t0 = time.perf_counter()
            proc = subprocess.run([sys.executable, "-m", "rgt.cli", "train", "-i", str(inv), "--json",
                                   "-e", json.dumps({"rgt_job": job(run_id), "rgt_skip_smoke": True})],
                                  capture_output=True, text=True, cwd=REPO, env=env)
            elapsed = time.perf_counter() - t0
            assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
            hb = stub.exec(["bash", "-c", f"test -s {RUNS}/{run_id}/.rgt/heartbeat && echo yes"]).stdout
            assert hb.strip() == "yes", f"{run_id}: no heartbeat after train returned"
            stop_runs()
            return elapsed

        mux = ["-o", "ControlMaster=auto", "-o", "ControlPersist=120s", "-o", f"ControlPath={work}/cm-%C"]

        def baseline(mux: list[str]) -> float:
            n = next(counter)
            ssh_e = " ".join(stub.ssh_argv(extra_opts=mux)[:-1])
            dest = f"/workspace/bench-base{n}"
            t0 = time.perf_counter()
            subprocess.run(["rsync", "-a", "--mkpath", "-e", ssh_e, f"{CODE}/", f"root@127.0.0.1:{dest}/"],
                           check=True, capture_output=True)
            # the job's first line on the box, as rgt's train waits for the first heartbeat
            subprocess.run(stub.ssh_argv(
                f"cd {dest} && tmux new -d -s bench-base{n} 'python3 train.py --steps 100000 --sleep 0.5 "
                f"> job.log 2>&1' && for i in $(seq 200); do test -s job.log && break; sleep 0.02; done",
                extra_opts=mux), check=True, capture_output=True)
            elapsed = time.perf_counter() - t0
            stop_runs()
            return elapsed

        rgt_train(seen)  # warm: bytecode caches, the inventory cache, the box's first probe in the "seen" ledger
        baseline(mux)
        seen_other = work / "ledger-seen-other"
        if args.compare:
            rgt_train(seen_other, args.compare)
        first_t, seen_t, base_t, mux_t, first_o, seen_o = [], [], [], [], [], []
        for _ in range(args.rounds):  # interleaved, so a slow moment of the machine hits every measure alike
            fresh = work / f"ledger-fresh-{next(counter)}"
            first_t.append(rgt_train(fresh))
            seen_t.append(rgt_train(seen))
            base_t.append(baseline([]))
            mux_t.append(baseline(mux))
            if args.compare:
                first_o.append(rgt_train(work / f"ledger-fresh-{next(counter)}", args.compare))
                seen_o.append(rgt_train(seen_other, args.compare))
        if args.tasks:
            for name, ledger in (("first contact", fresh), ("seen before", seen)):
                print(f"-- {name}: each task's seconds", file=sys.stderr)
                for task, secs in task_times(ledger / "events"):
                    print(f"  {secs:6.2f}  {task}", file=sys.stderr)
        med = {k: statistics.median(v) for k, v in (("first", first_t), ("seen", seen_t), ("base", base_t),
                                                       ("mux", mux_t))}
        result = {"rounds": args.rounds, "each_s": {"first_contact": [round(t, 2) for t in first_t],
                                                   "seen_before": [round(t, 2) for t in seen_t],
                                                   "baseline": [round(t, 2) for t in base_t],
                                                   "baseline_warm_mux": [round(t, 2) for t in mux_t]},
                  "train_first_contact_median_s": round(med["first"], 3),
                  "train_seen_before_median_s": round(med["seen"], 3),
                  "baseline_rsync_tmux_median_s": round(med["base"], 3),
                  "baseline_over_warm_mux_median_s": round(med["mux"], 3),
                  "ratio_first_contact": round(med["first"] / med["base"], 2),
                  "ratio_seen_before": round(med["seen"] / med["base"], 2),
                  "ratio_seen_before_vs_warm_mux": round(med["seen"] / med["mux"], 2)}
        if args.compare:
            for key, vals in (("compare_first_contact", first_o), ("compare_seen_before", seen_o)):
                result["each_s"][key] = [round(t, 2) for t in vals]
                result[key + "_median_s"] = round(statistics.median(vals), 3)
                result["ratio_" + key] = round(statistics.median(vals) / med["base"], 2)
        print(json.dumps(result))
        print(f"rgt-run train to first heartbeat: first contact {med['first']:.2f} s "
              f"({med['first'] / med['base']:.1f}x), box seen before {med['seen']:.2f} s "
              f"({med['seen'] / med['base']:.1f}x); rsync + ssh tmux new {med['base']:.2f} s "
              f"(over a warm ControlMaster {med['mux']:.2f} s)", file=sys.stderr)
    finally:
        sh.down(tag=tag)
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
