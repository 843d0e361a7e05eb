"""`rgt-run pull`'s per-host line: what failed, in plain words (the CLI tests drive the rest)."""

from rgt.pull import host_line


def test_the_files_are_named_by_kind_with_the_other_problems():
    doc = {"error": "box: PULL NOT VERIFIED for r/box: missing locally: out/a; SHA-256 differs: out/b; checkpoint "
                    "ckpt/c.pt does not load (torch): bad zip",
           "missing": ["out/a"], "sha_mismatch": ["out/b"],
           "problems": ["missing locally: out/a; SHA-256 differs: out/b", "checkpoint ckpt/c.pt does not load (torch): "
                        "bad zip"]}
    assert host_line("box", doc) == ("box: NOT verified: 1 file(s) missing here: out/a; 1 file(s) whose content "
                                     "differs from the box's (SHA-256): out/b; checkpoint ckpt/c.pt does not load "
                                     "(torch): bad zip")
    many = {"unexpected": [f"out/x{i}" for i in range(8)]}
    assert host_line("box", many).endswith("8 file(s) unexpected here (never deleted; move it away): out/x0, out/x1, "
                                           "out/x2, out/x3, out/x4 and 3 more")


def test_a_failed_transfer_is_the_cause_and_a_module_message_loses_its_prefix():
    doc = {"error": "box: rsync failed for out (rc 30): timeout Re-run to resume. PULL NOT VERIFIED for r/box: "
                    "missing locally: out/a", "rsync_failed": ["out"], "missing": ["out/a"]}
    assert host_line("box", doc).startswith("box: NOT verified: rsync failed for out (rc 30): timeout Re-run")
    full = {"error": "box: PULL NOT VERIFIED for r/box: every file matched, but /r/box.PROVENANCE.md could not be "
                     "written: the local disk is full (No space left on device)"}
    assert host_line("box", full) == ("box: NOT verified: every file matched, but /r/box.PROVENANCE.md could not be "
                                      "written: the local disk is full (No space left on device)")
    ok = {"verified": True, "files": 3, "bytes": 2_000_000, "dest": "/r/box", "repaired": ["out/a"]}
    assert host_line("box", ok) == ("box: verified: 3 files, 2.0 MB, SHA-256 match -> /r/box (re-sent 1 file(s) "
                                    "changed locally: out/a)")


def test_a_capped_or_unsealed_log_is_said_under_the_hosts_line():
    logs = {"max_bytes": 1 << 20, "files": [
        {"path": "logs/job.log", "source": "/w/run/logs/job.log", "sealed": True, "capped": True,
         "reason": "capped: bytes 10 to 20 (...) are not in the export: it is capped at 1.0 MiB (collect_log_max_mb)"},
        {"path": "logs/attempts.jsonl", "source": "/w/run/.rgt/attempts.jsonl", "sealed": True, "reason": None},
        {"path": None, "source": "/w/run/logs/tb", "sealed": False, "reason": "not sealed: it is a directory"}]}
    ok = {"verified": True, "files": 3, "bytes": 2_000_000, "dest": "/r/box", "logs": logs}
    assert host_line("box", ok).splitlines() == [
        "box: verified: 3 files, 2.0 MB, SHA-256 match -> /r/box",
        "  log /w/run/logs/job.log: capped: bytes 10 to 20 (...) are not in the export: it is capped at 1.0 MiB "
        "(collect_log_max_mb)",
        "  log /w/run/logs/tb: not sealed: it is a directory"]
