"""When the ledger's record of a probe is reused instead of probing again (rgt_probe_eval.reuse): only the same
instance behind the same pinned host key, asked the same question, not failed, and young enough."""

import pytest

from ansible_collections.rgt.remote_gpu.plugins.module_utils.rgt_probe_eval import probe_inputs_digest, reuse

ARGS = {"durable_root": "/workspace", "project": "rgt", "gpu_request": {"count": 1}, "python": "/usr/bin/python3"}
NOW = 1_000_000.0


def record(**kw):
    doc = {"instance_id": "pod-1", "verdict": "ok",
           "probed": {"at": NOW - 42, "pin": "pin-a", "inputs": probe_inputs_digest(ARGS)}}
    doc.update(kw)
    return doc


def test_a_recent_probe_of_the_same_box_is_reused_and_says_how_old():
    assert reuse(record(), "pod-1", "pin-a", probe_inputs_digest(ARGS), NOW, 300) == (True, "reused, taken 42 s ago")
    assert reuse(record(verdict="warn"), "pod-1", "pin-a", probe_inputs_digest(ARGS), NOW, 300)[0]


@pytest.mark.parametrize("previous, instance, pin, args, max_age, why", [
    (record(verdict="fail"), "pod-1", "pin-a", ARGS, 300, "blocking problem"),
    (record(verdict=None), "pod-1", "pin-a", ARGS, 300, "blocking problem"),
    (record(), "pod-2", "pin-a", ARGS, 300, "another instance"),
    (record(), "pod-1", "pin-b", ARGS, 300, "host key pin"),
    (record(), "pod-1", "", ARGS, 300, "host key pin"),
    (record(), "pod-1", "pin-a", {**ARGS, "gpu_request": {"count": 8}}, 300, "asked other things"),
    (record(), "pod-1", "pin-a", ARGS, 41, "42 s old"),
    (record(), "pod-1", "pin-a", ARGS, 0, "reuse off"),
    (record(probed={"at": NOW + 5, "pin": "pin-a", "inputs": probe_inputs_digest(ARGS)}), "pod-1", "pin-a", ARGS,
     300, "old"),
    (record(probed={}), "pod-1", "pin-a", ARGS, 300, "no time"),
    (record(probed="x"), "pod-1", "pin-a", ARGS, 300, "no time"),
    (None, "pod-1", "pin-a", ARGS, 300, "no earlier probe"),
    ([], "pod-1", "pin-a", ARGS, 300, "no earlier probe"),
])
def test_anything_else_is_probed_again(previous, instance, pin, args, max_age, why):
    reusable, said = reuse(previous, instance, pin, probe_inputs_digest(args), NOW, max_age)
    assert not reusable and why in said
