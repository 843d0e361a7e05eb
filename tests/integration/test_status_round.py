"""`status` over the ssh round (rgt.sshround) on the local profile: the monitor role and the round give the same
status document for the same run, a status starts no ansible-playbook, and the zipapp of the status code is
cached by its hash. Every host is this machine (connection local) with its own run under a temp durable root."""

import argparse
import io
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from clihelp import write_inventory
from rich.console import Console

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / ".collections"))
from ansible_collections.rgt.remote_gpu.plugins.module_utils import rgt_runlayout  # noqa: E402

pytestmark = pytest.mark.skipif(not (REPO / ".venv" / "bin" / "ansible-playbook").exists(),
                                reason="needs .venv with ansible-core")

# what differs between two looks a few seconds apart, whoever looks
CLOCK_KEYS = {"collected_at", "seen_at", "elapsed_s", "cost_so_far", "heartbeat_age_s", "log_age_s", "ckpt_age_s",
              "mem_usage_bytes", "bytes_pct", "inodes_pct"}


def timeless(value):
    if isinstance(value, dict):
        return {k: timeless(v) for k, v in value.items() if k not in CLOCK_KEYS}
    if isinstance(value, list):
        return [timeless(v) for v in value]
    return value


def local_host(durable, run_id, **extra):
    return {"ansible_connection": "local", "ansible_python_interpreter": sys.executable, "rgt_profile": "local",
            "rgt_instance_id": "localhost", "rgt_durable_root": str(durable), "rgt_job": {"name": run_id},
            "rgt_shared_volume": True, **extra}


def seed(durable, run_id, *, alive=None, finished=False, outputs=(), lines=0):
    p = rgt_runlayout.RunPaths(str(durable), "rgt", run_id)
    for d in (p.meta, p.logs, p.ckpt, p.out):
        os.makedirs(d, exist_ok=True)
    rgt_runlayout.atomic_write_json(p.job, {
        "schema": 1, "run_id": run_id, "project": "rgt", "run_dir": p.run_dir, "outputs": list(outputs),
        "log_patterns": {}, "expected_duration_s": None, "price_per_hour": 1.5, "heartbeat_interval_s": 5,
        "stall_after_s": 600, "attempt_policy": {"auto_resume": False}})
    pid = alive.pid if alive else 999999
    inc = rgt_runlayout.incarnation()
    rgt_runlayout.atomic_write_json(p.pid, {"wrapper_pid": pid, "job_pid": pid, "pgid": pid, "attempt": 1,
                                            "incarnation": inc})
    rgt_runlayout.atomic_write_json(p.heartbeat, {"ts": time.time(), "attempt": 1, "job_alive": bool(alive)})
    rgt_runlayout.append_jsonl(p.attempts, {"attempt": 1, "started_at": time.time() - 600, "code_dir": p.code_dir(
        "abcd1234"), "resume_from": "", "incarnation": inc, "detach": "nohup"})
    with open(p.log, "a") as fh:
        fh.write("== rgt attempt 1 started 2026-12-01T00:00:00Z resume_from=\n")
        fh.write("".join(f"step={i} loss={1.0 / i:.4f}\n" for i in range(1, lines + 1)))
    if finished:
        rgt_runlayout.append_jsonl(p.attempts, {"attempt": 1, "ended_at": time.time(), "rc": 0, "signal": None,
                                                "reason": "finished"})
        rgt_runlayout.atomic_write_json(p.exit, {"attempt": 1, "rc": 0, "signal": None, "reason": "finished",
                                                 "ended_at": time.time(), "stop_signal": None})
    return p


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    root = tmp_path_factory.mktemp("round")
    durable = root / "durable"
    sleeper = subprocess.Popen(["sleep", "300"])
    seed(durable, "run-live", alive=sleeper, lines=30)
    done = seed(durable, "run-done", finished=True, outputs=["weights.bin"], lines=5)
    (Path(done.out) / "weights.bin").write_bytes(b"w")
    seed(durable, "run-old", finished=True, lines=3)
    hosts = {"live": local_host(durable, "run-live", monitor_other_run_ids=["run-old"]),
             "done": local_host(durable, "run-done", monitor_history_kb=0),
             "templated": local_host("{{ '%s' }}" % durable, "run-done")}
    inv = write_inventory(root / "inv", hosts)
    yield {"inv": inv, "root": root, "durable": durable}
    sleeper.kill()
    sleeper.wait()


def prepared(fleet, limit):
    from rgt.prepare import prepare

    ns = argparse.Namespace(inventory=str(fleet["inv"]), limit=limit, extra_vars=[], verbose=0,
                            ledger=str(fleet["root"] / "ledger"), playbook="monitor")
    _playbook, hosts, extravars = prepare(ns)
    return ns, hosts, extravars


def test_the_monitor_role_and_the_round_give_the_same_document(fleet, monkeypatch):
    from rgt import observe, sshround

    monkeypatch.setenv("XDG_CACHE_HOME", str(fleet["root"] / "cache"))
    ns, hosts, extravars = prepared(fleet, "live,done")
    console = Console(file=io.StringIO())
    by_play = observe.poll_play(ns, console, hosts, extravars, Path(ns.ledger))
    now = time.time()
    by_round = {name: observe.round_doc(name, out, now)
                for name, out in sshround.status_round(ns.inventory, hosts, extravars).items()}
    assert set(by_play) == set(by_round) == {"live", "done"}
    assert by_round["live"]["state"] == "running" and by_round["done"]["state"] == "finished"
    assert [o["run_id"] for o in by_round["live"]["other_runs"]] == ["run-old"]
    assert "history" in by_round["live"] and "history" not in by_round["done"]
    for name in by_play:
        assert timeless(by_round[name]) == timeless(by_play[name]), name


def test_status_is_one_ssh_round_caching_the_code_and_only_a_templated_host_needs_the_play(fleet, rgt):
    cache = fleet["root"] / "cache2"
    env = {"XDG_CACHE_HOME": str(cache)}
    first = rgt("status", "-i", fleet["inv"], "--json", env=env, timeout=120)
    assert first.rc == 0, first.stderr
    hosts = first.doc["hosts"]
    assert {h: d["state"] for h, d in hosts.items()} == {"live": "running", "done": "finished",
                                                          "templated": "finished"}
    assert hosts["templated"]["run_dir"] == hosts["done"]["run_dir"]  # Ansible evaluated its durable root
    plays = list((rgt.ledger / "events").glob("*monitor*"))
    assert len(plays) == 1, "one monitor play, for the templated host only"
    assert '"live"' not in plays[0].read_text() and '"templated"' in plays[0].read_text()
    shipped = list((cache / "rgt").glob("status-*"))
    assert len(shipped) == 1
    stamp = (shipped[0] / "__main__.py").stat().st_mtime_ns
    again = rgt("status", "-i", fleet["inv"], "-l", "live", "--json", env=env, timeout=120)
    assert again.rc == 0 and again.doc["hosts"]["live"]["step"] == 30
    assert list((rgt.ledger / "events").glob("*monitor*")) == plays, "status of a plain host started a play"
    assert list((cache / "rgt").glob("status-*")) == shipped
    assert (shipped[0] / "__main__.py").stat().st_mtime_ns == stamp


@pytest.mark.stubs
def test_the_round_reaches_a_real_sshd_with_the_pin_reuses_the_master_and_refuses_a_wrong_pin(rgt, stub_fleet,
                                                                                               tmp_path):
    """One stub box: status over the round answers, the second look rides the same ControlMaster, and the same
    box under another pin is refused (exit 3), never trusted."""
    import json as _json

    from conftest import stub_inventory

    from rgt import sshround
    from rgt.inventory import Host

    stub = stub_fleet["stubs"]["rp"]
    run = "/workspace/rgt/active/round"
    stub.exec(f"mkdir -p {run}/.rgt {run}/logs {run}/out {run}/ckpt && echo 'step=7 loss=0.5' > {run}/logs/job.log"
              f" && echo '{_json.dumps({'schema': 1, 'run_id': 'round', 'outputs': []})}' > {run}/.rgt/job.json"
              f" && echo '{_json.dumps({'attempt': 1, 'rc': 0, 'reason': 'finished'})}' > {run}/.rgt/exit.json")
    inv = stub_inventory(stub_fleet, ["rp"], job={"name": "round"})
    first = rgt("status", "-i", inv, "--json", timeout=120)
    assert first.rc == 0, first.stderr
    assert first.doc["hosts"]["rp"]["state"] == "finished" and first.doc["hosts"]["rp"]["step"] == 7
    assert "status-" in stub.exec("ls ~/.cache/rgt").stdout  # the status code is cached on the box
    hv = {k: v for k, v in stub.inventory_vars().items() if k != "ansible_ssh_common_args"}
    target = sshround.target_for(str(inv), Host(name="rp", vars=hv))

    def master():
        proc = subprocess.run(["ssh", "-O", "check", "-o", f"ControlPath={target.control_path}", "x"],
                              capture_output=True, text=True)
        return proc.returncode, proc.stderr.strip()

    rc, before = master()
    assert rc == 0 and "Master running" in before
    again = rgt("status", "-i", inv, "--json", timeout=120)
    assert again.rc == 0 and master() == (0, before)  # the same master process served the second look
    wrong = tmp_path / "wrong"
    wrong.mkdir()
    (wrong / "hosts.yml").write_text((inv / "hosts.yml").read_text())
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(tmp_path / "other")], check=True)
    other_key = " ".join((tmp_path / "other.pub").read_text().split()[:2])
    (wrong / "known_hosts").write_text(f"{stub.instance_id} {other_key}\n")  # another box's key under this id
    refused = rgt("status", "-i", wrong, "--json", timeout=120)
    assert refused.rc == 3, refused.stderr
    assert refused.doc["hosts"]["rp"]["host_key_mismatch"] is True
    assert refused.doc["hosts"]["rp"]["state"] == "unreachable"
