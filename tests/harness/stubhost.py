"""GPU-less stub hosts on real parts: podman containers with sshd, a fake nvidia-smi and fake dmesg.

Used by pytest (``tests/integration``) and by molecule create/destroy playbooks through the CLI
(``python -m tests.harness up|down|pin|...``, see ``tests/harness/__main__.py``).

What a stub is
--------------
A container of ``localhost/rgt-stub:latest`` (built by ``scripts/setup-stubs.sh``) started with
``--init``, its ssh port published on 127.0.0.1 (a free port picked by the engine), optional
``--memory``, and disk tiers as podman tmpfs volumes with a size and an inode cap
(``podman volume create --opt type=tmpfs --opt device=tmpfs --opt o=nr_blocks=N,nr_inodes=M``;
``o=size=`` is refused by podman 4.3 as an XFS project-quota option). Its host keys are made per
container; the harness reads the ed25519 public key through the engine and pins it in a known_hosts
file as ``<instance_id> ssh-ed25519 AAAA...`` (the runner passes ``-o HostKeyAlias=<instance_id>``).

Every podman call gets ``CONTAINERS_CONF=<repo>/tests/stubs/containers.conf`` (runc, cgroupfs,
lower ulimits, netavark), so nothing under /etc is needed.

Names: every container and volume is ``<tag>-<name>[...]``; the tag is per session
(``session_tag()``: $RGT_STUB_TAG or a random one), so parallel runs don't collide. Everything
the harness creates carries the label ``rgt-stub=1`` plus ``rgt-stub.tag=<tag>``; the stub's
metadata (instance id, key, known_hosts path) lives in container labels, so a later process
(molecule destroy, ``down``) can find it again with ``load()`` / ``list_stubs()``.

Faults
------
- ``preempt(grace_s)``: SIGTERM to every process but PID 1 and the sshd listener, wait up to
  grace_s for them to exit, then stop the container (a VM shutdown with a grace window);
  ``signal_all=False`` is plain ``podman stop -t grace_s`` (SIGTERM reaches only sshd through
  catatonit, the rest are SIGKILLed at the end).
- ``reboot()`` = ``podman restart`` (tmux sessions die; /run inside is NOT a tmpfs, so the fake GPU
  state survives), ``pause()`` / ``unpause()`` (a hung host: TCP connects but nothing answers).
- ``link_cut()`` / ``link_restore()``: nftables drop-all table inside the container's network
  namespace (``nsenter -t <pid> -n nft ...`` from the host; no NET_ADMIN in the container). With
  published ports this makes ssh time out, also on already open connections. ``method="link"``
  sets eth0 down/up instead; the kernel then drops the default route, which ``link_restore``
  puts back.
- ``rate_limit(rate)``: tc tbf on the container's eth0 (box -> controller); ``direction="both"``
  also shapes the host-side veth (controller -> box). The kernel here has tbf/htb, not netem.
- ``rotate_host_key()``: new host keys + SIGHUP to sshd (sshd re-execs itself and loads them):
  a recreated instance behind the same address; ssh with the old pin fails with
  "REMOTE HOST IDENTIFICATION HAS CHANGED" / "Host key verification failed".

Host side effects and cleanup
-----------------------------
netavark sets ``net.ipv4.ip_forward=1`` and creates the iptables-nft tables ``ip nat`` / ``ip filter``
with NETAVARK chains; it removes its podman0 bridge with the last container but leaves the tables
and the sysctl. ``host_cleanup()`` removes the NETAVARK chains (and the tables when nothing else is
in them) once no podman container is left; resetting ip_forward is opt-in. Calling it in CI
teardown is the CI job's business.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shlex
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
STUBS_DIR = REPO / "tests" / "stubs"
CONTAINERS_CONF = STUBS_DIR / "containers.conf"
SETUP_SCRIPT = REPO / "scripts" / "setup-stubs.sh"
IMAGE = "localhost/rgt-stub:latest"
LABEL = "rgt-stub"
STATE_PATH = "/run/nvidia-fake/state.json"
DMESG_PATH = "/run/nvidia-fake/dmesg.log"
DEFAULT_STATE_PATH = STUBS_DIR / "nvidia-state.json"
CUT_TABLE = "rgt_cut"


class StubError(RuntimeError):
    pass


# ------------------------------------------------------------------------------------------------
# engine plumbing


def podman_env(extra: dict | None = None) -> dict:
    env = dict(os.environ)
    env["CONTAINERS_CONF"] = str(CONTAINERS_CONF)
    if extra:
        env.update(extra)
    return env


def podman_available() -> bool:
    return shutil.which("podman") is not None


def podman(
    *args: str, check: bool = True, input: str | bytes | None = None, timeout: float = 120, text: bool = True
) -> subprocess.CompletedProcess:
    """Run podman with the repo's containers.conf. Raises StubError on failure when check."""
    cmd = ["podman", *args]
    try:
        cp = subprocess.run(cmd, input=input, capture_output=True, text=text, timeout=timeout, env=podman_env())
    except subprocess.TimeoutExpired as e:
        raise StubError(f"timeout after {timeout}s: {shlex.join(cmd)}") from e
    if check and cp.returncode != 0:
        err = cp.stderr if text else cp.stderr.decode(errors="replace")
        raise StubError(f"{shlex.join(cmd)} -> rc {cp.returncode}: {err.strip()[-2000:]}")
    return cp


def _run(
    cmd: Sequence[str], check: bool = True, timeout: float = 60, input: str | None = None
) -> subprocess.CompletedProcess:
    cp = subprocess.run(list(cmd), capture_output=True, text=True, timeout=timeout, input=input)
    if check and cp.returncode != 0:
        raise StubError(f"{shlex.join(cmd)} -> rc {cp.returncode}: {cp.stderr.strip()[-2000:]}")
    return cp


def image_present(image: str = IMAGE) -> bool:
    return podman("image", "exists", image, check=False).returncode == 0


def ensure_image(image: str = IMAGE, build: bool = True) -> None:
    """Make sure the stub image exists; runs scripts/setup-stubs.sh when it doesn't (or always when
    build, which is cheap when nothing changed)."""
    if image_present(image) and not build:
        return
    cp = subprocess.run(["bash", str(SETUP_SCRIPT)], capture_output=True, text=True, timeout=900, env=podman_env())
    if cp.returncode != 0:
        raise StubError(f"setup-stubs.sh failed (rc {cp.returncode}): {cp.stderr[-3000:]}")


def session_tag(prefix: str = "rgts") -> str:
    """$RGT_STUB_TAG, or a new random tag like rgts-3fa9c1."""
    tag = os.environ.get("RGT_STUB_TAG")
    if tag:
        return _slug(tag)
    return f"{prefix}-{secrets.token_hex(3)}"


def _slug(s: str) -> str:
    s = re.sub(r"[^A-Za-z0-9_.-]+", "-", s).strip("-.")
    return s or "x"


def ensure_keypair(keydir: str | os.PathLike, name: str = "id_ed25519") -> tuple[Path, Path]:
    """An ed25519 keypair for the tests in keydir (created once). Returns (private, public)."""
    d = Path(keydir)
    d.mkdir(parents=True, exist_ok=True)
    priv, pub = d / name, d / f"{name}.pub"
    if not (priv.exists() and pub.exists()):
        for p in (priv, pub):
            p.unlink(missing_ok=True)
        _run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "rgt-stub-tests", "-f", str(priv)])
    priv.chmod(0o600)
    return priv, pub


# ------------------------------------------------------------------------------------------------
# known_hosts


def write_known_host(known_hosts: str | os.PathLike, alias: str, keyline: str) -> None:
    """Replace the lines for alias in known_hosts with `<alias> <type> <base64>` (atomic)."""
    path = Path(known_hosts)
    path.parent.mkdir(parents=True, exist_ok=True)
    parts = keyline.split()
    if len(parts) < 2:
        raise StubError(f"bad host key line: {keyline!r}")
    new = f"{alias} {parts[0]} {parts[1]}\n"
    old = path.read_text().splitlines(keepends=True) if path.exists() else []
    keep = [ln for ln in old if not (ln.split() and alias in ln.split()[0].split(","))]
    fd, tmp = tempfile.mkstemp(dir=str(path.parent), prefix=".known_hosts.")
    with os.fdopen(fd, "w") as fh:
        fh.writelines(keep + [new])
        fh.flush()
        os.fsync(fh.fileno())
    os.chmod(tmp, 0o644)
    os.replace(tmp, path)


def remove_known_host(known_hosts: str | os.PathLike, alias: str) -> None:
    path = Path(known_hosts)
    if not path.exists():
        return
    old = path.read_text().splitlines(keepends=True)
    keep = [ln for ln in old if not (ln.split() and alias in ln.split()[0].split(","))]
    if keep != old:
        path.write_text("".join(keep))


# ------------------------------------------------------------------------------------------------
# the stub


@dataclass
class Mount:
    """A disk tier. persist=False: a podman tmpfs volume; its content is lost on `podman stop`
    (kept by `podman restart`), like a container disk. persist=True: a tmpfs mounted on the host
    under $RGT_STUB_MOUNT_DIR (default /run/rgt-stubs) and bind-mounted; it survives
    stop/start/restart (a durable volume) and goes with destroy. Needs root on the host."""

    path: str
    size_mib: int
    inodes: int | None = None
    persist: bool = False

    @classmethod
    def from_any(cls, m) -> Mount:
        if isinstance(m, Mount):
            return m
        if isinstance(m, dict):
            return cls(
                path=m["path"],
                size_mib=int(m["size_mib"]),
                inodes=(int(m["inodes"]) if m.get("inodes") else None),
                persist=bool(m.get("persist")),
            )
        if isinstance(m, str):  # "PATH:SIZE_MIB[:INODES[:persist]]"
            parts = m.split(":")
            return cls(
                parts[0],
                int(parts[1]),
                int(parts[2]) if len(parts) > 2 and parts[2] else None,
                persist=len(parts) > 3 and parts[3] in ("persist", "1", "true"),
            )
        raise TypeError(f"mount spec {m!r}")


def host_mount_dir() -> Path:
    return Path(os.environ.get("RGT_STUB_MOUNT_DIR", "/run/rgt-stubs"))


def _umount_host_dir(d: str | os.PathLike) -> None:
    d = Path(d)
    if os.path.ismount(d):
        _run(["umount", "-l", str(d)], check=False)
    try:
        d.rmdir()
        d.parent.rmdir()  # the per-container dir, when empty
    except OSError:
        pass


@dataclass
class StubHost:
    name: str
    tag: str
    container: str
    instance_id: str
    hostname: str
    port: int
    key_file: str
    known_hosts: str
    volumes: list[str] = field(default_factory=list)
    mounts: list[dict] = field(default_factory=list)
    memory: str | None = None
    host_dirs: list[str] = field(default_factory=list)
    _cut_method: str | None = None
    _saved_routes: list = field(default_factory=list)

    # --- description --------------------------------------------------------------------------
    def inventory_vars(self) -> dict:
        """Host vars for an Ansible inventory (plus the harness' own bookkeeping)."""
        return {
            "ansible_host": "127.0.0.1",
            "ansible_port": self.port,
            "ansible_user": "root",
            "ansible_ssh_private_key_file": self.key_file,
            "ansible_ssh_common_args": " ".join(shlex.quote(o) for o in self.ssh_options()),
            "rgt_instance_id": self.instance_id,
        }

    def to_dict(self) -> dict:
        return {
            "name": self.name,
            "tag": self.tag,
            "container": self.container,
            "instance_id": self.instance_id,
            "hostname": self.hostname,
            "ansible_host": "127.0.0.1",
            "ansible_port": self.port,
            "ansible_user": "root",
            "ansible_ssh_private_key_file": self.key_file,
            "known_hosts": self.known_hosts,
            "volumes": self.volumes,
            "host_dirs": self.host_dirs,
            "mounts": self.mounts,
            "memory": self.memory,
        }

    # --- ssh ------------------------------------------------------------------------------------
    def ssh_options(self, connect_timeout: float = 5) -> list[str]:
        return [
            "-o",
            "StrictHostKeyChecking=yes",
            "-o",
            f"UserKnownHostsFile={self.known_hosts}",
            "-o",
            f"HostKeyAlias={self.instance_id}",
            "-o",
            "BatchMode=yes",
            "-o",
            "IdentitiesOnly=yes",
            "-o",
            f"ConnectTimeout={int(connect_timeout)}",
            "-o",
            "LogLevel=ERROR",
        ]

    def ssh_argv(
        self, command: str | None = None, connect_timeout: float = 5, extra_opts: Iterable[str] = ()
    ) -> list[str]:
        argv = [
            "ssh",
            "-i",
            self.key_file,
            "-p",
            str(self.port),
            *self.ssh_options(connect_timeout),
            *extra_opts,
            "root@127.0.0.1",
        ]
        if command is not None:
            argv.append(command)
        return argv

    def ssh(
        self,
        command: str,
        timeout: float = 30,
        connect_timeout: float = 5,
        check: bool = False,
        input: str | None = None,
        extra_opts: Iterable[str] = (),
    ) -> subprocess.CompletedProcess:
        """Run a command over real ssh with the pinned host key."""
        argv = self.ssh_argv(command, connect_timeout, extra_opts)
        try:
            cp = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, input=input)
        except subprocess.TimeoutExpired as e:
            raise StubError(f"ssh timeout after {timeout}s: {command}") from e
        if check and cp.returncode != 0:
            raise StubError(f"ssh {command!r} -> rc {cp.returncode}: {cp.stderr.strip()}")
        return cp

    def wait_ssh(self, timeout: float = 30, interval: float = 0.2) -> float:
        """Retry `ssh true` (pinned key) until it works; returns seconds waited."""
        t0 = time.monotonic()
        last = None
        while True:
            cp = self.ssh("true", timeout=10, connect_timeout=2)
            if cp.returncode == 0:
                return time.monotonic() - t0
            last = cp.stderr.strip()
            if "Host key verification failed" in last or "IDENTIFICATION HAS CHANGED" in last:
                raise StubError(f"{self.container}: host key mismatch: {last}")
            if time.monotonic() - t0 > timeout:
                raise StubError(f"{self.container}: ssh not answering after {timeout}s: {last}")
            time.sleep(interval)

    # --- engine-side helpers -----------------------------------------------------------------
    def exec(
        self, command: str | Sequence[str], check: bool = True, input: str | None = None, timeout: float = 60
    ) -> subprocess.CompletedProcess:
        """podman exec (a string runs under sh -c)."""
        argv = ["sh", "-c", command] if isinstance(command, str) else list(command)
        return podman(
            "exec",
            *(["-i"] if input is not None else []),
            self.container,
            *argv,
            check=check,
            input=input,
            timeout=timeout,
        )

    def pid(self) -> int:
        pid = int(podman("inspect", "-f", "{{.State.Pid}}", self.container).stdout.strip() or 0)
        if pid <= 0:
            raise StubError(f"{self.container} is not running")
        return pid

    def status(self) -> str:
        return podman("inspect", "-f", "{{.State.Status}}", self.container).stdout.strip()

    def host_pubkey(self, keytype: str = "ed25519", timeout: float = 15) -> str:
        """The container's host public key line, read through the engine (waits for the
        entrypoint to create it)."""
        t0 = time.monotonic()
        while True:
            cp = self.exec(f"cat /etc/ssh/ssh_host_{keytype}_key.pub", check=False)
            if cp.returncode == 0 and cp.stdout.strip():
                return cp.stdout.strip()
            if time.monotonic() - t0 > timeout:
                raise StubError(f"{self.container}: no host key after {timeout}s: {cp.stderr.strip()}")
            time.sleep(0.1)

    def pin(self) -> str:
        """Write `<instance_id> ssh-ed25519 AAAA...` into known_hosts; returns the key line."""
        key = self.host_pubkey()
        write_known_host(self.known_hosts, self.instance_id, key)
        return key

    # --- GPU state / dmesg ----------------------------------------------------------------------
    def get_gpu_state(self) -> dict:
        return json.loads(self.exec(f"cat {STATE_PATH}").stdout)

    def set_gpu_state(self, state: dict) -> None:
        data = json.dumps(state, indent=1)
        self.exec(
            f"mkdir -p /run/nvidia-fake && cat > {STATE_PATH}.tmp && mv {STATE_PATH}.tmp {STATE_PATH}", input=data
        )

    def update_gpu_state(self, gpu: dict | None = None, index: int | None = None, **top) -> dict:
        """Shallow-merge top-level keys, and `gpu` fields into gpus[index] (all GPUs if None)."""
        st = self.get_gpu_state()
        st.update(top)
        if gpu:
            for i, g in enumerate(st.get("gpus", [])):
                if index is None or i == index:
                    g.update(gpu)
        self.set_gpu_state(st)
        return st

    def append_dmesg(self, lines: str | Iterable[str]) -> None:
        if isinstance(lines, str):
            lines = [lines]
        text = "".join(ln.rstrip("\n") + "\n" for ln in lines)
        self.exec(f"cat >> {DMESG_PATH}", input=text)

    def clear_dmesg(self) -> None:
        self.exec(f": > {DMESG_PATH}")

    # --- disks ----------------------------------------------------------------------------------
    def df(self, path: str) -> dict:
        return json.loads(self.exec(["python3", "-c", _DF_PY, path]).stdout)

    def fill(self, path: str, inode_pct: float | None = None, byte_pct: float | None = None) -> dict:
        """Fill the filesystem at path to inode_pct % of inodes (empty files) and byte_pct % of
        bytes (one fallocated file), under <path>/.rgt-fill/. Returns df numbers after."""
        cp = self.exec(["python3", "-c", _FILL_PY, path, json.dumps(inode_pct), json.dumps(byte_pct)], timeout=300)
        return json.loads(cp.stdout)

    def unfill(self, path: str) -> None:
        self.exec(["rm", "-rf", f"{path.rstrip('/')}/.rgt-fill"])

    # --- lifecycle faults -------------------------------------------------------------------
    def _after_start(self, wait: bool, timeout: float) -> None:
        self._cut_method = None
        if wait:
            self.wait_ssh(timeout=timeout)

    def stop(self, grace_s: int = 10) -> None:
        podman("stop", "-t", str(int(grace_s)), self.container, timeout=grace_s + 60)

    def start(self, wait: bool = True, timeout: float = 30) -> None:
        podman("start", self.container)
        self._refresh_port()
        self._after_start(wait, timeout)

    def preempt(self, grace_s: float = 10, signal_all: bool = True, restart: bool = False, wait: bool = True) -> dict:
        """Spot preemption. signal_all: SIGTERM every process except PID 1 and the sshd listener,
        wait until they are gone or grace_s passed, then stop the container. Otherwise plain
        `podman stop -t grace_s`. restart: start it again afterwards (and wait for ssh)."""
        t0 = time.monotonic()
        survivors = None
        if signal_all:
            self.exec(["python3", "-c", _OTHERS_PY, "term"])
            deadline = t0 + grace_s
            while time.monotonic() < deadline:
                survivors = int(self.exec(["python3", "-c", _OTHERS_PY, "count"], check=False).stdout.strip() or 0)
                if survivors == 0:
                    break
                time.sleep(0.2)
            podman("stop", "-t", "1", self.container)
        else:
            self.stop(int(grace_s))
        out = {"stopped_after_s": round(time.monotonic() - t0, 3), "survivors_at_kill": survivors}
        if restart:
            self.start(wait=wait)
        return out

    def reboot(self, wait: bool = True, timeout: float = 30) -> None:
        podman("restart", "-t", "3", self.container)
        self._refresh_port()
        self._after_start(wait, timeout)

    def pause(self) -> None:
        podman("pause", self.container)

    def unpause(self) -> None:
        podman("unpause", self.container)

    def rotate_host_key(self, mode: str = "hup") -> str:
        """New host keys (a recreated instance). mode "hup": regenerate + SIGHUP sshd (container and
        its processes live on); "restart": regenerate + podman restart. Does NOT update the pin;
        returns the new ed25519 key line (call pin() to accept it)."""
        self.exec(
            "rm -f /etc/ssh/ssh_host_*_key /etc/ssh/ssh_host_*_key.pub && "
            "ssh-keygen -q -t ed25519 -N '' -f /etc/ssh/ssh_host_ed25519_key && "
            "ssh-keygen -q -t ecdsa -N '' -f /etc/ssh/ssh_host_ecdsa_key"
        )
        if mode == "restart":
            self.reboot(wait=False)
        else:
            self.exec('kill -HUP "$(cat /run/sshd.pid)"')
        key = self.host_pubkey()
        # wait until the re-exec'd sshd listens again (it serves the new key)
        t0 = time.monotonic()
        while time.monotonic() - t0 < 10:
            cp = subprocess.run(
                ["ssh-keyscan", "-T", "2", "-t", "ed25519", "-p", str(self.port), "127.0.0.1"],
                capture_output=True,
                text=True,
                timeout=10,
            )
            if key.split()[1] in cp.stdout:
                break
            time.sleep(0.1)
        return key

    # --- network faults (inside the container's netns, from the host) -------------------------
    def _nsenter(self, *cmd: str, check: bool = True, input: str | None = None) -> subprocess.CompletedProcess:
        return _run(["nsenter", "-t", str(self.pid()), "-n", *cmd], check=check, input=input)

    def link_cut(self, method: str = "nft") -> None:
        """Make the box unreachable (packets dropped, ssh times out). method: nft | link."""
        if method == "nft":
            self._nsenter(
                "nft",
                "-f",
                "-",
                input=(
                    f"table inet {CUT_TABLE} {{\n"
                    "  chain input { type filter hook input priority -300; policy drop; }\n"
                    "  chain output { type filter hook output priority -300; policy drop; }\n"
                    "}\n"
                ),
            )
        elif method == "link":
            routes = self._nsenter("ip", "-j", "route", "show", "default").stdout
            self._saved_routes = json.loads(routes or "[]")
            self._nsenter("ip", "link", "set", "eth0", "down")
        else:
            raise ValueError(method)
        self._cut_method = method

    def link_restore(self) -> None:
        self._nsenter("nft", "delete", "table", "inet", CUT_TABLE, check=False)
        self._nsenter("ip", "link", "set", "eth0", "up")
        for r in self._saved_routes or []:
            if r.get("gateway"):
                self._nsenter(
                    "ip", "route", "replace", "default", "via", r["gateway"], "dev", r.get("dev", "eth0"), check=False
                )
        self._saved_routes = []
        self._cut_method = None

    def _host_veth(self) -> str:
        # read the peer index inside the container: nsenter -n changes the netns, not the /sys mount, so
        # reading /sys through nsenter would name the HOST's eth0 (and shape the machine's real uplink)
        iflink = self.exec(["cat", "/sys/class/net/eth0/iflink"]).stdout.strip()
        for line in _run(["ip", "-o", "link"]).stdout.splitlines():
            idx, name = line.split(":", 2)[:2]
            name = name.strip().split("@")[0]
            if idx.strip() == iflink and name.startswith(("veth", "vnet")):
                return name
        raise StubError(f"{self.container}: host veth for ifindex {iflink} not found (refusing to guess)")

    def rate_limit(
        self, rate: str = "1mbit", burst: str = "32kbit", latency: str = "400ms", direction: str = "egress"
    ) -> None:
        """tc tbf. egress = box -> controller (container eth0); both = also the host-side veth."""
        tbf = ["root", "tbf", "rate", rate, "burst", burst, "latency", latency]
        self._nsenter("tc", "qdisc", "replace", "dev", "eth0", *tbf)
        if direction == "both":
            _run(["tc", "qdisc", "replace", "dev", self._host_veth(), *tbf])

    def rate_unlimit(self) -> None:
        self._nsenter("tc", "qdisc", "del", "dev", "eth0", "root", check=False)
        try:
            _run(["tc", "qdisc", "del", "dev", self._host_veth(), "root"], check=False)
        except StubError:
            pass

    # --- teardown -------------------------------------------------------------------------------
    def destroy(self, forget_pin: bool = False) -> None:
        podman("rm", "-f", "-t", "0", self.container, check=False)
        for v in self.volumes:
            podman("volume", "rm", "-f", v, check=False)
        for d in self.host_dirs:
            _umount_host_dir(d)
        if forget_pin:
            remove_known_host(self.known_hosts, self.instance_id)

    def _refresh_port(self) -> None:
        self.port = _published_port(self.container)


# ------------------------------------------------------------------------------------------------
# scripts run inside the stub

_DF_PY = r"""
import json, os, sys
st = os.statvfs(sys.argv[1])
tb = st.f_blocks * st.f_frsize; fb = st.f_bfree * st.f_frsize
print(json.dumps({"path": sys.argv[1], "bytes_total": tb, "bytes_used": tb - fb,
  "bytes_pct": round(100.0 * (tb - fb) / tb, 2) if tb else 0.0,
  "inodes_total": st.f_files, "inodes_used": st.f_files - st.f_ffree,
  "inodes_pct": round(100.0 * (st.f_files - st.f_ffree) / st.f_files, 2) if st.f_files else 0.0}))
"""

_FILL_PY = r"""
import json, math, os, sys
path = sys.argv[1]; ipct = json.loads(sys.argv[2]); bpct = json.loads(sys.argv[3])
d = os.path.join(path, ".rgt-fill")
os.makedirs(d, exist_ok=True)
st = os.statvfs(path)
if ipct is not None and st.f_files:
    want = int(math.ceil(st.f_files * ipct / 100.0)) - (st.f_files - st.f_ffree)
    if bpct is not None:
        want -= 1
    base = len(os.listdir(d))
    for i in range(max(want, 0)):
        try:
            os.close(os.open(os.path.join(d, "i%07d" % (base + i)), os.O_CREAT | os.O_WRONLY, 0o644))
        except OSError:
            break
if bpct is not None:
    st = os.statvfs(path)
    total = st.f_blocks * st.f_frsize; used = (st.f_blocks - st.f_bfree) * st.f_frsize
    want = int(total * bpct / 100.0) - used
    if want > 0:
        fd = os.open(os.path.join(d, "bytes-%d" % len(os.listdir(d))), os.O_CREAT | os.O_WRONLY, 0o644)
        try:
            os.posix_fallocate(fd, 0, want)
        except OSError:
            pass
        finally:
            os.close(fd)
st = os.statvfs(path)
tb = st.f_blocks * st.f_frsize; fb = st.f_bfree * st.f_frsize
print(json.dumps({"path": path, "bytes_total": tb, "bytes_used": tb - fb,
  "bytes_pct": round(100.0 * (tb - fb) / tb, 2) if tb else 0.0,
  "inodes_total": st.f_files, "inodes_used": st.f_files - st.f_ffree,
  "inodes_pct": round(100.0 * (st.f_files - st.f_ffree) / st.f_files, 2) if st.f_files else 0.0}))
"""

# SIGTERM every process except PID 1, the sshd listener and this one; print how many were signalled.
_OTHERS_PY = r"""
import os, sys
try:
    listener = int(open("/run/sshd.pid").read().strip())
except (OSError, ValueError):
    listener = -1
keep = {1, listener, os.getpid(), os.getppid()}
pids = [int(p) for p in os.listdir("/proc") if p.isdigit() and int(p) not in keep]
alive = []
for pid in pids:
    try:
        if sys.argv[1] == "term":
            os.kill(pid, 15)
        else:
            os.kill(pid, 0)
        alive.append(pid)
    except OSError:
        pass
print(len(alive))
"""


# ------------------------------------------------------------------------------------------------
# start / find / stop


def _published_port(container: str) -> int:
    out = podman("port", container, "22/tcp").stdout.strip().splitlines()
    for line in out:
        m = re.search(r":(\d+)$", line.strip())
        if m:
            return int(m.group(1))
    raise StubError(f"{container}: no published ssh port ({out})")


def _labels(**kv) -> list[str]:
    out = []
    for k, v in kv.items():
        out += ["--label", f"{k}={v}"]
    return out


def start_stub(
    name: str,
    *,
    keydir: str | os.PathLike,
    known_hosts: str | os.PathLike | None = None,
    tag: str | None = None,
    instance_id: str | None = None,
    hostname: str | None = None,
    memory: str | None = None,
    cpus: str | None = None,
    mounts: Iterable[Mount | dict | str] = (),
    gpu_state: dict | None = None,
    port: int | None = None,
    image: str = IMAGE,
    env: dict | None = None,
    extra_args: Sequence[str] = (),
    wait: bool = True,
    wait_timeout: float = 30,
) -> StubHost:
    """Start one stub, pin its host key, and (wait) wait until ssh answers.

    keydir: where the test keypair lives (created if missing); known_hosts defaults to
    <keydir>/known_hosts. memory: e.g. "512m". mounts: [{path, size_mib, inodes}] as inode-capped
    tmpfs volumes. gpu_state: JSON for /run/nvidia-fake/state.json (default: the image's 2 GPUs).
    port: host port on 127.0.0.1 (default: a free one chosen by the engine)."""
    tag = tag or session_tag()
    name = _slug(name)
    container = f"{tag}-{name}"
    instance_id = instance_id or container
    hostname = hostname or name
    priv, pub = ensure_keypair(keydir)
    known_hosts = str(known_hosts or Path(keydir) / "known_hosts")
    mounts = [Mount.from_any(m) for m in mounts]
    page = os.sysconf("SC_PAGE_SIZE")
    meta = {
        LABEL: "1",
        f"{LABEL}.tag": tag,
        f"{LABEL}.name": name,
        f"{LABEL}.instance_id": instance_id,
        f"{LABEL}.key": str(priv),
        f"{LABEL}.known_hosts": known_hosts,
    }
    volumes, host_dirs, vol_args, mount_meta = [], [], [], []
    try:
        for m in mounts:
            vol = f"{container}-{_slug(m.path.strip('/').replace('/', '-'))}"
            opts = [f"nr_blocks={(m.size_mib * 1024 * 1024) // page}"]
            if m.inodes:
                opts.append(f"nr_inodes={m.inodes}")
            if m.persist:
                d = host_mount_dir() / container / vol
                d.mkdir(parents=True, exist_ok=True)
                _run(["mount", "-t", "tmpfs", "-o", ",".join(opts + ["mode=0755"]), f"rgt-{vol}"[:60], str(d)])
                host_dirs.append(str(d))
                vol_args += ["-v", f"{d}:{m.path}"]
                where = {"host_dir": str(d)}
            else:
                podman(
                    "volume",
                    "create",
                    *_labels(**{LABEL: "1", f"{LABEL}.tag": tag, f"{LABEL}.container": container}),
                    "--opt",
                    "type=tmpfs",
                    "--opt",
                    "device=tmpfs",
                    "--opt",
                    "o=" + ",".join(opts),
                    vol,
                )
                volumes.append(vol)
                vol_args += ["-v", f"{vol}:{m.path}"]
                where = {"volume": vol}
            mount_meta.append(
                {"path": m.path, "size_mib": m.size_mib, "inodes": m.inodes, "persist": m.persist, **where}
            )
        meta[f"{LABEL}.volumes"] = ",".join(volumes)
        meta[f"{LABEL}.host_dirs"] = ",".join(host_dirs)
        meta[f"{LABEL}.mounts"] = json.dumps(mount_meta, separators=(",", ":"))
        args = [
            "run",
            "-d",
            "--name",
            container,
            "--hostname",
            hostname,
            "--init",
            "-p",
            f"127.0.0.1:{port or ''}:22",
            "-e",
            f"SSH_PUBKEY={pub.read_text().strip()}",
            *_labels(**meta),
            *vol_args,
        ]
        if memory:
            args.append(f"--memory={memory}")
            meta_mem = memory
        else:
            meta_mem = None
        if cpus:
            args.append(f"--cpus={cpus}")
        for k, v in (env or {}).items():
            args += ["-e", f"{k}={v}"]
        args += [*extra_args, image]
        podman(*args)
        stub = StubHost(
            name=name,
            tag=tag,
            container=container,
            instance_id=instance_id,
            hostname=hostname,
            port=_published_port(container),
            key_file=str(priv),
            known_hosts=known_hosts,
            volumes=volumes,
            mounts=mount_meta,
            memory=meta_mem,
            host_dirs=host_dirs,
        )
        if gpu_state is not None:
            stub.set_gpu_state(gpu_state)
        stub.pin()
        if wait:
            stub.wait_ssh(timeout=wait_timeout)
        return stub
    except BaseException:
        podman("rm", "-f", "-t", "0", container, check=False)
        for v in volumes:
            podman("volume", "rm", "-f", v, check=False)
        for d in host_dirs:
            _umount_host_dir(d)
        raise


def _from_inspect(info: dict) -> StubHost:
    labels = info.get("Config", {}).get("Labels") or {}
    container = info["Name"].lstrip("/")
    try:
        port = _published_port(container)  # also answers while paused; a stopped one has none
    except StubError:
        port = 0
    mem = info.get("HostConfig", {}).get("Memory") or 0
    return StubHost(
        name=labels.get(f"{LABEL}.name", container),
        tag=labels.get(f"{LABEL}.tag", ""),
        container=container,
        instance_id=labels.get(f"{LABEL}.instance_id", container),
        hostname=info.get("Config", {}).get("Hostname", ""),
        port=port,
        key_file=labels.get(f"{LABEL}.key", ""),
        known_hosts=labels.get(f"{LABEL}.known_hosts", ""),
        volumes=[v for v in labels.get(f"{LABEL}.volumes", "").split(",") if v],
        mounts=json.loads(labels.get(f"{LABEL}.mounts") or "[]"),
        memory=(f"{mem // (1024 * 1024)}m" if mem else None),
        host_dirs=[d for d in labels.get(f"{LABEL}.host_dirs", "").split(",") if d],
    )


def list_stubs(tag: str | None = None) -> list[StubHost]:
    filt = ["--filter", f"label={LABEL}=1"] + (["--filter", f"label={LABEL}.tag={tag}"] if tag else [])
    ids = podman("ps", "-a", "-q", *filt).stdout.split()
    if not ids:
        return []
    infos = json.loads(podman("inspect", *ids).stdout)
    return [_from_inspect(i) for i in infos]


def load(name: str, tag: str | None = None) -> StubHost:
    """Find a stub by container name, or by (name, tag)."""
    container = f"{tag}-{_slug(name)}" if tag else name
    cp = podman("inspect", "--type", "container", container, check=False)
    if cp.returncode != 0:
        raise StubError(f"no stub container {container}")
    return _from_inspect(json.loads(cp.stdout)[0])


def down(tag: str | None = None, names: Iterable[str] = (), all: bool = False) -> list[str]:
    """Remove stubs and their volumes: the named ones (in tag), all of a tag, or (all) every
    container/volume labelled rgt-stub=1. Returns the removed container names."""
    removed = []
    if all:
        ids = podman("ps", "-a", "-q", "--filter", f"label={LABEL}=1").stdout.split()
        if ids:
            names_out = podman("inspect", "-f", "{{.Name}}", *ids).stdout.split()
            podman("rm", "-f", "-t", "0", *ids, check=False)
            removed += [n.lstrip("/") for n in names_out]
        vols = podman("volume", "ls", "-q", "--filter", f"label={LABEL}=1").stdout.split()
        if vols:
            podman("volume", "rm", "-f", *vols, check=False)
        base = host_mount_dir()
        if base.is_dir():
            for cdir in base.iterdir():
                for d in cdir.iterdir() if cdir.is_dir() else []:
                    _umount_host_dir(d)
                try:
                    cdir.rmdir()
                except OSError:
                    pass
        return removed
    names = list(names)
    stubs = [load(n, tag) for n in names] if names else list_stubs(tag) if tag else []
    for s in stubs:
        s.destroy()
        removed.append(s.container)
    if tag and not names:
        vols = podman("volume", "ls", "-q", "--filter", f"label={LABEL}.tag={tag}").stdout.split()
        if vols:
            podman("volume", "rm", "-f", *vols, check=False)
    return removed


def host_cleanup(reset_ip_forward: bool = False) -> dict:
    """Remove what netavark leaves on the host once no podman container exists any more: its
    NETAVARK* chains (and the jumps to them) in the iptables-nft tables `ip nat` / `ip filter`,
    and those tables when nothing else is left in them. reset_ip_forward: also set
    net.ipv4.ip_forward=0. Does nothing while containers (stubs or others) remain."""
    res = {"skipped": None, "deleted_tables": [], "deleted_chains": [], "ip_forward": None}
    if podman_available():
        left = podman("ps", "-a", "-q", check=False).stdout.split()
        if left:
            res["skipped"] = f"{len(left)} podman container(s) remain"
            return res
    if not shutil.which("nft"):
        res["skipped"] = "nft not installed"
        return res
    for table in ("nat", "filter"):
        cp = _run(["nft", "-j", "list", "table", "ip", table], check=False)
        if cp.returncode != 0:
            continue
        items = json.loads(cp.stdout).get("nftables", [])
        chains = [i["chain"] for i in items if "chain" in i]
        rules = [i["rule"] for i in items if "rule" in i]
        nv = {c["name"] for c in chains if c["name"].startswith("NETAVARK")}
        foreign = [r for r in rules if r["chain"] not in nv and not _jumps_to(r, nv)]
        foreign_chains = [c for c in chains if c["name"] not in nv and "hook" not in c]
        if not foreign and not foreign_chains:
            _run(["nft", "delete", "table", "ip", table])
            res["deleted_tables"].append(f"ip {table}")
            continue
        for r in rules:
            if r["chain"] not in nv and _jumps_to(r, nv):
                _run(["nft", "delete", "rule", "ip", table, r["chain"], "handle", str(r["handle"])], check=False)
        for c in nv:
            _run(["nft", "flush", "chain", "ip", table, c], check=False)
        for c in nv:
            if _run(["nft", "delete", "chain", "ip", table, c], check=False).returncode == 0:
                res["deleted_chains"].append(f"ip {table} {c}")
    if reset_ip_forward:
        Path("/proc/sys/net/ipv4/ip_forward").write_text("0\n")
    try:
        res["ip_forward"] = int(Path("/proc/sys/net/ipv4/ip_forward").read_text().strip())
    except OSError:
        pass
    return res


def _jumps_to(rule: dict, chains: set) -> bool:
    blob = json.dumps(rule.get("expr", []))
    return any(f'"target": "{c}"' in blob for c in chains)
