"""Every role documents itself: each default is an argument_specs option and appears in the README."""

from pathlib import Path

import pytest
import yaml

ROLES = Path(__file__).resolve().parents[2] / "roles"


@pytest.mark.parametrize("role", sorted(p.name for p in ROLES.iterdir() if p.is_dir()))
def test_readme_and_argument_specs_document_every_default(role):
    defaults = [n for n in yaml.safe_load((ROLES / role / "defaults" / "main.yml").read_text())
                if not n.startswith("_")]
    specs = yaml.safe_load((ROLES / role / "meta" / "argument_specs.yml").read_text())
    options = specs["argument_specs"]["main"]["options"]
    readme = (ROLES / role / "README.md").read_text()
    assert set(options) == set(defaults)
    for name in defaults:
        assert name in readme, name
