# -*- coding: utf-8 -*-
# Copyright: rgt contributors
# SPDX-License-Identifier: Apache-2.0

from __future__ import annotations

DOCUMENTATION = r"""
name: rgt_bundle
author: rgt contributors
short_description: A bundle of rgt's box-side code (a script and the module_utils it imports)
description:
  - Builds one of the bundles of C(plugins/module_utils/rgt_bundle.py) from this collection - the one bundler of
    box-side code that is not an Ansible module - and returns it as a dictionary C({name, entry, digest, files}).
  - C(files) maps each file's name in the bundle to its source; C(entry) is the script to run; C(digest) is the
    content hash of the names and sources.
  - The module_utils a script needs are read from its imports, never listed by hand.
  - C(wrapper) and C(queue) are flat (the script and its module_utils side by side, imports made flat), what
    C(rgt.remote_gpu.rgt_launch) installs next to a run (C(wrapper_bundle)) or a sweep (C(queue_bundle));
    C(ckpt_loader) is the checkpoint loader C(rgt.remote_gpu.rgt_closeout) runs with the job's python
    (C(loader_bundle)). C(k8s_stage) and C(k8s_seal) are the runner's Kubernetes ConfigMaps, C(status) its status
    round's zipapp.
  - Runs on the controller; stdlib only.
options:
  _terms:
    description: Bundle name(s) - C(wrapper), C(queue), C(ckpt_loader), C(k8s_stage), C(k8s_seal), C(status).
    required: true
    type: list
    elements: str
notes:
  - With one name, C(lookup) gives that bundle's dictionary itself; C(query) (or several names) gives a list with
    one bundle per name.
"""

EXAMPLES = r"""
- name: Show what the job wrapper ships (its files and their content hash)
  ansible.builtin.debug:
    msg: "{{ bundle.files | list }} digest {{ bundle.digest }}"
  vars:
    bundle: "{{ lookup('rgt.remote_gpu.rgt_bundle', 'wrapper') }}"
"""

RETURN = r"""
_raw:
  description:
    - One bundle per name - C(name), C(entry) (the file to run), C(digest) (content hash),
      C(files) (each file name in the bundle mapped to its source).
  type: list
  elements: dict
"""

from ansible.errors import AnsibleError  # noqa: E402
from ansible.plugins.lookup import LookupBase  # noqa: E402

from ansible_collections.rgt.remote_gpu.plugins.module_utils import rgt_bundle  # noqa: E402


class LookupModule(LookupBase):
    def run(self, terms, variables=None, **kwargs):
        if kwargs:
            raise AnsibleError(f"rgt.remote_gpu.rgt_bundle takes no options (got {', '.join(sorted(kwargs))})")
        if not terms:
            raise AnsibleError("rgt.remote_gpu.rgt_bundle: give a bundle name, e.g. "
                               "lookup('rgt.remote_gpu.rgt_bundle', 'wrapper')")
        try:
            return [rgt_bundle.build(str(term)).as_dict() for term in terms]
        except (rgt_bundle.BundleError, OSError) as err:
            raise AnsibleError(f"rgt.remote_gpu.rgt_bundle: {err}") from None
