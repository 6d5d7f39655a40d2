"""GPU starvation: long gaps between the CUDA calls of the thread that feeds the GPU, and what it did in them.

A starved GPU shows no slow CUDA call at all: the feeding thread simply stops calling. Per traced
process the feeder is the thread with the most launches and copies; its gaps are the idle stretches
between the end of one of its calls (running max over nested runtime/driver calls) and the start of
the next, at least MIN_GAP_NS long. (A gap relative to the thread's median gap would excuse a thread
whose every step ends in a long gap, the starved case itself; gaps while the GPU stays busy, e.g.
used by another process, make no chain.) They are found in SQL over
per-bucket first/last call times (window functions over buckets of MIN_GAP_NS, exact for every gap
of that length: such a gap always crosses a bucket edge), so the cost is one aggregate over the calls.

Each gap is split by the thread's scheduler rows into on-CPU (host-bound: busy in user code),
preempted (CPU contention) and blocked (waiting: IO, a lock, a queue fed by DataLoader workers), and
classed by the largest share. Per process and class the engine adds GPU utilisation in the snapshots
inside the gaps vs outside them, and what the process's children (workers) did during the gaps.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import duckdb

from ingero_mcp.analysis import recommend as rc
from ingero_mcp.analysis._sql import has_rows, pid_in, rows, table_complete, tidy, ts_in, where
from ingero_mcp.analysis.models import CausalChain, Evidence, TimelineEntry, TimeWindow

MS = 1_000_000
MIN_GAP_NS = 50 * MS  # also the bucket width of the gap search
MIN_CLASS_SHARE = 0.02  # a class of gaps smaller than this share of the span makes no chain
MIN_CLASS_NS = 500 * MS
BUSY_GPU = 50.0  # GPU utilisation (%) in the gaps at or above which the GPU was not starved (another user kept it busy)
WORK_OPS = "(contains(op, 'aunch') OR contains(op, 'emcpy') OR contains(op, 'emset'))"  # launches, copies, memsets


def _gaps_only(window: TimeWindow | None, pids: list[int] | None) -> str:
    """CTEs ending in `gaps(pid, tid, start_ns, end_ns, gap_ns)`: the long gaps of each process's feeder thread
    (the thread with the most launches and copies)."""
    b = MIN_GAP_NS
    return f"""
        b AS MATERIALIZED (SELECT pid, tid, ts_ns // {b} AS k, min(ts_ns) AS first_ns, max(ts_ns + duration_ns) AS end_ns,
                     count(*) FILTER (WHERE {WORK_OPS}) AS work
              FROM cuda_calls {where(ts_in(window), pid_in(pids))} GROUP BY ALL),
        feeder AS (SELECT pid, arg_max(tid, w) AS tid FROM (SELECT pid, tid, sum(work) AS w FROM b GROUP BY ALL)
                   WHERE w > 0 GROUP BY pid),
        bg AS (SELECT b.pid, b.tid, b.first_ns, b.first_ns - max(b.end_ns) OVER (PARTITION BY b.pid, b.tid ORDER BY b.k
                      ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS gap_ns
               FROM b SEMI JOIN feeder f ON b.pid = f.pid AND b.tid = f.tid),
        gaps AS (SELECT pid, tid, first_ns - gap_ns AS start_ns, first_ns AS end_ns, gap_ns FROM bg WHERE gap_ns >= {MIN_GAP_NS})"""


def _split(si_bounds: str) -> str:
    """CTEs `si`, `hit`, `split`, `gs` over a CTE `gaps`: the scheduler rows of the gap's thread inside each gap,
    the gap's preempted / blocked / on-CPU split and its class (the largest share)."""
    return f"""
        si AS (SELECT i.pid, i.tid, i.off_ns, i.on_ns, i.prev_state, i.preemptor_pid, i.preemptor_comm
               FROM sched_intervals i SEMI JOIN (SELECT DISTINCT pid, tid FROM gaps) f ON i.pid = f.pid AND i.tid = f.tid
               WHERE {si_bounds}),
        hit AS (SELECT gaps.pid, gaps.tid, gaps.start_ns, si.prev_state, si.preemptor_pid, si.preemptor_comm,
                       least(coalesce(si.on_ns, gaps.end_ns), gaps.end_ns) - si.off_ns AS ns
                FROM si ASOF JOIN gaps ON si.pid = gaps.pid AND si.tid = gaps.tid AND si.off_ns >= gaps.start_ns
                WHERE si.off_ns < gaps.end_ns),
        split AS (SELECT pid, tid, start_ns, coalesce(sum(ns) FILTER (WHERE prev_state = 'preempted'), 0) AS pre_ns,
                         coalesce(sum(ns) FILTER (WHERE prev_state <> 'preempted'), 0) AS blk_ns
                  FROM hit GROUP BY ALL),
        gs AS (SELECT gaps.*, coalesce(split.pre_ns, 0) AS pre_ns, coalesce(split.blk_ns, 0) AS blk_ns,
                      gaps.gap_ns - coalesce(split.pre_ns, 0) - coalesce(split.blk_ns, 0) AS on_ns,
                      CASE WHEN coalesce(split.blk_ns, 0) >= greatest(coalesce(split.pre_ns, 0),
                                  gaps.gap_ns - coalesce(split.pre_ns, 0) - coalesce(split.blk_ns, 0)) THEN 'blocked'
                           WHEN coalesce(split.pre_ns, 0) >= gaps.gap_ns - coalesce(split.pre_ns, 0) - coalesce(split.blk_ns, 0)
                           THEN 'preempted' ELSE 'host-bound' END AS cls
               FROM gaps LEFT JOIN split USING (pid, tid, start_ns))"""


def gaps_cte(window: TimeWindow | None, pids: list[int] | None) -> str:
    """CTEs ending in `gs(pid, tid, start_ns, end_ns, gap_ns, pre_ns, blk_ns, on_ns, cls)`: the feeder
    threads' long gaps with their scheduler split and class, recomputed from the store in one statement."""
    return _gaps_only(window, pids) + "," + _split(
        "i.off_ns >= (SELECT min(start_ns) FROM gaps) AND i.off_ns < (SELECT max(end_ns) FROM gaps)")


def gaps_sql(window: TimeWindow | None, pids: list[int] | None) -> str:
    """Every long gap of every feeder thread (no split: that is `split_sql`, run only when there are gaps)."""
    return tidy(f"WITH {_gaps_only(window, pids)} SELECT pid, tid, start_ns, end_ns, gap_ns FROM gaps ORDER BY pid, start_ns")


def split_sql(found: list[tuple]) -> str:
    """The split and class of the given gaps (pid, tid, start_ns, end_ns, gap_ns): the same CTEs as
    `gaps_cte`, with the gaps as literals so that the scheduler rows are pruned by time."""
    values = ", ".join(f"({int(p)}, {int(t)}, {int(s)}, {int(e)}, {int(g)})" for p, t, s, e, g in found)
    lo, hi = min(int(r[2]) for r in found), max(int(r[3]) for r in found)
    return tidy(f"WITH gaps(pid, tid, start_ns, end_ns, gap_ns) AS (VALUES {values}),"
                 + _split(f"i.off_ns >= {lo} AND i.off_ns < {hi}")
                 + " SELECT pid, tid, start_ns, end_ns, gap_ns, pre_ns, blk_ns, on_ns, cls FROM gs ORDER BY pid, start_ns")


def gaps_one(pid: int, cls: str | None, expr: str, window: TimeWindow | None, pids: list[int] | None,
             extra: str = "", source: str = "gs") -> str:
    """One aggregate over one process's gaps of one class (the Evidence.sql of a gap chain)."""
    cond = [f"gs.pid = {int(pid)}", f"gs.cls = '{cls}'" if cls else ""]
    return tidy(f"WITH {gaps_cte(window, pids)} SELECT {expr} FROM {source} {extra} {where(*cond)}")


@dataclass
class Gap:
    """One long gap of a feeder thread."""

    pid: int
    tid: int
    start_ns: int
    end_ns: int
    gap_ns: int
    pre_ns: int
    blk_ns: int
    on_ns: int
    cls: str


@dataclass
class GapClass:
    """A process's gaps of one class, and the evidence about them."""

    pid: int
    tid: int
    cls: str
    gaps: list[Gap]
    all_gaps: list[Gap] = field(default_factory=list)  # every long gap of the process, all classes
    gpu_in: float | None = None
    cpu_in: float | None = None
    n_snap_in: int = 0
    gpu_out: float | None = None
    cpu_out: float | None = None
    preemptors: list[tuple[int, str, int, int]] = field(default_factory=list)  # pid, comm, ns, intervals
    children: list[tuple[int, str, int, int]] = field(default_factory=list)  # pid, comm, alive ns in gaps, off-CPU ns
    child_events: dict[str, tuple[int, int]] = field(default_factory=dict)  # op -> (count, bytes) in gap buckets
    own_events: dict[str, tuple[int, int]] = field(default_factory=dict)  # the process's own, same buckets
    other_calls: list[tuple[int, str, int, int]] = field(default_factory=list)  # tid, op, calls, ns inside the gaps

    @property
    def total_ns(self) -> int:
        """Time lost in this class of gaps."""
        return sum(g.gap_ns for g in self.gaps)

    def part(self, attr: str) -> int:
        """Sum of one split (on_ns, pre_ns, blk_ns) over the gaps."""
        return sum(getattr(g, attr) for g in self.gaps)


def _pct(part: float, whole: float) -> float:
    return round(100.0 * part / whole, 1) if whole else 0.0


def _s(ns: float) -> str:
    return f"{ns / 1e9:,.2f} s" if ns >= 1e9 else f"{ns / MS:,.0f} ms"


def find_gap_classes(con: duckdb.DuckDBPyConnection, window: TimeWindow | None, pids: list[int] | None,
                     span_ns: int) -> list[GapClass]:
    """The long gaps of every feeder thread, grouped by process and class; small classes dropped."""
    if not has_rows(con, "sched_intervals") or not table_complete(con, "cuda_calls") \
            or not table_complete(con, "sched_intervals"):
        return []  # gaps between sampled calls are not gaps; without every scheduler row the split is unknown
    found = rows(con, gaps_sql(window, pids))
    if not found:
        return []
    got = [Gap(*(int(x) for x in r[:8]), r[8]) for r in rows(con, split_sql(found))]
    by: dict[tuple[int, str], list[Gap]] = {}
    for g in got:
        by.setdefault((g.pid, g.cls), []).append(g)
    out = []
    for (pid, cls), gs in by.items():
        total = sum(g.gap_ns for g in gs)
        if total < MIN_CLASS_NS or (span_ns and total < MIN_CLASS_SHARE * span_ns):
            continue
        out.append(GapClass(pid, gs[0].tid, cls, gs, all_gaps=[g for g in got if g.pid == pid]))
    if out:
        _gather(con, out, window)
    return [gc for gc in out if gc.gpu_in is None or gc.gpu_in < BUSY_GPU]


def _gather(con: duckdb.DuckDBPyConnection, classes: list[GapClass], window: TimeWindow | None) -> None:
    has_aggs = has_rows(con, "host_aggregates")
    for gc in classes:
        g_cte = _g_values(gc)
        feeder_calls = rows(con, f"SELECT min(ts_ns), max(ts_ns + duration_ns) FROM cuda_calls "
                                 f"{where(f'pid = {gc.pid}', f'tid = {gc.tid}', ts_in(window))}")[0]
        lo, hi = int(feeder_calls[0]), int(feeder_calls[1])
        snap = rows(con, f"""
            WITH {g_cte},
            all_g AS (SELECT start_ns, end_ns FROM (VALUES {', '.join(f'({g.start_ns}, {g.end_ns})' for g in gc.all_gaps)}) t(start_ns, end_ns)),
            s AS (SELECT ts_ns, cpu_percent, gpu_util_percent FROM snapshots WHERE ts_ns BETWEEN {lo} AND {hi})
            SELECT count(*) FILTER (WHERE EXISTS (SELECT 1 FROM g WHERE s.ts_ns >= g.start_ns AND s.ts_ns < g.end_ns)),
                   round(avg(gpu_util_percent) FILTER (WHERE EXISTS (SELECT 1 FROM g WHERE s.ts_ns >= g.start_ns AND s.ts_ns < g.end_ns)), 1),
                   round(avg(cpu_percent) FILTER (WHERE EXISTS (SELECT 1 FROM g WHERE s.ts_ns >= g.start_ns AND s.ts_ns < g.end_ns)), 1),
                   round(avg(gpu_util_percent) FILTER (WHERE NOT EXISTS (SELECT 1 FROM all_g WHERE s.ts_ns >= all_g.start_ns AND s.ts_ns < all_g.end_ns)), 1),
                   round(avg(cpu_percent) FILTER (WHERE NOT EXISTS (SELECT 1 FROM all_g WHERE s.ts_ns >= all_g.start_ns AND s.ts_ns < all_g.end_ns)), 1)
            FROM s""")[0]
        gc.n_snap_in, gc.gpu_in, gc.cpu_in, gc.gpu_out, gc.cpu_out = int(snap[0]), snap[1], snap[2], snap[3], snap[4]
        if gc.part("pre_ns"):
            gc.preemptors = [(int(p), c or "?", int(ns), int(n)) for p, c, ns, n in rows(con, f"""
                WITH {g_cte}
                SELECT i.preemptor_pid, any_value(i.preemptor_comm), sum(least(coalesce(i.on_ns, g.end_ns), g.end_ns) - i.off_ns), count(*)
                FROM sched_intervals i JOIN g ON i.off_ns >= g.start_ns AND i.off_ns < g.end_ns
                WHERE i.pid = {gc.pid} AND i.tid = {gc.tid} AND i.prev_state = 'preempted' AND i.preemptor_pid IS NOT NULL
                GROUP BY 1 ORDER BY 3 DESC LIMIT 5""")]
        gc.children = [(int(p), c or "?", int(alive or 0), int(off or 0)) for p, c, alive, off in rows(con, children_sql(gc.pid, g_cte))
                       if alive]
        if gc.children and has_aggs:
            kids = ", ".join(str(p) for p, *_ in gc.children)
            for op, n, nbytes in rows(con, events_sql(kids, g_cte)):
                gc.child_events[op] = (int(n or 0), int(nbytes or 0))
        if has_aggs:
            for op, n, nbytes in rows(con, events_sql(str(gc.pid), g_cte)):
                gc.own_events[op] = (int(n or 0), int(nbytes or 0))
        gc.other_calls = [(int(t), op, int(n), int(ns)) for t, op, n, ns in rows(con, f"""
            WITH {g_cte}
            SELECT c.tid, c.op, count(*), sum(least(c.ts_ns + c.duration_ns, g.end_ns) - greatest(c.ts_ns, g.start_ns))
            FROM cuda_calls c JOIN g ON c.ts_ns < g.end_ns AND c.ts_ns + c.duration_ns > g.start_ns
            WHERE c.pid = {gc.pid} AND c.tid <> {gc.tid} GROUP BY ALL ORDER BY 4 DESC LIMIT 4""")]


def children_sql(pid: int, g_cte: str) -> str:
    """Per child process of `pid`: time alive inside the gaps (CTE `g`) and its main thread's off-CPU time there."""
    return tidy(f"""
        WITH {g_cte},
        kids AS (SELECT pid, coalesce((SELECT arg_max(h.comm, h.count) FROM host_aggregates h WHERE h.pid = processes.pid),
                                      any_value(comm)) AS comm, coalesce(min(first_seen_ns), 0) AS born, max(coalesce(exit_ns, last_seen_ns)) AS died
                 FROM processes WHERE ppid = {int(pid)} AND traced GROUP BY pid),
        alive AS (SELECT kids.pid, kids.comm, g.start_ns, g.end_ns, greatest(g.start_ns, kids.born) AS a0,
                         least(g.end_ns, coalesce(kids.died, g.end_ns)) AS a1
                  FROM kids JOIN g ON kids.born < g.end_ns AND coalesce(kids.died, g.end_ns) > g.start_ns),
        off AS (SELECT alive.pid, sum(least(coalesce(i.on_ns, alive.a1), alive.a1) - greatest(i.off_ns, alive.a0)) AS ns
                FROM alive JOIN sched_intervals i ON i.pid = alive.pid AND i.tid = alive.pid
                 AND i.off_ns < alive.a1 AND coalesce(i.on_ns, alive.a1) > alive.a0 GROUP BY alive.pid)
        SELECT alive.pid, any_value(alive.comm), sum(alive.a1 - alive.a0), any_value(off.ns)
        FROM alive LEFT JOIN off USING (pid) GROUP BY alive.pid ORDER BY alive.pid
    """)


def _g_values(gc: GapClass) -> str:
    """CTE `g`: the class's gaps as literals."""
    return f"g(start_ns, end_ns) AS (VALUES {', '.join(f'({g.start_ns}, {g.end_ns})' for g in gc.gaps)})"


def g_from_gs(pid: int, cls: str, window: TimeWindow | None, pids: list[int] | None) -> str:
    """CTE `g`: one process's gaps of one class, recomputed from the calls (for Evidence.sql)."""
    return f"{gaps_cte(window, pids)}, g AS (SELECT start_ns, end_ns FROM gs WHERE pid = {int(pid)} AND cls = '{cls}')"


def events_sql(pids_listed: str, g_cte: str) -> str:
    """sched_switch and mm_page_alloc counts (and bytes) of the listed pids in the host_aggregates buckets
    that overlap the gaps (CTE `g`)."""
    return tidy(f"""
        WITH {g_cte},
        hitb AS (SELECT DISTINCT a.bucket_start_ns FROM (SELECT DISTINCT bucket_start_ns, bucket_ns FROM host_aggregates) a
                 JOIN g ON a.bucket_start_ns < g.end_ns AND a.bucket_start_ns + a.bucket_ns > g.start_ns)
        SELECT op, sum(count) AS events, sum(sum_bytes) AS bytes FROM host_aggregates WHERE pid IN ({pids_listed})
          AND op IN ('sched_switch', 'mm_page_alloc') AND bucket_start_ns IN (SELECT bucket_start_ns FROM hitb)
        GROUP BY op ORDER BY op""")


def _ranges(pids: list[int]) -> str:
    """'1587-1590, 1600': pids as ranges."""
    out: list[str] = []
    for p in sorted(pids):
        if out and out[-1][1] == p - 1:
            out[-1][1] = p
        else:
            out.append([p, p])
    return ", ".join(f"{a}-{b}" if b > a else f"{a}" for a, b in out)


def _grouped(preemptors: list[tuple[int, str, int, int]]) -> str:
    """'pt_data_worker x4 (1587-1590), kworker/3:1[113]': the tasks that took the CPU, grouped by name, busiest first."""
    by: dict[str, list[int]] = {}
    for pid, comm, _, _ in preemptors:
        by.setdefault(comm, []).append(pid)
    parts = [f"{c} x{len(p)} ({_ranges(p)})" if len(p) > 1 else f"{c}[{p[0]}]" for c, p in by.items()]
    return ", ".join(parts[:3]) or "other tasks"


def gap_chain(gc: GapClass, span_ns: int, names: dict[int, str], cpus: int | None,
              window: TimeWindow | None, pids: list[int] | None) -> CausalChain:
    """The chain of one process's gaps of one class: what the feeding thread, the GPU and the workers did then."""
    total, n = gc.total_ns, len(gc.gaps)
    on, pre, blk = gc.part("on_ns"), gc.part("pre_ns"), gc.part("blk_ns")
    who = f"{names.get(gc.pid, '?')}[{gc.pid}]"
    thread = "main thread" if gc.tid == gc.pid else f"thread {gc.tid}"
    idle = 1.0 - (gc.gpu_in or 0.0) / 100.0 if gc.gpu_in is not None else 1.0
    lost = int(total * idle)
    share = lost / span_ns if span_ns else 0.0
    gpu_txt = (f"GPU {gc.gpu_in:.1f}% busy in the {gc.n_snap_in} snapshots inside the gaps"
               + (f" vs {gc.gpu_out:.1f}% outside them" if gc.gpu_out is not None else "")) if gc.gpu_in is not None else ""
    scope = "the trace" if window is None else "the window"  # span_ns is the window's when one was asked for
    head = (f"GPU starved {_s(total)} ({_pct(total, span_ns)}% of {scope}) in {n} gap{'s' if n != 1 else ''} of "
            f">= {_s(MIN_GAP_NS)} between the CUDA calls of {who}'s {thread}")
    if gc.gpu_in is not None:
        head += f" (GPU {gc.gpu_in:.0f}% then" + (f" vs {gc.gpu_out:.0f}% otherwise)" if gc.gpu_out is not None else ")")
    kids_alive = sum(a for _, _, a, _ in gc.children)
    kids_on = sum(max(0, a - o) for _, _, a, o in gc.children)
    kid_names = sorted({c for _, c, _, _ in gc.children})
    kids_txt = f"{', '.join(kid_names) or 'children'} {_ranges([p for p, *_ in gc.children])}"
    pages_k, bytes_k = gc.child_events.get("mm_page_alloc", (0, 0))
    pages_own, bytes_own = gc.own_events.get("mm_page_alloc", (0, 0))
    because = [f"{thread} {gc.tid} was on-CPU {_pct(on, total)}%, preempted {_pct(pre, total)}% and blocked "
               f"{_pct(blk, total)}% of the {_s(total)} of gaps (scheduler rows inside the gaps)"]
    if gpu_txt:
        because.append(gpu_txt)
    numbers: dict[str, object] = {
        "gaps_s": round(total / 1e9, 2), "gaps": n, "share": _pct(total, span_ns), "scope": scope, "who": who, "thread": f"{thread} {gc.tid}",
        "on_pct": _pct(on, total), "pre_pct": _pct(pre, total), "blk_pct": _pct(blk, total), "cpus": cpus or "?",
        "gpu_in": gc.gpu_in if gc.gpu_in is not None else "?", "gpu_out": gc.gpu_out if gc.gpu_out is not None else "?",
        "cpu_in": gc.cpu_in if gc.cpu_in is not None else "?", "workers": kids_txt,
        "kids_on_pct": _pct(kids_on, kids_alive), "kid_pages": f"{pages_k:,}", "kid_gib": round(bytes_k / 2**30, 2),
        "own_pages": f"{pages_own:,}", "pin_note": "", "spare_cpus": "?", "own_gib": round(bytes_own / 2**30, 2),
        # the CPU-contention catalogue's words
        "subject": f"the {thread} of {who} between its CUDA calls", "subject_cap": f"The {thread} of {who}", "span": "the gaps",
        "preempted_pct": _pct(pre, total), "blocked_pct": _pct(blk, total), "moment": "in the gaps", "cpu_at_slow": gc.cpu_in,
        "cpu_mean": gc.cpu_out if gc.cpu_out is not None else "?", "competitors": _grouped(gc.preemptors),
    }
    host_alloc = [(t, op, k, ns) for t, op, k, ns in gc.other_calls if "hostalloc" in op.lower()]
    if gc.cls == "host-bound":
        cause, title = rc.HOST_BOUND, "the thread that feeds the GPU is busy on the CPU between its CUDA calls"
        if gc.children:
            tail = f"{kids_txt} on-CPU {_pct(kids_on, kids_alive)}% of the gaps, yet the {thread} itself did the work"
        else:
            tail = "no child process (worker) was alive then: data preparation on the main thread (DataLoader num_workers=0)"
        because.append(tail)
        if gc.cpu_in is not None and cpus:
            busy = gc.cpu_in / 100.0 * cpus
            because.append(f"host CPU {gc.cpu_in:.1f}% in the gaps: about {busy:,.1f} of {cpus} CPUs busy, "
                           f"{max(0.0, cpus - busy):,.0f} idle that workers could use")
            numbers["spare_cpus"] = f"{max(0.0, cpus - busy):,.0f}"
        if pages_own:
            because.append(f"{who} allocated {pages_own:,} pages ({bytes_own / 2**30:,.2f} GiB) in the 1 s buckets holding "
                           "the gaps: building batches in host memory")
        short = [f"{thread} {gc.tid} on-CPU {_pct(on, total)}% of the gaps (host-bound: running Python, not CUDA)", tail]
        if pre >= 0.2 * total:  # on a crowded host the same gaps are also partly CPU contention
            because.append(f"it was also preempted {_pct(pre, total)}% of the gaps, the CPU taken by {numbers['competitors']}"
                           + (f" on {cpus} CPUs" if cpus else ""))
            short[0] += f", preempted {_pct(pre, total)}% (by {numbers['competitors']})"
        strength = on / total if total else 0.0
    elif gc.cls == "preempted":
        cause, title = rc.CPU_CONTENTION, "CPU contention: the thread that feeds the GPU was preempted between its CUDA calls"
        comp = numbers["competitors"]
        because.append(f"CPU taken by {comp}" + (f" on {cpus} CPUs" if cpus else "")
                       + (f" (CPU {gc.cpu_in:.0f}% in the gaps)" if gc.cpu_in is not None else ""))
        short = [f"{thread} {gc.tid} preempted (runnable, not running) {_pct(pre, total)}% of the gaps",
                 f"CPU taken by {comp}" + (f" on {cpus} CPUs" if cpus else "")]
        strength = pre / total if total else 0.0
    elif gc.children and kids_on >= 0.3 * kids_alive:
        cause, title = rc.INPUT_WAIT, "the thread that feeds the GPU sleeps until its workers deliver the next batch"
        because.append(f"{kids_txt} were on-CPU {_pct(kids_on, kids_alive)}% of the time they were alive in the gaps, "
                       f"with {pages_k:,} page allocations ({bytes_k / 2**30:,.2f} GiB) in the buckets holding the gaps")
        if host_alloc:
            t, op, k, ns = host_alloc[0]
            because.append(f"thread {t} spent {ns / MS:,.0f} ms in {k} {op} call{'s' if k != 1 else ''} (pinned host buffers) "
                           "inside the gaps")
            numbers["pin_note"] = (f"; with pin_memory=True the pinned buffers ({ns / MS:,.0f} ms in {k} {op} calls on thread {t} "
                                   "inside the gaps) are allocated anew: persistent_workers=True keeps them")
        short = [f"{thread} {gc.tid} blocked (waiting) {_pct(blk, total)}% of the gaps",
                 f"{kids_txt} busy (on-CPU {_pct(kids_on, kids_alive)}%): waiting on DataLoader workers"]
        strength = blk / total if total else 0.0
    else:
        cause, title = rc.BLOCKED, "the thread that feeds the GPU sleeps between its CUDA calls (IO, a lock, a queue)"
        short = [f"{thread} {gc.tid} blocked (sleeping) {_pct(blk, total)}% of the gaps", "waiting on IO, a lock or a queue"]
        strength = blk / total if total else 0.0
    if gc.gpu_in is None:
        severity = "MEDIUM" if share >= 0.05 and strength >= 0.5 else "LOW"
    elif share >= 0.25 and strength >= 0.6 and gc.gpu_in < 30:
        severity = "HIGH"
    elif share >= 0.05 and strength >= 0.5 and gc.gpu_in < 50:
        severity = "MEDIUM"
    else:
        severity = "LOW"
    if gc.gpu_in is not None and gc.gpu_out is not None and gc.gpu_in >= gc.gpu_out:
        severity = "LOW"  # the GPU was no less busy in the gaps than outside them: they did not starve it
    if cause == rc.BLOCKED and severity == "HIGH":
        severity = "MEDIUM"  # sleeping with no busy worker may be a server waiting for work: the trace cannot tell
    ev = [
        Evidence(name="gaps", value=n, unit=f"gaps of class {gc.cls}", sql=gaps_one(gc.pid, gc.cls, "count(*)", window, pids)),
        Evidence(name="gaps_time", value=total, unit="ns", sql=gaps_one(gc.pid, gc.cls, "sum(gs.gap_ns)", window, pids)),
        Evidence(name="on_cpu_in_gaps", value=on, unit="ns", sql=gaps_one(gc.pid, gc.cls, "sum(gs.on_ns)", window, pids)),
        Evidence(name="preempted_in_gaps", value=pre, unit="ns", sql=gaps_one(gc.pid, gc.cls, "sum(gs.pre_ns)", window, pids)),
        Evidence(name="blocked_in_gaps", value=blk, unit="ns", sql=gaps_one(gc.pid, gc.cls, "sum(gs.blk_ns)", window, pids)),
    ]
    if gc.gpu_in is not None:
        ev.append(Evidence(name="gpu_util_percent_in_gaps", value=gc.gpu_in, unit="% (snapshots inside the gaps)",
                           sql=gaps_one(gc.pid, gc.cls, "round(avg(s.gpu_util_percent), 1)", window, pids,
                                        source="gs JOIN snapshots s ON s.ts_ns >= gs.start_ns AND s.ts_ns < gs.end_ns")))
    if gc.cpu_in is not None:
        ev.append(Evidence(name="cpu_percent_in_gaps", value=gc.cpu_in, unit="% (snapshots inside the gaps)",
                           sql=gaps_one(gc.pid, gc.cls, "round(avg(s.cpu_percent), 1)", window, pids,
                                        source="gs JOIN snapshots s ON s.ts_ns >= gs.start_ns AND s.ts_ns < gs.end_ns")))
    if gc.gpu_out is not None:
        span = (f"SELECT min(ts_ns) AS lo, max(ts_ns + duration_ns) AS hi FROM cuda_calls "
                f"{where(f'pid = {gc.pid}', f'tid = {gc.tid}', ts_in(window))}")
        ev.append(Evidence(name="gpu_util_percent_outside_gaps", value=gc.gpu_out, unit="% (the thread's other snapshots)",
                           sql=tidy(f"WITH {gaps_cte(window, pids)}, span AS ({span}) SELECT round(avg(s.gpu_util_percent), 1) "
                                     f"FROM snapshots s, span WHERE s.ts_ns BETWEEN span.lo AND span.hi AND NOT EXISTS "
                                     f"(SELECT 1 FROM gs WHERE gs.pid = {gc.pid} AND s.ts_ns >= gs.start_ns AND s.ts_ns < gs.end_ns)")))
    g_cte = g_from_gs(gc.pid, gc.cls, window, pids)
    if pages_own:
        ev.append(Evidence(name=f"page_allocs {who} in gap buckets", value=pages_own, unit="pages (host_aggregates)",
                           sql=tidy(f"SELECT events FROM ({events_sql(str(gc.pid), g_cte)}) WHERE op = 'mm_page_alloc'")))
    if gc.children:
        ev.append(Evidence(name="children_on_cpu_in_gaps", value=kids_on, unit=f"ns of {kids_alive} ns alive ({kids_txt})",
                           sql=tidy(f"SELECT sum(greatest(0, alive - coalesce(off, 0))) FROM ({children_sql(gc.pid, g_cte)}) "
                                     "t(pid, comm, alive, off)")))
        if pages_k:
            kids = ", ".join(str(p) for p, *_ in gc.children)
            ev.append(Evidence(name="children_page_allocs_in_gap_buckets", value=pages_k, unit="pages (host_aggregates)",
                               sql=tidy(f"SELECT events FROM ({events_sql(kids, g_cte)}) WHERE op = 'mm_page_alloc'")))
    for t, op, k, ns in host_alloc[:1]:
        ev.append(Evidence(name=f"{op} on thread {t} inside gaps", value=ns, unit=f"ns ({k} calls)",
                           sql=tidy(f"WITH {g_cte} SELECT sum(least(c.ts_ns + c.duration_ns, g.end_ns) - greatest(c.ts_ns, g.start_ns)) "
                                     f"FROM cuda_calls c JOIN g ON c.ts_ns < g.end_ns AND c.ts_ns + c.duration_ns > g.start_ns "
                                     f"WHERE c.pid = {gc.pid} AND c.tid = {int(t)} AND c.op = '{op}'")))
    timeline = []
    for g in sorted(sorted(gc.gaps, key=lambda g: -g.gap_ns)[:5], key=lambda g: g.start_ns):
        timeline.append(TimelineEntry(ts_ns=g.start_ns, pid=gc.pid, tid=gc.tid, kind="gap", duration_ns=g.gap_ns,
                                      description=f"no CUDA call from {thread} {gc.tid} for {_s(g.gap_ns)}: on-CPU "
                                      f"{_pct(g.on_ns, g.gap_ns)}%, preempted {_pct(g.pre_ns, g.gap_ns)}%, blocked "
                                      f"{_pct(g.blk_ns, g.gap_ns)}%"))
    explanation = (f"{head}. Root cause: {title}, because " + "; ".join(because) + ". A gap is time between the end of "
                   f"one CUDA call of the thread and the start of its next, >= {MIN_GAP_NS // MS} ms; the GPU then runs only "
                   "what was queued before.")
    recs = rc.recommend(cause, numbers)
    if cause == rc.HOST_BOUND and pre >= 0.2 * total:
        recs += rc.recommend(rc.CPU_CONTENTION, numbers)[:1]
    return CausalChain(
        id=f"ingero-mcp:gpu-starvation:{gc.pid}:{gc.cls}", op="gpu-starvation", severity=severity,
        summary=f"{head} <- " + " <- ".join(short), root_cause=f"{cause}: {title}", explanation=explanation,
        count=n, pids=[gc.pid], evidence=ev, recommendations=recs, timeline=timeline,
    )
