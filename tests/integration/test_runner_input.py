"""Bad input gets one clear message naming the field, exit 2, and no host touched."""

import pytest
from clihelp import REPO, write_inventory

LOCAL = {"ansible_connection": "local", "rgt_profile": "local", "rgt_instance_id": "localhost"}


def assert_refused(result, field):
    assert result.rc == 2, result.stderr
    assert field in result.stderr
    doc = result.doc
    assert doc["exit_code"] == 2 and field in doc["field"]


@pytest.mark.parametrize("bad_vars, field", [
    ({"rgt_profle": "local"}, "rgt_profle"),                              # unknown key (typo)
    ({"rgt_job": {"gpu": {"count": "two"}}}, "rgt_job.gpu.count"),         # wrong type
    ({"rgt_job": {"gpus": 1}}, "rgt_job.gpus"),                            # unknown job key
    ({"rgt_project": "my project"}, "rgt_project"),                        # bad value
])
def test_malformed_host_vars_exit_2_naming_the_field(rgt, tmp_path, bad_vars, field):
    inv = write_inventory(tmp_path / "inv", {"box": {**LOCAL, **bad_vars}})
    result = rgt("playbooks/probe.yml", "-i", inv, "--json")
    assert_refused(result, field)
    assert not (rgt.ledger / "events").exists(), "nothing may run when input is bad"


def test_missing_instance_id_exit_2(rgt, tmp_path):
    host = {k: v for k, v in LOCAL.items() if k != "rgt_instance_id"}
    inv = write_inventory(tmp_path / "inv", {"box": host})
    assert_refused(rgt("probe", "-i", inv, "--json"), "rgt_instance_id")


def test_unknown_profile_exit_2_lists_known_ones(rgt, tmp_path):
    inv = write_inventory(tmp_path / "inv", {"box": {**LOCAL, "rgt_profile": "runpood"}})
    result = rgt("probe", "-i", inv, "--json")
    assert_refused(result, "rgt_profile")
    assert "runpod" in result.stderr


def test_unparseable_inventory_exit_2(rgt, tmp_path):
    inv = tmp_path / "hosts.yml"
    inv.write_text("all:\n  hosts:\n    box: {rgt_profile: local\n")
    result = rgt("probe", "-i", inv, "--json")
    assert result.rc == 2 and "could not be parsed" in result.stderr


def test_bad_job_spec_in_extra_vars_exit_2(rgt, tmp_path):
    inv = write_inventory(tmp_path / "inv", {"box": LOCAL})
    job = tmp_path / "job.yml"
    job.write_text("rgt_job:\n  name: ok\n  secrets: ['not a name']\n")
    assert_refused(rgt("probe", "-i", inv, "-e", f"@{job}", "--json"), "rgt_job.secrets")


def test_ssh_host_without_pinned_key_is_refused_before_connecting(rgt, tmp_path):
    inv = write_inventory(tmp_path / "inv", {"box": {"ansible_host": "127.0.0.1", "ansible_port": 1,
                                                     "rgt_profile": "runpod", "rgt_instance_id": "pod1"}})
    result = rgt("probe", "-i", inv, "--json")
    assert_refused(result, "rgt_instance_id")
    assert "no pinned host key" in result.stderr


@pytest.mark.parametrize("mutate, field", [
    (lambda p: p.update(colour="blue"), "colour"),                                   # unknown key
    (lambda p: p["spot"].update(grace_s="five"), "spot.grace_s"),                     # wrong type
    (lambda p: p["mounts"][0].update(survives=["reboot"]), "mounts[0].survives[0]"),  # bad enum
])
def test_malformed_profile_exit_2_naming_the_field(rgt, tmp_path, mutate, field):
    import yaml

    prof = yaml.safe_load((REPO / "profiles" / "runpod.yml").read_text())
    prof["name"] = "mybox"
    mutate(prof)
    pdir = tmp_path / "profiles"
    pdir.mkdir()
    (pdir / "mybox.yml").write_text(yaml.safe_dump(prof, allow_unicode=True))
    inv = write_inventory(tmp_path / "inv", {"box": {**LOCAL, "rgt_profile": "mybox"}})
    result = rgt("probe", "-i", inv, "--json", env={"RGT_PROFILES_DIR": str(pdir)})
    assert_refused(result, field)
    assert "mybox.yml" in result.stderr


def test_an_offload_with_a_key_in_its_target_is_refused_exit_2_never_echoing_the_key(rgt, tmp_path):
    inv = write_inventory(tmp_path / "inv", {"box": LOCAL})
    job = tmp_path / "job.yml"
    job.write_text("rgt_job:\n  name: ok\n  offload: {to: ':s3,secret_access_key=AKIA-PASTED-KEY:bucket'}\n")
    result = rgt("probe", "-i", inv, "-e", f"@{job}", "--json")
    assert_refused(result, "rgt_job.offload.to")
    assert "AKIA-PASTED-KEY" not in result.stdout + result.stderr
