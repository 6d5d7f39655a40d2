"""Answers to the analysis' costly questions, worked out once per store content: recorded when a finished store is
derived (the report's questions for the whole trace, in `acct_answers`, schemas/v7.sql) and kept for the process.

A question is its SQL text and parameters; an answer is the exact rows that SQL gave over the store's rows as they
are now (`views.fingerprint`: row counts, session span, the views' definitions). A question for another window is
other SQL: it runs as before and is kept for the process. The SQL attached to evidence is the SQL that was asked.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
import weakref
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from decimal import Decimal
from itertools import chain
from typing import Any

import duckdb

from ingero_mcp.analysis._sql import rows
from ingero_mcp.store.views import SAME_ROWS_AS, SOURCE_SQL, views_hash

STORED = "acct_answers"

# While a finished store is derived: key -> (sql, rows) of every question asked (see `recording`).
_RECORDING: ContextVar[dict[str, tuple[str, list[tuple]]] | None] = ContextVar("ingero_answers", default=None)

# The process's answers: (store file, fingerprint) -> key -> rows (or their JSON, as read from acct_answers). Every
# connection and cursor of the process shares them; a few stores at most (an MCP server reopening a live one).
_KEPT: OrderedDict[tuple[str, str], dict[str, object]] = OrderedDict()
_KEPT_STORES = 4
_KEPT_ANSWERS = 5000  # per store: a server asked about many windows keeps the first ones, then asks again
_LOCK = threading.Lock()
# A read-only connection's store does not change under it: where it reads from, worked out once per connection.
_WHERE: weakref.WeakKeyDictionary[duckdb.DuckDBPyConnection, tuple[str, str] | None] = weakref.WeakKeyDictionary()


def key_of(sql: str, params: Sequence[object] | None = None) -> str:
    """The question's key: a hash of its SQL text and parameters."""
    text = sql + "\x00" + json.dumps(list(params or []), default=repr)
    return hashlib.sha256(text.encode()).hexdigest()


def _where(con: duckdb.DuckDBPyConnection) -> tuple[str, str] | None:
    """(the store's file as it is on disk, what its rows are now) or None for a store without a file (kept
    nowhere). A live snapshot's file is gone once opened: private, it never changes."""
    with _LOCK:
        if con in _WHERE:
            return _WHERE[con]
    got = con.execute("SELECT current_setting('access_mode'), "
                      "(SELECT file FROM pragma_database_list WHERE name = current_database()), "
                      f"* FROM ({SOURCE_SQL})").fetchall()[0]
    where = None
    if got[1]:
        try:
            st = os.stat(got[1])
            stamp = f"{got[1]} {st.st_mtime_ns} {st.st_size}"
        except OSError:
            stamp = str(got[1])
        where = stamp, made_from(got[2:])
    if got[0] == "read_only":
        with _LOCK:
            _WHERE[con] = where
    return where


def made_from(source: Sequence[object]) -> str:
    """What answers are made from: the store's row counts and session span (views.SOURCE_SQL), and the views."""
    return f"{tuple(source)!r} {views_hash()}"


def shared_rows(con: duckdb.DuckDBPyConnection, sql: str, params: Sequence[object] | None = None) -> list[tuple]:
    """`rows(con, sql, params)` for a question whose answer depends only on its SQL and the store's rows (no
    connection state but the views): read from the store's recorded answers or the process's, else run and kept."""
    recording = _RECORDING.get()
    key = key_of(sql, params)
    if recording is not None:  # asked twice while recorded (two findings over one window): run once
        if key in recording:
            return list(recording[key][1])
        got = rows(con, sql, params)
        if not params:  # a recorded answer's SQL recomputes it alone: a question with parameters is not recorded
            recording[key] = (sql, got)
        return got
    where = _where(con)
    if where is not None:
        known = _known(con, where)
        hit = known.get(key)
        if isinstance(hit, str):
            hit = known[key] = decode(hit)
        if hit is not None:
            return list(hit)  # type: ignore[call-overload]
    got = rows(con, sql, params)
    if where is not None:
        with _LOCK:
            known = _KEPT.get(where)
            if known is not None and len(known) < _KEPT_ANSWERS:
                known[key] = list(got)
    return got


def _known(con: duckdb.DuckDBPyConnection, where: tuple[str, str]) -> dict[str, object]:
    """The answers known for this store content: those it recorded (read once), and those worked out since."""
    with _LOCK:
        known = _KEPT.get(where)
        if known is not None:
            _KEPT.move_to_end(where)
            return known
    known = {}
    if _has_stored(con):
        alike = _alike(where[1])
        known = dict(rows(con, f"SELECT query_key, answer FROM {STORED} WHERE made_from IN "
                               f"({', '.join('?' * len(alike))})", alike))
    with _LOCK:
        known = _KEPT.setdefault(where, known)
        while len(_KEPT) > _KEPT_STORES:
            _KEPT.popitem(last=False)
    return known


def _alike(made: str) -> list[str]:
    """`made` (a made_from) and the same rows made with the definitions views.SAME_ROWS_AS names: answers recorded
    over either are the answers now (the key is the question's SQL)."""
    source = made.rsplit(" ", 1)[0]
    return [made, *(f"{source} {other}" for other in sorted(SAME_ROWS_AS))]


def _has_stored(con: duckdb.DuckDBPyConnection) -> bool:
    return bool(rows(con, "SELECT 1 FROM duckdb_tables() WHERE NOT temporary AND schema_name = 'main' "
                          "AND table_name = ? AND database_name = current_database()", [STORED]))


@contextmanager
def recording() -> Iterator[dict[str, tuple[str, list[tuple]]]]:
    """Every shared question asked inside, with its rows (run, not read back): what a finished store records."""
    asked: dict[str, tuple[str, list[tuple]]] = {}
    token = _RECORDING.set(asked)
    try:
        yield asked
    finally:
        _RECORDING.reset(token)


def store_answers(con: duckdb.DuckDBPyConnection, asked: dict[str, tuple[str, list[tuple]]]) -> int:
    """Write the recorded answers that JSON keeps exactly into acct_answers, made from the store as it is now
    (the caller holds the transaction). Returns how many were written."""
    made = made_from(con.execute(SOURCE_SQL).fetchall()[0])
    kept = []
    for key, (sql, got) in asked.items():
        text = encode(got)
        if text is not None:
            kept.append((made, key, sql, text))
    if kept:
        con.executemany(f"INSERT INTO {STORED} (made_from, query_key, sql, answer) VALUES (?, ?, ?, ?)", kept)
    return len(kept)


def _plain(value: object) -> object:
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value if value == value else {"$f": repr(value)}  # NaN: JSON writes it, but it never equals itself
    if isinstance(value, Decimal):
        return {"$d": str(value)}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, tuple):
        return {"$t": [_plain(v) for v in value]}
    if isinstance(value, dict) and all(isinstance(k, str) for k in value):
        return {"$m": [[k, _plain(v)] for k, v in value.items()]}
    raise TypeError(type(value).__name__)


def _back(value: dict[str, Any]) -> object:
    """One object `_plain` wrote, its insides already read back (json's object_hook works from the inside out)."""
    if "$f" in value:
        return float(value["$f"])
    if "$d" in value:
        return Decimal(value["$d"])
    if "$t" in value:
        return tuple(value["$t"])
    return dict(value["$m"])


def encode(got: list[tuple]) -> str | None:
    """The rows as JSON that `decode` turns back into equal rows of the same types, or None where it cannot."""
    try:
        text = json.dumps([[_plain(v) for v in row] for row in got], separators=(",", ":"))
    except (TypeError, ValueError):
        return None
    back = decode(text)
    return text if _same_fast(back, got) or _same(back, got) else None


def _same_fast(a: list[tuple], b: list[tuple]) -> bool:
    """`_same` for rows of plain values, in C: equal rows whose values have the same types one by one (a value
    inside a list or a dict keeps its type through `_plain` and `_back`; NaN, never equal, goes to `_same`)."""
    return a == b and list(map(type, chain.from_iterable(a))) == list(map(type, chain.from_iterable(b)))


def decode(text: str) -> list[tuple]:
    """Rows written by `encode`."""
    return [tuple(row) for row in json.loads(text, object_hook=_back)]  # a hook per object, not a call per value


def _same(a: object, b: object) -> bool:
    if type(a) is not type(b):
        return False
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))  # type: ignore[arg-type]
    if isinstance(a, dict):
        return list(a) == list(b) and all(_same(a[k], b[k]) for k in a)  # type: ignore[call-overload,index]
    if isinstance(a, float) and a != a:
        return b != b
    return a == b
