"""rgt.sshround: the ssh argv a status round builds (the connection Ansible would use, plus the strict pin and a
ControlMaster per pinned identity), the zipapp of the monitor module's code (named by its content hash, shipped
once, reused, shipped again when the code changes), and the arguments derived once for the role and the round."""

import json
import os
import sys
import time
from pathlib import Path

import pytest
import yaml

from rgt import bundle, paths, sshround
from rgt.inventory import Host

REPO = Path(__file__).resolve().parents[2]
CFG = sshround.SshConfig(ssh_args=["-o", "ControlMaster=auto", "-o", "ControlPersist=120s", "-o",
                                   "StrictHostKeyChecking=yes", "-o", "ConnectTimeout=15"],
                         control_path_dir="/tmp/rgt-cp-test", timeout=20)


def ssh_host(name="gpu1", **hv):
    base = {"ansible_host": "203.0.113.7", "ansible_port": 2222, "ansible_user": "root",
            "ansible_ssh_private_key_file": "/keys/id_ed25519", "rgt_instance_id": "pod-abc", "rgt_profile": "runpod",
            "rgt_job": {"name": "exp1"}}
    return Host(name=name, vars={**base, **hv}, profile={"roots": {"durable": "/workspace"}})


def options(argv):
    """{option: value} of every `-o Option=value` (first value wins, as in ssh)."""
    out = {}
    for i, arg in enumerate(argv):
        if arg == "-o":
            key, _, value = argv[i + 1].partition("=")
            out.setdefault(key, value)
    return out


def test_argv_has_the_strict_pin_port_key_user_and_a_control_path(tmp_path):
    inv = tmp_path / "inv"
    inv.mkdir()
    target = sshround.target_for(str(inv), ssh_host(), {}, CFG)
    argv = target.argv
    assert argv[0] == "ssh" and argv[-1] == "203.0.113.7"
    opts = options(argv)
    assert opts["StrictHostKeyChecking"] == "yes"
    assert opts["UserKnownHostsFile"] == str(inv.resolve() / "known_hosts")
    assert opts["HostKeyAlias"] == "pod-abc"
    assert opts["Port"] == "2222" and opts["User"] == "root"
    assert opts["IdentityFile"] == '"/keys/id_ed25519"'
    assert opts["BatchMode"] == "yes" and opts["ControlMaster"] == "auto" and opts["ControlPersist"] == "120s"
    assert opts["ConnectTimeout"] == "15"  # ansible.cfg's ssh_args come first, as in Ansible
    assert opts["ControlPath"] == target.control_path and target.control_path.startswith("/tmp/rgt-cp-test/rgt-")
    assert not any("exp1" in a for a in argv)  # nothing of the job in argv


def test_a_host_with_its_own_known_hosts_and_common_args(tmp_path):
    host = ssh_host(rgt_known_hosts=str(tmp_path / "pins"), ansible_ssh_common_args="-o ProxyJump=bastion")
    opts = options(sshround.target_for(str(tmp_path), host, {}, CFG).argv)
    assert opts["UserKnownHostsFile"] == str(tmp_path / "pins")
    assert opts["ProxyJump"] == "bastion"


def test_common_args_cannot_loosen_the_pin_because_ssh_keeps_the_first_value(tmp_path):
    host = ssh_host(ansible_ssh_common_args="-o StrictHostKeyChecking=yes -o UserKnownHostsFile=/x/kh")
    argv = sshround.target_for(str(tmp_path), host, {"ansible_ssh_extra_args": "-o StrictHostKeyChecking=no"},
                               CFG).argv
    assert options(argv)["StrictHostKeyChecking"] == "yes"
    pin = argv.index("HostKeyAlias=pod-abc")
    assert argv.index("-o", argv.index("StrictHostKeyChecking=no") - 1) > pin


def test_another_pin_on_the_same_address_never_shares_a_control_master(tmp_path):
    a = sshround.target_for(str(tmp_path), ssh_host(), {}, CFG)
    b = sshround.target_for(str(tmp_path), ssh_host(rgt_instance_id="pod-xyz"), {}, CFG)
    again = sshround.target_for(str(tmp_path), ssh_host(), {}, CFG)
    assert a.control_path != b.control_path
    assert a.control_path == again.control_path  # the next tick reuses the master


def test_ansible_cfg_ssh_args_are_read_from_the_runners_config():
    cfg = sshround.ssh_config(paths.ANSIBLE_CFG, env={})
    assert "ControlMaster=auto" in cfg.ssh_args and "StrictHostKeyChecking=yes" in cfg.ssh_args
    assert cfg.timeout == 20 and cfg.control_path_dir == "~/.ansible/cp"


def test_local_host_runs_without_ssh(tmp_path):
    host = Host(name="me", vars={"ansible_connection": "local", "ansible_python_interpreter": sys.executable,
                                 "rgt_instance_id": "localhost"})
    target = sshround.target_for(str(tmp_path), host, {}, CFG)
    assert target.local and target.argv == [] and target.python == sys.executable
    assert sshround.command_argv(target, "true") == ["sh", "-c", "true"]


def test_templated_connection_values_other_plugins_and_passwords_are_left_to_ansible(tmp_path):
    with pytest.raises(ValueError, match="ansible_host is a template"):
        sshround.target_for(str(tmp_path), ssh_host(ansible_host="{{ lookup('env', 'BOX') }}"), {}, CFG)
    with pytest.raises(ValueError, match="community.docker.docker"):
        sshround.target_for(str(tmp_path), ssh_host(ansible_connection="community.docker.docker"), {}, CFG)
    with pytest.raises(ValueError, match="password"):
        sshround.target_for(str(tmp_path), ssh_host(ansible_password="hunter2"), {}, CFG)
    assert not sshround.can_round(str(tmp_path), ssh_host(ansible_connection="kubectl"), {})
    assert sshround.can_round(str(tmp_path), ssh_host(ansible_connection="ssh"), {})


# ---------------------------------------------------------------- the arguments, derived once

def test_status_arguments_follow_the_role_defaults():
    statusdoc = paths.module_util("rgt_statusdoc")
    defaults = yaml.safe_load((REPO / "roles" / "monitor" / "defaults" / "main.yml").read_text())
    assert defaults["monitor_log_tail_kb"] == statusdoc.LOG_TAIL_KB
    assert defaults["monitor_history_kb"] == statusdoc.HISTORY_KB
    assert defaults["monitor_mounts"] == [] and defaults["monitor_other_run_ids"] == []
    host = ssh_host(rgt_job={"name": "exp1", "run_id": "exp1-b"})
    host.other_runs = ["old"]
    assert sshround.status_params(host) == {
        "durable_root": "/workspace", "project": "rgt", "run_id": "exp1-b", "mounts": [], "log_tail_kb": 256,
        "history_kb": 1024, "other_run_ids": ["old"]}
    over = ssh_host(rgt_durable_root="/data", rgt_project="p", monitor_mounts=["/data"], monitor_history_kb=0)
    params = sshround.status_params(over)
    assert (params["durable_root"], params["project"], params["run_id"], params["mounts"],
            params["history_kb"]) == ("/data", "p", "exp1", ["/data"], 0)


# ---------------------------------------------------------------- the zipapp on the box

def local_target():
    host = Host(name="me", vars={"ansible_connection": "local", "ansible_python_interpreter": sys.executable,
                                 "rgt_instance_id": "localhost"})
    return sshround.target_for("/nonexistent", host, {}, CFG)


def test_zipapp_is_shipped_once_reused_and_reshipped_when_the_hash_changes(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    cache = tmp_path / "cache" / "rgt"
    params = {"op": "status", "durable_root": str(tmp_path / "durable"), "project": "rgt", "run_id": "r1",
              "history_kb": 0}
    stdin = (json.dumps(params) + "\n").encode()
    target = local_target()
    first = sshround.run_cached(target, stdin)
    assert first.rc == 0, first.stderr
    assert json.loads(first.stdout)["status"]["state"] == "not_started"
    digest, _data = bundle.status_zipapp()
    cached = cache / f"status-{digest}"

    def box_side():  # the box's copies (on a local host the controller's own caches live beside them)
        return sorted(p.name for p in cache.iterdir() if "status-" in p.name)

    assert box_side() == [cached.name]  # no temp directory left behind
    for name, text in bundle.lib().build("status").files.items():
        assert (cached / name).read_bytes() == text.encode(), name
    assert list(cached.rglob("__pycache__/*.pyc")), "the module_utils' bytecode is kept beside them"
    stamp = (cached / "__main__.py").stat()
    second = sshround.run_cached(target, stdin)
    again = (cached / "__main__.py").stat()
    assert second.rc == 0 and (again.st_ino, again.st_mtime_ns) == (stamp.st_ino, stamp.st_mtime_ns)
    stale = cache / "status-0123456789abcdef0123"  # a version last shipped 8 days ago
    (stale / "x").mkdir(parents=True)
    os.utime(stale, (time.time() - 8 * 86400,) * 2)
    status = bundle.lib().build("status")
    files = dict(status.files)
    files["__main__.py"] += "\n# another version of the code\n"
    monkeypatch.setattr(bundle, "_ZIPAPP", bundle.lib().zipapp(status._replace(files=files)))
    third = sshround.run_cached(target, stdin)
    assert third.rc == 0
    assert box_side() == sorted([cached.name, f"status-{bundle.status_zipapp()[0]}"])


def test_a_bad_run_id_is_refused_before_any_connection(tmp_path):
    host = ssh_host(rgt_job={"name": "../etc"})
    host.vars["ansible_host"] = "192.0.2.1"  # TEST-NET: would hang if it were contacted
    out = sshround.status_round(str(tmp_path), [host], {})
    assert out["gpu1"].status is None and not out["gpu1"].unreachable
    assert "run id '../etc' is not allowed" in out["gpu1"].error
