"""The engines, one table: where a host's run is launched, looked at, pulled and stopped (rgt.engines.base.Engine,
the interface). A host's engine is chosen here and only here, through the registry: its profile's detach
primitive (rgt_registry.detach) is driven by exactly one engine class (Engine.drives reads the entry's runs_on and
job_fields). A fourth engine is one new module in runner/rgt/engines/ with its class in ENGINES, plus its
registry entry (tests/unit/test_engines.py holds every registered primitive to exactly one class).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from rich.console import Console

from rgt import k8s, paths
from rgt.engines.base import Engine
from rgt.engines.kubernetes import Kubernetes
from rgt.engines.ssh import Ssh
from rgt.observe import record_all

# every engine, built from its class (never from a name); the order is the order a command acts in on a mixed
# inventory (as before the engines: Kubernetes hosts first, then the boxes' play, whose result holds them all)
ENGINES: tuple[Engine, ...] = (Kubernetes(), Ssh())
DEFAULT: Engine = ENGINES[-1]  # the engine of a command that names no host: the boxes' play


def engine_for_entry(entry) -> Engine:
    """The one engine that drives a registry entry (None: the profile names no registered primitive)."""
    found = [engine for engine in ENGINES if engine.drives(entry)]
    if len(found) != 1:
        raise AssertionError(f"detach primitive {getattr(entry, 'name', entry)!r} is driven by "
                             f"{len(found)} engines: {[e.name for e in found]}")
    return found[0]


def engine_of(profile: dict) -> Engine:
    """The engine of a host with this profile (its detach primitive's registry entry; `auto`, or none: SSH)."""
    return engine_for_entry(paths.module_util("rgt_registry").detach(k8s.primitive(profile)))


def split(hosts: list) -> list[tuple[Engine, list]]:
    """[(engine, its hosts)] for the engines `hosts` use, in ENGINES order, each host's order kept."""
    chosen = {id(h): engine_of(h.profile) for h in hosts}
    return [(engine, mine) for engine in ENGINES if (mine := [h for h in hosts if chosen[id(h)] is engine])]


def split_instances(instances: list) -> list[tuple[Engine, list]]:
    """[(engine, its teardown instances)]: an instance whose hosts are all of one engine is that engine's; one
    that mixes them is the boxes' play's (DEFAULT)."""
    def engine(inst) -> Engine:
        found = {id(e): e for e in (engine_of(h.profile) for h in inst.hosts)}
        return next(iter(found.values())) if len(found) == 1 else DEFAULT
    chosen = {id(i): engine(i) for i in instances}
    return [(e, mine) for e in ENGINES if (mine := [i for i in instances if chosen[id(i)] is e])]


def poll(args: argparse.Namespace, console: Console, hosts: list, extravars: dict, ledger: Path) -> dict:
    """One look at every host's run, each through its engine (Engine.observe: the SSH status round or monitor.yml
    on a box, kubectl on Kubernetes); returns {host: doc}, recorded in the ledger (rgt.observe.record)."""
    docs: dict[str, dict] = {}
    for engine, mine in split(hosts):
        docs.update(engine.observe(args, console, mine, extravars, ledger))
    return record_all(ledger, {h.name: docs[h.name] for h in hosts}, time.time())
