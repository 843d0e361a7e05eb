"""Shared test setup: the collection import path, and the repo root."""

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
COLLECTIONS = REPO / ".collections"

link = COLLECTIONS / "ansible_collections" / "rgt" / "remote_gpu"
if not link.exists():
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to("../../..")
if str(COLLECTIONS) not in sys.path:
    sys.path.insert(0, str(COLLECTIONS))
if str(REPO) not in sys.path:  # `tests.harness` is imported by fixtures and molecule playbooks alike
    sys.path.insert(0, str(REPO))
