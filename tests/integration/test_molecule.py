"""The molecule scenarios (molecule/<scenario>, listed in SCENARIOS) end to end: `molecule test -s <scenario>`.

Each scenario creates its podman stub GPU hosts through tests/harness (autodl-like and/or runpod-like), converges
the role over real ssh with pinned host keys, converges again (idempotence: 0 changed), verifies with testinfra
and destroys the stubs. Skipped only when podman is not installed.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
VENV_BIN = REPO / ".venv" / "bin"
ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")

pytestmark = [
    pytest.mark.stubs,
    pytest.mark.slow,
    pytest.mark.skipif(shutil.which("podman") is None, reason="podman is not installed (scripts/setup-stubs.sh)"),
]


def _molecule_env() -> dict:
    env = dict(os.environ)
    env.update(
        ANSIBLE_COLLECTIONS_PATH=str(REPO / ".collections"),
        CONTAINERS_CONF=str(REPO / "tests" / "stubs" / "containers.conf"),
        PATH=f"{VENV_BIN}{os.pathsep}{env.get('PATH', '')}",
        NO_COLOR="1",
        PY_COLORS="0",
    )
    env.pop("RGT_STUB_TAG", None)  # each scenario makes its own tag (kept in its ephemeral dir)
    return env


@pytest.fixture(scope="module")
def stub_image():
    from tests.harness import stubhost as sh

    sh.ensure_image(build=False)  # builds localhost/rgt-stub:latest only when it is missing


# Lifecycle order. Each scenario is self-contained (its own stubs; the spine scenarios lay out or ship what they
# need in converge), so any one can run alone: pytest -k "test_molecule_scenario and collect".
SCENARIOS = [
    "probe",
    "env_check",
    "upload_resume",
    "launch_detached",
    "monitor",
    "collect",
    "teardown",  # against a fake RunPod control plane
]


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_molecule_scenario(scenario, stub_image):
    molecule = VENV_BIN / "molecule"
    cmd = [str(molecule) if molecule.exists() else "molecule", "test", "-s", scenario]
    t0 = time.monotonic()
    # one stream: molecule logs on stderr, ansible-playbook and pytest print on stdout
    proc = subprocess.run(
        cmd, cwd=REPO, env=_molecule_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=900
    )
    took = time.monotonic() - t0
    out = ANSI.sub("", proc.stdout)
    tail = out[-6000:]
    assert proc.returncode == 0, f"molecule test -s {scenario} -> rc {proc.returncode} after {took:.0f}s:\n{tail}"
    # molecule's idempotence step fails on any changed task of the second converge
    assert re.search(rf"{scenario} (?:>|➜) idempotence\]?:? Executed: Successful", out), f"idempotence failed:\n{tail}"
    summary = re.findall(r"=+ (\d+ passed[^=]*) in [\d.]+s =+", out)
    assert summary and "failed" not in summary[-1] and "error" not in summary[-1], f"testinfra:\n{tail}"
    assert re.search(rf"{scenario} (?:>|➜) verify\]?:? Executed: Successful", out), tail
    assert re.search(rf"{scenario} (?:>|➜) destroy\]?:? Executed: Successful", out), tail
