# -*- coding: utf-8 -*-
# Copyright: rgt contributors
# SPDX-License-Identifier: Apache-2.0
"""rgt_transfer: rsync between the controller and one box, on the controller (where rsync runs), reaching the box
with the host's own connection variables. The documentation is plugins/modules/rgt_transfer.py; the rules (argv,
retries, counting, progress, messages) are plugins/module_utils/rgt_rsync.py.

An action plugin rather than a module delegated to localhost: it runs in the controller's Ansible process, reads
the inventory host's connection variables itself (a delegated task would see localhost's, so the roles had to
copy them into Jinja), sees check mode, and costs no module round trip; rsync is its child, so Ansible's stop on
Ctrl-C reaches rsync with the worker's process group."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

from ansible_collections.rgt.remote_gpu.plugins.module_utils import rgt_rsync
from ansible_collections.rgt.remote_gpu.plugins.plugin_utils.rgt_action import ControllerAction

ARGUMENT_SPEC = dict(
    direction=dict(type="str", required=True, choices=["push", "pull"]),
    src=dict(type="str", required=True),
    dest=dict(type="str", required=True),
    files_from=dict(type="path"),
    entries=dict(type="list", elements="str"),
    repair_from=dict(type="path"),
    mkdir=dict(type="bool", default=False),
    partial_dir=dict(type="str", default=rgt_rsync.PARTIAL_DIR),
    timeout_s=dict(type="int", default=60),
    bwlimit=dict(type="int"),
    retries=dict(type="int", default=5),
    retry_delay_s=dict(type="int", default=3),
    progress_dir=dict(type="path"),
    progress_part=dict(type="str", default=""),
    progress_total=dict(type="list", elements="raw"),  # ints; an unknown part (null) counts nothing
)
# the ssh connection plugin's option for each of the host's connection variables (ansible_connection: the host's own)
OPTIONS = {"ansible_host": "host", "ansible_user": "remote_user", "ansible_port": "port",
           "ansible_ssh_private_key_file": "private_key_file", "ansible_ssh_common_args": "ssh_common_args",
           "ansible_ssh_extra_args": "ssh_extra_args"}
WHAT = {"push": "upload", "pull": "pull"}  # the progress file's name and records (runner/rgt/progress.py)


class ActionModule(ControllerAction):
    ARGUMENT_SPEC = ARGUMENT_SPEC
    VALIDATION = dict(required_if=[("direction", "pull", ("entries",))],
                      mutually_exclusive=[("files_from", "repair_from"), ("files_from", "entries"),
                                          ("mkdir", "entries")])

    def run(self, tmp=None, task_vars=None):
        task_vars = task_vars or {}
        result, args = self.start(tmp, task_vars)
        if self._task.check_mode:
            result.update(skipped=True, changed=False, msg="check mode: rsync sends nothing")
            return result
        name = str(task_vars.get("inventory_hostname"))
        connection = rgt_rsync.Connection.from_vars(name, self._connection_vars(task_vars))
        progress = None
        if args["progress_dir"]:
            what = WHAT[args["direction"]]
            try:
                parts = [int(n) for n in args["progress_total"] or [] if n not in (None, "")]
            except (TypeError, ValueError):
                result.update(failed=True, msg="progress_total must be a list of byte counts (integers), got %r"
                              % (args["progress_total"],))
                return result
            total = sum(parts) if parts else None
            progress = rgt_rsync.Progress(rgt_rsync.progress_file(args["progress_dir"], name, what), name, what,
                                          args["progress_part"], total)
        options = dict(partial_dir=args["partial_dir"], timeout_s=args["timeout_s"], bwlimit=args["bwlimit"])
        tries = dict(retries=max(0, args["retries"]), delay_s=max(0, args["retry_delay_s"]), progress=progress)
        try:
            if args["direction"] == "push":
                result.update(self._push(connection, args, options, tries))
            else:
                result.update(self._pull(connection, args, options, tries))
        except rgt_rsync.TransferError as exc:
            result.update(failed=True, changed=False, msg=str(exc))
        return result

    def _connection_vars(self, task_vars):
        """The host's connection settings as Ansible's own connection plugin resolved them for this task (inventory
        variables under any of their names, extra vars, ansible.cfg), so rsync's ssh carries the same user, port,
        key, options and pins; a setting the plugin does not have comes from the host's variable of that name."""
        found = {}
        for var in rgt_rsync.Connection.VARS:
            option = OPTIONS.get(var)
            try:
                if option is None:
                    raise KeyError(var)
                value = self._connection.get_option(option)
            except (KeyError, AttributeError):
                value = self._templar.template(task_vars[var]) if var in task_vars else None
            if value is not None:
                found[var] = value
        return found

    @staticmethod
    def _push(connection, args, options, tries):
        transfer = rgt_rsync.Transfer(connection, args["src"].rstrip("/") + "/", args["dest"], push=True,
                                      files_from=args["files_from"], mkdir=args["mkdir"], **options)
        done = rgt_rsync.run(transfer, **tries)
        if done["failed"]:
            done["msg"] = rgt_rsync.push_failure(transfer, done)
        return done

    @staticmethod
    def _pull(connection, args, options, tries):
        repair, entries = rgt_rsync.pull(connection, args["src"], args["dest"], args["entries"],
                                         repair_from=args["repair_from"], **dict(tries, **options))
        done = repair + entries
        failed = [r for r in done if r["failed"]]
        out = {"repair_results": repair, "entry_results": entries, "changed": any(r["changed"] for r in done),
               "failed": bool(failed), "bytes_sent": sum(r["bytes_sent"] for r in done),
               "bytes_received": sum(r["bytes_received"] for r in done),
               "files_transferred": sum(r["files_transferred"] for r in done)}
        if failed:
            out["msg"] = rgt_rsync.pull_failure(failed)
        return out
