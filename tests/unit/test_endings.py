"""What status and watch say about a run that ended by a signal, and the command they name next (runner/rgt/endings.py:
docs/job-spec.md "How a run ends")."""

from __future__ import annotations

import argparse
import io

from rich.console import Console

from rgt import endings


def run(state="preempted", auto_resume=False, **exit_doc):
    return {"run_id": "exp1", "state": state, "attempt": 2, "auto_resume": auto_resume,
            "evidence": {"exit": {"attempt": 2, "reason": state, "rc": None, "signal": None, "stop_signal": None,
                                  **exit_doc}}}


class Host:
    def __init__(self, name="box", recalled=None):
        self.name, self.recalled = name, recalled


ARGS = argparse.Namespace(inventory="inv", extra_vars=["@job.yml"])


def test_a_stop_of_the_job_alone_is_named_and_train_resumes_it():
    what, command = endings.next_step(run(rc=143, signal=15), ARGS, Host())
    assert what == ("attempt 2 preempted: the job ended by SIGTERM (rc 143): only the job's own processes got the "
                    "stop signal")
    assert command == "`rgt-run train -i inv -e @job.yml` resumes it from its newest checkpoint"


def test_with_auto_resume_status_names_watch_and_watch_itself_names_train():
    doc = run(auto_resume=True, rc=0, stop_signal="SIGTERM")
    what, command = endings.next_step(doc, ARGS, Host())
    assert "the wrapper got SIGTERM" in what and command.startswith("rgt-run watch -i inv resumes it")
    _what, command = endings.next_step(doc, ARGS, Host(), watching=True)
    assert command.startswith("`rgt-run train -i inv -e @job.yml`")


def test_the_preempt_file_is_named_when_no_signal_was():
    what, _command = endings.next_step(run(rc=0), ARGS, Host())
    assert "RGT_PREEMPT_FILE appeared" in what


def test_a_killed_run_names_its_signal_and_retry():
    what, command = endings.next_step(run("failed", reason="killed", rc=137, signal=9), ARGS, Host())
    assert what == "attempt 2 failed: the job was killed by SIGKILL (rc 137: the OOM killer or `kill -9`)"
    assert "rgt-run logs -i inv --run exp1" in command and "rgt-run retry -i inv exp1" in command


def test_runs_that_ended_without_a_signal_get_no_line():
    assert endings.next_step(run("failed", reason="failed", rc=3), ARGS, Host()) is None
    assert endings.next_step(run("finished", reason="finished", rc=0), ARGS, Host()) is None
    assert endings.next_step({"state": "running", "evidence": {"exit": None}}, ARGS, Host()) is None


def test_the_train_command_carries_the_job_spec_the_way_the_user_gave_it():
    bare = argparse.Namespace(inventory="my inv", extra_vars=None)
    remembered = endings.next_step(run(rc=143, signal=15), bare, Host(recalled={"job": {}}))[1]
    assert "rgt-run train -i 'my inv' -e @job.yml`" in remembered  # train needs the job spec again
    inventory_job = endings.next_step(run(rc=143, signal=15), bare, Host())[1]
    assert "rgt-run train -i 'my inv'`" in inventory_job


def test_annotate_prints_a_line_per_run_and_puts_the_command_in_its_document():
    out = io.StringIO()
    docs = {"box": {**run(rc=143, signal=15), "other_runs": [run("failed", reason="killed", rc=139, signal=11),
                                                           run("finished", reason="finished", rc=0)]}}
    endings.annotate(docs, [Host()], ARGS, Console(file=out, width=400, color_system=None))
    lines = out.getvalue().splitlines()
    assert len(lines) == 2 and lines[0].startswith("  box:exp1: attempt 2 preempted") and "SIGSEGV" in lines[1]
    assert docs["box"]["next"].startswith("`rgt-run train") and "retry" in docs["box"]["other_runs"][0]["next"]
    assert "next" not in docs["box"]["other_runs"][1]
