"""Throughput drops: stretches where a process's busiest CUDA op is called at under half its usual rate.

A heavy tail shows slow calls; a drop shows the calls that did not happen (a starved GPU feeder
spends its time outside CUDA). Per (pid, op) the calls are counted per time bucket in one scan;
the worst run of at least two consecutive buckets below half the median rate (first and last
bucket of the process excluded: start-up and shutdown) becomes a chain, tied to what the calling
thread, the host and the GPU's other users did during it. Such chains are at most MEDIUM: a drop
alone says less than a measured tail.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import duckdb

from ingero_mcp.analysis import recommend as rc
from ingero_mcp.analysis._sql import bucket_in, pid_in, rows, sql_str, state_expr, tidy, ts_in, where
from ingero_mcp.analysis.calls import CallGroup
from ingero_mcp.analysis.models import CausalChain, Evidence, TimelineEntry, TimeWindow

MIN_CALLS = 200
MIN_BUCKETS = 10
MIN_MEDIAN = 20  # calls per bucket: fewer and a halving is noise
DROP = 0.5
MIN_RUN = 2


@dataclass
class Drop:
    """The worst throughput drop of one (pid, op)."""

    pid: int
    op: str
    bucket_ns: int
    origin_ns: int  # bucket k spans [origin + k*bucket, origin + (k+1)*bucket)
    first_bucket: int  # the pid's first and last active bucket of the op
    last_bucket: int
    median: int  # calls per bucket, interior buckets, zeros included
    start_bucket: int  # the drop: buckets [start, end)
    end_bucket: int
    calls_in_drop: int
    lost_calls: int
    interior_buckets: int
    drop_buckets: int  # all buckets below the line (not only the worst run)

    @property
    def start_ns(self) -> int:
        """Start of the drop."""
        return self.origin_ns + self.start_bucket * self.bucket_ns

    @property
    def end_ns(self) -> int:
        """End of the drop (exclusive)."""
        return self.origin_ns + self.end_bucket * self.bucket_ns


def bucket_for(span_ns: int) -> int:
    """1 s buckets, wider for traces longer than 10 minutes (at most ~600 buckets)."""
    return max(1_000_000_000, span_ns // 600 + 1)


def rate_sql(window: TimeWindow | None, pids: list[int] | None, origin_ns: int, bucket_ns: int, ops: list[str] | None = None) -> str:
    """Calls per (pid, op, bucket)."""
    only = f"op IN ({', '.join(sql_str(o) for o in ops)})" if ops else ""
    return tidy(f"""
        SELECT pid, op, (ts_ns - {origin_ns}) // {bucket_ns} AS k, count(*) AS n
        FROM cuda_calls {where(ts_in(window), pid_in(pids), only)} GROUP BY ALL
    """)


def median_one(d: Drop, window: TimeWindow | None) -> str:
    """The usual rate: median calls per interior bucket (empty buckets count as 0)."""
    return tidy(f"""
        WITH b AS (SELECT (ts_ns - {d.origin_ns}) // {d.bucket_ns} AS k, count(*) AS n FROM cuda_calls
                   {where(f"pid = {d.pid}", f"op = {sql_str(d.op)}", ts_in(window))} GROUP BY k)
        SELECT quantile_disc(coalesce(b.n, 0), 0.5) FROM range({d.first_bucket + 1}, {d.last_bucket}) r(k) LEFT JOIN b USING (k)
    """)


def calls_in_one(d: Drop) -> str:
    """Calls of the op by the pid during the drop."""
    return tidy(f"SELECT count(*) FROM cuda_calls WHERE pid = {d.pid} AND op = {sql_str(d.op)} "
                f"AND ts_ns >= {d.start_ns} AND ts_ns < {d.end_ns}")


def _disc_median(values: list[int]) -> int:
    s = sorted(values)
    return s[max(0, math.ceil(len(s) * 0.5) - 1)]


def find_drops(con: duckdb.DuckDBPyConnection, window: TimeWindow | None, origin_ns: int, span_ns: int,
               busiest: dict[int, tuple[int, str]], skip_ops: set[str]) -> list[Drop]:
    """The worst drop of each pid's busiest op (`busiest`: pid -> (calls, op), already only the pids asked for),
    skipping ops that have a chain."""
    wanted = {pid: op for pid, (total, op) in busiest.items() if total >= MIN_CALLS and op not in skip_ops}
    if not wanted:
        return []
    bucket = bucket_for(span_ns)
    counts: dict[tuple[int, str], dict[int, int]] = {}
    for pid, op, k, n in rows(con, rate_sql(window, sorted(wanted), origin_ns, bucket, sorted(set(wanted.values())))):
        if wanted.get(int(pid)) == op:
            counts.setdefault((int(pid), op), {})[int(k)] = int(n)
    out: list[Drop] = []
    for (pid, op), per in sorted(counts.items()):
        lo, hi = min(per), max(per)
        interior = list(range(lo + 1, hi))
        if len(interior) < MIN_BUCKETS:
            continue
        series = [per.get(k, 0) for k in interior]
        med = _disc_median(series)
        if med < MIN_MEDIAN:
            continue
        low = [n < DROP * med for n in series]
        best: tuple[int, int, int] | None = None  # (lost, start index, end index)
        i = 0
        while i < len(series):
            if not low[i]:
                i += 1
                continue
            j = i
            while j < len(series) and low[j]:
                j += 1
            if j - i >= MIN_RUN:
                lost = sum(med - n for n in series[i:j])
                if best is None or lost > best[0]:
                    best = (lost, i, j)
            i = j
        if best is None:
            continue
        lost, i, j = best
        out.append(Drop(pid=pid, op=op, bucket_ns=bucket, origin_ns=origin_ns, first_bucket=lo, last_bucket=hi,
                        median=med, start_bucket=interior[i], end_bucket=interior[j - 1] + 1,
                        calls_in_drop=sum(series[i:j]), lost_calls=lost, interior_buckets=len(series),
                        drop_buckets=sum(low)))
    return out


def thread_state_sql(d: Drop, tid: int) -> str:
    """Off-CPU time of the calling thread during the drop, by state (scheduler rows clipped to the drop)."""
    return tidy(f"""
        SELECT {state_expr()}, sum(least(coalesce(on_ns, {d.end_ns}), {d.end_ns}) - greatest(off_ns, {d.start_ns}))
        FROM sched_intervals WHERE pid = {d.pid} AND tid = {int(tid)}
          AND off_ns < {d.end_ns} AND coalesce(on_ns, {d.end_ns}) > {d.start_ns}
        GROUP BY ALL
    """)


def thread_state_one(d: Drop, tid: int, state: str) -> str:
    """One state's off-CPU ns of the calling thread during the drop."""
    return tidy(f"""
        SELECT coalesce(sum(least(coalesce(on_ns, {d.end_ns}), {d.end_ns}) - greatest(off_ns, {d.start_ns})), 0)
        FROM sched_intervals WHERE pid = {d.pid} AND tid = {int(tid)} AND {state_expr()} = {sql_str(state)}
          AND off_ns < {d.end_ns} AND coalesce(on_ns, {d.end_ns}) > {d.start_ns}
    """)


def in_calls_sql(d: Drop) -> str:
    """The pid's time inside CUDA calls during the drop, per op, with the calls' own attribution."""
    return tidy(f"""
        SELECT op, tid, count(*), sum(duration_ns), sum(cpu_wait_ns), sum(sleep_ns), count(cpu_wait_ns)
        FROM cuda_calls WHERE pid = {d.pid} AND ts_ns >= {d.start_ns} AND ts_ns < {d.end_ns}
        GROUP BY ALL ORDER BY 4 DESC
    """)


def others_sql(d: Drop, window: TimeWindow | None) -> str:
    """Other processes' CUDA calls during the drop and over the whole window (rate comparison)."""
    return tidy(f"""
        SELECT pid, count(*) FILTER (WHERE ts_ns >= {d.start_ns} AND ts_ns < {d.end_ns}) AS during, count(*) AS overall
        FROM cuda_calls {where(f"pid <> {d.pid}", ts_in(window))} GROUP BY pid
    """)


def others_one(d: Drop, pid: int) -> str:
    """One other process's CUDA calls during the drop."""
    return tidy(f"SELECT count(*) FROM cuda_calls WHERE pid = {int(pid)} AND ts_ns >= {d.start_ns} AND ts_ns < {d.end_ns}")


def host_sql(d: Drop, window: TimeWindow | None) -> str:
    """sched_switch per pid in the aggregate buckets overlapping the drop, and over the window."""
    drop = TimeWindow(start_ns=d.start_ns, end_ns=d.end_ns - 1)
    return tidy(f"""
        WITH agg AS (SELECT * FROM host_aggregates {where("op = 'sched_switch'", bucket_in(window))}),
        hit AS (SELECT DISTINCT bucket_start_ns, bucket_ns FROM agg {where(bucket_in(drop))}),
        spans AS (SELECT (SELECT sum(bucket_ns) FROM hit) AS hit_ns,
                         (SELECT sum(bucket_ns) FROM (SELECT DISTINCT bucket_start_ns, bucket_ns FROM agg)) AS all_ns)
        SELECT agg.pid, max(agg.comm), sum(agg.count) FILTER (WHERE agg.bucket_start_ns IN (SELECT bucket_start_ns FROM hit)),
               sum(agg.count), any_value(spans.hit_ns), any_value(spans.all_ns)
        FROM agg CROSS JOIN spans GROUP BY agg.pid
    """)


def snapshot_sql(d: Drop, window: TimeWindow | None) -> str:
    """Mean CPU and GPU utilisation during the drop and over the window."""
    return tidy(f"""
        SELECT round(avg(cpu_percent) FILTER (WHERE ts_ns >= {d.start_ns} AND ts_ns < {d.end_ns}), 1),
               round(avg(gpu_util_percent) FILTER (WHERE ts_ns >= {d.start_ns} AND ts_ns < {d.end_ns}), 1),
               round(avg(cpu_percent), 1), round(avg(gpu_util_percent), 1)
        FROM snapshots {where(ts_in(window))}
    """)


def _pct(part: float, whole: float) -> float:
    return round(100.0 * part / whole, 1) if whole else 0.0


def drop_chain(con: duckdb.DuckDBPyConnection, d: Drop, window: TimeWindow | None, span_ns: int,
               names: dict[int, str], group: CallGroup | None, cpus: int | None = None) -> CausalChain:
    """The chain of one throughput drop: what the calling thread, the host and the GPU's other users did then;
    `group` is the op's per-op statistics over the window (its numbers go on the chain), when known."""
    wall = d.end_ns - d.start_ns
    secs = d.bucket_ns / 1e9
    per_tid: dict[int, list] = {}
    in_ops: dict[str, int] = {}
    for op, tid, n, dur, pre, blk, attributed in rows(con, in_calls_sql(d)):
        t = per_tid.setdefault(int(tid), [0, 0, 0, 0, 0])
        t[0] += int(n)
        t[1] += int(dur or 0)
        t[2] += int(pre or 0)
        t[3] += int(blk or 0)
        t[4] += int(attributed)
        in_ops[op] = in_ops.get(op, 0) + int(dur or 0)
    tid = max(per_tid, key=lambda k: per_tid[k][0]) if per_tid else d.pid
    state = {s: int(ns or 0) for s, ns in rows(con, thread_state_sql(d, tid))}
    source = "scheduler rows"
    if not state and per_tid.get(tid, [0] * 5)[4]:
        state = {"preempted": per_tid[tid][2], "blocked": per_tid[tid][3]}
        source = "attribution of the calls made then"
    pre, blk = state.get("preempted", 0), state.get("blocked", 0)
    in_calls = per_tid.get(tid, [0, 0])[1]
    top_op = max(in_ops, key=in_ops.get) if in_ops else d.op
    others = []
    for pid, during, overall in rows(con, others_sql(d, window)):
        rate_then = during / (wall / 1e9) if wall else 0.0
        rate_all = overall / (span_ns / 1e9) if span_ns else 0.0
        if during and rate_then >= 2 * rate_all:
            others.append((int(pid), int(during), rate_then, rate_all))
    busy = []
    for pid, comm, during, overall, hit_ns, all_ns in rows(con, host_sql(d, window)):
        if pid == d.pid or not during or not hit_ns or not all_ns:
            continue
        r_then, r_all = during / (hit_ns / 1e9), overall / (all_ns / 1e9)
        if r_then >= 1.5 * r_all and r_then >= 100:
            busy.append((int(pid), comm or names.get(int(pid), "?"), int(during), r_then, r_all))
    busy.sort(key=lambda x: -x[3])
    cpu_then, gpu_then, cpu_all, gpu_all = rows(con, snapshot_sql(d, window))[0]
    who = f"{names.get(d.pid, '?')}[{d.pid}]"
    rate_in = d.calls_in_drop / (wall / 1e9)
    head = (f"{d.op} rate in {who} fell to {rate_in:,.0f}/s from a usual {d.median / secs:,.0f}/s for "
            f"{wall / 1e9:,.0f} s ({d.lost_calls:,} calls fewer)")
    because: list[str] = []
    if pre >= 0.25 * wall:
        cause, title = rc.CPU_CONTENTION, "CPU contention: the calling thread was preempted"
        because.append(f"thread {tid} was preempted {_pct(pre, wall)}% of the drop ({source})")
        if busy:
            because.append("busier than usual then: " + ", ".join(f"{c}[{p}] {r:,.0f} switches/s vs {a:,.0f}/s" for p, c, _, r, a in busy[:3]))
    elif others and (blk >= 0.3 * wall or in_calls >= 0.5 * wall):
        cause, title = rc.GPU_SHARED, "the GPU is shared with another process"
        because.append(f"thread {tid} spent {_pct(in_calls, wall)}% of the drop inside CUDA calls (mostly {top_op})")
        because.append("another process used the GPU more than usual then: " + ", ".join(
            f"{names.get(p, '?')}[{p}] {r:,.0f} calls/s vs {a:,.0f}/s" for p, _, r, a in others[:3]))
    elif blk >= 0.5 * wall or in_calls >= 0.5 * wall:
        cause, title = rc.BLOCKED, "blocked: the thread waits (GPU, lock or IO)"
        because.append(f"thread {tid} slept {_pct(blk, wall)}% of the drop ({source}) and spent {_pct(in_calls, wall)}% "
                       f"inside CUDA calls (mostly {top_op})")
    else:
        cause, title = rc.UNEXPLAINED, "not explained by host evidence"
        because.append(f"thread {tid} was preempted {_pct(pre, wall)}%, blocked {_pct(blk, wall)}% and inside CUDA calls "
                       f"{_pct(in_calls, wall)}% of the drop: it was mostly running host code outside CUDA")
    if cpu_then is not None:
        because.append(f"CPU {cpu_then}% during the drop vs {cpu_all}% over the window"
                       + (f"; GPU {gpu_then}% vs {gpu_all}%" if gpu_then is not None else ""))
    share = d.drop_buckets / d.interior_buckets if d.interior_buckets else 0.0
    severity = "MEDIUM" if cause != rc.UNEXPLAINED and share >= 0.05 else "LOW"
    evidence = [
        Evidence(name="usual_calls_per_bucket", value=d.median, unit=f"calls per {secs:g} s (median)", sql=median_one(d, window)),
        Evidence(name="calls_during_drop", value=d.calls_in_drop, unit=f"calls in {wall / 1e9:g} s", sql=calls_in_one(d)),
    ]
    for st in ("preempted", "blocked"):
        if source == "scheduler rows" and st in state:
            evidence.append(Evidence(name=f"thread_{st}_during_drop", value=state[st], unit="ns", sql=thread_state_one(d, tid, st)))
    for p, during, _, _ in others[:3]:
        evidence.append(Evidence(name=f"cuda_calls {names.get(p, '?')}[{p}] during drop", value=during, sql=others_one(d, p)))
    timeline = [
        TimelineEntry(ts_ns=d.start_ns, pid=d.pid, tid=tid, kind="cuda", description=f"{d.op} rate falls below half its usual rate"),
        TimelineEntry(ts_ns=d.end_ns, pid=d.pid, tid=tid, kind="cuda", description=f"{d.op} rate back above half its usual rate"),
    ]
    for ts, event, pid, child, comm in rows(
        con, f"SELECT ts_ns, event, pid, child_pid, comm FROM process_events WHERE ts_ns >= {d.start_ns - d.bucket_ns} "
             f"AND ts_ns < {d.end_ns} ORDER BY ts_ns LIMIT 5"):
        subject = child if event == "fork" else pid
        timeline.append(TimelineEntry(ts_ns=int(ts), pid=int(pid), kind="process",
                                      description=f"{event} {names.get(subject, comm or '?')}[{subject}]"))
    timeline.sort(key=lambda e: e.ts_ns)
    numbers = {**rc.drop_words(), "op": d.op, "preempted_pct": _pct(pre, wall), "blocked_pct": _pct(blk, wall), "off_cpu_pct": _pct(pre + blk, wall),
               "competitors": ", ".join(f"{c}[{p}]" for p, c, *_ in busy[:3]) or "other tasks", "cpus": cpus or "?",
               "cpu_at_slow": cpu_then, "cpu_mean": cpu_all, "gpu_at_slow": gpu_then, "gpu_mean": gpu_all,
               "others": ", ".join(f"{names.get(p, '?')}[{p}]" for p, *_ in others[:3]) or "none",
               "first_slow": d.start_ns}
    g = group
    return CausalChain(
        id=f"ingero-mcp:{d.op}:throughput:{d.pid}", op=d.op, severity=severity,
        summary=f"{head} <- " + " <- ".join(because[:2]),
        root_cause=f"{cause}: {title}",
        explanation=f"Throughput drop: {head}. Root cause: {title}, because " + "; ".join(because) + ".",
        count=None if g is None else g.count, p50_ns=None if g is None else g.p50_ns,
        p99_ns=None if g is None else g.p99_ns, max_ns=None if g is None else g.max_ns,
        tail_ratio=round(g.p99_ns / g.p50_ns, 1) if g is not None and g.p50_ns else None,
        pids=[d.pid], evidence=evidence, recommendations=rc.recommend(cause, numbers), timeline=timeline,
    )
