"""Causal chains: the time accounting's causes (causes.py), cold starts, then the imported chains.

Own chains are ranked by severity, then by the feeding time they explain (seconds lost); what
explains under 1 % of the feeding time goes to a one-line "minor" list. Imported chains (origin
"ingero") follow, as their origin wrote them. The per-op duration statistics stay in the report's
stats: a heavy tail is a fact, not a cause.
"""

from __future__ import annotations

import duckdb

from ingero_mcp.analysis import recommend as rc
from ingero_mcp.analysis._sql import rows, table_complete
from ingero_mcp.analysis.accounting import accounting, thread_names
from ingero_mcp.analysis.calls import CallGroup
from ingero_mcp.analysis.causes import accounting_chains
from ingero_mcp.analysis.imported import imported_chains
from ingero_mcp.analysis.models import Accounting, CausalChain, Evidence, TimeWindow
from ingero_mcp.analysis.views import install_views
from ingero_mcp.analysis.window import window_or_trace

COLD_FACTOR = 10  # a first launch this many times the median launch counts as cold
RANK = {"HIGH": 0, "MEDIUM": 1, "LOW": 2}


def cold_start_sql(window: TimeWindow, pids: list[int] | None = None) -> str:
    """Per process: its first launches of distinct kernels (call_spans.call_class 'launch_first') that took at
    least COLD_FACTOR x its median repeat launch, with the time they took beyond that median."""
    only = f"AND pid IN ({', '.join(str(int(p)) for p in pids)})" if pids else ""
    return " ".join(f"""
        WITH s AS (SELECT pid, call_class, start_ns, end_ns - start_ns AS ns FROM call_spans
                   WHERE call_class IN ('launch', 'launch_first') AND start_ns BETWEEN {window.start_ns} AND {window.end_ns} {only}),
        m AS (SELECT pid, coalesce(median(ns) FILTER (WHERE call_class = 'launch'), 0) AS median_ns,
                     count(*) FILTER (WHERE call_class = 'launch_first') AS kernels FROM s GROUP BY pid)
        SELECT s.pid, m.kernels, count(*) AS cold, sum(s.ns - m.median_ns)::BIGINT AS excess_ns, min(s.start_ns) AS first_ns,
               max(s.start_ns + s.ns) AS last_ns, max(s.ns) AS worst_ns, any_value(m.median_ns)::BIGINT AS median_ns
        FROM s JOIN m USING (pid)
        WHERE s.call_class = 'launch_first' AND s.ns >= {COLD_FACTOR} * greatest(m.median_ns, 1000)
        GROUP BY s.pid, m.kernels ORDER BY excess_ns DESC""".split())


def cold_start_chains(con: duckdb.DuckDBPyConnection, window: TimeWindow, acc: Accounting,
                      pids: list[int] | None) -> list[CausalChain]:
    """First launches of distinct kernels that were slow (lazy module loading): a fact of the rows, not a guess."""
    if not rows(con, "SELECT 1 FROM cuda_calls WHERE kernel_handle IS NOT NULL LIMIT 1"):
        return []
    install_views(con)
    names = thread_names(con)
    walls = {}
    for t in acc.threads:
        walls.setdefault(t.pid, t.total.wall_ns)
    out = []
    sql = cold_start_sql(window, pids)
    for pid, kernels, cold, excess, first, last, worst, median in rows(con, sql):
        wall = walls.get(int(pid)) or window.duration_ns or 1
        share = excess / wall
        if share < 0.01:
            continue
        severity = "HIGH" if share >= 0.25 else "MEDIUM" if share >= 0.05 else "LOW"
        who = f"{names.get(int(pid), '?')}[{pid}]"
        t0 = window.start_ns
        out.append(CausalChain(
            id=f"{rc.COLD_START}-{pid}", op=rc.COLD_START, severity=severity, root_cause=rc.COLD_START,  # type: ignore[arg-type]
            summary=(f"{who}: {cold} first launches of distinct kernels took {excess / 1e9:.2f} s beyond a normal launch "
                     f"({median / 1e6:.3f} ms), from +{(first - t0) / 1e9:.1f} s to +{(last - t0) / 1e9:.1f} s, the worst "
                     f"{worst / 1e6:.1f} ms: kernel modules loaded on first use (lazy loading), a start-up cost"),
            explanation=(f"Each of these launches is the process's first launch of that kernel (the same function handle "
                         f"is never launched before it in the trace), and each took at least {COLD_FACTOR}x the median "
                         f"repeat launch: CUDA loads a kernel's module on its first launch. {kernels} distinct kernels "
                         "were launched in the window."),
            seconds_lost=round(excess / 1e9, 3), window=TimeWindow(start_ns=int(first), end_ns=int(last)), pids=[int(pid)],
            evidence=[Evidence(name="slow first launches / distinct kernels", value=f"{cold} / {kernels}",
                               sql=f"SELECT cold || ' / ' || kernels FROM ({sql}) WHERE pid = {int(pid)}"),
                      Evidence(name="time beyond a normal launch", value=round(excess / 1e9, 3), unit="s",
                               sql=f"SELECT round(excess_ns / 1e9, 3) FROM ({sql}) WHERE pid = {int(pid)}")],
            recommendations=rc.recommend(rc.COLD_START, {"op": "cudaLaunchKernel", "slowest_ms": f"{worst / 1e6:.1f}",
                                                          "call_index": 1, "pid": pid}),
        ))
    return out


def causal_chains(
    con: duckdb.DuckDBPyConnection,
    window: TimeWindow | None = None,
    pids: list[int] | None = None,
    *,
    groups: list[CallGroup] | None = None,
    acc: Accounting | None = None,
    minor: list[str] | None = None,
) -> list[CausalChain]:
    """Own chains (severity, then seconds explained), then the imported ones. `minor` collects the small ones."""
    del groups  # per-op statistics are the report's; chains read the accounting
    whole = window_or_trace(con, window)
    acc = accounting(con, window, pids) if acc is None else acc
    own: list[CausalChain] = []
    if acc.complete:
        found, small = accounting_chains(con, acc, whole, thread_names(con))
        own += found
        if minor is not None:
            minor += small
        if table_complete(con, "cuda_calls"):
            own += cold_start_chains(con, whole, acc, pids)
    own.sort(key=lambda c: (RANK[c.severity], -(c.seconds_lost or 0)))
    return own + imported_chains(con, window)
