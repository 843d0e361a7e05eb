"""The real single-node Slurm cluster the slurm test modules share (tests/slurm/start-slurm.sh): each test module
that uses the fixture gets a cluster of its own (private state dir, config and ports: another test run on the same
machine has its own and never stops this one), stopped at the end. It skips only when it cannot be had at all.
SLURM_CONF points the test's sbatch/squeue and the runner's scontrol/scancel at it.

Use: `from slurmcluster import slurm, job_state, squeue_state  # noqa: F401` in a test module."""

import os
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SLURM = REPO / "tests" / "slurm"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _sh(script: str, env: dict) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(SLURM / script)], capture_output=True, text=True, timeout=900,
                          env={**os.environ, **env})


@pytest.fixture(scope="module")
def slurm():
    """A running cluster of this module's own; yields its state dir (logs under log/)."""
    if os.geteuid() != 0:
        pytest.skip("needs root: start-slurm.sh installs slurm packages, runs slurmd and munged")
    have = all(shutil.which(b) for b in ("slurmctld", "slurmd", "scancel", "munged"))
    if not have and not shutil.which("apt-get"):
        pytest.skip("slurm packages are missing and there is no apt-get to install them")
    state = tempfile.mkdtemp(prefix="rgt-slurm-", dir="/tmp")  # short: slurmd keeps unix sockets under it
    # 6 CPUs advertised (config_overrides; jobs share the real cores): the engine module runs three 1-CPU runs and
    # a sweep's array (two 1-CPU tasks at once) side by side, and none of them may wait for Resources
    env = {"RGT_SLURM_STATE": state, "RGT_SLURM_CTLD_PORT": str(_free_port()),
           "RGT_SLURM_D_PORT": str(_free_port()), "RGT_SLURM_CPUS": "6"}
    old_conf = os.environ.get("SLURM_CONF")
    os.environ["SLURM_CONF"] = f"{state}/slurm.conf"
    try:
        t0 = time.monotonic()
        proc = _sh("start-slurm.sh", env)
        if proc.returncode == 3:  # packages missing and apt could not install them (e.g. no network)
            pytest.skip("cannot install slurm packages: " + proc.stderr.strip())
        assert proc.returncode == 0, proc.stdout + proc.stderr
        print(f"\nslurm start: {time.monotonic() - t0:.2f} s\n{proc.stdout}")
        yield Path(state)
    finally:
        t0 = time.monotonic()
        stop = _sh("stop-slurm.sh", env)
        print(f"\nslurm stop: {time.monotonic() - t0:.2f} s\n{stop.stdout}{stop.stderr}")
        if old_conf is None:
            os.environ.pop("SLURM_CONF", None)
        else:
            os.environ["SLURM_CONF"] = old_conf
        shutil.rmtree(state, ignore_errors=True)


def job_state(job_id: str) -> str:
    """JobState from scontrol (MinJobAge=3600 keeps finished jobs listed); '' when Slurm no longer knows it."""
    out = subprocess.run(["scontrol", "show", "job", job_id], capture_output=True, text=True).stdout
    for word in out.split():
        if word.startswith("JobState="):
            return word.split("=", 1)[1]
    return ""


def squeue_state(job_id: str) -> str:
    return subprocess.run(["squeue", "-h", "-j", job_id, "-o", "%T"], capture_output=True, text=True).stdout.strip()
