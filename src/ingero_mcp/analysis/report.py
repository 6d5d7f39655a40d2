"""The incident report: trace info, per-op stats, per-process breakdown and causal chains in one model.

The report runs the one cuda_calls pass (calls.call_groups) and the time accounting once each and hands
them to every part; the verdict leads.
"""

from __future__ import annotations

import duckdb

from ingero_mcp.analysis import recommend as rc
from ingero_mcp.analysis._sql import pid_list, table_complete, ts_in, where
from ingero_mcp.analysis.derive import materialize
from ingero_mcp.analysis.accounting import accounting, recording_notes, wind_down_notes
from ingero_mcp.analysis.answers import shared_rows
from ingero_mcp.analysis.calls import CallGroup, call_groups
from ingero_mcp.analysis.chains import causal_chains
from ingero_mcp.analysis.info import data_quality, events_lost, trace_info
from ingero_mcp.analysis.models import Accounting, CausalChain, Diagnosis, Progress, Report, TimeWindow
from ingero_mcp.analysis.processes import per_process_breakdown
from ingero_mcp.analysis.stats import trace_stats
from ingero_mcp.analysis.verdict import GPU_BOUND_MEAN, Syncs, verdict


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
    notes += recording_notes(acc) + wind_down_notes(acc)
    return Report(window=whole, info=info, verdict=found.verdict, stats=stats.ops, host=stats.host, processes=processes,
                  chains=found.chains, minor=found.minor, accounting=acc, notes=notes)


def gpu_busy_sql(window: TimeWindow | None, pids: list[int] | None) -> str:
    """The GPU's mean utilisation in the window's snapshots taken while the processes analysed were using CUDA (their
    first call to the end of their last): a GPU left idle after the job exited reads 0%, which is not the job's. The
    window's snapshots where none falls in that span (a job shorter than the snapshot interval)."""
    only = f"AND pid IN ({pid_list(pids)})" if pids else ""
    calls = where(ts_in(window))
    return " ".join(f"""
        WITH life AS (SELECT min(ts_ns) AS lo, max(ts_ns + coalesce(duration_ns, 0)) AS hi FROM cuda_calls
                      {calls or 'WHERE TRUE'} {only}),
        snap AS (SELECT ts_ns, gpu_util_percent FROM snapshots {where(ts_in(window), 'gpu_util_percent IS NOT NULL')})
        SELECT coalesce((SELECT avg(gpu_util_percent) FROM snap, life WHERE ts_ns BETWEEN life.lo AND life.hi),
                        (SELECT avg(gpu_util_percent) FROM snap))""".split())


def feeder_syncs_sql(pid: int, tid: int, window: TimeWindow | None) -> str:
    """A thread's synchronising calls in the window (call_spans 'sync': a stream or device synchronise, a small
    copy back such as `.item()`): how many, their time together, their median. Calls that return at once found the
    GPU done with what was queued: the host did not wait for the GPU, the GPU waited for the host."""
    span = f"AND start_ns >= {int(window.start_ns)} AND start_ns < {int(window.end_ns)}" if window else ""
    return " ".join(f"""
        SELECT count(*), coalesce(sum(end_ns - start_ns), 0)::BIGINT, median(end_ns - start_ns)::BIGINT
        FROM call_spans WHERE pid = {int(pid)} AND tid = {int(tid)} AND call_class = 'sync' {span}""".split())


def launches_per_mark_sql(marker: Progress) -> str:
    """Within a marker's span, the launches per mark of the rarest kernel (or graph) launched at least nine times in
    ten marks, with whether any launch probe gap leaves those counts short (then unread). Every kernel recurring k
    times between two marks says a mark may span k steps of the loop: a `.item()` read every 20 steps."""
    return " ".join(f"""
        WITH mk AS ({marker.sql}), span AS (SELECT min(ts_ns) AS lo, max(ts_ns) AS hi, count(*) AS n FROM mk),
        per AS (SELECT count(*) / any_value(span.n) AS ratio FROM cuda_calls, span
                WHERE pid = {int(marker.pid)} AND contains(op, 'aunch') AND ts_ns BETWEEN span.lo AND span.hi
                GROUP BY op, kernel_handle HAVING count(*) >= 0.9 * any_value(span.n))
        SELECT (SELECT min(ratio) FROM per),
               EXISTS (SELECT 1 FROM probe_gaps WHERE probes = 'launch')""".split())


STEPS_PER_MARK_SLACK = 0.05  # launches per mark within this share of a whole number k >= 2: k steps a mark


def steps_per_mark(ratio: float | None, gaps: bool) -> int | None:
    """k where every kernel recurs about k >= 2 times between two marks (launches_per_mark_sql's row), else None."""
    if ratio is None or gaps or float(ratio) < 2 - STEPS_PER_MARK_SLACK * 2:
        return None
    k = round(float(ratio))
    return k if abs(float(ratio) - k) <= STEPS_PER_MARK_SLACK * k else None


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
    gpu_mean = shared_rows(con, gpu_busy_sql(window, pids))[0][0]
    gpu = None if gpu_mean is None else float(gpu_mean)
    syncs = None
    if acc.complete and acc.threads and acc.imported is None:
        from ingero_mcp.analysis.causes import pace_threads

        lead = pace_threads(acc)[:1]
        if lead:
            n, ns, median = shared_rows(con, feeder_syncs_sql(lead[0].pid, lead[0].tid, window))[0]
            syncs = Syncs(calls=int(n), ns=int(ns or 0), median_ns=int(median or 0))
    tuning, span = None, whole or window
    lead_pid = _gpu_bound_lead(acc, chains, gpu, span)
    if lead_pid is not None and span is not None:  # the verdict would say GPU-bound: unless it was cuDNN's trials
        from ingero_mcp.analysis.causes.autotune import autotuning_share

        pct = autotuning_share(con, lead_pid[0], span)
        tuning = f"{pct:.0f}% of {lead_pid[1]}'s on-CPU samples (all its threads)" if pct is not None else None
    # asked here, not in a helper or a comprehension given the connection: the report reads what it hands on
    per_mark: dict[int, int] = {}
    for m in acc.progress:
        k = steps_per_mark(*shared_rows(con, launches_per_mark_sql(m))[0])
        if k is not None:
            per_mark[m.pid] = k
    return Diagnosis(accounting=acc, chains=chains, minor=minor, gpu_util_percent=gpu,
                     verdict=verdict(acc, chains, gpu, syncs, per_mark, tuning))


def _gpu_bound_lead(acc: Accounting, chains: list[CausalChain], gpu: float | None,
                    window: TimeWindow | None) -> tuple[int, str] | None:
    """The lead process (pid, name) where the verdict would say a busy GPU set the pace with nothing found
    (verdict.GPU_BOUND_MEAN): whose share of on-CPU samples in cuDNN's autotuning the verdict then says, where half or
    more (causes.autotune), the trials its GPU ran all through the window, which no slow phase stands out from."""
    if (gpu is None or gpu < GPU_BOUND_MEAN or window is None or not window.duration_ns or not acc.complete
            or not acc.threads or acc.imported is not None
            or any(c.origin == "ingero-mcp" and (c.severity != "LOW" or c.root_cause == rc.GPU_BOUND) for c in chains)):
        return None
    from ingero_mcp.analysis.causes import pace_threads

    lead = pace_threads(acc)[:1]
    return (lead[0].pid, f"{lead[0].process_comm or lead[0].comm or '?'}[{lead[0].pid}]") if lead else None
