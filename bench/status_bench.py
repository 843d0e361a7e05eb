#!/usr/bin/env python3
"""How much does `rgt-run status --json` cost over N stub hosts, against the floor of one parallel SSH round?

Baselines, measured in the same run on the same stubs (ratios, never a timed assertion):
- floor: a parallel multiplexed ssh round (ControlMaster, warm) running one `python3 -c` call per host, all at once:
  what any status poll that runs Python on the box must at least pay;
- plain: a plain parallel `ssh host cat <run_dir>/.rgt/heartbeat` to every host (no multiplexing; the old baseline).
Also measured: the status round alone inside one process (rgt.engines.poll: no process start, no inventory read),
the controller CPU of one watch tick (user+sys of this process and its ssh children during one poll), and with
--play the old path, one monitor.yml run through ansible-runner (rgt.observe.poll_play).
With --compare DIR, `rgt-run status --json` of another checkout (PYTHONPATH=DIR/runner: its runner and collection)
is measured in the same rounds too.
Usage: python bench/status_bench.py [--hosts 16] [--rounds 5] [--play] [--compare DIR] [--profile FILE]
"""

from __future__ import annotations

import argparse
import io
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.harness import stubhost as sh  # noqa: E402

JOB = {"name": "bench", "python": "/usr/bin/python3", "command": "true"}
# the wrapper's GPU samples of a run (gpu.csv): status reads them instead of calling nvidia-smi (on the stubs a
# Python script, which would double the Python starts the box pays per look)
GPU_ROWS = "".join(f"{100 + t},{i},{90 + i},{20000 + i},81920,60\\n" for t in range(3) for i in range(2))


def seed_run(stub: sh.StubHost) -> str:
    """A finished run layout on the box (with the wrapper's gpu.csv), so status has real files to read."""
    run = "/workspace/rgt/active/bench"
    stub.exec(f"mkdir -p {run}/.rgt {run}/logs {run}/out {run}/ckpt && "
              f"echo 'step=10 loss=0.5' > {run}/logs/job.log && "
              f"echo '{{\"ts\": 0, \"attempt\": 1}}' > {run}/.rgt/heartbeat && "
              f"echo '{json.dumps({'schema': 1, 'run_id': 'bench', 'command': 'true', 'outputs': []})}' "
              f"> {run}/.rgt/job.json && "
              f"echo '{json.dumps({'attempt': 1, 'rc': 0, 'reason': 'finished', 'signal': None})}' "
              f"> {run}/.rgt/exit.json && "
              f"printf 'ts,index,util_pct,mem_used_mib,mem_total_mib,temp_c\\n{GPU_ROWS}' > {run}/.rgt/gpu.csv")
    return f"{run}/.rgt/heartbeat"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hosts", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--play", action="store_true", help="also time the monitor play (the path before the round)")
    ap.add_argument("--start-workers", type=int, default=4, help="stubs started at once")
    ap.add_argument("--compare", metavar="DIR", help="also time another checkout's rgt-run status (its runner/)")
    ap.add_argument("--profile", metavar="FILE", help="after the rounds, one fresh rgt-run status under cProfile")
    args = ap.parse_args()
    sh.ensure_image()
    tag = sh.session_tag("rgtb")
    work = Path(tempfile.mkdtemp(prefix="rgt-bench-"))
    inv = work / "inv"
    inv.mkdir()
    try:
        sh.ensure_keypair(work / "keys")

        def start(i: int) -> sh.StubHost:
            return sh.start_stub(f"b{i}", keydir=work / "keys", known_hosts=inv / "known_hosts", tag=tag,
                                 instance_id=f"bench-{i}", mounts=[{"path": "/workspace", "size_mib": 32}])

        t_start = time.perf_counter()
        with ThreadPoolExecutor(max_workers=args.start_workers) as pool:
            stubs = list(pool.map(start, range(args.hosts)))
        print(f"{args.hosts} stubs up in {time.perf_counter() - t_start:.0f} s", file=sys.stderr)
        hosts = {}
        for s in stubs:
            hb = seed_run(s)
            hv = {k: v for k, v in s.inventory_vars().items() if k != "ansible_ssh_common_args"}
            hosts[s.name] = {**hv, "rgt_profile": "runpod", "ansible_python_interpreter": "/usr/bin/python3",
                             "rgt_project": "rgt", "rgt_job": JOB}
        import yaml
        (inv / "hosts.yml").write_text(yaml.safe_dump({"all": {"hosts": hosts}}))
        env = {**os.environ, "RGT_LEDGER": str(work / "ledger")}

        base_env = {**env, "PYTHONPATH": str(Path(args.compare).resolve() / "runner")} if args.compare else env

        def rgt_status(run_env: dict = env) -> float:
            t0 = time.perf_counter()
            proc = subprocess.run([sys.executable, "-m", "rgt.cli", "status", "-i", str(inv), "--json"],
                                  capture_output=True, text=True, env=run_env, cwd=REPO)
            elapsed = time.perf_counter() - t0
            doc = json.loads(proc.stdout)
            assert len(doc["hosts"]) == args.hosts and all(
                h.get("state") == "finished" for h in doc["hosts"].values()), proc.stdout[:500]
            return elapsed

        floor_opts = ["-o", "ControlMaster=auto", "-o", "ControlPersist=120s",
                      "-o", f"ControlPath={work}/cm-%C"]

        def floor_round() -> float:
            t0 = time.perf_counter()
            with ThreadPoolExecutor(max_workers=args.hosts) as pool:
                outs = list(pool.map(lambda s: subprocess.run(
                    s.ssh_argv("python3 -c 'import json; print(json.dumps({}))'", extra_opts=floor_opts),
                    capture_output=True, timeout=60), stubs))
            assert all(o.returncode == 0 for o in outs), [o.stderr for o in outs if o.returncode]
            return time.perf_counter() - t0

        os.environ["RGT_LEDGER"] = env["RGT_LEDGER"]
        from rich.console import Console

        from rgt import engines, observe
        from rgt.prepare import prepare

        ns = argparse.Namespace(inventory=str(inv), limit=None, extra_vars=[], verbose=0, ledger=env["RGT_LEDGER"],
                                playbook="monitor")
        _pb, host_objs, extravars = prepare(ns)
        quiet = Console(file=io.StringIO())
        ledger = Path(env["RGT_LEDGER"])

        def in_process_tick() -> tuple[float, float]:
            """(wall s, controller CPU s) of one poll, as one watch tick pays it."""
            c0, t0 = os.times(), time.perf_counter()
            docs = engines.poll(ns, quiet, host_objs, extravars, ledger)
            t1, c1 = time.perf_counter(), os.times()
            assert all(d.get("state") == "finished" for d in docs.values()), docs
            cpu = (c1.user - c0.user) + (c1.system - c0.system) + (c1.children_user - c0.children_user) + (
                c1.children_system - c0.children_system)
            return t1 - t0, cpu

        def play_poll() -> float:
            t0 = time.perf_counter()
            docs = observe.poll_play(ns, quiet, host_objs, extravars, ledger)
            assert all(d.get("state") == "finished" for d in docs.values()), docs
            return time.perf_counter() - t0

        def plain_ssh() -> float:
            t0 = time.perf_counter()
            with ThreadPoolExecutor(max_workers=args.hosts) as pool:
                outs = list(pool.map(lambda s: s.ssh(f"cat {hb}"), stubs))
            assert all(o.returncode == 0 for o in outs)
            return time.perf_counter() - t0

        rgt_status()  # warm: ControlPersist masters, the zipapp shipped to every box, bytecode caches
        if args.compare:
            rgt_status(base_env)
        plain_ssh()
        floor_round()
        in_process_tick()
        rgt_t, floor_t, ssh_t, tick_t, tick_cpu, base_t = [], [], [], [], [], []
        for _ in range(args.rounds):  # interleaved, so a slow moment of the machine hits every measure alike
            rgt_t.append(rgt_status())
            if args.compare:
                base_t.append(rgt_status(base_env))
            floor_t.append(floor_round())
            ssh_t.append(plain_ssh())
            wall, cpu = in_process_tick()
            tick_t.append(wall)
            tick_cpu.append(cpu)
        med = {k: statistics.median(v) for k, v in (("rgt", rgt_t), ("floor", floor_t), ("ssh", ssh_t),
                                                       ("tick", tick_t), ("cpu", tick_cpu))}
        result = {"hosts": args.hosts, "rounds": args.rounds,
                  "rgt_status_median_s": round(med["rgt"], 3),
                  "mux_python_round_median_s": round(med["floor"], 3),
                  "plain_ssh_cat_median_s": round(med["ssh"], 3),
                  "status_round_in_process_median_s": round(med["tick"], 3),
                  "watch_tick_controller_cpu_s": round(med["cpu"], 3),
                  "ratio_status_vs_mux_python_round": round(med["rgt"] / med["floor"], 2),
                  "ratio_round_in_process_vs_mux_python_round": round(med["tick"] / med["floor"], 2),
                  "every_host_answered": True}
        if args.compare:
            base = statistics.median(base_t)
            result["compare_rgt_status_median_s"] = round(base, 3)
            result["ratio_compare_vs_mux_python_round"] = round(base / med["floor"], 2)
        result["load_average"] = [round(x, 2) for x in os.getloadavg()]
        if args.play:
            play_poll()
            play = statistics.median([play_poll() for _ in range(max(1, args.rounds // 2))])
            result["monitor_play_median_s"] = round(play, 3)
            result["ratio_play_vs_mux_python_round"] = round(play / med["floor"], 2)
        if args.profile:  # where a fresh process's time goes: python -m pstats FILE
            subprocess.run([sys.executable, "-m", "cProfile", "-o", args.profile, "-m", "rgt.cli", "status", "-i",
                            str(inv), "--json"], capture_output=True, env=env, cwd=REPO, check=True)
        print(json.dumps(result))
        print(f"rgt-run status --json on {args.hosts} stubs: median {med['rgt']:.2f} s; multiplexed python3 round: "
              f"{med['floor']:.2f} s; ratio {med['rgt'] / med['floor']:.2f}x; the round in-process "
              f"{med['tick']:.2f} s ({med['tick'] / med['floor']:.2f}x), a watch tick's controller CPU "
              f"{med['cpu']:.2f} s", file=sys.stderr)
    finally:
        sh.down(tag=tag)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
