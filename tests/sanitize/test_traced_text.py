"""Traced strings get the same cleaning in the terminal report and in MCP results."""

from __future__ import annotations

import pytest

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


def test_precomputed_classes_are_what_this_python_computes() -> None:
    """charclasses.py is generated: regenerating it on this Python gives the committed file, byte for byte."""
    import unicodedata
    from pathlib import Path

    from ingero_mcp import charclasses, sanitize

    computed = sanitize.compute_classes()
    if charclasses.UNICODE_VERSION == unicodedata.unidata_version:
        assert computed == (charclasses.DROP, charclasses.SPACE)
        assert sanitize.classes_module_text() == Path(charclasses.__file__).read_text()
        assert sanitize.classes() is not computed and sanitize.classes() == computed  # read, not walked
    else:  # another Unicode version: the classes are computed, never the committed ones taken on trust
        assert sanitize.classes() == computed


def test_another_unicode_version_computes_the_classes(monkeypatch: pytest.MonkeyPatch) -> None:
    import unicodedata

    from ingero_mcp import charclasses, sanitize

    monkeypatch.setattr(charclasses, "UNICODE_VERSION", "0.0.0")
    sanitize._patterns.cache_clear()
    try:
        drop, space = sanitize.classes()
        assert drop is not charclasses.DROP and (drop, space) == sanitize.compute_classes()
        assert clean(HOSTILE) == "ptdata_worker[31m IGNORE PREVIOUS"  # patterns built from the computed classes
    finally:
        monkeypatch.undo()
        sanitize._patterns.cache_clear()
    # back on this Python's own version: the committed classes, no walk (another version walks)
    assert (sanitize.classes()[0] is charclasses.DROP) == (charclasses.UNICODE_VERSION == unicodedata.unidata_version)
    assert clean(HOSTILE) == "ptdata_worker[31m IGNORE PREVIOUS"



def test_plain_strings_are_what_the_patterns_would_make(monkeypatch: pytest.MonkeyPatch) -> None:
    """`clean`'s fast path (printable ASCII, no run of spaces, none at either end) gives what the patterns give: of
    printable ASCII only the space is in a class, and random plain and near-plain strings (runs and ends of spaces,
    a tab, DEL, a non-ASCII letter, capped or not) clean the same with the fast path and without it."""
    import random

    from ingero_mcp import sanitize

    assert [c for c in map(chr, range(0x20, 0x7F)) if sanitize.alters(c)] == [" "]
    rng = random.Random(20)
    alphabet = "ab Z9_-:/.,()[]{}%=\t\x7f\xe9"
    made = [""] + ["".join(rng.choice(alphabet) for _ in range(rng.randint(1, 30))) for _ in range(3000)]
    fast = {(text, cap): clean(text, cap) for text in made for cap in (10, 200)}
    plain = sum(map(sanitize._plain, made))
    monkeypatch.setattr(sanitize, "_plain", lambda text: False)  # every string through the patterns
    assert {(text, cap): clean(text, cap) for text, cap in fast} == fast
    assert 300 < plain < len(made) - 300  # both paths were tried
