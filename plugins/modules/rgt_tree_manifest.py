#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: rgt contributors
# SPDX-License-Identifier: Apache-2.0

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: rgt_tree_manifest
short_description: Manifest a local code tree (ignore rules, SHA-256 per file, hash8, CRLF scripts, skipped files)
version_added: "0.1.0"
description:
  - Run on the controller (delegated to C(localhost)). Walks I(src) without following symlinks, applies the
    tree's ignore rules (C(.rgtignore) when present, else C(.gitignore); gitignore syntax) and always leaves out
    C(.git), C(__pycache__/) and C(.rgt/).
  - Returns the manifest sorted by path, each file's SHA-256 (read in 1 MiB chunks), and C(hash8), the first
    8 hex digits of the SHA-256 of the sorted C(relpath\0sha256\n) list, which names the box's C(code-<hash8>)
    directory (docs/internals.md, "Run spine").
  - "Lists the scripts with CRLF line ends (C(crlf_scripts)); a script is a file with a shell suffix (C(.sh),
    C(.bash), C(.zsh), C(.ksh), C(.command)) or one that starts with a shebang (C(#!)). A CR there becomes part of
    each line's last word (an argument C(ok\\r), C($'\\r': command not found)); CRLF in other files (C(.csv),
    C(.py) without a shebang) is fine. With O(crlf=refuse) the module fails naming each script and the fix."
  - Lists what it skips, with a warning each - symlinks (never followed), non-regular files (fifos, sockets,
    devices), names that are not valid UTF-8 and names the relative-path rule refuses (a backslash, a leading
    C(C:)) - and returns them all in C(skipped) (C(path), C(kind)).
  - With I(files_from), writes the NUL-separated path list for C(rsync --from0 --files-from=FILE).
author:
  - rgt contributors
options:
  src:
    description: The local directory to ship.
    type: path
    required: true
  ignore_file:
    description:
      - Use this ignore file instead of C(.rgtignore)/C(.gitignore) (absolute, or relative to I(src)). Must exist.
    type: path
  files_from:
    description: Write the NUL-separated list of the manifest's paths to this file (mode 0600).
    type: path
  crlf:
    description:
      - What to do with scripts that have CRLF line ends - C(refuse) fails the task naming each one and the fix
        (nothing else is written), C(allow) lists them in C(crlf_scripts) and goes on.
    type: str
    choices: [refuse, allow]
    default: allow
notes:
  - Reads only; writing I(files_from) is the one side effect, and it happens in check mode too (it is a scratch
    file on the controller). C(changed) is always false.
"""

EXAMPLES = r"""
- name: Manifest the code tree
  rgt.remote_gpu.rgt_tree_manifest:
    src: "{{ playbook_dir }}/../src"
    files_from: /tmp/rgt-upload/code.files
  delegate_to: localhost
  register: tree
"""

RETURN = r"""
src:
  description: Absolute path of the tree.
  returned: always
  type: str
ignore_file:
  description: The ignore file applied, or null.
  returned: always
  type: str
manifest:
  description: Shipped files, sorted by path.
  returned: always
  type: list
  elements: dict
  sample: [{"path": "train.py", "bytes": 1234, "sha256": "9f86d0..."}]
hash8:
  description: First 8 hex digits of tree_sha256; the box directory is code-<hash8>.
  returned: always
  type: str
  sample: 0123abcd
tree_sha256:
  description: SHA-256 of the sorted "relpath\0sha256\n" list.
  returned: always
  type: str
files:
  description: Number of files shipped.
  returned: always
  type: int
bytes:
  description: Total size of the shipped files.
  returned: always
  type: int
crlf_scripts:
  description: Paths (relative to src) of the scripts (shell suffix or shebang) that have CRLF line ends.
  returned: always
  type: list
  elements: str
ignored_count:
  description: Entries left out by the ignore rules (an ignored directory counts once).
  returned: always
  type: int
symlinks:
  description: Symlinks found and skipped (never followed, never shipped).
  returned: always
  type: list
  elements: str
special:
  description: Non-regular files skipped (fifos, sockets, devices).
  returned: always
  type: list
  elements: str
undecodable:
  description: Names skipped because they are not valid UTF-8 (Python repr of the path).
  returned: always
  type: list
  elements: str
unsafe:
  description: Names skipped because the relative-path rule refuses them (a backslash, a leading drive prefix
    such as C(C:)); see rgt_runlayout.check_relpath.
  returned: always
  type: list
  elements: str
skipped:
  description: Everything skipped and never shipped, sorted by path; kind is symlink, special, undecodable or
    unsafe.
  returned: always
  type: list
  elements: dict
  sample: [{"path": "data", "kind": "symlink"}]
files_from:
  description: Path of the written list, or null.
  returned: always
  type: str
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.rgt.remote_gpu.plugins.module_utils.rgt_tree import manifest_step

ARGUMENT_SPEC = dict(
    src=dict(type="path", required=True),
    ignore_file=dict(type="path"),
    files_from=dict(type="path"),
    crlf=dict(type="str", choices=["refuse", "allow"], default="allow"),
)


def main():
    # rgt-run's plays run the action plugin of the same name (plugins/action/rgt_tree_manifest.py: the same step
    # in Ansible's worker, no module process); this file is what ansible-doc shows and a plain module run uses
    module = AnsibleModule(argument_spec=ARGUMENT_SPEC, supports_check_mode=True)
    params = module.params
    doc, warnings, failure = manifest_step(params["src"], params["ignore_file"], params["files_from"],
                                           params["crlf"])
    for warning in warnings:
        module.warn(warning)
    if failure:
        module.fail_json(msg=failure, **(doc or {}))
    module.exit_json(changed=False, **doc)


if __name__ == "__main__":
    main()
