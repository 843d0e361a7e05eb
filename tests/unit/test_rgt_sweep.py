"""A sweep's cells (module_util rgt_sweep): stable, path-safe run ids, each cell's args and env, and a
deterministic placement over hosts."""

import pytest

from ansible_collections.rgt.remote_gpu.plugins.module_utils import rgt_runlayout, rgt_sweep


def job(**sweep):
    return {"name": "abl", "command": "python train.py", "sweep": sweep}


def test_every_combination_is_a_cell_named_by_its_params_in_the_order_written():
    cells = rgt_sweep.cells(job(matrix={"lr": ["1e-3", 3e-4], "seed": [0, 1, 2]}))
    assert [c["id"] for c in cells] == [
        "abl--lr=1e-3--seed=0", "abl--lr=1e-3--seed=1", "abl--lr=1e-3--seed=2",
        "abl--lr=0.0003--seed=0", "abl--lr=0.0003--seed=1", "abl--lr=0.0003--seed=2"]
    assert cells[4]["params"] == {"lr": "0.0003", "seed": "1"}
    assert all(rgt_runlayout.check_name(c["id"], "run id") is None for c in cells)
    # the same spec gives the same cells (ids are stable across re-runs)
    assert rgt_sweep.cells(job(matrix={"lr": ["1e-3", 3e-4], "seed": [0, 1, 2]})) == cells


def test_explicit_cells_come_after_the_matrix_with_their_own_args_and_env():
    cells = rgt_sweep.cells(job(matrix={"seed": [0]}, args="--seed {seed}", env={"SEED": "{seed}"},
                                cells=[{"params": {"seed": 7, "opt": "adamw", "fp16": True},
                                        "args": "--opt {opt}", "env": {"OPT": "{opt}"}}]))
    assert [c["id"] for c in cells] == ["abl--seed=0", "abl--seed=7--fp16=true--opt=adamw"]
    assert cells[1]["args"] == "--seed 7 --opt adamw"
    assert cells[1]["env"] == {"SEED": "7", "OPT": "adamw"}
    assert rgt_sweep.cell_command("python train.py ", cells[1]) == "python train.py --seed 7 --opt adamw"
    assert rgt_sweep.cell_command("python train.py", {"args": ""}) == "python train.py"


def test_a_literal_brace_in_the_args_stays_and_values_are_shell_quoted():
    (cell,) = rgt_sweep.cells(job(matrix={"v": ["a.b"]}, args="--cfg '{{\"v\": 1}}' --v {v}"))
    assert cell["args"] == "--cfg '{\"v\": 1}' --v a.b"


@pytest.mark.parametrize("value", ["a b", "x--y", "x-", "a/b", "..?", "", None, [1]])
def test_a_value_that_cannot_be_part_of_a_run_id_is_refused_naming_it(value):
    with pytest.raises(rgt_sweep.SweepError) as err:
        rgt_sweep.cells(job(matrix={"lr": ["1e-3", value]}))
    assert err.value.field == "rgt_job.sweep.matrix.lr[1]" and err.value.fix


@pytest.mark.parametrize("sweep, field", [
    ({"matrix": {"1lr": [1]}}, "rgt_job.sweep.matrix"),
    ({"matrix": {"lr": []}}, "rgt_job.sweep.matrix.lr"),
    ({"matrix": {"seed": [0]}, "cells": [{"params": {"seed": 0}}]}, "rgt_job.sweep.cells[0]"),
    ({"cells": [{"params": {}}]}, "rgt_job.sweep.cells[0].params"),
    ({"matrix": {"seed": [0]}, "args": "--lr {lr}"}, "rgt_job.sweep.args"),
    ({"matrix": {"seed": [0]}, "args": "--s {seed!r}"}, "rgt_job.sweep.args"),
    ({"matrix": {"seed": [0]}, "args": "--s {seed"}, "rgt_job.sweep.args"),
    ({"matrix": {"seed": [0]}, "env": {"1BAD": "x"}}, "rgt_job.sweep.env.1BAD"),
    ({"matrix": {"seed": ["x" * 130]}}, "rgt_job.sweep.matrix"),
])
def test_a_sweep_the_rules_refuse_names_its_field(sweep, field):
    with pytest.raises(rgt_sweep.SweepError) as err:
        rgt_sweep.cells(job(**sweep))
    assert err.value.field == field, str(err.value)


def test_no_sweep_no_cells():
    assert rgt_sweep.cells({"name": "x"}) == [] and rgt_sweep.cells(job()) == []


def test_cells_are_placed_evenly_by_what_each_host_runs_at_once_and_deterministically():
    ids = ["c%d" % i for i in range(7)]
    assert rgt_sweep.place(ids, ["a", "b"]) == {"a": ["c0", "c2", "c4", "c6"], "b": ["c1", "c3", "c5"]}
    # b runs 2 cells at once: it takes twice the share
    placed = rgt_sweep.place(ids, ["a", "b"], {"b": 2})
    assert {h: len(v) for h, v in placed.items()} == {"a": 3, "b": 4}
    assert rgt_sweep.place(ids, ["a", "b"], {"b": 2}) == placed


def test_the_roster_lists_exactly_the_cells_expected_per_host():
    cells = rgt_sweep.cells(job(matrix={"seed": [0, 1, 2]}))
    placement = rgt_sweep.place([c["id"] for c in cells], ["a", "b"])
    roster = rgt_sweep.roster("abl", cells, placement, created_at=1.0)
    assert roster["schema"] == "rgt/roster/v1" and roster["hosts"] == placement
    assert sorted(c["id"] for c in roster["cells"]) == sorted(c["id"] for c in cells)
    assert {c["id"]: c["host"] for c in roster["cells"]}["abl--seed=1"] == "b"


def test_a_sweep_past_the_cap_is_refused_before_any_cell_is_built():
    # 256^16 combinations: counted, never built (this returns at once)
    with pytest.raises(rgt_sweep.SweepError) as err:
        rgt_sweep.cells(job(matrix={"k%d" % i: list(range(256)) for i in range(16)}))
    assert err.value.field == "rgt_job.sweep" and "cap of %d" % rgt_sweep.MAX_CELLS in str(err.value)
    with pytest.raises(rgt_sweep.SweepError) as err:  # the listed cells count too
        rgt_sweep.cells(job(matrix={"seed": list(range(rgt_sweep.MAX_CELLS))}, cells=[{"params": {"seed": -1}}]))
    assert "%d cells" % (rgt_sweep.MAX_CELLS + 1) in str(err.value) and "1 listed" in str(err.value)
    # exactly at the cap is fine
    assert len(rgt_sweep.cells(job(matrix={"a": list(range(10)), "b": list(range(100))}))) == rgt_sweep.MAX_CELLS
