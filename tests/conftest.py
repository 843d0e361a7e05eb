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


import pytest  # noqa: E402 (after the import path above)


def _suffix_group(item, groups):
    """Write the loadgroup suffix (`<nodeid>@<group>`) where this pytest reads node ids. pytest 9.2 keeps them in
    `item._id` (a NodeId), so the suffix pytest-xdist 3.8 writes to `item._nodeid` reaches no scheduler and every
    test of a file is spread over the workers (pytest-dev/pytest-xdist#1386)."""
    suffixed = "%s@%s" % (item.nodeid, "_".join(sorted(groups)))
    try:
        from _pytest.nodeid import coerce_node_id
    except ImportError:  # pytest before 9.2: xdist's own suffix works
        return
    item._id = coerce_node_id(suffixed)


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook (which reads the groups)
def pytest_collection_modifyitems(config, items):
    """Under pytest-xdist (`scripts/test` runs `-n 3 --dist loadgroup`), a test file runs on one worker, in order
    (files keep module state: a stub fleet, a fake control plane, a Slurm cluster and the runs it submitted),
    except the molecule scenarios, which are independent (each makes its own stubs) and spread over the workers:
    they are the long pole."""
    for item in items:
        if not item.get_closest_marker("xdist_group"):
            group = item.nodeid.split("::", 1)[0]
            if group.endswith("test_molecule.py") and "[" in item.nodeid:
                group += "::" + item.nodeid.rsplit("[", 1)[1].rstrip("]")
            item.add_marker(pytest.mark.xdist_group(group))
        if getattr(config.option, "loadgroup", False) and "@" not in item.nodeid:
            _suffix_group(item, {m.args[0] if m.args else m.kwargs.get("name", "default")
                                 for m in item.iter_markers("xdist_group")})
