"""v3 stores keep the accounting's derived tables (schemas/v3.sql: acct_*), made once when the store is finished.

A reader's views then read those tables; they must hold exactly the rows (and types) the views compute, and must be
left unused when the store changed since (an append), when it is a live recording, or an older store.
"""

from __future__ import annotations

from pathlib import Path

import duckdb

from ingero_mcp.analysis.derive import materialize, store_derived
from ingero_mcp.store.views import DERIVED, KEPT_VIEW, STORED, TABLES, VIEWS, has_derived, lay_views
from ingero_mcp.store import TraceWriter, open_store

from test_analysis_views import (
    CALL_COLUMNS,
    MS,
    US,
    PID,
    S,
    SCHED_COLUMNS,
    T0,
    call,
    columns,
    random_calls,
    sched,
    write_store,
)


def _rows(con, sql: str) -> list[tuple]:
    return sorted(con.execute(sql).fetchall(), key=repr)


def _computed(path: Path) -> tuple[dict, dict]:
    con = open_store(path)
    assert not has_derived(con)
    lay_views(con)
    want = {v: _rows(con, f"SELECT * FROM {v}") for v in VIEWS}
    types = {v: con.execute(f"DESCRIBE SELECT * FROM {v}").fetchall() for v in VIEWS}
    con.close()
    return want, types


def _derive(path: Path) -> None:
    con = duckdb.connect(str(path))
    assert store_derived(con)
    con.close()


def _check_derived(path: Path, want: dict, types: dict) -> None:
    con = open_store(path)
    assert has_derived(con)
    lay_views(con)
    for v in VIEWS:
        sql = con.execute("SELECT sql FROM duckdb_views() WHERE temporary AND view_name = ?", [v]).fetchall()[0][0]
        # a views.COMPUTED view is laid by its own SQL: its rows are not stored; call_spans reads the kept spans (v9)
        assert (DERIVED[v] in sql or KEPT_VIEW in sql) == (v in STORED), v
        assert con.execute(f"DESCRIBE SELECT * FROM {v}").fetchall() == types[v], v
        assert _rows(con, f"SELECT * FROM {v}") == want[v], v
    materialize(con)  # nothing made: the per-connection names read the stored tables
    assert con.execute("SELECT count(*) FROM duckdb_tables() WHERE temporary").fetchall() == [(0,)]
    for v in VIEWS:
        assert _rows(con, f"SELECT * FROM {TABLES[v]}") == want[v], v
    cur = con.cursor()  # a cursor (run_sql, evidence SQL) gets them too
    lay_views(cur)
    assert _rows(cur, "SELECT * FROM call_spans") == want["call_spans"]
    con.close()


STATE = [sched(T0 + k * 7 * MS, T0 + k * 7 * MS + 3 * MS, "sleeping", wakeup=T0 + k * 7 * MS + 2 * MS,
               sleep=2 * MS, wait=1 * MS, tid=tid) for k in range(1, 100) for tid in (11, 12)]


def test_stored_tables_equal_the_views(tmp_path: Path) -> None:
    db = write_store(tmp_path / "d.duckdb", STATE, random_calls())
    want, types = _computed(db)
    _derive(db)
    _check_derived(db, want, types)
    _derive(db)  # again: replaced, not doubled
    _check_derived(db, want, types)


def plain_calls(tid: int, n: int = 60) -> list[dict]:
    """A thread whose calls never overlap: launches of three kernels of its own (each first launch a span kept),
    copies, a zero-length call, calls probed entry-only (no duration: no span), one call starting where the last
    ended."""
    ops = [("cudaLaunchKernel", 1), ("cudaLaunchKernel", 2), ("cudaMemcpy", None), ("cudaLaunchKernel", 3),
           ("cudaStreamSynchronize", None)]
    rows, ts = [], T0 + 20 * MS
    for i in range(n):
        op, handle = ops[i % len(ops)]
        dur = None if i % 11 == 5 else (0 if i % 13 == 7 else 40 * US + i)
        copy = "emcpy" in op
        rows.append(call(ts, dur, op, handle=handle and 100 * tid + handle, tid=tid, nbytes=1 << 21 if copy else None,
                         pinned=i % 2 == 0 if copy else None))
        ts += (dur or 0) + (0 if i == 30 else 7 * US)
    return rows


def test_a_v9_store_keeps_only_the_spans_that_are_not_one_call(tmp_path: Path) -> None:
    """Threads whose calls never overlap keep only their first launches; a thread whose calls nest keeps every span;
    read back (cuda_calls for the rest), the rows and types are the views' own."""
    db = write_store(tmp_path / "k.duckdb", STATE, random_calls(tids=(11,)) + plain_calls(12) + plain_calls(13))
    want, types = _computed(db)
    _derive(db)
    _check_derived(db, want, types)
    con = open_store(db)
    kept = con.execute("SELECT tid, count(*), count(*) FILTER (WHERE call_class = 'launch_first') "
                       "FROM acct_call_spans GROUP BY tid ORDER BY tid").fetchall()
    spans = dict(con.execute("SELECT tid, count(*) FROM call_spans GROUP BY tid").fetchall())
    con.close()
    assert kept[0][0] == 11 and kept[0][1] == spans[11]  # nested: every span
    assert kept[1:] == [(12, 3, 3), (13, 3, 3)]  # plain: the three first launches only
    assert spans[12] == spans[13] == 60 - 5  # the 5 entry-only calls have no span


def test_a_first_launch_beside_another_call_at_its_moment(tmp_path: Path) -> None:
    """A kernel's first launch at the moment of another call of its thread (both zero-length, the other first in
    the calls' order): the finish finds the launch among the calls at that moment by its handle (read by rowid for
    those calls alone), as the view does; the span of the call without a handle would be a wrong first launch."""
    at = T0 + 50 * MS
    calls = [call(at - 30 * US, 10 * US, "cudaLaunchKernel", handle=7, tid=14),
             call(at, 0, "cudaMemcpy", tid=14, nbytes=1 << 21, pinned=True),
             call(at, 0, "cudaLaunchKernel", handle=8, tid=14),
             call(at + 90 * US, 40 * US, "cudaLaunchKernel", handle=8, tid=14)]
    db = write_store(tmp_path / "tie.duckdb", STATE, calls)
    want, types = _computed(db)
    _derive(db)
    _check_derived(db, want, types)
    # call_spans' columns: pid, tid, start_ns, end_ns, calls, before_ns, op, ..., kernel_handle, call_class
    firsts = sorted((row[2], row[6], row[-2]) for row in want["call_spans"] if row[-1] == "launch_first")
    assert firsts == [(at - 30 * US, "cudaLaunchKernel", 7), (at, "cudaLaunchKernel", 8)], firsts


def test_finishing_again_does_not_grow_the_file(tmp_path: Path) -> None:
    """Each finish rewrites the acct rows: the old ones' blocks are freed before the new are written (10M store: 826
    of 2,120 blocks were free after repeated finishes)."""
    db = write_store(tmp_path / "f.duckdb", STATE, random_calls(20))
    sizes = []
    for _ in range(3):
        _derive(db)
        con = duckdb.connect(str(db), read_only=True)
        sizes.append(con.execute("SELECT total_blocks, free_blocks FROM pragma_database_size()").fetchall()[0])
        con.close()
    assert sizes[2] == sizes[1] and sizes[1][1] == 0, sizes


def test_empty_store(tmp_path: Path) -> None:
    db = write_store(tmp_path / "e.duckdb", [], [])
    want, types = _computed(db)
    _derive(db)
    _check_derived(db, want, types)


def test_an_append_after_deriving_falls_back(tmp_path: Path) -> None:
    db = write_store(tmp_path / "a.duckdb", STATE, random_calls())
    _derive(db)
    with TraceWriter(db, session_id=1) as w:
        w.append("cuda_calls", columns([call(T0 + 2 * S, 1 * MS, "cudaStreamSynchronize", tid=11)], CALL_COLUMNS))
    con = open_store(db)
    assert not has_derived(con)
    con.close()
    want, types = _computed(db)  # computed from the rows now: the new call is in
    assert sum(r[4] for r in want["call_spans"]) == 901


def test_collector_fold_stores_them(tmp_path: Path) -> None:
    db = tmp_path / "live.duckdb"
    w = TraceWriter(db, live=True, derive=store_derived)  # as the collector makes it
    w.replace("sessions", {"source": ["demo:golden"], "started_ns": [T0], "stopped_ns": [T0 + 3 * S]})
    w.append("sched_intervals", columns(STATE, SCHED_COLUMNS))
    w.append("cuda_calls", columns(random_calls(3), CALL_COLUMNS))
    w.flush()
    con = open_store(db)  # live: segments, no derived tables
    assert not has_derived(con)
    con.close()
    w.close()  # folds, then derives
    plain = tmp_path / "plain.duckdb"
    write_store(plain, STATE, random_calls(3))
    want, types = _computed(plain)
    _check_derived(db, want, types)


def test_direct_writer_derives_only_when_asked(tmp_path: Path) -> None:
    db = write_store(tmp_path / "n.duckdb", STATE, random_calls())
    con = open_store(db)
    assert not has_derived(con)  # acct tables exist (v3) but were not made
    assert con.execute("SELECT count(*) FROM acct_meta").fetchall() == [(0,)]
    con.close()


OLD_WAKERS = """
    WITH s AS (
        SELECT * FROM thread_state
        WHERE pid = {pid} AND tid = {tid} AND state = 'sleeping' AND end_ns > {lo} AND start_ns < {hi}),
    m AS (SELECT start_ns AS t FROM s UNION SELECT end_ns FROM s),
    i AS (
        SELECT m.t, coalesce(c.before_ns + least(m.t, c.end_ns) - c.start_ns, 0) AS in_ns
        FROM m ASOF LEFT JOIN (SELECT * FROM call_spans WHERE pid = {pid} AND tid = {tid}) c ON c.start_ns <= m.t),
    s2 AS (
        SELECT s.*, ie.in_ns - ia.in_ns AS inside_ns, least(s.end_ns, {hi}) - greatest(s.start_ns, {lo}) AS w_ns
        FROM s JOIN i ia ON ia.t = s.start_ns JOIN i ie ON ie.t = s.end_ns)
    SELECT waker_pid, waker_tid, min(waker_comm), min(waker_context), count(*), sum(w_ns)::BIGINT,
           sum(w_ns) FILTER (WHERE sleep_state = 'D')::BIGINT, arg_max(syscall, w_ns)
    FROM s2 WHERE inside_ns {cond} GROUP BY waker_pid, waker_tid"""


def test_wakers_read_thread_sleeps_as_the_old_query_computed(tmp_path: Path) -> None:
    """wakers_sql reads thread_sleeps (made once) instead of its own ASOF join: the same rows, on the plain views, the
    per-connection tables and the stored tables (each sleep counted for its time in the window)."""
    from ingero_mcp.analysis.accounting import wakers_sql
    from ingero_mcp.analysis.models import TimeWindow

    state = [dict(r, waker_pid=100, waker_tid=100 + k % 3, waker_comm=f"w{k % 3}") for k, r in enumerate(STATE)]
    db = write_store(tmp_path / "w.duckdb", state, random_calls())
    con = open_store(db)
    lay_views(con)
    cases = [(11, None, False), (11, None, True), (12, TimeWindow(start_ns=T0 + 100 * MS, end_ns=T0 + 400 * MS), False),
             (13, None, False)]
    want = {}
    for tid, w, inside in cases:
        lo, hi = (w.start_ns, w.end_ns) if w else (-(2**62), 2**62)
        want[(tid, inside, lo)] = _rows(con, OLD_WAKERS.format(pid=PID, tid=tid, lo=lo, hi=hi,
                                                               cond="> 0" if inside else "= 0"))
    con.close()
    assert any(want.values())

    def check(con) -> None:
        for tid, w, inside in cases:
            lo = w.start_ns if w else -(2**62)
            assert _rows(con, wakers_sql(PID, tid, w, inside)) == want[(tid, inside, lo)]

    con = open_store(db)
    lay_views(con)
    check(con)
    materialize(con)
    check(con)
    con.close()
    _derive(db)
    con = open_store(db)
    lay_views(con)
    check(con)
    con.close()
