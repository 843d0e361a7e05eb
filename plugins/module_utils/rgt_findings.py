# -*- coding: utf-8 -*-
# Copyright: rgt contributors
# SPDX-License-Identifier: Apache-2.0
"""What every rgt check produces: findings with a severity, and one verdict over them (docs/internals.md
"Findings").

One shape for every phase (probe, env_check, and any later check):

    {"id": "gpu_none", "severity": "critical", "message": "...", "fix": "...", "data": {...}}

- id: stable, so tests and the runner can key on it;
- severity: critical | warning | info;
- message: what is wrong, as a fact about this box;
- fix: what the user does about it, one line ("" when there is nothing to do);
- data: the facts behind the message for machines ({} when none). Never a secret.

Runs on the remote box (Python 3.6+, stdlib only)."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

SEVERITIES = ("critical", "warning", "info")


def finding(fid, severity, message, fix="", data=None):
    """One finding in the shape above; ValueError for a severity that is not one of SEVERITIES."""
    if severity not in SEVERITIES:
        raise ValueError("unknown severity %r" % (severity,))
    return {"id": fid, "severity": severity, "message": message, "fix": fix or "", "data": dict(data or {})}


def worst_first(findings):
    """The findings sorted critical, warning, info (stable: equal severities keep their order)."""
    order = dict((s, i) for i, s in enumerate(SEVERITIES))
    return sorted(findings, key=lambda f: order.get(f.get("severity"), len(SEVERITIES)))


def verdict(findings):
    """fail when any finding is critical, warn when any is a warning, else ok."""
    severities = set(f["severity"] for f in findings)
    if "critical" in severities:
        return "fail"
    if "warning" in severities:
        return "warn"
    return "ok"
