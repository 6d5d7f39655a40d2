"""Word wrapping that never starts a line with traced text: a break is never placed before or inside a name
recorded on the traced host (a process may call itself "SYSTEM: obey ..."), so every line starts with the
renderer's own words or indent. A run that cannot be broken is left long rather than cut or broken inside.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence

WORD = re.compile(r"\S+")
MIN_WORD = 4  # words of a short multi-word name protected on their own (it may reach the text shortened)
CONTINUED = "> "  # starts a line that continues a traced string too long for one line (never the string itself)
SHORT_NAME = 40  # a longer string (a command line, a collector's note) is protected whole, its words not alone


def protected_spans(text: str, names: Iterable[str]) -> list[tuple[int, int]]:
    """Where the given (cleaned) traced strings occur in `text`, as [start, end) character spans."""
    spans: list[tuple[int, int]] = []
    for name in names:
        words = name.split() if len(name) <= SHORT_NAME else []
        needles = [name] + ([w for w in words if len(w) >= MIN_WORD] if len(words) > 1 else [])
        for needle in needles:
            at = text.find(needle)
            while at >= 0:
                spans.append((at, at + len(needle)))
                at = text.find(needle, at + 1)
    return spans


def breakable(starts: Sequence[int], spans: Sequence[tuple[int, int]]) -> list[bool]:
    """For each word start, whether a line may begin there: not at nor inside a protected span."""
    if not spans:
        return [True] * len(starts)
    return [not any(lo <= s < hi for lo, hi in spans) for s in starts]


def wrap(text: str, width: int, first: str = "", rest: str | None = None, protect: Iterable[str] = ()) -> list[str]:
    """`text` (already cleaned: one line) wrapped to `width` columns: the first line after `first`, the others after
    `rest` (default: spaces as wide as `first`). Lines break only between words, never before or inside a
    protected string. A traced run too long for a line of its own is broken between words, each continuation line
    starting with CONTINUED after `rest`; a single word longer than a line is left long, never cut."""
    rest = " " * len(first) if rest is None else rest
    words = list(WORD.finditer(text))
    if not words:
        return [first.rstrip()]
    ok = breakable([w.start() for w in words], protected_spans(text, [n for n in protect if n]))
    groups: list[str] = []  # runs of words no line may start inside, with their own spacing kept
    start = end = 0
    for i, w in enumerate(words):
        if i == 0 or ok[i]:
            if i:
                groups.append(text[start:end])
            start = w.start()
        end = w.end()
    groups.append(text[start:end])
    lines: list[str] = []
    line = first
    fresh = True  # nothing placed on `line` yet
    for g in groups:
        if fresh or len(line) + 1 + len(g) <= width:
            line = line + ("" if fresh else " ") + g
            fresh = False
            continue
        lines.append(line)
        if len(rest) + len(g) > width and " " in g:  # a long traced run: broken, each piece after a continuation mark
            pieces = wrap(g, width, rest, rest + CONTINUED)
            lines += pieces[:-1]
            line = pieces[-1]
        else:
            line = rest + g
    lines.append(line)
    return lines
