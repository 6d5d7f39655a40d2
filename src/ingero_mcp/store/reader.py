"""Opens a trace store read-only, whether finished (one DuckDB file) or still being recorded.

A finished store is opened in DuckDB's read-only mode. A recording in progress (or one whose
collector was killed) also has Parquet segments beside the file; they are merged with the file
into a private snapshot that is then opened read-only, so every reader sees one set of tables
with the same names. External access (files, network, ATTACH, extensions) is switched off on
every reader connection and the setting is locked, so SQL from a user or a model cannot reach
outside the trace.
"""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path

import duckdb

from ingero_mcp.store.errors import StoreError
from ingero_mcp.store.schema import (
    DERIVED_PREFIX,
    GENERATED,
    REPLACE_TABLES,
    SCHEMA_VERSION,
    STORED_FOR,
    TABLES,
    V1_AS_V2,
    insert_sql,
    migrate,
)
from ingero_mcp.store.segments import (
    Bad,
    has_segments,
    insert_segments,
    list_segments,
    remember_skipped,
    segment_dir,
    segment_seq,
)
from ingero_mcp.store.shapes import expected_columns
from ingero_mcp.store.views import lay_views

_SQLITE_MAGIC = b"SQLite format 3\x00"
_LOCK_RETRY_S = 10.0


def _describe_missing(path: Path) -> str:
    return (
        f"no trace store at {path}. Record one with `sudo ingero-mcp trace --db {path}`, "
        "import an Ingero database with `ingero-mcp import SRC.db --db OUT.duckdb`, "
        "or make a synthetic one with `ingero-mcp demo dataloader --db demo.duckdb`."
    )


def _check_file(path: Path) -> None:
    if path.is_dir():
        raise StoreError(f"{path} is a directory, not a trace store file")
    with path.open("rb") as fh:
        head = fh.read(16)
    if head == _SQLITE_MAGIC:
        raise StoreError(
            f"{path} is a SQLite database (an Ingero trace?), not an ingero-mcp store. "
            f"Import it first: `ingero-mcp import {path} --db {path.with_suffix('.duckdb')}`"
        )


ONE_ROW_GROUP = 122_880  # DuckDB's rows per row group: the unit its threads share a scan by

def _lock_down(con: duckdb.DuckDBPyConnection, settings: dict[str, str] | None = None) -> duckdb.DuckDBPyConnection:
    # DuckDB shares one database instance per file within a process: a second open_store of the
    # same file while the first is open gets the instance the first one already locked down.
    locked, external = con.execute(
        "SELECT current_setting('lock_configuration'), current_setting('enable_external_access')"
    ).fetchall()[0]
    if locked and not external:
        return con
    if "threads" not in (settings or {}):
        # A store whose every table fits in one row group has nothing to share out: DuckDB's threads only add their
        # scheduling to each of the report's ~100 small queries (the bundled trace's explain: SQL 0.23 -> 0.20 s).
        largest = con.execute("SELECT coalesce(max(estimated_size), 0) FROM duckdb_tables() "
                              "WHERE database_name = current_database()").fetchall()[0][0]
        if largest <= ONE_ROW_GROUP:
            con.execute("SET threads = 1").fetchall()
    for name, value in (settings or {}).items():  # before the lock: limits a reader may not lift (run_sql's)
        con.execute(f"SET {name} = '{_sql_quote(value)}'").fetchall()
    con.execute("SET enable_external_access = false").fetchall()
    con.execute("SET enable_progress_bar = false").fetchall()  # no bar over explain's output on a terminal
    # Every ASOF join by its sort-merge operator: DuckDB runs one whose left side it estimates under 64 rows as a nested
    # loop, and nested in a CTE its estimate can be 1 where the rows are 100k (analysis/waits.py's overlaps of one
    # thread's sleeps with another's states: 118 s as a loop, 0.3 s merged, on a recorded 20 s job). For every
    # connection and cursor of the instance, run_sql's included. A DuckDB without the setting has no such loop either.
    try:
        con.execute("SET GLOBAL asof_loop_join_threshold = 0").fetchall()
    except duckdb.Error:
        pass
    con.execute("SET lock_configuration = true").fetchall()
    return con


def _connect_read_only(path: Path) -> duckdb.DuckDBPyConnection:
    deadline = time.monotonic() + _LOCK_RETRY_S
    while True:
        try:
            return duckdb.connect(str(path), read_only=True)
        except duckdb.IOException as exc:
            # The collector holds the file for the second it takes to fold its segments.
            message = str(exc)
            if "lock" in message.lower() and time.monotonic() < deadline:
                time.sleep(0.2)
                continue
            if "not a valid DuckDB database" in message:
                raise StoreError(
                    f"{path} is not a readable DuckDB trace store (corrupt or another kind of file)") from exc
            raise StoreError(f"cannot open {path}: {message}") from exc
        except duckdb.Error as exc:
            raise StoreError(f"{path} is not a readable DuckDB trace store ({exc})") from exc


class _Seen:
    """What one look at a store's catalog said: its database name, its tables' columns and types, its version."""

    def __init__(self, con: duckdb.DuckDBPyConnection) -> None:
        got = con.execute(
            "SELECT current_database(), table_name, column_name, data_type FROM information_schema.columns "
            "WHERE table_schema = 'main' AND table_catalog = current_database() ORDER BY table_name, ordinal_position"
        ).fetchall()
        self.db = str(got[0][0]) if got else str(con.execute("SELECT current_database()").fetchall()[0][0])
        self.columns: dict[str, dict[str, str]] = {}
        for _db, table, column, dtype in got:
            self.columns.setdefault(str(table), {})[str(column)] = str(dtype)
        self.version = 0
        if "version" in self.columns.get("schema_version", {}):
            self.version = int(con.execute("SELECT max(version) FROM schema_version").fetchall()[0][0] or 0)


def _check_version(con: duckdb.DuckDBPyConnection, path: Path) -> _Seen:
    seen = _Seen(con)
    if seen.version == 0:  # no schema_version table, or an empty one
        raise StoreError(f"{path} is a DuckDB file but not an ingero-mcp trace store (no schema_version table)")
    if seen.version > SCHEMA_VERSION:
        raise StoreError(f"{path} has schema version {seen.version}; this ingero-mcp reads up to "
                         f"{SCHEMA_VERSION}: upgrade it")
    _check_schema(con, path, seen)
    return seen


# No *_ns value of a sound store comes near INT64's limits: a moment past 2116 or a duration of 146
# years is damage, and arithmetic on it (ts_ns + duration_ns) overflows deep inside an analysis.
NS_LIMIT = 2**62


def _check_schema(con: duckdb.DuckDBPyConnection, path: Path, seen: _Seen) -> None:
    """One StoreError line naming what a damaged store lacks: a table, a column, a type, a sane *_ns range."""
    version = seen.version
    want = expected_columns(version)
    have = seen.columns
    for table, columns in want.items():
        if table not in have:
            raise StoreError(f"{path} is damaged: table {table} is missing (schema v{version} has it); "
                             "re-record or re-import the trace")
        for column, dtype in columns.items():
            got = have[table].get(column)
            if got is None:
                raise StoreError(f"{path} is damaged: table {table} has no column {column} ({dtype} in "
                                 f"schema v{version})")
            if got != dtype:
                raise StoreError(f"{path} is damaged: {table}.{column} is {got}, schema v{version} says {dtype}")
    # one scan per table (min and max of each *_ns column; DuckDB answers them from its statistics), one query
    # (since v10 a generated column is computed from the checked ones: no statistics, a scan to check it)
    computed = GENERATED if version >= 10 else {}
    per_table = [(t, [c for c, dtype in columns.items() if c.endswith("_ns") and dtype == "BIGINT"
                      and c not in computed.get(t, ())]) for t, columns in want.items()]
    per_table = [(t, cs) for t, cs in per_table if cs]
    if not per_table:
        return
    sql = "SELECT " + ", ".join(f"(SELECT [{', '.join(f'min({c}), max({c})' for c in cs)}] FROM {t})"
                                for t, cs in per_table)
    try:
        got = con.execute(sql).fetchall()[0]
    except duckdb.Error as exc:
        raise StoreError(
            f"{path} is damaged: its *_ns columns cannot be read ({str(exc).strip().splitlines()[0]})") from exc
    for (table, cs), values in zip(per_table, got, strict=True):
        for i, column in enumerate(cs):
            lo, hi = values[2 * i], values[2 * i + 1]
            extreme = None if lo is None else max(abs(int(lo)), abs(int(hi)))  # Python ints: no overflow
            if extreme is not None and extreme >= NS_LIMIT:
                raise StoreError(f"{path} is damaged: {table}.{column} holds {extreme:,}, beyond any time or "
                                 f"duration in ns (limit {NS_LIMIT:,}: the year 2116, or 146 years)")


def _current_shape() -> dict[str, list[tuple[str, str]]]:
    """Each table's (column, type) in SCHEMA_VERSION (store/shapes.py)."""
    return {table: list(columns.items()) for table, columns in expected_columns(SCHEMA_VERSION).items()}


def lay_current_views(con: duckdb.DuckDBPyConnection, seen: _Seen | None = None) -> None:
    """An older store opened read-only cannot be migrated: show it in the current shape through TEMP views.

    DuckDB resolves the temp catalog first, so `FROM cuda_calls` reads the view; the view reads the
    stored table by its qualified name (`<db>.main.<table>`), which does not bind back to itself.
    `seen`: the store's catalog as _check_version read it on this connection (else it is read now).
    """
    seen = seen or _Seen(con)
    if seen.version >= SCHEMA_VERSION:
        return
    db = seen.db
    for table, columns in _current_shape().items():
        if table == "schema_version" or table.startswith(DERIVED_PREFIX):
            continue  # an older store has no derived tables: its views are computed (store/views.py)
        have = set(seen.columns.get(table, {}))
        if {c for c, _ in columns} - STORED_FOR.get(table, set()) <= have:  # (columns kept only to compute others)
            continue
        con.execute(f'CREATE TEMP VIEW "{table}" AS {_select_as_current(table, columns, have, f"{db}")}').fetchall()


def _select_as_current(table: str, columns: list[tuple[str, str]], have: set[str], db: str) -> str:
    """SELECT over `<db>.main.<table>` (columns `have`, an older version) giving the current `columns`."""
    select = []
    for column, dtype in columns:
        expr = V1_AS_V2.get((table, column)) if column not in have else None
        if expr is None:
            expr = f'"{column}"' if column in have else "NULL"
        select.append(f'CAST({expr} AS {dtype}) AS "{column}"')
    source = f'"{db}".main."{table}"' if have else "(SELECT 1) AS _none WHERE false"
    return f"SELECT {', '.join(select)} FROM {source}"


def _stored_columns(con: duckdb.DuckDBPyConnection, db: str) -> dict[str, set[str]]:
    stored: dict[str, set[str]] = {}
    for table, column in con.execute(
        "SELECT table_name, column_name FROM information_schema.columns WHERE table_catalog = ? AND "
        "table_schema = 'main'",
        [db],
    ).fetchall():
        stored.setdefault(str(table), set()).add(str(column))
    return stored


def open_store(db_path: str | os.PathLike[str], settings: dict[str, str] | None = None) -> duckdb.DuckDBPyConnection:
    """A read-only connection on the trace at `db_path`, live segments included, in the current shape and with the
    store's views laid (store/views.py). `settings`: DuckDB settings (memory_limit, temp_directory, ...) made before
    the configuration is locked, for a process's first open."""
    con, seen = _open(db_path, settings)
    return _with_views(con, seen)


def cursor(con: duckdb.DuckDBPyConnection) -> duckdb.DuckDBPyConnection:
    """A new cursor of an open store (a connection of its own: one per MCP tool call), laid out as `open_store`
    lays its connection: temporary views belong to one connection."""
    return _with_views(con.cursor())


def _with_views(con: duckdb.DuckDBPyConnection, seen: _Seen | None = None) -> duckdb.DuckDBPyConnection:
    lay_current_views(con, seen)
    lay_views(con)
    return con


def _open(db_path: str | os.PathLike[str], settings: dict[str, str] | None) -> tuple[duckdb.DuckDBPyConnection, _Seen]:
    path = Path(db_path)
    segments = segment_dir(path)
    live = has_segments(path)
    if not path.exists() and not live:
        raise StoreError(_describe_missing(path))
    if path.exists():
        _check_file(path)
    if not live:
        remember_skipped(path, [])
        con = _connect_read_only(path)
        seen = _check_version(con, path)
        return _lock_down(con, settings), seen
    for attempt in range(4):
        # The collector replaces latest-*.parquet every second and deletes the segments when it
        # folds them; a snapshot that caught a file mid-change (DuckDB reads a Parquet footer and
        # its data in two opens) is simply taken again.
        try:
            con = _lock_down(_live_snapshot(path, segments), settings)
            return con, _Seen(con)
        except (duckdb.Error, OSError):
            if attempt == 3:
                raise
            time.sleep(0.2)
            if not has_segments(path):
                return _open(path, settings)  # folded meanwhile
    raise AssertionError("unreachable")


def _live_snapshot(path: Path, segments: Path) -> duckdb.DuckDBPyConnection:
    """Merge the store file and its segments into a private read-only snapshot."""
    fd, tmp_name = tempfile.mkstemp(prefix="ingero-live-", suffix=".duckdb")
    os.close(fd)
    os.unlink(tmp_name)  # DuckDB wants to create the file itself
    tmp = Path(tmp_name)
    try:
        build = duckdb.connect(str(tmp))
        bad, _ = merge_live(build, path, segments)
        remember_skipped(path, bad)
        build.close()
        con = duckdb.connect(str(tmp), read_only=True)
    finally:
        # The open connection keeps the snapshot alive; the name goes now so nothing is left behind.
        for leftover in (tmp, Path(f"{tmp}.wal")):
            leftover.unlink(missing_ok=True)
    return con


def merge_live(build: duckdb.DuckDBPyConnection, path: Path, segments: Path,
               after_seq: int | None = None) -> tuple[list[Bad], int]:
    """Into `build` (writable): the store file's rows in the current shape, then its segments; or, `after_seq` given
    (`build` already holds those and the segments up to that number: a checkpoint's copy), only the newer segments and
    the latest-state files. Returns the segments skipped, with why, and the highest segment number merged."""
    if after_seq is None:
        migrate(build)
        if path.exists():
            src = _connect_read_only(path)
            _check_version(src, path)
            src.close()
            build.execute(f"ATTACH '{_sql_quote(str(path))}' AS recorded (READ_ONLY)").fetchall()
            shape = _current_shape()
            stored = _stored_columns(build, "recorded")
            for table in TABLES:
                # An older recorded file is read in the current shape, as lay_current_views shows it.
                select = _select_as_current(table, shape[table], stored.get(table, set()), "recorded")
                build.execute(insert_sql(build, table, f"({select}) AS recorded_rows",
                                         [c for c, _ in shape[table]])).fetchall()
            build.execute("DETACH recorded").fetchall()
    # A segment no reader can use (partial, empty, garbage, another schema, a folder) is skipped and
    # reported, not allowed to make the whole store unreadable (store/segments.py).
    by_table, bad = list_segments(segments)
    last_seq = after_seq or 0
    with tempfile.TemporaryDirectory(prefix="ingero-latest-") as copies:
        for table in TABLES:
            files = by_table.get(table, [])
            if table in REPLACE_TABLES:
                for file in [f for f in files if f.name.startswith("latest-")]:
                    files.remove(file)
                    try:
                        # The collector replaces this file every second, and DuckDB opens a file more than once
                        # to read it: a replace in between reads as a corrupt file (~1 read in 10 under a
                        # writer replacing it in a loop). One open here pins one version; DuckDB reads that copy.
                        copy = _pinned_copy(file, Path(copies) / table)
                        build.execute(f"DELETE FROM {table} WHERE session_id IN (SELECT session_id FROM "
                                      "read_parquet(?))",
                                      [str(copy)]).fetchall()
                    except (duckdb.Error, OSError) as exc:
                        bad.append((file, str(exc).strip().splitlines()[0][:300]))
                        continue
                    bad += [(file, why) for _, why in insert_segments(build, table, [copy])]
            numbered = [(segment_seq(f), f) for f in files]
            files = [f for seq, f in numbered if after_seq is None or seq is None or seq > after_seq]
            last_seq = max([last_seq, *(seq for seq, _ in numbered if seq is not None)])
            bad += insert_segments(build, table, files)
    return bad, last_seq


def _pinned_copy(file: Path, folder: Path) -> Path:
    """A private copy of one version of `file` (read through one open, which a rename over the name does not change)."""
    folder.mkdir(exist_ok=True)
    copy = folder / file.name
    with open(file, "rb") as src, open(copy, "wb") as dst:
        dst.write(src.read())
    return copy


def _sql_quote(text: str) -> str:
    return text.replace("'", "''")
