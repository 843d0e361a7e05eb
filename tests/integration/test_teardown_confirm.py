"""Through `rgt-run`, a meter stop takes its confirmation only from `rgt-run teardown` (the prompt or --confirm, after
the plan) (rgt issue 17).

The box is this machine (connection local, tests/integration/test_teardown_box.py's Box); the control planes are
the local fakes of tests/fakes/control_planes.py, which count every call: a refusal must leave them with none.
"""

import json
import sys

import pytest
from clihelp import REPO, write_inventory
from test_teardown_box import FAST, TOKEN, Box, runpod_env

from tests.fakes.control_planes import RunPodV2

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


if __name__ == "__main__":  # pragma: no cover
    sys.exit(pytest.main([__file__, "-v"]))
