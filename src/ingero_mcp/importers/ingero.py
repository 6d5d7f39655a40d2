"""Imports an Ingero SQLite trace database into a trace store, losslessly.

Mapping (what Ingero's columns mean was checked against its published databases):
- events of the CUDA / DRIVER sources -> cuda_calls (timestamp = call entry, duration = entry to
  return; arg0 = bytes for alloc/memcpy ops; arg1 = cudaMemcpyKind for cudaMemcpy*). Ingero did not
  measure per-call attribution, so those columns stay NULL.
- sched_switch rows -> sched_intervals: `pid` is a thread id, `duration` is the off-CPU time that
  ends at `timestamp` (the switch back in). Ingero writes the thread's own id in `arg1` (checked:
  every row of the three published files), so it is kept as preemptor only when it names another task.
  Ingero does not record prev_state: 'unknown'.
- process_fork / process_exec / process_exit / oom_kill rows -> process_events (fork: arg1 = child).
- event_aggregates -> host_aggregates (exact per-minute counts; the totals for everything above).
- system_snapshots -> snapshots, process_names -> processes (+ ppid from fork rows),
  sessions -> sessions, causal_chains -> imported_chains.
- and, verbatim: every event row -> imported_events, stack_traces -> imported_stacks, every other
  table (catalogue, schema_info, cgroups, Ingero's own session / process-name rows) -> imported_rows.
A file holding several Ingero sessions (a merged cluster file) becomes one store session each;
rows go to the session of their node and time. Every string is cleaned on its way in (`text.py`), and
an import is one transaction: it adds all of the file or nothing.
"""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import duckdb
import numpy as np
import pyarrow as pa

from ingero_mcp.importers import text
from ingero_mcp.importers.ingero_source import (
    KNOWN_SCHEMAS,
    IngeroImportError,
    IngeroSession,
    IngeroSource,
    open_ingero,
    prefetch,
)
from ingero_mcp.store import TABLES, TraceWriter, segment_dir
from ingero_mcp.store.schema import current_version, ddl, migrate

ORIGIN = "ingero"
BUCKET_NS = 60_000_000_000  # Ingero's event_aggregates are per minute (bucket = minute-truncated ns)
# Ingero's "MB" (mem_total, mem_avail, swap_mb) are MiB, /proc/meminfo kB / 1024: the DataLoader
# host's mem_total 15989 is a 16 GiB VM's MemTotal (~16,372,000 kB) / 1024.
MIB = 1024 * 1024
CHUNK_ROWS = 100_000
DUCKDB_MAGIC = b"DUCK"  # bytes 8..12 of every DuckDB database file

# Ops whose arg0 is a byte count (Ingero's schema_info: "byte size for alloc/memcpy"; mm_page_alloc:
# bytes = 4096 << order). For launches arg0 is a kernel function pointer, so it is not bytes.
BYTE_OPS = frozenset({
    "cudaMalloc", "cudaMallocManaged", "cudaMemcpy", "cudaMemcpyAsync",
    "cuMemAlloc", "cuMemAllocManaged", "cuMemcpy", "cuMemcpyAsync", "mm_page_alloc",
})
# Runtime memcpy ops carry cudaMemcpyKind in arg1.
MEMCPY_KIND_OPS = frozenset({"cudaMemcpy", "cudaMemcpyAsync"})
MEMCPY_KINDS = {0: "H2H", 1: "H2D", 2: "D2H", 3: "D2D", 4: "default"}
PROCESS_EVENT_OPS = {"process_fork": "fork", "process_exec": "exec", "process_exit": "exit", "oom_kill": "oom_kill"}
CUDA_SOURCES = {"CUDA": "runtime", "DRIVER": "driver"}

# Tables with a mapping of their own; every other table of the file is kept in imported_rows.
MAPPED_TABLES = frozenset({"events", "event_aggregates", "causal_chains", "system_snapshots", "stack_traces"})
EVENT_COLUMNS = (
    "id", "timestamp", "pid", "tid", "source", "op", "duration", "gpu_id", "arg0", "arg1", "ret_code",
    "stack_hash", "stack_ips", "cgroup_id", "node", "rank", "local_rank", "world_size",
)
AGG_COLUMNS = ("bucket", "source", "op", "pid", "count", "stored", "sum_dur", "min_dur", "max_dur", "sum_arg0")
CHAIN_P50_NOTE = (
    "p50_ns is Ingero's cuda_p50_us, which Ingero derives as p99 / tail_ratio, not a measured median "
    "(the measured p50 is in the timeline text); p99_ns and p50_ns are whole microseconds x 1000"
)

Progress = Callable[[str, int, int], None]
"""progress(stage, rows_done, rows_total): called as the import advances."""


@dataclass
class ImportSummary:
    """What an import did: the sessions it added, rows read per Ingero table and written per store table."""

    src: Path
    dst: Path
    session_ids: list[int]
    ingero_version: str
    schema_version: str
    rows_read: dict[str, int] = field(default_factory=dict)
    rows_written: dict[str, int] = field(default_factory=dict)
    seconds: float = 0.0
    warnings: list[str] = field(default_factory=list)

    @property
    def total_rows_read(self) -> int:
        """All rows read from the SQLite file."""
        return sum(self.rows_read.values())


def store_source(source: str, op: str) -> str:
    """The store's source name for an Ingero (source, op): 'cuda', 'driver', 'sched', 'mm', 'process', ..."""
    if source == "CUDA":
        return "cuda"
    if source == "HOST":
        if op.startswith("sched_"):
            return "sched"
        if op.startswith("mm_") or op == "oom_kill":
            return "mm"
        if op.startswith("process_"):
            return "process"
        if op.startswith("pod_"):
            return "k8s"
    return source.lower()


def import_ingero(src: Path, dst: Path, progress: Progress | None = None, *, replace: bool = False) -> ImportSummary:
    """Import Ingero trace database `src` into store `dst` (created if missing; existing sessions kept).

    Raises IngeroImportError (a StoreError) for a missing file, a non-SQLite file or a SQLite file
    without Ingero's tables, a destination that is not a trace store or holds a recording's unfolded
    segments, and an Ingero session the store already holds (unless `replace`: those sessions are
    removed in the same transaction). The import is one transaction: on any failure the store is as it
    was (a store this import created is removed).
    """
    started = time.perf_counter()
    src, dst = Path(src), Path(dst)
    source = open_ingero(src)
    try:
        _check_destination(src, dst)
        created = not dst.exists()
        try:
            job = _write(source, dst, progress, replace)
        except BaseException:
            if created:  # a store made by this import alone: leave nothing behind
                for leftover in (dst, dst.with_name(dst.name + ".wal")):
                    leftover.unlink(missing_ok=True)
            raise
        warnings = []
        if source.schema_version not in KNOWN_SCHEMAS:
            warnings.append(
                f"Ingero schema {source.schema_version} is not one this importer was checked against "
                f"({', '.join(KNOWN_SCHEMAS)}); columns it did not know are NULL, unknown tables kept in imported_rows"
            )
        summary = ImportSummary(
            src=src, dst=dst, session_ids=job.session_ids, ingero_version=job.ingero_version,
            schema_version=source.schema_version, rows_read=job.rows_read, rows_written=job.written, warnings=warnings,
        )
    finally:
        source.close()
    summary.seconds = time.perf_counter() - started
    return summary


def _write(source: IngeroSource, dst: Path, progress: Progress | None, replace: bool) -> _Import:
    """The import's one transaction: the sessions it replaces removed and the whole file added, or nothing."""
    _ensure_tables(dst)
    again = _already_imported(dst, source)
    if again and not replace:
        raise IngeroImportError(
            f"{dst} already holds {source.path.name}'s Ingero session(s) as store session(s) "
            f"{', '.join(map(str, again))} (same node and start time): importing again would count every "
            "event twice. Use --replace to import it in their place, or choose another --db"
        )
    with _ImportWriter(dst) as writer:
        writer.remove_sessions(again)
        job = _Import(source, writer, progress)
        job.run()
        writer.commit()
    return job


class _ImportWriter(TraceWriter):
    """A direct TraceWriter whose rows go into one transaction: commit() keeps them; closing without it (an
    error, an interrupt) rolls every row back, the removal of replaced sessions included."""

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self.committed = False
        self._transaction("BEGIN TRANSACTION")

    def _transaction(self, statement: str) -> None:
        assert self._con is not None  # direct mode: the writer holds its connection until close
        self._con.execute(statement).fetchall()

    def remove_sessions(self, session_ids: list[int]) -> None:
        """Drop every row of these sessions (the ones a --replace import takes the place of)."""
        assert self._con is not None
        for table in TABLES if session_ids else ():
            self._con.execute(f"DELETE FROM {table} WHERE session_id IN ({','.join(map(str, session_ids))})").fetchall()

    def commit(self) -> None:
        """Make the import visible: everything, at once."""
        self._transaction("COMMIT")
        self.committed = True

    def close(self) -> None:
        """Roll back what was not committed, then close."""
        if not self.committed and self._con is not None and not self._closed:
            try:
                self._transaction("ROLLBACK")
            except duckdb.Error:  # the connection already gave the transaction up
                pass
        super().close()


def _check_destination(src: Path, dst: Path) -> None:
    """Refuse a --db that would be destroyed or misread: the source itself, a file that is not DuckDB, a
    DuckDB database that is not a trace store, or a store with a recording's unfolded segments."""
    if dst.exists() and src.resolve() == dst.resolve():
        raise IngeroImportError(f"{dst}: the store (--db) must not be the Ingero file being imported")
    segments = segment_dir(dst)
    if segments.is_dir() and any(segments.iterdir()):
        # The recording's session is in those segments, not yet in the file: an import would take its id.
        raise IngeroImportError(
            f"{segments} exists: a collector is recording to {dst}, or one was killed. If none is running, fold "
            f"what it left first: python3 -c \"from ingero_mcp.store import fold_segments; fold_segments('{dst}')\" "
            "(or choose another --db)"
        )
    if dst.is_file() and dst.stat().st_size > 0:
        with dst.open("rb") as fh:
            head = fh.read(16)
        if head[8:12] != DUCKDB_MAGIC:
            raise IngeroImportError(f"{dst}: exists and is not a DuckDB trace store; choose a new --db path")
        try:
            con = duckdb.connect(str(dst), read_only=True)
        except duckdb.Error as exc:
            raise IngeroImportError(f"cannot open {dst}: {str(exc).splitlines()[0]}") from exc
        try:
            version = current_version(con)
            tables = con.execute(
                "SELECT count(*) FROM information_schema.tables WHERE table_schema = 'main'").fetchall()[0][0]
        finally:
            con.close()
        if version == 0 and tables:
            raise IngeroImportError(
                f"{dst}: a DuckDB database that is not an ingero-mcp trace store (no schema_version table, "
                f"{tables} other table(s)); it is left as it is: choose a new --db path"
            )


def _already_imported(dst: Path, source: IngeroSource) -> list[int]:
    """Store sessions holding one of `source`'s Ingero sessions already (same node and start time)."""
    if not source.sessions:
        return []
    con = duckdb.connect(str(dst), read_only=True)
    try:
        have = con.execute(
            "SELECT session_id, coalesce(host, ''), started_ns FROM sessions WHERE source = 'ingero-import'"
        ).fetchall()
    finally:
        con.close()
    wanted = {(s.node or "", s.started_ns) for s in source.sessions}
    return sorted({int(sid) for sid, host, started in have if (host, started) in wanted})


def _ensure_tables(dst: Path) -> None:
    """Create/migrate the store, and add tables appended to the current schema after it was created."""
    try:
        con = duckdb.connect(str(dst))
    except duckdb.Error as exc:
        raise IngeroImportError(f"cannot open {dst} for writing: {str(exc).splitlines()[0]}") from exc
    try:
        migrate(con)
        # v1.sql is CREATE ... IF NOT EXISTS only (idempotent); tables were appended to it before v2 existed.
        con.execute(ddl(1)).fetchall()
    finally:
        con.close()


class _Assigner:
    """Decides which store session a row belongs to: same node (when both know one), then nearest in time."""

    def __init__(self, sessions: list[IngeroSession], session_ids: list[int]) -> None:
        self.ids = np.array(session_ids, dtype=np.int64)
        self.start = np.array([s.started_ns for s in sessions], dtype=np.int64)
        self.stop = np.array(
            [s.stopped_ns if s.stopped_ns is not None else np.iinfo(np.int64).max for s in sessions], dtype=np.int64
        )
        self.nodes = [s.node for s in sessions]

    def assign(self, lo: np.ndarray, hi: np.ndarray | None = None, nodes: list[Any] | None = None) -> np.ndarray:
        """Session id per row, for rows spanning [lo, hi] (ns) and optionally tagged with a node."""
        n = len(lo)
        if len(self.ids) == 1:
            return np.full(n, self.ids[0], dtype=np.int64)
        hi = lo if hi is None else hi
        lo_f = np.asarray(lo, dtype=np.float64)[:, None]
        hi_f = np.asarray(hi, dtype=np.float64)[:, None]
        # Distance in ns from the row's span to each session's [start, stop]; 0 when they overlap.
        dist = np.maximum(np.maximum(self.start[None, :] - hi_f, lo_f - self.stop[None, :].astype(np.float64)), 0.0)
        if nodes is not None:
            row_nodes = np.array([str(x or "") for x in nodes], dtype=object)[:, None]
            sess_nodes = np.array(self.nodes, dtype=object)[None, :]
            mismatch = (row_nodes != "") & (sess_nodes != "") & (row_nodes != sess_nodes)
            dist = dist + np.where(mismatch, 1e30, 0.0)
        return self.ids[np.argmin(dist, axis=1)]


def _split(arrow: pa.Table, sids: np.ndarray) -> Iterator[tuple[int, pa.Table]]:
    """The rows of `arrow` per session id."""
    unique = np.unique(sids)
    if len(unique) == 1:
        yield int(unique[0]), arrow
        return
    for sid in unique:
        yield int(sid), arrow.filter(pa.array(sids == sid))


def _ints(values: list[Any]) -> np.ndarray:
    """An int64 column with NULL (a column the file lacks) as 0."""
    return pa.array(values, pa.int64()).fill_null(0).to_numpy()


def _unless(values: list[Any], null: list[bool]) -> pa.Array:
    """An int64 column with NULL where `null` is true."""
    return pa.array([None if z else v for v, z in zip(values, null, strict=True)], pa.int64())


def _json_default(value: Any) -> Any:
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value).hex()
    return str(value)


class _Import:
    """One import run: reads the file table by table and writes Arrow batches per store session."""

    def __init__(self, source: IngeroSource, writer: TraceWriter, progress: Progress | None) -> None:
        self.src = source
        self.writer = writer
        self.progress = progress
        self.sessions = source.sessions or [self._synthetic_session()]
        base = writer.session_id
        self.session_ids = [base + i for i in range(len(self.sessions))]
        self.first_sid = self.session_ids[0]
        self.assigner = _Assigner(self.sessions, self.session_ids)
        self.ingero_version = str(self.sessions[0].row.get("ingero_ver") or "unknown") if source.sessions else "unknown"
        self.rows_read: dict[str, int] = {}
        self.written: dict[str, int] = {}  # store table -> rows written by this import
        self.total = sum(source.count(t) for t in source.tables)
        self.has_aggregates = source.count("event_aggregates") > 0
        self.done = 0
        self.stage = "sessions"  # the Ingero table being read, for error messages
        self.comm: dict[int, str] = {}  # pid -> name, read by run()
        # Per (session, pid): first/last event time; forks (child -> parent, ts, session); exits.
        self.seen: dict[tuple[int, int], list[int]] = {}
        self.forks: dict[int, tuple[int, int, int]] = {}
        self.exits: dict[tuple[int, int], int] = {}
        self.traced: set[tuple[int, int]] = set()
        self.agg_pids: set[tuple[int, int]] = set()  # (session, pid) counted in event_aggregates
        self.source_totals: dict[tuple[int, str], list[int]] = {}  # (session, source) -> [count, stored]

    # -- helpers ---------------------------------------------------------------------------------
    def _append(self, table: str, arrow: pa.Table, sids: np.ndarray | None = None) -> None:
        if arrow.num_rows == 0:
            return
        parts = _split(arrow, sids) if sids is not None else [(self.first_sid, arrow)]
        for sid, part in parts:
            self.writer.session_id = sid
            self.writer.append(table, part)
        self.written[table] = self.written.get(table, 0) + arrow.num_rows

    def _replace(self, table: str, sid: int, data: dict[str, list[Any]] | pa.Table) -> None:
        self.writer.session_id = sid
        self.writer.replace(table, data)
        rows = data.num_rows if isinstance(data, pa.Table) else len(next(iter(data.values())))
        self.written[table] = self.written.get(table, 0) + rows

    def _advance(self, stage: str, rows: int) -> None:
        self.stage = stage
        self.done += rows
        if self.progress is not None:
            self.progress(stage, self.done, self.total)

    def _read(self, table: str, rows: int) -> None:
        self.stage = table
        self.rows_read[table] = self.rows_read.get(table, 0) + rows

    def _synthetic_session(self) -> IngeroSession:
        """A file without a sessions row still gets one store session spanning its events."""
        lo, hi = self.src.con.execute("SELECT min(timestamp), max(timestamp) FROM events").fetchall()[0]
        return IngeroSession(ingero_id=0, row={}, node="", started_ns=int(lo or 0), stopped_ns=int(hi) if hi else None)

    def _process_names(self) -> dict[int, str]:
        if "process_names" not in self.src.tables:
            return {}
        self.stage = "process_names"
        named = self.src.con.execute("SELECT pid, name FROM process_names").fetchall()
        return {int(p): text.name(n) or "" for p, n in named}

    def _names(self, sources: list[int], ops: list[int]) -> tuple[list[str], list[str]]:
        sn = self.src.source_names
        on = self.src.op_names
        src_names = [sn.get(s, f"source-{s}") for s in sources]
        op_names = [on.get((s, o), f"op-{s}-{o}") for s, o in zip(sources, ops, strict=True)]
        return src_names, op_names

    # -- the run ---------------------------------------------------------------------------------
    def run(self) -> None:
        """Write everything; a value of the wrong type in the file becomes a one-line IngeroImportError."""
        try:
            self.comm = self._process_names()
            self._run()
        except (pa.ArrowException, ValueError, TypeError, OverflowError, sqlite3.DatabaseError) as exc:
            first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            raise IngeroImportError(
                f"{self.src.path}: malformed Ingero data in table {self.stage}: {first}"
            ) from exc

    def _run(self) -> None:
        """Write everything; sessions first so that a reader never sees rows without their session."""
        self._write_sessions()
        self._events()
        self._aggregates()
        self._snapshots()
        self._chains()
        self._stacks()
        self._verbatim_tables()
        self._processes()
        self._coverage_and_stats()

    def _write_sessions(self) -> None:
        for sid, s in zip(self.session_ids, self.sessions, strict=True):
            r = s.row
            flags = {
                k: r[k] for k in ("flags", "pid_filter", "rank", "local_rank", "world_size")
                if r.get(k) not in (None, "")
            }
            notes = (
                f"imported from Ingero {r.get('ingero_ver') or 'unknown'} (SQLite schema "
                f"{self.src.schema_version}), file {text.name(self.src.path.name)}, Ingero session id {s.ingero_id}"
                + (f", node {s.node}" if s.node else "")
                + (
                    "; events are a stored sample, exact per-minute totals in host_aggregates"
                    if self.has_aggregates
                    else "; events are a stored sample and the file holds no per-minute totals"
                )
            )
            self._replace("sessions", sid, {
                "source": ["ingero-import"],
                "host": [s.node or None],
                "kernel": [r.get("kernel") or None],
                "os_release": [r.get("os_release") or None],
                "cpu_model": [r.get("cpu_model") or None],
                "cpu_count": pa.array([r.get("cpu_cores") or None], pa.int32()),
                # Ingero's mem_total is MB (MemTotal kB / 1024).
                "memory_bytes": pa.array([int(r["mem_total"]) * MIB if r.get("mem_total") else None], pa.int64()),
                "gpu_model": [r.get("gpu_model") or None],
                "gpu_driver": [r.get("gpu_driver") or None],
                "cuda_runtime_version": [r.get("cuda_ver") or None],
                "python_version": [r.get("python_ver") or None],
                "collector_version": [f"ingero {r['ingero_ver']}" if r.get("ingero_ver") else "ingero"],
                "collector_flags": [json.dumps(flags, default=_json_default)],
                "started_ns": pa.array([s.started_ns], pa.int64()),
                "stopped_ns": pa.array([s.stopped_ns], pa.int64()),
                "notes": [notes],
            })

    def _events(self) -> None:
        self.stage = "events"
        for chunk in prefetch(self.src.chunks("events", EVENT_COLUMNS, CHUNK_ROWS)):
            n = len(chunk["timestamp"])
            self._read("events", n)
            self._event_chunk(chunk)
            self._advance("events", n)

    def _event_chunk(self, c: dict[str, list[Any]]) -> None:
        """Map one chunk of event rows: verbatim copy, then the rows each store table takes (vectorised)."""
        n = len(c["timestamp"])
        ts = _ints(c["timestamp"])
        dur = _ints(c["duration"])
        pid = _ints(c["pid"])
        tid_raw = _ints(c["tid"])
        tid = np.where(tid_raw != 0, tid_raw, pid)  # 0 = not recorded: the process's own id
        arg0 = _ints(c["arg0"])
        arg1 = _ints(c["arg1"])
        src_ids = _ints(c["source"])
        op_ids = _ints(c["op"])
        # Names per distinct (source, op) code, then spread over the rows.
        encoded = pa.array(src_ids * 65_536 + op_ids).dictionary_encode()  # hashing: few distinct codes
        keys, inv = encoded.dictionary.to_numpy(), encoded.indices.to_numpy()
        u_src = [self.src.source_names.get(int(k) >> 16, f"source-{int(k) >> 16}") for k in keys]
        u_op = [self.src.op_names.get((int(k) >> 16, int(k) & 0xFFFF), f"op-{int(k) >> 16}-{int(k) & 0xFFFF}")
                for k in keys]
        codes = pa.array(inv.astype(np.int32))
        src_col = pa.DictionaryArray.from_arrays(codes, pa.array(u_src, pa.string()))
        op_col = pa.DictionaryArray.from_arrays(codes, pa.array(u_op, pa.string()))
        u_cuda = np.array([sn in CUDA_SOURCES for sn in u_src])
        u_sched = np.array([sn == "HOST" and on == "sched_switch" for sn, on in zip(u_src, u_op, strict=True)])
        u_proc = np.array([sn == "HOST" and on in PROCESS_EVENT_OPS for sn, on in zip(u_src, u_op, strict=True)])
        is_cuda, is_sched, is_proc = u_cuda[inv], u_sched[inv], u_proc[inv]
        u_mapped = np.where(u_cuda, 1, 0) + np.where(u_sched, 2, 0) + np.where(u_proc, 3, 0)
        mapped = pa.DictionaryArray.from_arrays(
            pa.array(u_mapped[inv].astype(np.int32) - 1, mask=u_mapped[inv] == 0),
            pa.array(["cuda_calls", "sched_intervals", "process_events"]),
        )
        nodes = text.column(c["node"], text.name)
        sids = self.assigner.assign(ts, ts, nodes)

        ids = pa.array(c["id"] if not any(isinstance(x, str) for x in c["id"]) else text.column(c["id"], text.name))
        self._append("imported_events", pa.table({
            "origin": pa.DictionaryArray.from_arrays(pa.array(np.zeros(n, np.int32)), pa.array([ORIGIN])),
            "event_id": ids if pa.types.is_string(ids.type) else ids.cast(pa.string()),
            "ts_ns": pa.array(ts),
            "duration_ns": pa.array(c["duration"], pa.int64()),
            "pid": pa.array(c["pid"], pa.int32()),
            "tid": pa.array(c["tid"], pa.int32()),
            "source": src_col,
            "op": op_col,
            "source_id": pa.array(c["source"], pa.int32()),
            "op_id": pa.array(c["op"], pa.int32()),
            "gpu_id": pa.array(c["gpu_id"], pa.int32()),
            "arg0": pa.array(c["arg0"], pa.int64()),
            "arg1": pa.array(c["arg1"], pa.int64()),
            "ret_code": pa.array(c["ret_code"], pa.int64()),
            "stack_hash": pa.array(c["stack_hash"], pa.int64()),
            "stack_ips": pa.array(text.column(c["stack_ips"], text.json_text), pa.string()),
            "cgroup_id": pa.array(c["cgroup_id"], pa.int64()),
            "node": pa.array([x if x else None for x in nodes], pa.string()),
            "rank": pa.array(c["rank"], pa.int32()),
            "local_rank": pa.array(c["local_rank"], pa.int32()),
            "world_size": pa.array(c["world_size"], pa.int32()),
            "mapped_to": mapped,
        }), sids)

        if is_cuda.any():
            idx = np.flatnonzero(is_cuda)
            u_bytes = np.array([on in BYTE_OPS for on in u_op])[inv[idx]]
            u_kind = np.array([on in MEMCPY_KIND_OPS for on in u_op])[inv[idx]]
            kind_arg = arg1[idx]
            has_kind = u_kind & (kind_arg >= 0) & (kind_arg < len(MEMCPY_KINDS))
            self._append("cuda_calls", pa.table({
                "ts_ns": pa.array(ts[idx]),
                "duration_ns": pa.array(dur[idx]),
                "pid": pa.array(pid[idx].astype(np.int32)),
                "tid": pa.array(tid[idx].astype(np.int32)),
                "api": pa.DictionaryArray.from_arrays(
                    pa.array(np.array([CUDA_SOURCES.get(sn, "") == "driver" for sn in u_src])[inv[idx]]
                             .astype(np.int32)),
                    pa.array(["runtime", "driver"]),
                ),
                "op": op_col.take(pa.array(idx)),
                "bytes": pa.array(arg0[idx], mask=~u_bytes),
                "memcpy_kind": pa.DictionaryArray.from_arrays(
                    pa.array(np.where(has_kind, kind_arg, 0).astype(np.int32), mask=~has_kind),
                    pa.array([MEMCPY_KINDS[k] for k in range(len(MEMCPY_KINDS))]),
                ),
                "return_code": pa.array(c["ret_code"], pa.int32()).take(pa.array(idx)),
                "gpu_id": pa.array(c["gpu_id"], pa.int32()).take(pa.array(idx)),
            }), sids[idx])

        if is_sched.any():
            idx = np.flatnonzero(is_sched)
            # arg1 is Ingero's "next task"; in every published row it is the thread itself: no preemptor then.
            other = (arg1[idx] != 0) & (arg1[idx] != tid[idx])
            preemptor = pa.array(arg1[idx].astype(np.int32), mask=~other)
            self._append("sched_intervals", pa.table({
                "pid": pa.array(pid[idx].astype(np.int32)),
                "tid": pa.array(tid[idx].astype(np.int32)),
                "off_ns": pa.array(ts[idx] - dur[idx]),
                "on_ns": pa.array(ts[idx]),
                "off_cpu_ns": pa.array(dur[idx]),
                "prev_state": pa.DictionaryArray.from_arrays(pa.array(np.zeros(len(idx), np.int32)),
                                                             pa.array(["unknown"])),
                "preemptor_pid": preemptor,
                "preemptor_comm": pa.array(
                    [self.comm.get(int(p)) if o else None for p, o in zip(arg1[idx], other, strict=True)], pa.string()
                ) if other.any() else pa.nulls(len(idx), pa.string()),
            }), sids[idx])

        traced = is_cuda | is_sched
        if traced.any():
            pairs = pa.array(sids[traced] * (1 << 32) + pid[traced]).unique().to_numpy()
            self.traced.update((int(v) >> 32, int(v) & 0xFFFFFFFF) for v in pairs)

        if is_proc.any():
            idx = np.flatnonzero(is_proc)
            kinds = [PROCESS_EVENT_OPS[u_op[inv[i]]] for i in idx]
            child = [int(arg1[i]) if k == "fork" and arg1[i] else None for i, k in zip(idx, kinds, strict=True)]
            self._append("process_events", pa.table({
                "ts_ns": pa.array(ts[idx]),
                "event": pa.array(kinds, pa.string()),
                "pid": pa.array(pid[idx].astype(np.int32)),
                "tid": pa.array(tid[idx].astype(np.int32)),
                "child_pid": pa.array(child, pa.int32()),
                "comm": pa.array([self.comm.get(int(pid[i])) for i in idx], pa.string()),
            }), sids[idx])
            for i, k, ch in zip(idx, kinds, child, strict=True):
                sid, p = int(sids[i]), int(pid[i])
                if k == "fork" and ch is not None:
                    self.forks.setdefault(ch, (p, int(ts[i]), sid))
                elif k == "exit" and int(tid[i]) == p:  # the main thread's exit is the process's
                    self.exits[(sid, p)] = int(ts[i])

        self._note_seen(sids, pid, ts)

    def _note_seen(self, sids: np.ndarray, pid: np.ndarray, ts: np.ndarray) -> None:
        grouped = pa.table({"sid": sids, "pid": pid, "ts": ts}).group_by(["sid", "pid"]).aggregate(
            [("ts", "min"), ("ts", "max")]
        )
        for sid, p, lo, hi in zip(*(grouped.column(n).to_pylist() for n in ("sid", "pid", "ts_min", "ts_max")),
                                  strict=True):
            cur = self.seen.get((sid, p))
            self.seen[(sid, p)] = [lo, hi] if cur is None else [min(cur[0], lo), max(cur[1], hi)]

    def _aggregates(self) -> None:
        self.stage = "event_aggregates"
        if "event_aggregates" not in self.src.tables:
            return
        first_row = 0
        for c in self.src.chunks("event_aggregates", AGG_COLUMNS, CHUNK_ROWS):
            n = len(c["bucket"])
            self._read("event_aggregates", n)
            src_names, op_names = self._names([int(x) for x in c["source"]], [int(x) for x in c["op"]])
            bucket = np.array(c["bucket"], dtype=np.int64)
            sids = self.assigner.assign(bucket, bucket + BUCKET_NS - 1)
            # Ingero writes 0 durations for events that have none (page allocs, wakeups): NULL here.
            no_dur = [not mx and not sm for mx, sm in zip(c["max_dur"], c["sum_dur"], strict=True)]
            self._append("host_aggregates", pa.table({
                "bucket_start_ns": pa.array(bucket),
                "bucket_ns": pa.array([BUCKET_NS] * n, pa.int64()),
                "pid": pa.array(c["pid"], pa.int32()),
                "comm": pa.array([self.comm.get(int(p)) for p in c["pid"]], pa.string()),
                "source": pa.array([store_source(s, o) for s, o in zip(src_names, op_names, strict=True)], pa.string()),
                "op": pa.array(op_names, pa.string()),
                "count": pa.array(c["count"], pa.int64()),
                "stored": pa.array(c["stored"], pa.int64()),
                "sum_duration_ns": _unless(c["sum_dur"], no_dur),
                "min_duration_ns": _unless(c["min_dur"], no_dur),
                "max_duration_ns": _unless(c["max_dur"], no_dur),
                "sum_bytes": pa.array(
                    [v if o in BYTE_OPS else None for v, o in zip(c["sum_arg0"], op_names, strict=True)], pa.int64()
                ),
            }), sids)
            # sum_arg0 of an op whose arg0 is not bytes has no column: keep those rows verbatim.
            odd = [i for i, o in enumerate(op_names) if o not in BYTE_OPS and c["sum_arg0"][i]]
            if odd:
                rows = [tuple(c[k][i] for k in AGG_COLUMNS) for i in odd]
                self._verbatim("event_aggregates", AGG_COLUMNS, rows, [first_row + i for i in odd], sids[odd])
            first_row += n
            for sid, s_name, o_name, cnt, stored, p in zip(
                sids.tolist(), src_names, op_names, c["count"], c["stored"], c["pid"], strict=True
            ):
                key = (sid, store_source(s_name, o_name))
                acc = self.source_totals.setdefault(key, [0, 0])
                acc[0] += int(cnt)
                acc[1] += int(stored)
                self.agg_pids.add((sid, int(p)))
            self._advance("event_aggregates", n)

    def _snapshots(self) -> None:
        self.stage = "system_snapshots"
        if "system_snapshots" not in self.src.tables:
            return
        cols = ("timestamp", "cpu_pct", "mem_pct", "mem_avail", "swap_mb", "load_avg")
        mem_total = {sid: s.row.get("mem_total") for sid, s in zip(self.session_ids, self.sessions, strict=True)}
        cores = {sid: s.row.get("cpu_cores") for sid, s in zip(self.session_ids, self.sessions, strict=True)}
        for c in self.src.chunks("system_snapshots", cols, CHUNK_ROWS):
            n = len(c["timestamp"])
            self._read("system_snapshots", n)
            ts = np.array(c["timestamp"], dtype=np.int64)
            sids = self.assigner.assign(ts)
            self._append("snapshots", pa.table({
                "ts_ns": pa.array(ts),
                "cpu_percent": pa.array(c["cpu_pct"], pa.float64()),  # already 0..100
                "mem_used_percent": pa.array(c["mem_pct"], pa.float64()),  # already 0..100
                "load1": pa.array(c["load_avg"], pa.float64()),
                # Ingero's MB are MiB (kB / 1024): x 1,048,576 to bytes.
                "mem_available_bytes": pa.array([None if v is None else int(v) * MIB for v in c["mem_avail"]],
                                                pa.int64()),
                "swap_used_bytes": pa.array([None if v is None else int(v) * MIB for v in c["swap_mb"]], pa.int64()),
                # Not in the snapshot row; the session's MemTotal and core count, for readers that want them here.
                "mem_total_bytes": pa.array(
                    [int(mem_total[s]) * MIB if mem_total.get(s) else None for s in sids.tolist()], pa.int64()
                ),
                "cpu_count": pa.array([cores.get(s) or None for s in sids.tolist()], pa.int32()),
            }), sids)
            self._advance("system_snapshots", n)

    def _chains(self) -> None:
        self.stage = "causal_chains"
        if "causal_chains" not in self.src.tables:
            return
        cols = (
            "id", "detected_at", "severity", "summary", "root_cause", "explanation", "recommendations",
            "cuda_op", "cuda_p99_us", "cuda_p50_us", "tail_ratio", "timeline", "node",
        )
        for c in self.src.chunks("causal_chains", cols, CHUNK_ROWS):
            n = len(c["id"])
            self._read("causal_chains", n)
            ts = np.array([x or 0 for x in c["detected_at"]], dtype=np.int64)
            for key, how in (("id", text.name), ("severity", text.name), ("summary", text.text),
                             ("root_cause", text.text), ("explanation", text.text), ("recommendations", text.json_text),
                             ("cuda_op", text.name), ("timeline", text.json_text), ("node", text.name)):
                c[key] = text.column(c[key], how)
            sids = self.assigner.assign(ts, ts, c["node"])
            us = lambda vals: pa.array([None if v is None else int(v) * 1000 for v in vals], pa.int64())  # noqa: E731
            self._append("imported_chains", pa.table({
                "origin": pa.array([ORIGIN] * n),
                "chain_id": pa.array([str(x) for x in c["id"]], pa.string()),
                "detected_ns": pa.array(c["detected_at"], pa.int64()),
                "severity": pa.array(c["severity"], pa.string()),
                "summary": pa.array(c["summary"], pa.string()),
                "root_cause": pa.array(c["root_cause"], pa.string()),
                "explanation": pa.array(c["explanation"], pa.string()),
                "recommendations": pa.array([r if r else "[]" for r in c["recommendations"]], pa.string()),
                "op": pa.array([o or None for o in c["cuda_op"]], pa.string()),
                "p99_ns": us(c["cuda_p99_us"]),
                "p50_ns": us(c["cuda_p50_us"]),
                "tail_ratio": pa.array(c["tail_ratio"], pa.float64()),
                "timeline": pa.array(c["timeline"], pa.string()),
                "node": pa.array([x if x else None for x in c["node"]], pa.string()),
                "notes": pa.array([CHAIN_P50_NOTE] * n),
            }), sids)
            self._advance("causal_chains", n)

    def _stacks(self) -> None:
        self.stage = "stack_traces"
        if "stack_traces" not in self.src.tables:
            return
        for c in self.src.chunks("stack_traces", ("hash", "ips", "frames"), CHUNK_ROWS):
            n = len(c["hash"])
            self._read("stack_traces", n)
            # A stack is shared by every session of the file: it is kept once, in the first.
            self._append("imported_stacks", pa.table({
                "origin": pa.array([ORIGIN] * n),
                "stack_hash": pa.array(c["hash"], pa.int64()),
                "ips": pa.array(text.column(c["ips"], text.json_text), pa.string()),
                "frames": pa.array(text.column(c["frames"], text.json_text), pa.string()),
            }))
            self._advance("stack_traces", n)

    def _verbatim(
        self,
        table: str,
        cols: tuple[str, ...] | list[str],
        rows: list[tuple[Any, ...]],
        numbers: list[int],
        sids: np.ndarray | None = None,
    ) -> None:
        """Rows kept as JSON objects in imported_rows (in the file's first session unless `sids` says)."""
        if not rows:
            return
        self._append("imported_rows", pa.table({
            "origin": pa.array([ORIGIN] * len(rows)),
            "table_name": pa.array([text.name(table)] * len(rows), pa.string()),
            "row_number": pa.array(numbers, pa.int64()),
            "row_json": pa.array(
                [json.dumps(text.row(dict(zip(cols, r, strict=True))), default=_json_default, ensure_ascii=False)
                 for r in rows],
                pa.string(),
            ),
        }), sids)

    def _verbatim_tables(self) -> None:
        """Every table without a mapping of its own, row by row as JSON (catalogue, metadata, cgroups...)."""
        for table in self.src.tables:
            if table in MAPPED_TABLES:
                continue
            self.stage = table
            cols, rows = self.src.all_rows(table)
            self._read(table, len(rows))
            self._verbatim(table, cols, rows, list(range(len(rows))))
            self._advance(table, len(rows))

    def _processes(self) -> None:
        """One processes row per pid seen in a session: name from process_names, parent from fork rows."""
        self.stage = "process_names"
        per_session: dict[int, set[int]] = {sid: set() for sid in self.session_ids}
        for sid, p in [*self.seen, *self.agg_pids]:
            per_session[sid].add(p)
        for child, (parent, _ts, sid) in self.forks.items():
            per_session[sid].update((child, parent))
        if self.comm:
            seen_at = dict(self.src.con.execute("SELECT pid, seen_at FROM process_names").fetchall())
            pids = list(seen_at)
            at = np.array([int(seen_at[p] or 0) for p in pids], dtype=np.int64)
            for p, sid in zip(pids, self.assigner.assign(at).tolist(), strict=True):
                # A named pid belongs to every session that saw it, and at least to the nearest one.
                if not any(int(p) in per_session[s] for s in self.session_ids):
                    per_session[sid].add(int(p))
        for sid, pids in per_session.items():
            ordered = sorted(pids)
            rows = [self.seen.get((sid, p)) for p in ordered]
            fork = [self.forks.get(p) if self.forks.get(p, (0, 0, -1))[2] == sid else None for p in ordered]
            self._replace("processes", sid, {
                "pid": pa.array(ordered, pa.int32()),
                "ppid": pa.array([f[0] if f else None for f in fork], pa.int32()),
                "comm": pa.array([self.comm.get(p) for p in ordered], pa.string()),
                # First seen: the fork that made it, or its first row, whichever came first.
                "first_seen_ns": pa.array(
                    [min([t for t in ((f[1] if f else None), (r[0] if r else None)) if t is not None], default=None)
                     for f, r in zip(fork, rows, strict=True)],
                    pa.int64(),
                ),
                "last_seen_ns": pa.array([r[1] if r else None for r in rows], pa.int64()),
                "exit_ns": pa.array([self.exits.get((sid, p)) for p in ordered], pa.int64()),
                "traced": pa.array([(sid, p) in self.traced for p in ordered], pa.bool_()),
            })

    def _coverage_and_stats(self) -> None:
        """table_coverage (which tables are complete) and collector_stats from Ingero's exact counts."""
        for sid in self.session_ids:
            totals = {src: v for (s, src), v in self.source_totals.items() if s == sid}
            has_aggs = bool(totals)
            cover = [
                ("cuda_calls", False, "Ingero stores a sample of CUDA/driver calls as rows; exact per-minute "
                 "counts and durations per op are in host_aggregates. Per-call attribution was not measured (NULL)."),
                ("sched_intervals", False, "Ingero stores sched_switch rows only for CUDA-active threads and not all "
                 "of them; exact per-minute counts in host_aggregates (op 'sched_switch'). prev_state unknown."),
                ("process_events", False, "fork/exec/exit rows as Ingero stored them; counts in host_aggregates"),
                ("host_aggregates", has_aggs, "Ingero's event_aggregates: exact counts per (minute, op, pid)"
                 if has_aggs else "this Ingero file holds no event_aggregates: totals unknown"),
                ("snapshots", True, "Ingero's system snapshots (about one a second), as recorded"),
                ("processes", False, "pids named by Ingero or seen in its rows; ppid only where a fork was recorded"),
                ("imported_chains", True, "every causal chain Ingero stored"),
                ("imported_events", True, "every event row of the Ingero file, verbatim"),
                ("imported_stacks", True, "every stack of the Ingero file (kept in the file's first session)"),
                ("imported_rows", True, "every row of the Ingero file's other tables (kept in the first session)"),
                ("collector_stats", has_aggs, "from event_aggregates: seen = sum(count), stored = sum(stored); "
                 "Ingero does not count lost events, so events_lost = 0 means unknown"),
            ]
            self._replace("table_coverage", sid, {
                "table_name": [t for t, _, _ in cover],
                "complete": pa.array([c for _, c, _ in cover], pa.bool_()),
                "note": [n for _, _, n in cover],
            })
            if totals:
                names = sorted(totals)
                self._replace("collector_stats", sid, {
                    "source": names,
                    "events_seen": pa.array([totals[n][0] for n in names], pa.int64()),
                    "events_stored": pa.array([totals[n][1] for n in names], pa.int64()),
                    "events_lost": pa.array([0] * len(names), pa.int64()),
                    "events_aggregated": pa.array([totals[n][0] - totals[n][1] for n in names], pa.int64()),
                })

