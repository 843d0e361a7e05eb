"""rgt.sweeps on the controller: the slots of a host, the sticky roster (a cell keeps its host on every later train,
a cell whose host left the play is refused), each host's share for the launch, each cell as a run for the plays
that look at runs, the tally against the roster; a host's runs in the ledger (rgt.memory.host_runs, recall); and
rgt.status.resume_key / due_runs (what watch starts again)."""

import json

import pytest

from rgt import status, sweeps
from rgt.errors import InputError
from rgt.inventory import Host

PROFILE = {"detach": {"primitive": "tmux", "fallback": "nohup"}}


def job(seeds=(0, 1, 2, 3), gpus=1, **sweep):
    spec = {"matrix": {"seed": list(seeds)}, "args": "--seed {seed}", "env": {"SEED": "{seed}"}, "gpus_per_cell": 1}
    spec.update(sweep)
    return {"name": "abl", "command": "python train.py", "python": "/usr/bin/python3", "env": {"BASE": "1"},
            "gpu": {"count": gpus}, "sweep": spec}


def host(name, job_spec=None, profile=PROFILE, **more):
    vars_ = {"rgt_project": "proj", **more}
    if job_spec is not None:
        vars_["rgt_job"] = job_spec
    return Host(name=name, vars=vars_, profile=profile)


def cells_by_host(item):
    return {c["id"]: c["host"] for c in item["roster"]["cells"]}


# ---------------------------------------------------------------- slots

@pytest.mark.parametrize("gpu, sweep, expected", [
    ({"count": 4}, {"gpus_per_cell": 2}, ["0,1", "2,3"]),
    ({"count": 4}, {}, ["0", "1", "2", "3"]),                    # gpus_per_cell defaults to 1
    ({"count": 4}, {"parallel": 2}, ["0", "1"]),                 # parallel caps the slots
    ({"count": 8}, {"gpus_per_cell": 2, "parallel": 3}, ["0,1", "2,3", "4,5"]),
    ({"count": 5}, {"gpus_per_cell": 2}, ["0,1", "2,3"]),        # a GPU too few for a cell stays idle
    ({"count": 1}, {"gpus_per_cell": 2}, ["0"]),                 # fewer GPUs than a cell asks: one slot with all
    ({"count": 0}, {"parallel": 3}, ["", "", ""]),               # CPU cells: parallel slots that see no GPU
    ({"count": 2}, {"gpus_per_cell": 0, "parallel": 2}, ["", ""]),
    (None, {}, [""]),
])
def test_slots(gpu, sweep, expected):
    spec = {"sweep": sweep} if gpu is None else {"gpu": gpu, "sweep": sweep}
    assert sweeps.slots(spec) == expected


# ---------------------------------------------------------------- placement: sticky over the ledger's roster

def test_plan_places_cells_by_the_cells_each_host_runs_at_once(tmp_path):
    (item,) = sweeps.plan([host("a", job(range(6))), host("b", job(range(6), gpus=2))], tmp_path)
    assert item["sweep"] == "abl" and item["project"] == "proj"
    assert item["slots"] == {"a": ["0"], "b": ["0", "1"]} and item["at_once"] == {"a": 1, "b": 2}
    assert {h: len(ids) for h, ids in item["roster"]["hosts"].items()} == {"a": 2, "b": 4}
    cell = next(c for c in item["roster"]["cells"] if c["id"] == "abl--seed=3")
    assert cell["command"] == "python train.py --seed 3" and cell["env"] == {"SEED": "3"}
    assert not (tmp_path / "sweeps").exists()  # plan writes nothing; record does


def test_a_recorded_roster_keeps_every_cell_on_its_host_and_only_new_cells_are_placed(tmp_path):
    (first,) = sweeps.plan([host("a", job()), host("b", job())], tmp_path)
    assert cells_by_host(first) == {"abl--seed=0": "a", "abl--seed=1": "b", "abl--seed=2": "a", "abl--seed=3": "b"}
    sweeps.record(tmp_path, first)
    kept = json.loads((tmp_path / "sweeps" / "proj" / "abl.json").read_text())
    assert kept["schema"] == "rgt/roster/v1" and kept["job"] == job() and kept["hosts"] == first["roster"]["hosts"]

    # the inventory changed: the hosts in another order, b now has two GPUs, and the matrix grew
    grown = (0, 1, 2, 3, 4, 5)
    (again,) = sweeps.plan([host("b", job(grown, gpus=2)), host("a", job(grown))], tmp_path)
    placed = cells_by_host(again)
    assert {c: placed[c] for c in cells_by_host(first)} == cells_by_host(first)  # nothing moved
    # b holds 2 cells on 2 slots, a 2 cells on 1: both new cells go to b (the fewest cells per slot)
    assert placed["abl--seed=4"] == "b" and placed["abl--seed=5"] == "b"
    assert again["roster"]["hosts"] == {"b": ["abl--seed=1", "abl--seed=3", "abl--seed=4", "abl--seed=5"],
                                        "a": ["abl--seed=0", "abl--seed=2"]}
    assert again["roster"]["created_at"] == first["roster"]["created_at"]

    # without the ledger nothing is sticky: the same hosts place the cells afresh (b first now)
    (fresh,) = sweeps.plan([host("b", job(grown, gpus=2)), host("a", job(grown))], None)
    assert cells_by_host(fresh)["abl--seed=0"] == "b"


def test_a_cell_whose_host_left_the_play_is_refused_naming_the_field(tmp_path):
    (first,) = sweeps.plan([host("a", job()), host("b", job())], tmp_path)
    sweeps.record(tmp_path, first)
    with pytest.raises(InputError) as caught:
        sweeps.plan([host("a", job()), host("c", job())], tmp_path)
    assert caught.value.field == "rgt_job.sweep"
    assert "abl--seed=1 (on b)" in caught.value.message and "abl--seed=3 (on b)" in caught.value.message
    assert "abl--seed=0" not in caught.value.message and caught.value.exit_code == 2
    # a roster of another project does not bind this one
    (other,) = sweeps.plan([host("a", job(), rgt_project="other"), host("c", job(), rgt_project="other")], tmp_path)
    assert set(cells_by_host(other).values()) == {"a", "c"}


def test_two_hosts_declaring_different_sweeps_under_one_name_are_refused(tmp_path):
    with pytest.raises(InputError) as caught:
        sweeps.plan([host("a", job()), host("b", job(seeds=(7,)))], tmp_path)
    assert caught.value.field == "rgt_job.sweep" and "'a' and 'b'" in caught.value.message


# ---------------------------------------------------------------- the launch's share, and cells as runs

def test_host_share_is_the_hosts_cells_in_roster_order_with_its_slots(tmp_path):
    (item,) = sweeps.plan([host("a", job()), host("b", job())], None)
    share = sweeps.host_share(item, "b", ["abl--seed=3"])
    assert share["name"] == "abl" and share["slots"] == ["0"] and share["retry"] == ["abl--seed=3"]
    assert [c["id"] for c in share["cells"]] == ["abl--seed=1", "abl--seed=3"]
    assert share["cells"][0] == {"id": "abl--seed=1", "command": "python train.py --seed 1", "env": {"SEED": "1"},
                                 "params": {"seed": "1"}}
    assert share["roster"] is item["roster"] and share["poll_s"] == 1.0
    assert sweeps.host_share(item, "a")["retry"] == []
    (polled,) = sweeps.plan([host("a", job(poll_s=0.5))], None)
    assert sweeps.host_share(polled, "a")["poll_s"] == 0.5


def test_cell_job_is_the_sweeps_job_as_one_run():
    spec = job()
    cell = {"id": "abl--seed=2", "command": "python train.py --seed 2", "env": {"SEED": "2", "BASE": "cell"}}
    out = sweeps.cell_job(spec, cell)
    assert "sweep" not in out and out["run_id"] == "abl--seed=2" and out["command"] == "python train.py --seed 2"
    assert out["env"] == {"BASE": "cell", "SEED": "2"} and out["gpu"] == {"count": 1}
    assert "sweep" in spec and spec["env"] == {"BASE": "1"}  # the sweep's job is not modified


def test_expand_makes_each_sweep_host_act_on_its_cells():
    hosts = [host("a", job()), host("b", job()), host("plain", {"run_id": "solo", "command": "true"})]
    items = sweeps.plan(hosts, None)
    extravars = {"rgt_job": job(), "keep": 1}
    sweeps.expand(hosts, extravars, items)
    assert extravars == {"keep": 1}  # the sweep's job leaves the extra vars: each host gets its own cell's job
    a, b, plain = hosts
    assert a.recalled["job"]["run_id"] == "abl--seed=0" and a.vars["rgt_job"] == a.recalled["job"]
    assert [c["run_id"] for c in a.recalled["cells"]] == ["abl--seed=0", "abl--seed=2"]
    assert a.other_runs == ["abl--seed=2"] and b.other_runs == ["abl--seed=3"]
    assert "sweep" not in a.vars["rgt_job"] and a.vars["rgt_job"]["command"] == "python train.py --seed 0"
    assert a.sweep == b.sweep == "abl" and a.vars["rgt_project"] == "proj"
    assert plain.sweep is None and plain.recalled is None and plain.vars["rgt_job"]["run_id"] == "solo"
    plain_only = {"rgt_job": {"run_id": "solo", "command": "true"}}
    sweeps.expand(hosts, plain_only, [])
    assert plain_only == {"rgt_job": {"run_id": "solo", "command": "true"}}  # a job without a sweep stays


def test_prepare_gives_a_launching_play_each_hosts_share_and_other_plays_the_cells(tmp_path):
    hosts = [host("a", job()), host("b", job())]
    items = sweeps.prepare("train", hosts, {}, tmp_path)
    assert [c["id"] for c in hosts[0].overlay["rgt_sweep"]["cells"]] == ["abl--seed=0", "abl--seed=2"]
    assert hosts[0].recalled is None  # a launch acts on the sweep, not on one cell
    assert items[0]["roster"]["hosts"]["b"] == ["abl--seed=1", "abl--seed=3"]
    looked = [host("a", job()), host("b", job())]
    sweeps.prepare("status", looked, {}, tmp_path)
    assert looked[1].recalled["job"]["run_id"] == "abl--seed=1" and not looked[1].overlay


def test_prepare_refuses_a_sweep_on_a_profile_whose_primitive_runs_no_sweeps(tmp_path):
    k8s = {"detach": {"primitive": "k8s-job", "fallback": None}}
    hosts = [host("a", job()), host("ns-1", job(), profile=k8s)]
    with pytest.raises(InputError) as caught:
        sweeps.prepare("train", hosts, {}, tmp_path)
    assert caught.value.field == "rgt_job.sweep" and "ns-1" in caught.value.message
    assert "k8s-job" in caught.value.message
    assert not hosts[0].overlay and not (tmp_path / "sweeps").exists()  # nothing touched
    # the same profile without a sweep is none of this code's business
    assert sweeps.prepare("train", [host("ns-1", {"run_id": "x", "command": "true"}, profile=k8s)], {},
                          tmp_path) == []


def test_a_slurm_profile_runs_a_sweep_as_a_job_array(tmp_path):
    slurm = {"detach": {"primitive": "sbatch", "fallback": None}}
    hosts = [host("login-1", job(), profile=slurm)]
    (item,) = sweeps.prepare("train", hosts, {}, tmp_path)
    assert [c["id"] for c in hosts[0].overlay["rgt_sweep"]["cells"]] == [c["id"] for c in item["roster"]["cells"]]


# ---------------------------------------------------------------- the tally

def roster(n=8):
    ids = [f"abl--seed={i}" for i in range(n)]
    return {"sweep": "abl", "project": "proj", "cells": [{"id": c, "host": "a" if i % 2 == 0 else "b"}
                                                          for i, c in enumerate(ids)]}


def runs(states, where=None):
    where = where or {}
    return [{"host": where.get(i, "a" if i % 2 == 0 else "b"), "run_id": f"abl--seed={i}", "state": s}
            for i, s in states.items()]


def test_tally_line_reads_finished_over_total_then_the_rest():
    states = dict.fromkeys(range(8), "finished")
    states.update({2: "failed", 5: "running"})
    t = sweeps.tally(roster(), runs(states))
    assert sweeps.tally_line(t) == "sweep abl: 6/8 finished, 1 running, 1 failed (abl--seed=2)"
    assert t["done"] is False and t["total"] == 8 and t["counts"] == {"finished": 6, "failed": 1, "running": 1}
    assert t["hosts"] == {"a": {"finished": 3, "failed": 1}, "b": {"finished": 3, "running": 1}}
    done = sweeps.tally(roster(), runs(dict.fromkeys(range(8), "finished")))
    assert done["done"] is True and sweeps.tally_line(done) == "sweep abl: 8/8 finished"


def test_tally_maps_every_run_state_onto_the_sweeps_states():
    states = {0: "finished", 1: "stalled", 2: "queued", 3: "timeout", 4: "oom", 5: "dead", 6: "preempted",
              7: "not_started", 8: "error"}
    t = sweeps.tally(roster(10), runs(states))  # seed=9 was seen nowhere
    assert [c["state"] for c in t["cells"]] == ["finished", "running", "queued", "failed", "failed", "preempted",
                                                "preempted", "missing", "failed", "missing"]
    assert sweeps.tally_line(t) == ("sweep abl: 1/10 finished, 1 running, 1 queued, 3 failed (abl--seed=3, "
                                    "abl--seed=4, abl--seed=8), 2 preempted, 2 missing (abl--seed=7, abl--seed=9)")
    assert sweeps.tally(roster(0), [])["done"] is False  # an empty roster is not a finished sweep


def test_tally_names_a_cell_started_on_two_hosts_and_the_cells_of_a_host_that_did_not_answer():
    seen = runs({0: "finished", 1: "running", 2: "running", 3: "running"})
    seen += runs({0: "running"}, where={0: "b"})      # seed=0 also started on b: a duplicate
    seen += runs({2: "not_started"}, where={2: "b"})  # prepared on b but never started there: not a duplicate
    seen += runs({4: "unreachable"})                  # a did not answer
    t = sweeps.tally(roster(6), seen, down={"a"})
    states = {c["id"]: c["state"] for c in t["cells"]}
    assert states == {"abl--seed=0": "duplicate", "abl--seed=1": "running", "abl--seed=2": "unreachable",
                      "abl--seed=3": "running", "abl--seed=4": "unreachable", "abl--seed=5": "missing"}
    assert sweeps.tally_line(t) == ("sweep abl: 0/6 finished, 2 running, 1 missing (abl--seed=5), 1 duplicate "
                                    "(abl--seed=0), 2 unreachable")


def test_tally_line_names_at_most_three_cells():
    t = sweeps.tally(roster(5), runs(dict.fromkeys(range(5), "failed")))
    assert sweeps.tally_line(t) == ("sweep abl: 0/5 finished, 5 failed (abl--seed=0, abl--seed=1, abl--seed=2 "
                                    "...)")


# ---------------------------------------------------------------- watch: what a relaunch would resume

def test_resume_key_names_every_run_of_the_host_that_a_relaunch_starts_again():
    doc = {"run_id": "abl--seed=0", "state": "preempted", "auto_resume": True, "attempt": 2, "other_runs": [
        {"run_id": "abl--seed=2", "state": "preempted", "auto_resume": True, "attempt": 1},
        {"run_id": "abl--seed=4", "state": "preempted", "auto_resume": True, "attempt": 1, "attention": [{"id": "x"}]},
        {"run_id": "abl--seed=6", "state": "failed", "auto_resume": True, "attempt": 1},
        {"run_id": "abl--seed=8", "state": "preempted", "auto_resume": False, "attempt": 1}]}
    assert status.resume_key("a", doc) == ("a", (("abl--seed=0", 2), ("abl--seed=2", 1)))
    # the host's first run goes on; another run on it was preempted: it is resumed all the same (by run)
    running = dict(doc, state="running")
    assert status.resume_key("a", running) == ("a", (("abl--seed=2", 1),))
    # a later preemption of the same run is a new key (resumed once per attempt)
    later = dict(running, other_runs=[dict(doc["other_runs"][0], attempt=2)])
    assert status.resume_key("a", later) == ("a", (("abl--seed=2", 2),))
    assert status.resume_key("a", {"state": "finished", "other_runs": []}) is None


def test_a_cell_no_queue_started_is_due_whatever_auto_resume_says_and_a_single_run_never_started_is_not():
    doc = {"run_id": "solo", "state": "not_started", "auto_resume": False, "other_runs": [
        {"run_id": "abl--seed=1", "state": "not_started", "sweep": "abl", "queue_alive": False},
        {"run_id": "abl--seed=3", "state": "not_started"},   # its job.json was never written: known from the ledger
        {"run_id": "abl--seed=5", "state": "dead", "sweep": "abl"},
        {"run_id": "abl--seed=7", "state": "queued", "sweep": "abl", "queue_alive": True}]}
    assert [r["run_id"] for r in status.due_runs(doc, {"abl--seed=3"})] == ["abl--seed=1", "abl--seed=3"]
    assert status.resume_key("a", doc) == ("a", (("abl--seed=1", None),))


# ---------------------------------------------------------------- a host's runs: every single run and every cell

def launched(ledger, host_name, run_id, at, instance="i-1", project="proj", sweep=None):
    """A run as the ledger remembers it after a launch, launched at `at` (ISO time)."""
    from rgt import memory

    entry = memory.record_launch(ledger, host_name, instance, project, {"name": run_id, "command": "true"},
                                 {"action": "launch", "attempt": 1, "state": "running"}, sweep=sweep)
    doc = json.loads((ledger / "runs" / f"{host_name}.json").read_text())
    doc["runs"][f"{project}/{run_id}"]["launched_at"] = at
    (ledger / "runs" / f"{host_name}.json").write_text(json.dumps(doc))
    return entry


def boxes(*names, instance="i-1"):
    return [host(n, rgt_instance_id=instance) for n in names]


def recorded_sweep(ledger, created_at="2026-01-02T00:00:00+00:00"):
    (item,) = sweeps.plan([host("a", job()), host("b", job())], ledger)
    item["roster"]["created_at"] = created_at
    sweeps.record(ledger, item)
    return item


def test_a_hosts_runs_are_every_remembered_run_and_every_cell_placed_on_it_newest_first(tmp_path):
    from rgt import memory

    ledger = tmp_path
    launched(ledger, "a", "early", "2026-01-01T00:00:00+00:00")
    recorded_sweep(ledger)  # cells 0 and 2 on a; never launched, the roster is from Jan 2
    launched(ledger, "a", "later", "2026-01-03T00:00:00+00:00")
    launched(ledger, "a", "gone", "2026-01-04T00:00:00+00:00", instance="i-old")  # a box this host no longer is
    launched(ledger, "a", "other", "2026-01-05T00:00:00+00:00", project="elsewhere")
    (a,) = boxes("a")
    runs = memory.host_runs(ledger, a)
    assert [(r["run_id"], r["sweep"]) for r in runs] == [("later", None), ("abl--seed=0", "abl"),
                                                         ("abl--seed=2", "abl"), ("early", None)]
    assert runs[1]["job"]["command"] == "python train.py --seed 0" and "sweep" not in runs[1]["job"]
    assert memory.units(runs) == [("run", "later"), ("sweep", "abl"), ("run", "early")]

    # a look: the host acts on every one of them; its own job spec (or one given with -e) narrows it to that job
    (a,) = boxes("a")
    (own,) = [host("b", {"name": "mine", "command": "true"}, rgt_instance_id="i-1")]
    assert memory.recall(ledger, [a, own]) == [a]
    assert a.vars["rgt_job"]["name"] == "later" and a.other_runs == ["abl--seed=0", "abl--seed=2", "early"]
    assert a.recalled["remembered"] is True and a.sweep is None
    assert own.recalled is None and own.vars["rgt_job"]["name"] == "mine"
    assert sweeps.in_scope([a, own]) == [("proj", "abl")]
    # a launch: one unit per host, newest by default, or the one asked for (a sweep: its job from the roster)
    (a,) = boxes("a")
    memory.recall(ledger, [a], launching=True)
    assert a.vars["rgt_job"]["name"] == "later" and a.recalled == {"job": a.vars["rgt_job"]}
    (a,) = boxes("a")
    memory.recall(ledger, [a], launching=True, choose=lambda runs: {"a": ("sweep", "abl")})
    assert a.vars["rgt_job"] == job() and a.recalled["job"] == job()


def test_the_tally_covers_the_sweeps_the_hosts_act_on_and_only_their_cells(tmp_path):
    from rgt import memory

    recorded_sweep(tmp_path)
    seen = [{"host": "a", "run_id": "abl--seed=0", "state": "finished"},
            {"host": "a", "run_id": "abl--seed=2", "state": "finished"}]
    narrowed = [host("a", {"name": "solo", "command": "true"})]  # -e @solo.yml: the sweep is not looked at
    assert sweeps.tallies(tmp_path, narrowed, seen) == []
    (a,) = boxes("a")
    memory.recall(tmp_path, [a])  # --limit a: b's cells were not looked at, so they are not missing
    (t,) = sweeps.tallies(tmp_path, [a], seen)
    assert t["done"] is True and t["total"] == 2 and sweeps.tally_line(t) == "sweep abl: 2/2 finished"


@pytest.mark.parametrize("damage", [b"", b'{"schema": "rgt/roster/v1", "cells": [{"id": "abl--se', b"\xff\xfe",
                                    b'{"schema": "rgt/roster/v1", "cells": "abl--seed=0"}', b"[1, 2]"])
def test_a_damaged_roster_is_refused_naming_the_file_and_never_replaced_by_a_guess(tmp_path, damage):
    from rgt import memory

    recorded_sweep(tmp_path)
    path = tmp_path / "sweeps" / "proj" / "abl.json"
    path.write_bytes(damage)
    for call in (lambda: sweeps.plan([host("a", job()), host("b", job()), host("c", job())], tmp_path),
                 lambda: memory.host_runs(tmp_path, boxes("a")[0]),
                 lambda: sweeps.prepare("status", [host("a", job())], {}, tmp_path)):
        with pytest.raises(InputError) as caught:
            call()
        assert str(path) in caught.value.message and "damaged" in caught.value.message
        assert caught.value.exit_code == 2 and "move it away" in caught.value.fix
    assert path.read_bytes() == damage


def test_a_damaged_record_of_runs_is_refused_and_never_overwritten(tmp_path):
    from rgt import memory

    path = tmp_path / "runs" / "a.json"
    path.parent.mkdir()
    path.write_text('{"schema": "rgt/runs/v1", "runs": {"proj/x": {"run_id": "x"')
    with pytest.raises(InputError) as caught:
        memory.check_records(tmp_path, boxes("a"))
    assert str(path) in caught.value.message and caught.value.exit_code == 2
    assert memory.record_launch(tmp_path, "a", "i-1", "proj", {"name": "y"}, {"action": "launch"}) is None
    assert path.read_text().endswith('"run_id": "x"')
    path.write_text(json.dumps({"schema": "rgt/runs/v1", "runs": {"proj/x": {"run_id": "x"}}}))  # no job
    with pytest.raises(InputError, match="has no run_id or job"):
        memory.host_runs(tmp_path, boxes("a")[0])


def test_a_lost_roster_keeps_each_launched_cell_where_the_ledger_or_its_box_says(tmp_path):
    first = recorded_sweep(tmp_path)
    placed = cells_by_host(first)
    assert placed == {"abl--seed=0": "a", "abl--seed=1": "b", "abl--seed=2": "a", "abl--seed=3": "b"}
    (tmp_path / "sweeps" / "proj" / "abl.json").unlink()  # lost; cell 0 was launched (remembered), cell 1 on b's box
    launched(tmp_path, "a", "abl--seed=0", "2026-01-03T00:00:00+00:00", sweep="abl")
    asked = []

    def look(members, project, name):
        asked.append(([h.name for h in members], project, name))
        return {"b": {"cells": {"abl--seed=1": "b", "abl--seed=9": "b"}}}

    # a new host c first in the inventory: a fresh placement would put cell 0 on c; the known cells stay put
    hosts = [host("c", job()), host("a", job()), host("b", job())]
    (again,) = sweeps.plan(hosts, tmp_path, look)
    now = cells_by_host(again)
    assert now["abl--seed=0"] == "a" and now["abl--seed=1"] == "b"
    assert asked == [(["c", "a", "b"], "proj", "abl")]
    # a cell known on two hosts is refused, not decided
    with pytest.raises(InputError, match=r"abl--seed=0 \(on a and c\)"):
        sweeps.plan(hosts, tmp_path, lambda *_: {"c": {"cells": {"abl--seed=0": "c"}}})


def test_a_relaunch_from_the_roster_makes_the_same_cells_whatever_order_the_file_keeps_its_keys_in(tmp_path):
    """The order of sweep.matrix is part of every cell's run id (seed first: abl--seed=1--lr=0.1): a job read back
    from the roster, even one written with sorted keys, makes the cells the roster holds, not new ones."""
    from rgt import memory

    two = job(seeds=(1, 2))
    two["sweep"]["matrix"] = {"seed": [1, 2], "lr": ["0.1"]}
    (item,) = sweeps.plan([host("a", two)], tmp_path)
    sweeps.record(tmp_path, item)
    ids = [c["id"] for c in item["roster"]["cells"]]
    assert ids == ["abl--seed=1--lr=0.1", "abl--seed=2--lr=0.1"]
    path = tmp_path / "sweeps" / "proj" / "abl.json"
    for text in (path.read_text(), json.dumps(json.loads(path.read_text()), sort_keys=True)):  # an older roster
        path.write_text(text)
        (a,) = boxes("a")
        memory.recall(tmp_path, [a], launching=True, choose=lambda runs: {"a": ("sweep", "abl")})
        (again,) = sweeps.prepare("launch_detached", [a], {}, tmp_path)
        assert [c["id"] for c in a.overlay["rgt_sweep"]["cells"]] == ids
        assert [c["id"] for c in again["roster"]["cells"]] == ids


def test_watch_relaunches_by_run_one_launch_per_sweep_and_one_per_single_run(tmp_path, monkeypatch):
    import argparse

    from rgt import memory

    recorded_sweep(tmp_path)
    launched(tmp_path, "a", "r1", "2026-01-05T00:00:00+00:00")
    launched(tmp_path, "a", "r2", "2026-01-04T00:00:00+00:00")
    hosts = boxes("a", "b")
    memory.recall(tmp_path, hosts)
    plays = []

    def fake_launch(args, console, ledger, choose, names):
        plays.append((choose(hosts_runs) if choose else None, sorted(names)))
        return 0

    hosts_runs = {h.name: memory.host_runs(tmp_path, h) for h in hosts}
    monkeypatch.setattr(status, "_launch", fake_launch)
    due = {"a": [{"run_id": "abl--seed=0", "state": "preempted", "sweep": "abl"},
                 {"run_id": "r1", "state": "preempted"}, {"run_id": "r2", "state": "preempted"}],
           "b": [{"run_id": "abl--seed=3", "state": "not_started"}]}  # its sweep known from the ledger's runs
    code = status.relaunch(argparse.Namespace(ledger=str(tmp_path)), None, ["a", "b"], ledger=tmp_path,
                           host_objs=hosts, due=due)
    assert code == 0
    assert plays == [({"a": ("sweep", "abl"), "b": ("sweep", "abl")}, ["a", "b"]),  # the sweep's queue, once
                     ({"a": ("run", "r1")}, ["a"]), ({"a": ("run", "r2")}, ["a"])]   # each single run on its own
    # a host given a job spec relaunches that job (no chooser)
    plays.clear()
    own = host("c", {"name": "x", "command": "true"})
    status.relaunch(argparse.Namespace(ledger=str(tmp_path)), None, ["c"], ledger=tmp_path, host_objs=[own],
                    due={"c": [{"run_id": "x", "state": "preempted"}]})
    assert plays == [(None, ["c"])]
