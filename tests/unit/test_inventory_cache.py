"""The inventory is parsed once while its files are unchanged: once per process (lifecycle runs several plays,
watch polls) and, for a static inventory, once across processes (each rgt-run status is a process). A real
ansible-inventory behind a counting shim on PATH."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from rgt.inventory import load_hosts

REAL = Path(sys.executable).parent / "ansible-inventory"

pytestmark = pytest.mark.skipif(not REAL.exists(), reason="needs .venv with ansible-core")


@pytest.fixture
def counted(tmp_path, monkeypatch):
    shim_dir = tmp_path / "shim"
    shim_dir.mkdir()
    calls = tmp_path / "calls"
    shim = shim_dir / "ansible-inventory"
    shim.write_text(f'#!/bin/sh\necho x >> "{calls}"\nexec "{REAL}" "$@"\n')
    shim.chmod(0o755)
    monkeypatch.setenv("PATH", f"{shim_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    return lambda: len(calls.read_text().splitlines()) if calls.exists() else 0


def _inventory(tmp_path: Path) -> Path:
    inv = tmp_path / "inv" / "hosts.yml"
    (inv.parent / "group_vars").mkdir(parents=True)
    inv.write_text(yaml.safe_dump({"all": {"hosts": {"box": {"rgt_profile": "runpod", "rgt_instance_id": "pod1"}}}}))
    (inv.parent / "group_vars" / "all.yml").write_text(yaml.safe_dump({"rgt_project": "first"}))
    return inv


def test_one_parse_while_nothing_changed_and_a_new_parse_after_a_change(tmp_path, counted):
    inv = _inventory(tmp_path)
    for _ in range(3):
        (host,) = load_hosts(str(inv))
        assert host.vars["rgt_project"] == "first"
    assert counted() == 1
    # a changed group_vars file is seen at once
    (inv.parent / "group_vars" / "all.yml").write_text(yaml.safe_dump({"rgt_project": "second-one"}))
    (host,) = load_hosts(str(inv))
    assert host.vars["rgt_project"] == "second-one" and counted() == 2
    # a new host_vars file too
    (inv.parent / "host_vars").mkdir()
    (inv.parent / "host_vars" / "box.yml").write_text(yaml.safe_dump({"rgt_project": "third"}))
    (host,) = load_hosts(str(inv))
    assert host.vars["rgt_project"] == "third" and counted() == 3


def test_a_caller_changing_what_it_got_does_not_change_the_next_answer(tmp_path, counted):
    inv = _inventory(tmp_path)
    (host,) = load_hosts(str(inv), extravars={"rgt_project": "from-e"})
    assert host.vars["rgt_project"] == "from-e"
    host.vars["rgt_job"] = {"name": "mutated"}
    (again,) = load_hosts(str(inv))
    assert again.vars["rgt_project"] == "first" and "rgt_job" not in again.vars and counted() == 1


def _in_a_new_process(inv: Path) -> str:
    code = "from rgt.inventory import load_hosts; print(load_hosts(%r)[0].vars['rgt_project'])" % str(inv)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()


def test_a_static_inventory_is_parsed_once_across_processes_until_a_file_changes(tmp_path, counted):
    inv = _inventory(tmp_path)
    assert [_in_a_new_process(inv) for _ in range(3)] == ["first"] * 3
    assert counted() == 1
    cached = list((tmp_path / "cache" / "rgt" / "inventory").glob("*.json"))
    assert len(cached) == 1 and cached[0].stat().st_mode & 0o777 == 0o600
    (inv.parent / "group_vars" / "all.yml").write_text(yaml.safe_dump({"rgt_project": "changed"}))
    assert _in_a_new_process(inv) == "changed" and counted() == 2


def test_an_inventory_script_or_plugin_config_is_asked_every_time(tmp_path, counted):
    script = tmp_path / "inv.py"
    script.write_text("#!%s\nimport json\nprint(json.dumps({'all': {'hosts': ['box']}, '_meta': {'hostvars': "
                      "{'box': {'rgt_profile': 'runpod', 'rgt_instance_id': 'pod1'}}}}))\n" % sys.executable)
    script.chmod(0o755)
    for _ in range(2):
        _in_a_new_process_default(script)
    assert counted() == 2
    plugin = tmp_path / "aws_ec2.yml"
    plugin.write_text("plugin: amazon.aws.aws_ec2\n")
    from rgt.inventory import _static

    assert not _static(plugin) and not _static(script) and _static(_inventory(tmp_path / "x"))


def _in_a_new_process_default(inv: Path) -> None:
    code = "from rgt.inventory import load_hosts; load_hosts(%r)" % str(inv)
    subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
