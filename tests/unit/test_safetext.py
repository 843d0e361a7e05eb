"""rgt.safetext.printable: what a box may write (escape sequences, C0/C1 controls, newlines in one-line fields)
never reaches a terminal as control; the text around it stays."""

import pytest

from rgt.safetext import printable


@pytest.mark.parametrize("text, shown", [
    ("\x1b[2J\x1b[H\x1b[1;32mverified: 999 files\x1b[0m", "verified: 999 files"),  # CSI: clear, home, colour
    ("a\x1b]0;rgt: verified\x07b", "ab"),  # OSC window title, BEL-terminated
    ("a\x1b]8;;http://x\x1b\\link\x1b]8;;\x1b\\b", "alinkb"),  # OSC 8 hyperlink, ST-terminated
    ("a\x1bP1$r q\x1b\\b", "ab"),  # DCS string
    ("a\x1b_apc\x9cb", "ab"),  # APC ended by the 8-bit ST
    ("a\x9b2Jb\x9d0;t\x07c", "abc"),  # 8-bit CSI and OSC
    ("a\x1bcb\x1b7c\x1b(Bd", "abcd"),  # reset, save cursor, charset
    ("open\x1b]0;the rest is swallowed", "open"),  # an unterminated string runs to the end, as on a terminal
    ("half\x1b[", "half"), ("lone\x1b", "lone"),
    ("nul\x00bs\x08bell\x07del\x7fnel\x85", "nulbsbelldelnel"),
    ("over\rwrite", "overwrite"),  # a carriage return cannot overwrite what came before it
    ("tab\tstays", "tab\tstays"), ("ünïcode ✓ 日本", "ünïcode ✓ 日本"),
    ("one\ntwo\r\nthree", "one\\ntwo\\nthree"),  # one field, one line: a newline is shown escaped
    (None, "None"), (0.5, "0.5"), (3, "3"),
])
def test_printable_removes_control_and_keeps_the_text(text, shown):
    assert printable(text) == shown


def test_multiline_keeps_newlines_and_strips_the_rest():
    assert printable("line 1\x1b[2K\r\nline 2\x1b]0;t\x07\n", multiline=True) == "line 1\nline 2\n"


def test_nothing_a_box_can_write_survives_as_a_control_character():
    every = "".join(chr(c) for c in range(0x00, 0xa0)) + "".join(f"\x1b{chr(c)}" for c in range(0x20, 0x7f))
    out = printable(every * 3)
    assert not [ch for ch in out if ord(ch) < 0x20 and ch != "\t" or 0x7f <= ord(ch) < 0xa0]
