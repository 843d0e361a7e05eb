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


def pytest_collection_modifyitems(config, items):
    """Under pytest-xdist (`scripts/test` runs `-n 3 --dist loadgroup`), a test file runs on one worker, in order
    (files keep module state: a stub fleet, a fake control plane), except the molecule scenarios, which are
    independent (each makes its own stubs) and spread over the workers: they are the long pole."""
    import pytest

    for item in items:
        if item.get_closest_marker("xdist_group"):
            continue
        group = item.nodeid.split("::", 1)[0]
        if group.endswith("test_molecule.py") and "[" in item.nodeid:
            group += "::" + item.nodeid.rsplit("[", 1)[1].rstrip("]")
        item.add_marker(pytest.mark.xdist_group(group))
