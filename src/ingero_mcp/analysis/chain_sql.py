"""The SQL of the chain engine: slow calls of an op and what surrounded them, batched over every candidate op.

Batch queries (one per kind of evidence, all candidate ops at once) keep the scans of cuda_calls
few. Each piece of evidence also gets a stand-alone query for one op (`*_one`) whose first column
of its first row is the number shown: that is the `Evidence.sql` a reader can re-run.
"""

from __future__ import annotations

from ingero_mcp.analysis._sql import bucket_in, pid_in, sql_str, state_expr, tidy, ts_in, where
from ingero_mcp.analysis.models import TimeWindow

TOP_K = 200  # slow calls per op examined one by one (the longest ones)
FIRST_M = 500  # earliest calls per (pid, op) kept to tell whether a slow call was among the first


def thresholds(th: dict[str, int]) -> str:
    """A VALUES table of (op, threshold_ns)."""
    return ", ".join(f"({sql_str(op)}, {int(v)})" for op, v in sorted(th.items()))


def slow_cte(th: dict[str, int], window: TimeWindow | None, pids: list[int] | None) -> str:
    """CTEs `th` (op, thr) and `slow` (every call of those ops at or above its op's threshold)."""
    return f"""th(op, thr) AS (VALUES {thresholds(th)}),
        slow AS (SELECT c.* FROM cuda_calls c JOIN th ON c.op = th.op
                 {where("c.duration_ns >= th.thr", ts_in(window, "c.ts_ns"), pid_in(pids, "c.pid"))})"""


def top_cte(k: int = TOP_K) -> str:
    """CTE `top`: the k longest slow calls of each op (ties: earliest first)."""
    return f"top AS (SELECT * FROM slow QUALIFY row_number() OVER (PARTITION BY op ORDER BY duration_ns DESC, ts_ns) <= {k})"


def summary_sql(th: dict[str, int], window: TimeWindow | None, pids: list[int] | None) -> str:
    """Per op: what the slow calls' threads went through (attribution sums), their bytes, and the host then."""
    return tidy(f"""
        WITH {slow_cte(th, window, pids)}
        SELECT s.op, count(*), sum(s.duration_ns), sum(s.bytes), count(s.off_cpu_ns), sum(s.off_cpu_ns),
               sum(s.cpu_wait_ns), sum(s.sleep_ns), sum(s.context_switches), sum(s.page_allocs),
               list(DISTINCT s.pid ORDER BY s.pid), count(DISTINCT s.tid), count(snap.ts_ns),
               avg(snap.cpu_percent), max(snap.cpu_percent), avg(snap.gpu_util_percent), min(s.ts_ns), max(s.ts_ns)
        FROM slow s ASOF LEFT JOIN snapshots snap ON s.ts_ns >= snap.ts_ns
        GROUP BY s.op
    """)


def top_sql(th: dict[str, int], window: TimeWindow | None, pids: list[int] | None) -> str:
    """The TOP_K longest slow calls of each op, one row each."""
    return tidy(f"""
        WITH {slow_cte(th, window, pids)}, {top_cte()}
        SELECT top.op, top.ts_ns, top.duration_ns, top.pid, top.tid, top.off_cpu_ns, top.cpu_wait_ns, top.sleep_ns,
               top.context_switches, top.page_allocs, top.bytes, top.memcpy_kind, snap.cpu_percent, snap.gpu_util_percent
        FROM top ASOF LEFT JOIN snapshots snap ON top.ts_ns >= snap.ts_ns
        ORDER BY top.op, top.duration_ns DESC, top.ts_ns
    """)


def inside_call_sql(pid: int, tid: int, ts_ns: int, end_ns: int, limit: int = 5) -> str:
    """The longest scheduler intervals of a thread inside one call."""
    return tidy(f"""
        SELECT off_ns, coalesce(off_cpu_ns, on_ns - off_ns), {state_expr()}, preemptor_pid, preemptor_comm
        FROM sched_intervals WHERE pid = {int(pid)} AND tid = {int(tid)} AND off_ns >= {int(ts_ns)} AND off_ns < {int(end_ns)}
        ORDER BY 2 DESC NULLS LAST LIMIT {int(limit)}
    """)


def first_calls_sql(ops: list[str], pids: list[int] | None) -> str:
    """The FIRST_M earliest call timestamps of each (pid, op), over the whole trace (a cold start is absolute)."""
    only = f"op IN ({', '.join(sql_str(o) for o in ops)})"
    return tidy(f"SELECT pid, op, min(ts_ns, {FIRST_M}) FROM cuda_calls {where(only, pid_in(pids))} GROUP BY pid, op")


def calls_before_one(pid: int, op: str, ts_ns: int) -> str:
    """How many calls of `op` the process made before the one at ts_ns."""
    return tidy(f"SELECT count(*) FROM cuda_calls WHERE pid = {int(pid)} AND op = {sql_str(op)} AND ts_ns < {int(ts_ns)}")


def _values_top(top: list[tuple]) -> str:
    return ", ".join(f"({sql_str(op)}, {int(pid)}, {int(tid)}, {int(ts)}, {int(ts + dur)})" for op, ts, dur, pid, tid in top)


def _bucket_ns(top: list[tuple]) -> int:
    longest = max((dur for _, _, dur, _, _ in top), default=0)
    return max(1_000_000, longest // 64 + 1)


def sched_overlap_sql(top: list[tuple]) -> str:
    """Scheduler intervals of the calling thread inside each top slow call, by state and by preemptor.

    A thread is on CPU when it enters a call, so every interval that overlaps the call starts inside
    it; intervals and calls are matched through the time buckets the call spans.
    """
    b = _bucket_ns(top)
    return tidy(f"""
        WITH v(op, pid, tid, ts_ns, end_ns) AS (VALUES {_values_top(top)}),
        cover AS (SELECT v.*, unnest(range(ts_ns // {b}, end_ns // {b} + 1)) AS b FROM v)
        SELECT cover.op, {state_expr('i.prev_state')}, i.preemptor_pid, any_value(i.preemptor_comm), count(*),
               sum(least(cover.end_ns, coalesce(i.on_ns, cover.end_ns)) - i.off_ns) AS overlap_ns,
               count(DISTINCT cover.ts_ns)
        FROM cover JOIN sched_intervals i
          ON i.pid = cover.pid AND i.tid = cover.tid AND i.off_ns // {b} = cover.b
        WHERE i.off_ns >= cover.ts_ns AND i.off_ns < cover.end_ns
        GROUP BY ALL
    """)


def sched_overlap_one(op: str, state: str | None, th: dict[str, int], window: TimeWindow | None,
                      pids: list[int] | None, preemptor: int | None = None) -> str:
    """Off-CPU ns of the calling threads inside the op's TOP_K slow calls (one state / one preemptor)."""
    cond = [f"{state_expr('i.prev_state')} = {sql_str(state)}" if state else "", f"i.preemptor_pid = {int(preemptor)}" if preemptor is not None else ""]
    return tidy(f"""
        WITH {slow_cte({op: th[op]}, window, pids)}, {top_cte()}
        SELECT coalesce(sum(least(top.ts_ns + top.duration_ns, coalesce(i.on_ns, top.ts_ns + top.duration_ns)) - i.off_ns), 0)
        FROM top JOIN sched_intervals i ON i.pid = top.pid AND i.tid = top.tid
         AND i.off_ns >= top.ts_ns AND i.off_ns < top.ts_ns + top.duration_ns
        {where(*cond)}
    """)


def top_sum_one(op: str, column: str, th: dict[str, int], window: TimeWindow | None, pids: list[int] | None) -> str:
    """sum(column) over the op's TOP_K slow calls."""
    return tidy(f"WITH {slow_cte({op: th[op]}, window, pids)}, {top_cte()} SELECT sum({column}) FROM top")


def competitors_sql(top: list[tuple], window: TimeWindow | None) -> str:
    """Host events (sched_switch, mm_page_alloc) per pid in the aggregate buckets holding the top slow calls,
    with the same pid's events over every bucket of the window for comparison."""
    return tidy(f"""
        WITH v(op, pid, tid, ts_ns, end_ns) AS (VALUES {_values_top(top)}),
        agg AS (SELECT * FROM host_aggregates {where("op IN ('sched_switch', 'mm_page_alloc')", bucket_in(window))}),
        buckets AS (SELECT DISTINCT bucket_start_ns, bucket_ns FROM agg),
        hit AS (SELECT DISTINCT v.op AS chain_op, b.bucket_start_ns, b.bucket_ns FROM v JOIN buckets b
                ON v.ts_ns >= b.bucket_start_ns AND v.ts_ns < b.bucket_start_ns + b.bucket_ns),
        hit_ns AS (SELECT chain_op, sum(bucket_ns) AS span_ns FROM hit GROUP BY chain_op),
        during AS (SELECT hit.chain_op, agg.op, agg.pid, max(agg.comm) AS comm, sum(agg.count) AS events
                   FROM hit JOIN agg ON agg.bucket_start_ns = hit.bucket_start_ns GROUP BY ALL),
        overall AS (SELECT op, pid, sum(count) AS events FROM agg GROUP BY ALL),
        all_ns AS (SELECT sum(bucket_ns) AS span_ns FROM buckets)
        SELECT during.chain_op, during.op, during.pid, during.comm, during.events, hit_ns.span_ns,
               overall.events, all_ns.span_ns
        FROM during JOIN hit_ns USING (chain_op) JOIN overall ON overall.op = during.op AND overall.pid = during.pid
        CROSS JOIN all_ns
    """)


def competitor_one(op: str, pid: int, event: str, th: dict[str, int], window: TimeWindow | None,
                   pids: list[int] | None) -> str:
    """Events of one pid in the aggregate buckets holding the op's TOP_K slow calls."""
    return tidy(f"""
        WITH {slow_cte({op: th[op]}, window, pids)}, {top_cte()},
        agg AS (SELECT * FROM host_aggregates {where(f"op = {sql_str(event)}", bucket_in(window))}),
        hit AS (SELECT DISTINCT b.bucket_start_ns FROM top JOIN (SELECT DISTINCT bucket_start_ns, bucket_ns FROM agg) b
                ON top.ts_ns >= b.bucket_start_ns AND top.ts_ns < b.bucket_start_ns + b.bucket_ns)
        SELECT sum(count) FROM agg JOIN hit USING (bucket_start_ns) WHERE pid = {int(pid)}
    """)


def gpu_others_sql(top: list[tuple]) -> str:
    """CUDA calls of other processes starting inside each top slow call (another process on the same GPU):
    per (op, other pid) its calls, and per op (pid NULL) how many top calls had any."""
    b = _bucket_ns(top)
    return tidy(f"""
        WITH v(op, pid, tid, ts_ns, end_ns) AS (VALUES {_values_top(top)}),
        cover AS (SELECT v.*, unnest(range(ts_ns // {b}, end_ns // {b} + 1)) AS b FROM v),
        inside AS (SELECT cover.op, cover.pid AS caller, cover.tid AS caller_tid, cover.ts_ns AS call_ts,
                          c.pid, c.duration_ns
                   FROM cover JOIN cuda_calls c ON c.ts_ns // {b} = cover.b AND c.pid <> cover.pid
                   WHERE c.ts_ns >= cover.ts_ns AND c.ts_ns < cover.end_ns)
        SELECT op, pid, count(*), count(DISTINCT (caller, caller_tid, call_ts)), sum(duration_ns)
        FROM inside GROUP BY GROUPING SETS ((op, pid), (op))
    """)


def gpu_others_one(op: str, th: dict[str, int], window: TimeWindow | None, pids: list[int] | None) -> str:
    """How many of the op's TOP_K slow calls had another process's CUDA call start inside them."""
    return tidy(f"""
        WITH {slow_cte({op: th[op]}, window, pids)}, {top_cte()}
        SELECT count(*) FROM top WHERE EXISTS (SELECT 1 FROM cuda_calls c WHERE c.pid <> top.pid
               AND c.ts_ns >= top.ts_ns AND c.ts_ns < top.ts_ns + top.duration_ns)
    """)


def slow_one(op: str, expr: str, th: dict[str, int], window: TimeWindow | None, pids: list[int] | None,
             snapshots: bool = False) -> str:
    """One aggregate over all the op's slow calls (optionally with the snapshot at each call as `snap`)."""
    join = " ASOF LEFT JOIN snapshots snap ON s.ts_ns >= snap.ts_ns" if snapshots else ""
    return tidy(f"WITH {slow_cte({op: th[op]}, window, pids)} SELECT {expr} FROM slow s{join}")


def op_one(op: str, expr: str, window: TimeWindow | None, pids: list[int] | None) -> str:
    """One aggregate over every call of the op in the window."""
    return tidy(f"SELECT {expr} FROM cuda_calls {where(f'op = {sql_str(op)}', ts_in(window), pid_in(pids))}")


CROSS_MIN_NS = 1_000_000  # other-thread calls shorter than this cannot explain a long wait


def cross_thread_sql(top: list[tuple]) -> str:
    """CUDA calls of the same process on other threads in flight during each top slow call: per (op, other tid,
    other op) how many top calls they overlapped and for how long (a driver lock held by another thread)."""
    return tidy(f"""
        WITH v(op, pid, tid, ts_ns, end_ns) AS (VALUES {_values_top(top)}),
        other AS (SELECT pid, tid, op, ts_ns, ts_ns + duration_ns AS end_ns FROM cuda_calls
                  WHERE duration_ns >= {CROSS_MIN_NS} AND pid IN (SELECT DISTINCT pid FROM v))
        SELECT v.op, other.tid, other.op, count(DISTINCT (v.tid, v.ts_ns)),
               sum(least(v.end_ns, other.end_ns) - greatest(v.ts_ns, other.ts_ns)), min(other.ts_ns)
        FROM v JOIN other ON other.pid = v.pid AND other.tid <> v.tid AND other.ts_ns < v.end_ns AND other.end_ns > v.ts_ns
        GROUP BY ALL ORDER BY 5 DESC, 3
    """)


def cross_thread_one(op: str, tid: int, other_op: str, th: dict[str, int], window: TimeWindow | None,
                     pids: list[int] | None) -> str:
    """ns during which the op's TOP_K slow calls overlapped `other_op` calls (>= CROSS_MIN_NS) on thread `tid`."""
    return tidy(f"""
        WITH {slow_cte({op: th[op]}, window, pids)}, {top_cte()}
        SELECT coalesce(sum(least(top.ts_ns + top.duration_ns, c.ts_ns + c.duration_ns) - greatest(top.ts_ns, c.ts_ns)), 0)
        FROM top JOIN cuda_calls c ON c.pid = top.pid AND c.tid = {int(tid)} AND c.tid <> top.tid AND c.op = {sql_str(other_op)}
         AND c.duration_ns >= {CROSS_MIN_NS} AND c.ts_ns < top.ts_ns + top.duration_ns AND c.ts_ns + c.duration_ns > top.ts_ns
    """)


def copy_bandwidth_sql(th: dict[str, int], window: TimeWindow | None, pids: list[int] | None) -> str:
    """Per memcpy op: bytes and time of its calls at or above the threshold (its median), whose bandwidth an
    op-wide figure hides when fast (pinned, asynchronous) copies of the same op are mixed in."""
    return tidy(f"WITH {slow_cte(th, window, pids)} SELECT op, sum(bytes), sum(duration_ns), count(*) FROM slow "
                f"WHERE bytes IS NOT NULL GROUP BY op")


QUEUED_GAP_NS = 1_000_000  # a copy that returned at most this long before a sync started was queued just before it


def queued_copy_sql(top: list[tuple]) -> str:
    """For each top slow call, the last copy (with bytes) the same thread made before it: a sync that waits for an
    asynchronous copy queued just before it is the copy's own time on the GPU."""
    return tidy(f"""
        WITH v(op, pid, tid, ts_ns, end_ns) AS (VALUES {_values_top(top)}),
        m AS (SELECT pid, tid, op, ts_ns, duration_ns, bytes, memcpy_kind FROM cuda_calls
              WHERE contains(op, 'emcpy') AND bytes IS NOT NULL AND pid IN (SELECT DISTINCT pid FROM v))
        SELECT v.op, v.ts_ns, v.end_ns - v.ts_ns, m.op, m.ts_ns, m.duration_ns, m.bytes, m.memcpy_kind
        FROM v ASOF JOIN m ON m.pid = v.pid AND m.tid = v.tid AND m.ts_ns < v.ts_ns
        WHERE m.ts_ns + m.duration_ns >= v.ts_ns - {QUEUED_GAP_NS}
    """)


def queued_copy_one(op: str, th: dict[str, int], window: TimeWindow | None, pids: list[int] | None) -> str:
    """Bytes of the copy queued just before the op's slowest slow call (same thread)."""
    return tidy(f"""
        WITH {slow_cte({op: th[op]}, window, pids)}, {top_cte()},
        pick AS (SELECT * FROM top ORDER BY duration_ns DESC, ts_ns LIMIT 1),
        m AS (SELECT pid, tid, ts_ns, duration_ns, bytes FROM cuda_calls WHERE contains(op, 'emcpy') AND bytes IS NOT NULL)
        SELECT m.bytes FROM pick ASOF JOIN m ON m.pid = pick.pid AND m.tid = pick.tid AND m.ts_ns < pick.ts_ns
        WHERE m.ts_ns + m.duration_ns >= pick.ts_ns - {QUEUED_GAP_NS}
    """)
