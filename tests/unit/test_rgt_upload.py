"""upload_resume's record (plugins/module_utils/rgt_upload.py): the report the runner reads (upload_resume_report),
built from what the role's steps registered whatever step stopped it, and its line in the controller ledger."""

import json

from ansible_collections.rgt.remote_gpu.plugins.module_utils import rgt_upload as up

TREE = {"hash8": "0123abcd", "files": 3, "bytes": 300, "ignored_count": 2, "crlf_scripts": [], "symlinks": ["l"],
        "skipped": []}
KEYS = {"host", "run_id", "run_dir", "status", "rc_hint", "hash8", "code_dir", "files", "bytes", "bytes_sent",
        "files_transferred", "attempts", "ignored_count", "crlf_scripts", "crlf", "symlinks_skipped", "skipped",
        "mismatches", "missing", "data", "seconds"}


def test_an_upload_reports_what_was_sent_where_and_its_data_part():
    steps = {"code_tree": TREE, "existing": {"ok": False, "dir": "/w/p/active/r1/code-0123abcd"},
             "code_rsync": {"rc": 0, "attempts": 2, "bytes_sent": 310, "files_transferred": 3},
             "promoted": {"promoted": True}, "data_tree": {"files": 1, "bytes": 9},
             "data_rsync": {"rc": 0, "attempts": 1, "bytes_sent": 12, "files_transferred": 1},
             "data_verified": {"ok": True}}
    report = up.build_report("box1", "r1", "refuse", steps, data_src="data", started=100.0, now=103.456)
    assert set(report) == KEYS
    assert report["status"] == "uploaded" and report["rc_hint"] is None
    assert (report["run_dir"], report["code_dir"]) == ("/w/p/active/r1", "/w/p/active/r1/code-0123abcd")
    assert (report["bytes_sent"], report["files_transferred"], report["attempts"]) == (310, 3, 2)
    assert report["symlinks_skipped"] == ["l"] and report["seconds"] == 3.46
    assert report["data"] == {"dir": "/w/p/active/r1/data", "files": 1, "bytes": 9, "bytes_sent": 12,
                              "files_transferred": 1, "attempts": 1, "verified": True}


def test_the_status_names_what_stopped_the_upload():
    def status(check_mode=False, **steps):
        return up.build_report("b", "r1", steps.pop("crlf", "refuse"), steps, check_mode=check_mode)["status"]

    assert status(code_tree=dict(TREE, crlf_scripts=["run.sh"])) == "refused"
    assert status(code_tree=dict(TREE, crlf_scripts=["run.sh"]), crlf="allow", existing={"ok": True}) == "present"
    assert status(code_tree=TREE, existing={"ok": False, "rc_hint": 3}) == "not_deployed"
    assert status(code_tree=TREE, existing={"ok": False}, code_rsync={"rc": 30, "attempts": 6}) == "failed"
    assert status(code_tree=TREE, existing={"ok": False}, check_mode=True) == "checked"
    assert status(code_tree=TREE, existing={"ok": False}, code_rsync={"skipped": True}) == "failed"
    bad = up.build_report("b", "r1", "refuse", {"code_tree": TREE, "existing": {"ok": False, "dir": "/c"},
                                                "promoted": {"rc_hint": 3, "mismatches": [{"path": "a.py"}],
                                                             "missing": ["b.py"]}})
    assert (bad["status"], bad["rc_hint"], bad["mismatches"], bad["missing"]) == ("not_deployed", 3, ["a.py"],
                                                                                  ["b.py"])
    assert bad["attempts"] == 0 and bad["data"] is None  # no transfer ran, no data asked for


def test_each_upload_is_a_line_in_the_hosts_ledger_file(tmp_path):
    ledger = tmp_path / "ledger" / "uploads"
    first = up.build_report("box1", "r1", "refuse", {"code_tree": TREE})
    path = up.record(str(ledger), "box1", first, at="2026-01-01T00:00:00Z")
    up.record(str(ledger), "box1", dict(first, run_id="r2"), at="2026-01-01T00:01:00Z")
    lines = [json.loads(line) for line in (ledger / "box1.jsonl").read_text().splitlines()]
    assert path == str(ledger / "box1.jsonl")
    assert [(r["run_id"], r["at"]) for r in lines] == [("r1", "2026-01-01T00:00:00Z"), ("r2", "2026-01-01T00:01:00Z")]
    assert (ledger / "box1.jsonl").read_text().splitlines()[0] == json.dumps(dict(first, at=lines[0]["at"]),
                                                                            sort_keys=True)
