"""Drained gaps: stretches in which a process had nothing queued on the GPU because its feeding thread had waited
for all of it (a synchronising call returned) and no thread of the process had queued anything since.

Whatever the thread did in such a gap kept the GPU idle for that process, whatever the GPU's utilisation over the
second says: these are the host-side seconds the per-second view cannot split at a busy GPU (a command run between
steps, Python preparing the next batch after a `.item()`). A lower bound of the host's cost: idle time between
kernels while work is queued is not in them.
"""

from __future__ import annotations

from collections import defaultdict

import duckdb

from ingero_mcp.analysis.accounting import SECOND_NS, latest_name_sql
from ingero_mcp.analysis.answers import shared_rows

# Calls that queue work on the GPU: launches, copies, memsets (any API, runtime or driver).
QUEUES = "(kernel_handle IS NOT NULL OR contains(op, 'Memcpy') OR contains(op, 'Memset'))"
# The parts a thread's time in a drained gap is split into (the accounting's names); 'run_outside' is the rest.
GAP_PARTS = ("sleep_outside", "io", "cpu_wait", "unknown", "in_call")


def _gaps_cte(p: int, t: int, lo: int, hi: int) -> str:
    """The CTEs up to `gap` (a, b): the thread's drained gaps ending in [lo, hi) (drained_sql says which)."""
    near = f"ts_ns >= {lo - 60 * SECOND_NS} AND ts_ns < {hi + 60 * SECOND_NS}"
    return f"""
        WITH sy AS (SELECT start_ns, end_ns FROM call_spans WHERE pid = {p} AND tid = {t} AND call_class = 'sync'
                      AND end_ns > {lo} AND end_ns < {hi}),
        q AS (SELECT ts_ns FROM cuda_calls WHERE pid = {p} AND {near} AND {QUEUES}),
        ev AS (SELECT end_ns AS t, 0 AS queues, start_ns FROM sy UNION ALL SELECT ts_ns, 1, NULL FROM q),
        pv AS (SELECT start_ns, t AS end_ns,
                      min(CASE WHEN queues = 1 THEN t END) OVER (ORDER BY t DESC, queues DESC ROWS UNBOUNDED PRECEDING)
                          AS next_ns,
                      max(CASE WHEN queues = 1 THEN t END) OVER (ORDER BY t, queues ROWS UNBOUNDED PRECEDING) AS prev_ns
               FROM ev),
        pg AS (SELECT start_ns, end_ns FROM probe_gaps WHERE probes = 'launch' AND end_ns > start_ns),
        g AS (SELECT min(end_ns) AS a, least(next_ns, {hi}) AS b FROM pv
              WHERE start_ns IS NOT NULL AND next_ns IS NOT NULL AND (prev_ns IS NULL OR prev_ns < start_ns)
              GROUP BY next_ns),
        gap AS (SELECT a, b FROM g WHERE b > a
                  AND NOT EXISTS (SELECT 1 FROM pg WHERE pg.start_ns < g.b AND pg.end_ns > g.a))"""


def drained_gaps_sql(pid: int, tid: int, lo: int, hi: int) -> str:
    """The thread's drained gaps ending in [lo, hi) as intervals (a, b): what ran in them (its samples) is what kept
    the GPU from the process's next work."""
    return " ".join(f"{_gaps_cte(int(pid), int(tid), int(lo), int(hi))} SELECT a, b FROM gap".split())


def drained_sql(pid: int, tid: int, t0: int, lo: int, hi: int) -> str:
    """Per second k (from t0) and part: a thread's time in the drained gaps of [lo, hi), and each gap's whole time
    ('gap'). A gap runs from the end of one of the thread's synchronising calls (call_spans 'sync') during which the
    process queued nothing, to the process's next queuing call; gaps with no next call (the trace's end) or that
    overlap a launch probe gap (launches unseen) are left out; syncs in a row make one gap. An interval of the thread
    meets one gap at most (the thread's own sync lies between two), found by an ASOF join. Parts: sleeps outside
    CUDA calls in S (sleep_outside) and D state (io), waiting for a CPU, off-CPU unknown, inside a CUDA call that
    queues nothing (in_call)."""
    p, t, lo, hi = int(pid), int(tid), int(lo), int(hi)
    return " ".join(f"""{_gaps_cte(p, t, lo, hi)},
        iv AS (SELECT CASE sleep_state WHEN 'D' THEN 'io' ELSE 'sleep_outside' END AS part, start_ns AS a,
                      end_ns AS b
               FROM thread_sleeps WHERE pid = {p} AND tid = {t} AND inside_ns = 0 AND end_ns > {lo}
                 AND start_ns < {hi}
               UNION ALL
               SELECT CASE state WHEN 'cpu_wait' THEN 'cpu_wait' ELSE 'unknown' END, start_ns, end_ns
               FROM thread_state WHERE pid = {p} AND tid = {t} AND state IN ('cpu_wait', 'off_cpu')
                 AND end_ns > {lo} AND start_ns < {hi}
               UNION ALL
               SELECT 'in_call', start_ns, end_ns FROM call_spans WHERE pid = {p} AND tid = {t}
                 AND end_ns > {lo} AND start_ns < {hi}),
        x AS (SELECT 'gap' AS part, a, b FROM gap
              UNION ALL
              SELECT iv.part, greatest(iv.a, gap.a), least(iv.b, gap.b) FROM iv ASOF JOIN gap ON iv.b > gap.a),
        k AS (SELECT part, a, b, unnest(range((a - {int(t0)}) // {SECOND_NS},
                                              (b - 1 - {int(t0)}) // {SECOND_NS} + 1)) AS k FROM x WHERE b > a)
        SELECT k, part, sum(least(b, {int(t0)} + (k + 1) * {SECOND_NS}) - greatest(a, {int(t0)} + k * {SECOND_NS}))
                   ::BIGINT AS ns
        FROM k GROUP BY ALL ORDER BY k, part""".split())


def drained_wakers_sql(pid: int, tid: int, lo: int, hi: int, io: bool = False) -> str:
    """Who ended a thread's sleeps outside CUDA calls (in D state with `io`, else S) within its drained gaps in
    [lo, hi): per waker (its name, and its context: a task, or an interrupt landed on it), the sleep time inside the
    gaps, most first. What filled the time the GPU had nothing of the
    process queued, to set against what the window's sleeps as a whole say."""
    p, t, lo, hi = int(pid), int(tid), int(lo), int(hi)
    state = "= 'D'" if io else "<> 'D'"
    return " ".join(f"""{_gaps_cte(p, t, lo, hi)},
        s AS (SELECT start_ns AS a, end_ns AS b, waker_pid, waker_tid, waker_comm, waker_context FROM thread_sleeps
              WHERE pid = {p} AND tid = {t} AND inside_ns = 0 AND sleep_state {state} AND end_ns > {lo}
                AND start_ns < {hi})
        SELECT s.waker_pid, s.waker_tid, {latest_name_sql('s.waker_tid', 'min(s.waker_comm)')} AS waker_comm,
               s.waker_context,
               sum(least(s.b, gap.b) - greatest(s.a, gap.a))::BIGINT AS ns
        FROM s ASOF JOIN gap ON s.b > gap.a WHERE least(s.b, gap.b) > greatest(s.a, gap.a)
        GROUP BY s.waker_pid, s.waker_tid, s.waker_context ORDER BY ns DESC""".split())


def drained_parts(con: duckdb.DuckDBPyConnection, pid: int, tid: int, t0: int, lo: int,
                  hi: int) -> dict[int, dict[str, int]]:
    """drained_sql's rows as {k: {part: ns}}, with 'run_outside' (the gap's time less the other parts: running
    outside CUDA calls, nothing queued)."""
    got: dict[int, dict[str, int]] = defaultdict(dict)
    for k, part, ns in shared_rows(con, drained_sql(pid, tid, t0, lo, hi)):
        got[int(k)][str(part)] = int(ns or 0)
    for parts in got.values():
        parts["run_outside"] = max(0, parts.get("gap", 0) - sum(parts.get(p, 0) for p in GAP_PARTS))
    return dict(got)
