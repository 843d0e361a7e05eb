"""The big documents a module returns are described key by key in its RETURN block (`contains:`), and the
description is the code's: the keys documented are exactly the keys returned."""

import yaml

from ansible_collections.rgt.remote_gpu.plugins.modules import rgt_pull_verify, rgt_teardown
from tests.unit.test_collect_report import VERIFIED, params
from tests.unit.test_rgt_gate import Layout


def contains(module, key: str) -> dict:
    doc = yaml.safe_load(module.RETURN)[key]
    assert doc["type"] == "dict" and doc.get("returned")
    return doc["contains"]


def test_the_collect_report_is_documented_key_by_key():
    report, _ = rgt_pull_verify.build_report(params(verify=VERIFIED, rsync=[{"item": "out", "rc": 0}]))
    assert set(contains(rgt_pull_verify, "report")) == set(report)


def test_the_gate_verdict_is_documented_key_by_key(tmp_path):
    lay = Layout(tmp_path)
    lay.sealed("proj", "run-a")
    verdict = lay.gate()
    assert set(contains(rgt_teardown, "gate")) == set(verdict)
    row_doc = contains(rgt_teardown, "gate")["runs"]["description"]
    for key in verdict["runs"][0]:
        assert key in row_doc, key


def test_the_status_document_is_documented_key_by_key(tmp_path):
    from ansible_collections.rgt.remote_gpu.plugins.module_utils import rgt_statusdoc
    from ansible_collections.rgt.remote_gpu.plugins.modules import rgt_status

    doc = rgt_statusdoc.status_document({"durable_root": str(tmp_path), "project": "p", "run_id": "r",
                                         "history_kb": 64, "other_run_ids": ["r2"]})
    documented = set(contains(rgt_status, "status"))
    optional = {"slurm", "queue_reason", "stop_reason"}  # only for a run under Slurm, a cell held at its budget
    assert set(doc) <= documented and documented - set(doc) == optional
    evidence = contains(rgt_status, "status")["evidence"]["description"]
    for key in doc["evidence"]:
        assert key in evidence, key
