"""Shared test setup: the collection import path, the repo root, and every test's own working state."""

import os
import pwd
import shutil
import subprocess
import sys
import tempfile
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


# ---------------------------------------------------------------- every test's own working state
# No test reads or writes the checkout's own working state (./.rgt, ./runs: what the README's first command leaves
# there) nor the user's home (~/.cache/rgt, ~/.ansible). Each test process (an xdist worker) gets a home of its own:
# $HOME, the XDG dirs (rgt's caches: parsed inventories, the built zipapp; caches only, keyed by what they hold, so
# the tests of one worker share them) and ~/.ansible (ssh's ControlMaster sockets, shared the same way). Each test
# gets a directory of its own as cwd, with the ledger and the runs dir there. The directories are short paths under
# /tmp because ssh's ControlPath sockets must fit in 108 bytes.

WORKING_STATE = ("RGT_LEDGER", "RGT_RUNS_DIR", "HOME", "XDG_CACHE_HOME", "XDG_CONFIG_HOME", "XDG_DATA_HOME",
                 "ANSIBLE_HOME", "ANSIBLE_REMOTE_TEMP")


def _home_env(root: Path) -> dict[str, str]:
    home = root / "home"
    return {"HOME": str(home), "XDG_CACHE_HOME": str(home / ".cache"), "XDG_CONFIG_HOME": str(home / ".config"),
            "XDG_DATA_HOME": str(home / ".local" / "share"), "ANSIBLE_HOME": str(home / ".ansible"),
            # Ansible expands the local connection's remote_tmp (~/.ansible/tmp) to the login user's home
            # (~root), not $HOME: point it at this home too
            "ANSIBLE_REMOTE_TEMP": str(home / ".ansible" / "tmp")}


def _work_env(root: Path) -> dict[str, str]:
    work = root / "work"
    return {"RGT_LEDGER": str(work / ".rgt"), "RGT_RUNS_DIR": str(work / "runs")}


def _new_state_root(prefix: str, home: bool) -> Path:
    root = Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))
    (root / "work").mkdir()
    if home:
        (root / "home").mkdir()
    return root


def _guarded() -> list[Path]:
    """The working state outside the tests' own directories that a test must leave as it found it."""
    real_home = Path(pwd.getpwuid(os.getuid()).pw_dir)
    return [REPO / ".rgt", REPO / "runs", real_home / ".cache" / "rgt", real_home / ".ansible"]


def _snapshot() -> dict[str, tuple]:
    seen: dict[str, tuple] = {}
    for top in _guarded():
        for path in [top, *top.rglob("*")] if top.exists() else []:
            try:
                st = path.lstat()
            except OSError:
                continue
            seen[str(path)] = (st.st_mtime_ns, st.st_size) if not path.is_dir() else ("dir",)
    return seen


def pytest_configure(config):
    """Before any fixture (session-scoped ones start servers and stub fleets that inherit the environment): this
    process's own working state; each test then gets a fresh one (`_own_working_state`)."""
    config._rgt_state_root = _new_state_root("rgt-s", home=True)
    config._rgt_state_before = _snapshot()
    config._rgt_state_saved = {k: os.environ.get(k) for k in WORKING_STATE}
    os.environ.update({**_home_env(config._rgt_state_root), **_work_env(config._rgt_state_root)})


def pytest_unconfigure(config):
    for key, value in getattr(config, "_rgt_state_saved", {}).items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value
    shutil.rmtree(getattr(config, "_rgt_state_root", "/nonexistent"), ignore_errors=True)


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session, exitstatus):
    """Fail the run when a test changed the checkout's working state or the user's home (a test that forgot to
    point a subprocess at its own directories)."""
    if hasattr(session.config, "workerinput"):  # an xdist worker: the controller checks once
        return
    before, after = session.config._rgt_state_before, _snapshot()
    changed = sorted({p for p in set(before) | set(after) if before.get(p) != after.get(p)})
    if changed:
        listed = "\n  ".join(changed[:20]) + ("\n  ..." if len(changed) > 20 else "")
        sys.stderr.write(f"\nERROR: the tests changed working state outside their own directories:\n  {listed}\n")
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


@pytest.fixture(autouse=True)
def _own_working_state(monkeypatch):
    """Each test: its own cwd, ledger and runs dir (removed afterwards)."""
    root = _new_state_root("rgt-t", home=False)
    for key, value in _work_env(root).items():
        monkeypatch.setenv(key, value)
    monkeypatch.chdir(root / "work")
    yield root
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def tmpfs():
    """mount(path, options): a tmpfs mounted on the new directory `path` (mount -o `options`, e.g. "size=4m"),
    unmounted after the test; the test is skipped where this process may not mount one."""
    mounted = []

    def mount(path: Path, options: str) -> Path:
        path.mkdir()
        proc = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(path)], capture_output=True,
                              text=True)
        if proc.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here: {proc.stderr.strip()}")
        mounted.append(path)
        return path

    yield mount
    for path in reversed(mounted):
        subprocess.run(["umount", str(path)], check=True)


@pytest.fixture
def plane():
    """plane(kind, **knobs): a started fake control plane (tests/fakes/control_planes.py), stopped after the test."""
    from tests.fakes import control_planes
    made = []

    def _make(kind, **knobs):
        fake = control_planes.PLANES[kind](**knobs).start()
        made.append(fake)
        return fake

    yield _make
    for fake in made:
        fake.stop()
