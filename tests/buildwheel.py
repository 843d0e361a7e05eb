"""Build the `rgt` sdist and wheel the way a user's `pipx install <checkout>` does, without writing into the
checkout: the source tree is copied to a temp dir first (setuptools writes build/ and *.egg-info beside its
source). `python -m build` makes the sdist, then the wheel FROM that sdist, so a collection file missing from
MANIFEST.in fails here too."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# what a build must never see: local state, caches, other builds (all git-ignored)
SKIP = shutil.ignore_patterns(".git", ".venv", ".collections", ".rgt", "runs", "build", "dist", "*.egg-info",
                              "__pycache__", "*.pyc", ".pytest_cache", ".ruff_cache", ".cache", "*.tar.gz")


def build_dists(workdir: Path) -> tuple[Path, Path]:
    """(sdist, wheel) built from a copy of the checkout under `workdir`."""
    src, out = workdir / "src", workdir / "dist"
    shutil.copytree(REPO, src, ignore=SKIP, symlinks=True)
    proc = subprocess.run([sys.executable, "-m", "build", "--outdir", str(out), str(src)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"python -m build failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    (sdist,), (wheel,) = out.glob("rgt-*.tar.gz"), out.glob("rgt-*.whl")
    return sdist, wheel
