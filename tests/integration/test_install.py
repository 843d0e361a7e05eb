"""`rgt-run` installed as a tool, the way `pipx install <checkout or wheel>` does it: the wheel built from this
checkout goes into a fresh venv outside the checkout, and a user drives it from a project directory of their own
(cwd and HOME in temp dirs, no ANSIBLE_* settings pointing at the checkout). The installed runner must find the
collection inside its own package, run the whole local lifecycle, and write nothing into site-packages nor into
the checkout."""

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.buildwheel import build_dists

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[2]
# where a runner that wrongly resolved to the checkout would write (the rest is the engineers' own edits)
CHECKOUT_STATE = (".rgt", "runs", ".collections", "build", "dist", "rgt.egg-info")


def tree(root: Path) -> dict[str, tuple[int, int]]:
    """{relative path: (size, mtime_ns)} of every file and link under root."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in filenames + [d for d in dirnames if os.path.islink(os.path.join(dirpath, d))]:
            st = os.lstat(os.path.join(dirpath, name))
            out[os.path.relpath(os.path.join(dirpath, name), root)] = (st.st_size, st.st_mtime_ns)
    return out


def checkout_state() -> dict:
    state = {"top": sorted(p.name for p in REPO.iterdir())}
    for name in CHECKOUT_STATE:
        state[name] = tree(REPO / name) if (REPO / name).exists() else None
    return state


@pytest.fixture(scope="module")
def tool(tmp_path_factory):
    """The installed tool: {"venv", "python", "rgt_run", "site"}; the venv lies outside the checkout."""
    work = tmp_path_factory.mktemp("install")
    _, wheel = build_dists(work / "build")
    venv = work / "venv"
    # no ensurepip (seconds on 2 cores): this interpreter's pip installs into the new venv (pip --python)
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    # the wheel's ranges, at the versions CI tests (constraints.txt), as scripts/bootstrap installs them
    proc = subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "-q",
                           "--disable-pip-version-check", "-c", str(REPO / "constraints.txt"), str(wheel)],
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    site = Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               capture_output=True, text=True, check=True).stdout.strip())
    assert (site / "rgt" / "paths.py").is_file() and not (site / "__editable__.rgt-0.1.0.pth").exists()
    return {"venv": venv, "python": python, "rgt_run": venv / "bin" / "rgt-run", "site": site}


def user_env(home: Path) -> dict:
    """A user's shell: nothing of the checkout's test setup (ANSIBLE_CONFIG, ANSIBLE_COLLECTIONS_PATH, the
    .venv on PATH, a private ledger) leaks in; `pipx` puts only the rgt-run link on PATH, not the venv."""
    keep = {k: v for k, v in os.environ.items()
            if k in ("LANG", "LC_ALL", "TMPDIR", "PIP_CERT", "SSL_CERT_FILE", "REQUESTS_CA_BUNDLE")}
    return {**keep, "HOME": str(home), "PATH": "/usr/local/bin:/usr/bin:/bin", "ANSIBLE_NOCOLOR": "1"}


def run(tool, *args, cwd: Path, env: dict, timeout: int = 120) -> subprocess.CompletedProcess:
    return subprocess.run([str(tool["rgt_run"]), *args], capture_output=True, text=True, cwd=cwd, env=env,
                          timeout=timeout, stdin=subprocess.DEVNULL)


def edit_job(project: Path, python: Path) -> None:
    """The user's edits to the job.yml that `rgt-run init` wrote, and their code beside it."""
    shutil.copytree(REPO / "examples" / "tiny_train", project / "code",
                    ignore=shutil.ignore_patterns("__pycache__", "job.yml"))
    spec = yaml.safe_load((project / "job.yml").read_text())
    spec["rgt_job"].update({
        "name": "tiny-installed", "command": "python train.py --steps 3 --ckpt-every 1 --sleep 0.05",
        "python": str(python), "code_dir": "code",  # relative: to the directory job.yml is in
        "checkpoint": {"glob": "step_*.ckpt"}, "outputs": ["weights.bin", "metrics.json"], "disk_floor_gib": 0.01,
        "smoke_command": "python train.py --steps 2 --ckpt-every 1"})
    (project / "job.yml").write_text(yaml.safe_dump(spec))


def test_installed_tool_runs_the_lifecycle_from_a_user_project(tool, tmp_path):
    home, project = tmp_path / "home", tmp_path / "project"
    home.mkdir()
    project.mkdir()
    env = user_env(home)
    site_before, checkout_before = tree(tool["site"]), checkout_state()

    helped = run(tool, "--help", cwd=tmp_path, env=env)
    assert helped.returncode == 0, helped.stderr
    assert "usage: rgt-run" in helped.stdout
    profiles = run(tool, "profiles", cwd=tmp_path, env=env)
    assert profiles.returncode == 0, profiles.stderr
    assert "runpod" in profiles.stdout + profiles.stderr and "local" in profiles.stdout + profiles.stderr

    init = run(tool, "init", "--profile", "local", cwd=project, env=env)
    assert init.returncode == 0, init.stdout + init.stderr
    hosts = yaml.safe_load((project / "inventory" / "hosts.yml").read_text())["all"]["hosts"]
    (host,) = hosts
    assert hosts[host]["rgt_profile"] == "local"
    edit_job(project, tool["python"])
    life = run(tool, "lifecycle", "-i", "inventory", "-e", "@job.yml", "--interval", "1", "--json",
               cwd=project, env=env, timeout=600)
    assert life.returncode == 0, life.stdout[-2000:] + life.stderr[-6000:]
    doc = json.loads(life.stdout)
    assert [(p["phase"], p["exit_code"]) for p in doc["phases"]] == \
        [("train", 0), ("watch", 0), ("pull", 0), ("teardown", 0)]

    # the pulled result lies under the project's ./runs, verified, byte for byte the box's export
    pulled = project / "runs" / "tiny-installed"
    verified = json.loads((pulled / f"{host}.PULL_VERIFIED.json").read_text())
    assert verified["run_id"] == "tiny-installed" and verified["files"] >= 2
    (exported,) = (project / ".rgt").glob("local-box/durable/*/export/tiny-installed/out/weights.bin")
    local = pulled / host / "out" / "weights.bin"
    assert hashlib.sha256(local.read_bytes()).digest() == hashlib.sha256(exported.read_bytes()).digest()
    assert (project / ".rgt").is_dir()  # the project's own ledger

    runs = run(tool, "runs", "--json", cwd=project, env=env)
    assert runs.returncode == 0, runs.stdout + runs.stderr
    listed = [(r["host"], r["run_id"], r["pull"]) for r in json.loads(runs.stdout)["runs"]]
    assert listed == [(host, "tiny-installed", "verified")]

    assert tree(tool["site"]) == site_before  # nothing written into the installed package
    assert checkout_state() == checkout_before  # nor into the checkout
