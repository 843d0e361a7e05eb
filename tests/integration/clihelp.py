"""Helpers shared by integration tests (import as `from clihelp import ...`)."""

from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]


def write_inventory(path: Path, hosts: dict, group_vars: dict | None = None) -> Path:
    """Write a YAML inventory directory (hosts.yml + group_vars/all.yml)."""
    path.mkdir(parents=True, exist_ok=True)
    (path / "hosts.yml").write_text(yaml.safe_dump({"all": {"hosts": hosts}}))
    if group_vars:
        (path / "group_vars").mkdir(exist_ok=True)
        (path / "group_vars" / "all.yml").write_text(yaml.safe_dump(group_vars))
    return path
