"""The incident report: trace info, per-op stats, per-process breakdown and causal chains in one model.

The report runs the one cuda_calls pass (calls.call_groups) and the time accounting once each and hands
them to every part; the verdict leads.
"""

from __future__ import annotations

import duckdb

from ingero_mcp.analysis._sql import rows, table_complete, ts_in, where
from ingero_mcp.analysis.derive import materialize
from ingero_mcp.analysis.accounting import accounting, recording_notes
from ingero_mcp.analysis.calls import CallGroup, call_groups
from ingero_mcp.analysis.chains import causal_chains
from ingero_mcp.analysis.info import data_quality, events_lost, trace_info
from ingero_mcp.analysis.models import Diagnosis, Report, TimeWindow
from ingero_mcp.analysis.processes import per_process_breakdown
from ingero_mcp.analysis.stats import trace_stats
from ingero_mcp.analysis.verdict import verdict


def build_report(
    con: duckdb.DuckDBPyConnection, window: TimeWindow | None = None, pids: list[int] | None = None
) -> Report:
    """Everything `explain` shows, computed once over the window (default: the whole trace)."""
    info = trace_info(con, overlaps=False)  # the sort they cost is paid below, where the accounting mended rows
    groups = call_groups(con, window, pids)
    whole = window or info.window or TimeWindow(start_ns=0, end_ns=0)  # window_or_trace, from what info read
    stats = trace_stats(con, window, pids, groups=groups, whole=whole)
    processes = per_process_breakdown(con, window, pids, groups=groups)
    found = diagnosis(con, window, pids, groups=groups, whole=whole)
    acc = found.accounting
    notes = list(stats.notes)
    if info.live:
        notes.append("the trace is still being recorded (or its collector stopped without closing it)")
    if pids:
        seen = {p.pid for p in processes}
        missing = [p for p in pids if p not in seen]
        if missing:
            notes.append(f"no activity in this window for pid(s) {', '.join(map(str, missing))} (not traced, "
                         "not counted, or outside the window)")
    if len(info.sessions) > 1:
        notes.append(f"this store holds {len(info.sessions)} sessions (recordings or imported nodes); the numbers are "
                     "over all of them: filter by session_id with `ingero-mcp query` to separate them")
    lost = events_lost(info)
    if lost:
        notes.append(f"{lost:,} events were lost by the collector (collector_stats.events_lost)")
    if acc.note:
        notes.append(acc.note)
    if acc.data_quality:
        info.data_quality = data_quality(con)
    notes += [f"data quality: {q.count:,} {q.what} (SQL: {q.sql})" for q in info.data_quality]
    notes += [f"data quality: {line}" for line in acc.data_quality]
    notes += recording_notes(acc)
    return Report(window=whole, info=info, verdict=found.verdict, stats=stats.ops, host=stats.host, processes=processes,
                  chains=found.chains, minor=found.minor, accounting=acc, notes=notes)


def diagnosis(con: duckdb.DuckDBPyConnection, window: TimeWindow | None = None, pids: list[int] | None = None,
              groups: list[CallGroup] | None = None, whole: TimeWindow | None = None) -> Diagnosis:
    """The accounting, the chains built on it (`groups`: the report's one cuda_calls pass, else made here) and the
    verdict over them: what `build_report` and the MCP tool get_time_accounting both say. `whole`: the window, or
    the trace's, where the caller has it."""
    if table_complete(con, "cuda_calls") and table_complete(con, "sched_intervals"):
        materialize(con)  # the views' rows, made once per store content before the accounting reads them
    acc = accounting(con, window, pids)
    minor: list[str] = []
    chains = causal_chains(con, window, pids, groups=groups, acc=acc, minor=minor, whole=whole)
    gpu_mean = rows(con, f"SELECT avg(gpu_util_percent) FROM snapshots {where(ts_in(window))}")[0][0]
    gpu = None if gpu_mean is None else float(gpu_mean)
    return Diagnosis(accounting=acc, chains=chains, minor=minor, gpu_util_percent=gpu,
                     verdict=verdict(acc, chains, gpu))
