"""`rgt-run train -C` with a job that declares a sweep: every cell (its run id, args and env) and the host each goes
to, computed here (no box contacted); a sweep the rules refuse exits 2 naming the field; a sweep on a profile whose
detach primitive runs no sweeps (Kubernetes) is refused before anything is touched."""

import json

from clihelp import write_inventory


def sweep_job(tmp_path, **sweep):
    code = tmp_path / "code"
    code.mkdir(exist_ok=True)
    (code / "train.py").write_text("print('hi')\n")
    spec = {"matrix": {"lr": ["1e-3", "3e-4"], "seed": [0, 1, 2]}, "args": "--lr {lr} --seed {seed}",
            "env": {"SEED": "{seed}"}, "gpus_per_cell": 1}
    spec.update(sweep)
    return {"rgt_job": {"name": "abl", "command": "python train.py", "python": "/usr/bin/python3",
                        "code_dir": str(code), "sweep": spec}}


def two_boxes(tmp_path):
    hosts = {name: {"ansible_host": "127.0.0.1", "ansible_port": 1, "rgt_profile": "runpod",
                    "rgt_instance_id": f"pod-{name}"} for name in ("box-a", "box-b")}
    inv = write_inventory(tmp_path / "inv", hosts)
    (inv / "known_hosts").write_text("".join(f"pod-{h} ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIHw9\n" for h in hosts))
    return inv


def test_check_shows_every_cell_and_where_it_runs(rgt, tmp_path):
    inv = two_boxes(tmp_path)
    job = sweep_job(tmp_path)
    # the job is given per host here (each box has its own gpu count): one sweep over both
    (inv / "host_vars").mkdir()
    for host, count in (("box-a", 1), ("box-b", 2)):
        spec = dict(job["rgt_job"], gpu={"count": count})
        (inv / "host_vars" / f"{host}.yml").write_text(json.dumps({"rgt_job": spec}))
    result = rgt("train", "-i", inv, "-C", "--json", timeout=120)
    assert result.rc == 0, result.stdout + result.stderr
    (sweep,) = result.doc["sweeps"]
    assert sweep["sweep"] == "abl" and sweep["at_once"] == {"box-a": 1, "box-b": 2}
    roster = sweep["roster"]
    # box-b runs two cells at once: it gets twice the share of the six cells
    assert {h: len(ids) for h, ids in roster["hosts"].items()} == {"box-a": 2, "box-b": 4}
    cell = next(c for c in roster["cells"] if c["id"] == "abl--lr=3e-4--seed=1")
    assert cell["command"] == "python train.py --lr 3e-4 --seed 1" and cell["env"] == {"SEED": "1"}
    assert cell["run_dir"] == "/workspace/rgt/active/abl--lr=3e-4--seed=1"
    assert "abl--lr=1e-3--seed=0" in result.stderr and "6 cells" in result.stderr
    assert not (rgt.ledger / "events").exists()


def test_a_cell_value_that_cannot_name_a_run_is_refused_naming_the_field(rgt, tmp_path):
    job = sweep_job(tmp_path, matrix={"lr": ["1e-3", "1e 4"]})
    result = rgt("train", "-i", two_boxes(tmp_path), "-e", json.dumps(job), "-C", "--json", timeout=120)
    assert result.rc == 2, result.stdout + result.stderr
    assert result.doc["field"] == "rgt_job.sweep.matrix.lr[1]" and "'1e 4'" in result.doc["error"]


def test_a_sweep_on_a_profile_that_cannot_queue_it_is_refused_before_any_box(rgt, tmp_path):
    hosts = {"ns-1": {"ansible_connection": "local", "rgt_profile": "kubernetes", "rgt_instance_id": "ns-1"}}
    inv = write_inventory(tmp_path / "inv", hosts)
    result = rgt("train", "-i", inv, "-e", json.dumps(sweep_job(tmp_path)), "--json", timeout=120)
    assert result.rc == 2, result.stdout + result.stderr
    assert result.doc["field"] == "rgt_job.sweep" and "k8s-job" in result.doc["error"]
    assert not (rgt.ledger / "events").exists()
