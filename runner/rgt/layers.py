"""The runner's layers, one table: cli -> commands -> engines -> core -> module_utils.

A module imports only modules of its own layer or of the layers below it, never one above, and no import cycle
runs through any of them (tests/unit/test_layers.py holds every module of runner/rgt/ to this table; the layer map
at the top of docs/internals.md is held to it too). Every module of runner/rgt/ is in exactly one layer. A module
of a subpackage is named with its package, dotted (`engines.ssh`: runner/rgt/engines/ssh.py); the package's own
`__init__.py` is the package's name (`engines`).

- cli: parses the command line and dispatches (argparse, the command table, shell completion, main()). Nothing
  below it imports it; its only caller is the console script `rgt-run` (pyproject: rgt.cli:main).
- commands: what each subcommand does, and what the commands share: input preparation (prepare), the summary of
  a play (report), watch's notifications (notify).
- engines: where a run is launched, looked at, pulled and stopped: the engines behind one interface (the package
  engines: its table and the choice of a host's engine; engines.base the interface; engines.ssh boxes and Slurm's
  login node over SSH plays; engines.kubernetes Kubernetes), plays through ansible-runner (phases), the SSH
  status round (sshround) and the code it ships (bundle), the pull round (pullround), the status documents' shapes
  (observe), Kubernetes (k8s manifests, k8s_engine's kubectl, k8s_run).
- core: the facts every layer reads and writes, reaching no box: errors, paths, the ledger and its records (runs
  remembered, sweep rosters), inventory, job spec, profiles, output.
- module_utils: plugins/module_utils/, the collection's code shared with the box (Python 3.6+, stdlib only),
  imported by the runner through rgt.paths.module_util; it imports nothing of the runner.
"""

from __future__ import annotations

from rgt import paths

ORDER = ("cli", "commands", "engines", "core", "module_utils")  # top first: a layer imports its own and later ones

LAYERS: dict[str, list[str]] = {
    "cli": ["cli"],
    "commands": ["automove", "budget", "init", "lifecycle", "logs", "move", "notify", "offload", "offloadpull", "pin",
                 "plan", "play", "prepare", "prices", "pull", "report", "retry", "runreport", "runs", "service",
                 "status", "teardown", "unattended"],
    "engines": ["bundle", "engines", "engines.base", "engines.kubernetes", "engines.ssh", "k8s", "k8s_engine",
                "k8s_run", "observe", "phases", "pullround", "sshround"],
    "core": ["confirmation", "endings", "errors", "events", "inventory", "jobspec", "layers", "ledger", "memory",
             "output", "paths", "profiles", "progress", "rosters", "safetext", "sweeps", "watchlock"],
    # the collection's module_utils, as they are on disk (each one is box-side code, so each one is this layer)
    "module_utils": sorted(p.stem for p in paths.MODULE_UTILS_DIR.glob("*.py") if p.stem != "__init__"),
}


def layer_of(module: str) -> str | None:
    """The layer of a runner module (`status`) or module_util (`rgt_gate`); None when the table has no such name."""
    return next((layer for layer in ORDER if module in LAYERS[layer]), None)


def may_import(importer: str, imported: str) -> bool:
    """Does the layer rule let `importer` import `imported` (both in the table: same layer, or a lower one)?"""
    return ORDER.index(layer_of(importer)) <= ORDER.index(layer_of(imported))
