# -*- coding: utf-8 -*-
# Copyright: rgt contributors
# SPDX-License-Identifier: Apache-2.0
"""Bounded commands and lenient file reads for modules that gather facts on the box (Python 3.6+, stdlib)."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import os
import subprocess


def run(argv, timeout):
    """Run a command bounded by `timeout`, C locale; never raises. Returns (rc, out, err); 124 on timeout."""
    env = dict(os.environ)
    env["LC_ALL"] = "C"
    env["LANG"] = "C"
    try:
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env,
                                universal_newlines=True)
    except OSError as exc:
        return 127, "", str(exc)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        return 124, out or "", "timed out after %ss" % timeout
    return proc.returncode, out or "", err or ""


def read(path):
    """File text or None (missing or unreadable files are facts, not errors)."""
    try:
        with open(path) as handle:
            return handle.read()
    except (IOError, OSError):
        return None
