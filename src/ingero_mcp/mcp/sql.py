"""Read-only SQL for the `run_sql` tool: the schema text, a row limit, a timeout, bounded output.

The engine enforces the safety, not a filter on the SQL text: the connection comes from
`open_store` (DuckDB read-only mode, external access off and the setting locked), so writes,
ATTACH, COPY, file readers and extension loading fail however the query is phrased. A query
that runs longer than the timeout is interrupted from a timer thread, and the timeout covers
turning the rows into cleaned, capped values too. ATTACH and DETACH are refused from the parsed
statement: DuckDB lets a read-only connection attach the file it already has open, and an attached
name would stay on the connection every tool shares.
"""

from __future__ import annotations

import datetime as dt
import decimal
import json
import re
import threading
import uuid
from dataclasses import dataclass, field
from typing import Any

import duckdb

from ingero_mcp.sanitize import clean
from ingero_mcp.store.schema import SCHEMA_VERSION, TABLES, ddl

DEFAULT_LIMIT = 1_000
MAX_LIMIT = 10_000
DEFAULT_TIMEOUT_S = 10.0
CELL_CAP = 1_000  # characters of one string value in a result (a longer one says how much was cut)
MAX_COLUMNS = 100  # columns shown of one result (a 5,000-column PIVOT is cut, and says so)
HEADER_CAP = 6_000  # characters of the shown columns' names and types together
ROWS_CAP = 200_000  # characters of converted rows handed on; the tool's own budget cuts further
_REFUSED = {"ATTACH", "DETACH"}

_COLUMN_RE = re.compile(r"^\s+(\w+)\s+([A-Z]+)[^-]*?(?:--\s*(.*))?$")
# v2 on: `ALTER TABLE t ADD COLUMN c TYPE;  -- note` and `ALTER TABLE t RENAME COLUMN a TO c;  -- note`.
_ALTER_RE = re.compile(r"^ALTER TABLE (\w+) (?:ADD COLUMN (\w+)|RENAME COLUMN \w+ TO (\w+))[^-]*?(?:--\s*(.*))?$")


def _column_notes() -> dict[tuple[str, str], str]:
    """(table, column) -> the comment beside that column in the versioned DDL."""
    notes: dict[tuple[str, str], str] = {}
    for version in range(1, SCHEMA_VERSION + 1):
        table = None
        for line in ddl(version).splitlines():
            start = re.match(r"CREATE TABLE (?:IF NOT EXISTS )?(\w+?)(?:_v\d+)? \(", line)  # v10: t_v10 becomes t
            if start:
                table = start.group(1)
                continue
            alter = _ALTER_RE.match(line)
            if alter:
                table = None
                if alter.group(4):
                    notes[(alter.group(1), alter.group(2) or alter.group(3))] = alter.group(4).strip()
                continue
            match = _COLUMN_RE.match(line)
            if table and match and match.group(3):
                notes[(table, match.group(1))] = match.group(3).strip()
    return notes


def describe_schema(con: duckdb.DuckDBPyConnection) -> str:
    """The store's tables and columns as compact text, read from the store's own catalog."""
    rows = con.execute(
        "SELECT table_catalog = 'temp', table_name, column_name, data_type, is_generated = 'ALWAYS' FROM "
        "information_schema.columns "
        "WHERE table_schema = 'main' AND table_catalog IN ('temp', current_database()) "
        "ORDER BY table_name, ordinal_position"
    ).fetchall()
    # An older store read through TEMP views of the current shape (store.reader): the view wins.
    views = {str(table) for temp, table, *_ in rows if temp}
    columns: dict[str, list[tuple[str, str, bool]]] = {}
    for temp, table, column, dtype, generated in rows:
        if temp or str(table) not in views:
            columns.setdefault(str(table), []).append((str(column), str(dtype), bool(generated)))
    notes = _column_notes()
    ordered = [t for t in TABLES if t in columns] + sorted(t for t in columns if t not in TABLES)
    lines = []
    for table in ordered:
        parts = []
        for column, dtype, generated in columns[table]:
            if column == "session_id" and table != "sessions":
                continue
            note = notes.get((table, column))
            short = note[:80] if note else ""
            if generated:  # v10: computed from the row's other columns as it is read (schemas/v10.sql)
                short = f"computed; {short}" if short else "computed from the row's other columns"
            parts.append(f"{column} {dtype}" + (f" [{short}]" if short else ""))
        lines.append(f"- {table}(" + ", ".join(parts) + ")")
    return "\n".join(lines)


def _jsonable(value: Any) -> Any:
    """A value as JSON data; strings (traced text) cleaned and capped at CELL_CAP."""
    if value is None or isinstance(value, bool | int | float):
        return value
    if isinstance(value, str):
        return clean(value, CELL_CAP)
    if isinstance(value, decimal.Decimal):
        return float(value)
    if isinstance(value, dt.datetime | dt.date | dt.time | dt.timedelta | uuid.UUID):
        return str(value)
    if isinstance(value, bytes | bytearray | memoryview):
        return f"<{len(bytes(value))} bytes>"
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value[:CELL_CAP]]
    if isinstance(value, dict):
        return {clean(str(k), 200): _jsonable(v) for k, v in list(value.items())[:CELL_CAP]}
    return clean(str(value), CELL_CAP)


@dataclass
class SqlResult:
    """Rows of one query, at most `limit`, and whether more were there; `fetched`: the rows the query gave up to
    `limit` (more than `rows` when they were too large to pass on); `total_columns`: the query's columns, of which
    `columns` are the first ones."""

    columns: list[str]
    types: list[str]
    rows: list[list[Any]]
    more_rows: bool
    elapsed_s: float
    notes: list[str] = field(default_factory=list)
    fetched: int = 0
    total_columns: int = 0


def _shown_columns(names: list[str], types: list[str]) -> int:
    """How many leading columns fit MAX_COLUMNS and HEADER_CAP: headers count in a result's size."""
    used = 0
    for i, (name, dtype) in enumerate(zip(names, types, strict=True)):
        used += len(name) + len(dtype) + 8
        if i == MAX_COLUMNS or used > HEADER_CAP:
            return i
    return len(names)


class SqlError(Exception):
    """A query the engine refused or that failed; the message is for the model to read."""


def _check_statements(con: duckdb.DuckDBPyConnection, sql: str) -> None:
    """Refuse ATTACH/DETACH however they are spelled (the parser says what each statement is)."""
    try:
        statements = con.extract_statements(sql)
    except duckdb.Error:
        return  # a syntax error: the engine reports it when the query runs
    for statement in statements:
        kind = str(statement.type).rsplit(".", 1)[-1]
        if kind in _REFUSED:
            raise SqlError(f"{kind} is refused: run_sql reads this trace store only (its tables are listed in "
                           "the description)")


def run_query(
    con: duckdb.DuckDBPyConnection, sql: str, limit: int = DEFAULT_LIMIT, timeout_s: float = DEFAULT_TIMEOUT_S
) -> SqlResult:
    """Run `sql` on a cursor of the read-only store connection; at most `limit` rows, stopped at `timeout_s`.

    The timeout covers the conversion of the rows too: values are cleaned and capped (CELL_CAP) here,
    once, so what the caller does with them is bounded by rows x CELL_CAP."""
    import time

    if not sql.strip():
        raise SqlError("empty query")
    if not 1 <= limit <= MAX_LIMIT:
        raise SqlError(f"limit must be between 1 and {MAX_LIMIT}, got {limit}")
    started = time.monotonic()
    deadline = started + timeout_s
    timeout = f"query stopped after the {timeout_s:g} s timeout; aggregate or filter more"
    from ingero_mcp.store.reader import cursor as store_cursor

    # a connection of its own, laid out as the store's: the SQL a report cites runs here as it ran there
    cursor = store_cursor(con)
    fired = threading.Event()

    def stop() -> None:
        fired.set()
        cursor.interrupt()

    timer = threading.Timer(timeout_s, stop)
    timer.start()
    try:
        _check_statements(cursor, sql)
        cursor.execute(sql)
        if cursor.description is None:
            return SqlResult([], [], [], False, time.monotonic() - started, ["the statement returned no rows"])
        columns = [clean(str(d[0]), 200) for d in cursor.description]
        types = [clean(str(d[1]), 200) for d in cursor.description]
        fetched = cursor.fetchmany(limit + 1)
    except duckdb.Error as exc:  # an interrupt included: the timer's, or another's
        if fired.is_set():
            raise SqlError(timeout) from exc
        if isinstance(exc, duckdb.InterruptException):
            raise SqlError(f"query interrupted: {clean(str(exc), 1000)}") from exc
        # DuckDB's messages echo data (a value that failed to cast, a column name): cleaned like data
        raise SqlError(f"{type(exc).__name__}: {clean(str(exc), 1000)}") from exc
    finally:
        timer.cancel()
        try:
            cursor.close()
        except duckdb.Error:
            pass
    notes = []
    width = _shown_columns(columns, types)
    if width < len(columns):
        notes.append(f"only the first {width} of the {len(columns)} columns are shown ({len(columns) - width} left "
                     "out): select the columns you need")
    rows: list[list[Any]] = []
    size = 0
    for i, row in enumerate(fetched[:limit]):
        if i % 64 == 0 and time.monotonic() > deadline:
            raise SqlError(timeout)
        values = [_jsonable(v) for v in row[:width]]
        size += len(json.dumps(values, ensure_ascii=False)) + 1
        if size > ROWS_CAP:
            break
        rows.append(values)
    if time.monotonic() > deadline:
        raise SqlError(timeout)
    return SqlResult(columns[:width], types[:width], rows, len(fetched) > limit, time.monotonic() - started, notes,
                     fetched=min(len(fetched), limit), total_columns=len(columns))
