"""Aggregates that contradict the stored rows are not called exact (issue 8, item 7).

Ingero's per-minute aggregates can count fewer calls than the rows stored for the same minute (seen on
a published trace: 0 counted, 906 rows). The store is Ingero's published DataLoader trace, ingero_dataloader,
then a copy whose aggregates are made to count fewer than the rows of one minute: per bucket the count
is never fewer than the rows, and what is a lower bound is labelled as one. A window (`--since 30s`)
does not pull in the minute buckets that reach outside it.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import duckdb
import pytest

from ingero_mcp.analysis.models import TimeWindow
from ingero_mcp.analysis.processes import per_process_breakdown
from ingero_mcp.analysis.stats import trace_stats
from ingero_mcp.store import open_store

MINUTE = 1774015560000000000  # the first minute bucket of the DataLoader trace


@pytest.fixture(scope="module")
def contradicted(ingero_dataloader: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy whose aggregates count 0 cudaMemcpyAsync calls (14 rows stored) and 100 switches of pid 2233 (853 rows)
    in the first minute."""
    out = tmp_path_factory.mktemp("contradicted") / "c.duckdb"
    shutil.copy(ingero_dataloader, out)
    con = duckdb.connect(str(out))
    try:
        con.execute(f"UPDATE host_aggregates SET count = 0, sum_duration_ns = 218000, max_duration_ns = 218000 "
                    f"WHERE op = 'cudaMemcpyAsync' AND bucket_start_ns = {MINUTE}")
        con.execute(f"DELETE FROM host_aggregates WHERE op = 'sched_switch' AND pid = 2233 "
                    f"AND bucket_start_ns = {MINUTE} "
                    f"AND rowid NOT IN (SELECT min(rowid) FROM host_aggregates WHERE op = 'sched_switch' "
                    f"AND pid = 2233 AND bucket_start_ns = {MINUTE})")
        con.execute(f"UPDATE host_aggregates SET count = 100 WHERE op = 'sched_switch' AND pid = 2233 "
                    f"AND bucket_start_ns = {MINUTE}")
    finally:
        con.close()
    return out


def test_consistent_aggregates_stay_exact(ingero_dataloader: Path) -> None:
    con = open_store(ingero_dataloader)
    try:
        memcpy = {s.op: s for s in trace_stats(con).ops}["cudaMemcpyAsync"]
        assert memcpy.total_count == 20 + 1 and not memcpy.lower_bound and memcpy.contradicted_buckets == 0
        main = {p.pid: p for p in per_process_breakdown(con)}[2233]
        assert main.context_switches == 3713 and not main.switches_lower_bound
    finally:
        con.close()


def test_a_bucket_never_counts_fewer_than_its_rows(contradicted: Path) -> None:
    con = open_store(contradicted)
    try:
        rows_n, rows_ns = con.sql(f"SELECT count(*), sum(duration_ns) FROM cuda_calls WHERE op = 'cudaMemcpyAsync' "
                                  f"AND ts_ns < {MINUTE + 60_000_000_000}").fetchall()[0]
        stats = trace_stats(con)
        memcpy = {s.op: s for s in stats.ops}["cudaMemcpyAsync"]
        later_n, later_ns = con.sql(f"SELECT sum(count), sum(sum_duration_ns) FROM host_aggregates "
                                    f"WHERE op = 'cudaMemcpyAsync' AND bucket_start_ns > {MINUTE}").fetchall()[0]
        assert (rows_n, later_n) == (14, 1)
        # the first minute counts its 14 rows, not the aggregate's 0 calls / 218 us; the next minute its aggregate
        assert memcpy.total_count == rows_n + later_n and memcpy.total_ns == rows_ns + later_ns
        assert memcpy.lower_bound and memcpy.contradicted_buckets == 1 and memcpy.aggregate_count == later_n
        assert any("fewer calls than the rows" in n and "cudaMemcpyAsync" in n for n in stats.notes)
        switches_rows = con.sql(f"SELECT count(*) FROM sched_intervals WHERE pid = 2233 "
                                f"AND on_ns < {MINUTE + 60_000_000_000}").fetchall()[0][0]
        later = con.sql(f"SELECT sum(count) FROM host_aggregates WHERE op = 'sched_switch' AND pid = 2233 "
                        f"AND bucket_start_ns > {MINUTE}").fetchall()[0][0]
        main = {p.pid: p for p in per_process_breakdown(con)}[2233]
        assert main.context_switches == switches_rows + later == 853 + 2826
        assert main.switches_lower_bound
    finally:
        con.close()


def test_a_window_does_not_pull_in_minutes_outside_it(ingero_dataloader: Path) -> None:
    con = open_store(ingero_dataloader)
    try:
        end = con.sql("SELECT max(ts_ns) FROM cuda_calls").fetchall()[0][0]
        window = TimeWindow(start_ns=end - 30_000_000_000, end_ns=end)  # --since 30s: both minutes reach outside it
        in_window = dict(con.sql(f"SELECT op, count(*) FROM cuda_calls WHERE ts_ns BETWEEN {window.start_ns} AND {end} "
                                 f"GROUP BY op").fetchall())
        stats = trace_stats(con, window)
        for s in stats.ops:
            assert s.total_count == in_window[s.op] and s.lower_bound, s.op
        assert stats.host == []  # no minute bucket lies wholly inside 30 s
        assert any("wholly inside the window" in n for n in stats.notes)
    finally:
        con.close()
