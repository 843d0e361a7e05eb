"""Where the collection lives, and the collections path Ansible needs to resolve `rgt.remote_gpu`."""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
from pathlib import Path
from types import ModuleType

REPO_ROOT = Path(__file__).resolve().parents[1]
PLAYBOOKS_DIR = REPO_ROOT / "playbooks"
ANSIBLE_CFG = REPO_ROOT / "ansible.cfg"
COLLECTIONS_DIR = REPO_ROOT / ".collections"
MODULE_UTILS_DIR = REPO_ROOT / "plugins" / "module_utils"


MODULE_UTILS_PACKAGE = "ansible_collections.rgt.remote_gpu.plugins.module_utils"


class _ModuleUtilsFinder(importlib.abc.MetaPathFinder):
    """Resolves `ansible_collections.rgt.remote_gpu.plugins.module_utils.<name>` to this collection's files, so a
    module_util that imports another one (rgt_manifest -> rgt_runlayout) loads in the runner exactly as on the
    box, without a collections path. Last on sys.meta_path: a real collection on the path wins."""

    def find_spec(self, fullname, path=None, target=None):
        if MODULE_UTILS_PACKAGE.startswith(fullname + ".") or fullname == MODULE_UTILS_PACKAGE:
            return importlib.machinery.ModuleSpec(fullname, None, is_package=True)  # namespace parents
        if fullname.startswith(MODULE_UTILS_PACKAGE + "."):
            name = fullname[len(MODULE_UTILS_PACKAGE) + 1:]
            source = MODULE_UTILS_DIR / f"{name}.py"
            if "." not in name and source.is_file():
                return importlib.util.spec_from_file_location(fullname, source)
        return None


def module_util(name: str) -> ModuleType:
    """A module_utils file of the collection, imported under its collection name: the runner shares the box's
    rules (names, paths, profiles, manifests, the teardown gate) with the modules, one copy each."""
    if not any(isinstance(f, _ModuleUtilsFinder) for f in sys.meta_path):
        sys.meta_path.append(_ModuleUtilsFinder())
    return importlib.import_module(f"{MODULE_UTILS_PACKAGE}.{name}")


def ensure_collection_link() -> Path:
    """Make `.collections/ansible_collections/rgt/remote_gpu` point at the repo root (idempotent)."""
    link = COLLECTIONS_DIR / "ansible_collections" / "rgt" / "remote_gpu"
    if not link.exists():
        link.parent.mkdir(parents=True, exist_ok=True)
        if link.is_symlink():  # dangling
            link.unlink()
        os.symlink(os.path.relpath(REPO_ROOT, link.parent), link)
    return COLLECTIONS_DIR


def resolve_playbook(name: str) -> Path:
    """Accept `playbooks/train.yml`, `train.yml`, `train` or any path to an existing file."""
    candidates = [Path(name), REPO_ROOT / name, PLAYBOOKS_DIR / name, PLAYBOOKS_DIR / f"{name}.yml"]
    for cand in candidates:
        if cand.is_file():
            return cand.resolve()
    raise FileNotFoundError(name)
