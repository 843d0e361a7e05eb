"""The collect role's report and failure message, built once in Python (plugins/module_utils/rgt_pullverify.py
build_report, the module rgt_pull_verify's) from the results the role's steps registered: the runner and the
teardown gate read this report, and the message is what the user sees for the host."""

from ansible_collections.rgt.remote_gpu.plugins.module_utils.rgt_pullverify import build_report


def params(**report):
    return {"host": "box", "run_id": "r1", "instance_id": "i-1", "dest": "/runs/r1/box",
            "manifest_path": "/runs/r1/box.manifest.json", "report": report}


VERIFIED = {"verified": True, "manifest_sha256": "a" * 64, "files": 3, "bytes": 30, "marker": "/m",
            "msg": "PULL VERIFIED"}


def test_a_verified_pull_has_no_error_and_names_what_rsync_sent():
    report, failure = build_report(params(
        closeout={"sealed": True, "msg": "sealed", "capsule": "/cap", "files": 9},
        rsync=[{"item": "out", "rc": 0, "changed": True}, {"item": "ckpt", "rc": 0, "changed": False},
               {"item": "x", "skipped": True}],
        verify=VERIFIED, verify_only=False))
    assert failure is None
    assert report["error"] is None and report["verified"] is True and report["sealed"] is True
    assert report["files"] == 3 and report["capsule"] == "/cap"
    assert report["rsync_entries"] == ["out", "ckpt"] and report["rsync_changed"] == ["out"]
    assert report["rsync_failed"] == [] and report["logs"] is None  # a closeout without a logs record


def test_the_closeouts_logs_record_is_in_the_report():
    logs = {"max_bytes": 1 << 20, "files": [{"path": "logs/job.log", "source": "/r/logs/job.log", "sealed": True,
                                             "capped": True, "reason": "capped: bytes 10 to 20 ..."}]}
    report, failure = build_report(params(closeout={"sealed": True, "logs": logs}, verify=VERIFIED))
    assert failure is None and report["logs"] == logs


def test_a_failed_rsync_names_entry_rc_and_stderr_and_says_rerun():
    report, failure = build_report(params(
        repair=[{"item": "the files changed locally (a)", "rc": 0}],
        rsync=[{"item": "out", "rc": 30, "stderr": "  timeout\n in data  "}], verify=VERIFIED))
    assert failure == ("box: rsync failed for out (rc 30): timeout in data Re-run to resume (completed files are "
                       "kept, the partial file continues).")
    assert report["error"] == failure and report["rsync_failed"] == ["out"]


def test_a_host_key_mismatch_says_check_the_pin_and_long_stderr_is_cut_at_a_word():
    _, failure = build_report(params(
        rsync=[{"item": "out", "rc": 255, "stderr": "Host key verification failed. " + "word " * 200}],
        verify={"verified": False, "msg": "PULL NOT VERIFIED for r1/box: missing a"}))
    assert "(rc 255): Host key verification failed. word" in failure
    assert "... The host key does not match its pin: check it with rgt-run pin; never retried." in failure
    assert failure.endswith("never retried. PULL NOT VERIFIED for r1/box: missing a")
    assert len(failure) < 600


def test_a_verification_that_did_not_run_is_a_failure():
    report, failure = build_report(params(verify={"skipped": True}))
    assert failure == "box: verification did not run" and report["verified"] is False


def test_a_step_failing_before_verification_is_the_hosts_message():
    report, failure = build_report(params(closeout={"failed": True}, failed=True, error="out/sub is a symlink"))
    assert failure == "out/sub is a symlink" and report["error"] == "out/sub is a symlink"
    report, failure = build_report(params(failed=True, error=None))
    assert failure == "collect failed" and report["error"] == "failed"


def test_check_mode_reports_without_failing():
    report, failure = build_report(params(verify={"skipped": True}), check_mode=True)
    assert failure is None and report["error"] is None
