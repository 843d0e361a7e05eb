"""What each distribution carries. `ansible-galaxy collection build` ships the collection only (no runner, tests
or dev tooling, no example known_hosts); the wheel and the sdist carry the whole collection for `rgt-run`; one
license (Apache-2.0) in galaxy.yml, pyproject.toml, LICENSE and every file header; meta/ states the tested
ansible-core range and what an execution environment needs."""

import email
import shutil
import subprocess
import sys
import tarfile
import tomllib
import zipfile
from pathlib import Path

import pytest
import yaml
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name

from tests.buildwheel import build_dists

REPO = Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())
GALAXY = yaml.safe_load((REPO / "galaxy.yml").read_text())
EMBEDDED = "rgt/_collection/ansible_collections/rgt/remote_gpu/"
NOT_SHIPPED_DIRS = ("tests", "molecule", "scripts", "bench", "runner", ".ci", ".collections", ".venv", ".git")
NOT_SHIPPED_FILES = ("pyproject.toml", "setup.py", "MANIFEST.in")
SKIP_DIRS = {".venv", ".git", ".collections", ".rgt", "runs", "build", "dist", "__pycache__", ".pytest_cache",
             ".ruff_cache", ".cache", "rgt.egg-info"}


def collection_files(*tops: str) -> list[str]:
    """The checkout's files under these collection dirs, relative to the repo root (no caches)."""
    out = []
    for top in tops:
        for path in (REPO / top).rglob("*"):
            if path.is_file() and not SKIP_DIRS.intersection(path.relative_to(REPO).parts) \
                    and path.suffix not in (".pyc", ".pyo"):
                out.append(path.relative_to(REPO).as_posix())
    assert out, tops
    return sorted(out)


def source_files() -> list[Path]:
    """Every text file of the checkout that could carry a license line."""
    out = []
    for path in REPO.rglob("*"):
        rel = path.relative_to(REPO)
        if SKIP_DIRS.intersection(rel.parts) or not path.is_file() or path.name == "LICENSE" \
                or path == Path(__file__).resolve():  # this file names what it looks for
            continue
        if path.suffix in (".py", ".yml", ".yaml", ".md", ".toml", ".cfg", ".txt", ".in", ".sh", ".j2", ".json") \
                or path.parent.name in ("scripts", ".ci"):
            out.append(path)
    return out


@pytest.fixture(scope="module")
def galaxy_members(tmp_path_factory):
    if shutil.which("ansible-galaxy", path=str(Path(sys.executable).parent)) is None:
        pytest.skip("needs ansible-galaxy beside this interpreter (.venv)")
    out = tmp_path_factory.mktemp("galaxy")
    proc = subprocess.run([str(Path(sys.executable).parent / "ansible-galaxy"), "collection", "build", "--force",
                           "--output-path", str(out), str(REPO)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (tarball,) = out.glob("rgt-remote_gpu-*.tar.gz")
    with tarfile.open(tarball) as tar:
        return [m.name for m in tar.getmembers() if m.isfile()]


@pytest.fixture(scope="module")
def dists(tmp_path_factory):
    sdist, wheel = build_dists(tmp_path_factory.mktemp("dists"))
    with zipfile.ZipFile(wheel) as zf:
        wheel_names = set(zf.namelist())
        (meta_name,) = [n for n in wheel_names if n.endswith(".dist-info/METADATA")]
        metadata = email.message_from_bytes(zf.read(meta_name))
    with tarfile.open(sdist) as tar:
        sdist_names = {m.name.split("/", 1)[1] for m in tar.getmembers() if m.isfile() and "/" in m.name}
    return {"wheel": wheel_names, "sdist": sdist_names, "metadata": metadata}


def test_galaxy_build_ships_the_collection_only(galaxy_members):
    leaked = [n for n in galaxy_members
              if n.split("/", 1)[0] in NOT_SHIPPED_DIRS or n in NOT_SHIPPED_FILES or n.endswith("known_hosts")
              or "__pycache__" in n]
    assert leaked == []
    for needed in ("MANIFEST.json", "FILES.json", "LICENSE", "README.md",
                   "meta/runtime.yml", "meta/execution-environment.yml", "profiles/local.yml"):
        assert needed in galaxy_members, needed
    for top in ("roles", "playbooks", "plugins", "profiles"):
        missing = set(collection_files(top)) - set(galaxy_members)
        assert not missing, f"{top}: {sorted(missing)[:5]}"


def test_execution_environment_names_files_the_tarball_carries(galaxy_members):
    ee = yaml.safe_load((REPO / "meta" / "execution-environment.yml").read_text())
    assert ee["version"] == 3
    deps = ee["dependencies"]
    assert set(deps) == {"python", "system"}
    for rel in deps.values():
        assert rel in galaxy_members, rel
    wanted = {line.split(">=")[0].split("==")[0].strip().lower()
              for line in (REPO / deps["python"]).read_text().splitlines() if line.strip() and line[0] != "#"}
    assert {"jsonschema", "pyyaml"} <= wanted
    assert "ansible-core" not in wanted and "ansible" not in wanted  # the EE's base image brings ansible-core


def _constraints() -> dict[str, str]:
    pins = {}
    for line in (REPO / "constraints.txt").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, _, version = line.partition("==")
            pins[canonicalize_name(name)] = version.strip()
    return pins


def test_requires_ansible_is_the_tested_range():
    runtime = yaml.safe_load((REPO / "meta" / "runtime.yml").read_text())
    spec = SpecifierSet(runtime["requires_ansible"])
    (core,) = [Requirement(d) for d in PYPROJECT["project"]["dependencies"] if d.startswith("ansible-core")]
    assert core.specifier == spec, "pyproject's ansible-core range is the collection's requires_ansible"
    assert _constraints()["ansible-core"] in spec and "2.19.0" in spec
    assert "2.18.9" not in spec and "2.20.0" not in spec


def test_dependencies_are_ranges_and_ci_installs_an_exact_version_of_each():
    """pyproject.toml says what rgt works with (ranges: it lives in other people's environments); constraints.txt
    says what CI tests, exactly, and every version there is inside its range."""
    pins = _constraints()
    extras = PYPROJECT["project"]["optional-dependencies"]
    for raw in [*PYPROJECT["project"]["dependencies"], *(d for group in extras.values() for d in group)]:
        req = Requirement(raw)
        assert req.specifier and not any(s.operator == "==" for s in req.specifier), f"{raw}: a range, not a pin"
        name = canonicalize_name(req.name)
        assert name in pins, f"{req.name} has no exact version in constraints.txt"
        assert pins[name] in req.specifier, f"constraints.txt pins {req.name}=={pins[name]} outside {raw}"


def test_galaxy_yml_has_no_placeholder_links():
    links = {k: v for k, v in GALAXY.items() if k in ("repository", "documentation", "homepage", "issues")}
    assert not any(".invalid" in str(v) or "example." in str(v) for v in links.values()), links


def test_wheel_carries_the_collection_and_the_runner_schemas(dists):
    names = dists["wheel"]
    assert EMBEDDED + "galaxy.yml" in names and EMBEDDED + "ansible.cfg" in names
    for top in ("roles", "playbooks", "plugins", "profiles", "meta", "inventories/local", "examples/tiny_train"):
        missing = {EMBEDDED + rel for rel in collection_files(top)} - names
        assert not missing, f"{top}: {sorted(missing)[:5]}"
    for schema in (REPO / "runner" / "rgt" / "schemas").glob("*.json"):
        assert f"rgt/schemas/{schema.name}" in names
    templates = sorted((REPO / "runner" / "rgt" / "templates").glob("*.j2"))
    assert templates and all(f"rgt/templates/{t.name}" in names for t in templates), "the report's templates"
    modules = {str(p.relative_to(REPO / "runner")) for p in (REPO / "runner" / "rgt").rglob("*.py")
               if "__pycache__" not in p.parts}
    assert not sorted(modules - names), "runner modules (each subpackage in pyproject's packages)"
    assert not [n for n in names if n.startswith(EMBEDDED + "tests/") or "known_hosts" in n or ".pyc" in n]


def test_sdist_carries_what_builds_the_wheel(dists):
    names = dists["sdist"]
    for rel in ("setup.py", "pyproject.toml", "MANIFEST.in", "LICENSE", "galaxy.yml", "ansible.cfg",
                *collection_files("roles", "playbooks", "plugins", "profiles", "meta", "runner/rgt/templates")):
        assert rel in names, rel
    assert not [n for n in names if n.split("/", 1)[0] in ("tests", "molecule", "scripts", "bench", ".ci")]


def test_python_3_11_to_3_13_are_accepted(dists):
    spec = SpecifierSet(dists["metadata"]["Requires-Python"])
    assert all(v in spec for v in ("3.11.0", "3.12.1", "3.13.0"))
    assert "3.10.13" not in spec and "3.14.0" not in spec


def test_one_license_everywhere(dists):
    assert PYPROJECT["project"]["license"] == "Apache-2.0"
    assert GALAXY["license"] == ["Apache-2.0"] and "license_file" not in GALAXY
    assert dists["metadata"]["License-Expression"] == "Apache-2.0"
    assert (REPO / "LICENSE").read_text().lstrip().startswith("Apache License")
    for meta in (REPO / "roles").glob("*/meta/main.yml"):
        assert yaml.safe_load(meta.read_text())["galaxy_info"]["license"] == "Apache-2.0", meta
    plugins = [p for p in (REPO / "plugins").rglob("*.py") if "__pycache__" not in p.parts]
    unlicensed = [str(p.relative_to(REPO)) for p in plugins
                  if "# SPDX-License-Identifier: Apache-2.0" not in p.read_text().splitlines()[:6]]
    assert unlicensed == []
    gpl = [str(p.relative_to(REPO)) for p in source_files()
           if "GPL" in (text := p.read_text(errors="replace")) or "General Public License" in text]
    assert gpl == []
