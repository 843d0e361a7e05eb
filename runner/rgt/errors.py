"""Exit codes (docs/internals.md "Exit codes") and the one error type that maps to each of them."""

from __future__ import annotations

import argparse
from typing import NoReturn

OK = 0
FAILED = 1
BAD_INPUT = 2
REFUSED = 3
UNREACHABLE = 4
ATTENTION = 5
INTERRUPTED = 130  # Ctrl-C: what a shell reports for SIGINT (128 + 2)

# a playbook's outcome, worst first (rgt.phases.PhaseResult.exit_code): identity, input, failure, transport
PHASE_ORDER = (REFUSED, BAD_INPUT, FAILED, UNREACHABLE, OK)


def worst(codes) -> int:
    """The exit code of several plays of one command (PHASE_ORDER; OK for none)."""
    codes = list(codes)
    return next((c for c in PHASE_ORDER if c in codes), OK)


class RgtError(Exception):
    """An error the user can act on: a message, an optional fix, and the exit code it maps to."""

    exit_code = FAILED

    def __init__(self, message: str, fix: str | None = None, field: str | None = None):
        super().__init__(message)
        self.message = message
        self.fix = fix
        self.field = field

    def as_dict(self) -> dict:
        return {"error": self.message, "fix": self.fix, "field": self.field, "exit_code": self.exit_code}


class InputError(RgtError):
    """Malformed inventory, profile, job spec or flag: nothing was touched."""

    exit_code = BAD_INPUT


class Unreachable(RgtError):
    """A box could not be reached (refused, timed out, no route, no such name): says nothing about a job on it."""

    exit_code = UNREACHABLE


class GateRefused(RgtError):
    """A gate said no (host identity, teardown, disk floor, live-run mutation)."""

    exit_code = REFUSED


class ArgumentParser(argparse.ArgumentParser):
    """argparse that reports a bad command line like every other input error: one message, the fix, exit 2,
    and the JSON error document under --json (plain argparse prints usage and exits on its own)."""

    def error(self, message: str) -> NoReturn:
        raise InputError(f"{self.prog}: {message}", fix=f"see `{self.prog} --help`", field="argv")
