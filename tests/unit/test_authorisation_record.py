"""rgt.unattended's record rules: the digest over an authorisation's own content, why one does not allow a stop,
and --down-expires."""

import pytest

from rgt import unattended
from rgt.errors import InputError


def doc(**over) -> dict:
    base = {"schema": unattended.SCHEMA, "instance_id": "pod-1", "hosts": ["box"], "runs": [
        {"project": "p", "run_id": "r", "host": "box"}], "created_ts": 100.0, "expires_ts": 200.0,
        "expires_at": "then"}
    base["sha256"] = unattended.digest(base)
    base.update(over)
    return base


def test_an_intact_unexpired_authorisation_for_the_instance_allows_the_stop():
    assert unattended.problem(doc(), "pod-1", now=150) is None


@pytest.mark.parametrize(("record", "iid", "now", "said"), [
    (None, "pod-1", 150, "no authorisation"),
    (doc(), "pod-2", 150, "names instance 'pod-1', not 'pod-2'"),
    (doc(), "pod-1", 200, "expired at then"),
    (doc(expires_ts=900.0), "pod-1", 150, "SHA-256 does not match"),
    (doc(runs=[]), "pod-1", 150, "SHA-256 does not match"),
    (doc(schema="rgt/authorisation/v0"), "pod-1", 150, "SHA-256 does not match"),
])
def test_what_refuses_a_stop(record, iid, now, said):
    assert said in unattended.problem(record, iid, now=now)


def test_expiry_durations_and_the_file_name_of_an_odd_instance_id(tmp_path):
    assert [unattended.parse_expiry(t) for t in ("7d", "12h", "90m", "30s", "2")] == [
        7 * 86400, 12 * 3600, 90 * 60, 30, 2 * 86400]
    for bad in ("0d", "soon", "-1h", "1w"):
        with pytest.raises(InputError) as err:
            unattended.parse_expiry(bad)
        assert err.value.field == "--down-expires"
    assert unattended.auth_path(tmp_path, "pod-1").name == "pod-1.json"
    odd = unattended.auth_path(tmp_path, "../x y")
    assert odd.parent == tmp_path / "authorisations" and odd.name.startswith("id-")
