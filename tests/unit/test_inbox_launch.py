"""`rgt_job.offload.stop_box` at launch (rgt.unattended.inbox_at_launch): exit 2 naming the field, before anything
is launched, without `train --down` naming the instance, without an offload to an rclone remote, or on a profile
that refuses an in-box stop; otherwise the box's copy is the very authorisation the ledger then keeps."""

import json

import pytest
from rich.console import Console

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
