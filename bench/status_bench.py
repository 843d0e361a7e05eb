#!/usr/bin/env python3
"""How much does `rgt-run status --json` cost over N stub hosts, against the floor of one parallel SSH round?

Baseline: a plain parallel `ssh host cat <run_dir>/.rgt/heartbeat` to every host (one round trip each, all at
once) — what any status poll must at least pay. Measured in one run on the same stubs, reported as a ratio;
never a timed assertion. Usage: python bench/status_bench.py [--hosts 8] [--rounds 5]
"""

from __future__ import annotations

import argparse
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


def seed_run(stub: sh.StubHost) -> str:
    """A finished run layout on the box, so status has real files to read."""
    run = "/workspace/rgt/active/bench"
    stub.exec(f"mkdir -p {run}/.rgt {run}/logs {run}/out {run}/ckpt && "
              f"echo 'step=10 loss=0.5' > {run}/logs/job.log && "
              f"echo '{{\"ts\": 0, \"attempt\": 1}}' > {run}/.rgt/heartbeat && "
              f"echo '{json.dumps({'schema': 1, 'run_id': 'bench', 'command': 'true', 'outputs': []})}' "
              f"> {run}/.rgt/job.json && "
              f"echo '{json.dumps({'attempt': 1, 'rc': 0, 'reason': 'finished', 'signal': None})}' "
              f"> {run}/.rgt/exit.json")
    return f"{run}/.rgt/heartbeat"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hosts", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    sh.ensure_image()
    tag = sh.session_tag("rgtb")
    work = Path(tempfile.mkdtemp(prefix="rgt-bench-"))
    inv = work / "inv"
    inv.mkdir()
    try:
        stubs = [sh.start_stub(f"b{i}", keydir=work / "keys", known_hosts=inv / "known_hosts", tag=tag,
                               instance_id=f"bench-{i}", mounts=[{"path": "/workspace", "size_mib": 32}])
                 for i in range(args.hosts)]
        hosts = {}
        for s in stubs:
            hb = seed_run(s)
            hv = {k: v for k, v in s.inventory_vars().items() if k != "ansible_ssh_common_args"}
            hosts[s.name] = {**hv, "rgt_profile": "runpod", "ansible_python_interpreter": "/usr/bin/python3",
                             "rgt_project": "rgt", "rgt_job": JOB}
        import yaml
        (inv / "hosts.yml").write_text(yaml.safe_dump({"all": {"hosts": hosts}}))
        env = {**os.environ, "RGT_LEDGER": str(work / "ledger")}

        def rgt_status() -> float:
            t0 = time.perf_counter()
            proc = subprocess.run([sys.executable, "-m", "rgt.cli", "status", "-i", str(inv), "--json"],
                                  capture_output=True, text=True, env=env, cwd=REPO)
            elapsed = time.perf_counter() - t0
            doc = json.loads(proc.stdout)
            assert len(doc["hosts"]) == args.hosts and all(
                h.get("state") == "finished" for h in doc["hosts"].values()), proc.stdout[:500]
            return elapsed

        def plain_ssh() -> float:
            t0 = time.perf_counter()
            with ThreadPoolExecutor(max_workers=args.hosts) as pool:
                outs = list(pool.map(lambda s: s.ssh(f"cat {hb}"), stubs))
            assert all(o.returncode == 0 for o in outs)
            return time.perf_counter() - t0

        rgt_status()  # warm: ControlPersist masters, bytecode caches
        plain_ssh()
        rgt_t = [rgt_status() for _ in range(args.rounds)]
        ssh_t = [plain_ssh() for _ in range(args.rounds)]
        med_rgt, med_ssh = statistics.median(rgt_t), statistics.median(ssh_t)
        print(json.dumps({"hosts": args.hosts, "rounds": args.rounds,
                          "rgt_status_median_s": round(med_rgt, 3), "parallel_ssh_cat_median_s": round(med_ssh, 3),
                          "ratio": round(med_rgt / med_ssh, 1)}))
        print(f"rgt-run status --json on {args.hosts} stubs: median {med_rgt:.2f} s; plain parallel ssh cat: "
              f"{med_ssh:.2f} s; ratio {med_rgt / med_ssh:.1f}x", file=sys.stderr)
    finally:
        sh.down(tag=tag)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
