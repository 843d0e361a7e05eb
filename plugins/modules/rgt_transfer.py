#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: rgt contributors
# SPDX-License-Identifier: Apache-2.0
# The documentation of the action plugin plugins/action/rgt_transfer.py (it runs on the controller: nothing here
# runs). The rules are plugins/module_utils/rgt_rsync.py.

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: rgt_transfer
short_description: rsync between the controller and the box, resumable, retried, counted, with live progress
version_added: "0.1.0"
description:
  - Runs on the controller (an action plugin, because rsync runs here) and reaches the box with the host's own
    connection settings as Ansible's ssh connection plugin resolved them for the task (host, remote user, port,
    private key file, ssh common args and ssh extra args, from C(ansible_host), C(ansible_user), C(ansible_port),
    C(ansible_ssh_private_key_file) or C(ansible_private_key_file), C(ansible_ssh_common_args),
    C(ansible_ssh_extra_args) (the runner's host key pins live there), extra vars or ansible.cfg), as
    C(rsync -e "ssh -p PORT [-i KEY] -o BatchMode=yes -o ConnectTimeout=15 -o ServerAliveInterval=10
    -o ServerAliveCountMax=3 <common args> <extra args>"). C(ansible_connection) C(local) copies with a local
    rsync. Do not delegate it.
  - "The argv, as a list (no shell): C(rsync -a [-s] --no-owner --no-group [--ignore-times] --partial
    --partial-dir=P --timeout=T --stats [--from0 --files-from=LIST] --log-file=LOG --log-file-format='%i %b %n'
    [--bwlimit=K] [-e SSH [--rsync-path='mkdir -p DEST && rsync']] SRC DEST/). A pull passes the box's paths
    unsplit (C(-s))."
  - Retried I(retries) times I(retry_delay_s) apart on the exit codes worth another try (10, 12, 30, 35, 255),
    never after C(Host key verification failed). Each attempt resumes; finished files are skipped by rsync's quick
    check, a cut file continues from its kept partial.
  - Counts what every attempt moved from rsync's log (C(bytes_sent), C(bytes_received), C(files_transferred));
    C(changed) when at least one file's data was sent.
  - With I(progress_dir), adds C(--info=progress2) and appends the progress to
    C(<progress_dir>/<inventory_hostname>.<upload|pull>.jsonl) for rgt-run's live line; rsync's stdout (without
    the progress lines), stderr and exit status are returned unchanged.
  - Fails when a transfer did not finish, naming what, the attempts, rsync's exit code and message, and what to
    do (re-run, it resumes; or check the host key pin).
author:
  - rgt contributors
options:
  direction:
    description: C(push) sends I(src) on the controller to I(dest) on the box; C(pull) fetches from the box.
    type: str
    choices: [push, pull]
    required: true
  src:
    description:
      - push, the local directory whose contents are sent; pull, the directory on the box that holds I(entries).
    type: str
    required: true
  dest:
    description: The receiving directory (on the box for a push, on the controller for a pull).
    type: str
    required: true
  files_from:
    description: push, a NUL-separated list of paths relative to I(src) (C(--from0 --files-from)) to send.
    type: path
  entries:
    description: pull, the top-level names in I(src) to fetch into I(dest), each with its own rsync session.
    type: list
    elements: str
  repair_from:
    description:
      - pull, a NUL-separated list of paths relative to I(src) re-sent first with C(--ignore-times) (local files
        whose content differs though their size and mtime match); nothing when null.
    type: path
  mkdir:
    description: push, make I(dest) first (C(--rsync-path='mkdir -p DEST && rsync'), or here for a local box).
    type: bool
    default: false
  partial_dir:
    description: rsync C(--partial-dir); a relative one is inside each destination directory.
    type: str
    default: .rsync-partial
  timeout_s:
    description: rsync C(--timeout) (seconds without I/O before an attempt gives up).
    type: int
    default: 60
  bwlimit:
    description: rsync C(--bwlimit) in KiB/s; null for no cap.
    type: int
  retries:
    description: Extra attempts after the first, each resuming.
    type: int
    default: 5
  retry_delay_s:
    description: Seconds between attempts.
    type: int
    default: 3
  progress_dir:
    description: Controller directory for the live progress file; null for none (rsync runs without progress).
    type: path
  progress_part:
    description:
      - push, the part this transfer is in the progress records (C(code), C(data)); a pull names its parts
        C(repair) and each entry.
    type: str
    default: ""
  progress_total:
    description:
      - The byte counts (integers) of the host's whole transfer, summed for the live line's total; a null one (a
        part whose size is not known) counts nothing.
    type: list
    elements: raw
notes:
  - Supports check mode (sends nothing, reports skipped).
"""

EXAMPLES = r"""
- name: Send the code tree (resumable)
  rgt.remote_gpu.rgt_transfer:
    direction: push
    src: /home/me/project
    dest: /workspace/proj/active/run-1/.code-0123abcd.partial
    files_from: /tmp/rgt-upload-x/code.files
    mkdir: true

- name: Pull each top-level entry of the sealed export
  rgt.remote_gpu.rgt_transfer:
    direction: pull
    src: /workspace/proj/export/run-1
    dest: /home/me/runs/run-1/box1
    entries: [ckpt, logs, out, run.json]
    partial_dir: /home/me/runs/run-1/.rsync-partial-box1
"""

RETURN = r"""
rc:
  description: push, rsync's exit status of the last attempt (negative for a signal).
  returned: a push that ran
  type: int
attempts:
  description: push, the attempts made.
  returned: a push that ran
  type: int
stdout:
  description: push, rsync's stdout of the last attempt (the C(--stats) block), without progress lines.
  returned: a push that ran
  type: str
stderr:
  description: push, rsync's stderr of the last attempt.
  returned: a push that ran
  type: str
cmd:
  description: push, the rsync argv.
  returned: a push that ran
  type: list
  elements: str
bytes_sent:
  description: Bytes rsync sent, every attempt (and every transfer of a pull) together.
  returned: when it ran
  type: int
bytes_received:
  description: Bytes rsync received, every attempt together.
  returned: when it ran
  type: int
files_transferred:
  description: Files whose data moved, every attempt together.
  returned: when it ran
  type: int
size:
  description: push, the bytes of every file the transfer covers (C(--stats) "Total file size"), null without it.
  returned: a push that ran
  type: int
item:
  description: push, what was sent (I(src)).
  returned: a push that ran
  type: str
repair_results:
  description: pull, the repair's result (none or one), each as a push's (C(item) "the files changed locally (...)").
  returned: a pull that ran
  type: list
  elements: dict
entry_results:
  description: pull, one result per entry, each as a push's (C(item) the entry).
  returned: a pull that ran
  type: list
  elements: dict
msg:
  description: Why the transfer failed.
  returned: on failure
  type: str
"""
