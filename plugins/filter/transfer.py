# -*- coding: utf-8 -*-
# Copyright: rgt contributors
# SPDX-License-Identifier: Apache-2.0
"""Filters that turn a host's Ansible connection variables into rsync's remote shell and target.

upload_resume and collect both call rsync on the controller (delegate_to: localhost); they must reach the box
exactly as Ansible does, pins included, so they build the ssh command from the same variables here."""

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

from shlex import quote

BASE_OPTIONS = ("-o BatchMode=yes -o ConnectTimeout=15 -o ServerAliveInterval=10 -o ServerAliveCountMax=3")


def rsync_rsh(port, key="", common_args="", extra_args=""):
    parts = ["ssh", "-p", str(port or 22)]
    if key:
        parts += ["-i", quote(str(key))]
    parts += [BASE_OPTIONS, common_args or "", extra_args or ""]
    return " ".join(p for p in parts if p)


def rsync_target(host, user=""):
    """`[user@]host:`; an IPv6 literal gets brackets."""
    host = str(host)
    if ":" in host and not host.startswith("["):
        host = "[%s]" % host
    return "%s%s:" % ("%s@" % user if user else "", host)


class FilterModule(object):
    def filters(self):
        return {"rsync_rsh": rsync_rsh, "rsync_target": rsync_target}
