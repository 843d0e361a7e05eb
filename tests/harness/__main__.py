"""CLI for the stub hosts; every command prints one JSON document on stdout.

  python -m tests.harness image                      # build/refresh the image (scripts/setup-stubs.sh)
  python -m tests.harness up NAME [NAME...] --keydir DIR [--tag T] [--known-hosts F] [--memory 512m]
        [--cpus 1.5] [--mount PATH:SIZE_MIB[:INODES[:persist]]]... [--gpu-state FILE_OR_JSON] [--hostname H]
        [--instance-id ID] [--port N] [--no-wait]
  python -m tests.harness list [--tag T]
  python -m tests.harness inventory --tag T         # {"all": {"hosts": {NAME: hostvars}}}
  python -m tests.harness down [NAME...] [--tag T] [--all] [--host-cleanup]
  python -m tests.harness pin NAME --tag T
  python -m tests.harness gpu NAME --tag T [--state FILE_OR_JSON] [--set K=JSON]... [--gpu-set K=JSON]...
        [--index I]
  python -m tests.harness dmesg NAME --tag T [--append LINE]... [--clear]
  python -m tests.harness fill NAME PATH --tag T [--inodes-pct X] [--bytes-pct Y] | --undo
  python -m tests.harness rotate-key NAME --tag T [--mode hup|restart]
  python -m tests.harness preempt NAME --tag T [--grace S] [--pid1-only] [--restart]
  python -m tests.harness reboot|pause|unpause|start|stop NAME --tag T
  python -m tests.harness cut NAME --tag T [--method nft|link] ; restore NAME --tag T
  python -m tests.harness rate NAME --tag T --rate 1mbit [--both] ; unrate NAME --tag T
  python -m tests.harness exec NAME --tag T -- CMD...
  python -m tests.harness host-cleanup [--reset-ip-forward]

NAME is the short name given to `up` (with --tag) or the full container name (without --tag).
The tag defaults to $RGT_STUB_TAG; `up` makes a random one when neither is given and prints it.
Errors: {"error": "..."} and exit status 1.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from . import stubhost as sh


def _json_arg(v: str):
    p = Path(v)
    if not v.lstrip().startswith(("{", "[")) and p.exists():
        return json.loads(p.read_text())
    return json.loads(v)


def _kv(items):
    out = {}
    for it in items or []:
        k, _, v = it.partition("=")
        try:
            out[k] = json.loads(v)
        except ValueError:
            out[k] = v
    return out


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="python -m tests.harness", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = ap.add_subparsers(dest="cmd", required=True)

    def with_tag(p):
        p.add_argument("--tag", default=os.environ.get("RGT_STUB_TAG"))
        return p

    def one(name):
        p = with_tag(sub.add_parser(name))
        p.add_argument("name")
        return p

    sub.add_parser("image")
    p = with_tag(sub.add_parser("up"))
    p.add_argument("names", nargs="+")
    p.add_argument("--keydir", required=True)
    p.add_argument("--known-hosts")
    p.add_argument("--instance-id", help="only with one NAME")
    p.add_argument("--hostname")
    p.add_argument("--memory")
    p.add_argument("--cpus")
    p.add_argument("--mount", action="append", default=[], help="PATH:SIZE_MIB[:INODES[:persist]]")
    p.add_argument("--gpu-state")
    p.add_argument("--port", type=int)
    p.add_argument("--no-wait", action="store_true")
    p.add_argument("--image", default=sh.IMAGE)
    with_tag(sub.add_parser("list"))
    with_tag(sub.add_parser("inventory"))
    p = with_tag(sub.add_parser("down"))
    p.add_argument("names", nargs="*")
    p.add_argument("--all", action="store_true")
    p.add_argument("--host-cleanup", action="store_true")
    one("pin")
    p = one("gpu")
    p.add_argument("--state")
    p.add_argument("--set", action="append")
    p.add_argument("--gpu-set", action="append")
    p.add_argument("--index", type=int)
    p = one("dmesg")
    p.add_argument("--append", action="append")
    p.add_argument("--clear", action="store_true")
    p = one("fill")
    p.add_argument("path")
    p.add_argument("--inodes-pct", type=float)
    p.add_argument("--bytes-pct", type=float)
    p.add_argument("--undo", action="store_true")
    p = one("rotate-key")
    p.add_argument("--mode", choices=["hup", "restart"], default="hup")
    p = one("preempt")
    p.add_argument("--grace", type=float, default=10)
    p.add_argument("--pid1-only", action="store_true")
    p.add_argument("--restart", action="store_true")
    for n in ("reboot", "pause", "unpause", "start", "stop", "restore", "unrate"):
        one(n)
    p = one("cut")
    p.add_argument("--method", choices=["nft", "link"], default="nft")
    p = one("rate")
    p.add_argument("--rate", default="1mbit")
    p.add_argument("--burst", default="32kbit")
    p.add_argument("--latency", default="400ms")
    p.add_argument("--both", action="store_true")
    one("exec")  # the command follows "--"
    p = sub.add_parser("host-cleanup")
    p.add_argument("--reset-ip-forward", action="store_true")
    return ap


def run(a) -> dict:
    if a.cmd == "image":
        sh.ensure_image(build=True)
        return {"image": sh.IMAGE, "present": sh.image_present()}
    if a.cmd == "up":
        tag = a.tag or sh.session_tag()
        if a.instance_id and len(a.names) > 1:
            raise sh.StubError("--instance-id needs exactly one NAME")
        gpu = _json_arg(a.gpu_state) if a.gpu_state else None
        stubs = []
        for n in a.names:
            s = sh.start_stub(
                n,
                keydir=a.keydir,
                known_hosts=a.known_hosts,
                tag=tag,
                instance_id=a.instance_id,
                hostname=a.hostname,
                memory=a.memory,
                cpus=a.cpus,
                mounts=a.mount,
                gpu_state=gpu,
                port=a.port,
                image=a.image,
                wait=not a.no_wait,
            )
            stubs.append({**s.to_dict(), "inventory": s.inventory_vars()})
        return {"tag": tag, "stubs": stubs}
    if a.cmd == "list":
        return {"tag": a.tag, "stubs": [s.to_dict() for s in sh.list_stubs(a.tag)]}
    if a.cmd == "inventory":
        return {"all": {"hosts": {s.name: s.inventory_vars() for s in sh.list_stubs(a.tag)}}}
    if a.cmd == "down":
        if not (a.all or a.tag or a.names):
            raise sh.StubError("down needs NAME..., --tag or --all")
        removed = sh.down(tag=a.tag, names=a.names, all=a.all)
        out = {"removed": removed}
        if a.host_cleanup:
            out["host_cleanup"] = sh.host_cleanup()
        return out
    if a.cmd == "host-cleanup":
        return sh.host_cleanup(reset_ip_forward=a.reset_ip_forward)

    s = sh.load(a.name, a.tag)
    base = {"container": s.container, "instance_id": s.instance_id}
    if a.cmd == "pin":
        return {**base, "known_hosts": s.known_hosts, "key": s.pin()}
    if a.cmd == "gpu":
        if a.state:
            s.set_gpu_state(_json_arg(a.state))
        if a.set or a.gpu_set:
            s.update_gpu_state(gpu=_kv(a.gpu_set), index=a.index, **_kv(a.set))
        return {**base, "state": s.get_gpu_state()}
    if a.cmd == "dmesg":
        if a.clear:
            s.clear_dmesg()
        if a.append:
            s.append_dmesg(a.append)
        return {**base, "dmesg": s.exec("cat /run/nvidia-fake/dmesg.log").stdout.splitlines()}
    if a.cmd == "fill":
        if a.undo:
            s.unfill(a.path)
            return {**base, "df": s.df(a.path)}
        return {**base, "df": s.fill(a.path, inode_pct=a.inodes_pct, byte_pct=a.bytes_pct)}
    if a.cmd == "rotate-key":
        return {**base, "new_key": s.rotate_host_key(mode=a.mode)}
    if a.cmd == "preempt":
        return {**base, **s.preempt(a.grace, signal_all=not a.pid1_only, restart=a.restart), "status": s.status()}
    if a.cmd == "exec":
        if not a.argv:
            raise sh.StubError("exec needs -- CMD...")
        cp = s.exec(a.argv, check=False)
        return {**base, "rc": cp.returncode, "stdout": cp.stdout, "stderr": cp.stderr}
    if a.cmd == "cut":
        s.link_cut(method=a.method)
    elif a.cmd == "restore":
        s.link_restore()
    elif a.cmd == "rate":
        s.rate_limit(rate=a.rate, burst=a.burst, latency=a.latency, direction="both" if a.both else "egress")
    elif a.cmd == "unrate":
        s.rate_unlimit()
    elif a.cmd in ("reboot", "start"):
        getattr(s, a.cmd)()
    elif a.cmd in ("pause", "unpause", "stop"):
        getattr(s, a.cmd)()
    return {**base, "done": a.cmd, "status": s.status(), "ansible_port": sh.load(a.name, a.tag).port}


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    rest = []
    if "--" in argv:
        i = argv.index("--")
        argv, rest = argv[:i], argv[i + 1 :]
    a = build_parser().parse_args(argv)
    a.argv = rest
    try:
        out = run(a)
    except (sh.StubError, ValueError, OSError) as e:
        print(json.dumps({"error": str(e)}))
        return 1
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
