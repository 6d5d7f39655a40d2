"""Reads an Ingero SQLite trace database (schema 0.8, 0.9): validation, catalogue, chunked rows.

Ingero stores numeric source/op codes with a `sources`/`ops` catalogue inside each file, a small
sample of events as rows, and exact per-minute counts in `event_aggregates`. This module only
reads; the mapping to the store lives in `ingero.py`. Text decodes with U+FFFD for bytes that are not
UTF-8, and the catalogue, session and process names come out cleaned (`text.py`).
"""

from __future__ import annotations

import queue
import shutil
import sqlite3
import tempfile
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ingero_mcp.importers import text
from ingero_mcp.store.errors import StoreError

SQLITE_MAGIC = b"SQLite format 3\x00"
# Without these an Ingero file cannot be read meaningfully.
REQUIRED_TABLES = ("events", "sources", "ops")
REQUIRED_EVENT_COLUMNS = ("timestamp", "pid", "tid", "source", "op", "duration")
KNOWN_SCHEMAS = ("0.8", "0.9")


class IngeroImportError(StoreError):
    """An input that is not an Ingero trace database (the CLI prints it as one line, exit 2)."""


@dataclass
class IngeroSession:
    """One row of Ingero's `sessions` table (one `ingero trace` run)."""

    ingero_id: int
    row: dict[str, Any]
    node: str
    started_ns: int
    stopped_ns: int | None


@dataclass
class IngeroSource:
    """An open, validated Ingero database: its schema version, catalogue and table layout."""

    path: Path
    con: sqlite3.Connection
    schema_version: str
    tables: dict[str, list[str]]  # table -> column names
    source_names: dict[int, str] = field(default_factory=dict)
    op_names: dict[tuple[int, int], str] = field(default_factory=dict)
    sessions: list[IngeroSession] = field(default_factory=list)
    tmpdir: Path | None = None  # a private copy of a source with a pending WAL, removed by close()

    def close(self) -> None:
        """Close the SQLite connection and remove the private copy, if one was made."""
        self.con.close()
        _remove(self.tmpdir)

    def count(self, table: str) -> int:
        """Rows in `table` (0 when the file lacks it)."""
        if table not in self.tables:
            return 0
        return int(self.con.execute(f'SELECT count(*) FROM "{table}"').fetchall()[0][0])

    def select(self, table: str, wanted: Sequence[str], order: str = "rowid") -> tuple[list[str], str]:
        """A SELECT of `wanted` columns; columns this file lacks come back as NULL (older/newer schemas)."""
        have = set(self.tables[table])
        exprs = [f'"{c}"' if c in have else f'NULL AS "{c}"' for c in wanted]
        return list(wanted), f'SELECT {", ".join(exprs)} FROM "{table}" ORDER BY {order}'

    def chunks(self, table: str, wanted: Sequence[str], size: int = 100_000) -> Iterator[dict[str, list[Any]]]:
        """Rows of `table` as column lists, `size` rows at a time (bounded memory on large files)."""
        names, sql = self.select(table, wanted)
        cur = self.con.execute(sql)
        while True:
            rows = cur.fetchmany(size)
            if not rows:
                return
            cols = list(zip(*rows, strict=True))
            yield {n: list(c) for n, c in zip(names, cols, strict=True)}

    def all_rows(self, table: str) -> tuple[list[str], list[tuple[Any, ...]]]:
        """Every row of a small table, all columns, in rowid order (WITHOUT ROWID tables: key order)."""
        cols = self.tables[table]
        quoted = ", ".join(f'"{c}"' for c in cols)
        try:
            rows = self.con.execute(f'SELECT {quoted} FROM "{table}" ORDER BY rowid').fetchall()
        except sqlite3.OperationalError:
            rows = self.con.execute(f'SELECT {quoted} FROM "{table}"').fetchall()
        return cols, rows


def open_ingero(path: Path) -> IngeroSource:
    """Open `path` read-only and check that it is an Ingero trace database; one-line errors otherwise."""
    if not path.exists():
        raise IngeroImportError(f"{path}: no such file")
    if not path.is_file():
        raise IngeroImportError(f"{path}: not a file")
    with path.open("rb") as fh:
        head = fh.read(len(SQLITE_MAGIC))
    if head != SQLITE_MAGIC:
        raise IngeroImportError(f"{path}: not an SQLite database (expected an Ingero trace .db file)")
    tmpdir: Path | None = None
    try:
        opened, tmpdir = _readable_copy(path)
        # Immutable: nothing is written beside the source (Ingero files are in WAL mode: a plain read-only
        # open wants to create -shm/-wal there, fails in a read-only folder and litters a writable one).
        # A source whose -wal holds transactions not yet checkpointed is read from a private copy instead,
        # where SQLite can apply them. check_same_thread off: a prefetch thread reads the event rows.
        uri = opened.resolve().as_uri() + ("?mode=ro" if tmpdir else "?mode=ro&immutable=1")
        con = sqlite3.connect(uri, uri=True, check_same_thread=False)
        con.text_factory = text.decode  # a name of any bytes is a name, not a traceback
        names = [r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'").fetchall()]
        tables = {t: [r[1] for r in con.execute(f'PRAGMA table_info("{t}")').fetchall()] for t in names}
    except (sqlite3.DatabaseError, OSError) as exc:
        _remove(tmpdir)
        raise IngeroImportError(f"{path}: unreadable SQLite database ({exc})") from exc
    missing = [t for t in REQUIRED_TABLES if t not in tables]
    if missing:
        con.close()
        _remove(tmpdir)
        raise IngeroImportError(
            f"{path}: not an Ingero trace database (missing table(s) {', '.join(missing)})"
        )
    missing_cols = [c for c in REQUIRED_EVENT_COLUMNS if c not in tables["events"]]
    if missing_cols:
        con.close()
        _remove(tmpdir)
        raise IngeroImportError(f"{path}: events table lacks Ingero column(s) {', '.join(missing_cols)}")
    version = "unknown"
    if "schema_info" in tables:
        rows = con.execute("SELECT value FROM schema_info WHERE key = 'version'").fetchall()
        if rows:
            version = str(rows[0][0])
    src = IngeroSource(path=path, con=con, schema_version=version, tables=tables, tmpdir=tmpdir)
    try:
        sources = con.execute("SELECT id, name FROM sources").fetchall()
        src.source_names = {int(i): text.name(n) or "" for i, n in sources}
        src.op_names = {
            (int(s), int(o)): text.name(n) or ""
            for s, o, n in con.execute("SELECT source_id, op_id, name FROM ops").fetchall()
        }
        src.sessions = _sessions(src)
    except (sqlite3.DatabaseError, ValueError, TypeError, OverflowError) as exc:
        src.close()
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise IngeroImportError(f"{path}: malformed Ingero catalogue (sources, ops or sessions): {first}") from exc
    return src


def _readable_copy(path: Path) -> tuple[Path, Path | None]:
    """`path` itself when its -wal is absent or empty; else a private copy of the file and its WAL, and its folder."""
    wal = Path(f"{path}-wal")
    if not (wal.is_file() and wal.stat().st_size > 0):
        return path, None
    tmpdir = Path(tempfile.mkdtemp(prefix="ingero-import-"))
    copy = tmpdir / path.name
    shutil.copyfile(path, copy)
    shutil.copyfile(wal, Path(f"{copy}-wal"))
    return copy, tmpdir


def _remove(tmpdir: Path | None) -> None:
    if tmpdir is not None:
        shutil.rmtree(tmpdir, ignore_errors=True)


def _sessions(src: IngeroSource) -> list[IngeroSession]:
    if "sessions" not in src.tables:
        return []
    cols, rows = src.all_rows("sessions")
    out = []
    for row in rows:
        raw = dict(zip(cols, row, strict=True))
        d = text.row(raw)
        stopped = int(d.get("stopped_at") or 0)
        out.append(
            IngeroSession(
                ingero_id=int(d.get("id") or len(out) + 1),
                row=d,
                node=text.name(raw.get("node")) or "",  # as the event rows' nodes are cleaned
                started_ns=int(d.get("started_at") or 0),
                stopped_ns=stopped or None,  # Ingero writes 0 while recording / when killed
            )
        )
    return out


def prefetch(chunks: Iterator[dict[str, list[Any]]], depth: int = 2) -> Iterator[dict[str, list[Any]]]:
    """Read the next chunks in a thread while the caller maps and writes the current one.

    sqlite3 releases the GIL inside SQLite and DuckDB releases it while inserting, so reading and
    writing overlap. The generator must not be abandoned half-way by a caller that keeps running:
    an exception in the caller stops the reader at its next chunk.
    """
    q: queue.Queue[tuple[str, Any]] = queue.Queue(maxsize=depth)
    stop = threading.Event()

    def reader() -> None:
        try:
            for chunk in chunks:
                while not stop.is_set():
                    try:
                        q.put(("chunk", chunk), timeout=0.1)
                        break
                    except queue.Full:
                        continue
                if stop.is_set():
                    return
            q.put(("end", None))
        except BaseException as exc:  # handed to the caller, raised there
            q.put(("error", exc))

    thread = threading.Thread(target=reader, name="ingero-reader", daemon=True)
    thread.start()
    try:
        while True:
            kind, item = q.get()
            if kind == "end":
                return
            if kind == "error":
                raise item
            yield item
    finally:
        stop.set()
        thread.join()
