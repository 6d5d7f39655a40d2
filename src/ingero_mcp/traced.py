"""Strings recorded on the traced host (process names, command lines, paths, imported text) are data.

A hostile process can name itself to look like an instruction or hide characters that reorder
or conceal text, so everything that reaches a terminal or a model goes through `clean` first:
control, zero-width, bidi and other invisible characters removed, whitespace folded, length capped.
"""

from __future__ import annotations

import unicodedata

DEFAULT_CAP = 200
# Unicode categories removed outright (with the control characters, Cc): format characters (zero-width spaces and joiners, bidi
# embeddings/overrides/isolates, BOM, soft hyphen), surrogates, private use, unassigned.
_DROP_CATEGORIES = frozenset({"Cf", "Cs", "Co", "Cn"})
# Invisible characters of other categories, removed too: variation selectors (which can carry a
# hidden payload one byte per selector), the combining grapheme joiner, Hangul fillers.
_INVISIBLE_RANGES = ((0xFE00, 0xFE0F), (0xE0100, 0xE01EF), (0x034F, 0x034F), (0x115F, 0x1160), (0x3164, 0x3164), (0xFFA0, 0xFFA0))


def _invisible(ch: str) -> bool:
    code = ord(ch)
    return any(lo <= code <= hi for lo, hi in _INVISIBLE_RANGES)


# Replaced by a space: line breaks, tabs and other separators (so words stay apart); every other
# control character (NUL, BEL, ESC, DEL, C1 controls) is removed.
_SPACE_CHARS = frozenset("\t\n\r\x0b\x0c\x1c\x1d\x1e\x1f\x85\u2028\u2029")


def clean(text: str, cap: int = DEFAULT_CAP) -> str:
    """`text` without control, invisible or bidi characters, whitespace runs folded, at most `cap` chars."""
    out: list[str] = []
    last_space = False
    for ch in text:
        category = unicodedata.category(ch)
        if ch in _SPACE_CHARS or category == "Zs":
            if not last_space:
                out.append(" ")
            last_space = True
            continue
        if category in _DROP_CATEGORIES or category == "Cc" or _invisible(ch):
            continue
        out.append(ch)
        last_space = False
    result = "".join(out).strip()
    if len(result) > cap:
        dropped = len(result) - cap
        result = f"{result[:cap]}…[+{dropped} chars]"
    return result
