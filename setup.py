# SPDX-License-Identifier: Apache-2.0
"""Build hook: the wheel carries the Ansible collection `rgt.remote_gpu` as a real collections tree inside the
package, `rgt/_collection/ansible_collections/rgt/remote_gpu/`, so an installed `rgt-run` (pip, pipx) points
Ansible at it without a checkout and without writing into site-packages. Everything else is in pyproject.toml.

The collection's files are copied from this source tree (a checkout, or an unpacked sdist: MANIFEST.in lists the
same paths). An editable install (`pip install -e .`) copies nothing: `rgt.paths` finds the checkout instead."""

from __future__ import annotations

import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = Path(__file__).resolve().parent
# What Ansible and the runner need at run time, relative to the collection root: keep MANIFEST.in in step.
COLLECTION_FILES = ("galaxy.yml", "ansible.cfg", "LICENSE")
COLLECTION_DIRS = ("meta", "playbooks", "roles", "plugins", "profiles",
                   "inventories/local",       # the embedded default inventory
                   "examples/tiny_train")     # its job's code (rgt_job.code_dir, resolved from the collection root)
EMBEDDED = ("_collection", "ansible_collections", "rgt", "remote_gpu")
SKIP = shutil.ignore_patterns("__pycache__", "*.pyc", "*.pyo")


class BuildPyWithCollection(build_py):
    """build_py, plus the collection tree copied into the built package."""

    def run(self):
        super().run()
        if getattr(self, "editable_mode", False):
            return
        self._collection_outputs = self.copy_collection(Path(self.build_lib, "rgt", *EMBEDDED))

    @staticmethod
    def copy_collection(target: Path) -> list[str]:
        missing = [rel for rel in (*COLLECTION_FILES, *COLLECTION_DIRS) if not (HERE / rel).exists()]
        if missing:
            raise SystemExit(f"rgt build: the collection is incomplete, missing {', '.join(missing)} under {HERE} "
                             "(an sdist must carry them: see MANIFEST.in)")
        if target.exists():
            shutil.rmtree(target)
        target.mkdir(parents=True)
        for rel in COLLECTION_FILES:
            shutil.copy2(HERE / rel, target / rel)
        for rel in COLLECTION_DIRS:
            shutil.copytree(HERE / rel, target / rel, ignore=SKIP, symlinks=False)
        return sorted(str(p) for p in target.rglob("*") if p.is_file())

    def get_outputs(self, include_bytecode=1):
        return [*super().get_outputs(include_bytecode), *getattr(self, "_collection_outputs", [])]


setup(cmdclass={"build_py": BuildPyWithCollection})
