"""Writes trace data as columnar batches: straight into DuckDB, or as live Parquet segments.

Direct mode (import, demo) inserts Arrow batches with one `INSERT ... BY NAME` each: DuckDB scans
the Arrow memory without a copy, which is what makes >1M rows/s possible (row-by-row
`executemany` measured ~1,000x slower). Live mode (the collector) never holds the DuckDB file
open while recording: each flush writes one Parquet file per table under a temporary name and
renames it into `<db>.segments/<table>/`, so readers in other processes see everything up to the
last flush, and a SIGKILL loses at most one flush interval. `close()` folds the segments into the
DuckDB file in one transaction. Live recording needs only pyarrow: where DuckDB is not installed
(a bare GPU host), the segments stay on disk and fold later on any machine that has it.
"""

from __future__ import annotations

import os
import shutil
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.parquet as pq

from ingero_mcp.store.checkpoint import Checkpointer, checkpoint_dir
from ingero_mcp.store.errors import StoreError
from ingero_mcp.store.schema import REPLACE_TABLES, TABLES, insert_sql, migrate
from ingero_mcp.store.segments import (
    fsync_path,
    insert_parquet,
    insert_segments,
    list_segments,
    quarantine,
    segment_dir,
    segment_seq,
)

if TYPE_CHECKING:
    import duckdb

Batch = pa.Table | pa.RecordBatch | Mapping[str, Sequence[Any]]
Derive = Callable[["duckdb.DuckDBPyConnection"], object]  # stores a finished store's derived rows


def _as_table(data: Batch) -> pa.Table:
    if isinstance(data, pa.Table):
        return data
    if isinstance(data, pa.RecordBatch):
        return pa.Table.from_batches([data])
    return pa.table(dict(data))


def _check_table(table: str) -> None:
    if table not in TABLES:
        raise ValueError(f"unknown store table {table!r}; tables: {', '.join(TABLES)}")


def _duckdb_available() -> bool:
    try:
        import duckdb  # noqa: F401
    except ImportError:
        return False
    return True


def _connect_writable(path: Path) -> duckdb.DuckDBPyConnection:
    import duckdb

    try:
        con = duckdb.connect(str(path))
    except duckdb.IOException as exc:
        raise StoreError(f"cannot open {path} for writing: {exc}") from exc
    migrate(con)
    return con


def _next_session_id(con: duckdb.DuckDBPyConnection) -> int:
    return int(con.execute("SELECT coalesce(max(session_id), 0) + 1 FROM sessions").fetchall()[0][0])


def _insert(con: duckdb.DuckDBPyConnection, table: str, arrow: pa.Table) -> None:
    con.register("_ingero_batch", arrow)
    try:
        con.execute(insert_sql(con, table, "_ingero_batch", arrow.schema.names)).fetchall()
    finally:
        con.unregister("_ingero_batch")


class TraceWriter:
    """Appends columnar batches to a trace store for one session.

    `append(table, batch)` adds rows; `replace(table, batch)` sets the session's whole content of a
    latest-state table (sessions, processes, collector_stats, table_coverage). Columns missing from
    a batch are NULL; `session_id` is filled in.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        live: bool = False,
        session_id: int | None = None,
        derive: Derive | None = None,
        checkpoints: bool = False,
    ) -> None:
        self.path = Path(path)
        self.live = live
        self._seq = 0
        self._pending: dict[str, list[pa.Table]] = defaultdict(list)
        self._latest: dict[str, pa.Table] = {}
        self._closed = False
        # What makes the accounting's derived tables (schemas/v3.sql) when the store is finished (the direct writer's
        # close, the live writer's fold), passed in by whoever knows the store is complete then (the collector, the
        # demo scenarios; analysis.derive.store_derived): the store itself knows nothing of the analysis. An import
        # holds a sample, which the accounting refuses, so it passes none.
        self.derive = derive
        self.rows_written: dict[str, int] = defaultdict(int)
        self.checkpointer: Checkpointer | None = None
        self._checkpoints_cpu_s = 0.0
        if live:
            self.segments = segment_dir(self.path)
            self.fold_on_close = _duckdb_available()
            if self.fold_on_close:
                # Create the store (schema only) up front so readers can open it during recording.
                con = _connect_writable(self.path)
                self.session_id = session_id or _next_session_id(con)
                con.close()
            else:
                self.session_id = session_id or 1
            self.segments.mkdir(parents=True, exist_ok=True)
            self._seq = _last_segment_seq(self.segments)
            # a checkpoint left by a recording that never folded may hold rows no segment holds now: none is kept
            shutil.rmtree(checkpoint_dir(self.path), ignore_errors=True)
            self._con: duckdb.DuckDBPyConnection | None = None
            # `checkpoints`: a finished copy of the recording so far kept now and then by a child process, which a
            # reader that starts late answers from at once (store/checkpoint.py); it needs DuckDB and `derive`
            self.checkpointer = (Checkpointer(self.path, derive)
                                 if checkpoints and derive is not None and self.fold_on_close else None)
        else:
            self._con = _connect_writable(self.path)
            self.session_id = session_id or _next_session_id(self._con)

    def _with_session(self, data: Batch) -> pa.Table:
        arrow = _as_table(data)
        if "session_id" in arrow.column_names:
            arrow = arrow.drop_columns(["session_id"])
        return arrow.append_column("session_id", pa.array([self.session_id] * arrow.num_rows, pa.int32()))

    def append(self, table: str, data: Batch) -> None:
        """Add rows to `table`."""
        _check_table(table)
        arrow = self._with_session(data)
        if arrow.num_rows == 0:
            return
        self.rows_written[table] += arrow.num_rows
        if self.live:
            self._pending[table].append(arrow)
        else:
            assert self._con is not None
            _insert(self._con, table, arrow)

    def replace(self, table: str, data: Batch) -> None:
        """Set this session's rows of a latest-state table."""
        _check_table(table)
        if table not in REPLACE_TABLES:
            raise ValueError(f"{table} is append-only; replace() takes {sorted(REPLACE_TABLES)}")
        arrow = self._with_session(data)
        if self.live:
            self._latest[table] = arrow
        else:
            assert self._con is not None
            self._con.execute(f"DELETE FROM {table} WHERE session_id = ?", [self.session_id]).fetchall()
            _insert(self._con, table, arrow)

    def flush(self) -> int:
        """Live mode: make everything appended so far visible to readers. Returns rows flushed."""
        if not self.live:
            return 0
        flushed = 0
        for table, parts in list(self._pending.items()):
            if not parts:
                continue
            arrow = _concat(parts)
            self._seq += 1
            _write_atomic(self.segments / table / f"{self._seq:09d}.parquet", arrow)
            flushed += arrow.num_rows
            self._pending[table] = []
        for table, arrow in self._latest.items():
            _write_atomic(self.segments / table / f"latest-{self.session_id}.parquet", arrow)
        self._latest.clear()
        if self.checkpointer is not None:
            self.checkpointer.poll()
        return flushed

    def stop_checkpoints(self) -> None:
        """No checkpoint after this (one under way is ended): the recording is stopping."""
        if self.checkpointer is not None:
            self.checkpointer.stop()
            self._checkpoints_cpu_s = self.checkpointer.cpu_s
            self.checkpointer = None

    @property
    def checkpoints_cpu_s(self) -> float:
        """The CPU seconds the checkpoints' child processes took (those reaped so far)."""
        return self.checkpointer.cpu_s if self.checkpointer is not None else self._checkpoints_cpu_s

    def close(self) -> None:
        """Finish: live mode flushes and folds the segments into the DuckDB file."""
        if self._closed:
            return
        self._closed = True
        if self.live:
            self.stop_checkpoints()  # before the flush, which would start one
            self.flush()
            if self.fold_on_close:
                fold_segments(self.path, derive=self.derive)
        elif self._con is not None:
            try:
                if self.derive is not None:
                    _derive(self._con, self.derive)
            finally:
                self._con.close()

    def __enter__(self) -> TraceWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _concat(parts: list[pa.Table]) -> pa.Table:
    """One table from a flush's batches. A column may come dictionary-encoded from one producer (the ring
    decoders) and plain from another (the rows written at stop); Arrow will not merge those, so such
    columns are decoded to their value type first."""
    if len({part.schema for part in parts}) > 1:
        parts = [_decoded(part) for part in parts]
    return pa.concat_tables(parts, promote_options="permissive")


def _decoded(table: pa.Table) -> pa.Table:
    """`table` with its dictionary columns as plain columns of their value type."""
    columns = [col.cast(col.type.value_type) if pa.types.is_dictionary(col.type) else col for col in table.columns]
    return pa.Table.from_arrays(columns, names=table.column_names)


def _write_atomic(final: Path, arrow: pa.Table) -> None:
    """Write under a temporary name, flush it to disk, then rename: after a crash (or power loss) the
    final name holds a whole file or nothing, never a partial one. The directory is not synced: a rename
    lost in a crash leaves the temporary name, which readers ignore (the last second is lost, nothing is
    corrupt), and the collector writes several segments each second, each fsync a wait of its own."""
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = final.with_name(f".{final.name}.tmp")
    pq.write_table(arrow, tmp, compression="zstd", **_encodings(arrow.schema))
    fsync_path(tmp)
    os.replace(tmp, final)


def _encodings(schema: pa.Schema) -> dict[str, Any]:
    """Parquet encodings by column type: dictionaries only where values repeat (names, ops, ids, flags), and the
    64-bit nanosecond columns as deltas. Arrow's default tries a dictionary on every column, and gives up on
    timestamps and durations only after building one: one second of segments at 60,000 calls/s took 19 ms of
    CPU and 0.84 MB against 12 ms and 0.47 MB (`bench/bench_store.py --segments`)."""
    repeat = [f.name for f in schema if pa.types.is_string(f.type) or pa.types.is_large_string(f.type)
              or pa.types.is_dictionary(f.type) or pa.types.is_boolean(f.type)
              or (pa.types.is_integer(f.type) and f.type.bit_width <= 32)]
    deltas = {f.name: "DELTA_BINARY_PACKED" for f in schema if f.name.endswith("_ns") and pa.types.is_int64(f.type)}
    return {"use_dictionary": repeat, "column_encoding": deltas}


def _last_segment_seq(segments: Path) -> int:
    return max((seq for p in segments.glob("*/*.parquet") if (seq := segment_seq(p)) is not None), default=0)


def fold_segments(db_path: str | os.PathLike[str], bad: list[tuple[Path, str]] | None = None,
                  derive: Derive | None = None) -> int:
    """Move a recording's Parquet segments into its DuckDB file, in one transaction, then delete them.

    Also recovers a recording whose collector was killed: whatever segments it left are folded. A
    segment that cannot be read (partial, empty, garbage, another schema, an unknown table folder)
    does not stop the fold: it is moved to `<db>.quarantine/` and appended to `bad` with the reason.
    `derive` (analysis.derive.store_derived) stores the accounting's rows once the fold is committed; without it
    readers compute them. Returns the number of rows folded.
    """
    import duckdb

    path = Path(db_path)
    segments = segment_dir(path)
    if not segments.is_dir():
        return 0
    by_table, unusable = list_segments(segments)
    # Which files DuckDB can insert into the schema's tables, tried in a scratch database first: a
    # failed statement would abort the fold's transaction.
    probe = duckdb.connect(":memory:")
    try:
        migrate(probe)
        for table, files in by_table.items():
            for file in [f for f in files if f.name.startswith("latest-")]:
                try:
                    pq.read_table(file).column("session_id")
                except (OSError, KeyError, ValueError, pa.ArrowException) as exc:
                    files.remove(file)
                    unusable.append((file, str(exc).strip().splitlines()[0][:300]
                                           if str(exc).strip() else type(exc).__name__))
            failed = insert_segments(probe, table, files)
            unusable += failed
            by_table[table] = [f for f in files if f not in {p for p, _ in failed}]
    finally:
        probe.close()
    moved = quarantine(path, segments, unusable)
    if bad is not None:
        bad.extend(moved)
    con = _connect_writable(path)
    folded = 0
    try:
        con.execute("BEGIN TRANSACTION").fetchall()
        for table, files in sorted(by_table.items()):
            latest = [p for p in files if p.name.startswith("latest-")]
            appended = [p for p in files if not p.name.startswith("latest-")]
            for file in latest:
                arrow = pq.read_table(file)
                session_ids = set(arrow.column("session_id").to_pylist())
                for sid in session_ids:
                    con.execute(f"DELETE FROM {table} WHERE session_id = ?", [sid]).fetchall()
                _insert(con, table, arrow)
                folded += arrow.num_rows
            if appended:
                names = [str(p) for p in appended]
                before = con.execute(f"SELECT count(*) FROM {table}").fetchall()[0][0]
                insert_parquet(con, table, names)
                folded += con.execute(f"SELECT count(*) FROM {table}").fetchall()[0][0] - before
        con.execute("COMMIT").fetchall()
    except Exception:
        con.execute("ROLLBACK").fetchall()
        con.close()
        raise
    try:
        # The store is finished: its accounting is computed once here, not by every reader (schemas/v3.sql).
        if derive is not None:
            _derive(con, derive)
    finally:
        con.close()
    shutil.rmtree(segments)
    shutil.rmtree(checkpoint_dir(path), ignore_errors=True)  # what it held is in the store now
    return folded


def _derive(con: duckdb.DuckDBPyConnection, derive: Derive) -> None:
    """Store the accounting's derived tables; a failure there leaves the store as it was (readers compute them)."""
    import logging

    try:
        derive(con)
    except Exception as exc:  # the trace itself is committed: never lose it over a derived table
        logging.getLogger(__name__).warning("derived accounting tables not stored: %s", exc)
