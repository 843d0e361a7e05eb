"""The one channel from the box to the runner: each role publishes its report as one named fact
(runner.events.REPORT_FACTS) and the runner reads exactly those from the events, nothing else."""

import io
from pathlib import Path

import yaml
from rich.console import Console

from rgt.events import REPORT_FACTS, EventSink

ROLES = Path(__file__).resolve().parents[2] / "roles"


def _published(tasks: list, out: set) -> None:
    for task in tasks or []:
        if not isinstance(task, dict):
            continue
        for block in ("block", "rescue", "always"):
            _published(task.get(block), out)
        facts = task.get("ansible.builtin.set_fact") or task.get("set_fact")
        if isinstance(facts, dict):
            out.update(k for k in facts if k.endswith("_report") and not k.startswith("_"))


def published_reports() -> dict[str, set]:
    found: dict[str, set] = {}
    for path in sorted(ROLES.glob("*/tasks/*.yml")):
        names: set = set()
        _published(yaml.safe_load(path.read_text()), names)
        for name in names:
            found.setdefault(name, set()).add(path.parent.parent.name)
    return found


def test_every_published_report_is_read_and_every_read_report_is_published():
    published = published_reports()
    assert set(published) == set(REPORT_FACTS), (
        "a role publishes a report the runner does not read, or the runner waits for one no role sets: "
        f"roles {sorted(published)} vs REPORT_FACTS {sorted(REPORT_FACTS)}")
    # each report has one publisher, and its name starts with that role's name
    for name, roles in published.items():
        assert len(roles) == 1 and name.startswith(next(iter(roles))), (name, roles)


def _ok(facts: dict, **res) -> dict:
    return {"event": "runner_on_ok",
            "event_data": {"host": "box1", "task": "t", "res": {"ansible_facts": facts, **res}}}


def test_the_sink_keeps_the_named_reports_and_nothing_else(tmp_path):
    sink = EventSink(Console(file=io.StringIO()), tmp_path / "events.jsonl", quiet=True)
    sink(_ok({"probe_report": {"verdict": "ok"}, "my_own_report": {"x": 1}, "__upload_resume_report": {"y": 2},
              "env_check_report": "not a dict"}, rgt_keep={"collect_report": {"verified": True}}))
    sink(_ok({"probe_report": {"verdict": "warn"}}))
    assert sink.hosts["box1"].results == {"probe_report": {"verdict": "warn"}}
