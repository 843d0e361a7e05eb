"""The one role preamble (roles/run_context): the profile and the run identity are defined once, every rgt role
depends on it, and a profile the runner already validated (rgt_profile_data) is used as given, never loaded again."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from rgt.inventory import Host
from rgt.phases import _overlay_vars

REPO = Path(__file__).resolve().parents[2]
ROLES = REPO / "roles"
PLAYBOOK_BIN = REPO / ".venv" / "bin" / "ansible-playbook"
RGT_ROLES = sorted(p.name for p in ROLES.iterdir() if (p / "tasks").is_dir())

pytestmark = pytest.mark.skipif(not PLAYBOOK_BIN.exists(), reason="needs .venv with ansible-core")


def test_every_role_starts_from_run_context_and_loads_no_profile_itself():
    assert len(RGT_ROLES) >= 7
    for role in RGT_ROLES:
        meta = yaml.safe_load((ROLES / role / "meta" / "main.yml").read_text())
        assert {"role": "run_context"} in meta["dependencies"], role
        defaults = (ROLES / role / "defaults" / "main.yml").read_text()
        assert "rgt.remote_gpu.profile" not in defaults, f"{role} loads the profile itself"
        loaded = yaml.safe_load(defaults)
        assert loaded[f"{role}_profile"] == "{{ run_context_profile }}", role
        for key in ("project", "run_id"):
            if f"{role}_{key}" in loaded:
                assert loaded[f"{role}_{key}"] == "{{ run_context_%s }}" % key, (role, key)


def _play(tmp_path: Path, variables: dict) -> dict:
    out = tmp_path / "seen.json"
    (tmp_path / "play.yml").write_text(yaml.safe_dump([{
        "hosts": "box", "gather_facts": False, "roles": ["rgt.remote_gpu.run_context"],
        "tasks": [{"ansible.builtin.copy": {"dest": str(out), "mode": "0644", "content": (
            "{{ {'profile': run_context_profile.name, 'project': run_context_project,"
            " 'run_id': run_context_run_id} | to_json }}")}}]}]))
    box = {"ansible_connection": "local", "ansible_python_interpreter": sys.executable}
    (tmp_path / "inv.yml").write_text(yaml.safe_dump({"all": {"hosts": {"box": box}}}))
    (tmp_path / "vars.json").write_text(json.dumps(variables))
    env = {**os.environ, "ANSIBLE_CONFIG": str(REPO / "ansible.cfg"),
           "ANSIBLE_COLLECTIONS_PATH": str(REPO / ".collections")}
    proc = subprocess.run([str(PLAYBOOK_BIN), "-i", str(tmp_path / "inv.yml"), str(tmp_path / "play.yml"),
                           "-e", "@" + str(tmp_path / "vars.json")], capture_output=True, text=True, env=env,
                          cwd=tmp_path, timeout=120)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    return json.loads(out.read_text())


def test_a_profile_the_runner_validated_is_used_as_given(tmp_path):
    # rgt_profile names no profile file: a lookup would fail; rgt_profile_data wins without one
    seen = _play(tmp_path, {"rgt_profile": "no-such-profile", "rgt_profile_data": {"name": "validated-once"},
                            "rgt_job": {"name": "job-a"}})
    assert seen == {"profile": "validated-once", "project": "rgt", "run_id": "job-a"}


def test_without_the_runner_the_named_profile_is_loaded_and_the_defaults_are_one_set(tmp_path):
    assert _play(tmp_path, {"rgt_profile": "runpod", "rgt_project": "p1",
                            "rgt_job": {"name": "job-a", "run_id": "run-b"}}) == {
        "profile": "runpod", "project": "p1", "run_id": "run-b"}
    # nothing named: generic_ssh, project rgt, no run (null, which the roles that need a run refuse by name)
    assert _play(tmp_path, {}) == {"profile": "generic_ssh", "project": "rgt", "run_id": None}


def test_the_runner_passes_each_hosts_validated_profile_in_its_own_inventory_source(tmp_path):
    host = Host(name="box", vars={"rgt_profile": "runpod"}, profile={"name": "runpod", "roots": {}})
    # and the identity of its pinned host key (a reused probe must have met the same one): none pinned, none
    assert _overlay_vars(host, str(tmp_path)) == {"rgt_profile_data": {"name": "runpod", "roots": {}},
                                                  "rgt_pin_id": ""}


def test_only_the_runner_passes_a_validated_profile(tmp_path):
    from rgt.errors import InputError
    from rgt.inventory import load_hosts

    inv = tmp_path / "hosts.yml"
    inv.write_text(yaml.safe_dump({"all": {"hosts": {"box": {
        "rgt_profile": "runpod", "rgt_instance_id": "pod1", "rgt_profile_data": {"name": "unvalidated"}}}}}))
    with pytest.raises(InputError) as err:
        load_hosts(str(inv))
    assert err.value.field == "rgt_profile_data"
