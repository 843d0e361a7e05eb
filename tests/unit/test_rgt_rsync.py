"""rsync on the controller, one home (plugins/module_utils/rgt_rsync.py): the argv with the host's own SSH pins, the
retry rule, the counting, the messages, and the functions the runner can call without a play, with a real rsync."""

import json
import os
import shutil
import stat

import pytest
from ansible.parsing.dataloader import DataLoader
from ansible.template import Templar

from ansible_collections.rgt.remote_gpu.plugins.action.rgt_transfer import ActionModule
from ansible_collections.rgt.remote_gpu.plugins.module_utils import rgt_rsync as rs

PINS = "-o StrictHostKeyChecking=yes -o UserKnownHostsFile=/inv/known_hosts -o HostKeyAlias=pod-1"
needs_rsync = pytest.mark.skipif(shutil.which("rsync") is None, reason="needs rsync")


def box(**hostvars):
    return rs.Connection.from_vars("box1", dict({"ansible_host": "203.0.113.5", "ansible_user": "root",
                                                 "ansible_port": 2222, "ansible_ssh_extra_args": PINS}, **hostvars))


def test_a_push_reaches_the_box_with_its_port_key_and_pins_and_makes_its_destination():
    t = rs.Transfer(box(ansible_ssh_private_key_file="/keys/id ed"), "/src/", "/w/run/.code-1.partial", push=True,
                    files_from="/tmp/code.files", mkdir=True, timeout_s=60, bwlimit=500)
    argv = t.argv(log_file="/tmp/x.log")
    rsh = argv[argv.index("-e") + 1]
    assert rsh.startswith("ssh -p 2222 -i '/keys/id ed' -o BatchMode=yes -o ConnectTimeout=15") and rsh.endswith(PINS)
    assert argv[0] == "rsync" and "-s" not in argv and "--info=progress2" not in argv
    assert {"-a", "--no-owner", "--no-group", "--partial", "--partial-dir=.rsync-partial", "--timeout=60",
            "--stats", "--from0", "--files-from=/tmp/code.files", "--log-file=/tmp/x.log",
            "--log-file-format=%i %b %n", "--bwlimit=500"} <= set(argv)
    assert "--rsync-path=mkdir -p /w/run/.code-1.partial && rsync" in argv
    assert argv[-2:] == ["/src/", "root@203.0.113.5:/w/run/.code-1.partial/"]
    assert t.argv(progress=True)[:2] == ["rsync", "--info=progress2"]


def test_a_pull_passes_the_boxs_paths_unsplit_and_a_local_box_needs_no_ssh():
    t = rs.Transfer(box(ansible_host="2001:db8::1"), "/cap/ckpt", "/runs/r1/box1", push=False,
                    partial_dir="/runs/r1/.rsync-partial-box1", timeout_s=30)
    argv = t.argv()
    assert "-s" in argv and "--partial-dir=/runs/r1/.rsync-partial-box1" in argv
    assert not any(a.startswith("--rsync-path") for a in argv)
    assert argv[-2:] == ["root@[2001:db8::1]:/cap/ckpt", "/runs/r1/box1/"]
    local = rs.Transfer(box(ansible_connection="local"), "/cap/ckpt", "/runs/r1/box1", push=False)
    assert "-e" not in local.argv() and local.argv()[-2:] == ["/cap/ckpt", "/runs/r1/box1/"]


def test_only_a_broken_link_or_a_timeout_is_tried_again_never_a_host_key_that_fails_its_pin():
    assert [rc for rc in range(0, 256) if rs.should_retry(rc, "")] == [10, 12, 30, 35, 255]
    assert not rs.should_retry(255, "Host key verification failed.\r\nrsync: connection unexpectedly closed")
    assert not rs.should_retry(23, "some files vanished")


def test_every_attempts_bytes_and_files_are_counted_from_the_log():
    log = ("2026/01/01 [7] >f+++++++++ 1048576 a.bin\n2026/01/01 [7] sent 1,050,000 bytes  received 99 bytes\n"
           "2026/01/01 [8] >f..T...... 0 a.bin\n2026/01/01 [8] cd+++++++++ 0 sub\n"
           "2026/01/01 [8] sent 2.000 bytes  received 35 bytes  total size 9\n")
    assert rs.count_log(log) == (1052000, 134, 2)
    assert rs.total_size("Number of files: 3\nTotal file size: 1,234 bytes\n") == 1234
    assert rs.total_size("") is None


def test_a_failed_push_names_the_attempts_the_exit_code_and_says_rerun_or_check_the_pin():
    t = rs.Transfer(box(), "/home/me/code/", "/w/run/.code-1.partial")
    cut = rs.push_failure(t, {"rc": 30, "attempts": 6, "bytes_sent": 4096, "stderr": "rsync: timeout\n  (code 30)\n"})
    assert cut == ("rsync of /home/me/code to box1:/w/run/.code-1.partial failed after 6 attempt(s), rc 30: rsync: "
                   "timeout (code 30). Sent so far: 4096 bytes; re-run to resume (completed files are kept, the "
                   "partial file continues).")
    pin = rs.push_failure(t, {"rc": 255, "attempts": 1, "stderr": "Host key verification failed."})
    assert pin.endswith("rc 255: Host key verification failed.. The host key does not match its pin: check it with "
                        "rgt-run pin; never retried.")
    assert len(rs.push_failure(t, {"rc": 12, "stderr": "word " * 400})) < 800


def test_jinjas_truncate_is_kept_for_the_messages():
    assert rs.truncate("a" * 10, 8) == "a" * 10  # within the leeway of 5
    assert rs.truncate("one two three four five six", 12) == "one two..."
    assert rs.repair_label(["a.txt", "b/c.bin"]) == "the files changed locally (a.txt, b/c.bin)"


@pytest.fixture
def tree(tmp_path):
    src = tmp_path / "src"
    (src / "sub").mkdir(parents=True)
    (src / "a.bin").write_bytes(os.urandom(70000))
    (src / "sub" / "b.txt").write_text("b\n")
    return src


@needs_rsync
def test_the_runner_can_push_and_pull_without_a_play_resuming_and_counting(tmp_path, tree):
    local = rs.Connection("box1", local=True)
    (tmp_path / "code.files").write_bytes(b"a.bin\0sub/b.txt\0")
    dest = tmp_path / "box" / ".code-1.partial"
    push = rs.Transfer(local, str(tree) + "/", str(dest), files_from=str(tmp_path / "code.files"), mkdir=True)
    done = rs.run(push, retries=2)
    assert (done["rc"], done["attempts"], done["changed"], done["failed"]) == (0, 1, True, False)
    assert done["files_transferred"] == 2 and done["bytes_sent"] > 70000 and done["size"] == 70002
    assert stat.S_IMODE(dest.stat().st_mode) == 0o755 and (dest / "sub" / "b.txt").read_text() == "b\n"
    again = rs.run(push)
    assert again["rc"] == 0 and not again["changed"] and again["files_transferred"] == 0

    (tmp_path / "repair.files").write_bytes(b"sub/b.txt\0")
    (tmp_path / "runs").mkdir()
    (tmp_path / "runs" / "sub").mkdir()
    (tmp_path / "runs" / "sub" / "b.txt").write_text("x\n")  # same size: only --ignore-times re-sends it
    mtime = (dest / "sub" / "b.txt").stat().st_mtime_ns
    os.utime(tmp_path / "runs" / "sub" / "b.txt", ns=(mtime, mtime))
    progress = rs.Progress(str(tmp_path / "box1.pull.jsonl"), "box1", "pull", total=70002)
    repair, entries = rs.pull(local, str(dest), str(tmp_path / "runs"), ["a.bin", "sub"],
                              repair_from=str(tmp_path / "repair.files"), progress=progress,
                              partial_dir=str(tmp_path / ".rsync-partial-box1"))
    assert [r["item"] for r in repair] == ["the files changed locally (sub/b.txt)"]
    assert [(r["item"], r["rc"]) for r in entries] == [("a.bin", 0), ("sub", 0)]
    assert (tmp_path / "runs" / "sub" / "b.txt").read_text() == "b\n"
    assert (tmp_path / "runs" / "a.bin").read_bytes() == (tree / "a.bin").read_bytes()
    parts = {json.loads(line)["part"] for line in (tmp_path / "box1.pull.jsonl").read_text().splitlines()}
    assert parts == {"repair", "a.bin", "sub"}


@needs_rsync
def test_a_cut_link_is_tried_again_and_a_bad_source_is_not(tmp_path, tree, monkeypatch):
    """A stand-in `rsync` on PATH fails its first run with 30 (a timeout), then runs the real rsync."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "rsync"
    fake.write_text("#!/bin/sh\nif [ ! -e %s ]; then touch %s; echo 'timeout in data send' >&2; exit 30; fi\n"
                    "exec %s \"$@\"\n" % (tmp_path / "once", tmp_path / "once", shutil.which("rsync")))
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", "%s:%s" % (bin_dir, os.environ["PATH"]))
    waits = []
    local = rs.Connection("box1", local=True)
    done = rs.run(rs.Transfer(local, str(tree) + "/", str(tmp_path / "dst")), retries=3, delay_s=7,
                  sleep=waits.append)
    assert (done["rc"], done["attempts"], waits) == (0, 2, [7])
    missing = rs.run(rs.Transfer(local, str(tmp_path / "nothing") + "/", str(tmp_path / "dst")), retries=3,
                     sleep=waits.append)
    assert (missing["rc"], missing["attempts"], missing["failed"], waits) == (23, 1, True, [7])


class Resolved:
    """A connection plugin after Ansible set its options for the task (get_option; KeyError for one it lacks)."""

    def __init__(self, **options):
        self.options = options

    def get_option(self, option):
        return self.options[option]


def test_the_action_reaches_the_box_as_ansibles_own_ssh_plugin_resolved_it():
    """The key, port, user and pins rsync's ssh gets are the ones Ansible's ssh plugin resolved for the task (an
    inventory variable under any of its names, extra vars, ansible.cfg: molecule writes ansible_private_key_file),
    not only the variables of one spelling; molecule's upload_resume and collect scenarios run it for real."""
    action = ActionModule.__new__(ActionModule)
    action._templar = Templar(loader=DataLoader())
    action._connection = Resolved(host="203.0.113.5", remote_user="root", port=2222, private_key_file="/k/id",
                                  ssh_common_args="", ssh_extra_args=PINS)
    found = rs.Connection.from_vars("box1", action._connection_vars({"ansible_connection": "ssh",
                                                                      "ansible_port": 22}))
    assert found.rsh() == ("ssh -p 2222 -i /k/id -o BatchMode=yes -o ConnectTimeout=15 -o ServerAliveInterval=10 "
                           "-o ServerAliveCountMax=3 " + PINS)
    assert found.target() == "root@203.0.113.5:" and not found.local
    action._connection = Resolved()  # the local plugin has none of these options
    local = rs.Connection.from_vars("box1", action._connection_vars({"ansible_connection": "local"}))
    assert local.local and local.path("/cap") == "/cap"
