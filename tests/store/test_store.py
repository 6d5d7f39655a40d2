"""The store's writer/reader contract: columnar writes, live segments visible, read-only readers."""

from __future__ import annotations

import os
import subprocess
import sys
import sqlite3
from pathlib import Path

import duckdb
import pytest
from paths import REPO

from ingero_mcp.store.views import DEFINITIONS, SPANS_PLAIN
from ingero_mcp.store import SCHEMA_VERSION, StoreError, TraceWriter, fold_segments, open_store, segment_dir

CALL = {"ts_ns": [1, 2], "duration_ns": [5, 6], "pid": [7, 7], "tid": [7, 8], "api": ["runtime"] * 2,
        "op": ["cudaMalloc"] * 2}


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


def test_a_flush_merges_dictionary_and_plain_batches_of_one_column(tmp_path: Path) -> None:
    # The ring decoders write prev_state dictionary-encoded, the rows for threads still off-CPU at the stop
    # write it plain: a flush holding both once failed at the stop and lost the session's last rows.
    import pyarrow as pa

    db = tmp_path / "mixed.duckdb"
    w = TraceWriter(db, live=True)
    interval = {"pid": [7], "tid": [7], "off_ns": [1], "off_cpu_ns": [5]}
    states = pa.DictionaryArray.from_arrays(pa.array([0, 1], pa.int32()), pa.array(["preempted", "sleeping"]))
    w.append("sched_intervals", pa.table({**{k: v * 2 for k, v in interval.items()}, "prev_state": states}))
    w.append("sched_intervals", pa.table({**interval, "prev_state": pa.array(["sleeping"], pa.string())}))
    w.close()
    con = open_store(db)
    assert con.execute("SELECT prev_state, count(*) FROM sched_intervals GROUP BY ALL ORDER BY 1").fetchall() == [
        ("preempted", 1), ("sleeping", 2)]


def test_a_reader_never_misses_the_session_while_the_writer_replaces_it(tmp_path: Path) -> None:
    """The collector rewrites latest-*.parquet every second; a reader opening the store meanwhile must see one
    version of it, whole (DuckDB opens a file more than once: a replace in between read as corrupt, and the session
    row was skipped, ~1 read in 10 with the writer replacing it in a loop)."""
    import threading

    from ingero_mcp.store.segments import skipped_segments

    db = tmp_path / "live.duckdb"
    w = TraceWriter(db, live=True)
    done = threading.Event()

    def rewrite() -> None:
        i = 0
        while not done.is_set():  # sizes vary, as the notes and counters do
            i += 1
            w.replace("sessions", {"source": ["collector"], "started_ns": [1], "notes": ["x" * (i * 37 % 4000)]})
            w.flush()

    rewrite_thread = threading.Thread(target=rewrite)
    w.replace("sessions", {"source": ["collector"], "started_ns": [1]})
    w.flush()
    rewrite_thread.start()
    try:
        for _ in range(40):
            con = open_store(db)
            assert con.execute("SELECT count(*), min(source) FROM sessions").fetchall() == [(1, "collector")]
            assert skipped_segments(db) == []
            con.close()
    finally:
        done.set()
        rewrite_thread.join()
    w.close()


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
        "w.append('cuda_calls', {'ts_ns': [1], 'duration_ns': [2], 'pid': [3], 'tid': [3], 'api': ['runtime'], "
        "'op': ['cudaFree']})\n"
        "w.close()\n"
    )
    subprocess.run([sys.executable, "-c", script], check=True)
    assert not db.exists() and segment_dir(db).is_dir()
    assert open_store(db).execute("SELECT op FROM cuda_calls").fetchall() == [("cudaFree",)]
    assert fold_segments(db) == 1
    assert open_store(db).execute("SELECT count(*) FROM cuda_calls").fetchall() == [(1,)]


V1_STORES = [REPO / "investigations" / f"h200-seed-benchmark-{v}.duckdb" for v in ("v1", "4cpu")]
V2_ONLY = {"cuda_calls": ["cpu_wait_ns", "sleep_ns", "kernel_handle", "host_ptr", "host_pinned"],
           "sched_intervals": ["sleep_ns", "cpu_wait_ns", "preemptor_tid", "on_cpu", "last_holder_pid",
                               "last_holder_tid", "last_holder_comm", "waker_pid", "waker_tid", "waker_comm",
                               "waker_context", "syscall"],
           "host_aggregates": ["tid", "cpu"], "process_events": ["old_comm"],
           "threads": ["pid", "tid", "comm", "first_seen_ns", "last_seen_ns", "exit_ns"],
           "gpu_processes": ["ts_ns", "gpu_id", "pid", "used_memory_bytes", "sm_util_percent"]}


def _v1_split(con: duckdb.DuckDBPyConnection) -> list[tuple]:
    return con.execute("""
        SELECT prev_state, count(*), sum(sleep_ns), sum(cpu_wait_ns), count(cpu_wait_ns),
               count(*) FILTER (WHERE cpu_wait_ns IS NOT NULL AND sleep_ns + cpu_wait_ns <> off_cpu_ns),
               count(*) FILTER (WHERE prev_state = 'blocked' AND wakeup_ns IS NULL AND cpu_wait_ns IS NOT NULL),
               count(*) FILTER (WHERE prev_state = 'preempted' AND (sleep_ns <> 0 OR cpu_wait_ns <> off_cpu_ns))
        FROM sched_intervals GROUP BY ALL ORDER BY 1""").fetchall()


@pytest.mark.parametrize("path", V1_STORES, ids=lambda p: p.name)
def test_v1_store_reads_in_the_v2_shape(path: Path) -> None:
    assert V1_STORES, "the committed v1 stores are missing"
    raw = duckdb.connect(str(path), read_only=True)
    assert raw.execute("SELECT max(version) FROM schema_version").fetchall() == [(1,)]
    v1_calls = raw.execute("SELECT sum(preempted_ns), sum(blocked_ns), count(*) FROM cuda_calls").fetchall()
    raw.close()
    con = open_store(path)  # read-only: temp views over the v1 tables
    for table, columns in V2_ONLY.items():
        con.execute(f"SELECT {', '.join(columns)} FROM {table} LIMIT 1").fetchall()
    assert con.execute("SELECT sum(cpu_wait_ns), sum(sleep_ns), count(*) FROM cuda_calls").fetchall() == v1_calls
    assert con.execute("SELECT count(kernel_handle), count(host_pinned) FROM cuda_calls").fetchall() == [(0, 0)]
    split = _v1_split(con)
    assert {s for s, *_ in split} == {"blocked", "preempted"}
    assert all(r[5:] == (0, 0, 0) for r in split), split
    assert con.execute("SELECT count(*) FROM threads").fetchall() == [(0,)]
    with pytest.raises(duckdb.Error):
        con.execute("SELECT preempted_ns FROM cuda_calls").fetchall()
    with pytest.raises(duckdb.Error):  # still read-only
        con.execute("INSERT INTO threads VALUES (1, 1, 1, 'x', 0, 0, NULL)").fetchall()
    con.close()
    # explain runs on it, as on a v2 store
    out = subprocess.run([sys.executable, "-m", "ingero_mcp.cli", "explain", "--db", str(path), "--full"],
                         capture_output=True, text=True, timeout=120, env={**os.environ, "COLUMNS": "120"})
    assert out.returncode == 0 and "cudaStreamSynchronize" in out.stdout + out.stderr, out.stderr[-2000:]


def test_writable_v1_store_migrates(tmp_path: Path) -> None:
    src = V1_STORES[0]
    db = tmp_path / "v1.duckdb"
    db.write_bytes(src.read_bytes())
    seen = _v1_split(open_store(src))
    with TraceWriter(db) as w:  # opening for writing migrates in place
        w.append("threads", {"pid": [1], "tid": [2], "comm": ["x"]})
    con = open_store(db)
    versions = con.execute("SELECT version FROM schema_version ORDER BY 1").fetchall()
    assert versions == [(v,) for v in range(1, SCHEMA_VERSION + 1)]
    # no current-shape views over it (the store's own views, laid on every reader, aside)
    assert con.execute("SELECT count(*) FROM information_schema.tables WHERE table_catalog = 'temp' "
                       "AND table_name NOT IN ?", [[*DEFINITIONS, SPANS_PLAIN]]).fetchall() == [(0,)]
    assert _v1_split(con) == seen  # the same split as the read-only views give
    assert con.execute("SELECT count(*) FROM threads").fetchall() == [(1,)]


def test_a_store_within_one_row_group_is_read_on_one_thread(tmp_path: Path) -> None:
    """Every table of a small store fits in one of DuckDB's row groups: its queries get one thread, not a pool's
    scheduling for nothing; a store with a larger table keeps DuckDB's default (one per core)."""
    from ingero_mcp.store.reader import ONE_ROW_GROUP

    small, large = tmp_path / "small.duckdb", tmp_path / "large.duckdb"
    for db, calls in ((small, 1000), (large, ONE_ROW_GROUP + 1)):
        with TraceWriter(db) as w:
            w.replace("sessions", {"source": ["demo:x"], "started_ns": [10]})
            w.append("cuda_calls", {"ts_ns": list(range(20, 20 + calls)), "duration_ns": [5] * calls,
                                    "pid": [7] * calls, "tid": [7] * calls, "api": ["runtime"] * calls,
                                    "op": ["cudaMalloc"] * calls})
    default = duckdb.connect().execute("SELECT current_setting('threads')").fetchone()[0]
    got = {}
    for db in (small, large):
        con = open_store(db)
        got[db.stem] = con.execute("SELECT current_setting('threads')").fetchone()[0]
        con.close()
    assert got == {"small": 1, "large": default}, (got, default)


# Intervals as the collector writes them (collector/records.py sched_split; drain.py at the stop: on_ns NULL), the split
# given: preempted; woken then waiting; wakeup not seen (unknown); woken and still waiting at the stop; asleep at it.
INTERVALS = {
    "pid": [7] * 5, "tid": [7] * 5, "prev_state": ["preempted", "sleeping", "sleeping", "sleeping", "sleeping"],
    "off_ns": [100, 200, 300, 400, 500], "on_ns": [110, 230, 340, None, None],
    "wakeup_ns": [None, 220, None, 420, None],
    "off_cpu_ns": [10, 30, 40, 50, 60], "sleep_ns": [0, 20, None, 20, 60], "cpu_wait_ns": [10, 10, None, 30, 0],
    "preemptor_pid": [9, 9, 8, 8, 8], "preemptor_tid": [9, 10, 10, 8, None],
}


def test_a_v10_store_computes_the_split_and_keeps_what_the_writer_gave(tmp_path: Path) -> None:
    """off_cpu_ns, sleep_ns, cpu_wait_ns and preemptor_pid are not stored (schemas/v10.sql): read back, every row is
    what the writer gave, the stop's rows (on_ns NULL) through stopped_ns, a pid not its tid through *_if_other."""
    db = tmp_path / "v10.duckdb"
    with TraceWriter(db) as w:
        w.append("sched_intervals", INTERVALS)
    con = open_store(db)
    got = con.execute("SELECT off_ns, on_ns, off_cpu_ns, sleep_ns, cpu_wait_ns, stopped_ns, preemptor_pid, "
                      "preemptor_pid_if_other FROM sched_intervals ORDER BY off_ns").fetchall()
    assert got == [(100, 110, 10, 0, 10, None, 9, None), (200, 230, 30, 20, 10, None, 9, 9),
                   (300, 340, 40, None, None, None, 8, 8), (400, None, 50, 20, 30, 450, 8, None),
                   (500, None, 60, 60, 0, 560, 8, 8)]
    generated = con.execute("SELECT column_name FROM information_schema.columns WHERE table_name = 'sched_intervals' "
                            "AND is_generated = 'ALWAYS' ORDER BY 1").fetchall()
    assert generated == [("cpu_wait_ns",), ("last_holder_pid",), ("off_cpu_ns",), ("preemptor_pid",),
                         ("sleep_ns",)]


@pytest.mark.parametrize("live", [False, True])
def test_a_row_whose_split_disagrees_with_the_rule_is_refused_not_stored_wrong(tmp_path: Path, live: bool) -> None:
    """Woken at 420 and still waiting for a CPU at the stop (450): a writer saying it waited 7 ns, not 30, is refused,
    in direct mode at once, in a live recording at the fold (its segment kept, in quarantine)."""
    rows = {k: [v[3]] for k, v in INTERVALS.items()}
    rows["cpu_wait_ns"] = [7]
    db = tmp_path / "bad.duckdb"
    if not live:
        refused = r"sched_intervals: cpu_wait_ns given, not what schemas/v10.sql computes .*tid 7, off_ns 400"
        with pytest.raises(duckdb.Error, match=refused):
            with TraceWriter(db) as w:
                w.append("sched_intervals", rows)
        return
    w = TraceWriter(db, live=True)
    w.append("sched_intervals", rows)
    w.close()
    assert open_store(db).execute("SELECT count(*) FROM sched_intervals").fetchone()[0] == 0
    assert list((tmp_path / "bad.duckdb.quarantine" / "sched_intervals").glob("*.parquet"))


def test_migrating_a_v9_store_to_v10_keeps_every_row(tmp_path: Path) -> None:
    """v10 re-creates three tables with computed columns (schemas/v10.sql): an H200 recording written as v9 reads the
    same after the migration, row for row, its split, holders' pids and kernel handles included."""
    import lzma
    import shutil

    from ingero_mcp.store.schema import migrate

    db = tmp_path / "v9.duckdb"
    with lzma.open(REPO / "investigations" / "zoo-v9" / "niced_trainer_neighbor.duckdb.xz") as src, \
            db.open("wb") as dst:
        shutil.copyfileobj(src, dst)
    queries = ("SELECT * EXCLUDE (session_id) FROM sched_intervals ORDER BY ALL",
               "SELECT ts_ns, tid, op, kernel_handle FROM cuda_calls ORDER BY ALL",
               "SELECT * FROM acct_thread_sleeps ORDER BY ALL")
    con = duckdb.connect(str(db))
    assert con.execute("SELECT max(version) FROM schema_version").fetchone()[0] == 9
    before = [con.execute(q).fetchall() for q in queries]
    assert migrate(con) == SCHEMA_VERSION == 10
    after = [con.execute(q.replace("EXCLUDE (session_id)", "EXCLUDE (session_id, stopped_ns, "
                                   "preemptor_pid_if_other, last_holder_pid_if_other)")).fetchall() for q in queries]
    con.close()
    assert before[0] and before[1]  # (a zoo store keeps no derived rows: acct_thread_sleeps is empty, and stays so)
    assert any(r[6] != r[12] for r in before[0] if r[6] is not None)  # a preemptor whose pid is not its tid
    assert after == before
