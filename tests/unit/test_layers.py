"""The runner is layered (rgt.layers: cli -> commands -> engines -> core -> module_utils) and its imports say so:
read from the source with `ast`, every module of runner/rgt/ is in one layer, imports only its own layer or lower
ones, no import cycle runs through the modules, nothing imports the CLI, and an import inside a function is one of
a short list, each kept there for a measured start-up cost or an optional dependency."""

from __future__ import annotations

import ast
import tomllib
from dataclasses import dataclass
from pathlib import Path

from rgt import layers

REPO = Path(__file__).resolve().parents[2]
RUNNER = REPO / "runner" / "rgt"
MODULE_UTILS = REPO / "plugins" / "module_utils"
MODULE_UTILS_PACKAGE = "ansible_collections.rgt.remote_gpu.plugins.module_utils"

# Imports inside a function: (module, what it imports there) -> why it is not at the module's top. The figures are
# the imports' CPU cost in a process that already holds what `rgt-run status --help` imports (python -c, bytecode
# cached as an installed tool has it, median of 9).
WHY_INSIDE = {
    ("phases", ("ansible_runner",)): "15 ms of every start; only a play needs it (status over the SSH round, logs, "
                                     "runs, profiles and --help run none)",
    ("runreport", ("matplotlib", "matplotlib.pyplot")): "0.37 s with pyplot; only a report's plots need it",
    ("runreport", ("jinja2",)): "30 ms; status imports runreport (through notify) and makes no page",
    ("confirmation", ("jinja2", "jinja2.nodes")): "20 ms; only when the roles changed (the derived names are "
                                                  "cached on disk)",
    ("k8s", ("kubernetes_validate",)): "an optional dependency (the k8s extra): its absence is named where "
                                       "manifests are validated",
    ("cli", ("argcomplete",)): "3 ms; only a shell completing needs it",
    ("cli", ("importlib",)): "30 ms (importlib.metadata); only --version reads the distribution's metadata",
    ("cli", ("tomllib",)): "2 ms; only --version in a checkout that was never installed reads pyproject.toml",
    ("inventory", ("jsonschema", "referencing")): "40-70 ms; only a document that has not passed the same "
                                                  "validation before is validated (rgt.ledger.pass_key)",
    **{(module, ("yaml",)): "11 ms; a status whose inventory, profile and validation are cached reads no YAML "
                             "(rgt.inventory, rgt.profiles, rgt.ledger.pass_key)"
       for module in ("cli", "confirmation", "init", "k8s", "k8s_engine", "prepare")},
    ("notify", ("urllib.request", "urllib.error", "http.client")): "9 ms with ssl; only a webhook's post needs them",
}
FUNCTION_LEVEL = {(module, name): why for (module, names), why in WHY_INSIDE.items() for name in names}


@dataclass(frozen=True)
class Import:
    module: str  # the importing runner module (`status`)
    target: str  # what it imports: a runner module (`rgt.observe` -> `observe`), a module_util, or a library
    line: int
    in_function: bool
    kind: str  # "runner", "module_util" or "library"


def _targets(node: ast.Import | ast.ImportFrom) -> list[tuple[str, str]]:
    """(kind, name) of each thing one import statement brings in."""
    if isinstance(node, ast.Import):
        names = [alias.name for alias in node.names]
    elif node.module in ("rgt", MODULE_UTILS_PACKAGE):  # `from rgt import status`: the modules are the names
        names = [f"{node.module}.{alias.name}" for alias in node.names]
    else:
        names = [node.module or ""]
    out = []
    for name in names:
        if name == "rgt" or name.startswith("rgt."):  # a subpackage's module keeps its package: `engines.ssh`
            out.append(("runner", name.split(".", 1)[1] if "." in name else "rgt"))
        elif name.startswith(MODULE_UTILS_PACKAGE + "."):
            out.append(("module_util", name[len(MODULE_UTILS_PACKAGE) + 1:].split(".")[0]))
        else:
            out.append(("library", name))
    return out


def imports_of(path: Path) -> list[Import]:
    """Every import statement of a module, at its top or inside a function (at any depth)."""
    module = module_name(path)
    found: list[Import] = []

    def visit(node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                assert not getattr(child, "level", 0), f"{module}.py:{child.lineno}: a relative import; name rgt.X"
                found.extend(Import(module, target, child.lineno, in_function, kind)
                             for kind, target in _targets(child))
            visit(child, in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)))

    visit(ast.parse(path.read_text(), str(path)), False)
    return found


def module_name(path: Path) -> str:
    """A runner module's name in rgt.layers: `status`, `engines.ssh`; a subpackage's __init__.py is `engines`."""
    parts = path.relative_to(RUNNER).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def runner_files() -> list[Path]:
    return sorted(p for p in RUNNER.rglob("*.py") if p != RUNNER / "__init__.py")


def runner_modules() -> list[str]:
    return sorted(module_name(p) for p in runner_files())


def graph() -> list[Import]:
    return [imp for path in runner_files() for imp in imports_of(path)]


def find_cycle(edges: dict[str, set[str]]) -> list[str] | None:
    """One import cycle (a -> b -> ... -> a) of the graph, or None."""
    state: dict[str, str] = {}
    stack: list[str] = []

    def walk(node: str) -> list[str] | None:
        state[node] = "open"
        stack.append(node)
        for nxt in sorted(edges.get(node, ())):
            if state.get(nxt) == "open":
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state:
                cycle = walk(nxt)
                if cycle:
                    return cycle
        stack.pop()
        state[node] = "done"
        return None

    for node in sorted(edges):
        if node not in state:
            cycle = walk(node)
            if cycle:
                return cycle
    return None


def test_every_runner_module_and_module_util_is_in_exactly_one_layer():
    assert tuple(layers.LAYERS) == layers.ORDER
    placed = [name for layer in layers.ORDER for name in layers.LAYERS[layer]]
    twice = sorted({name for name in placed if placed.count(name) > 1})
    assert not twice, f"in two layers: {twice}"
    runner = set(runner_modules())
    listed = set(placed) - set(layers.LAYERS["module_utils"])
    assert listed == runner, (f"runner/rgt/ modules in no layer of rgt.layers: {sorted(runner - listed)}; "
                              f"names in the table that are no module: {sorted(listed - runner)}")
    assert set(layers.LAYERS["module_utils"]) == {p.stem for p in MODULE_UTILS.glob("*.py") if p.stem != "__init__"}


def test_there_is_no_import_cycle_among_the_runners_modules():
    edges: dict[str, set[str]] = {}
    for imp in graph():
        if imp.kind == "runner" and imp.target != imp.module:
            edges.setdefault(imp.module, set()).add(imp.target)
    cycle = find_cycle(edges)
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_find_cycle_names_a_cycle_and_accepts_a_layered_graph():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"cli": {"status", "prepare"}, "status": {"prepare"}, "prepare": {"ledger"}}) is None


def test_nothing_imports_the_cli_but_the_console_script():
    importers = sorted(f"{imp.module}.py:{imp.line}" for imp in graph() if imp.kind == "runner"
                       and imp.target == "cli" and imp.module != "cli")
    assert not importers, f"rgt.cli imported by {importers}: commands import rgt.prepare / rgt.output instead"
    scripts = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts == {"rgt-run": "rgt.cli:main"}


def test_every_import_goes_to_its_own_layer_or_below():
    wrong = []
    for imp in graph():
        if imp.kind == "library":
            continue
        assert layers.layer_of(imp.target) is not None, f"{imp.module}.py:{imp.line} imports {imp.target}, in no layer"
        if not layers.may_import(imp.module, imp.target):
            wrong.append(f"{imp.module}.py:{imp.line} ({layers.layer_of(imp.module)}) imports {imp.target} "
                         f"({layers.layer_of(imp.target)})")
    assert not wrong, "imports from a lower layer into a higher one:\n" + "\n".join(wrong)


def test_the_layer_rule_reads_top_down():
    assert layers.may_import("cli", "status") and layers.may_import("status", "observe")
    assert layers.may_import("observe", "ledger") and layers.may_import("ledger", "rgt_runlayout")
    assert layers.may_import("status", "runreport")  # the same layer
    assert not layers.may_import("ledger", "status") and not layers.may_import("k8s_run", "teardown")
    assert layers.may_import("pull", "engines") and not layers.may_import("engines.ssh", "pull")
    assert not layers.may_import("prepare", "cli")


def test_the_module_utils_import_nothing_of_the_runner():
    found = [f"{p.name}: {node.lineno}" for p in sorted(MODULE_UTILS.glob("*.py"))
             for node in ast.walk(ast.parse(p.read_text())) if isinstance(node, (ast.Import, ast.ImportFrom))
             and any(kind == "runner" for kind, _name in _targets(node))]
    assert not found, f"box-side code importing the runner: {found}"


def test_imports_inside_functions_are_only_the_listed_ones():
    inside = {(imp.module, imp.target): imp for imp in graph() if imp.in_function}
    runner = sorted(f"{m}.py:{imp.line} imports rgt.{t}" for (m, t), imp in inside.items() if imp.kind != "library")
    assert not runner, "the runner's own modules are imported at the top of a module, never inside a function " \
                       "(an import cycle is broken by moving code, not hidden): " + "; ".join(runner)
    unlisted = sorted(f"{m}.py:{imp.line} imports {t}" for (m, t), imp in inside.items() if (m, t) not in
                      FUNCTION_LEVEL)
    assert not unlisted, ("an import inside a function needs a measured reason in FUNCTION_LEVEL (else it goes "
                          "to the module's top): " + "; ".join(unlisted))
    stale = sorted(f"{m}: {t}" for (m, t) in FUNCTION_LEVEL if (m, t) not in inside)
    assert not stale, f"FUNCTION_LEVEL lists imports that are no longer inside a function: {stale}"
