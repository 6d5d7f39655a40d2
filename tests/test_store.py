"""The store's writer/reader contract: columnar writes, live segments visible, read-only readers."""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path

import duckdb
import pytest

from ingero_mcp.store import StoreError, TraceWriter, fold_segments, open_store, segment_dir

CALL = {"ts_ns": [1, 2], "duration_ns": [5, 6], "pid": [7, 7], "tid": [7, 8], "api": ["runtime"] * 2, "op": ["cudaMalloc"] * 2}


def test_direct_write_then_read(tmp_path: Path) -> None:
    db = tmp_path / "t.duckdb"
    with TraceWriter(db) as w:
        w.replace("sessions", {"source": ["demo:x"], "started_ns": [10]})
        w.append("cuda_calls", CALL)
    con = open_store(db)
    assert con.execute("SELECT count(*), sum(duration_ns) FROM cuda_calls").fetchone() == (2, 11)
    assert con.execute("SELECT session_id FROM sessions").fetchall() == [(1,)]


def test_live_segments_visible_before_close_and_folded_after(tmp_path: Path) -> None:
    db = tmp_path / "live.duckdb"
    w = TraceWriter(db, live=True)
    w.replace("sessions", {"source": ["collector"], "started_ns": [1]})
    w.append("cuda_calls", CALL)
    w.flush()
    con = open_store(db)  # another reader while the writer is recording
    assert con.execute("SELECT count(*) FROM cuda_calls").fetchone()[0] == 2
    assert con.execute("SELECT stopped_ns FROM sessions").fetchone()[0] is None
    con.close()
    w.append("cuda_calls", {k: v[:1] for k, v in CALL.items()})
    w.replace("sessions", {"source": ["collector"], "started_ns": [1], "stopped_ns": [99]})
    w.close()
    assert not segment_dir(db).exists()
    con = open_store(db)
    assert con.execute("SELECT count(*) FROM cuda_calls").fetchone()[0] == 3
    assert con.execute("SELECT count(*), max(stopped_ns) FROM sessions").fetchone() == (1, 99)


def test_killed_writer_leaves_a_readable_store_that_folds(tmp_path: Path) -> None:
    db = tmp_path / "killed.duckdb"
    w = TraceWriter(db, live=True)
    w.append("cuda_calls", CALL)
    w.flush()
    w.append("cuda_calls", CALL)  # never flushed: lost with the "kill"
    del w
    assert open_store(db).execute("SELECT count(*) FROM cuda_calls").fetchone()[0] == 2
    assert fold_segments(db) == 2
    assert open_store(db).execute("SELECT count(*) FROM cuda_calls").fetchone()[0] == 2


def test_readers_cannot_write_or_reach_files(tmp_path: Path) -> None:
    db = tmp_path / "t.duckdb"
    with TraceWriter(db) as w:
        w.append("cuda_calls", CALL)
    con = open_store(db)
    with pytest.raises(duckdb.Error):
        con.execute("DELETE FROM cuda_calls")
    with pytest.raises(duckdb.Error):
        con.execute("SELECT * FROM read_csv('/etc/passwd')")
    with pytest.raises(duckdb.Error):
        con.execute("SET enable_external_access = true")
    assert con.execute("SELECT count(*) FROM cuda_calls").fetchone()[0] == 2


def test_clear_errors_for_bad_stores(tmp_path: Path) -> None:
    with pytest.raises(StoreError, match="no trace store"):
        open_store(tmp_path / "missing.duckdb")
    garbage = tmp_path / "garbage.duckdb"
    garbage.write_bytes(os.urandom(4096))
    with pytest.raises(StoreError, match="not a readable DuckDB"):
        open_store(garbage)
    lite = tmp_path / "ingero.db"
    sqlite3.connect(lite).execute("CREATE TABLE events(x)").connection.commit()
    with pytest.raises(StoreError, match="ingero-mcp import"):
        open_store(lite)
    other = tmp_path / "other.duckdb"
    duckdb.connect(str(other)).execute("CREATE TABLE t(a INT)").close()
    with pytest.raises(StoreError, match="not an ingero-mcp trace store"):
        open_store(other)


def test_live_writer_without_duckdb_leaves_segments_that_fold_later(tmp_path: Path) -> None:
    """A bare GPU host may have pyarrow but not DuckDB: recording must still work."""
    import subprocess
    import sys

    db = tmp_path / "bare.duckdb"
    script = (
        "import sys; sys.modules['duckdb'] = None\n"  # makes `import duckdb` raise ImportError
        "from ingero_mcp.store import writer\n"
        f"w = writer.TraceWriter({str(db)!r}, live=True)\n"
        "w.append('cuda_calls', {'ts_ns': [1], 'duration_ns': [2], 'pid': [3], 'tid': [3], 'api': ['runtime'], 'op': ['cudaFree']})\n"
        "w.close()\n"
    )
    subprocess.run([sys.executable, "-c", script], check=True)
    assert not db.exists() and segment_dir(db).is_dir()
    assert open_store(db).execute("SELECT op FROM cuda_calls").fetchall() == [("cudaFree",)]
    assert fold_segments(db) == 1
    assert open_store(db).execute("SELECT count(*) FROM cuda_calls").fetchall() == [(1,)]
