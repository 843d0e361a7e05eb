# -*- coding: utf-8 -*-
# Copyright: rgt contributors
# SPDX-License-Identifier: Apache-2.0

from __future__ import annotations

DOCUMENTATION = r"""
name: profile
author: rgt contributors
short_description: Load a validated rgt platform profile
description:
  - Reads C(profiles/<name>.yml) from the collection root, validates it against
    C(profiles/schema/profile.schema.json) and returns the profile as a dictionary.
  - Validation errors fail the task with the file, the JSON path of the bad field
    (for example C(mounts[1].survives[0])) and how to fix it.
  - A detach primitive or meter-stop verb that is not registered in C(plugins/module_utils/rgt_registry.py) is
    such an error (field C(detach.primitive), C(meter_stop.verb), C(meter_stop.api.client), ...).
  - Profiles are cached per process (keyed by path and modification time).
  - Runs on the controller; needs the Python packages C(PyYAML) and C(jsonschema).
options:
  _terms:
    description: Profile name(s), for example C(autodl) or C(runpod). Normally one.
    required: true
    type: list
    elements: str
  profiles_dir:
    description:
      - Directory that holds C(<name>.yml) files, to use your own profiles.
      - Defaults to the collection's C(profiles/) directory.
      - User profiles are validated against the same schema.
    type: path
    required: false
notes:
  - The lookup returns a one-element list per name (lookup convention);
    C(lookup('rgt.remote_gpu.profile', name)) unwraps a single element into the dictionary.
"""

EXAMPLES = r"""
- name: Load the profile the inventory names
  ansible.builtin.set_fact:
    probe_profile: "{{ lookup('rgt.remote_gpu.profile', rgt_profile) }}"

- name: Show the durable root and the meter-stop verb
  ansible.builtin.debug:
    msg: >-
      {{ lookup('rgt.remote_gpu.profile', 'autodl').roots.durable }}
      {{ lookup('rgt.remote_gpu.profile', 'autodl').meter_stop.verb }}

- name: Use a profile from your own directory
  ansible.builtin.debug:
    msg: "{{ lookup('rgt.remote_gpu.profile', 'mycluster', profiles_dir='/etc/rgt/profiles') }}"
"""

RETURN = r"""
_raw:
  description:
    - One validated profile dictionary per name (see C(profiles/README.md) and the schema for every key).
  type: list
  elements: dict
"""

from ansible.errors import AnsibleError  # noqa: E402
from ansible.plugins.lookup import LookupBase  # noqa: E402

try:
    from ansible_collections.rgt.remote_gpu.plugins.module_utils.rgt_profiles import (
        ProfileError,
        load_profile,
        profile_path,
    )
    from ansible_collections.rgt.remote_gpu.plugins.module_utils.rgt_registry import profile_problems

    IMPORT_ERROR = None
except ImportError as exc:  # PyYAML or jsonschema missing on the controller
    IMPORT_ERROR = exc

_KNOWN_KWARGS = {"profiles_dir"}


class LookupModule(LookupBase):
    def run(self, terms, variables=None, **kwargs):
        if IMPORT_ERROR is not None:
            raise AnsibleError(
                f"rgt.remote_gpu.profile needs PyYAML and jsonschema on the controller: {IMPORT_ERROR}"
            )
        unknown = sorted(set(kwargs) - _KNOWN_KWARGS)
        if unknown:
            raise AnsibleError(
                f"rgt.remote_gpu.profile: unknown option(s) {', '.join(unknown)}; "
                f"allowed: {', '.join(sorted(_KNOWN_KWARGS))}"
            )
        profiles_dir = kwargs.get("profiles_dir") or None
        if not terms:
            raise AnsibleError(
                "rgt.remote_gpu.profile: give a profile name, e.g. lookup('rgt.remote_gpu.profile', 'autodl')"
            )
        results = []
        for term in terms:
            try:
                profile = load_profile(str(term), profiles_dir=profiles_dir)
                for field, message, fix in profile_problems(profile)[:1]:  # the same rule as the runner's
                    raise ProfileError(field, message, fix, str(profile_path(str(term), profiles_dir)))
                results.append(profile)
            except ProfileError as err:
                raise AnsibleError(
                    f"rgt profile {term!s} ({err.source or 'no file'}): field {err.field}: {err.message}. "
                    f"Fix: {err.fix}"
                ) from None
        return results
