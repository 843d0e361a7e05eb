"""Where the collection lives, and the collections path Ansible needs to resolve `rgt.remote_gpu`."""

from __future__ import annotations

import os
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
PLAYBOOKS_DIR = REPO_ROOT / "playbooks"
ANSIBLE_CFG = REPO_ROOT / "ansible.cfg"
COLLECTIONS_DIR = REPO_ROOT / ".collections"


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
