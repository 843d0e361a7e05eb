"""The engines behind one interface (rgt.engines): every registered detach primitive is driven by exactly one
engine class, the table is built from the classes (every Engine subclass of runner/rgt/engines/ is in it, once),
each engine implements every operation of rgt.engines.base.Engine, and a host's engine is chosen by its profile's
primitive only (the registry's runs_on / job_fields)."""

from __future__ import annotations

import ast
import importlib
import inspect
import pkgutil

import pytest

from rgt import engines
from rgt.engines.base import Engine
from rgt.engines.kubernetes import Kubernetes
from rgt.engines.ssh import Ssh
from rgt.paths import module_util

registry = module_util("rgt_registry")


def engine_classes() -> set[type]:
    """Every Engine subclass defined in a module of the package runner/rgt/engines/."""
    found = set()
    for info in pkgutil.iter_modules(engines.__path__):
        module = importlib.import_module(f"rgt.engines.{info.name}")
        found |= {obj for _name, obj in inspect.getmembers(module, inspect.isclass)
                  if issubclass(obj, Engine) and obj is not Engine and obj.__module__ == module.__name__}
    return found


def test_the_table_is_built_from_the_classes_one_instance_each():
    classes = [type(engine) for engine in engines.ENGINES]
    assert len(classes) == len(set(classes)), "an engine class twice in rgt.engines.ENGINES"
    assert set(classes) == engine_classes(), "an Engine subclass of runner/rgt/engines/ is not in ENGINES"
    assert len({engine.name for engine in engines.ENGINES}) == len(engines.ENGINES)


@pytest.mark.parametrize("entry", registry.DETACH_PRIMITIVES, ids=lambda e: e.name)
def test_every_registered_primitive_is_driven_by_exactly_one_engine(entry):
    driving = [type(engine).__name__ for engine in engines.ENGINES if engine.drives(entry)]
    assert len(driving) == 1, f"{entry.name} ({'built' if entry.built else 'not built'}) is driven by {driving}"


def test_a_profile_that_names_no_registered_primitive_is_an_ssh_box():
    assert isinstance(engines.engine_for_entry(None), Ssh)
    assert isinstance(engines.engine_of({"detach": {"primitive": "auto"}}), Ssh)
    assert isinstance(engines.engine_of({}), Ssh)


def test_slurm_is_the_ssh_engine_and_a_k8s_job_the_kubernetes_one():
    assert isinstance(engines.engine_of({"detach": {"primitive": "sbatch"}}), Ssh)  # the login node, over SSH
    assert isinstance(engines.engine_of({"detach": {"primitive": "tmux"}}), Ssh)
    assert isinstance(engines.engine_of({"detach": {"primitive": "k8s-job"}}), Kubernetes)


@pytest.mark.parametrize("cls", sorted(engine_classes(), key=lambda c: c.__name__), ids=lambda c: c.__name__)
def test_every_engine_implements_every_operation(cls):
    required = [node.name for node in ast.walk(ast.parse(inspect.getsource(Engine)))
                if isinstance(node, ast.FunctionDef) and isinstance(node.body[-1], ast.Raise)
                and "NotImplementedError" in ast.unparse(node.body[-1])]
    assert required, "the interface names no required operation"
    missing = [name for name in required if getattr(cls, name) is getattr(Engine, name)]
    assert not missing, f"{cls.__name__} does not implement {missing}"


def test_split_groups_hosts_by_engine_in_the_tables_order():
    class Host:
        def __init__(self, name, primitive):
            self.name, self.profile = name, {"detach": {"primitive": primitive}}

    hosts = [Host("k1", "k8s-job"), Host("b1", "tmux"), Host("s1", "sbatch"), Host("k2", "k8s-job")]
    groups = [(type(engine), [h.name for h in mine]) for engine, mine in engines.split(hosts)]
    assert groups == [(Kubernetes, ["k1", "k2"]), (Ssh, ["b1", "s1"])]
    assert engines.split([]) == []
