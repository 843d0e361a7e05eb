"""`rgt-run pin`: record each instance's SSH host key once, by instance id, and never replace it silently."""

from __future__ import annotations

import argparse
import socket
import subprocess
import tempfile

from rich.console import Console

from rgt import errors, output
from rgt.errors import GateRefused, InputError, Unreachable
from rgt.inventory import known_hosts_file, load_hosts
from rgt.ledger import atomic_write_bytes


def fingerprint(key_line: str) -> str:
    with tempfile.NamedTemporaryFile("w", suffix=".pub") as fh:
        fh.write(key_line + "\n")
        fh.flush()
        out = subprocess.run(["ssh-keygen", "-lf", fh.name], capture_output=True, text=True, check=True)
    return out.stdout.split()[1]


def reach(host: str, port: int, timeout: float = 10) -> None:
    """Open (and close) a TCP connection to the box's SSH port; Unreachable when it is refused, times out, has
    no route or the name does not resolve (ssh-keyscan alone says none of this: it just prints nothing)."""
    try:
        socket.create_connection((host, port), timeout=timeout).close()
    except socket.gaierror as exc:
        raise Unreachable(f"cannot resolve {host!r}: {exc.strerror or exc}") from None
    except TimeoutError:
        raise Unreachable(f"no answer from {host}:{port} within {timeout:.0f} s") from None
    except OSError as exc:
        raise Unreachable(f"{host}:{port}: {exc.strerror or exc}") from None


def scan(host: str, port: int, timeout: int = 10) -> str | None:
    proc = subprocess.run(["ssh-keyscan", "-T", str(timeout), "-t", "ed25519", "-p", str(port), host],
                          capture_output=True, text=True, timeout=timeout + 5)
    for line in proc.stdout.splitlines():
        parts = line.split()
        if len(parts) >= 3 and not line.startswith("#"):
            return f"{parts[1]} {parts[2]}"
    return None


HELP = "record each box's SSH host key once, by instance id (never replaced silently)"
DESCRIPTION = """\
Record each box's SSH host key once, under its instance id, in known_hosts beside your inventory, and print its
fingerprint: compare it with the one the platform console shows. rgt connects only to boxes whose key is pinned.
A box that later offers another key is refused (exit 3) until you check it and pass --replace INSTANCE_ID.
A box whose SSH port cannot be reached (refused, timed out, a name that does not resolve) is named and skipped;
the others are pinned, and the command exits 4. Boxes on this machine (a local connection) need no pin."""


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--replace", metavar="INSTANCE_ID",
                   help="replace the pinned key of exactly this instance (after checking it in the console)")


def cmd_pin(args: argparse.Namespace, console: Console) -> int:
    hosts = [h for h in load_hosts(args.inventory, args.limit) if not h.is_local]
    results = []
    unreachable = []
    for host in hosts:
        kh = known_hosts_file(args.inventory, host)
        lines = kh.read_text().splitlines() if kh.exists() else []
        pinned = [ln for ln in lines if ln.split(" ", 1)[0] == host.instance_id]
        addr = str(host.vars.get("ansible_host", host.name))
        port = int(host.vars.get("ansible_port", 22))
        try:
            reach(addr, port)
        except Unreachable as exc:
            unreachable.append(host.name)
            results.append({"host": host.name, "instance_id": host.instance_id, "action": "unreachable",
                            "error": exc.message})
            console.print(f"[magenta]{host.name}: UNREACHABLE[/magenta] ({exc.message}): nothing was pinned for "
                          f"instance {host.instance_id}")
            continue
        key = scan(addr, port)
        if key is None:
            raise errors.RgtError(f"host '{host.name}' ({addr}:{port}) did not offer an ed25519 key",
                                  fix="check that sshd runs and the port is right")
        new_line = f"{host.instance_id} {key}"
        fp = fingerprint(key)
        if pinned and pinned[0].split(" ", 1)[1] == key:
            results.append({"host": host.name, "instance_id": host.instance_id, "fingerprint": fp,
                            "action": "unchanged"})
            console.print(f"{host.name}: already pinned ({fp})")
            continue
        if pinned and args.replace != host.instance_id:
            raise GateRefused(f"host '{host.name}': instance '{host.instance_id}' offers key {fp}, which differs "
                              "from the pinned key; nothing was changed",
                              fix=f"verify {fp} in the platform console, then pass --replace {host.instance_id}",
                              field="rgt_instance_id")
        kept = [ln for ln in lines if ln.split(" ", 1)[0] != host.instance_id]
        atomic_write_bytes(kh, ("\n".join(kept + [new_line]) + "\n").encode(), mode=0o644)
        action = "replaced" if pinned else "pinned"
        results.append({"host": host.name, "instance_id": host.instance_id, "fingerprint": fp, "action": action})
        console.print(f"{host.name}: {action} {fp} for instance {host.instance_id} in {kh} — compare it with the "
                      "fingerprint the platform console shows")
    if not hosts:
        raise InputError("no SSH hosts to pin in this inventory", fix="local hosts need no pin", field="-i")
    code = errors.UNREACHABLE if unreachable else errors.OK
    if unreachable:
        console.print(f"unreachable: {', '.join(unreachable)}: check that the box is running and that ansible_host "
                      "and ansible_port are the SSH address the platform console shows, then run rgt-run pin again")
    output.emit({"command": "pin", "hosts": results, "exit_code": code}, args.json)
    return code
