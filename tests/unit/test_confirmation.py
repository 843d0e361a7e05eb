"""runner/rgt/confirmation.py: the variables that confirm a meter stop come from the roles themselves (their argument
specs and defaults), and a playbook that carries a meter-stop role is found however it pulls the role in."""

import json
import re
from pathlib import Path

import pytest
import yaml

from rgt import confirmation as cf
from rgt import paths

ROLES = paths.REPO_ROOT / "roles"


@pytest.fixture
def roles_dir(tmp_path, monkeypatch):
    """A roles directory of our own (the derivation reads whatever roles there are)."""
    def clear():
        cf._derived.cache_clear()

    def role(name: str, options: dict) -> None:
        (tmp_path / name / "meta").mkdir(parents=True)
        (tmp_path / name / "defaults").mkdir()
        specs = {"argument_specs": {"main": {"options": {k: {"type": "raw"} for k in options}}}}
        (tmp_path / name / "meta" / "argument_specs.yml").write_text(yaml.safe_dump(specs))
        (tmp_path / name / "defaults" / "main.yml").write_text(yaml.safe_dump(options))
        clear()

    monkeypatch.setattr(cf, "ROLES_DIR", tmp_path)
    clear()
    yield role
    monkeypatch.undo()
    clear()


def test_the_confirmation_variables_are_the_teardown_roles():
    assert cf.confirm_vars() == ("rgt_teardown_confirm", "rgt_teardown_confirms", "teardown_confirm")
    assert cf.meter_stop_roles() == ("teardown",)
    assert cf.CHANNEL in cf.confirm_vars()  # what `rgt-run teardown` passes is one the role reads


def test_a_confirmation_option_and_everything_its_default_reads_are_confirmations(roles_dir):
    roles_dir("wipe", {"wipe_confirm": "{{ rgt_wipe_ok | default(wipe_typed) }}",
                       "wipe_typed": "{{ rgt_typed[inventory_hostname] | default('') }}", "wipe_other": "x"})
    roles_dir("look", {"look_depth": 3})
    assert cf.confirm_vars() == ("rgt_typed", "rgt_wipe_ok", "wipe_confirm", "wipe_typed")
    assert cf.meter_stop_roles() == ("wipe",)
    assert cf.pins() == {"rgt_typed": "", "rgt_wipe_ok": "", "wipe_typed": "",
                         "wipe_confirm": "{{ rgt_wipe_ok | default(wipe_typed) }}"}


def test_the_pins_hold_every_confirmation_to_what_rgt_run_teardown_confirmed():
    pins = cf.pins({"box": "pod-1"})
    assert pins[cf.CHANNEL] == {"box": "pod-1"} and cf.pins()[cf.CHANNEL] == {}
    assert pins["rgt_teardown_confirm"] == ""
    default = yaml.safe_load((ROLES / "teardown" / "defaults" / "main.yml").read_text())["teardown_confirm"]
    assert pins["teardown_confirm"] == default and cf.CHANNEL in default


def test_the_argument_specs_and_the_readme_document_every_confirmation_variable():
    """Held to the docs: the role option and the variables it reads are named where an ops team looks."""
    readme = (ROLES / "teardown" / "README.md").read_text()
    option = yaml.safe_load((ROLES / "teardown" / "meta" / "argument_specs.yml").read_text())[
        "argument_specs"]["main"]["options"]["teardown_confirm"]
    for name in cf.confirm_vars():
        assert name in readme, name
        assert name == "teardown_confirm" or name in " ".join(option["description"]), name


def test_every_confirm_parameter_of_a_role_task_takes_only_confirmation_variables():
    """A confirmation must follow the naming rule to be found: a task that passes another variable as a module's
    `confirm` would be a confirmation the runner does not refuse."""
    seen = 0
    for tasks in ROLES.glob("*/tasks/*.yml"):
        for template in re.findall(r"^\s+confirm:\s*(.+)$", tasks.read_text(), re.M):
            names = cf._names_read(yaml.safe_load(template))
            assert names and names <= set(cf.confirm_vars()), (tasks, template)
            seen += 1
    assert seen


def play(tmp_path: Path, plays: list, name: str = "play.yml") -> Path:
    path = tmp_path / name
    path.write_text(json.dumps(plays))
    return path


def own_role(tmp_path: Path, name: str, tasks: list | None = None, deps: list | None = None) -> None:
    (tmp_path / "roles" / name / "tasks").mkdir(parents=True)
    (tmp_path / "roles" / name / "tasks" / "main.yml").write_text(json.dumps(tasks or [{"debug": {"msg": "hi"}}]))
    if deps is not None:
        (tmp_path / "roles" / name / "meta").mkdir()
        (tmp_path / "roles" / name / "meta" / "main.yml").write_text(json.dumps({"dependencies": deps}))


def test_the_collections_playbooks_other_than_teardown_carry_no_meter_stop(tmp_path):
    """carried_role() knows the collection's own playbooks without reading them: held here, by reading copies."""
    found = {}
    for playbook in paths.PLAYBOOKS_DIR.glob("*.yml"):
        (tmp_path / "playbooks").mkdir(exist_ok=True)
        copy = tmp_path / "playbooks" / playbook.name
        copy.write_text(playbook.read_text())
        found[playbook.stem] = cf.carried_role(copy)
        assert cf.carried_role(playbook) == found[playbook.stem]
    assert found.pop("teardown") == "rgt.remote_gpu.teardown"
    assert set(found.values()) == {None}


def test_the_derivation_is_kept_on_disk_until_the_roles_change(roles_dir, tmp_path):
    roles_dir("wipe", {"wipe_confirm": "{{ rgt_wipe_ok }}"})
    assert cf.confirm_vars() == ("rgt_wipe_ok", "wipe_confirm")
    cf._derived.cache_clear()
    kept = list(cf.cache_path("confirmation", "x").parent.glob("*.json"))
    assert kept and cf.confirm_vars() == ("rgt_wipe_ok", "wipe_confirm")
    defaults = tmp_path / "wipe" / "defaults" / "main.yml"
    defaults.write_text(yaml.safe_dump({"wipe_confirm": "{{ rgt_wipe_really_ok | default('') }}"}))
    cf._derived.cache_clear()
    assert cf.confirm_vars() == ("rgt_wipe_really_ok", "wipe_confirm")


def test_a_copy_of_teardown_yml_carries_the_role(tmp_path):
    copy = tmp_path / "mine.yml"
    copy.write_text((paths.PLAYBOOKS_DIR / "teardown.yml").read_text())
    assert cf.carried_role(copy) == "rgt.remote_gpu.teardown"


@pytest.mark.parametrize("plays", [
    [{"hosts": "all", "roles": ["teardown"]}],  # the bare name: rgt's roles_path
    [{"hosts": "all", "roles": [{"name": "rgt.remote_gpu.teardown", "vars": {"teardown_confirm": "x"}}]}],
    [{"hosts": "all", "post_tasks": [{"block": [{"rescue": [], "always": [
        {"ansible.builtin.include_role": {"name": "rgt.remote_gpu.teardown"}}]}]}]}],
    [{"hosts": "all", "tasks": [{"import_role": "name=rgt.remote_gpu.teardown"}]}],
    [{"ansible.builtin.import_playbook": "rgt.remote_gpu.teardown"}],
    [{"hosts": "all", "tasks": [{"ansible.builtin.import_tasks": "more.yml"}]}],
    [{"hosts": "all", "roles": ["cleanup"]}],  # the user's own role, which depends on it
])
def test_a_play_that_pulls_the_role_in_carries_it(tmp_path, plays):
    (tmp_path / "more.yml").write_text(json.dumps([{"include_role": {"name": "rgt.remote_gpu.teardown"}}]))
    own_role(tmp_path, "cleanup", deps=[{"role": "rgt.remote_gpu.teardown"}])
    assert cf.carried_role(play(tmp_path, plays)) == "rgt.remote_gpu.teardown"


def test_an_imported_copy_carries_it_too(tmp_path):
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "td.yml").write_text((paths.PLAYBOOKS_DIR / "teardown.yml").read_text())
    assert cf.carried_role(play(tmp_path, [{"import_playbook": "sub/td.yml"}])) == "rgt.remote_gpu.teardown"


@pytest.mark.parametrize("plays", [
    [{"hosts": "all", "roles": ["teardown"]}],  # the user's own role named teardown, beside the play
    [{"hosts": "all", "roles": ["rgt.remote_gpu.probe"], "tasks": [{"include_role": {"name": "{{ which }}"}}]}],
    [{"import_playbook": "missing.yml"}, {"hosts": "all", "tasks": [{"command": "teardown"}]}],
])
def test_a_play_without_the_role_does_not(tmp_path, plays):
    own_role(tmp_path, "teardown")
    assert cf.carried_role(play(tmp_path, plays)) is None


def test_a_playbook_that_cannot_be_read_is_left_to_ansible(tmp_path):
    bad = tmp_path / "bad.yml"
    bad.write_text("- hosts: all\n  roles: [teardown\n")
    assert cf.carried_role(bad) is None
    cycle = play(tmp_path, [{"import_playbook": "play.yml"}])
    assert cf.carried_role(cycle) is None
