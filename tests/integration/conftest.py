"""Fixtures for tests that drive `rgt-run` as a user would: a subprocess, stderr for people, --json for agents."""

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
RGT_RUN = [sys.executable, "-m", "rgt.cli"]


@dataclass
class CliResult:
    rc: int
    stdout: str
    stderr: str

    @property
    def doc(self) -> dict:
        lines = [ln for ln in self.stdout.splitlines() if ln.strip()]
        assert len(lines) == 1, f"--json must print exactly one document, got: {self.stdout!r}"
        return json.loads(lines[0])


@pytest.fixture
def rgt(tmp_path):
    """Run rgt-run with a private ledger; returns a function(args..., env=None, timeout=...)."""
    ledger = tmp_path / "ledger"

    def _run(*args: str, env: dict | None = None, timeout: int = 600, cwd: Path | None = None) -> CliResult:
        full_env = {**os.environ, "RGT_LEDGER": str(ledger), **(env or {})}
        proc = subprocess.run([*RGT_RUN, *map(str, args)], capture_output=True, text=True, env=full_env,
                              timeout=timeout, cwd=cwd or REPO)
        return CliResult(proc.returncode, proc.stdout, proc.stderr)

    _run.ledger = ledger
    return _run


# ---------------------------------------------------------------- stub hosts (podman), shared by a session

STUB_LAYOUTS = {
    # autodl-like: data disk with a small inode cap so a test can exhaust it cheaply, shared fs with ~cap,
    # a 512 MiB memory limit (free still shows the host's RAM)
    "adl": {"profile": "autodl", "instance_id": "autodl-7f3a21", "memory": "512m",
            "mounts": [{"path": "/root/autodl-tmp", "size_mib": 128, "inodes": 4000, "persist": True},
                       {"path": "/root/autodl-fs", "size_mib": 64, "inodes": 2000}]},
    # runpod-like: /workspace network volume, no memory limit
    # (persist: the volume outlives `podman stop`, like a network volume outlives a preemption)
    "rp": {"profile": "runpod", "instance_id": "pod-9k2m4x",
           "mounts": [{"path": "/workspace", "size_mib": 256, "persist": True}]},
    # a box for faults (broken driver, Xid, host key change); generic ssh profile
    "flt": {"profile": "generic_ssh", "instance_id": "box-faulty", "mounts": []},
}


@pytest.fixture(scope="session")
def stub_fleet(tmp_path_factory, request):
    """Three stub GPU hosts and a pinned inventory directory for them: {"inv": Path, "stubs": {name: StubHost}}."""
    import shutil as _shutil

    if _shutil.which("podman") is None:
        pytest.skip("podman is not installed (scripts/setup-stubs.sh installs it)")
    from tests.harness import stubhost as sh

    sh.ensure_image()
    tag = sh.session_tag("rgti")
    request.addfinalizer(lambda: sh.down(tag=tag))
    inv = tmp_path_factory.mktemp("fleet") / "inv"
    inv.mkdir()
    keydir = inv.parent / "keys"
    stubs = {}
    for name, spec in STUB_LAYOUTS.items():
        stubs[name] = sh.start_stub(name, keydir=keydir, known_hosts=inv / "known_hosts", tag=tag,
                                    instance_id=spec["instance_id"], memory=spec.get("memory"),
                                    mounts=spec["mounts"])
    return {"inv": inv, "stubs": stubs, "tag": tag}


def stub_inventory(fleet: dict, names: list[str], job: dict | None = None) -> Path:
    """Write hosts.yml for some stubs of the fleet (known_hosts stays the fleet's pinned file)."""
    from clihelp import write_inventory

    hosts = {}
    for name in names:
        stub = fleet["stubs"][name]
        hv = {k: v for k, v in stub.inventory_vars().items() if k != "ansible_ssh_common_args"}
        hv["rgt_profile"] = STUB_LAYOUTS[name]["profile"]
        hv["ansible_python_interpreter"] = "/usr/bin/python3"
        if job:
            hv["rgt_job"] = job
        hosts[name] = hv
    return write_inventory(fleet["inv"], hosts)
