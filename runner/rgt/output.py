"""Where rgt-run's output goes: a command's result on stdout, everything else on stderr.

A listing or reading command (`profiles`, `profiles show`, `status`, `runs`, `logs`, the plan of `train -C`, the
final summary of `watch`) prints its result on stdout, so `rgt-run profiles | grep autodl` and `| less` work;
progress, warnings, hints and errors go to stderr (`messages()`, the console rgt.cli hands every command).
Under --json stdout holds only the one JSON document (`emit`, every command's): the result's human rendering
goes to stderr instead. That holds for the whole command line (`set_json`, called by rgt.cli.main): a command run
inside another one (watch inside `lifecycle --json`) never prints a result on stdout.

A console whose stream is not a terminal (a pipe, a file) is WIDE columns wide, so a table row stays one line
and no word is folded (`runnin/g`); on a terminal, tables fit the terminal.
"""

from __future__ import annotations

import json
import sys

from rich.console import Console

WIDE = 4096  # columns of a console that is no terminal: every row of rgt's tables fits on one line

_json = False  # this command line prints one JSON document on stdout (rgt.cli.main)


def set_json(as_json: bool) -> None:
    """Say whether this process's stdout is reserved for one JSON document."""
    global _json
    _json = bool(as_json)


def _console(stderr: bool) -> Console:
    console = Console(stderr=stderr, highlight=False, soft_wrap=True)
    if not console.is_terminal:
        console.width = WIDE
    return console


def messages() -> Console:
    """Progress, warnings, hints and errors: stderr, at the terminal's width."""
    return Console(stderr=True, highlight=False, soft_wrap=True)


def results(as_json: bool = False) -> Console:
    """Where a command prints its result: stdout, or stderr under --json (`as_json`, or this command line's)."""
    return _console(stderr=as_json or _json)


def emit(doc: dict, as_json: bool) -> None:
    """A command's one JSON document on stdout, when the command line asked for --json (`as_json`)."""
    if as_json:
        sys.stdout.write(json.dumps(doc, sort_keys=True, default=str) + "\n")
        sys.stdout.flush()
