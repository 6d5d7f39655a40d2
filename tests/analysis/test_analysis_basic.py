"""Window, stats, per-process breakdown, info, timeline and context over a synthetic store."""

from __future__ import annotations

from pathlib import Path

import pytest

from analysis_fixtures import MS, S, SLOW_SYNC_START, SLOW_SYNCS, T0, US, contention_store
from stack_fixtures import checkpoint_store
from ingero_mcp.analysis._sql import AnalysisError
from ingero_mcp.analysis.context import system_context
from ingero_mcp.analysis.info import trace_info
from ingero_mcp.analysis.models import TimeWindow
from ingero_mcp.analysis.processes import per_process_breakdown
from ingero_mcp.analysis.report import build_report
from ingero_mcp.analysis.stats import trace_stats
from ingero_mcp.analysis.timeline import timeline
from ingero_mcp.analysis.window import parse_duration_ns, resolve_window, trace_window
from ingero_mcp.store import open_store


@pytest.fixture(scope="module")
def con(tmp_path_factory: pytest.TempPathFactory):
    db = contention_store(tmp_path_factory.mktemp("an") / "c.duckdb")
    connection = open_store(db)
    yield connection
    connection.close()


def test_window_is_relative_to_the_trace_end(con) -> None:
    assert trace_window(con) == TimeWindow(start_ns=T0, end_ns=T0 + 10 * S)
    assert resolve_window(con, since="2s") == TimeWindow(start_ns=T0 + 8 * S, end_ns=T0 + 10 * S)
    assert resolve_window(con, start="5s", end="3s") == TimeWindow(start_ns=T0 + 5 * S, end_ns=T0 + 7 * S)
    assert resolve_window(con, start="+1s", end="+2.5s") == TimeWindow(start_ns=T0 + S, end_ns=T0 + 2500 * MS)
    assert resolve_window(con, since="1h").start_ns == T0  # clamped to the trace
    assert parse_duration_ns("250ms") == 250 * MS
    assert parse_duration_ns("1,234.5 s") == 1_234_500 * MS  # offsets as the report prints them read back
    iso = resolve_window(con, start="2023-11-14T22:13:25Z", end="2023-11-14 22:13:26.5")  # T0 is 22:13:20 UTC
    assert iso == TimeWindow(start_ns=T0 + 5 * S, end_ns=T0 + 6500 * MS)
    assert resolve_window(con, start=str(T0 + 3 * S)).start_ns == T0 + 3 * S
    with pytest.raises(AnalysisError):
        resolve_window(con, since="soon")
    with pytest.raises(AnalysisError):
        resolve_window(con, start="2s", end="5s")


def test_stats_are_exact_percentiles_over_every_row(con) -> None:
    stats = trace_stats(con)
    by_op = {s.op: s for s in stats.ops}
    sync = by_op["cudaStreamSynchronize"]
    assert sync.count == 930
    # 900 steady calls of 200-204 us then 30 of 5 ms: p99 (rank 921) is a slow one, p95 a steady one
    exact = sorted([200 * US + (i % 5) * US for i in range(900)] + [5 * MS] * SLOW_SYNCS)
    assert sync.p50_ns == exact[464] and sync.p95_ns == exact[883] and sync.p99_ns == 5 * MS
    assert sync.max_ns == 5 * MS and sync.total_ns == sum(exact)
    assert sync.share_of_span == pytest.approx(sum(exact) / (10 * S))
    assert by_op["cudaLaunchKernel"].max_ns == 30 * MS
    assert by_op["cudaMemcpyAsync"].bytes_total == 50 * (64 << 20)
    assert by_op["cuMemAlloc"].api == "driver"
    assert stats.calls == 2000 and stats.pids == [100] and not stats.sampled
    host = {h.op: h for h in stats.host}
    assert host["sched_switch"].count == 10 * (50 + 4 * 500) + 2 * 2000
    assert host["mm_page_alloc"].sum_bytes == 10 * 1000 * 4096


def test_stats_window_and_pid_filters(con) -> None:
    late = trace_stats(con, TimeWindow(start_ns=SLOW_SYNC_START, end_ns=SLOW_SYNC_START + 600 * MS))
    sync = {s.op: s for s in late.ops}["cudaStreamSynchronize"]
    assert sync.count == 61 + SLOW_SYNCS and sync.p50_ns < MS and sync.p99_ns == 5 * MS  # both ends inclusive
    assert trace_stats(con, pids=[101]).ops == []


def test_sampled_store_takes_counts_from_aggregates(tmp_path: Path) -> None:
    con = open_store(contention_store(tmp_path / "s.duckdb", sampled=True))
    stats = trace_stats(con)
    sync = {s.op: s for s in stats.ops}["cudaStreamSynchronize"]
    assert stats.sampled and sync.from_sample
    assert sync.count < 930 and sync.total_count == 930
    assert any("stored sample" in n for n in stats.notes)


def test_per_process_breakdown(con) -> None:
    procs = {p.pid: p for p in per_process_breakdown(con)}
    main = procs[100]
    assert main.comm == "python" and main.children == [101, 102, 103, 104]
    assert main.counts_from == "rows" and main.context_switches == SLOW_SYNCS
    assert main.preempted_ns == SLOW_SYNCS * 4 * MS and main.blocked_ns == 0
    assert main.worst_stall_ns == 4 * MS
    assert main.page_allocs == 10_000 and main.page_alloc_bytes == 10_000 * 4096
    assert {o.op for o in main.ops} == {"cudaLaunchKernel", "cudaStreamSynchronize", "cudaMemcpyAsync", "cuMemAlloc"}
    worker = procs[101]
    # a collector store's sched_switch aggregates hold on-CPU time (schemas/v2.sql): off-CPU is not known from them
    assert worker.counts_from == "aggregates" and worker.context_switches == 5000 and worker.on_cpu_ns == S
    assert worker.off_cpu_ns is None
    assert worker.ppid == 100 and worker.ops == []
    assert procs[200].context_switches == 4000 and procs[200].comm == "stress"
    assert 1 not in procs  # a parent we know nothing about is not listed
    assert list(procs)[0] == 100  # CUDA-active first
    only = per_process_breakdown(con, pids=[200])
    assert [p.pid for p in only] == [200]


def test_info_timeline_context(con) -> None:
    info = trace_info(con)
    assert info.sessions[0].cpu_count == 4 and info.row_counts["cuda_calls"] == 2000
    assert not info.live and info.sessions[0].sources[0].source == "cuda"
    moment = SLOW_SYNC_START + 3 * MS
    tl = timeline(con, pid=100, around_ns=moment, limit=60)
    assert len(tl.entries) == 60 and tl.truncated and tl.total_in_window > 60
    assert [e.ts_ns for e in tl.entries] == sorted(e.ts_ns for e in tl.entries)
    kinds = {e.kind for e in tl.entries}
    assert "sched" in kinds and "snapshot" in kinds
    assert any("stress[200]" in e.description for e in tl.entries)
    ctx = system_context(con, max_points=4)
    assert len(ctx.points) <= 4 and ctx.downsampled_from == 11 and ctx.cpu_percent_max == 100.0
    assert len(system_context(con).points) == 11


def test_report_holds_every_part(con) -> None:
    report = build_report(con)
    assert report.stats and report.processes and report.info.sessions
    assert report.window == trace_window(con)


def test_report_reads_a_trace_while_it_is_recorded(tmp_path: Path) -> None:
    from ingero_mcp.store import TraceWriter

    db = tmp_path / "live.duckdb"
    w = TraceWriter(db, live=True)
    w.replace("sessions", {"source": ["collector"], "started_ns": [T0]})
    n = 50
    w.append("cuda_calls", {"ts_ns": [T0 + i * MS for i in range(n)], "duration_ns": [10 * US] * (n - 1) + [5 * MS],
                            "pid": [7] * n, "tid": [7] * n, "api": ["runtime"] * n, "op": ["cudaMemcpy"] * n})
    w.flush()
    con = open_store(db)
    report = build_report(con)
    con.close()
    assert report.info.live and any("still being recorded" in note for note in report.notes)
    assert report.stats[0].count == n and report.stats[0].max_ns == 5 * MS
    # as the collector does
    w.replace("sessions", {"source": ["collector"], "started_ns": [T0], "stopped_ns": [T0 + S]})
    w.close()
    con = open_store(db)
    assert not build_report(con).info.live


def test_incomplete_calls_without_cuda_totals_say_counts_are_of_stored_rows(tmp_path: Path) -> None:
    from ingero_mcp.store import TraceWriter

    db = contention_store(tmp_path / "lossy.duckdb")
    with TraceWriter(db, session_id=1) as w:  # what a collector that lost events writes
        w.replace("table_coverage", {"table_name": ["cuda_calls"], "complete": [False], "note": ["lost 12"]})
    stats = trace_stats(open_store(db))
    assert stats.sampled and all(s.total_count is None for s in stats.ops)
    assert "lost 12" in stats.notes[0] and "stored rows only" in stats.notes[0]


def test_imported_chain_evidence_sql_runs_whatever_the_origin_wrote(tmp_path: Path) -> None:
    from ingero_mcp.analysis.imported import imported_chains
    from ingero_mcp.store import TraceWriter

    db = tmp_path / "imported.duckdb"
    with TraceWriter(db) as w:  # text from another tool's file: quotes in any column
        w.append("imported_chains", {"origin": ["ingero"] * 5, "chain_id": ["c1", "c2", "c3", "c4", "c5"],
                                     "detected_ns": [T0, T0 + S, T0, T0 + S, T0 + 2 * S],
                                     "severity": ["it's high", "it's high", None, None, None],
                                     "op": ["cuda'Op", "cuda'Op", None, None, None]})
    con = open_store(db)
    chains = imported_chains(con)
    assert len(chains) == 2
    for chain, n in zip(chains, (2, 3), strict=True):
        stored = next(e for e in chain.evidence if e.name == "stored_chains")
        assert stored.value == n and con.execute(stored.sql).fetchall()[0][0] == n


def test_a_sleep_on_the_timeline_says_what_it_waited_in_and_who_ended_it(tmp_path: Path) -> None:
    """A sleep is not a preemption: its row says its system call and its waker (here the disk's interrupt), not the
    task the CPU ran next ('CPU taken by' is a preempted thread's)."""
    con = open_store(checkpoint_store(tmp_path / "ckpt.duckdb"))
    entries = [e for e in timeline(con, limit=5000).entries if e.kind == "sched"]
    fsync = [e.description for e in entries if e.description.startswith("off-CPU uninterruptible")]
    assert fsync and all("in fsync() (woken by an interrupt)" in d for d in fsync), fsync[:3]
    assert not any("CPU taken by" in e.description for e in entries if "preempted" not in e.description)
