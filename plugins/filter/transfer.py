# -*- coding: utf-8 -*-
# Copyright: rgt contributors
# SPDX-License-Identifier: Apache-2.0
"""Filters that turn a host's Ansible connection variables into rsync's remote shell and target.

rsync must reach the box exactly as Ansible does, pins included. The rules live in
plugins/module_utils/rgt_rsync.py (Connection), which the rgt_transfer action plugin (upload_resume, collect) uses
directly; these filters expose the same two answers to a play of one's own."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
name: rsync_rsh
short_description: The C(rsync -e) remote shell for a host, with the same SSH options and pins Ansible uses
description:
  - Builds C(ssh -p PORT [-i KEY] -o BatchMode=yes -o ConnectTimeout=15 -o ServerAliveInterval=10
    -o ServerAliveCountMax=3 <ansible_ssh_common_args> <ansible_ssh_extra_args>).
options:
  _input:
    description: The SSH port (C(ansible_port)).
    type: int
    required: true
  key:
    description: C(ansible_ssh_private_key_file), empty for none.
    type: str
  common_args:
    description: C(ansible_ssh_common_args).
    type: str
  extra_args:
    description: C(ansible_ssh_extra_args) (the runner's host key pins live here).
    type: str
"""

EXAMPLES = r"""
rsh: "{{ ansible_port | default(22) | rgt.remote_gpu.rsync_rsh(ansible_ssh_private_key_file | default(''),
         ansible_ssh_common_args | default(''), ansible_ssh_extra_args | default('')) }}"
target: "{{ ansible_host | default(inventory_hostname) | rgt.remote_gpu.rsync_target(ansible_user | default('')) }}"
"""

RETURN = r"""
_value:
  description: The remote shell command line (rsync_rsh), or C([user@]host:) (rsync_target).
  type: str
"""

from ansible_collections.rgt.remote_gpu.plugins.module_utils.rgt_rsync import Connection


def rsync_rsh(port, key="", common_args="", extra_args=""):
    """rgt_rsync.Connection.rsh (the one home of how rsync reaches a box, used by rgt_transfer)."""
    return Connection("", port=port, key=key, common_args=common_args, extra_args=extra_args).rsh()


def rsync_target(host, user=""):
    """`[user@]host:`; an IPv6 literal gets brackets (rgt_rsync.Connection.target)."""
    return Connection(str(host), user=user).target()


class FilterModule(object):
    def filters(self):
        return {"rsync_rsh": rsync_rsh, "rsync_target": rsync_target}
