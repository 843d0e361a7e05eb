"""How a play's task failures become rgt-run's exit code: a module's rc_hint says whether the failure was a gate
(3) or bad input (2); a plain failure is 1. Driven through the event sink the runner hands ansible-runner."""

import io

from rich.console import Console

from rgt.events import EventSink
from rgt.phases import PhaseResult


def outcome_of(tmp_path, *failures: dict) -> int:
    sink = EventSink(Console(file=io.StringIO()), tmp_path / "events.jsonl", quiet=True)
    for i, res in enumerate(failures):
        sink({"event": "runner_on_failed", "created": "2026-12-01T00:00:00",
              "event_data": {"host": f"h{i}", "task": "t", "res": res}})
    return PhaseResult(playbook="p.yml", ident="x", rc=2, status="failed", hosts=sink.hosts).exit_code


def test_a_module_refusing_its_input_is_exit_2(tmp_path):
    assert outcome_of(tmp_path, {"msg": "detach.primitive: sbatch is not built yet", "rc_hint": 2}) == 2


def test_a_gate_outranks_bad_input_and_bad_input_outranks_a_plain_failure(tmp_path):
    assert outcome_of(tmp_path, {"msg": "a", "rc_hint": 2}, {"msg": "b", "rc_hint": 3}) == 3
    assert outcome_of(tmp_path, {"msg": "a", "rc_hint": 2}, {"msg": "b"}) == 2
    assert outcome_of(tmp_path, {"msg": "b"}) == 1
