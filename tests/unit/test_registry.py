"""The registries of detach primitives and meter-stop verbs (plugins/module_utils/rgt_registry.py) are the one home:
every shipped profile names registered ones, each built one has its class in its table (rgt_detach.DETACHES,
rgt_meterstop.STOPS, rgt_cloud.CLIENTS) and each class its entry, no code dispatches by a name built from a string,
no other file keeps a list of the names, a profile naming an unregistered one is refused when loaded (field named),
and a launch through one that is registered but not built is refused (field named, what to use instead)."""

from __future__ import annotations

import copy
import importlib
import json
import re
from pathlib import Path

import pytest
import yaml
from rich.console import Console

from ansible_collections.rgt.remote_gpu.plugins.module_utils import rgt_cloud, rgt_detach, rgt_meterstop
from rgt import paths, profiles

REPO = Path(__file__).resolve().parents[2]
reg = paths.module_util("rgt_registry")

SHIPPED = profiles.profile_names()


def raw(name: str) -> dict:
    return yaml.safe_load((REPO / "profiles" / f"{name}.yml").read_text(encoding="utf-8"))


def write(tmp_path: Path, data: dict) -> str:
    (tmp_path / f"{data['name']}.yml").write_text(yaml.safe_dump(data, allow_unicode=True), encoding="utf-8")
    return data["name"]


# --- the registry covers what the profiles name ----------------------------------------------------------


@pytest.mark.parametrize("name", SHIPPED)
def test_every_shipped_profile_names_registered_primitives_and_verbs(name):
    p = profiles.load_profile(name)
    assert reg.detach(p["detach"]["primitive"]) is not None
    assert p["detach"]["fallback"] is None or reg.detach(p["detach"]["fallback"]) is not None
    stop = reg.meter_stop(reg.meter_stop_of(p["meter_stop"]))
    assert stop is not None and stop.built, p["meter_stop"]
    assert reg.profile_problems(p) == []


def test_the_engines_not_built_yet_are_registered_and_say_what_to_use_instead():
    for name in ("vast-onstart",):
        entry = reg.detach(name)
        assert entry is not None and entry.built is False and name not in rgt_detach.DETACHES and entry.instead
    assert [e.name for e in reg.DETACH_PRIMITIVES if e.built] == ["tmux", "nohup", "sbatch", "k8s-job"]
    assert "sbatch" in rgt_detach.DETACHES and reg.detach("k8s-job").runs_on == "controller"
    assert reg.meter_stop_of(raw("slurm")["meter_stop"]) == "scancel"
    assert reg.meter_stop_of(raw("kubernetes")["meter_stop"]) == "delete_job"
    assert reg.meter_stop_of(raw("runpod")["meter_stop"]) == "runpod_rest"
    assert reg.meter_stop_of(raw("generic_ssh")["meter_stop"]) == "manual"
    assert reg.meter_stop_of(raw("local")["meter_stop"]) == "none"


def test_each_entry_says_what_it_needs():
    assert reg.detach("tmux").needs() == "tmux on the box"
    assert "sbatch" in reg.detach("sbatch").needs() and "job spec slurm" in reg.detach("sbatch").needs()
    assert "KUBECONFIG" in reg.detach("k8s-job").needs()
    assert "meter_stop.api.key_env" in reg.meter_stop("vast_rest").needs()
    assert "scancel" in reg.meter_stop("scancel").needs()
    json.dumps(reg.table())  # serialisable for --json


# --- one home: implementations follow the registry, nobody else lists the names --------------------------


def test_every_built_detach_primitive_has_its_class_and_every_class_its_entry():
    for entry in reg.DETACH_PRIMITIVES:
        assert (entry.name in rgt_detach.DETACHES) == entry.built, entry.name
    for name, cls in rgt_detach.DETACHES.items():
        entry = reg.detach(name)
        assert entry is not None and entry.built and cls.name == name, name
        assert issubclass(cls, rgt_detach.Detach) and rgt_detach.get(name).entry is entry
        # one that runs on the controller (k8s-job) says so: its class names the runner's function that starts it
        assert (cls.started_by is not None) == (entry.runs_on == "controller"), name
        if cls.started_by:
            module, _, function = cls.started_by.rpartition(".")
            assert callable(getattr(importlib.import_module(module), function)), cls.started_by
        # a primitive that runs sweeps as a job array submits it (the others start the sweep's queue)
        assert (entry.sweeps == "array") == hasattr(cls, "submit_array"), name
    assert rgt_detach.get(reg.AUTO) is None and rgt_detach.get("vast-onstart") is None
    # the launch role on a box refuses a primitive the controller starts, naming the command that does
    field, message, fix = reg.launch_problem("k8s-job", where="box")
    assert field == "detach.primitive" and "from the controller" in message and "rgt-run train" in fix
    assert reg.launch_problem("k8s-job") is None


def test_every_meter_stop_verb_has_its_class_and_every_class_its_entry():
    for entry in reg.METER_STOPS:
        assert entry.built, entry.name
        stop = rgt_meterstop.stop_of(entry)
        assert isinstance(stop, rgt_meterstop.MeterStop)
        assert stop.name == (rgt_meterstop.API if entry.api else entry.name), entry.name
    assert set(rgt_meterstop.STOPS) == {e.name for e in reg.METER_STOPS if not e.api} | {rgt_meterstop.API}
    for name, cls in rgt_meterstop.STOPS.items():
        assert cls.name == name and issubclass(cls, rgt_meterstop.MeterStop), name
    # the API verbs: one client class each, keyed by the registry's name
    assert set(rgt_cloud.CLIENTS) == {e.name for e in reg.api_clients()}
    for name, cls in rgt_cloud.CLIENTS.items():
        assert cls.name == name and issubclass(cls, rgt_cloud.Client), name


def test_nothing_dispatches_by_a_name_built_from_a_string():
    """No `globals()[...]`, `globals().get(...)` of a name (a dunder like `__loader__` is no dispatch), nor a
    `getattr(..., "start_" ...)` style lookup, in the collection or the runner."""
    built = re.compile(r"""globals\(\)\s*(?:\[|\.get\()(?!\s*["']__\w+__["']\s*\))"""
                       r"""|getattr\([^)\n]*["'](?:start|stop|live|wait)_""")
    offenders = []
    for top in ("plugins", "runner/rgt"):
        for path in (REPO / top).rglob("*.py"):
            text = path.read_text(encoding="utf-8", errors="replace")
            offenders += [f"{path.relative_to(REPO)}: {m.group(0)}" for m in built.finditer(text)]
    assert offenders == []


def test_the_profile_schema_keeps_no_second_list_of_the_names():
    schema = json.loads((REPO / "profiles" / "schema" / "profile.schema.json").read_text(encoding="utf-8"))
    det = schema["properties"]["detach"]["properties"]
    ms = schema["properties"]["meter_stop"]["properties"]
    for node in (det["primitive"], det["fallback"], ms["verb"], ms["api"]["properties"]["client"],
                 ms["alternatives"]["items"]["properties"]["verb"]):
        assert "enum" not in node and "registered" in node["description"], node


def test_no_code_outside_the_registry_spells_a_registered_name_as_a_literal():
    """Besides the registry, a name is spelled once more only as the `name` of the class that implements it, in its
    table's module (held to the registry by the tests above)."""
    distinctive = [e.name for e in reg.DETACH_PRIMITIVES if e.name not in ("tmux", "nohup")]
    distinctive += [e.name for e in reg.api_clients()]
    home = REPO / reg.HOME
    tables = {REPO / "plugins" / "module_utils" / "rgt_detach.py": rgt_detach.DETACHES,
              REPO / "plugins" / "module_utils" / "rgt_cloud.py": rgt_cloud.CLIENTS}
    offenders = []
    for top in ("plugins", "runner", "roles", "playbooks"):
        for path in (REPO / top).rglob("*"):
            if path.suffix not in (".py", ".yml", ".yaml", ".json") or path == home or "__pycache__" in path.parts:
                continue
            text = path.read_text(encoding="utf-8", errors="replace")
            for name in distinctive:
                spelled = len(re.findall(r"""["']%s["']""" % re.escape(name), text))
                bound = len(re.findall(r"""^    name = ["']%s["']$""" % re.escape(name), text, re.M))
                if spelled != (bound if name in tables.get(path, {}) else 0) or bound > 1:
                    offenders.append(f"{path.relative_to(REPO)}: {name}")
    assert offenders == []


# --- refused at input: a name that is not registered -------------------------------------------------------


@pytest.mark.parametrize("edit, field, word", [
    (lambda d: d["detach"].update(primitive="screen"), "detach.primitive", "'screen' is not a registered detach"),
    (lambda d: d["detach"].update(fallback="none"), "detach.fallback", "'none' is not a registered detach"),
    (lambda d: d["meter_stop"].update(verb="hibernate"), "meter_stop.verb", "'hibernate' is not a registered"),
    (lambda d: d["meter_stop"]["api"].update(client="gcp_rest"), "meter_stop.api.client", "'gcp_rest' is not a"),
    (lambda d: d["meter_stop"]["alternatives"][0].update(verb="nap"), "meter_stop.alternatives[0].verb", "'nap'"),
])
def test_a_profile_naming_an_unregistered_primitive_or_verb_is_refused_with_the_field(tmp_path, edit, field, word):
    data = copy.deepcopy(raw("runpod"))
    edit(data)
    name = write(tmp_path, data)
    with pytest.raises(profiles.ProfileError) as info:
        profiles.load_profile(name, profiles_dir=tmp_path)
    err = info.value
    assert err.field == field and word in err.message, err.describe()
    assert "use one of:" in err.fix and "rgt_registry.py" in err.fix
    assert str(tmp_path / "runpod.yml") in str(err)
    assert [e.field for e in profiles.validate_profile_data(data, "x")] == [field]


def test_the_roles_lookup_refuses_the_same_profile(tmp_path):
    from ansible.errors import AnsibleError

    from ansible_collections.rgt.remote_gpu.plugins.lookup.profile import LookupModule

    data = copy.deepcopy(raw("local"))
    data["detach"]["primitive"] = "screen"
    write(tmp_path, data)
    with pytest.raises(AnsibleError) as info:
        LookupModule().run(["local"], profiles_dir=str(tmp_path))
    text = str(info.value)
    assert "field detach.primitive" in text and "'screen' is not a registered detach primitive" in text
    assert "Fix: use one of: tmux, nohup, sbatch, k8s-job, vast-onstart (not built yet)" in text


# --- refused before a launch: registered but not built -----------------------------------------------------


@pytest.mark.parametrize("name, primitive", [("vastai", "vast-onstart")])
def test_a_launch_through_an_unbuilt_primitive_is_refused_naming_the_field_and_what_to_use(name, primitive):
    profile = profiles.load_profile(name)
    profile = {**profile, "detach": {**profile["detach"], "primitive": primitive, "fallback": None}}
    err = profiles.launch_problem(profile)
    assert err is not None and err.field == "detach.primitive"
    assert f"'{primitive}'" in err.message and "not built yet" in err.message
    assert "never runs the job under another primitive" in err.message
    assert reg.detach(primitive).instead[:40] in err.fix and f"profile {name}" in str(err)


@pytest.mark.parametrize("name", SHIPPED)
def test_profiles_with_built_primitives_may_launch(name):
    assert profiles.launch_problem(profiles.load_profile(name)) is None


def test_an_unbuilt_fallback_is_refused_too_and_auto_is_tmux_then_nohup():
    assert reg.launch_problem("tmux", "vast-onstart")[0] == "detach.fallback"
    assert reg.launch_problem("screen")[0] == "detach.primitive"
    assert "not a registered" in reg.launch_problem("screen")[1]
    assert reg.launch_problem("auto") is None and reg.launch_problem("tmux", "nohup") is None
    assert reg.AUTO_MEANS == ("tmux", "nohup")


def test_profiles_show_says_which_primitive_and_verb_and_whether_built():
    console = Console(record=True, width=200)
    profiles.render_show(console, profiles.load_profile("slurm"))
    text = console.export_text()
    assert "Detach: sbatch (no fallback)" in text
    assert "Meter stopped by: scancel — needs scancel, scontrol on the login node" in text
    console = Console(record=True, width=200)
    profiles.render_show(console, profiles.load_profile("runpod"))
    text = console.export_text()
    assert "Detach: tmux (fallback nohup)" in text and "Meter stopped by: runpod_rest" in text
    doc = profiles.profile_as_json(profiles.load_profile("slurm"))
    assert doc["engines"]["detach"]["name"] == "sbatch" and doc["engines"]["detach"]["built"] is True
    assert doc["engines"]["meter_stop"]["name"] == "scancel" and doc["engines"]["meter_stop"]["built"] is True


def test_the_teardown_role_alone_deletes_no_kubernetes_job():
    """Only the runner knows a kubernetes host's run Jobs (rgt.k8s_run, from the ledger): the role's delete_job
    calls nothing (never a Job named after the instance id) and says what does."""
    record = {}
    assert rgt_meterstop.stop_of(reg.meter_stop("delete_job")).stop(None, record, None, None, None) is False
    assert record["final_state"].startswith("manual") and "rgt-run teardown" in record["final_state"]
