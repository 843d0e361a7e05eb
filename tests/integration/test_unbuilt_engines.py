"""A profile whose detach primitive is registered but not built yet (today vast-onstart: the registry decides;
sbatch and k8s-job are built) is refused before anything reaches the box, never run under tmux or nohup instead:
`rgt-run train` and `launch_detached` exit 2 naming the profile's field and what to use instead; the launch_detached
playbook alone (a plain ansible-playbook user) fails in rgt_launch with the same registry message. A profile naming
a primitive that is not registered at all is refused at input for every command (exit 2, the field named). Nothing
is created: no durable root, no tmux session, no playbook run. All on the local connection (seconds). Each unbuilt
primitive is tried through a profile of its own (profiles/local.yml with that primitive) in $RGT_PROFILES_DIR."""

import json
import os
import subprocess
from pathlib import Path

import pytest
import yaml
from clihelp import write_inventory

from ansible_collections.rgt.remote_gpu.plugins.module_utils import rgt_registry as reg

REPO = Path(__file__).resolve().parents[2]
ANSIBLE_PLAYBOOK = REPO / ".venv" / "bin" / "ansible-playbook"
PYTHON = REPO / ".venv" / "bin" / "python"


UNBUILT = [e for e in reg.DETACH_PRIMITIVES if not e.built]


def test_sbatch_is_built_and_the_others_wait():
    assert reg.detach("sbatch").built and reg.launch_problem("sbatch") is None
    assert {e.name for e in UNBUILT} <= {"vast-onstart"}


@pytest.fixture(params=UNBUILT, ids=[e.name for e in UNBUILT])
def box(request, tmp_path):
    """A local-connection host of a profile whose primitive is not built (RGT_PROFILES_DIR), a private tmux
    socket dir, and what must stay absent."""
    entry = request.param
    tmux_dir = Path(os.environ.get("TMPDIR", "/tmp")) / f"rgt-tmux-{os.getpid()}-{tmp_path.name[-8:]}"
    tmux_dir.mkdir()
    profiles_dir = tmp_path / "unbuilt-profiles"
    profiles_dir.mkdir()
    data = yaml.safe_load((REPO / "profiles" / "local.yml").read_text(encoding="utf-8"))
    data.update(name="engine")
    data["detach"].update(primitive=entry.name, fallback=None)
    (profiles_dir / "engine.yml").write_text(yaml.safe_dump(data), encoding="utf-8")
    env = {"TMUX_TMPDIR": str(tmux_dir), "RGT_PROFILES_DIR": str(profiles_dir)}

    def inventory(profile="engine"):
        return write_inventory(tmp_path / "inv", {"login": {
            "ansible_connection": "local", "ansible_python_interpreter": str(PYTHON), "rgt_profile": profile,
            "rgt_instance_id": "login-1", "rgt_project": "proj", "rgt_durable_root": str(tmp_path / "durable")}})

    yield {"tmp": tmp_path, "env": env, "inventory": inventory, "tmux_dir": tmux_dir, "entry": entry,
           "job": {"rgt_job": {"name": "engine-1", "command": "python train.py", "python": str(PYTHON),
                               "code_dir": str(REPO / "examples" / "tiny_train")}}}
    quiet = {k: v for k, v in os.environ.items() if k not in ("TMUX", "TMUX_PANE")}
    subprocess.run(["tmux", "kill-server"], env={**quiet, **env}, capture_output=True)
    for leftover in sorted(tmux_dir.rglob("*"), reverse=True):
        leftover.unlink() if not leftover.is_dir() else leftover.rmdir()
    tmux_dir.rmdir()


def nothing_created(box, rgt=None):
    assert not (box["tmp"] / "durable").exists(), "the refused launch wrote under the durable root"
    assert list(box["tmux_dir"].iterdir()) == [], "a tmux server was started"
    if rgt is not None:
        assert not (rgt.ledger / "events").exists(), "a playbook ran on refused input"


def refused_at_launch(result, entry, field="detach.primitive"):
    assert result.rc == 2, result.stdout + result.stderr
    assert "Traceback" not in result.stderr
    doc = result.doc
    assert doc["exit_code"] == 2 and doc["field"] == field, doc
    assert f"'{entry.name}'" in doc["error"] and "not built yet" in doc["error"], doc
    assert "never runs the job under another primitive" in doc["error"]
    assert entry.instead[:40] in doc["fix"], doc
    assert "not built yet" in result.stderr


@pytest.mark.parametrize("command", [["train"], ["playbooks/launch_detached.yml"]])
def test_launching_through_an_unbuilt_primitive_is_refused_at_input_and_nothing_is_created(rgt, box, command):
    result = rgt(*command, "-i", box["inventory"](), "-e", json.dumps(box["job"]), "--json", env=box["env"])
    refused_at_launch(result, box["entry"])
    nothing_created(box, rgt)


def test_the_launch_playbook_alone_refuses_an_unbuilt_primitive_in_rgt_launch_with_the_registry_message(box):
    extra = {**box["job"], "launch_detached_code_dir": str(box["tmp"] / "code-x")}
    env = {**os.environ, **box["env"], "ANSIBLE_CONFIG": str(REPO / "ansible.cfg"),
           "ANSIBLE_COLLECTIONS_PATH": str(REPO / ".collections"), "ANSIBLE_NOCOLOR": "1"}
    proc = subprocess.run([str(ANSIBLE_PLAYBOOK), "-i", str(box["inventory"]()),
                           str(REPO / "playbooks" / "launch_detached.yml"), "-e", json.dumps(extra)],
                          capture_output=True, text=True, env=env, cwd=REPO, timeout=300)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out
    assert f"detach.primitive: '{box['entry'].name}'" in out and "is registered but not built yet" in out, out
    assert "rc_hint: 2" in out and "field: detach.primitive" in out, out
    assert "Fix: use " + box["entry"].instead[:40] in out
    nothing_created(box)


def test_a_profile_naming_an_unregistered_primitive_is_refused_at_input_for_any_command(rgt, box, tmp_path):
    profiles_dir = tmp_path / "profiles"
    profiles_dir.mkdir()
    data = yaml.safe_load((REPO / "profiles" / "local.yml").read_text(encoding="utf-8"))
    data.update(name="mybox")
    data["detach"]["primitive"] = "screen"
    (profiles_dir / "mybox.yml").write_text(yaml.safe_dump(data), encoding="utf-8")
    env = {**box["env"], "RGT_PROFILES_DIR": str(profiles_dir)}
    for command in (["probe"], ["status"]):
        result = rgt(*command, "-i", box["inventory"]("mybox"), "--json", env=env)
        assert result.rc == 2, result.stdout + result.stderr
        doc = result.doc
        assert doc["field"] == "detach.primitive" and "'screen' is not a registered detach primitive" in doc["error"]
        assert "mybox.yml" in doc["error"] and "use one of: tmux, nohup" in doc["fix"], doc
    nothing_created(box, rgt)
