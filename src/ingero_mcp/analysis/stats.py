"""Per-operation statistics over a window: count, total time, share of the span, exact percentiles.

Percentiles are exact over every stored row (DuckDB quantile_disc), not a rolling sample. When
cuda_calls holds only a sample (an Ingero import), the exact counts and total time come from
host_aggregates and the percentiles are flagged as computed from the stored sample.
"""

from __future__ import annotations

import duckdb

from ingero_mcp.analysis._sql import bucket_in, pid_in, rows, table_complete, tidy, ts_in, where
from ingero_mcp.analysis.answers import shared_rows
from ingero_mcp.analysis.calls import CallGroup, call_groups
from ingero_mcp.analysis.imported import unanalysed_note
from ingero_mcp.analysis.models import HostTotal, OpStats, TimeWindow, TraceStats
from ingero_mcp.analysis.window import window_or_trace

def entry_only_note(names: list[str], ops: list[OpStats]) -> str:
    """What the entry-only ops' statistics are: counts exact, durations unknown (not zero)."""
    partly = [s.op for s in ops if s.op in names and s.entry_only < s.count]
    return (", ".join(names) + " were probed entry-only (duration_ns NULL: the collector's default for kernel "
            "launches): their counts are exact, their durations unknown (p50/p99/max/total 'entry-only', not 0)"
            + (f"; {', '.join(partly)}: the durations cover only the calls that have one" if partly else ""))


def bucket_inside(window: TimeWindow | None) -> str:
    """host_aggregates buckets wholly inside the window: only their counts belong to it."""
    if window is None:
        return ""
    return f"bucket_start_ns >= {int(window.start_ns)} AND bucket_start_ns + bucket_ns <= {int(window.end_ns) + 1}"


def reconcile_sql(
    rows_from: str, ts_col: str, dur_col: str, agg_where: str, keys: list[str], bucket_ns: int,
    window: TimeWindow | None
) -> str:
    """Per key, the counts and durations of the aggregates reconciled with the stored rows, bucket by bucket.

    A bucket's count is never fewer than the rows stored in it: where the aggregate counts fewer (or
    there is none, or the bucket reaches outside the window, whose rows alone are then counted), the
    rows are what is known and the result is a lower bound (`lower`). `contradicted` counts the
    buckets whose aggregate counted fewer calls than the rows stored in them."""
    k = ", ".join(keys)
    partial = (f"bucket_start_ns <= {int(window.end_ns)} AND bucket_start_ns + bucket_ns > {int(window.start_ns)}"
               f" AND NOT ({bucket_inside(window)})") if window is not None else "FALSE"
    return tidy(f"""
        WITH r AS (SELECT {k}, ({ts_col} // {bucket_ns}) * {bucket_ns} AS b, count(*) AS n, sum({dur_col}) AS s,
                          max({dur_col}) AS mx
                   FROM {rows_from} GROUP BY ALL),
             a AS (SELECT {k}, bucket_start_ns AS b, sum(count) AS n, sum(sum_duration_ns) AS s,
                          max(max_duration_ns) AS mx
                   FROM host_aggregates {where(agg_where, bucket_inside(window))} GROUP BY ALL),
             p AS (SELECT DISTINCT {k}, TRUE AS hit FROM host_aggregates {where(agg_where, partial)})
        SELECT {k}, sum(greatest(coalesce(a.n, 0), coalesce(r.n, 0))) AS n,
               sum(CASE WHEN a.n >= coalesce(r.n, 0) AND a.s IS NOT NULL THEN greatest(a.s, coalesce(r.s, 0))
                        ELSE coalesce(r.s, 0) END) AS s,
               max(greatest(coalesce(a.mx, 0), coalesce(r.mx, 0))) AS mx,
               bool_or(a.n IS NULL OR a.n < coalesce(r.n, 0) OR p.hit IS NOT NULL) AS lower,
               count(*) FILTER (WHERE a.n < r.n) AS contradicted,
               sum(coalesce(a.n, 0)) AS agg_n, sum(coalesce(r.n, 0)) AS row_n
        FROM (a FULL OUTER JOIN r USING ({k}, b)) LEFT JOIN p USING ({k})
        GROUP BY {k}
    """)


def agg_bucket_ns(con: duckdb.DuckDBPyConnection, agg_where: str) -> int | None:
    """The aggregates' bucket length (one per store: 1 s for the collector, 60 s for Ingero imports)."""
    got = rows(con, f"SELECT max(bucket_ns) FROM host_aggregates {where(agg_where)}")[0][0]
    return None if got is None else int(got)


def sample_note(con: duckdb.DuckDBPyConnection, counted_ops: set[str] | None = None) -> str:
    """What it means that cuda_calls is not complete: percentiles from the stored sample, totals from where."""
    why = rows(con, "SELECT string_agg(DISTINCT note, '; ') FROM table_coverage WHERE table_name = 'cuda_calls' "
                    "AND NOT complete")[0][0]
    counted = counted_ops if counted_ops is not None else {
        r[0] for r in rows(con,
                           "SELECT DISTINCT op FROM host_aggregates WHERE op IN (SELECT DISTINCT op FROM cuda_calls)")}
    totals = ("counts and total time come from host_aggregates, reconciled bucket by bucket with the stored rows "
              "(never fewer than the rows)" if counted
              else "counts and totals cover the stored rows only (no CUDA totals in host_aggregates)")
    return (f"cuda_calls does not hold every call (table_coverage{': ' + why if why else ''}): percentiles "
            f"are computed from the stored sample; {totals}")


def host_totals_sql(window: TimeWindow | None, pids: list[int] | None) -> str:
    """Totals per aggregated host event (sched_switch, mm_page_alloc, counted CUDA ops...) over the buckets
    wholly inside the window (a bucket reaching outside it would bring in events from outside)."""
    return tidy(f"""
        SELECT source, op, sum(count) AS events, count(DISTINCT pid) AS pids,
               sum(sum_duration_ns) AS sum_duration_ns, sum(sum_bytes) AS sum_bytes
        FROM host_aggregates {where(bucket_inside(window), pid_in(pids))}
        GROUP BY source, op ORDER BY events DESC, source, op
    """)


def host_totals(con: duckdb.DuckDBPyConnection, window: TimeWindow | None, pids: list[int] | None) -> list[HostTotal]:
    """host_aggregates summed per (source, op) over the buckets overlapping the window."""
    return [
        HostTotal(
            source=src, op=op, count=int(n), pids=int(np),
            sum_duration_ns=None if dur is None else int(dur), sum_bytes=None if b is None else int(b),
        )
        for src, op, n, np, dur, b in rows(con, host_totals_sql(window, pids))
    ]


def reconciled_ops_sql(con: duckdb.DuckDBPyConnection, window: TimeWindow | None, pids: list[int] | None) -> str | None:
    """Per CUDA op: aggregates reconciled with the stored rows bucket by bucket (None: no CUDA aggregates)."""
    agg_where = where("op IN (SELECT DISTINCT op FROM cuda_calls)", pid_in(pids)).removeprefix("WHERE ")
    bucket = agg_bucket_ns(con, agg_where)
    if bucket is None:
        return None
    rows_from = f"(SELECT op, ts_ns, duration_ns FROM cuda_calls {where(ts_in(window), pid_in(pids))}) c"
    return reconcile_sql(rows_from, "ts_ns", "duration_ns", agg_where, ["op"], bucket, window)


def op_stats(
    groups: list[CallGroup], span_ns: int, host: list[HostTotal], sampled: bool,
    reconciled: dict[str, tuple] | None = None
) -> list[OpStats]:
    """OpStats per op from the per-op call groups; when sampled, totals reconciled per bucket with the rows."""
    reconciled = reconciled or {}
    out: list[OpStats] = []
    for g in groups:
        if g.pid is not None:
            continue
        total_count, total_ns, lower, contradicted, agg_count = None, g.total_ns, sampled, 0, None
        if sampled and g.op in reconciled:
            n, s, _mx, lower, contradicted, agg_n, _row_n = reconciled[g.op]
            total_count, total_ns = int(n), max(int(s or 0), g.total_ns or 0)
            lower, contradicted, agg_count = bool(lower), int(contradicted), int(agg_n)
        out.append(
            OpStats(
                op=g.op, api=g.api, count=g.count, total_count=total_count, total_ns=total_ns,
                share_of_span=None if total_ns is None else round(total_ns / span_ns, 6) if span_ns else 0.0,
                p50_ns=g.p50_ns, p95_ns=g.p95_ns, p99_ns=g.p99_ns, max_ns=g.max_ns, min_ns=g.min_ns,
                mean_ns=None if g.mean_ns is None else round(g.mean_ns, 1), entry_only=g.entry_only,
                bytes_total=g.bytes_total, from_sample=sampled,
                lower_bound=lower, contradicted_buckets=contradicted, aggregate_count=agg_count,
            )
        )
    out.sort(key=lambda s: (-(s.total_ns or 0), -s.count, s.op))
    return out


def nested_sql(window: TimeWindow | None, pids: list[int] | None) -> str:
    """Per op, its calls that started inside another call of the same thread (a runtime call's driver counterpart,
    where both API layers were probed): one logical call, two rows. Nothing where only one layer was probed (the
    collector's default), and the window over the calls is then skipped."""
    cond = where(ts_in(window), pid_in(pids), "(SELECT count(DISTINCT api) FROM cuda_calls) > 1")
    return tidy(f"""
        WITH c AS (SELECT op, ts_ns, max(ts_ns + coalesce(duration_ns, 0)) OVER (PARTITION BY session_id, pid, tid
                                ORDER BY ts_ns, duration_ns DESC ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING)
                              AS open_until
                   FROM cuda_calls {cond})
        SELECT op, count(*) AS nested FROM c WHERE ts_ns < open_until GROUP BY op ORDER BY nested DESC""")


def trace_stats(
    con: duckdb.DuckDBPyConnection,
    window: TimeWindow | None = None,
    pids: list[int] | None = None,
    *,
    groups: list[CallGroup] | None = None,
    whole: TimeWindow | None = None,
) -> TraceStats:
    """Per-op statistics over `window` (default: the whole trace), optionally for some pids only. `whole`: the window,
    or the trace's, where the caller has it (window_or_trace)."""
    whole = window_or_trace(con, window) if whole is None else whole
    groups = call_groups(con, window, pids) if groups is None else groups
    sampled = not table_complete(con, "cuda_calls")
    host = host_totals(con, window, pids)
    reconciled: dict[str, tuple] = {}
    if sampled and (sql := reconciled_ops_sql(con, window, pids)) is not None:
        reconciled = {r[0]: r[1:] for r in rows(con, sql)}
    ops = op_stats(groups, whole.duration_ns, host, sampled, reconciled)
    call_pids = sorted({g.pid for g in groups if g.pid is not None})
    notes = [sample_note(con, {h.op for h in host} & {s.op for s in ops})] if sampled else []
    if not sampled:
        nested = {str(op): int(n) for op, n in shared_rows(con, nested_sql(window, pids))}
        ops = [o.model_copy(update={"nested": nested.get(o.op, 0)}) for o in ops]
        if nested:
            notes.append("one logical call made in both API layers is counted once: "
                         + ", ".join(f"{n:,} {op}" for op, n in sorted(nested.items(), key=lambda kv: (-kv[1], kv[0])))
                         + " started inside another call of their thread (a runtime call's driver call; both layers "
                         "were probed) and are that call's own work, not more of it")
    if window is not None and rows(con, f"SELECT 1 FROM host_aggregates {where(bucket_in(window), pid_in(pids))} "
                                   f"AND NOT ({bucket_inside(window)}) LIMIT 1"):
        notes.append("host_aggregates totals cover only the buckets wholly inside the window (lower bounds): "
                     "buckets reaching outside it are left out")
    entry_only = [s.op for s in ops if s.entry_only]
    if entry_only:
        notes.append(entry_only_note(entry_only, ops))
    if (unanalysed := unanalysed_note(con)) is not None:
        notes.append(unanalysed)
    lower = [s.op for s in ops if s.lower_bound and s.total_count is not None]
    contradicted = [f"{s.op} ({s.contradicted_buckets} bucket(s): aggregates {s.aggregate_count} < rows)"
                    for s in ops if s.contradicted_buckets]
    if contradicted:
        notes.append("host_aggregates count fewer calls than the rows stored in the same bucket for "
                     + ", ".join(contradicted)
                     + ": those buckets count their rows (a lower bound)")
    if lower:
        notes.append("counts and totals of " + ", ".join(lower) + " are lower bounds (per bucket never fewer than the "
                     "stored rows; buckets without aggregates or reaching outside the window count their rows only)")
    return TraceStats(
        window=whole, ops=ops, calls=sum(s.count for s in ops), pids=call_pids, host=host, sampled=sampled, notes=notes
    )
