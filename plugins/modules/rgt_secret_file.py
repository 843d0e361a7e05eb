#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: rgt contributors
# SPDX-License-Identifier: Apache-2.0

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: rgt_secret_file
short_description: Place a secret file (0600) on a box-local, non-shared path, atomically and idempotently
version_added: "0.1.0"
description:
  - Writes I(content) to I(dest) through a temporary file in the same directory (created under umask 077,
    fsync'd, then renamed over I(dest), and the directory fsync'd), so a reader never sees a partial file.
  - Idempotent. When I(dest) already holds the same bytes (compared by SHA-256 inside the module, never
    returned) and has I(mode), nothing is written and C(changed) is false.
  - Refuses a I(dest) under any of I(forbid_prefixes) (shared, network or durable-shared mounts from the
    profile), comparing both the path as written and with symlinks resolved. A secret on a shared filesystem
    is
    readable by other instances or team members, and some platforms' classifiers block key-shaped files there.
  - Creates missing parent directories with mode 0700. Existing directories are left as they are.
  - Returns nothing derived from the secret (no hash, no size), only C(dest), C(mode) and C(changed).
author:
  - rgt contributors
options:
  dest:
    description:
      - Path of the secret file on the box. C(~) expands to the login user's home and the profile placeholder
        C({user}) to the login user's name (also in I(forbid_prefixes)).
    type: path
    required: true
  content:
    description:
      - The file's exact content (for env_check, C(NAME=value) lines).
      - no_log. It travels inside the module payload over the SSH channel, never on a command line.
    type: str
    required: true
  mode:
    description: Permissions of the file. Anything readable or writable by group or others is refused.
    type: raw
    default: "0600"
  forbid_prefixes:
    description: Mount paths that must never hold a secret; I(dest) under any of them fails the task.
    type: list
    elements: path
    default: []
notes:
  - B(Pipelining must be on) (C(ansible.cfg) of this collection sets C(pipelining = True)). With pipelining
    the
    module and its arguments reach the remote interpreter on stdin; without it Ansible first writes the
    module,
    arguments included, into the remote temporary directory, which may sit on a shared home filesystem.
  - The calling task must set C(no_log) true as well, so that nothing about the task (loop items, templated
    arguments) reaches the output or callbacks.
  - Supports check mode (reports whether a write would happen, writes nothing).
seealso:
  - module: rgt.remote_gpu.rgt_env_check
"""

EXAMPLES = r"""
- name: Place the job's secrets (box-local, 0600)
  rgt.remote_gpu.rgt_secret_file:
    dest: /root/.rgt-secrets/myproj.env
    content: "WANDB_API_KEY={{ lookup('ansible.builtin.env', 'WANDB_API_KEY') }}\n"
    forbid_prefixes: [/root/autodl-fs]
  no_log: true
"""

RETURN = r"""
dest:
  description: The path written (as given, after C(~) expansion).
  returned: always
  type: str
  sample: /root/.rgt-secrets/myproj.env
mode:
  description: The file's mode, octal string.
  returned: always
  type: str
  sample: "0600"
"""

import hashlib
import hmac
import os
import stat
import tempfile

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.common.text.converters import to_bytes

from ansible_collections.rgt.remote_gpu.plugins.module_utils import rgt_runlayout


def resolve(path):
    """A profile path on the box: `{user}` and a leading `~` (the one expansion, module_utils/rgt_runlayout)."""
    return rgt_runlayout.expand_root(path) if path else path


def parse_mode(module, value):
    if isinstance(value, int):
        mode = value
    else:
        text = str(value).strip()
        try:
            mode = int(text, 8)
        except ValueError:
            module.fail_json(msg="mode must be an octal string such as '0600', got %r" % (value,))
    if mode & ~0o7777:
        module.fail_json(msg="mode %o is out of range" % mode)
    if mode & 0o077:
        module.fail_json(msg="mode %04o lets group or others read or write the secret; use 0600 or 0400"
                         % mode)
    return mode


def _under(path, prefix):
    path = os.path.normpath(path)
    prefix = os.path.normpath(prefix)
    if prefix == os.sep:
        return True
    return path == prefix or path.startswith(prefix.rstrip(os.sep) + os.sep)


def forbidden_prefix(dest, prefixes):
    """The first prefix that dest lies under, by written path or with symlinks resolved; None when allowed."""
    candidates = {os.path.abspath(dest), os.path.realpath(dest)}
    for prefix in prefixes:
        if not prefix:
            continue
        for resolved_prefix in {os.path.abspath(prefix), os.path.realpath(prefix)}:
            if any(_under(c, resolved_prefix) for c in candidates):
                return prefix
    return None


def same_content(path, wanted_digest):
    h = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(65536), b""):
            h.update(block)
    return hmac.compare_digest(h.digest(), wanted_digest)


def make_parents(directory):
    missing = []
    while directory and not os.path.isdir(directory):
        missing.append(directory)
        parent = os.path.dirname(directory)
        if parent == directory:
            break
        directory = parent
    for path in reversed(missing):
        os.mkdir(path, 0o700)
        os.chmod(path, 0o700)


def write_atomic(dest, data, mode):
    directory = os.path.dirname(dest) or "."
    old_umask = os.umask(0o077)
    try:
        make_parents(directory)
        fd, tmp = tempfile.mkstemp(prefix=".rgt-secret-", suffix=".tmp", dir=directory)
    finally:
        os.umask(old_umask)
    try:
        with os.fdopen(fd, "wb") as handle:
            os.fchmod(handle.fileno(), mode)
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.rename(tmp, dest)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    dir_fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def main():
    module = AnsibleModule(
        argument_spec=dict(
            dest=dict(type="path", required=True),
            content=dict(type="str", required=True, no_log=True),
            mode=dict(type="raw", default="0600"),
            forbid_prefixes=dict(type="list", elements="path", default=[]),
        ),
        supports_check_mode=True,
    )
    dest = resolve(module.params["dest"])
    forbid = [resolve(p) for p in module.params["forbid_prefixes"]]
    mode = parse_mode(module, module.params["mode"])
    result = dict(changed=False, dest=dest, mode="%04o" % mode)

    if not os.path.isabs(dest):
        module.fail_json(msg="dest %s must be an absolute path" % dest, **result)
    hit = forbidden_prefix(dest, forbid)
    if hit:
        module.fail_json(msg="refusing to place a secret at %s: it is under %s, a shared/durable mount in "
                             "forbid_prefixes (other instances or people can read it there). Choose a "
                             "box-local path, e.g. set the profile's secrets.dir or env_check_secrets_file."
                             % (dest, hit), **result)
    if os.path.islink(dest) or (os.path.exists(dest) and not os.path.isfile(dest)):
        module.fail_json(msg="refusing to replace %s: it exists and is not a regular file" % dest, **result)

    data = to_bytes(module.params["content"], errors="surrogate_or_strict")
    digest = hashlib.sha256(data).digest()

    if os.path.isfile(dest):
        current_mode = stat.S_IMODE(os.stat(dest).st_mode)
        try:
            unchanged = same_content(dest, digest)
        except (IOError, OSError):
            unchanged = False
        if unchanged and current_mode == mode:
            module.exit_json(**result)
        if unchanged:
            if not module.check_mode:
                os.chmod(dest, mode)
            result["changed"] = True
            module.exit_json(**result)

    result["changed"] = True
    if not module.check_mode:
        try:
            write_atomic(dest, data, mode)
        except (IOError, OSError) as exc:
            module.fail_json(msg="could not write %s: %s" % (dest, exc.strerror or exc), **result)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
