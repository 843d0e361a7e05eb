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
