"""The console a report is printed on: a terminal's (colours, its width) or plain text at a fixed width when piped.

Apart from render/report.py so that the default `explain` page (render/summary.py) does not load the full report's
panels and boxes."""

from __future__ import annotations

import os
import sys

from rich.console import Console

PLAIN_WIDTH = 100  # columns of piped output when $COLUMNS does not say
MIN_WIDTH = 40


def plain_width() -> int:
    """The width of piped output: $COLUMNS when it is a number (at least MIN_WIDTH), else PLAIN_WIDTH."""
    try:
        return max(MIN_WIDTH, int(os.environ.get("COLUMNS", "")))
    except ValueError:
        return PLAIN_WIDTH


def make_console(file: object = None) -> Console:
    """A terminal's console (colours, its width), or for a file or pipe plain text at plain_width() columns."""
    out = file or sys.stdout
    if hasattr(out, "isatty") and out.isatty():
        return Console(file=out, highlight=False, soft_wrap=False)
    return Console(file=out, width=plain_width(), no_color=True, color_system=None, highlight=False, soft_wrap=False,
                   force_terminal=False)
