"""The tables views.materialize makes (once per store content) hold exactly the rows of the views they stand for.

call_spans' table is made by analysis/spans.py (numpy) rather than by the view's SQL: both must agree on nested and
overlapping calls, calls out of order in the store, zero-length calls, several threads and processes, first launches.
"""

from __future__ import annotations

from pathlib import Path

from ingero_mcp.analysis.derive import materialize
from ingero_mcp.store.views import TABLES, VIEWS, lay_views
from ingero_mcp.store import open_store

from test_analysis_views import MS, S, T0, US, call, random_calls, sched, write_store


def _rows(con, sql: str) -> list[tuple]:
    return sorted(con.execute(sql).fetchall(), key=repr)


def _check(path: Path) -> None:
    plain = open_store(path)
    lay_views(plain)
    want = {v: _rows(plain, f"SELECT * FROM {v}") for v in VIEWS}
    types = {v: plain.execute(f"DESCRIBE SELECT * FROM {v}").fetchall() for v in VIEWS}
    plain.close()
    con = open_store(path)
    materialize(con)
    for v in VIEWS:
        assert con.execute(f"DESCRIBE SELECT * FROM {TABLES[v]}").fetchall() == types[v], v
        assert _rows(con, f"SELECT * FROM {TABLES[v]}") == want[v], v
        assert _rows(con, f"SELECT * FROM {v}") == want[v], v  # the view now reads the table
    materialize(con)  # once per store content: a second call keeps the tables
    con.close()


def test_materialized_tables_equal_the_views(tmp_path: Path) -> None:
    t = T0 + S
    calls = [
        call(t, 2 * MS, "cudaMemcpyAsync", nbytes=1 << 20, kind="H2D", pinned=True),
        call(t + 500 * US, 1 * MS, "cuMemcpyHtoDAsync_v2", api="driver", nbytes=1 << 20),
        call(t + 20 * MS, 1 * MS, "cudaLaunchKernel", handle=0xA),
        call(t + 20 * MS + 10 * US, 5 * US, "cuLaunchKernel", api="driver", handle=0xA),
        call(t + 30 * MS, 0, "cudaGetDevice"),  # zero length, then a call at the same moment: two spans
        call(t + 30 * MS, 10 * US, "cudaLaunchKernel", handle=0xB),
        call(t + 60 * MS, 2 * MS, "cudaMalloc", nbytes=1 << 20),
        call(t + 61 * MS, 2 * MS, "cudaFree"),
        call(t + 62 * MS, 5 * MS, "cudaStreamSynchronize"),  # extends the span again
        call(t + 100 * MS, 10 * US, "cudaLaunchKernel", handle=0xA, tid=12),
        call(t + 1500 * MS, 10 * US, "cudaLaunchKernel", handle=0xC, tid=12),
    ]
    calls = list(reversed(calls))  # out of order in the store
    state = [sched(t + 10 * MS, t + 25 * MS, "sleeping", wakeup=t + 24 * MS, sleep=14 * MS, wait=1 * MS),
             sched(t + 61 * MS, t + 1200 * MS, "preempted", sleep=0, wait=1139 * MS)]
    _check(write_store(tmp_path / "a.duckdb", state, calls))


def test_materialized_tables_equal_the_views_random(tmp_path: Path) -> None:
    calls = random_calls(per_tid=400)
    state = [sched(T0 + k * 7 * MS, T0 + k * 7 * MS + 3 * MS, "sleeping", wakeup=T0 + k * 7 * MS + 2 * MS,
                   sleep=2 * MS, wait=1 * MS, tid=tid) for k in range(1, 100) for tid in (11, 12)]
    _check(write_store(tmp_path / "r.duckdb", state, calls))


def test_materialize_on_an_empty_store(tmp_path: Path) -> None:
    _check(write_store(tmp_path / "e.duckdb", [], []))


def test_every_cursor_reads_the_rows_one_connection_made(tmp_path: Path) -> None:
    """A store without derived tables (here a v2-shaped test store) is derived once for the process: a cursor (each
    MCP tool call has its own connection) reads the cached rows, not views that would compute them again; once the
    store's rows change (a live recording's new segment), the fingerprint no longer matches."""
    path = write_store(tmp_path / "t.duckdb", [sched(T0 + 12 * MS, T0 + 15 * MS, "sleeping", wakeup=T0 + 14 * MS)],
                       [call(T0 + 10 * MS, 2 * MS, "cudaMemcpy")])
    con = open_store(path)
    materialize(con)
    want = {v: _rows(con, f"SELECT * FROM {v}") for v in VIEWS}
    cur = con.cursor()
    lay_views(cur)
    for v in VIEWS:
        sql = cur.execute("SELECT sql FROM duckdb_views() WHERE temporary AND view_name = ?", [v]).fetchall()[0][0]
        assert "ingero_cache." in sql, (v, sql)
        assert _rows(cur, f"SELECT * FROM {v}") == want[v], v
    materialize(cur)  # nothing to make: the cursor already reads the cache
    assert cur.execute("SELECT count(*) FROM ingero_cache.fingerprint").fetchall() == [(1,)]
    cur.close()
    con.close()
