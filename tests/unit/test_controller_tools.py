"""The programs a command runs on this machine, named before any box is touched (rgt.prepare): rsync for the plays
that move files, ssh for boxes reached over SSH, kubectl for Kubernetes hosts."""

from pathlib import Path

import pytest
import yaml

from rgt import errors, paths, prepare
from rgt.inventory import Host

REPO = Path(__file__).resolve().parents[2]


def host(name, profile, **hv):
    return Host(name=name, vars={"rgt_profile": profile, "rgt_instance_id": name, **hv},
                profile={"name": profile, "detach": {"primitive": "k8s-job" if profile == "kubernetes" else "tmux"}})


LOCAL = host("here", "local", ansible_connection="local")
BOX = host("box", "runpod")
CLUSTER = host("cluster", "kubernetes")


def test_each_command_needs_what_its_plays_run_here():
    assert prepare.controller_tools("train", [LOCAL]) == {"rsync": ["here"]}
    assert prepare.controller_tools("train", [LOCAL, BOX]) == {"ssh": ["box"], "rsync": ["here", "box"]}
    assert prepare.controller_tools("collect", [BOX]) == {"ssh": ["box"], "rsync": ["box"]}
    assert prepare.controller_tools("monitor", [LOCAL, BOX]) == {"ssh": ["box"]}
    assert prepare.controller_tools("smoke", [BOX]) == {}
    assert prepare.controller_tools("monitor", [CLUSTER]) == {"kubectl": ["cluster"]}


def test_a_missing_program_is_an_input_error_naming_it_and_its_debian_package(tmp_path):
    with pytest.raises(errors.InputError) as refused:
        prepare.check_controller_tools("train", [LOCAL, BOX], path=str(tmp_path))
    assert refused.value.exit_code == errors.BAD_INPUT
    assert refused.value.field == "ssh" and "box" in refused.value.message
    assert "apt-get install openssh-client" in refused.value.fix
    (tmp_path / "ssh").write_text("#!/bin/sh\n")
    (tmp_path / "ssh").chmod(0o755)
    with pytest.raises(errors.InputError) as refused:
        prepare.check_controller_tools("train", [LOCAL, BOX], path=str(tmp_path))
    assert refused.value.field == "rsync" and "apt-get install rsync" in refused.value.fix
    (tmp_path / "rsync").write_text("#!/bin/sh\n")
    (tmp_path / "rsync").chmod(0o755)
    prepare.check_controller_tools("train", [LOCAL, BOX], path=str(tmp_path))


def _roles(playbook: Path, seen: set) -> set:
    """The roles a playbook runs, through import_playbook and the roles' meta dependencies."""
    out = set()
    for play in yaml.safe_load(playbook.read_text()) or []:
        if "ansible.builtin.import_playbook" in play:
            out |= _roles(playbook.parent / play["ansible.builtin.import_playbook"], seen)
        for role in play.get("roles") or []:
            out.add((role["role"] if isinstance(role, dict) else role).rsplit(".", 1)[-1])
    todo = list(out)
    while todo:
        meta = REPO / "roles" / todo.pop() / "meta" / "main.yml"
        for dep in (yaml.safe_load(meta.read_text()) or {}).get("dependencies") or [] if meta.is_file() else []:
            name = (dep["role"] if isinstance(dep, dict) else dep).rsplit(".", 1)[-1]
            if name not in out:
                out.add(name)
                todo.append(name)
    return out


def test_every_playbook_whose_roles_run_rsync_is_checked_for_it():
    """The table holds to the roles: a role whose tasks call rsync (rgt_transfer) makes its playbooks need it."""
    movers = {p.parent.parent.name for p in (REPO / "roles").glob("*/tasks/*.yml")
              if "rgt.remote_gpu.rgt_transfer:" in p.read_text()}
    assert movers == {"collect", "upload_resume"}
    needing = {p.stem for p in paths.PLAYBOOKS_DIR.glob("*.yml") if _roles(p, set()) & movers}
    assert needing == set(prepare.RSYNC_PLAYBOOKS)
