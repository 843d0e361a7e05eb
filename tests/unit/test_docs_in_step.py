"""Prose that restates a fact of the code is held to it: every rgt_job field of the schema is documented in
docs/job-spec.md, every subcommand has its row in docs/cli.md, docs/internals.md's map of the modules lists every
module once, and no doc calls a built detach primitive or meter-stop verb "not built" (nor mentions one that is not
built without saying so) against the registry (plugins/module_utils/rgt_registry.py). Other prose that restates a
registry fact is generated from it (the blocks scripts/gen-docs writes) or held to it here (see "registry prose")."""

from __future__ import annotations

import importlib
import importlib.machinery
import importlib.util
import io
import json
import re
import subprocess
import sys
import tokenize
from pathlib import Path

import pytest

from rgt import cli, paths

REPO = Path(__file__).resolve().parents[2]
reg = paths.module_util("rgt_registry")

# what says "this is not usable yet"
NOT_BUILT = re.compile(r"\bnot\s+(?:yet\s+)?built\b|\bunbuilt\b|\bnot\s+implemented\b", re.I)
# the prose of the project: docs, READMEs, role specs and defaults, profiles' notes, docstrings and comments. Not
# the registry itself (the source of truth), the tests, nor CHANGELOG.md (history: what was true then).
PROSE_GLOBS = ("README.md", "docs/*.md", "profiles/*.md", "profiles/*.yml", "roles/*/README.md",
               "roles/*/meta/*.yml", "roles/*/defaults/*.yml", "roles/*/tasks/*.yml", "roles/*/files/*.py",
               "playbooks/*.yml", "plugins/**/*.py", "runner/rgt/*.py", "examples/**/*.md", "examples/**/*.yml")


# meter-stop verbs named by everyday words: a clause with "none" says nothing about the verb
COMMON_WORDS = ("none", "manual")


def prose_files() -> list[Path]:
    home = REPO / reg.HOME
    found = {p for pattern in PROSE_GLOBS for p in REPO.glob(pattern) if p.is_file() and p != home}
    return sorted(found)


def prose(path: Path) -> str:
    """A file's prose: all of a Markdown or YAML file; a Python file's comments and strings (docstrings, the
    modules' DOCUMENTATION, messages), each a block of its own, never its code."""
    text = path.read_text(encoding="utf-8", errors="replace")
    if path.suffix != ".py":
        return text
    strings = {tokenize.STRING, getattr(tokenize, "FSTRING_MIDDLE", tokenize.STRING)}
    blocks: list[str] = []
    last_comment = -2  # the line of the last comment: a comment on the next line goes on the same sentence
    for tok in tokenize.generate_tokens(io.StringIO(text).readline):
        if tok.type == tokenize.COMMENT:
            words = tok.string.lstrip("#").strip()
            if tok.start[0] == last_comment + 1 and blocks:
                blocks[-1] += " " + words
            else:
                blocks.append(words)
            last_comment = tok.start[0]
        elif tok.type in strings:
            blocks.append(tok.string)
    return "\n\n".join(blocks)


def clauses(text: str, markdown: bool = True) -> list[tuple[str, str]]:
    """(the nearest Markdown heading above, clause) for each clause: text split at sentence ends, ';', table cells,
    bullets and blank lines, whitespace folded. A clause keeps a ':' (`not built yet: vast-onstart`). Without
    `markdown` (YAML, Python) a '#' line is a comment, not a heading."""
    out = []
    heading = ""
    if not markdown:  # a comment's lines are one text
        text = re.sub(r"^\s*#+ ?", "", text, flags=re.M)
    for block in re.split(r"\n\s*\n|\n(?=\s*(?:[-*]|\d+\.)\s)|\n(?=#)", text):
        match = re.match(r"\s*#+\s+(.*)", block) if markdown else None
        if match:
            heading = match.group(1).splitlines()[0]
            block = block.split("\n", 1)[1] if "\n" in block else ""
        for part in re.split(r"(?<=[.!?])\s+|;|\|", block):
            part = " ".join(part.split())
            if part:
                out.append((heading, part))
    return out


def names_in(clause: str, entries) -> list:
    return [e for e in entries if e.name not in COMMON_WORDS
            and re.search(r"(?<![\w-])%s(?![\w-])" % re.escape(e.name), clause)]


def test_every_rgt_job_field_of_the_schema_has_its_row_in_job_spec_md():
    schema = json.loads((REPO / "runner" / "rgt" / "schemas" / "job.schema.json").read_text())
    doc = (REPO / "docs" / "job-spec.md").read_text()
    rows = set(re.findall(r"^\| `([a-z0-9_]+)` \|", doc, re.M))
    missing = sorted(set(schema["properties"]) - rows)
    assert missing == [], f"rgt_job fields without a row in docs/job-spec.md: {missing}"
    # and the sweep's own fields in its table
    sweep = schema["properties"]["sweep"]["properties"]
    assert sorted(set(sweep) - rows) == [], "sweep fields without a row in docs/job-spec.md"


def test_every_subcommand_has_its_row_in_cli_md():
    doc = (REPO / "docs" / "cli.md").read_text()
    rows = {m.split()[0] for m in re.findall(r"^\| `([^`]+)` \|", doc, re.M)}
    missing = [name for name in cli.commands() if name not in rows]
    assert missing == [], f"subcommands without a row in docs/cli.md's command table: {missing}"


def test_retry_has_its_section_in_cli_md():
    doc = (REPO / "docs" / "cli.md").read_text()
    assert re.search(r"^## `retry`", doc, re.M), "docs/cli.md has no `retry` section"


def test_no_doc_calls_a_built_primitive_or_verb_not_built():
    entries = [*reg.DETACH_PRIMITIVES, *reg.METER_STOPS]
    built = [e for e in entries if e.built]
    offenders = []
    for path in prose_files():
        for _heading, clause in clauses(prose(path), path.suffix == ".md"):
            if NOT_BUILT.search(clause):
                for entry in names_in(clause, built):
                    offenders.append(f"{path.relative_to(REPO)}: {entry.name} is built, but: {clause[:160]}")
    assert offenders == []


def test_every_unbuilt_primitive_a_doc_mentions_is_said_to_be_not_built():
    unbuilt = [e for e in [*reg.DETACH_PRIMITIVES, *reg.METER_STOPS] if not e.built]
    offenders = []
    for path in prose_files():
        for heading, clause in clauses(prose(path), path.suffix == ".md"):
            for entry in names_in(clause, unbuilt):
                if not NOT_BUILT.search(clause) and not NOT_BUILT.search(heading):
                    offenders.append(f"{path.relative_to(REPO)}: {entry.name} is not built, but: {clause[:160]}")
    assert offenders == []


def test_the_clause_splitter_keeps_a_list_after_a_colon_and_splits_sentences():
    """The checks above are only as good as the clauses they read."""
    text = ("Detach: built `tmux` and `sbatch`; registered, not built yet: `vast-onstart`.\n\n"
            "## Not built yet\n\n- vast-onstart relaunches on a container start\n")
    got = clauses(text)
    assert ("", "registered, not built yet: `vast-onstart`.") in got
    assert ("", "Detach: built `tmux` and `sbatch`") in got
    assert ("Not built yet", "- vast-onstart relaunches on a container start") in got


# ---------------------------------------------------------------------------------------------------- the layer map

LAYER_NAMES = ("cli", "commands", "engines", "core", "module_utils")
LAYER_FOLDERS = {"module_utils": "plugins/module_utils/"}  # every other layer: runner/rgt/


def layer_map() -> dict[str, list[str]]:
    """The map at the top of docs/internals.md as {layer: [module, ...]}, in the order written: its first fenced
    block, a line naming a layer and its folder, then its modules (continued on indented lines; a '↓' line says
    what the step down means)."""
    doc = (REPO / "docs" / "internals.md").read_text(encoding="utf-8")
    section = doc.split("## Map of the modules (layers)\n", 1)[1]
    block = section.split("```\n", 2)[1]
    found: dict[str, list[str]] = {}
    layer = None
    for line in block.splitlines()[1:]:  # the first line is the header
        words = line.split()
        if not words or words[0].startswith("↓"):
            continue
        if not line[0].isspace():
            assert words[0] in LAYER_NAMES and words[0] not in found, f"not a layer, or one written twice: {line!r}"
            layer, folder, words = words[0], words[1], words[2:]
            assert folder == LAYER_FOLDERS.get(layer, "runner/rgt/"), f"{layer}: folder {folder}"
            found[layer] = []
        assert layer is not None, f"a line of the map before any layer: {line!r}"
        found[layer].extend(words)
    return found


def modules_on_disk(folder: str) -> set[str]:
    """A folder's modules by their names in the map: a subpackage's module dotted (`engines.ssh`), its __init__.py
    the package's name (`engines`); the folder's own __init__.py is none."""
    names = set()
    for path in (REPO / folder).rglob("*.py"):
        parts = path.relative_to(REPO / folder).with_suffix("").parts
        parts = parts[:-1] if parts[-1] == "__init__" else parts
        if parts:
            names.add(".".join(parts))
    return names


def test_the_layer_map_lists_every_module_once_in_the_order_of_the_layers():
    layers = layer_map()
    assert list(layers) == list(LAYER_NAMES)
    listed = [m for modules in layers.values() for m in modules]
    assert sorted(m for m in listed if listed.count(m) > 1) == [], "a module in more than one place of the map"
    runner = {m for name, modules in layers.items() if name != "module_utils" for m in modules}
    assert sorted(modules_on_disk("runner/rgt") - runner) == [], "runner modules missing from the map"
    assert sorted(runner - modules_on_disk("runner/rgt")) == [], "the map names runner modules that do not exist"
    utils = set(layers["module_utils"])
    assert sorted(modules_on_disk("plugins/module_utils") ^ utils) == [], "module_utils and the map differ"
    for name, modules in layers.items():
        assert modules == sorted(modules), f"the {name} layer of the map is not in alphabetical order"


def test_the_layer_map_is_the_table_the_import_rule_test_reads():
    """rgt.layers.LAYERS (the import rule's table) and the map say the same; skipped until rgt.layers exists."""
    if importlib.util.find_spec("rgt.layers") is None:
        pytest.skip("rgt.layers is not here yet: the map is held to the files on disk alone")
    table = importlib.import_module("rgt.layers").LAYERS
    layers = layer_map()
    for name, modules in table.items():
        names = sorted(re.sub(r"^rgt\.|\.py$", "", str(m)) for m in modules)  # "rgt.status", "status.py": status
        assert names == sorted(layers.get(name, [])), f"layer {name}: rgt.layers and the map differ"
    assert set(layers) - {"module_utils"} <= set(table), "a layer of the map is not in rgt.layers"


# ---------------------------------------------------------------------------------------------------- registry prose
# Prose that restates a registry fact is either generated from it (the blocks `scripts/gen-docs` writes) or held to
# it below: the teardown role's table of verbs, how a sweep runs, which primitive a profile detaches with, and what
# a profile's own notes say of its verb and its fallback.

GEN_DOCS = REPO / "scripts" / "gen-docs"
DOC_PROSE = ("README.md", "docs/*.md", "roles/*/README.md", "profiles/README.md")


def gen_docs():
    loader = importlib.machinery.SourceFileLoader("gen_docs", str(GEN_DOCS))
    spec = importlib.util.spec_from_loader("gen_docs", loader)
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


def doc_clauses():
    """(path, heading, clause) of the Markdown docs."""
    for path in sorted({p for pattern in DOC_PROSE for p in REPO.glob(pattern)}):
        for heading, clause in clauses(path.read_text(encoding="utf-8")):
            yield path.relative_to(REPO), heading, clause


def test_the_generated_blocks_are_what_gen_docs_writes():
    done = subprocess.run([sys.executable, str(GEN_DOCS), "--check"], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    internals = (REPO / "docs" / "internals.md").read_text(encoding="utf-8")
    assert gen_docs().blocks(internals) == ["detach", "meter_stop"]


def test_gen_docs_rewrites_a_stale_block_from_the_registry_and_refuses_an_unknown_one():
    gen = gen_docs()
    registry = gen.registry()
    stale = "before\n<!-- registry:begin detach -->\n| `tmux` | no |\n<!-- registry:end -->\nafter\n"
    new = gen.rendered(stale, registry, "x.md")
    assert new.startswith("before\n<!-- registry:begin detach -->\n| primitive |") and new.endswith(
        "<!-- registry:end -->\nafter\n")
    for entry in registry.DETACH_PRIMITIVES:
        row = next(line for line in new.splitlines() if line.startswith("| `%s`" % entry.name))
        assert row.split(" | ")[1].startswith("yes" if entry.built else "no; use instead: ")
    assert gen.rendered(new, registry, "x.md") == new
    with pytest.raises(ValueError, match="unknown block 'verbs'"):
        gen.rendered("<!-- registry:begin verbs -->\n<!-- registry:end -->", registry, "x.md")


def test_the_teardown_roles_table_has_a_row_for_every_verb_and_names_every_api_client():
    doc = (REPO / "roles" / "teardown" / "README.md").read_text(encoding="utf-8")
    table = doc.split("## What it does then\n", 1)[1].strip().split("\n\n", 1)[0]
    firsts = [row.split("|")[1] for row in table.splitlines()[2:]]
    clients = next(cell for cell in firsts if cell.strip().startswith("API clients"))
    assert re.findall(r"`([a-z_]+)`", clients) == [e.name for e in reg.api_clients()]
    named = {name for cell in firsts for name in re.findall(r"`([a-z_]+)`", cell)}
    assert sorted(e.name for e in reg.METER_STOPS if e.name not in named) == []


def test_how_a_sweep_runs_is_said_as_the_registry_says():
    queue = {e.name for e in reg.DETACH_PRIMITIVES if e.sweeps == "queue"}
    array = [e for e in reg.DETACH_PRIMITIVES if e.sweeps == "array"]
    said = [(path, clause) for path, _heading, clause in doc_clauses() if "a sweep runs" in clause]
    assert len(said) >= 2
    for path, clause in said:
        assert {e.name for e in names_in(clause, reg.DETACH_PRIMITIVES)} == queue, f"{path}: {clause}"
        if "array" in clause:  # "a Slurm (job) array": the array primitives are Slurm's
            assert "Slurm" in clause and array and all("Slurm" in e.what for e in array), f"{path}: {clause}"
    primitive = profile_data("kubernetes")["detach"]["primitive"]  # the docs say Kubernetes refuses a sweep
    refused = [c for _p, _h, c in doc_clauses() if re.search(r"sweeps?\b.*\brefused|refused.*\bsweep", c, re.I)
               and re.search(r"kubernetes", c, re.I)]
    assert refused and not reg.runs_sweeps(primitive)


def profile_data(name: str) -> dict:
    import yaml

    return yaml.safe_load((REPO / "profiles" / f"{name}.yml").read_text(encoding="utf-8"))


def test_the_primitive_the_docs_give_a_profile_is_the_profiles():
    said = 0
    for path, _heading, clause in doc_clauses():
        profile = re.search(r"`([a-z_]+)` profile", clause)
        primitive = re.search(r"detach(?: primitive)? `([\w-]+)`", clause)
        if not (profile and primitive):
            continue
        said += 1
        detach = profile_data(profile.group(1))["detach"]
        assert detach["primitive"] == primitive.group(1), f"{path}: {clause}"
        if re.search(r"from the controller", clause):
            assert reg.detach(primitive.group(1)).runs_on == "controller", f"{path}: {clause}"
    assert said >= 3


def profile_notes(node, key=None) -> list[str]:
    """Every note of a profile (`notes` anywhere, and the gotchas' `check`), in file order."""
    if isinstance(node, dict):
        return [text for k, v in node.items() for text in profile_notes(v, k)]
    if isinstance(node, list):
        return [text for v in node for text in profile_notes(v, key)]
    return [node] if isinstance(node, str) and key in ("notes", "check") else []


NOTE_VERB = re.compile(r"\bverb (?:is )?(?:(?P<word>[a-z_]+)|\S+ \((?P<paren>[a-z_]+))")


def test_a_profiles_notes_say_its_own_verb_and_fallback():
    said = 0
    for path in sorted((REPO / "profiles").glob("*.yml")):
        data = profile_data(path.stem)
        texts = profile_notes(data)
        meter, detach = data["meter_stop"], data["detach"]
        for text in texts:
            for match in NOTE_VERB.finditer(text):
                said += 1
                word = match.group("word") or match.group("paren")
                assert word in (meter.get("verb"), reg.meter_stop_of(meter)), f"{path.name}: {text}"
            for match in re.finditer(r"`?([\w-]+)`? is the fallback", text):
                said += 1
                assert detach.get("fallback") == match.group(1), f"{path.name}: {text}"
            for match in re.finditer(r"detaches with ([\w-]+) only|\bno fallback\b", text):
                said += 1
                assert detach.get("fallback") is None, f"{path.name}: {text}"
                assert match.group(1) in (None, detach["primitive"]), f"{path.name}: {text}"
    assert said >= 6


def test_what_the_docs_say_auto_means_is_the_registrys_pair():
    said = 0
    for path, _heading, clause in doc_clauses():
        named = [e.name for e in names_in(clause, reg.DETACH_PRIMITIVES)]
        if "`auto`" in clause and named:
            said += 1
            first = {name: clause.index(name) for name in named}
            assert sorted(named, key=first.get) == list(reg.AUTO_MEANS), f"{path}: {clause}"
    assert said >= 2
