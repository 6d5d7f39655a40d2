"""Time accounting of an import (an Ingero trace): per thread, from its scheduler rows where they are complete.

Ingero stores a sample of its events as rows and counts every event it received per minute (host_aggregates). Its
scheduler rows are one per switch back onto a CPU of a thread it watches: `pid` = `tid` = the thread, `off_cpu_ns`
the time it was off the CPU before (sleeping or waiting for a CPU: the split is not recorded). A thread's rows are
complete when they hold every switch Ingero counted for it in the minutes overlapping the window; the off-CPU time
of the few it counted but did not store is known from the counted sums, and bounds what is unknown. Between two
rows the thread ran, so the rows of a complete thread split its time into on-CPU and off-CPU, except where no
switch is recorded for IMPORT_GAP_NS or more: a thread that runs that long without one switch is not believed (a
busy host preempts it; Ingero does not count the events its ring buffer drops), so such a stretch is unknown.

Its CUDA calls are a sample too: the time inside them is unknown per second; over the minutes of the window the
counted sums of both API layers bound it from above. The feeding thread (the thread of a process with CUDA calls
that made them, its main thread where it has calls) is named; imported_verdict.py makes the chain of ours.
"""

from __future__ import annotations

from typing import Any

import duckdb

from ingero_mcp.analysis._sql import bucket_in, pid_in, rows, tidy, where
from ingero_mcp.analysis.models import ImportedAccounting, ImportedSecond, ImportedThread, TimeWindow

SECOND_NS = 1_000_000_000
IMPORT_GAP_NS = 2 * SECOND_NS  # a stretch this long without a switch row is unknown, not on-CPU
MAX_MISSING_SHARE = 0.01  # counted-but-not-stored off-CPU time above this share of the accounted time: a sample
BUSY_SECOND_OFF = 0.05  # seconds off-CPU this share or more are counted
FULL_SECOND_NS = SECOND_NS // 2  # seconds with less accounted time than this are not judged alone
MAX_THREADS = 64  # threads examined (feeders and those with rows first)
IMPORT_SOURCE = "ingero-import"  # sessions.source of an Ingero import (importers/ingero.py)
_IMPORTED = f"session_id IN (SELECT session_id FROM sessions WHERE source = '{IMPORT_SOURCE}')"


def applies(con: duckdb.DuckDBPyConnection) -> bool:
    """Whether the store holds an Ingero import (its host_aggregates 'sched_switch' sums are off-CPU time)."""
    return bool(rows(con, f"SELECT 1 FROM sessions WHERE source = '{IMPORT_SOURCE}' LIMIT 1"))


def segments_cte(session_id: int, pid: int, tid: int) -> str:
    """CTEs `r` (the thread's rows) and `seg`: per row, the accounted stretch [from_ns, on_ns] (the run since the
    previous switch-in, then the off-CPU interval) and its off-CPU part [off_ns, on_ns]; a run of IMPORT_GAP_NS or
    more without a switch is left out (gap_from .. off_ns: unknown). Overlapping rows are clamped to the previous
    switch-in."""
    off = "least(on_ns, greatest(off_ns, coalesce(prev_on, off_ns)))"
    return (f"r AS (SELECT off_ns, on_ns, preemptor_pid, lag(on_ns) OVER (ORDER BY on_ns, off_ns) AS prev_on "
            f"FROM sched_intervals WHERE session_id = {int(session_id)} AND pid = {int(pid)} AND tid = {int(tid)} "
            "AND on_ns IS NOT NULL AND off_ns IS NOT NULL), "
            f"seg AS (SELECT on_ns, preemptor_pid, {off} AS off_ns, "
            f"CASE WHEN prev_on IS NOT NULL AND off_ns - prev_on < {IMPORT_GAP_NS} THEN least(prev_on, on_ns) "
            f"ELSE {off} END AS from_ns, "
            f"CASE WHEN prev_on IS NOT NULL AND off_ns - prev_on >= {IMPORT_GAP_NS} THEN prev_on END AS gap_from "
            "FROM r)")


def thread_sql(session_id: int, pid: int, tid: int, window: TimeWindow) -> str:
    """One row for a thread over the window: its rows' accounting (accounted, off-CPU, unknown, switches, span) and
    their completeness against Ingero's per-minute counts (counted, stored, missing and their off-CPU time, minutes
    with more rows than counts, rows in no counted minute), with the shares the report shows."""
    a, b = int(window.start_ns), int(window.end_ns)
    s, p, t = int(session_id), int(pid), int(tid)
    counted = where(f"session_id = {s}", f"pid = {t}", "op = 'sched_switch'", bucket_in(window))
    return tidy(f"""
        WITH {segments_cte(s, p, t)},
        acc AS (SELECT coalesce(sum(greatest(0, least(on_ns, {b}) - greatest(from_ns, {a}))), 0) AS accounted_ns,
                       coalesce(sum(greatest(0, least(on_ns, {b}) - greatest(off_ns, {a}))), 0) AS off_ns,
                       count(*) FILTER (WHERE on_ns BETWEEN {a} AND {b}) AS switches,
                       coalesce(sum(greatest(0, least(off_ns, {b}) - greatest(gap_from, {a})))
                                FILTER (WHERE gap_from IS NOT NULL), 0) AS unknown_ns,
                       greatest(min(coalesce(gap_from, from_ns)), {a}) AS span_from, least(max(on_ns), {b}) AS span_to
                FROM seg WHERE on_ns >= {a} AND coalesce(gap_from, from_ns) <= {b}),
        bk AS (SELECT bucket_start_ns AS b0, bucket_start_ns + bucket_ns AS b1, sum(count) AS counted,
                      sum(sum_duration_ns) AS counted_ns
               FROM host_aggregates {counted} GROUP BY ALL),
        m AS (SELECT bk.b0, any_value(bk.counted) AS counted, any_value(bk.counted_ns) AS counted_ns,
                     count(x.on_ns) AS n, coalesce(sum(x.off_cpu_ns), 0) AS n_ns
              FROM bk LEFT JOIN sched_intervals x ON x.session_id = {s} AND x.pid = {p} AND x.tid = {t}
                   AND x.on_ns >= bk.b0 AND x.on_ns < bk.b1
              GROUP BY bk.b0),
        c AS (SELECT sum(counted)::BIGINT AS counted, sum(n)::BIGINT AS stored,
                     sum(greatest(counted - n, 0))::BIGINT AS missing,
                     sum(CASE WHEN counted > n THEN greatest(counted_ns - n_ns, 0) ELSE 0 END)::BIGINT AS missing_ns,
                     count(*) FILTER (WHERE counted > n AND counted_ns IS NULL) AS missing_unknown,
                     count(*) FILTER (WHERE n > counted) AS over_buckets FROM m),
        u AS (SELECT count(*) AS unbucketed FROM sched_intervals x
              WHERE x.session_id = {s} AND x.pid = {p} AND x.tid = {t} AND x.on_ns BETWEEN {a} AND {b}
                AND NOT EXISTS (SELECT 1 FROM bk WHERE x.on_ns >= bk.b0 AND x.on_ns < bk.b1)),
        o AS (SELECT acc.*, c.*, u.unbucketed, acc.off_ns + coalesce(c.missing_ns, 0) AS off_cpu_ns,
                     greatest(acc.accounted_ns - acc.off_ns - coalesce(c.missing_ns, 0), 0) AS on_cpu_ns FROM acc, c, u)
        SELECT *, round(100.0 * on_cpu_ns / nullif(accounted_ns, 0), 1) AS on_cpu_pct,
               round(100.0 * off_cpu_ns / nullif(accounted_ns, 0), 1) AS off_cpu_pct,
               round(off_cpu_ns / 1e9, 3) AS off_cpu_s, round(accounted_ns / 1e9, 3) AS accounted_s,
               round(unknown_ns / 1e9, 3) AS unknown_s, round(coalesce(missing_ns, 0) / 1e6, 3) AS missing_ms
        FROM o
    """)


def seconds_sql(session_id: int, pid: int, tid: int, window: TimeWindow, t0: int) -> str:
    """Per second since the trace start (k): a thread's accounted time, off-CPU time and switches, from its rows;
    seconds its rows do not account for are left out."""
    a, b = int(window.start_ns), int(window.end_ns)
    k0, k1 = (a - t0) // SECOND_NS, (b - 1 - t0) // SECOND_NS
    lo, hi = f"greatest({t0} + k * {SECOND_NS}, {a})", f"least({t0} + (k + 1) * {SECOND_NS}, {b})"
    accounted = f"sum(greatest(0, least(on_ns, {hi}) - greatest(from_ns, {lo})))"
    return tidy(f"""
        WITH {segments_cte(session_id, pid, tid)},
        ks AS (SELECT unnest(range({int(k0)}, {int(k1) + 1})) AS k)
        SELECT k, {accounted}::BIGINT AS accounted_ns,
               sum(greatest(0, least(on_ns, {hi}) - greatest(off_ns, {lo})))::BIGINT AS off_ns,
               count(*) FILTER (WHERE on_ns >= {lo} AND on_ns < {hi}) AS switches
        FROM ks JOIN seg ON seg.on_ns > {lo} AND seg.from_ns < {hi}
        GROUP BY k HAVING {accounted} > 0 ORDER BY k
    """)


def busy_seconds_sql(session_id: int, pid: int, tid: int, window: TimeWindow, t0: int) -> str:
    """Over the seconds a thread's rows account for at least half of: how many were off-CPU BUSY_SECOND_OFF or more,
    the largest off-CPU share of one (%), and that second (k)."""
    return tidy(f"""
        SELECT count(*) FILTER (WHERE off_ns >= {BUSY_SECOND_OFF} * accounted_ns) AS off_seconds,
               round(100.0 * max(off_ns / accounted_ns), 1) AS worst_off_pct,
               arg_max(k, off_ns / accounted_ns) AS worst_k, count(*) AS seconds
        FROM ({seconds_sql(session_id, pid, tid, window, t0)}) WHERE accounted_ns >= {FULL_SECOND_NS}
    """)


def cuda_sql(session_id: int, pid: int, window: TimeWindow) -> str:
    """A process's CUDA calls in the minutes overlapping the window that hold counts: rows stored, calls counted, and
    the counted time in them (both API layers summed: an upper bound of the time inside CUDA calls)."""
    s, p = int(session_id), int(pid)
    agg = where(f"session_id = {s}", f"pid = {p}", "source IN ('cuda', 'driver')", bucket_in(window))
    return tidy(f"""
        WITH bk AS (SELECT DISTINCT bucket_start_ns AS b0, bucket_start_ns + bucket_ns AS b1 FROM host_aggregates {agg})
        SELECT (SELECT count(*) FROM cuda_calls k WHERE k.session_id = {s} AND k.pid = {p}
                AND EXISTS (SELECT 1 FROM bk WHERE k.ts_ns >= bk.b0 AND k.ts_ns < bk.b1)) AS cuda_rows,
               (SELECT sum(count)::BIGINT FROM host_aggregates {agg}) AS cuda_counted,
               (SELECT sum(sum_duration_ns)::BIGINT FROM host_aggregates {agg}) AS cuda_ns,
               round((SELECT sum(sum_duration_ns) FROM host_aggregates {agg}) / 1e9, 3) AS cuda_s
    """)


def candidates_sql(window: TimeWindow, pids: list[int] | None) -> str:
    """Every imported thread with scheduler rows in the window or switches counted there: (session, pid, tid, rows,
    counted). Ingero counts switches per thread id (its `pid` of a sched_switch is the thread)."""
    a, b = int(window.start_ns), int(window.end_ns)
    return tidy(f"""
        WITH r AS (SELECT session_id, pid, tid, count(*) AS n FROM sched_intervals
                   {where(_IMPORTED, f"on_ns BETWEEN {a} AND {b}", pid_in(pids))} GROUP BY ALL),
        g AS (SELECT session_id, pid AS tid, sum(count)::BIGINT AS counted FROM host_aggregates
              {where(_IMPORTED, "op = 'sched_switch'", bucket_in(window), pid_in(pids))}
              GROUP BY ALL HAVING sum(count) > 0)
        SELECT coalesce(r.session_id, g.session_id) AS session_id, coalesce(r.pid, g.tid) AS pid,
               coalesce(r.tid, g.tid) AS tid, coalesce(r.n, 0) AS n, g.counted
        FROM r FULL JOIN g ON r.session_id = g.session_id AND r.tid = g.tid
    """)


def feeders_sql(window: TimeWindow, pids: list[int] | None) -> str:
    """Per imported process with CUDA calls (rows in the window, or counted in its minutes): the thread that made
    them (its main thread where it has calls, else the thread with most) and its rows; tid NULL: counted only."""
    a, b = int(window.start_ns), int(window.end_ns)
    return tidy(f"""
        WITH k AS (SELECT session_id, pid, tid, count(*) AS n FROM cuda_calls
                   {where(_IMPORTED, f"ts_ns BETWEEN {a} AND {b}", pid_in(pids))} GROUP BY ALL),
        g AS (SELECT DISTINCT session_id, pid FROM host_aggregates
              {where(_IMPORTED, "source IN ('cuda', 'driver')", "count > 0", bucket_in(window), pid_in(pids))}),
        p AS (SELECT session_id, pid FROM k UNION SELECT session_id, pid FROM g)
        SELECT p.session_id, p.pid, arg_max(k.tid, (k.tid = p.pid, k.n)) AS tid, max(k.n) AS n
        FROM p LEFT JOIN k USING (session_id, pid) GROUP BY ALL ORDER BY p.session_id, p.pid
    """)


def who(t: ImportedThread) -> str:
    """'python3[2233]'s main thread' or 'pt_data_worker[2255/2260]', with its node where the store holds several
    (names as recorded; renderers clean them)."""
    node = f" ({t.node})" if t.node else ""
    if t.tid == t.pid:
        return f"{t.process_comm or t.comm or '?'}[{t.pid}]'s main thread{node}"
    return f"{t.comm or '?'}[{t.pid}/{t.tid}]{node}"


def label(t: ImportedThread) -> str:
    """'pt_data_worker[2255]': a thread by its own name."""
    name = t.comm or t.process_comm or "?"
    node = f" ({t.node})" if t.node else ""
    return (f"{name}[{t.pid}]" if t.tid == t.pid else f"{name}[{t.pid}/{t.tid}]") + node


def short_why(t: ImportedThread) -> str:
    """Why a thread is not accountable, in a few words (the verdict's list, the report's table)."""
    if t.switch_rows == 0 and t.switches_counted:
        return f"a sample, 0 of {t.switches_counted:,} switches stored"
    if t.switches_counted is None:
        return f"{t.switch_rows:,} switch rows, no per-minute count to check them against"
    return t.why_not or "?"


def _why_not(t: ImportedThread, got: dict[str, Any]) -> str | None:
    """Why a thread's time cannot be accounted from its rows (None: it can)."""
    n, counted = t.switch_rows, got.get("counted")
    if n == 0:
        return ("no scheduler row and no count of its switches" if counted is None else
                f"a sample: 0 of its {int(counted):,} counted switches are stored as rows")
    if counted is None:
        return (f"the file holds no per-minute count of its switches (event_aggregates), so whether its {n:,} "
                "switch rows are all of them cannot be told")
    if got["over_buckets"] or got["unbucketed"]:
        return (f"its {n:,} switch rows do not match Ingero's counts (more rows than counted in "
                f"{got['over_buckets']} minute(s), {got['unbucketed']} row(s) in minutes without a count)")
    if t.missing_switches and got["missing_unknown"]:
        return (f"a sample: {t.missing_switches:,} of its {t.switches_counted:,} counted switches are not rows and "
                "their off-CPU time is not known")
    if t.accounted_ns <= 0:
        return "no switch row of it accounts for any time in the window"
    missing = t.missing_off_cpu_ns or 0
    if missing > MAX_MISSING_SHARE * t.accounted_ns:
        return (f"a sample: {t.missing_switches:,} of its {t.switches_counted:,} counted switches are not rows "
                f"({missing / 1e9:,.3f} s off-CPU between them, over {100 * MAX_MISSING_SHARE:.0f}% of the "
                f"{t.accounted_ns / 1e9:,.1f} s its rows account for)")
    return None


def _account_thread(con: duckdb.DuckDBPyConnection, t: ImportedThread, window: TimeWindow, t0: int) -> None:
    """Fill in a thread's rows, completeness and (when accountable) its accounting, whole and per second."""
    t.sql = thread_sql(t.session_id, t.pid, t.tid, window)
    cur = con.execute(t.sql)
    got = dict(zip([d[0] for d in cur.description], cur.fetchall()[0], strict=True))
    t.switch_rows = int(got["switches"] or 0)
    t.switches_counted = None if got["counted"] is None else int(got["counted"])
    t.missing_switches = int(got["missing"] or 0)
    known = got["counted"] is not None and not got["missing_unknown"]
    t.missing_off_cpu_ns = int(got["missing_ns"] or 0) if known else None
    t.accounted_ns, t.unknown_ns = int(got["accounted_ns"]), int(got["unknown_ns"])
    if got["span_from"] is not None and got["span_to"] is not None and got["span_to"] > got["span_from"]:
        t.span = TimeWindow(start_ns=int(got["span_from"]), end_ns=int(got["span_to"]))
    t.why_not = _why_not(t, got)
    t.accountable = t.why_not is None
    if not t.accountable:
        return
    t.off_cpu_ns, t.on_cpu_ns = int(got["off_cpu_ns"]), int(got["on_cpu_ns"])
    t.seconds = [ImportedSecond(k=int(k), start_ns=t0 + int(k) * SECOND_NS, accounted_ns=int(acc),
                                off_cpu_ns=int(off), switches=int(n))
                 for k, acc, off, n in rows(con, seconds_sql(t.session_id, t.pid, t.tid, window, t0))]


def imported_accounting(con: duckdb.DuckDBPyConnection, window: TimeWindow,
                        pids: list[int] | None = None) -> ImportedAccounting:
    """Every imported thread over the window: complete or a sample, and where its time went when complete."""
    from ingero_mcp.analysis.accounting import origin_ns, thread_names

    t0 = origin_ns(con) or window.start_ns
    names = thread_names(con)
    procs = {int(p): c for p, c in rows(con, "SELECT pid, any_value(comm) FROM processes WHERE comm IS NOT NULL "
                                             "GROUP BY pid")}
    hosts = {int(sid): host for sid, host in rows(con, "SELECT session_id, host FROM sessions")}

    def new(sid: int, pid: int, tid: int) -> ImportedThread:
        return ImportedThread(session_id=sid, node=hosts.get(sid) if len(hosts) > 1 else None, pid=pid, tid=tid,
                              comm=names.get(tid), process_comm=procs.get(pid))

    threads: dict[tuple[int, int, int], ImportedThread] = {}
    for sid, pid, tid, n, counted in rows(con, candidates_sql(window, pids)):
        t = threads[(int(sid), int(pid), int(tid))] = new(int(sid), int(pid), int(tid))
        t.switch_rows, t.switches_counted = int(n), None if counted is None else int(counted)
    for sid, pid, tid, _n in rows(con, feeders_sql(window, pids)):
        key = (int(sid), int(pid), int(pid if tid is None else tid))
        t = threads.setdefault(key, new(*key))
        t.feeds_gpu = True
        cuda_rows, t.cuda_counted, t.cuda_ns_max = rows(con, cuda_sql(key[0], key[1], window))[0][:3]
        t.cuda_rows = int(cuda_rows)
    ordered = sorted(threads.values(), key=lambda t: (not t.feeds_gpu, t.switch_rows == 0, -(t.switches_counted or 0)))
    for t in ordered[:MAX_THREADS]:
        if t.switch_rows > 0 or t.feeds_gpu:
            _account_thread(con, t, window, t0)
        else:
            t.missing_switches = t.switches_counted or 0
            t.why_not = f"a sample: 0 of its {t.switches_counted or 0:,} counted switches are stored as rows"
    kept = sorted(ordered[:MAX_THREADS], key=lambda t: (not t.feeds_gpu, not t.accountable, -(t.switches_counted or 0)))
    accountable = [label(t) for t in kept if t.accountable]
    more = f" ({len(ordered) - len(kept)} more not examined)" if len(ordered) > len(kept) else ""
    note = ("this store holds a sample of the CUDA calls or scheduler rows (an import): the full time accounting needs "
            "every row, so each imported thread is accounted from its own scheduler rows where they are complete: "
            f"{len(accountable)} of {len(kept)} thread(s){more} ({', '.join(accountable[:4]) or 'none'})")
    return ImportedAccounting(window=window, threads=kept, note=note)
