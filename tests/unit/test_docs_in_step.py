"""Prose that restates a fact of the code is held to it: every rgt_job field of the schema is documented in
docs/job-spec.md, every subcommand has its row in docs/cli.md, and no doc calls a built detach primitive or meter-stop
verb "not built" (nor mentions one that is not built without saying so) against the registry
(plugins/module_utils/rgt_registry.py)."""

from __future__ import annotations

import io
import json
import re
import tokenize
from pathlib import Path

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
