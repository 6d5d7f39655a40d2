"""Per-process breakdown: CUDA ops with percentiles, context switches, off-CPU time, page allocations, children.

Scheduler numbers come from sched_intervals rows when the store has them complete for that pid
(preempted/blocked split and the worst stall are then known, the stalled thread named with its
role); otherwise from host_aggregates (op 'sched_switch'). What the aggregates' sum_duration_ns
means depends on who wrote them: the collector stores on-CPU time there (shown as on-CPU, off-CPU
then unknown); an Ingero import stores Ingero's off-CPU durations. In an import the aggregates are
reconciled with the stored rows bucket by bucket (never fewer than the rows; a lower bound where
they disagree). Page allocations come from host_aggregates (op 'mm_page_alloc': count and bytes),
else from the per-call attribution in cuda_calls; None where nothing was recorded (unknown, not 0).
The collector (this project's own `ingero-mcp trace`) is labelled and ranked last.
"""

from __future__ import annotations

import re
from collections import defaultdict

import duckdb

from ingero_mcp.analysis._sql import SLEEP_STATES, interval_in, pid_in, rows, table_complete, tidy, ts_in, where
from ingero_mcp.analysis.answers import shared_rows
from ingero_mcp.analysis.calls import CallGroup, call_groups
from ingero_mcp.analysis.imported import only_imported_sql
from ingero_mcp.analysis.models import ProcessBreakdown, ProcessOp, TimeWindow
from ingero_mcp.analysis.stats import agg_bucket_ns, bucket_inside, reconcile_sql

# The collector's own command line (the same pattern as analysis/causes/context.py's Ctx.is_collector).
_COLLECTOR = re.compile(r"ingero[-_]mcp(\.cli)?\s+trace|ingero_mcp\.cli\s+trace")


def is_collector(cmdline: str | None) -> bool:
    """Whether a command line is this project's collector (`ingero-mcp trace`, `python -m ingero_mcp.cli trace`)."""
    return bool(_COLLECTOR.search(cmdline or ""))


def is_import(con: duckdb.DuckDBPyConnection) -> bool:
    """Whether the store's sessions were imported from Ingero (its aggregates then hold Ingero's values)."""
    return bool(rows(con, "SELECT 1 FROM sessions WHERE source = 'ingero-import' LIMIT 1"))


def worst_threads_sql(window: TimeWindow | None, pids: list[int] | None) -> str:
    """The longest off-CPU interval per pid, its thread, the thread's name where recorded and whether it calls CUDA."""
    return tidy(f"""
        WITH w AS (SELECT pid, arg_max(tid, off) AS tid, max(off) AS off
                   FROM (SELECT pid, tid, coalesce(off_cpu_ns, on_ns - off_ns, 0) AS off
                         FROM sched_intervals {where(interval_in(window), pid_in(pids))})
                   GROUP BY pid)
        SELECT w.pid, w.tid,
               coalesce((SELECT max(t.comm) FROM threads t WHERE t.pid = w.pid AND t.tid = w.tid),
                        (SELECT arg_max(e.comm, e.ts_ns) FROM process_events e
                         WHERE e.tid = w.tid AND e.event IN ('thread', 'rename') AND e.comm IS NOT NULL)) AS name,
               EXISTS (SELECT 1 FROM cuda_calls c WHERE c.pid = w.pid AND c.tid = w.tid) AS calls_cuda
        FROM w
    """)


def _role(pid: int, tid: int, calls_cuda: bool) -> str:
    if tid == pid:
        return "main thread" + (", calls CUDA" if calls_cuda else ", no CUDA calls")
    return "CUDA-calling thread" if calls_cuda else "helper thread (no CUDA calls: idle waits here are not the job's)"


def sched_rows_sql(window: TimeWindow | None, pids: list[int] | None) -> str:
    """Context switches and off-CPU time per pid from sched_intervals rows."""
    return tidy(f"""
        SELECT pid, count(*) AS switches, sum(off) AS off_cpu_ns,
               sum(CASE WHEN prev_state = 'preempted' THEN off ELSE 0 END) AS preempted_ns,
               sum(CASE WHEN prev_state IN {SLEEP_STATES} THEN off ELSE 0 END) AS blocked_ns,
               count(*) FILTER (WHERE prev_state = 'preempted' OR prev_state IN {SLEEP_STATES}) AS known_state,
               max(off) AS worst_ns, arg_max(off_ns, off) AS worst_ts_ns
        FROM (SELECT pid, prev_state, off_ns, coalesce(off_cpu_ns, on_ns - off_ns, 0) AS off
              FROM sched_intervals {where(interval_in(window), pid_in(pids))})
        GROUP BY pid
    """)


def aggregates_sql(window: TimeWindow | None, pids: list[int] | None) -> str:
    """sched_switch and mm_page_alloc totals per pid from host_aggregates (the buckets wholly inside the window)."""
    return tidy(f"""
        SELECT pid, op, sum(count) AS events, sum(sum_duration_ns) AS sum_duration_ns,
               max(max_duration_ns) AS max_duration_ns, sum(sum_bytes) AS sum_bytes, max(comm) AS comm
        FROM host_aggregates
        {where("op IN ('sched_switch', 'mm_page_alloc')", bucket_inside(window), pid_in(pids))}
        GROUP BY pid, op
    """)


def call_pages_sql(window: TimeWindow | None, pids: list[int] | None) -> str:
    """Page allocations attributed to CUDA calls per pid (fallback when no aggregates)."""
    return tidy(f"""
        SELECT pid, sum(page_allocs) AS pages, sum(page_alloc_bytes) AS bytes
        FROM cuda_calls {where(ts_in(window), pid_in(pids), "page_allocs IS NOT NULL")}
        GROUP BY pid
    """)


def _identity(con: duckdb.DuckDBPyConnection, pids: list[int] | None) -> dict[int, tuple]:
    got = rows(
        con,
        f"SELECT pid, any_value(ppid), any_value(comm), any_value(cmdline), max(exit_ns) "
        f"FROM processes {where(pid_in(pids))} GROUP BY pid",
    )
    return {int(r[0]): r[1:] for r in got}


def _children(con: duckdb.DuckDBPyConnection, pids: list[int] | None) -> dict[int, list[int]]:
    got = rows(
        con,
        f"""
        SELECT parent, list(DISTINCT child ORDER BY child) FROM (
            SELECT ppid AS parent, pid AS child FROM processes WHERE ppid IS NOT NULL
            UNION SELECT pid, child_pid FROM process_events WHERE event = 'fork' AND child_pid IS NOT NULL
        ) {where(pid_in(pids, "parent"))} GROUP BY parent
        """,
    )
    return {int(p): [int(c) for c in kids if c != p] for p, kids in got}


def _event_comms(con: duckdb.DuckDBPyConnection, pids: list[int] | None) -> dict[int, str]:
    got = rows(
        con,
        f"SELECT pid, any_value(comm) FROM process_events {where(pid_in(pids), 'comm IS NOT NULL')} GROUP BY pid",
    )
    return {int(p): c for p, c in got}


def per_process_breakdown(
    con: duckdb.DuckDBPyConnection,
    window: TimeWindow | None = None,
    pids: list[int] | None = None,
    *,
    groups: list[CallGroup] | None = None,
) -> list[ProcessBreakdown]:
    """One entry per pid seen in the window: CUDA-active processes first, then the other traced ones
    (DataLoader workers: scheduler rows), then the rest of the host by context switches. The idle
    task (pid 0, whose "switches" are CPUs going idle) is left out unless asked for by pid."""
    groups = call_groups(con, window, pids) if groups is None else groups
    ops: dict[int, list[ProcessOp]] = defaultdict(list)
    for g in groups:
        if g.pid is not None:
            ops[g.pid].append(
                ProcessOp(op=g.op, count=g.count, total_ns=g.total_ns, p50_ns=g.p50_ns, p99_ns=g.p99_ns,
                          max_ns=g.max_ns, entry_only=g.entry_only)
            )
    sched = {int(r[0]): r[1:] for r in shared_rows(con, sched_rows_sql(window, pids))}
    rows_complete = table_complete(con, "sched_intervals")
    aggs: dict[tuple[int, str], tuple] = {}
    agg_comm: dict[int, str] = {}
    for pid, op, n, dur, mx, nbytes, comm in shared_rows(con, aggregates_sql(window, pids)):
        aggs[(int(pid), op)] = (int(n), dur, mx, nbytes)
        if comm:
            agg_comm[int(pid)] = comm
    call_pages = {int(r[0]): r[1:] for r in shared_rows(con, call_pages_sql(window, pids))}
    ident = _identity(con, pids)
    kids = _children(con, pids)
    event_comm = _event_comms(con, pids)

    collector_store = not is_import(con)
    reconciled: dict[int, tuple] = {}
    if not rows_complete:  # an import: aggregates reconciled with the rows per bucket
        agg_where = where("op = 'sched_switch'", pid_in(pids)).removeprefix("WHERE ")
        bucket = agg_bucket_ns(con, agg_where)
        if bucket is not None:
            rows_from = (f"(SELECT pid, on_ns, coalesce(off_cpu_ns, on_ns - off_ns) AS off FROM sched_intervals "
                         f"{where(ts_in(window, 'on_ns'), pid_in(pids))}) s")
            reconciled = {int(r[0]): r[1:] for r in shared_rows(
                con, reconcile_sql(rows_from, "on_ns", "off", agg_where, ["pid"], bucket, window))}
    worst = {int(r[0]): r[1:] for r in shared_rows(con, worst_threads_sql(window, pids))} if sched else {}

    only_imported = {int(p): what for p, what in shared_rows(con, only_imported_sql(window, pids))}

    seen = set(ops) | set(sched) | {p for p, _ in aggs} | (set(kids) & set(ident)) | set(only_imported)
    if pids:
        seen |= set(ident) & set(pids)
    out: list[ProcessBreakdown] = []
    if not (pids and 0 in pids):
        seen.discard(0)
    for pid in seen:
        ppid, comm, cmdline, exit_ns = ident.get(pid, (None, None, None, None))
        entry = ProcessBreakdown(
            pid=pid, ppid=ppid, comm=comm or agg_comm.get(pid) or event_comm.get(pid), cmdline=cmdline,
            ops=sorted(ops.get(pid, []), key=lambda o: (-(o.total_ns or 0), -o.count, o.op)),
            children=kids.get(pid, []), exit_ns=exit_ns, is_collector=is_collector(cmdline),
        )
        agg_sched = aggs.get((pid, "sched_switch"))
        if pid in reconciled:
            n, dur, mx, lower, _contradicted, _agg_n, _row_n = reconciled[pid]
            entry.context_switches, entry.off_cpu_ns = int(n), None if dur is None else int(dur)
            entry.worst_stall_ns = None if mx is None else int(mx)
            entry.switches_lower_bound = bool(lower)
            entry.counts_from = "rows" if pid in sched and _agg_n == 0 else "aggregates"
        elif pid in sched and (rows_complete or agg_sched is None):
            n, off, pre, blk, known, worst_ns, worst_ts = sched[pid]
            entry.context_switches, entry.off_cpu_ns = int(n), int(off or 0)
            if known:  # Ingero imports do not know prev_state: no split then
                entry.preempted_ns, entry.blocked_ns = int(pre or 0), int(blk or 0)
            entry.worst_stall_ns, entry.worst_stall_ts_ns = (int(worst_ns or 0),
                                                             None if worst_ts is None else int(worst_ts))
            entry.counts_from = "rows"
            entry.switches_lower_bound = not rows_complete
        elif agg_sched is not None:
            n, dur, mx, _ = agg_sched
            entry.context_switches = n
            if collector_store:  # the collector's sched_switch sum_duration_ns is on-CPU time; off-CPU was not recorded
                entry.off_cpu_ns, entry.on_cpu_ns = None, None if dur is None else int(dur)
                entry.worst_stall_ns = None
            else:
                entry.off_cpu_ns = None if dur is None else int(dur)
                entry.worst_stall_ns = None if mx is None else int(mx)
            entry.counts_from = "aggregates"
        else:
            entry.off_cpu_ns, entry.counts_from = None, "none"
        if pid in only_imported:  # block I/O, TCP...: imported, not analysed yet
            entry.known_from = [f"imported_events: {only_imported[pid]}"]
        if entry.worst_stall_ns and pid in worst and entry.counts_from == "rows":
            tid, name, calls_cuda = worst[pid]
            if tid is not None:
                entry.worst_stall_tid, entry.worst_stall_thread = int(tid), name
                entry.worst_stall_role = _role(pid, int(tid), bool(calls_cuda))
        pages = aggs.get((pid, "mm_page_alloc"))
        if pages is not None:
            entry.page_allocs, entry.page_alloc_bytes = pages[0], None if pages[3] is None else int(pages[3])
        elif pid in call_pages:
            entry.page_allocs, entry.page_alloc_bytes = int(call_pages[pid][0] or 0), int(call_pages[pid][1] or 0)
        else:
            entry.page_allocs, entry.page_alloc_bytes = None, None
        out.append(entry)
    out.sort(key=lambda e: (e.is_collector, not e.ops, e.counts_from != "rows", -sum(o.total_ns or 0 for o in e.ops),
                            -e.context_switches, e.pid))
    return out
