"""module_utils/rgt_cloud: the meter-stop clients against the fake control planes (tests/fakes)."""

import time

import pytest

from ansible_collections.rgt.remote_gpu.plugins.module_utils import rgt_cloud as c

TOKEN = "test-token"


def api(client, key_env="RGT_TEST_KEY", base_url_env=None):
    return {"client": client, "base_url": "http://127.0.0.1:9", "key_env": key_env, "base_url_env": base_url_env}


def client_for(plane, name, token=TOKEN, **kw):
    return c.make_client(api(name), env={"RGT_TEST_KEY": token}, base_url=plane.url, **kw)


def test_runpod_terminate_is_one_204_delete_then_polls_until_404(plane):
    fake = plane("runpod", lag_s=1.5)
    fake.add_pod("pod-1")
    client = client_for(fake, "runpod_rest")
    out = c.teardown(client, "pod-1", poll_timeout_s=20, poll_interval_s=0.5)
    assert out["final_state"] == c.GONE and out["stop_called"] and not out["already"]
    assert [r["method"] for r in fake.mutating_calls()] == ["DELETE"]
    assert fake.mutating_calls()[0]["path"] == "/v2/pods/pod-1"
    assert client.calls[1] == {"method": "DELETE", "path": "/v2/pods/pod-1", "status": 204}
    assert client.calls[-1]["status"] == 404
    assert all(r["headers"].get("Authorization") == "<redacted>" for r in fake.calls())


def test_runpod_already_gone_makes_no_delete(plane):
    fake = plane("runpod")
    client = client_for(fake, "runpod_rest")
    out = c.teardown(client, "pod-nope", poll_timeout_s=5, poll_interval_s=0.1)
    assert out["already"] and out["final_state"] == c.GONE
    assert fake.mutating_calls() == []


def test_base_url_comes_from_the_env_var_named_by_the_profile(plane):
    fake = plane("runpod")
    fake.add_pod("pod-1")
    client = c.make_client(api("runpod_rest", base_url_env="RGT_TEST_URL"),
                           env={"RGT_TEST_KEY": TOKEN, "RGT_TEST_URL": fake.url})
    assert client.state("pod-1") == "running"


@pytest.mark.slow
def test_vast_keeps_listing_for_20s_after_destroy_and_is_reported_gone_only_after(plane):
    fake = plane("vast", lag_s=20)
    fake.add_instance("4242")
    client = client_for(fake, "vast_rest")
    t0 = time.monotonic()
    out = c.teardown(client, "4242", poll_timeout_s=60, poll_interval_s=1.5)
    elapsed = time.monotonic() - t0
    assert out["final_state"] == c.GONE
    assert elapsed >= 20
    deletes = fake.calls("DELETE")
    assert len(deletes) == 1 and deletes[0]["path"] == "/api/v0/instances/4242/"
    gets = fake.calls("GET")
    assert len(gets) >= 12 and all(g["query"] == {"owner": "me"} for g in gets)
    assert gets[-1]["t"] - deletes[0]["t"] >= 20


def test_vast_stopped_instance_is_not_already_gone(plane):
    fake = plane("vast")
    fake.add_instance("77", actual_status="exited")  # stopped: still bills disk
    out = c.teardown(client_for(fake, "vast_rest"), "77", poll_timeout_s=5, poll_interval_s=0.1)
    assert not out["already"] and len(fake.calls("DELETE")) == 1


def test_vast_success_false_is_an_error(plane):
    fake = plane("vast", error_body=True)
    fake.add_instance("88")
    with pytest.raises(c.CloudError, match="Instance is locked") as err:
        c.teardown(client_for(fake, "vast_rest"), "88", poll_timeout_s=5, poll_interval_s=0.1)
    assert err.value.kind == "api"


def test_lambda_hung_terminate_is_requeried_not_repeated(plane):
    fake = plane("lambda", lag_s=4.0, hang={"POST /instance-operations/terminate": 4.0})
    fake.add_instance("lam-1", file_systems=["rgt-fs"])
    client = client_for(fake, "lambda_rest", http_timeout=1.0)
    t0 = time.monotonic()
    out = c.teardown(client, "lam-1", poll_timeout_s=30, poll_interval_s=0.5)
    assert time.monotonic() - t0 < 15
    assert out["final_state"] == c.GONE
    assert len(fake.calls("POST", "/instance-operations/terminate")) == 1
    assert client.calls[1]["status"] == "timeout"
    assert client.calls[2]["method"] == "GET"  # the re-query came right after the timeout
    assert any("terminating" in w for w in out["warnings"])
    assert any("rgt-fs" in w and "billing" in w for w in out["warnings"])


def test_lambda_hung_terminate_that_did_nothing_is_not_retried(plane):
    fake = plane("lambda", conflict=True, hang={"POST /instance-operations/terminate": 3.0})
    fake.add_instance("lam-2")
    client = client_for(fake, "lambda_rest", http_timeout=1.0)
    with pytest.raises(c.CloudError, match="not calling again"):
        c.teardown(client, "lam-2", poll_timeout_s=10, poll_interval_s=0.2)
    assert len(fake.calls("POST")) == 1


def test_401_names_the_env_var_to_set(plane):
    fake = plane("runpod")
    fake.add_pod("pod-1")
    client = client_for(fake, "runpod_rest", token="wrong")
    with pytest.raises(c.CloudError) as err:
        c.teardown(client, "pod-1", poll_timeout_s=5, poll_interval_s=0.1)
    assert err.value.kind == "auth" and "RGT_TEST_KEY" in err.value.message
    assert "wrong" not in err.value.message
    assert fake.mutating_calls() == []


def test_missing_key_names_the_env_var_and_calls_nothing():
    with pytest.raises(c.CloudError) as err:
        c.make_client(api("runpod_rest", key_env="RUNPOD_API_KEY"), env={})
    assert err.value.kind == "auth" and "RUNPOD_API_KEY" in err.value.message


def test_429_retry_after_is_honoured(plane):
    fake = plane("runpod", rate_limit_first=2, retry_after=1)
    fake.add_pod("pod-1")
    client = client_for(fake, "runpod_rest")
    t0 = time.monotonic()
    out = c.teardown(client, "pod-1", poll_timeout_s=10, poll_interval_s=0.2)
    assert time.monotonic() - t0 >= 2.0
    assert out["final_state"] == c.GONE
    statuses = [r["status"] for r in fake.calls()]
    assert statuses[:3] == [429, 429, 200]
    assert len(fake.calls("DELETE")) == 1


def test_409_on_terminate_is_an_invalid_transition(plane):
    fake = plane("runpod", conflict=True)
    fake.add_pod("pod-c")
    with pytest.raises(c.CloudError, match="invalid transition") as err:
        c.teardown(client_for(fake, "runpod_rest"), "pod-c", poll_timeout_s=5, poll_interval_s=0.1)
    assert err.value.kind == "conflict"
    assert len(fake.calls("DELETE")) == 1


def test_poll_timeout_reports_unknown_and_never_repeats(plane):
    fake = plane("runpod", lag_s=60)
    fake.add_pod("pod-slow")
    out = c.teardown(client_for(fake, "runpod_rest"), "pod-slow", poll_timeout_s=1.5, poll_interval_s=0.3)
    assert out["final_state"] == c.UNKNOWN and "check the console" in out["final_state"]
    assert len(fake.calls("DELETE")) == 1


def test_paperspace_lists_what_still_bills_and_deletes_none_of_it(plane):
    fake = plane("paperspace", lag_s=0.5)
    fake.add_machine("ps-1")
    fake.resources["public-ips"].append({"ip": "203.0.113.7", "assignedMachineId": "ps-1"})
    fake.resources["snapshots"].append({"id": "snap-1", "name": "nightly", "machineId": "ps-1"})
    fake.resources["storage"].append({"id": "vol-1", "name": "data"})
    client = client_for(fake, "paperspace_rest")
    out = c.teardown(client, "ps-1", poll_timeout_s=10, poll_interval_s=0.2)
    assert out["final_state"] == c.GONE
    left = client.leftovers("ps-1")
    assert any("203.0.113.7" in x and "this machine" in x for x in left)
    assert any("snap-1" in x or "nightly" in x for x in left)
    assert any("data" in x for x in left)
    assert [r["method"] for r in fake.mutating_calls()] == ["DELETE"]
    assert fake.mutating_calls()[0]["path"] == "/machines/ps-1"


def test_autodl_power_off_is_reversible_and_polls_until_shutdown(plane):
    fake = plane("autodl", lag_s=1.0)
    fake.add_instance("adl-1")
    client = client_for(fake, "autodl_token")
    out = c.teardown(client, "adl-1", poll_timeout_s=10, poll_interval_s=0.3)
    assert out["final_state"] == c.STOPPED and client.reversible
    post = fake.calls("POST")
    assert len(post) == 1 and post[0]["body"] == {"instance_uuid": "adl-1"}
    assert post[0]["path"].endswith("/pro/power_off")


def test_autodl_code_not_success_is_an_error(plane):
    fake = plane("autodl", error_body=True)
    fake.add_instance("adl-2")
    with pytest.raises(c.CloudError, match="OperateFailed"):
        c.teardown(client_for(fake, "autodl_token"), "adl-2", poll_timeout_s=5, poll_interval_s=0.1)


def test_autodl_sends_the_token_without_bearer(plane):
    fake = plane("autodl")  # the fake's auth_prefix is "": a Bearer prefix would get 401
    fake.add_instance("adl-3", status="shutdown")
    out = c.teardown(client_for(fake, "autodl_token"), "adl-3", poll_timeout_s=5, poll_interval_s=0.1)
    assert out["already"] and fake.mutating_calls() == []


def test_resume_poll_after_an_unknown_outcome_polls_without_calling_again(plane):
    fake = plane("runpod", lag_s=2)
    fake.add_pod("pod-r")
    client = client_for(fake, "runpod_rest")
    first = c.teardown(client, "pod-r", poll_timeout_s=0.5, poll_interval_s=0.2)
    assert first["final_state"] == c.UNKNOWN
    again = c.teardown(client_for(fake, "runpod_rest"), "pod-r", poll_timeout_s=10, poll_interval_s=0.3,
                       resume_poll=True)
    assert again["final_state"] == c.GONE and not again["stop_called"]
    assert len(fake.calls("DELETE")) == 1


def test_the_intent_is_on_record_before_the_call_and_again_once_it_is_answered(plane):
    """A run killed anywhere after the first hook leaves a record of a stop in flight (issue 17)."""
    fake = plane("vast", lag_s=60)
    fake.add_instance("4343")
    client = client_for(fake, "vast_rest")
    seen = []
    c.teardown(client, "4343", poll_timeout_s=0.3, poll_interval_s=0.1,
               on_call=lambda stage: seen.append((stage, len(fake.calls("DELETE")), list(client.calls))))
    assert [(stage, deletes) for stage, deletes, _ in seen] == [("requested", 0), ("answered", 1)]
    assert seen[1][2][-1] == {"method": "DELETE", "path": "/api/v0/instances/4343/", "status": 200}


def test_a_stop_found_gone_when_resuming_is_gone_not_already_gone(plane):
    fake = plane("runpod")
    out = c.teardown(client_for(fake, "runpod_rest"), "pod-ended", poll_timeout_s=1, poll_interval_s=0.1,
                     resume_poll=True)
    assert out["final_state"] == c.GONE and not out["already"] and not out["stop_called"]
    assert fake.mutating_calls() == []


DELETE_OK = {"method": "DELETE", "path": "/v2/pods/p", "status": 204}


@pytest.mark.parametrize("record, state", [
    ({"instance_id": "p", "final_state": c.REQUESTED, "calls": []}, c.RECORD_IN_FLIGHT),  # killed before the call
    ({"instance_id": "p", "final_state": c.REQUESTED, "calls": [DELETE_OK]}, c.RECORD_IN_FLIGHT),  # ... polling
    ({"instance_id": "p", "final_state": c.UNKNOWN, "calls": [DELETE_OK]}, c.RECORD_IN_FLIGHT),  # poll ran out
    ({"instance_id": "p", "final_state": c.UNKNOWN, "calls": [{**DELETE_OK, "status": "timeout"}]},
     c.RECORD_IN_FLIGHT),  # a hung call may have taken effect
    ({"instance_id": "p", "final_state": c.UNKNOWN, "calls": [{**DELETE_OK, "status": 401}]}, c.RECORD_NONE),
    ({"instance_id": "p", "final_state": "not stopped", "calls": []}, c.RECORD_NONE),
    ({"instance_id": "p", "final_state": "gone", "calls": [DELETE_OK]}, c.RECORD_GONE),
    ({"instance_id": "p", "final_state": "already gone", "calls": []}, c.RECORD_GONE),
    ({"instance_id": "other", "final_state": c.REQUESTED, "calls": []}, c.RECORD_NONE),  # another instance's
    (None, c.RECORD_NONE), ("not a record", c.RECORD_NONE), ({"instance_id": "p", "calls": "?"}, c.RECORD_NONE),
])
def test_what_an_earlier_record_says_of_the_instance(record, state):
    assert c.record_state(record, "p") == state
