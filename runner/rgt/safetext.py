"""Text that comes from a box, made safe to show: no terminal control sequence reaches a terminal or a message.

A box writes its own log lines, loss strings, error messages, file names and cell failure reasons. Printed as
they are, an escape sequence could clear the screen, retitle the window, move the cursor over rgt's own lines or
forge one such as `verified: 999 files`; a newline inside a one-line field could start a line that looks like
rgt's. `printable(text)` is the one rule, used wherever box text is printed or sent (rgt.status, rgt.logs,
rgt.sweeps, rgt.runreport, rgt.pull, rgt.teardown, rgt.notify): it removes ESC sequences (CSI, OSC, DCS, SOS,
PM and APC strings, the two-byte ones) and their 8-bit C1 forms, then every other C0/C1 control character and
DEL except tab. In a one-line field (the default) a newline is shown escaped (`\\n`); with `multiline=True` it is
kept (a message made of lines). Everything else, Unicode included, is left as it is. JSON output (`--json`) is
not passed through it: JSON escapes control characters itself, and a machine gets the box's text unchanged.
"""

from __future__ import annotations

import re

# an escape string (OSC, DCS, SOS, PM, APC) runs to its terminator (BEL, ST as ESC \ or the C1 byte); one left
# open runs to the end, as a terminal would swallow it
_STRING = r"(?:\x1b[\]PX^_]|[\x90\x98\x9d\x9e\x9f])[^\x07\x1b\x9c]*(?:\x07|\x1b\\|\x9c)?"
_CSI = r"(?:\x1b\[|\x9b)[\x30-\x3f]*[\x20-\x2f]*[\x40-\x7e]?"
_ESC = r"\x1b[\x20-\x2f]*[\x30-\x7e]?"  # ESC c (reset), ESC 7/8 (cursor), ESC ( B (charset), ...
_SEQUENCE = re.compile(f"{_STRING}|{_CSI}|{_ESC}")
_CONTROL = re.compile(r"[\x00-\x08\x0a-\x1f\x7f-\x9f]")  # C0 but tab, DEL, C1
_CONTROL_KEEP_NL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def printable(text: object, multiline: bool = False) -> str:
    """`text` (any value, as str() shows it) without terminal control sequences or control characters but tab;
    a newline shown as `\\n` unless `multiline`."""
    value = _SEQUENCE.sub("", text if isinstance(text, str) else str(text))
    value = value.replace("\r\n", "\n")
    if multiline:
        return _CONTROL_KEEP_NL.sub("", value)
    return _CONTROL.sub("", value.replace("\n", "\\n"))
