"""Every action plugin is documented by its stub in plugins/modules (what ansible-doc shows), and the stub's options
are the plugin's argument spec: the same names, types, element types, defaults, choices and required ones."""

import importlib
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
ACTIONS = sorted(p.stem for p in (REPO / "plugins" / "action").glob("rgt_*.py"))
KEYS = ("type", "elements", "default", "choices", "required")


@pytest.mark.parametrize("name", ACTIONS)
def test_the_stubs_options_are_the_action_plugins_argument_spec(name):
    action = importlib.import_module("ansible_collections.rgt.remote_gpu.plugins.action." + name)
    stub = importlib.import_module("ansible_collections.rgt.remote_gpu.plugins.modules." + name)
    doc = yaml.safe_load(stub.DOCUMENTATION)
    assert doc["module"] == name
    for part in ("EXAMPLES", "RETURN"):
        yaml.safe_load(getattr(stub, part))
    documented = {k: {key: v[key] for key in KEYS if v.get(key) not in (None, False)}
                  for k, v in doc["options"].items()}
    spec = {k: {key: v[key] for key in KEYS if v.get(key) not in (None, False)}
            for k, v in action.ARGUMENT_SPEC.items()}
    assert documented == spec
