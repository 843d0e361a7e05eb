"""Where `rgt-run lifecycle` run again resumes (rgt.lifecycle.resume_point), from the status of the job's runs: a
finished run goes straight to pull, a live one to watch, anything else trains again."""

import pytest

from rgt.lifecycle import resume_point


@pytest.mark.parametrize("states, expected", [
    (["finished"], "pull"),
    (["finished", "finished", "finished"], "pull"),              # a sweep whose every cell finished
    (["running"], "watch"),
    (["finished", "queued", "stalled"], "watch"),                # nothing to launch: wait for the live cells
    (["preempted"], "train"),                                    # train resumes it from its checkpoint
    (["finished", "not_started"], "train"),                      # a cell never started: its launch again
    (["dead"], "train"), (["failed"], "train"), (["unreachable"], "train"), (["error"], "train"),
    ([], "train"),                                               # nothing seen
])
def test_resume_point_follows_the_runs_states(states, expected):
    assert resume_point([{"run_id": f"r{i}", "state": s} for i, s in enumerate(states)]) == expected


def test_a_finished_run_that_needs_attention_goes_to_watch_which_reports_it():
    runs = [{"run_id": "a", "state": "finished", "attention": [{"id": "fast_finish"}]}]
    assert resume_point(runs) == "watch"
    assert resume_point([{"run_id": "a", "state": "failed", "attention": [{"id": "x"}]}]) == "train"
