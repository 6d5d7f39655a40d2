"""Formats for the terminal: the units (ingero_mcp.units), and traced strings cleaned before they are shown.

Process names and command lines come from the traced host: they are data, so control and invisible
characters are removed and they are always printed as plain text (never as rich markup).
"""

from __future__ import annotations

from rich.text import Text

from ingero_mcp import sanitize
from ingero_mcp.units import count, nbytes, ns, ns3, pct, pid_ranges, rel, secs, utc  # noqa: F401 - the rooms' formats

WHOLE = 1_000_000  # a cap for text shown whole (evidence SQL): still bounded, never cut in practice


def clean(text: object, limit: int = 120) -> str:
    """A traced string made safe to print (the same cleaning the MCP server applies), or "" for None."""
    return "" if text is None else sanitize.clean(str(text), limit)


def cell(value: object, limit: int = 120) -> Text:
    """A table cell that is printed as it is: cleaned, never read as rich markup."""
    return Text(clean(value, limit))
