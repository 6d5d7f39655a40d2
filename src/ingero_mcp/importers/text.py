"""Strings of an imported file, cleaned as they enter the store (they were written on the traced host).

An Ingero database is a file anyone can write: its op and source catalogue, process names, nodes, chain
texts and every other text column may hold line breaks, escape sequences, bidi or tag characters. They
are cleaned here with `sanitize.clean` (the cleaning every reader applies again on the way out) so the
store never holds them; names are capped like names, free text and JSON documents far higher. Bytes that
are not UTF-8 decode with U+FFFD instead of failing the import.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from typing import Any

from ingero_mcp.sanitize import clean, clean_data

NAME_CAP = 200  # an op, source, process, node, table or column name, an id
TEXT_CAP = 20_000  # a free text (a chain's explanation) or one string inside a JSON document


def decode(raw: bytes) -> str:
    """SQLite TEXT as str, bytes that are not UTF-8 replaced (sqlite3's text_factory)."""
    return raw.decode("utf-8", "replace")


def name(value: Any) -> str | None:
    """A name as the store keeps it: one cleaned line of at most NAME_CAP characters (None stays None)."""
    return None if value is None else clean(str(value), NAME_CAP)


def text(value: Any) -> str | None:
    """A free text as the store keeps it: one cleaned line of at most TEXT_CAP characters."""
    return None if value is None else clean(str(value), TEXT_CAP)


def json_text(value: Any) -> str | None:
    """A JSON document with every string in it cleaned; kept byte for byte when nothing needed cleaning.

    Text that is not JSON is cleaned as free text."""
    if value is None:
        return None
    raw = str(value)
    try:
        parsed = json.loads(raw)
    except ValueError:
        return text(raw)
    cleaned = clean_data(parsed, TEXT_CAP)
    if cleaned == parsed and clean(raw, len(raw)) == raw:
        return raw
    return json.dumps(cleaned, ensure_ascii=False, separators=(",", ":"))


def row(values: dict[str, Any]) -> dict[str, Any]:
    """A row of any table: its column names cleaned as names, its text values as free text."""
    return {name(k) or "": text(v) if isinstance(v, str) else v for k, v in values.items()}


def column(values: Iterable[Any], how: Callable[[Any], str | None]) -> list[str | None]:
    """`how` applied to a column, once per distinct value (columns repeat: nodes, stacks, ids)."""
    seen: dict[Any, str | None] = {}
    out = []
    for v in values:
        if v not in seen:
            seen[v] = how(v)
        out.append(seen[v])
    return out
