"""`rgt_job.offload.stop_box` at launch (rgt.unattended.inbox_at_launch): exit 2 naming the field, before anything
is launched, without `train --down` naming the instance, without an offload to an rclone remote, or on a profile
that refuses an in-box stop; otherwise the box's copy is the very authorisation the ledger then keeps. And the
watcher's side: it leaves the box to decide, and a stop the box made becomes a stop in flight (polled, never
called)."""

import argparse
import json

import pytest
from rich.console import Console

from ansible_collections.rgt.remote_gpu.plugins.module_utils import rgt_cloud
from rgt import unattended
from rgt.errors import InputError
from rgt.inventory import Host
from rgt.profiles import load_profile

OFFLOAD = {"to": "s3t:rgt/off", "stop_box": True}


def host(profile="autodl", offload=None, iid="adl-1"):
    job = {"name": "r1", "command": "true", "offload": OFFLOAD if offload is None else offload}
    return Host(name="box", vars={"rgt_instance_id": iid, "rgt_job": job, "rgt_project": "proj"},
                profile=load_profile(profile))


def pending(iid="adl-1"):
    return {iid: {"instance_id": iid, "profile": "autodl", "verb": "power_off", "label": "关机", "expires_s": 3600}}


def test_the_box_carries_the_authorisation_the_ledger_keeps(tmp_path):
    down = pending()
    out = unattended.inbox_at_launch(tmp_path, [host()], down)
    copy = out["adl-1"]
    assert copy["command"] == ["/usr/bin/shutdown"] and copy["self_id_env"] == "AutoDLContainerUUID"
    doc = copy["authorisation"]
    assert doc is down["adl-1"]["doc"] and doc["in_box"] is True and doc["sha256"] == unattended.digest(doc)
    assert doc["runs"] == [{"project": "proj", "run_id": "r1", "host": "box"}]
    unattended.record_launch(tmp_path, [host()], down, 0, Console(quiet=True))
    assert json.loads(unattended.auth_path(tmp_path, "adl-1").read_text()) == doc
    assert unattended.inbox_at_launch(tmp_path, [host(offload={"to": "s3t:rgt/off"})], down) is None


@pytest.mark.parametrize(("made", "down", "said"), [
    (host(), False, "needs rgt-run train --down naming this instance (adl-1)"),
    (host(offload={"to": "controller", "stop_box": True}), True, "needs an offload to an rclone remote"),
    (host("lambda"), True, "profile lambda (host box) refuses a meter stop from the box itself: Shutting down"),
    (host("runpod"), True, "profile runpod (host box) refuses a meter stop from the box itself: the profile does "
                           "not say an in-box stop is safe"),
])
def test_what_refuses_stop_box_before_anything_is_launched(tmp_path, made, down, said):
    with pytest.raises(InputError) as err:
        unattended.inbox_at_launch(tmp_path, [made], None, down=down)
    assert said in str(err.value) and err.value.field == "rgt_job.offload.stop_box"


def test_down_for_another_instance_does_not_authorise_this_box(tmp_path):
    with pytest.raises(InputError) as err:
        unattended.inbox_at_launch(tmp_path, [host()], pending("adl-other"))
    assert "--down naming this instance (adl-1)" in str(err.value)


def test_the_watcher_leaves_the_box_to_decide_until_it_refuses_or_the_wait_ends(tmp_path, monkeypatch):
    down = pending()
    unattended.inbox_at_launch(tmp_path, [host()], down)
    unattended.record_launch(tmp_path, [host()], down, 0, Console(quiet=True))
    sha = down["adl-1"]["doc"]["sha256"]
    ended = {"box": {"state": "finished", "inbox_stop": None}}
    unattended._ended_at.clear()
    assert unattended._box_may_still_stop(tmp_path, "adl-1", ["box"], ended)  # no record yet: the box decides
    refused = {"box": {"state": "finished", "inbox_stop": {"action": "refused", "authorisation": sha}}}
    assert not unattended._box_may_still_stop(tmp_path, "adl-1", ["box"], refused)  # the watcher's own stop now
    other = {"box": {"state": "finished", "inbox_stop": {"action": "refused", "authorisation": "an older one"}}}
    assert unattended._box_may_still_stop(tmp_path, "adl-1", ["box"], other)
    monkeypatch.setattr(unattended, "INBOX_WAIT_S", 0)
    assert not unattended._box_may_still_stop(tmp_path, "adl-1", ["box"], ended)  # waited long enough


def test_a_stop_the_box_made_becomes_a_stop_in_flight_on_the_teardown_record(tmp_path):
    down = pending()
    unattended.inbox_at_launch(tmp_path, [host()], down)
    unattended.record_launch(tmp_path, [host()], down, 0, Console(quiet=True))
    sha = down["adl-1"]["doc"]["sha256"]
    forged = {"box": {"inbox_stop": {"action": "stop", "authorisation": "not this one", "at": "T"}}}
    assert not unattended._box_stop_seen(Console(quiet=True), tmp_path, "adl-1", ["box"], forged, [host()])
    seen = {"box": {"inbox_stop": {"action": "stop", "authorisation": sha, "at": "T", "reason": "why"}}}
    assert unattended._box_stop_seen(Console(quiet=True), tmp_path, "adl-1", ["box"], seen, [host()])
    record = json.loads((tmp_path / "teardown" / "box.json").read_text())
    assert rgt_cloud.record_state(record, "adl-1") == rgt_cloud.RECORD_IN_FLIGHT and record["calls"] == []
    assert unattended._stop_on_record(tmp_path, "adl-1", ["box"])


def _recorded(tmp_path, made):
    down = pending()
    unattended.inbox_at_launch(tmp_path, [made], down)
    unattended.record_launch(tmp_path, [made], down, 0, Console(quiet=True))
    return down["adl-1"]["doc"]


def test_a_box_that_went_off_before_a_poll_saw_its_record_gets_a_receipt_and_never_a_call(tmp_path, plane,
                                                                                          monkeypatch):
    fake = plane("autodl", token="adl-token")
    fake.add_instance("adl-1")
    monkeypatch.setenv("AUTODL_TOKEN", "adl-token")
    made = host()
    made.profile["meter_stop"]["api"]["base_url"] = fake.url
    doc = _recorded(tmp_path, made)
    gone = {"box": {"state": "unreachable"}}
    say = Console(quiet=True)
    # the platform says it still runs (the box is only unreachable): nothing, the watcher waits as before
    assert not unattended._box_stopped_unseen(say, tmp_path, "adl-1", ["box"], gone, [made])
    # a box that answers is judged on its own records, whatever the platform says
    fake.instances["adl-1"]["status"] = "shutdown"
    assert not unattended._box_stopped_unseen(say, tmp_path, "adl-1", ["box"], {"box": {"state": "finished"}},
                                              [made])
    args = argparse.Namespace(follow=False)
    unattended.tick(args, say, tmp_path, [made], gone)
    receipt = json.loads(unattended.receipt_path(tmp_path, "adl-1").read_text())
    assert receipt["by"] == "the box itself (its record unseen)" and receipt["status"] == "done"
    assert receipt["final_state"] == "stopped" and receipt["platform_state"] == "shutdown"
    assert receipt["authorisation"] == doc["sha256"] and receipt["calls"] == []
    assert receipt["keeps_billing"] == made.profile["meter_stop"]["keeps_billing"]
    assert [r["run_id"] for r in receipt["runs"]] == ["r1"] and "not seen" in receipt["runs"][0]["pull"]
    assert fake.mutating_calls() == []  # read-only: never a stop from here
    assert unattended._done(tmp_path, "adl-1")


def test_an_unseen_stop_needs_an_intact_in_box_authorisation(tmp_path, plane, monkeypatch):
    fake = plane("autodl", token="adl-token")
    fake.add_instance("adl-1", status="shutdown")
    monkeypatch.setenv("AUTODL_TOKEN", "adl-token")
    made = host()
    made.profile["meter_stop"]["api"]["base_url"] = fake.url
    doc = _recorded(tmp_path, made)
    edited = dict(doc, runs=doc["runs"] + [{"project": "proj", "run_id": "r9", "host": "box"}])
    unattended.auth_path(tmp_path, "adl-1").write_text(json.dumps(edited))  # by hand: the SHA-256 left as it was
    assert not unattended._box_stopped_unseen(Console(quiet=True), tmp_path, "adl-1", ["box"],
                                              {"box": {"state": "unreachable"}}, [made])
    assert not unattended.receipt_path(tmp_path, "adl-1").exists()


def test_a_relaunch_carries_the_ledgers_own_in_box_authorisation_back_onto_the_box(tmp_path):
    made = host()
    assert unattended.inbox_for_relaunch(tmp_path, [made]) is None  # nothing authorised: nothing carried
    doc = _recorded(tmp_path, made)
    copy = unattended.inbox_for_relaunch(tmp_path, [made])
    assert copy == {"adl-1": {"authorisation": doc, "command": ["/usr/bin/shutdown"],
                              "self_id_env": "AutoDLContainerUUID"}}
    other = host()
    other.vars["rgt_job"] = {**other.vars["rgt_job"], "name": "r-not-covered"}
    assert unattended.inbox_for_relaunch(tmp_path, [other]) is None  # a run the authorisation does not cover
    plain = host(offload={"to": "s3t:rgt/off"})
    assert unattended.inbox_for_relaunch(tmp_path, [plain]) is None  # the job no longer asks for stop_box
    path = unattended.auth_path(tmp_path, "adl-1")
    path.write_text(json.dumps(dict(doc, expires_ts=doc["created_ts"])))  # edited (and expired): refused
    assert unattended.inbox_for_relaunch(tmp_path, [made]) is None
