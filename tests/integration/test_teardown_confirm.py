"""Through `rgt-run`, a meter stop takes its confirmation only from `rgt-run teardown` (the prompt or --confirm, after
the plan), and a teardown interrupted while it polls resumes by polling, never by calling again (rgt issue 17).

The box is this machine (connection local, tests/integration/test_teardown_box.py's Box); the control planes are
the local fakes of tests/fakes/control_planes.py, which count every call: a refusal must leave them with none.
"""

import json
import os
import signal
import subprocess
import sys

import pytest
from clihelp import REPO, read_json, wait_for, write_inventory
from test_teardown_box import FAST, TOKEN, Box, runpod_env

from tests.fakes.control_planes import RunPodV2, Vast

pytestmark = pytest.mark.skipif(not (REPO / ".venv" / "bin" / "ansible-playbook").exists(),
                                reason="needs .venv with ansible-core")

TEARDOWN_PLAY = (REPO / "playbooks" / "teardown.yml").read_text()


def copy_of_the_teardown_playbook(tmp_path, text: str = TEARDOWN_PLAY):
    path = tmp_path / "my-teardown.yml"
    path.write_text(text)
    return path


def test_a_copy_of_the_teardown_playbook_is_refused_whatever_confirms_it(rgt, tmp_path):
    box = Box(tmp_path, "runpod", "pod-copy-1")
    box.sealed("proj", "a")
    copy = copy_of_the_teardown_playbook(tmp_path)
    with RunPodV2(token=TOKEN) as fake:
        fake.add_pod(box.instance_id)
        # the role's own variable, given with -e: refused like rgt_teardown_confirm, naming where it came from
        given = rgt(copy, "-i", box.inv, "-e", f"teardown_confirm={box.instance_id}", "-e", FAST, "--json",
                    env=runpod_env(fake))
        assert given.rc == 2, given.stderr
        assert "teardown_confirm was given with -e on the command line" in given.stderr
        assert given.doc["field"] == "teardown_confirm"
        # no confirmation at all: the copy itself is refused, with the command to use instead
        plain = rgt(copy, "-i", box.inv, "-e", FAST, "--json", env=runpod_env(fake))
        assert plain.rc == 2, plain.stderr
        assert "runs the role rgt.remote_gpu.teardown, which stops a meter" in plain.stderr
        assert f"rgt-run teardown -i {box.inv}" in plain.doc["fix"] and plain.doc["field"] == "playbook"
        # the same through `rgt-run teardown`: its own -e is refused too
        sub = rgt("teardown", "-i", box.inv, "-e", json.dumps({"teardown_confirm": box.instance_id}), "--json",
                  env=runpod_env(fake))
        assert sub.rc == 2 and sub.doc["field"] == "teardown_confirm", sub.stderr
        assert fake.calls() == []
    assert box.record(rgt.ledger) is None
    assert not (rgt.ledger / "events").exists(), "nothing may run when input is bad"


def test_the_roles_confirmation_set_in_the_inventory_is_refused_naming_the_file(rgt, tmp_path):
    box = Box(tmp_path, "runpod", "pod-inv-1")
    hosts = json.loads(box.inv.read_text())["all"]["hosts"]
    inv = write_inventory(tmp_path / "inv", hosts, group_vars={"teardown_confirm": box.instance_id})
    result = rgt("teardown", "-i", inv, "--confirm", box.instance_id, "--json")
    assert result.rc == 2, result.stderr
    assert result.doc["field"] == "teardown_confirm"
    assert str(inv / "group_vars" / "all.yml") in result.doc["error"]
    assert box.record(rgt.ledger) is None


def test_a_play_that_hides_the_role_from_the_runner_still_cannot_confirm_a_meter_stop(rgt, tmp_path):
    """A templated role name is past what the runner can read in a playbook: the play runs, but every confirmation
    variable is held by rgt-run's own extra vars (play vars and role params lose to them), so the role's gate
    refuses (exit 3) and nothing is called."""
    box = Box(tmp_path, "runpod", "pod-hidden-1")
    box.sealed("proj", "a")
    play = tmp_path / "sneaky.yml"
    play.write_text(json.dumps([{
        "name": "Stop the meter with a stored confirmation", "hosts": "all", "gather_facts": False,
        "vars": {"which": "rgt.remote_gpu.teardown", "teardown_confirm": box.instance_id,
                 "rgt_teardown_confirm": box.instance_id, "rgt_teardown_confirms": {"box": box.instance_id},
                 "rgt_runs_dir": str(box.runs), "teardown_poll_interval_s": 0.3},
        "tasks": [{"name": "Run the teardown role", "ansible.builtin.include_role": {"name": "{{ which }}"}}]}]))
    with RunPodV2(token=TOKEN) as fake:
        fake.add_pod(box.instance_id)
        result = rgt(play, "-i", box.inv, "--json", env=runpod_env(fake))
        assert result.rc == 3, result.stderr
        assert fake.mutating_calls() == []
    assert "no confirmation" in result.stderr
    assert box.record(rgt.ledger) is None


def test_ctrl_c_while_polling_a_destroy_leaves_the_stop_on_record_and_the_rerun_polls_without_calling(rgt, tmp_path):
    box = Box(tmp_path, "vastai", "4242")
    box.sealed("proj", "a")
    record = rgt.ledger / "teardown" / "box.json"
    # an interrupted module leaves its AnsiballZ directory behind, as Ansible does: here, not in ~/.ansible/tmp
    env = {**os.environ, "RGT_LEDGER": str(rgt.ledger), "VAST_API_KEY": TOKEN,
           "ANSIBLE_REMOTE_TMP": str(tmp_path / "ansible-tmp")}
    argv = [sys.executable, "-m", "rgt.cli", "teardown", "-i", str(box.inv), "--runs-dir", str(box.runs),
            "--confirm", box.instance_id, "-e", FAST, "--json"]
    with Vast(token=TOKEN, lag_s=3600) as fake:  # vast keeps listing a destroyed instance for a while
        fake.add_instance(box.instance_id)
        env["VAST_URL"] = fake.url
        proc = subprocess.Popen(argv, cwd=REPO, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
        try:
            destroy = wait_for(lambda: fake.calls("DELETE"), timeout=240, what="the destroy call")[0]
            wait_for(lambda: [g for g in fake.calls("GET") if g["t"] > destroy["t"]], what="a poll after it")
            proc.send_signal(signal.SIGINT)  # Ctrl-C while teardown polls the destroyed instance
            out, err = proc.communicate(timeout=60)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        assert proc.returncode == 130, err
        assert "the Destroy was requested at" in err and "never calls again" in err
        doc = json.loads(out)
        assert doc["exit_code"] == 130 and doc["hosts"]["box"]["status"] == "interrupted (stop requested)"
        # the intent was on record before the call, and the answer once it came
        left = read_json(record)
        assert left["final_state"] == "requested — not reported gone yet" and left["requested_at"]
        assert {"method": "DELETE", "path": "/api/v0/instances/4242/", "status": 200} in left["calls"]

        fake.lag_s = 0  # the platform now reports it gone
        again = rgt("teardown", "-i", box.inv, "--runs-dir", box.runs, "--confirm", box.instance_id, "-e", FAST,
                    "--json", env={"VAST_API_KEY": TOKEN, "VAST_URL": fake.url})
        assert again.rc == 0, again.stderr
        assert len(fake.calls("DELETE")) == 1  # polled, never called again
    assert "a stop is in flight" in again.stderr and "runs on the box" not in again.stderr  # the box is not listed
    item = again.doc["instances"]["4242"]
    assert item["status"] == "in flight" and item["outcome"]["final_state"] == "gone"
    done = read_json(record)
    assert done["final_state"] == "gone" and done["requested_at"] == left["requested_at"]
    assert [c["method"] for c in done["calls"]].count("DELETE") == 1  # the record keeps the earlier call
    assert TOKEN not in again.stdout + again.stderr + out + err + json.dumps(done)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(pytest.main([__file__, "-v"]))
