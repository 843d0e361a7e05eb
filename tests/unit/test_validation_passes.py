"""A schema validation's pass is remembered between processes (rgt.ledger.pass_key, under ~/.cache/rgt/passes/),
so a fresh `rgt-run status` imports no jsonschema for an inventory, profile and job spec it validated before. A
remembered pass never hides an edit: the edited file is validated again and refused with the same message (exit 2)
as with no remembered pass at all; a refusal is never remembered; a document that holds anything but JSON's own
types is validated every time."""

from __future__ import annotations

import datetime
import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from rgt import cli, errors, inventory, ledger, profiles
from rgt.errors import InputError

REAL = Path(sys.executable).parent / "ansible-inventory"
needs_ansible = pytest.mark.skipif(not REAL.exists(), reason="needs .venv with ansible-core")
PROFILE = Path(profiles.PROFILES_DIR) / "runpod.yml"


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """A cache of this test's own (the passes and the parsed inventories); returns a switch to a fresh one, which
    gives the verdict of a process that never validated anything."""
    state = {"n": 0}

    def fresh() -> Path:
        state["n"] += 1
        where = tmp_path / f"cache{state['n']}"
        monkeypatch.setenv("XDG_CACHE_HOME", str(where))
        profiles.clear_cache()  # the module_util's per-process cache: each step reads as a new process
        return where

    fresh()
    return fresh


def _passes(where: Path) -> list[Path]:
    return sorted((where / "rgt" / "passes").glob("*.ok"))


def _inventory(tmp_path: Path, **extra) -> Path:
    inv = tmp_path / "inv" / "hosts.yml"
    inv.parent.mkdir(parents=True, exist_ok=True)
    host = {"rgt_profile": "runpod", "rgt_instance_id": "pod1", **extra}
    inv.write_text(yaml.safe_dump({"all": {"hosts": {"box": host}}}))
    return inv


def _refusal(call) -> InputError:
    with pytest.raises(InputError) as caught:
        call()
    assert caught.value.exit_code == errors.BAD_INPUT == 2
    return caught.value


@needs_ansible
def test_an_inventory_that_passed_is_not_validated_again_while_unchanged(tmp_path, cache, monkeypatch):
    inv = _inventory(tmp_path)
    inventory.load_hosts(str(inv))
    assert _passes(tmp_path / "cache1")  # the host's variables and the profile

    def no_validator(*_a, **_k):
        raise AssertionError("validated again")

    monkeypatch.setattr(inventory, "_validator", no_validator)
    monkeypatch.setattr(profiles._core, "validate_profile_data", no_validator)
    profiles.clear_cache()
    (host,) = inventory.load_hosts(str(inv))
    assert host.vars["rgt_instance_id"] == "pod1"


@needs_ansible
def test_a_remembered_pass_does_not_hide_an_edited_inventory(tmp_path, cache, capsys):
    inv = _inventory(tmp_path)
    inventory.load_hosts(str(inv))
    assert _passes(tmp_path / "cache1")
    _inventory(tmp_path, rgt_surprise=1)  # the same host, edited: a key the schema does not allow
    remembered = _refusal(lambda: inventory.load_hosts(str(inv)))
    cache()  # no pass remembered at all: the verdict of a process that never validated anything
    alone = _refusal(lambda: inventory.load_hosts(str(inv)))
    assert remembered.message == alone.message and remembered.fix == alone.fix
    assert "rgt_surprise" in remembered.message
    # through the command: exit 2, the same message, no box contacted (the refusal comes before any)
    inventory.load_hosts(str(_inventory(tmp_path)))  # passed again, then edited again
    _inventory(tmp_path, rgt_surprise=1)
    capsys.readouterr()
    assert cli.main(["status", "-i", str(inv), "--json", "--ledger", str(tmp_path / "ledger")]) == 2
    doc = json.loads(capsys.readouterr().out)
    assert (doc["error"], doc["fix"], doc["exit_code"]) == (alone.message, alone.fix, 2)


def test_a_remembered_pass_does_not_hide_an_edited_profile(tmp_path, cache, monkeypatch):
    mine = tmp_path / "profiles"
    mine.mkdir()
    monkeypatch.setenv("RGT_PROFILES_DIR", str(mine))
    (mine / "runpod.yml").write_bytes(PROFILE.read_bytes())
    assert profiles.load_profile("runpod")["name"] == "runpod"
    assert _passes(tmp_path / "cache1")
    doc = yaml.safe_load(PROFILE.read_text())
    doc["kind"] = "not-a-kind"  # one field edited, the rest as it passed
    (mine / "runpod.yml").write_text(yaml.safe_dump(doc))
    profiles.clear_cache()
    with pytest.raises(profiles.ProfileError) as remembered:
        profiles.load_profile("runpod")
    cache()
    with pytest.raises(profiles.ProfileError) as alone:
        profiles.load_profile("runpod")
    assert str(remembered.value) == str(alone.value) and remembered.value.field == alone.value.field == "kind"
    assert not _passes(tmp_path / "cache2")  # a refusal is never remembered


def test_a_profile_that_is_no_yaml_is_refused_with_the_python_parsers_message(tmp_path, cache, monkeypatch):
    mine = tmp_path / "profiles"
    mine.mkdir()
    monkeypatch.setenv("RGT_PROFILES_DIR", str(mine))
    (mine / "runpod.yml").write_text("name: runpod\nkind: [rental\n")
    with pytest.raises(profiles.ProfileError) as caught:
        profiles.load_profile("runpod")
    try:
        yaml.safe_load("name: runpod\nkind: [rental\n")
    except yaml.YAMLError as exc:
        assert str(exc) in caught.value.message and "line 3, column 1" in caught.value.message


def test_a_remembered_pass_does_not_hide_an_edited_job_spec(tmp_path, cache):
    code = tmp_path / "code"
    code.mkdir()
    job = {"name": "tiny", "command": "python train.py", "code_dir": str(code)}
    inventory.validate_job(dict(job))
    assert _passes(tmp_path / "cache1")
    edited = {**job, "outputs": "weights.bin"}  # a string where the schema wants a list
    remembered = _refusal(lambda: inventory.validate_job(dict(edited)))
    cache()
    alone = _refusal(lambda: inventory.validate_job(dict(edited)))
    assert (remembered.message, remembered.fix, remembered.field) == (alone.message, alone.fix, alone.field)
    assert remembered.field == "rgt_job.outputs"


def test_the_key_changes_with_the_document_the_checker_and_the_kind():
    doc = {"rgt_profile": "runpod", "rgt_instance_id": "pod1"}
    key = ledger.pass_key("inventory_host", doc, b"schema-1")
    assert key == ledger.pass_key("inventory_host", dict(reversed(doc.items())), b"schema-1")  # key order: same
    assert key != ledger.pass_key("inventory_host", {**doc, "rgt_instance_id": "pod2"}, b"schema-1")
    assert key != ledger.pass_key("inventory_host", doc, b"schema-2")  # an edited schema or validator
    assert key != ledger.pass_key("job", doc, b"schema-1")
    assert ledger.pass_key("x", {"n": 1}, b"") != ledger.pass_key("x", {"n": True}, b"")
    assert ledger.pass_key("x", {"n": 1}, b"") != ledger.pass_key("x", {"n": 1.0}, b"")


@pytest.mark.parametrize("doc", [{"when": datetime.date(2026, 1, 1)}, {"env": {1: "x"}}, {"xs": (1, 2)},
                                 {"s": type("S", (str,), {})("x")}])
def test_a_document_with_more_than_json_types_is_validated_every_time(doc):
    """Its JSON text would not say what the validator saw (a date reads as a string, an int key as a string key)."""
    assert ledger.pass_key("job", doc, b"") is None
    assert not ledger.passed_before(None)


@needs_ansible
def test_a_second_process_imports_neither_yaml_nor_jsonschema_for_what_passed_before(tmp_path, cache):
    """What a fresh `rgt-run status` pays at its start: the inventory, the profile and their passes come from the
    cache (the start-up cost itself is measured by bench/status_bench.py, never asserted)."""
    inv = _inventory(tmp_path)
    code = ("import sys; from rgt.inventory import load_hosts; (h,) = load_hosts(%r); "
            "print(h.profile['name'], 'yaml' in sys.modules, 'jsonschema' in sys.modules)" % str(inv))

    def run() -> str:
        return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()

    assert run() == "runpod True True"  # the first one parses and validates
    assert run() == "runpod False False"
    _inventory(tmp_path, rgt_project="edited")
    assert run() == "runpod False True"  # the edited host is validated again; the profile is unchanged
