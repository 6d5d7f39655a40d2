"""Tables laid out for a width: text columns wrap (at spaces, a longer word folded), number columns never break,
nothing is cut with an ellipsis. Optional columns are dropped (highest `drop` first) before anything wraps.

A table that may hold traced text in its first column or wrap a cell starts every line with a gutter ("| "
piped, a box-drawing bar on a terminal), so no line begins with a traced name.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from rich.text import Text

GAP = "  "
WRAP_MIN = 10  # a wrapping column is not narrowed below this (or its longest word, if shorter)
WRAP_WORD = 24  # a wrapping column keeps its longest word whole up to this width, while other columns can give


@dataclass
class Column:
    """A column: header, alignment, whether its cells may wrap, and its drop priority (0: never dropped)."""

    header: str
    right: bool = True
    wrap: bool = False
    drop: int = 0
    cells: list[str] = field(default_factory=list)


def _words_width(text: str) -> int:
    """The length of the longest word of `text` (0 for none)."""
    return max((len(w) for w in text.split()), default=0)


def fold(text: str, width: int) -> list[str]:
    """`text` in lines of at most `width`: broken at spaces, a word longer than the width cut into pieces."""
    width = max(1, width)
    lines: list[str] = []
    line = ""
    for word in text.split():
        while len(word) > width:
            if line:
                lines.append(line)
                line = ""
            lines.append(word[:width])
            word = word[width:]
        if not line:
            line = word
        elif len(line) + 1 + len(word) <= width:
            line += " " + word
        else:
            lines.append(line)
            line = word
    if line or not lines:
        lines.append(line)
    return lines


def _fit_header(header: str, lines: int, least: int) -> int:
    """The narrowest width (at least `least`) at which `header` takes at most `lines` lines."""
    w = max(least, _words_width(header))
    while len(fold(header, w)) > lines:
        w += 1
    return w


def _widths(cols: list[Column], room: int) -> list[int]:
    """Column widths within `room` characters of content. From natural widths (headers on one line), narrowed step
    by step until the table fits: headers over two lines; wrapping columns to their longest word (up to
    WRAP_WORD); headers over as many lines as their words; wrapping columns to WRAP_MIN. What still does not fit
    overflows."""
    cell_w = [max((len(x) for x in c.cells), default=0) for c in cols]
    word_w = [min(WRAP_WORD, max((_words_width(x) for x in c.cells), default=0)) for c in cols]
    widths = [max(len(c.header), w) for c, w in zip(cols, cell_w)]
    excess = sum(widths) - room
    steps = [
        ([_fit_header(c.header, 2, w if not c.wrap else min(w, WRAP_WORD)) for c, w in zip(cols, cell_w)], False),
        ([max(_fit_header(c.header, 2, 0), w, WRAP_MIN) if c.wrap else 0 for c, w in zip(cols, word_w)], True),
        ([max(_words_width(c.header), cw if not c.wrap else min(ww, cw)) for c, cw, ww in zip(cols, cell_w, word_w)],
         False),
        ([max(_words_width(c.header), min(w, WRAP_MIN)) if c.wrap else 0 for c, w in zip(cols, cell_w)], True),
    ]
    for floor, wrap_only in steps:
        if excess <= 0:
            break
        excess = _narrow(cols, widths, floor, excess, (lambda c: c.wrap) if wrap_only else (lambda c: True))
    return widths


def _narrow(cols: list[Column], widths: list[int], floor: list[int], excess: int,
            which: Callable[[Column], bool]) -> int:
    """Narrow the chosen columns (the one with most to give first) toward their floor by `excess`; what is left."""
    while excess > 0:
        candidates = [i for i, c in enumerate(cols) if which(c) and widths[i] > floor[i]]
        if not candidates:
            break
        i = max(candidates, key=lambda j: widths[j] - floor[j])
        step = min(excess, widths[i] - floor[i], max(1, (widths[i] - floor[i]) // 2))
        widths[i] -= step
        excess -= step
    return excess


def layout(columns: list[Column], width: int, gutter: str = "", header_style: str = "bold",
           rule: str | None = "-", short: bool = False) -> list[Text]:
    """The table's lines (header, a rule of `rule` unless None, the rows), each starting with `gutter`; columns dropped
    by priority until the table fits `width` (with `short`, until it fits with every header on one line), then
    headers and text columns wrapped."""
    cols = list(columns)

    def room(cs: list[Column]) -> int:
        return width - len(gutter) - len(GAP) * (len(cs) - 1)

    def natural(cs: list[Column]) -> int:
        head = len if short else _words_width
        return sum(max([head(c.header)] + [len(x) for x in c.cells]) for c in cs)
    while natural(cols) > room(cols) and any(c.drop for c in cols):
        cols.remove(max((c for c in cols if c.drop), key=lambda c: c.drop))
    widths = _widths(cols, room(cols))

    def block(values: list[str], style: str = "") -> list[Text]:
        parts = [fold(v, w) if (c.wrap or len(v) > w) else [v] for c, v, w in zip(cols, values, widths)]
        out = []
        for k in range(max(len(p) for p in parts)):
            cells = [(p[k] if k < len(p) else "") for p in parts]
            line = GAP.join(v.rjust(w) if c.right else v.ljust(w) for c, v, w in zip(cols, cells, widths))
            out.append(Text(gutter + line.rstrip(), style=style))
        return out

    heads = block([c.header for c in cols], header_style)
    lines = heads + ([Text(gutter + GAP.join(rule * w for w in widths), style="dim")] if rule else [])
    for i in range(len(cols[0].cells) if cols else 0):
        lines += block([c.cells[i] for c in cols])
    return lines
