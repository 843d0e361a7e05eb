"""Which mounts a meter stop deletes has one home, `rgt_gate.deleted_mounts` (over the profile's `mounts[].survives`
and `meter_stop.reversible`): the teardown plan prints it, the teardown module records it, and the probe warns
about a durable root on exactly those mounts."""

from __future__ import annotations

import copy
from types import SimpleNamespace

import pytest

from ansible_collections.rgt.remote_gpu.plugins.module_utils import rgt_gate
from ansible_collections.rgt.remote_gpu.plugins.module_utils import rgt_probe_eval as ev
from rgt import profiles
from rgt import teardown as td

SHIPPED = {p["name"]: p for p in profiles.list_profiles()}

# per shipped profile: (deleted by a reversible stop, deleted by the irreversible end), from profiles/*.yml
LOST = {
    "autodl": ([], ["/", "/root/autodl-tmp"]),
    "featurize": (["/"], ["/"]),
    "generic_ssh": ([], ["/", "~"]),
    "gpushare": (["/", "/hy-tmp"], ["/", "/hy-tmp"]),
    "kubernetes": (["/"], ["/"]),
    "lambda": ([], ["/", "/home/ubuntu"]),
    "lanrui": (["/"], ["/", "/home/user/datadisk"]),
    "local": ([], []),
    "matpool": (["/root"], ["/root"]),
    "paperspace": ([], ["/"]),
    "runpod": (["/"], ["/"]),
    "slurm": ([], []),
    "vastai": ([], ["/", "/workspace"]),
}

HOST = {"home": "/home/ann", "user": "ann"}


def with_reversible(profile: dict, reversible: bool) -> dict:
    changed = copy.deepcopy(profile)
    changed["meter_stop"]["reversible"] = reversible
    return changed


def test_every_shipped_profile_has_an_expected_answer():
    assert sorted(SHIPPED) == sorted(LOST)


@pytest.mark.parametrize("name", sorted(LOST))
def test_a_stop_and_a_terminate_delete_the_mounts_whose_survives_list_lacks_the_verb(name):
    stop, terminate = LOST[name]
    assert rgt_gate.deleted_mounts(with_reversible(SHIPPED[name], True)) == stop
    assert rgt_gate.deleted_mounts(with_reversible(SHIPPED[name], False)) == terminate


@pytest.mark.parametrize("name", sorted(LOST))
def test_the_teardown_plan_lists_what_the_profiles_own_verb_deletes(name):
    profile = SHIPPED[name]
    stop, terminate = LOST[name]
    inst = td.Instance("i-1", [SimpleNamespace(name="h1", profile=profile)], ["h1"])
    assert profiles.verb_plan(inst)["deletes"] == (stop if profile["meter_stop"]["reversible"] else terminate)


def _root_on(mount_path: str) -> str:
    point = mount_path.replace("{user}", HOST["user"])
    if point == "~" or point.startswith("~/"):
        point = HOST["home"] + point[1:]
    return point.rstrip("/") + "/rgt-durable"


@pytest.mark.parametrize("name", sorted(LOST))
def test_the_probe_warns_about_a_durable_root_on_exactly_the_mounts_the_teardown_plan_deletes(name):
    # lanrui's 停止 + 销毁数据盘 and generic_ssh's manual stop are irreversible: their data disk / home go with it
    profile = SHIPPED[name]
    deletes = rgt_gate.deleted_mounts(profile)
    for mount in profile["mounts"]:
        report = {
            "host": HOST,
            "layout": {
                "durable_root": _root_on(mount["path"]),
                "durable_root_exists": True,
                "durable_root_writable": True,
                "same_filesystem": True,
            },
        }
        warned = [f for f in ev.layout_findings(report, profile) if f["id"] == "durable_root_not_surviving"]
        assert bool(warned) == (mount["path"] in deletes), (name, mount["path"])
        if warned:
            assert warned[0]["data"]["survivors"] == [m["path"] for m in profile["mounts"] if m["path"] not in deletes]
            assert profile["meter_stop"]["label"] in warned[0]["message"]


@pytest.mark.parametrize("name", sorted(LOST))
def test_what_the_gate_says_of_a_runs_files_follows_the_same_rule(name):
    # files_fate (the gate's note for an unpulled run) and deleted_mounts answer from one rule, rgt_gate.survives
    for reversible in (True, False):
        profile = with_reversible(SHIPPED[name], reversible)
        deleted = rgt_gate.deleted_mounts(profile)
        for mount in profile["mounts"]:
            goes, text = rgt_gate.files_fate(mount, profile)
            assert goes is (mount["path"] in deleted), (name, reversible, mount["path"], text)
            assert mount["path"] in text
