# -*- coding: utf-8 -*-
"""What every rgt check produces: findings with a severity, and one verdict over them.

Runs on the remote box (Python 3.6+, stdlib only)."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

SEVERITIES = ("critical", "warning", "info")


def verdict(findings):
    """fail when any finding is critical, warn when any is a warning, else ok."""
    severities = set(f["severity"] for f in findings)
    if "critical" in severities:
        return "fail"
    if "warning" in severities:
        return "warn"
    return "ok"
