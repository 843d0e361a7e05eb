#!/usr/bin/env python3
"""What does one Ansible module execution cost on a stub box, against the SSH round trip under it?

The floor of every box-side step of a play (rgt's env_check, the upload's look and verification, the launch):
measured in one run on one stub (tests/harness: podman, real sshd, pinned host key), ansible.cfg as rgt-run uses
it (pipelining, ControlPersist, no fact gathering), medians of --rounds:
- tasks: N `ansible.builtin.ping` tasks in one play (N worker forks, N module executions);
- loop: one ping task with a loop of N items (one worker, N module executions);
- ssh: N `ssh box python3 -c pass` over a warm ControlMaster (the same pinned options).
Each figure is per execution, from the controller's timestamps between marker tasks. Ratios, never a timed test.
Usage: python bench/module_cost.py [--n 5] [--rounds 3]
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
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.harness import stubhost as sh  # noqa: E402

MARK = '- ansible.builtin.debug: {msg: "MARK {{ now().timestamp() }}"}\n'


def playbook(n: int) -> str:
    tasks = MARK + "- ansible.builtin.ping:\n" + MARK  # the first execution opens the ControlMaster: not counted
    tasks += "- ansible.builtin.ping:\n" * n + MARK
    tasks += f"- ansible.builtin.ping:\n  loop: {list(range(n))}\n" + MARK
    return "- hosts: all\n  gather_facts: false\n  tasks:\n" + "".join("    " + line for line in tasks.splitlines(True))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    sh.ensure_image()
    tag = sh.session_tag("rgtm")
    work = Path(tempfile.mkdtemp(prefix="rgt-module-cost-"))
    inv = work / "inv"
    inv.mkdir()
    try:
        sh.ensure_keypair(work / "keys")
        stub = sh.start_stub("mc", keydir=work / "keys", known_hosts=inv / "known_hosts", tag=tag,
                             instance_id="bench-module-cost", mounts=[{"path": "/workspace", "size_mib": 32}])
        (inv / "hosts.json").write_text(json.dumps({"all": {"hosts": {"mc": {
            **stub.inventory_vars(), "ansible_python_interpreter": "/usr/bin/python3"}}}}))
        (work / "pb.yml").write_text(playbook(args.n))
        env = {**os.environ, "ANSIBLE_CONFIG": str(REPO / "ansible.cfg")}
        mux = ["-o", "ControlMaster=auto", "-o", "ControlPersist=60s", "-o", f"ControlPath={work}/cm-%C"]
        subprocess.run(stub.ssh_argv("true", extra_opts=mux), check=True)  # open the master
        tasks, loop, ssh = [], [], []
        for _ in range(args.rounds):
            out = subprocess.run(["ansible-playbook", "-i", str(inv / "hosts.json"), str(work / "pb.yml")],
                                 capture_output=True, text=True, env=env, cwd=REPO, check=True).stdout
            marks = [float(line.split("MARK ")[1].strip().strip('"')) for line in out.splitlines()
                     if "msg: MARK " in line]
            tasks.append((marks[2] - marks[1]) / args.n)
            loop.append((marks[3] - marks[2]) / args.n)
            t0 = time.perf_counter()
            for _ in range(args.n):
                subprocess.run(stub.ssh_argv("python3 -c pass", extra_opts=mux), check=True)
            ssh.append((time.perf_counter() - t0) / args.n)
        med = {k: statistics.median(v) for k, v in (("tasks", tasks), ("loop", loop), ("ssh", ssh))}
        print(json.dumps({"n": args.n, "rounds": args.rounds, "per_task_s": round(med["tasks"], 3),
                          "per_loop_item_s": round(med["loop"], 3), "per_ssh_python_s": round(med["ssh"], 3),
                          "ratio_task_vs_ssh": round(med["tasks"] / med["ssh"], 1),
                          "load_average": [round(x, 2) for x in os.getloadavg()]}))
    finally:
        sh.down(tag=tag)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
