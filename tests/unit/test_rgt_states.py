"""The run-state vocabulary (plugins/module_utils/rgt_states.py) is one consistent home, and what restates it is held
to it: the job schema's notify `on` enum, the generated tables of docs/internals.md "Run states", and the state
lists of docs/internals.md, docs/job-spec.md "How a run ends", docs/report.md, docs/cli.md and README.md.

`python tests/unit/test_rgt_states.py` writes the generated tables into docs/internals.md."""

from __future__ import annotations

import json
import re
from pathlib import Path

from rgt import inventory, paths

REPO = Path(__file__).resolve().parents[2]
INTERNALS = REPO / "docs" / "internals.md"
BEGIN = "<!-- rgt_states: generated, do not edit by hand -->"
END = "<!-- rgt_states: end -->"


S = paths.module_util("rgt_states")
# rich's standard colour names rgt-run status uses (a typo would print the markup itself)
RICH_COLOURS = {"green", "yellow", "red", "cyan", "magenta", "dim", "white", "blue"}


def words(text: str) -> list[str]:
    return re.findall(r"`([a-z_]+)`", text)


# ---------------------------------------------------------------- the generated tables

def _cell(text) -> str:
    return str(text).replace("|", "/")


def _table(head: tuple, rows) -> list[str]:
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    out += ["| " + " | ".join(_cell(c) for c in row) + " |" for row in rows]
    return out


def _members(members) -> str:
    return ", ".join(f"`{m}`" for m in members)


def render() -> str:
    """The tables docs/internals.md "Run states" holds between BEGIN and END, from rgt_states alone."""
    groups_of = {s: [g for g, members, _ in S.GROUPS if s in members] for s in S.STATES}
    lines = ["Run states (a status document's `state`; `box`: the box or the cluster reports it, `runner`: the "
             "runner's own word for a host it got no document from):", ""]
    lines += _table(("state", "from", "means", "reported by", "groups", "status colour", "cell", "gate"), (
        (f"`{s.name}`", "box" if s.name in S.BOX_STATES else "runner", s.means, s.by,
         _members(groups_of[s.name]) or "-", s.style, f"`{s.cell}`", f"`{s.gate}`") for s in S.RUN_STATES))
    lines += ["", "Groups of run states (the rule each one is, and who uses it):", ""]
    lines += _table(("group", "states", "means"), ((f"*{g}*", _members(m), means) for g, m, means in S.GROUPS))
    lines += ["", "End reasons (an attempt's `reason`: exit.json and attempts.jsonl; `never`: last_state's word for "
              "a run that never started):", ""]
    lines += _table(("reason", "means", "written by", "status shows"), (
        (f"`{r.name}`", r.means, r.by, f"`{r.shown}`") for r in S.END_REASONS_TABLE))
    lines += ["", "Groups of end reasons:", ""]
    lines += _table(("group", "reasons", "means"), ((f"*{g}*", _members(m), means)
                                                     for g, m, means in S.REASON_GROUPS))
    lines += ["", "Gate states (a run as the teardown gate judges it, `rgt_gate.judge_run`; `blocks`: always, "
              "unless_pulled, or exported: only with a sealed export or a manifest no verified pull matches):", ""]
    lines += _table(("gate state", "means", "said by", "blocks"), (
        (f"`{g.name}`", g.means, g.by, g.blocks) for g in S.GATE_STATES_TABLE))
    lines += ["", "Cell states (a sweep cell in its sweep's tally, `rgt.sweeps.tally`, in the tally line's order; "
              "*named*: the tally line names the cells and is red; *bad*: the sweep page marks the row):", ""]
    lines += _table(("cell state", "means", "named", "bad"), (
        (f"`{c.name}`", c.means, "yes" if c.named else "-", "yes" if c.bad else "-") for c in S.CELL_STATES_TABLE))
    return "\n".join(lines)


def generated_block(text: str) -> str:
    assert text.count(BEGIN) == 1 and text.count(END) == 1, "docs/internals.md: one generated rgt_states block"
    return text.split(BEGIN, 1)[1].split(END, 1)[0].strip("\n")


def write_tables() -> None:
    text = INTERNALS.read_text()
    before, rest = text.split(BEGIN, 1)
    after = rest.split(END, 1)[1]
    INTERNALS.write_text(f"{before}{BEGIN}\n{render()}\n{END}{after}")


# ---------------------------------------------------------------- the vocabulary is consistent

def test_every_state_has_its_meaning_reporter_style_and_views():
    assert len(set(S.STATES)) == len(S.STATES)
    assert set(S.BOX_STATES) | set(S.RUNNER_STATES) == set(S.STATES)
    assert not set(S.BOX_STATES) & set(S.RUNNER_STATES)
    for state in S.RUN_STATES:
        assert state.means.strip() and state.by.strip(), state.name
        assert state.style in RICH_COLOURS, state.name
        assert state.notify_color, state.name
        assert S.style(state.name) == state.style
    assert S.style("a_newer_boxes_word") == S.STYLE_OTHER


def test_the_cell_and_gate_maps_are_total_over_the_states():
    assert set(S.CELL_VIEW) == set(S.STATES) and set(S.GATE_VIEW) == set(S.STATES)
    assert set(S.CELL_VIEW.values()) <= set(S.CELL_STATES)
    assert set(S.GATE_VIEW.values()) <= set(S.GATE_STATES)
    assert S.cell_state("stalled") == "running" and S.cell_state("dead") == "preempted"
    assert S.cell_state("not_started") == "missing"
    assert {S.cell_state(s) for s in ("timeout", "oom", "error")} == {"failed"}
    assert S.gate_state("queued") == "live" and S.gate_state("oom") == "failed"


def test_every_group_member_is_a_word_of_its_vocabulary():
    for name, members, means in S.GROUPS:
        assert members and means.strip(), name
        assert set(members) <= set(S.STATES), name
    for name, members, means in S.REASON_GROUPS:
        assert members and means.strip(), name
        assert set(members) <= set(S.REASON), name
    assert set(S.SHOWN.values()) <= set(S.STATES)
    assert set(S.LAST_STATES) == set(S.REASON)
    assert set(S.NOTIFY_EVENTS) - set(S.STATES) == {S.ATTENTION, S.BUDGET, S.IDLE_METER, S.MOVED, S.FENCED}
    assert set(S.DEFAULT_ON) <= set(S.NOTIFY_EVENTS)
    assert set(S.NOTIFY_COLORS) == set(S.STATES) | {S.ATTENTION, S.BUDGET, S.IDLE_METER, S.MOVED, S.FENCED}
    assert set(S.CELL_NAMED) <= set(S.CELL_BAD) <= set(S.CELL_STATES)
    for gate in S.GATE_STATES_TABLE:
        assert gate.means.strip() and gate.by.strip() and gate.blocks in ("always", "unless_pulled", "exported")
    for cell in S.CELL_STATES_TABLE:
        assert cell.means.strip(), cell.name


def test_the_groups_agree_with_each_other():
    assert not set(S.TERMINAL) & set(S.LIVE)
    assert set(S.FAILED) <= set(S.TERMINAL) | {"preempted"}
    assert "finished" in S.TERMINAL and "finished" not in S.FAILED
    assert set(S.ACTIVE) <= set(S.LIVE)
    assert set(S.SETTLED) <= set(S.TERMINAL)
    assert "unreachable" not in S.TERMINAL and "unreachable" not in S.FAILED and not S.is_live("unreachable")
    assert S.is_terminal("oom") and S.is_failed("timeout") and S.is_live("queued")
    assert not S.from_the_box("unreachable") and not S.from_the_box(None) and S.from_the_box("dead")
    assert S.shown("never") == "not_started" and S.shown("killed") == "failed" and S.shown("dead") == "dead"


# ---------------------------------------------------------------- the schema and the docs are held to it

def test_the_job_schema_takes_its_notify_words_from_the_vocabulary():
    raw = json.loads((REPO / "runner" / "rgt" / "schemas" / "job.schema.json").read_text())
    node = raw
    for key in inventory.NOTIFY_ON_WORD:
        node = node[key]
    assert "enum" not in node, "the notify `on` words have one home: rgt_states.NOTIFY_EVENTS"
    loaded = inventory.load_schema("job.schema.json")
    for key in inventory.NOTIFY_ON_WORD:
        loaded = loaded[key]
    assert loaded["enum"] == list(S.NOTIFY_EVENTS)
    validator = inventory._validator("job.schema.json")
    for word in S.NOTIFY_EVENTS:
        assert not list(validator.iter_errors({"notify": [{"command": "true", "on": [word]}]})), word
    assert list(validator.iter_errors({"notify": [{"command": "true", "on": ["budget_stoped"]}]}))


def test_the_run_states_tables_of_internals_md_are_generated_from_the_vocabulary():
    assert generated_block(INTERNALS.read_text()) == render(), (
        "docs/internals.md \"Run states\" is out of step with rgt_states: run `python tests/unit/test_rgt_states.py`")


def test_the_status_document_and_the_sweep_tally_of_internals_md_name_the_vocabulary():
    text = INTERNALS.read_text()
    listed = re.search(r'"state" \(a state from the box, `box` in "Run states" below: (.+?)\),', " ".join(text.split()))
    assert listed and set(words(listed.group(1))) <= set(S.BOX_STATES)
    tally = re.search(r"counting the cell states ([a-z_, ]+?) \(", " ".join(text.split()))
    assert tally and re.split(r", | and ", tally.group(1)) == list(S.CELL_STATES)


def _section(path: Path, heading: str) -> str:
    text = path.read_text()
    start = text.index(heading)
    nxt = text.find("\n## ", start + len(heading))
    return text[start:nxt if nxt > 0 else len(text)]


def test_how_a_run_ends_in_job_spec_md_is_the_vocabulary():
    section = _section(REPO / "docs" / "job-spec.md", "## How a run ends")
    rows = re.findall(r"^\| `([a-z_]+)` \| .* \| `([a-z_]+)`[^|]*\|$", section, re.M)
    assert sorted(r for r, _ in rows) == sorted(S.EXIT_REASONS)
    assert all(S.shown(reason) == shown for reason, shown in rows), rows
    assert re.search(r"no exit record .* is `dead`", section)
    starts = re.search(r"^- never launched, (.+?): `rgt-run train` starts it", section, re.M)
    assert starts and set(words(starts.group(1))) == set(S.RESUMED_ENDS)
    retried = re.search(r"^- (.+?) \(status: `failed`\): only `rgt-run retry ", section, re.M)
    assert retried and set(words(retried.group(1))) == set(S.FAILED_ENDS)


def test_the_report_and_notify_lists_of_report_md_are_the_vocabulary():
    text = (REPO / "docs" / "report.md").read_text()
    lost = re.search(r"^\| recomputed steps \| for an attempt that ended ([a-z_, ]+?) and was followed", text, re.M)
    assert lost and set(re.split(r", | or ", lost.group(1))) == set(S.LOST_REASONS)
    after = re.search(r"^\| cost after the end \| .*? the end of a ([a-z_/]+) last attempt", text, re.M)
    assert after and set(after.group(1).split("/")) == set(S.BILLED_AFTER_END)
    default = re.search(r"Default:\s+`\[([a-z_, ]+)\]`", text)
    assert default and tuple(default.group(1).split(", ")) == S.DEFAULT_ON
    assert "group *notify*" in text


def test_the_state_lists_of_cli_md_and_readme_are_states():
    cli = (REPO / "docs" / "cli.md").read_text()
    assert "group *failed*" in cli and '"Run states"' in cli
    row = re.search(r"^\| monitor \| one round trip per host: ([a-z_ /]+),", (REPO / "README.md").read_text(), re.M)
    assert row and set(row.group(1).split(" / ")) <= set(S.STATES)


if __name__ == "__main__":
    write_tables()
    print(f"wrote the rgt_states tables into {INTERNALS.relative_to(REPO)}")
