"""The steps of rgt_teardown without Ansible (plugins/module_utils/rgt_meterstop.py): the verb comes from the registry
(an unregistered one is refused with its field), a stop an earlier run left in flight is polled and never called
again, each verb's class does what its registry entry says, and the records of every host of the instance are
written. The whole module, as Ansible runs it, is driven by tests/integration/test_teardown_local.py."""

from __future__ import annotations

import copy
import json

import pytest

from ansible_collections.rgt.remote_gpu.plugins.module_utils import rgt_cloud, rgt_registry
from ansible_collections.rgt.remote_gpu.plugins.module_utils import rgt_meterstop as ms
from rgt import profiles
from tests.fakes import control_planes as fk
from tests.unit.test_rgt_launchplan import Ended


class FakeModule:
    def __init__(self, **params):
        self.params = dict(profile={}, instance_id="pod-1", confirm="", host="gpu1", instance_hosts=[], box_runs=[],
                           unlisted_hosts=[], runs_dir="/nonexistent", base_url=None, poll_timeout_s=20,
                           poll_interval_s=0.2, http_timeout_s=10, ledger_path=None, ledger_dir=None,
                           resume_poll=None)
        self.params.update(params)

    def fail_json(self, **fields):
        raise Ended(True, fields)


def test_the_verb_comes_from_the_registry_and_an_unregistered_one_is_refused_with_its_field():
    entry, problem = ms.verb_problem(profiles.load_profile("runpod"))
    assert problem is None and entry.name == "runpod_rest" and isinstance(ms.stop_of(entry), ms.ApiStop)
    entry, problem = ms.verb_problem(profiles.load_profile("slurm"))
    assert problem is None and isinstance(ms.stop_of(entry), ms.Scancel)
    entry, problem = ms.verb_problem(profiles.load_profile("generic_ssh"))
    assert isinstance(ms.stop_of(entry), ms.Manual)  # an action word with console steps
    bad = copy.deepcopy(profiles.load_profile("runpod"))
    bad["meter_stop"]["api"]["client"] = "gcp_rest"
    entry, problem = ms.verb_problem(bad)
    assert entry is None and problem[0] == "meter_stop.api.client" and "'gcp_rest' is not a" in problem[1]


def test_the_base_result_and_the_record_say_what_the_verb_does_and_leaves():
    profile = profiles.load_profile("autodl")
    params = FakeModule(profile=profile, instance_id="box-9").params
    base = ms.base_result(params)
    assert (base["verb"], base["label"], base["reversible"], base["resumed"]) == ("power_off", "关机", True, False)
    assert base["keeps_billing"] == profile["meter_stop"]["keeps_billing"] and base["manual_steps"]
    record = ms.new_record(params, {"requested_at": "earlier"})
    assert record == {"instance_id": "box-9", "verb": "power_off", "reversible": True, "calls": [],
                      "final_state": None, "keeps_billing": base["keeps_billing"], "at": None,
                      "requested_at": "earlier"}


def test_a_stop_left_in_flight_is_found_in_the_records_and_polled_without_the_gate(tmp_path):
    runpod = rgt_registry.meter_stop("runpod_rest")
    params = FakeModule(ledger_dir=str(tmp_path), instance_hosts=["gpu1", "gpu2"]).params
    assert ms.record_paths(params) == [str(tmp_path / "gpu1.json"), str(tmp_path / "gpu2.json")]
    assert ms.earlier_stop(params, runpod) is None  # no record: the gate, then a call
    left = {"instance_id": "pod-1", "final_state": rgt_cloud.REQUESTED, "calls": [{"method": "DELETE"}],
            "requested_at": "t0"}
    ms.write_record(str(tmp_path / "gpu2.json"), left)
    assert ms.earlier_stop(params, runpod) == left
    assert ms.earlier_stop(dict(params, resume_poll=False), runpod) is None  # told not to
    assert ms.earlier_stop(params, rgt_registry.meter_stop("scancel")) is None  # only an API call is in flight
    ms.write_record(str(tmp_path / "gpu2.json"), dict(left, instance_id="pod-2"))  # another instance's
    assert ms.earlier_stop(params, runpod) is None
    assert ms.earlier_stop(dict(params, resume_poll=True), runpod) == {"calls": []}
    gate = ms.resumed_gate(params, left, "terminate")
    assert gate["passed"] and gate["hosts"] == ["gpu1", "gpu2"] and gate["runs"] == []
    assert gate["notes"] == ["the terminate of pod-1 was requested by an earlier run (at t0) that did not see it "
                             "end: polling it, calling nothing"]


def test_a_reversible_stop_without_its_key_follows_the_console_steps(monkeypatch):
    profile = profiles.load_profile("autodl")
    entry = rgt_registry.meter_stop("autodl_token")
    module = FakeModule(profile=profile)
    monkeypatch.delenv("AUTODL_TOKEN", raising=False)
    extra = {}
    assert isinstance(ms.choose(module, entry, None, extra), ms.Manual)
    assert "AUTODL_TOKEN is not set" in extra["warnings"][0] and "console steps below" in extra["warnings"][0]
    monkeypatch.setenv("AUTODL_TOKEN", "t")
    extra = {}
    assert isinstance(ms.choose(module, entry, None, extra), ms.ApiStop) and extra == {}
    # a stop in flight is polled by its own verb, key or not
    monkeypatch.delenv("AUTODL_TOKEN")
    assert isinstance(ms.choose(module, entry, {"calls": []}, {}), ms.ApiStop)


def test_the_verbs_without_an_api_call_nothing_and_say_so():
    box_runs = [{"runs": [{"slurm_job_id": "77"}, {"slurm_job_id": None}]}]
    module = FakeModule(instance_id="55", box_runs=box_runs)
    for name, changed, final in (("none", False, "nothing to stop"),
                                 ("scancel", True, "scancel requested on the login node"),
                                 ("manual", False, "manual — nothing was called: follow the steps"),
                                 ("delete_job", False, "manual — nothing was called: `rgt-run teardown`")):
        record, extra = {}, {}
        assert ms.stop_of(rgt_registry.meter_stop(name)).stop(module, record, extra, {}, {}) is changed, name
        assert record["final_state"].startswith(final) and record["at"], name
        if name == "scancel":
            assert extra["remote_jobs"] == [{"job_id": "55", "argv": ["scancel", "55"]},
                                            {"job_id": "77", "argv": ["scancel", "77"]}]


@pytest.fixture
def runpod_plane():
    fake = fk.PLANES["runpod"](token="test-token").start()
    yield fake
    fake.stop()


def test_an_api_stop_calls_once_polls_until_gone_and_records_every_host(tmp_path, monkeypatch, runpod_plane):
    runpod_plane.add_pod("pod-1")
    monkeypatch.setenv("RUNPOD_API_KEY", "test-token")
    monkeypatch.delenv("RUNPOD_API_URL", raising=False)
    module = FakeModule(profile=profiles.load_profile("runpod"), base_url=runpod_plane.url,
                        ledger_dir=str(tmp_path), instance_hosts=["gpu1", "gpu2"])
    record, extra = ms.new_record(module.params, None), {}
    assert ms.ApiStop().stop(module, record, extra, {}, {}) is True
    ms.write_records(module.params, record)
    assert [r["method"] for r in runpod_plane.mutating_calls()] == ["DELETE"]
    for host in ("gpu1", "gpu2"):
        written = json.loads((tmp_path / f"{host}.json").read_text())
        assert written["final_state"] == rgt_cloud.GONE and written["requested_at"]
        assert {"method": "DELETE", "path": "/v2/pods/pod-1", "status": 204} in written["calls"]
    assert extra["still_billing"] == []
    # gone already: the next teardown looks, calls nothing
    record = ms.new_record(module.params, None)
    assert ms.ApiStop().stop(module, record, {}, {}, {}) is False
    assert record["final_state"] == "already " + rgt_cloud.GONE
    assert [r["method"] for r in runpod_plane.mutating_calls()] == ["DELETE"]


def test_an_api_stop_without_its_key_fails_before_any_call(monkeypatch, runpod_plane):
    monkeypatch.delenv("RUNPOD_API_KEY", raising=False)
    module = FakeModule(profile=profiles.load_profile("runpod"), base_url=runpod_plane.url)
    with pytest.raises(Ended) as info:
        ms.ApiStop().stop(module, ms.new_record(module.params, None), {}, {"verb": "terminate"}, {"passed": True})
    assert info.value.failed and info.value.fields["kind"] == "auth" and info.value.fields["calls"] == []
    assert "RUNPOD_API_KEY is not set" in info.value.fields["msg"]
    assert runpod_plane.calls() == []
