"""The live segments of a recording, and what to do with one that cannot be read.

A segment folder can hold things no reader can use: a partial or empty Parquet file (a disk that
filled, a copy that stopped), garbage, a file of another schema, a folder named `x.parquet`, a
folder of a table this version does not know. One of those must not take the whole store down
(explain crashing, the MCP server refusing to start, the fold rolling back): each is skipped and
reported, and the fold moves it aside to `<db>.quarantine/` so that the rest folds and nothing is
deleted. What is valid is decided by DuckDB inserting the file into the table as the current schema
(`store/schema.py`) defines it, so no column list is written here.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import TYPE_CHECKING

from ingero_mcp.store.schema import TABLES, insert_sql

if TYPE_CHECKING:
    import duckdb

log = logging.getLogger("ingero_mcp.store")


def segment_dir(db_path: str | os.PathLike[str]) -> Path:
    """Where a live recording of `db_path` keeps its segments."""
    return Path(f"{os.fspath(db_path)}.segments")


def has_segments(db_path: str | os.PathLike[str]) -> bool:
    """Whether `db_path` is a recording in progress: Parquet segments beside (or instead of) the store file."""
    segments = segment_dir(db_path)
    return segments.is_dir() and any(segments.glob("*/*.parquet"))


def segment_seq(file: Path) -> int | None:
    """A segment's number (the writer numbers its flushes' files in order); None for a latest-state file."""
    return int(file.stem) if file.stem.isdigit() else None


def fsync_path(path: Path) -> None:
    """A file's (or a folder's: a rename in it) data on disk before what follows relies on it."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def remove_store_file(db: Path) -> None:
    """A DuckDB file this project made (a checkpoint, a finished copy, one half made) and its write-ahead log, gone."""
    for leftover in (db, Path(f"{db}.wal")):
        leftover.unlink(missing_ok=True)


Bad = tuple[Path, str]
"""A segment no reader can use, and why."""

# Readers report what they skipped per store path (the latest open of it), for explain and the MCP server.
_SKIPPED: dict[str, list[Bad]] = {}


def quarantine_dir(db_path: str | os.PathLike[str]) -> Path:
    """Where the fold moves the segments it could not read."""
    return Path(f"{os.fspath(db_path)}.quarantine")


def list_segments(segments: Path) -> tuple[dict[str, list[Path]], list[Bad]]:
    """The Parquet files per known table, and the entries that are not one (unknown tables, folders...)."""
    files: dict[str, list[Path]] = {}
    bad: list[Bad] = []
    if not segments.is_dir():
        return files, bad
    for entry in sorted(segments.iterdir()):
        if not entry.is_dir():
            bad.append((entry, "not a table folder"))
            continue
        if entry.name not in TABLES:
            bad.append((entry, f"unknown table {entry.name!r} (this ingero-mcp knows {len(TABLES)} tables)"))
            continue
        for item in sorted(entry.iterdir()):
            if item.name.startswith("."):
                continue  # a segment being written (.NAME.tmp): renamed into place when complete
            if item.suffix != ".parquet":
                bad.append((item, "not a .parquet file"))
            elif not item.is_file():
                bad.append((item, "not a regular file"))
            elif item.stat().st_size == 0:
                bad.append((item, "empty file"))
            else:
                files.setdefault(entry.name, []).append(item)
    return files, bad


def insert_segments(con: duckdb.DuckDBPyConnection, table: str, files: list[Path]) -> list[Bad]:
    """Insert `files` into `table` (auto-commit connection): all at once, else one by one; the unreadable are returned.

    A file DuckDB cannot read as Parquet, or whose columns or types do not fit the table, is left out."""
    import duckdb

    if not files:
        return []
    try:
        insert_parquet(con, table, [str(f) for f in files])
        return []
    except duckdb.Error:
        pass
    bad: list[Bad] = []
    for file in files:
        try:
            insert_parquet(con, table, [str(file)])
        except duckdb.Error as exc:
            bad.append((file, _first_line(exc)))
    return bad


def insert_parquet(con: duckdb.DuckDBPyConnection, table: str, files: list[str]) -> None:
    """Insert the rows of Parquet `files`, read together by name, into `table` (store.schema.insert_sql: the columns
    given are the files' own, from their footers)."""
    source = "read_parquet(?, union_by_name = true)"
    given = [str(r[0]) for r in con.execute(f"DESCRIBE SELECT * FROM {source}", [files]).fetchall()]
    con.execute(insert_sql(con, table, source, given), [files]).fetchall()


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0][:300] if text else type(exc).__name__


def remember_skipped(db_path: str | os.PathLike[str], bad: list[Bad]) -> None:
    """Record what the latest open of `db_path` skipped (an empty list clears it), and log it."""
    key = os.fspath(Path(db_path).resolve())
    _SKIPPED[key] = list(bad)
    for path, reason in bad:
        log.warning("skipped segment %s: %s", path, reason)


def skipped_segments(db_path: str | os.PathLike[str]) -> list[Bad]:
    """The segments the latest open_store of `db_path` in this process skipped."""
    return list(_SKIPPED.get(os.fspath(Path(db_path).resolve()), []))


def describe(bad: list[Bad], limit: int = 5) -> str:
    """One line: how many segments were skipped, the first few with why."""
    shown = "; ".join(f"{p.parent.name}/{p.name}: {reason}" for p, reason in bad[:limit])
    more = f"; and {len(bad) - limit} more" if len(bad) > limit else ""
    return f"{len(bad)} unreadable segment(s) skipped ({shown}{more})"


def quarantine(db_path: str | os.PathLike[str], segments: Path, bad: list[Bad]) -> list[Bad]:
    """Move bad entries out of the segment folder into `<db>.quarantine/`, keeping their table/name."""
    target_root = quarantine_dir(db_path)
    moved: list[Bad] = []
    for path, reason in bad:
        rel = path.relative_to(segments)
        target = target_root / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        n = 1
        while target.exists():
            target = target.with_name(f"{rel.name}.{n}")
            n += 1
        os.replace(path, target)
        moved.append((target, reason))
        log.warning("quarantined segment %s -> %s: %s", path, target, reason)
    return moved
