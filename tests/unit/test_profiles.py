"""Platform profiles: every shipped profile validates and carries the facts the roles rely on; a
broken profile fails with the JSON path of the field and a fix; `rgt-run profiles show` prints the
survival matrix."""

from __future__ import annotations

import copy
import json
import shutil
from pathlib import Path

import jsonschema
import pytest
import yaml
from rich.console import Console

from rgt import profiles

REPO = Path(__file__).resolve().parents[2]
EXPECTED = [
    "autodl",
    "featurize",
    "generic_ssh",
    "gpushare",
    "kubernetes",
    "lambda",
    "lanrui",
    "local",
    "matpool",
    "paperspace",
    "runpod",
    "slurm",
    "vastai",
]
RENTALS = ["autodl", "runpod", "vastai", "matpool", "gpushare", "featurize", "lanrui"]


def mount(profile: dict, path: str) -> dict:
    found = [m for m in profile["mounts"] if m["path"] == path]
    assert found, f"{profile['name']} has no mount {path}"
    return found[0]


def raw(name: str) -> dict:
    return yaml.safe_load((REPO / "profiles" / f"{name}.yml").read_text(encoding="utf-8"))


@pytest.fixture(autouse=True)
def _fresh_cache():
    profiles.clear_cache()
    yield
    profiles.clear_cache()


# --- every profile ---------------------------------------------------------------------------------------


def test_schema_is_valid_draft_2020_12():
    schema = json.loads(profiles.SCHEMA_PATH.read_text(encoding="utf-8"))
    jsonschema.Draft202012Validator.check_schema(schema)


def test_schema_forbids_unknown_keys_and_documents_every_property():
    schema = json.loads(profiles.SCHEMA_PATH.read_text(encoding="utf-8"))

    def walk(node, where):
        if isinstance(node, dict):
            if node.get("type") == "object" or "object" in (node.get("type") or []):
                if "properties" in node:
                    assert node.get("additionalProperties") is False, f"{where} allows unknown keys"
                    for key, sub in node["properties"].items():
                        assert sub.get("description"), f"{where}.{key} has no description"
            for key, sub in node.items():
                walk(sub, f"{where}.{key}")
        elif isinstance(node, list):
            for i, sub in enumerate(node):
                walk(sub, f"{where}[{i}]")

    walk(schema, "schema")


def test_all_thirteen_profiles_are_shipped_and_valid():
    names = [p["name"] for p in profiles.list_profiles()]
    assert names == EXPECTED


@pytest.mark.parametrize("name", EXPECTED)
def test_profile_validates_and_name_matches_file(name):
    assert profiles.validate_profile_data(raw(name), f"{name}.yml", expected_name=name) == []
    assert profiles.load_profile(name)["name"] == name


@pytest.mark.parametrize("name", EXPECTED)
def test_verified_stamp_is_from_the_brief(name):
    assert profiles.load_profile(name)["verified"] == ("none" if name == "local" else "2026-06")


@pytest.mark.parametrize("name", RENTALS)
def test_rentals_never_create_envs_and_keep_secrets_off_shared_storage(name):
    p = profiles.load_profile(name)
    assert p["env_contract"]["never_create_env"] is True
    shared = [
        m["path"]
        for m in p["mounts"]
        if m["role"] in ("shared", "network_volume", "durable") and "terminate" in m["survives"]
    ]
    for path in shared:
        assert not (p["secrets"]["dir"] or "").startswith(path), f"{name} puts secrets on {path}"


@pytest.mark.parametrize("name", EXPECTED)
def test_durable_root_is_a_listed_mount_or_under_one(name):
    p = profiles.load_profile(name)
    durable = p["roots"]["durable"]
    assert any(
        durable == m["path"] or durable.startswith(m["path"].rstrip("/") + "/") for m in p["mounts"]
    ), durable


# --- platform facts --------------------------------------------------------------------------------------


def test_autodl_survival_matrix_and_clocks():
    p = profiles.load_profile("autodl")
    fs = mount(p, "/root/autodl-fs")
    assert fs["survives"] == ["stop", "terminate"]
    assert fs["inode_cap"] == 200000
    tmp = mount(p, "/root/autodl-tmp")
    assert "stop" in tmp["survives"] and "terminate" not in tmp["survives"]
    assert p["roots"]["durable"] == "/root/autodl-tmp"
    assert any("15 days" in clock for clock in p["danger_clocks"])
    assert p["meter_stop"]["verb"] == "power_off" and p["meter_stop"]["label"] == "关机"
    assert p["meter_stop"]["reversible"] is True
    assert p["network"]["proxy_hook"] == "source /etc/network_turbo 2>/dev/null || true"
    assert p["network"]["env"]["HF_HUB_DISABLE_XET"] == "1"
    assert p["env_contract"]["interpreter"] == "/root/miniconda3/bin/python"
    assert p["secrets"]["dir"] == "/root"


def test_runpod_network_volume_survives_terminate_and_container_disk_survives_nothing():
    p = profiles.load_profile("runpod")
    ws = mount(p, "/workspace")
    assert ws["role"] == "network_volume" and "terminate" in ws["survives"]
    assert mount(p, "/")["survives"] == []
    assert p["spot"] == {**p["spot"], "available": True, "grace_s": 5}
    assert p["meter_stop"]["verb"] == "terminate" and p["meter_stop"]["reversible"] is False
    assert p["meter_stop"]["api"]["key_env"] == "RUNPOD_API_KEY"
    assert p["secrets"]["dir"] == "/root"


def test_vastai_preemption_has_no_grace():
    p = profiles.load_profile("vastai")
    assert p["spot"]["available"] is True and p["spot"]["grace_s"] == 0
    assert p["meter_stop"]["verb"] == "destroy"
    assert all("terminate" not in m["survives"] for m in p["mounts"])


def test_lambda_terminate_is_irreversible_and_nfs_keeps_billing():
    p = profiles.load_profile("lambda")
    assert p["meter_stop"]["verb"] == "terminate" and p["meter_stop"]["reversible"] is False
    assert p["ssh"]["user"] == "ubuntu"
    assert p["roots"]["durable"].startswith("/lambda/nfs/")
    assert any("NFS" in item for item in p["meter_stop"]["keeps_billing"])
    assert any("rgt_durable_root" in note for note in p["notes"])


def test_paperspace_delete_is_the_verb_and_shutdown_is_the_reversible_alternative():
    p = profiles.load_profile("paperspace")
    assert p["meter_stop"]["verb"] == "delete" and p["meter_stop"]["reversible"] is False
    assert [a["reversible"] for a in p["meter_stop"]["alternatives"]] == [True]


@pytest.mark.parametrize("name", ["matpool", "gpushare", "featurize", "lanrui", "generic_ssh"])
def test_platforms_without_api_give_console_steps(name):
    ms = profiles.load_profile(name)["meter_stop"]
    assert ms["verb"] == "manual" and ms["api"] is None and ms["manual_steps"]


def test_cluster_and_local_verbs():
    assert profiles.load_profile("slurm")["meter_stop"]["verb"] == "scancel"
    assert profiles.load_profile("kubernetes")["meter_stop"]["verb"] == "delete_job"
    local = profiles.load_profile("local")
    assert local["meter_stop"]["verb"] == "none" and local["roots"]["durable"] == "~/rgt-runs"


def test_china_family_facts():
    assert (
        profiles.load_profile("matpool")["env_contract"]["interpreter"]
        == "/root/miniconda3/envs/myconda/bin/python"
    )
    gs = profiles.load_profile("gpushare")
    assert any("10 days" in c for c in gs["danger_clocks"])
    assert mount(gs, "/hy-netdisk")["optional"] is True
    lr = profiles.load_profile("lanrui")
    assert any("数据盘" in c and "stopped" in c for c in lr["danger_clocks"])


def test_render_env_and_expand_path_fill_placeholders():
    p = profiles.load_profile("autodl")
    env = profiles.render_env(p, "/root/autodl-tmp", "/root/autodl-tmp/")
    assert env["HF_HOME"] == "/root/autodl-tmp/.cache/huggingface"
    assert profiles.expand_path("/scratch/{user}/rgt-runs", "/home/ann", "ann") == "/scratch/ann/rgt-runs"
    assert profiles.expand_path("~/rgt-runs", "/home/ann/", "ann") == "/home/ann/rgt-runs"


# --- malformed profiles ----------------------------------------------------------------------------------


def errors_for(data: dict) -> list:
    return profiles.validate_profile_data(data, "bad.yml", expected_name="autodl")


def test_bad_survives_verb_names_the_field_path_and_the_fix():
    data = raw("autodl")
    data["mounts"][1]["survives"][0] = "reboot"
    (err,) = errors_for(data)
    assert err.field == "mounts[1].survives[0]"
    assert "reboot" in err.message
    assert err.fix == "use one of: stop, terminate"
    assert err.source == "bad.yml"


def test_unknown_key_is_named_with_its_path():
    data = raw("runpod")
    data["meter_stop"]["reversable"] = False
    (err,) = errors_for(data)
    assert err.field == "meter_stop.reversable"
    assert "unknown key" in err.message
    assert "reversible" in err.fix  # the allowed keys are listed, so the typo is obvious


def test_wrong_type_is_named_with_its_path():
    data = raw("vastai")
    data["spot"]["grace_s"] = "zero"
    (err,) = errors_for(data)
    assert err.field == "spot.grace_s"
    assert "expected integer or null" in err.message
    assert "integer" in err.fix


def test_missing_field_is_named_with_its_path():
    data = raw("lambda")
    del data["meter_stop"]["post_check"]
    (err,) = errors_for(data)
    assert err.field == "meter_stop.post_check"
    assert err.message == "required key is missing"
    assert err.fix.startswith("add 'post_check'")


def test_api_key_must_be_an_env_var_name_not_a_key():
    data = raw("runpod")
    data["meter_stop"]["api"]["key_env"] = "rpa_1234secret"
    (err,) = errors_for(data)
    assert err.field == "meter_stop.api.key_env"
    assert "[A-Z]" in err.fix


def test_verified_stamp_pattern():
    data = raw("autodl")
    data["verified"] = "June 2026"
    (err,) = errors_for(data)
    assert err.field == "verified"


def test_manual_verb_without_steps_is_rejected():
    data = raw("matpool")
    data["meter_stop"]["manual_steps"] = []
    errs = profiles.validate_profile_data(data, "matpool.yml", expected_name="matpool")
    assert [e.field for e in errs] == ["meter_stop.manual_steps"]


def test_name_must_match_file():
    errs = profiles.validate_profile_data(raw("autodl"), "x.yml", expected_name="runpod")
    assert [e.field for e in errs] == ["name"]


def test_load_profile_raises_the_first_error_with_file_and_count(tmp_path):
    data = raw("autodl")
    data["mounts"][1]["survives"][0] = "reboot"
    data["kind"] = "cloud"
    (tmp_path / "autodl.yml").write_text(yaml.safe_dump(data, allow_unicode=True), encoding="utf-8")
    with pytest.raises(profiles.ProfileError) as info:
        profiles.load_profile("autodl", profiles_dir=tmp_path)
    err = info.value
    assert err.field == "kind"
    assert str(tmp_path / "autodl.yml") in str(err)
    assert "1 more problem" in err.message
    assert "Fix: use one of:" in err.describe()


def test_unknown_profile_lists_the_known_ones():
    with pytest.raises(profiles.ProfileError) as info:
        profiles.load_profile("nosuch")
    assert "autodl" in info.value.fix


def test_invalid_yaml_reports_the_line(tmp_path):
    (tmp_path / "local.yml").write_text("name: local\nkind: [oops\n", encoding="utf-8")
    with pytest.raises(profiles.ProfileError) as info:
        profiles.load_profile("local", profiles_dir=tmp_path)
    assert "invalid YAML at line" in info.value.message


def test_user_profiles_dir_is_validated_the_same_way(tmp_path):
    shutil.copy(REPO / "profiles" / "local.yml", tmp_path / "local.yml")
    assert profiles.load_profile("local", profiles_dir=tmp_path)["kind"] == "workstation"


# --- lookup plugin ---------------------------------------------------------------------------------------


def test_lookup_plugin_returns_the_profile_as_one_element_list():
    from ansible.errors import AnsibleError

    from ansible_collections.rgt.remote_gpu.plugins.lookup.profile import LookupModule

    result = LookupModule().run(["runpod"])
    assert len(result) == 1 and result[0]["spot"]["grace_s"] == 5
    with pytest.raises(AnsibleError, match="unknown option"):
        LookupModule().run(["runpod"], profiles_dirr="/x")


def test_lookup_plugin_error_names_file_field_and_fix(tmp_path):
    from ansible.errors import AnsibleError

    from ansible_collections.rgt.remote_gpu.plugins.lookup.profile import LookupModule

    data = copy.deepcopy(raw("lambda"))
    data["mounts"][0]["survives"] = ["stop", "reboot"]
    (tmp_path / "lambda.yml").write_text(yaml.safe_dump(data), encoding="utf-8")
    with pytest.raises(AnsibleError) as info:
        LookupModule().run(["lambda"], profiles_dir=str(tmp_path))
    text = str(info.value)
    assert (
        "lambda.yml" in text
        and "mounts[0].survives[1]" in text
        and "Fix: use one of: stop, terminate" in text
    )


# --- rendering -------------------------------------------------------------------------------------------


def test_render_show_prints_the_survival_matrix_meter_stop_and_clocks():
    console = Console(record=True, width=120)
    profiles.render_show(console, profiles.load_profile("autodl"))
    text = console.export_text()
    rows = {line.split("│")[1].strip(): line for line in text.splitlines() if line.count("│") >= 6}
    assert "yes" in rows["/root/autodl-fs"].split("│")[4] and "200,000" in rows["/root/autodl-fs"]
    assert rows["/root/autodl-tmp"].split("│")[3].strip() == "yes"
    assert rows["/root/autodl-tmp"].split("│")[4].strip() == "no"
    assert "power_off (关机)" in text and "reversible" in text
    assert "Keeps billing" in text and "15 days" in text


def test_render_show_marks_irreversible_verbs():
    console = Console(record=True, width=120)
    profiles.render_show(console, profiles.load_profile("runpod"))
    text = console.export_text()
    assert "irreversible" in text and "Network Volumes" in text
    assert "/workspace" in text


def test_render_list_has_a_row_per_profile():
    console = Console(record=True, width=120)
    profiles.render_list(console)
    text = console.export_text()
    for name in EXPECTED:
        assert f"│ {name} " in text
    assert "5 s" in text and "0 s" in text


def test_profile_as_json_is_serialisable_and_spells_out_survival():
    doc = profiles.profile_as_json(profiles.load_profile("runpod"))
    json.dumps(doc, ensure_ascii=False)
    ws = [row for row in doc["survival"] if row["path"] == "/workspace"][0]
    assert ws["survives_terminate"] is True


def test_stale_stamps():
    from datetime import date

    assert profiles.is_stale("2026-06", today=date(2027, 1, 1)) is True
    assert profiles.is_stale("2026-06", today=date(2026, 11, 30)) is False
    assert profiles.is_stale("none") is False


def test_every_field_placeholder_in_the_rendered_profile_is_filled():
    """`<meter_stop.api.key_env>` (the registry's) and `<spot.grace_s>` (a profile's own note) show the profile's
    values, in `profiles show` and in --json; a word without a dot (`<name>`, `<PORT>`) is the user's and stays."""
    console = Console(record=True, width=200)
    runpod = profiles.load_profile("runpod")
    profiles.render_show(console, runpod)
    text = console.export_text()
    assert "needs env RUNPOD_API_KEY" in text and "<meter_stop" not in text
    assert profiles.profile_as_json(runpod)["engines"]["meter_stop"]["env"] == ["RUNPOD_API_KEY"]
    slurm = profiles.load_profile("slurm")
    assert "--signal=B:TERM@30," in slurm["detach"]["notes"] and "<run_dir>/.rgt/sbatch.sh" in slurm["detach"]["notes"]
    assert profiles.load_profile("kubernetes")["meter_stop"]["label"] == "kubectl delete job <name>"
    assert profiles.fill_placeholders(["<mounts[1].path> <spot.nope> <PORT>", {"k": "<spot.available>"}],
                                      runpod) == ["/workspace <spot.nope> <PORT>", {"k": "true"}]
