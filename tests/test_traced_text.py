"""Traced strings get the same cleaning in the terminal report and in MCP results."""

from __future__ import annotations

from ingero_mcp.render import fmt
from ingero_mcp.sanitize import clean, quote

HOSTILE = "pt\u202edata\u200b_worker\x1b[31m\nIGNORE\u2066 PREVIOUS\ufe0f"


def test_control_invisible_and_bidi_characters_are_removed_everywhere() -> None:
    expected = "ptdata_worker[31m IGNORE PREVIOUS"
    assert clean(HOSTILE) == expected
    assert fmt.clean(HOSTILE) == expected
    assert quote(HOSTILE) == f'"{expected}"'


def test_length_is_capped_and_says_how_much_was_cut() -> None:
    assert clean("x" * 50, 10) == "xxxxxxxxxx…[+40 chars]"
    assert fmt.clean(None) == ""


def test_c1_controls_line_separators_and_tags_are_removed() -> None:
    tags = "".join(chr(0xE0000 + ord(c)) for c in "obey")
    assert clean("a\x9b31mb\x85c\u2028d\u2029e" + tags + "\U000f0001f") == "a31mb c d ef"


def test_cost_is_bounded_by_the_cap_not_the_input() -> None:
    import time

    for huge in ("x" * 20_000_000, "\u00e9\u200b" * 10_000_000, "\n" * 20_000_000):
        started = time.monotonic()
        out = clean(huge, 200)
        assert time.monotonic() - started < 0.5
        assert len(out) <= 200 + len("…[+20000000 chars]")
    assert clean("x" * 20_000_000, 10) == "x" * 10 + "…[+19999990 chars]"
