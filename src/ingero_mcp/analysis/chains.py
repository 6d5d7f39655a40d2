"""Causal chains: the time accounting's causes (causes/), cold starts, then the imported chains.

Own chains are ranked by severity, then by the feeding time they explain (seconds lost); what
explains under 1 % of the feeding time goes to a one-line "minor" list. Imported chains (origin
"ingero") follow, as their origin wrote them. The per-op duration statistics stay in the report's
stats: a heavy tail is a fact, not a cause.
"""

from __future__ import annotations

import re

import duckdb

from ingero_mcp.analysis import recommend as rc
from ingero_mcp.analysis._sql import rows, sql_round, table_complete
from ingero_mcp.analysis.answers import shared_rows
from ingero_mcp.analysis.accounting import accounting, origin_ns, second_runs, thread_names
from ingero_mcp.analysis.calls import CallGroup
from ingero_mcp.analysis.models import PART_LABEL
from ingero_mcp.analysis.causes import accounting_chains, pace_threads
from ingero_mcp.analysis.imported import imported_chains
from ingero_mcp.analysis.models import SEVERITY_RANK, Accounting, CausalChain, Culprit, Evidence, TimeWindow
from ingero_mcp.analysis.window import window_or_trace

COLD_FACTOR = 10  # a first launch this many times the median launch counts as cold


# Both cold-start queries end the same way once `s` holds (pid, tid, call_class, start_ns, ns) of launches: the first
# launches that took COLD_FACTOR x the median repeat launch or more, per process. "A normal launch" is the median of
# the repeat launches in the process's first NORMAL_S seconds of launching: the median of every launch cost a sort of
# all of them (0.9 s at 10M events) and says the same of a loop that launches the same kernels all along.
NORMAL_S = 10
_COLD_TAIL = """f AS (SELECT pid, min(start_ns) AS f0 FROM s GROUP BY pid),
        m AS (SELECT pid, coalesce(median(ns) FILTER (WHERE call_class = 'launch' AND start_ns < f0 + {normal_ns}), 0)
                     AS median_ns, count(*) FILTER (WHERE call_class = 'launch_first') AS kernels
              FROM s JOIN f USING (pid) GROUP BY pid)
        SELECT s.pid, m.kernels, count(*) AS cold, sum(s.ns - m.median_ns)::BIGINT AS excess_ns,
               min(s.start_ns) AS first_ns, max(s.start_ns + s.ns) AS last_ns, max(s.ns) AS worst_ns,
               any_value(m.median_ns)::BIGINT AS median_ns, count(DISTINCT s.tid) AS threads
        FROM s JOIN m USING (pid)
        WHERE s.call_class = 'launch_first' AND s.ns >= {cold} * greatest(m.median_ns, 1000)
        GROUP BY s.pid, m.kernels ORDER BY excess_ns DESC"""


def cold_start_sql(window: TimeWindow, pids: list[int] | None = None) -> str:
    """Per process: its first launches of distinct kernels (call_spans.call_class 'launch_first') that took at
    least COLD_FACTOR x its median repeat launch, with the time they took beyond that median."""
    only = f"AND pid IN ({', '.join(str(int(p)) for p in pids)})" if pids else ""
    return " ".join(f"""
        WITH s AS (SELECT pid, tid, call_class, start_ns, end_ns - start_ns AS ns FROM call_spans
                   WHERE call_class IN ('launch', 'launch_first')
                     AND start_ns BETWEEN {window.start_ns} AND {window.end_ns} {only}),
        {_COLD_TAIL.format(cold=COLD_FACTOR, normal_ns=NORMAL_S * 1_000_000_000)}""".split())


def cold_start_bound_sql(window: TimeWindow, pids: list[int] | None = None) -> str:
    """cold_start_sql for launches probed entry-only (no duration): a launch's time is bounded above by the gap from its
    entry to the same thread's next CUDA call entry, used only where no launch-probe gap (probe_gaps) lies in between;
    and a first launch counts only inside the process's fully covered prefix (before the first probe gap after its
    first call: a launch seen after a gap may not be its kernel's first). Same columns as cold_start_sql, upper
    bounds."""
    only = f"AND pid IN ({', '.join(str(int(p)) for p in pids)})" if pids else ""
    return " ".join(f"""
        WITH g AS (SELECT session_id, start_ns, end_ns FROM probe_gaps WHERE probes = 'launch' AND end_ns > start_ns),
        n AS (SELECT session_id, pid, tid, ts_ns, op, kernel_handle, duration_ns,
                     lead(ts_ns) OVER (PARTITION BY pid, tid ORDER BY ts_ns) AS next_ns
              FROM cuda_calls WHERE TRUE {only}),
        firsts AS (SELECT pid, kernel_handle, min(ts_ns) AS ts_ns, TRUE AS first FROM cuda_calls
                   WHERE kernel_handle IS NOT NULL {only} GROUP BY ALL),
        cut AS (SELECT p.pid, min(g.start_ns) AS cut_ns
                FROM (SELECT session_id, pid, min(ts_ns) AS first_ns FROM cuda_calls GROUP BY ALL) p
                JOIN g ON g.session_id = p.session_id AND g.end_ns > p.first_ns GROUP BY p.pid),
        s AS (SELECT n.pid, n.tid, CASE WHEN f.first THEN 'launch_first' ELSE 'launch' END AS call_class,
                     n.ts_ns AS start_ns, n.next_ns - n.ts_ns AS ns
              FROM n LEFT JOIN firsts f USING (pid, kernel_handle, ts_ns) LEFT JOIN cut c USING (pid)
              WHERE contains(n.op, 'aunch') AND n.duration_ns IS NULL AND n.kernel_handle IS NOT NULL
                AND n.next_ns IS NOT NULL AND n.ts_ns BETWEEN {window.start_ns} AND {window.end_ns}
                AND NOT EXISTS (SELECT 1 FROM g WHERE g.session_id = n.session_id AND g.start_ns < n.next_ns
                                                  AND g.end_ns > n.ts_ns)
                AND (f.first IS NULL OR c.cut_ns IS NULL OR n.ts_ns < c.cut_ns)),
        {_COLD_TAIL.format(cold=COLD_FACTOR, normal_ns=NORMAL_S * 1_000_000_000)}""".split())


def uncovered_firsts_sql(pids: list[int] | None = None) -> str:
    """Per process with launch-probe gaps: distinct kernels whose first launch seen lies after the process's first
    probe gap (cold_start_bound_sql leaves them out: the real first launch may have been in a gap)."""
    only = f"AND pid IN ({', '.join(str(int(p)) for p in pids)})" if pids else ""
    return " ".join(f"""
        WITH g AS (SELECT session_id, start_ns, end_ns FROM probe_gaps WHERE probes = 'launch' AND end_ns > start_ns),
        cut AS (SELECT p.pid, min(g.start_ns) AS cut_ns
                FROM (SELECT session_id, pid, min(ts_ns) AS first_ns FROM cuda_calls WHERE TRUE {only} GROUP BY ALL) p
                JOIN g ON g.session_id = p.session_id AND g.end_ns > p.first_ns GROUP BY p.pid),
        firsts AS (SELECT pid, kernel_handle, min(ts_ns) AS ts_ns FROM cuda_calls WHERE kernel_handle IS NOT NULL {only}
                   GROUP BY ALL)
        SELECT f.pid, count(*) FILTER (WHERE f.ts_ns >= c.cut_ns) AS after_gap, count(*) AS kernels
        FROM firsts f JOIN cut c USING (pid) GROUP BY f.pid HAVING count(*) FILTER (WHERE f.ts_ns >= c.cut_ns) > 0
        ORDER BY f.pid""".split())


def cold_start_chains(con: duckdb.DuckDBPyConnection, window: TimeWindow, acc: Accounting,
                      pids: list[int] | None, minor: list[str] | None = None,
                      names: dict[int, str] | None = None) -> list[CausalChain]:
    """First launches of distinct kernels that were slow (lazy module loading): a fact of the rows, not a guess."""
    if not rows(con, "SELECT 1 FROM cuda_calls WHERE kernel_handle IS NOT NULL LIMIT 1"):
        return []
    names = thread_names(con) if names is None else names
    walls = {}
    for t in acc.threads:
        walls.setdefault(t.pid, t.busy_ns)  # the feeding time, idle waits for input left out
    out = []
    # v4 stores: launches entry-only, their durations unknown: bounded above by the gap to the thread's next call
    bound = acc.entry_only_launches
    sql = cold_start_bound_sql(window, pids) if bound else cold_start_sql(window, pids)
    took = "took up to" if bound else "took"
    upper = (" (upper bounds: launches were probed entry-only, so each is timed from its entry to the thread's next "
             "CUDA call, only where the launch probes stayed attached in between)") if bound else ""
    if bound and minor is not None:  # say what could not be judged rather than stay silent about it
        for pid, after, kernels in shared_rows(con, uncovered_firsts_sql(pids)):
            minor.append(f"{rc.COLD_START} (not assessable): {names.get(int(pid), '?')}[{pid}]: {after} of "
                         f"{kernels} distinct kernels were first seen after the launch probes' first gap (probe_gaps): "
                         "their real first launch may have been in a gap, so whether first launches of distinct "
                         "kernels were slow is not known")
    for pid, kernels, cold, excess, first, last, worst, median, threads in shared_rows(con, sql):
        wall = walls.get(int(pid)) or window.duration_ns or 1
        share = excess / wall
        if share < 0.01:
            if minor is not None:
                minor.append(f"{rc.COLD_START}: {names.get(int(pid), '?')}[{pid}]: {cold} of {kernels} "
                             f"first launches of distinct kernels were slow, {'up to ' if bound else ''}"
                             f"{excess / 1e9:.3f} s beyond a normal launch in all ({100 * share:.1f}% of the feeding "
                             f"time){upper}")
            continue
        severity = "HIGH" if share >= 0.25 else "MEDIUM" if share >= 0.05 else "LOW"
        if bound and severity == "HIGH":
            severity = "MEDIUM"  # sized by upper bounds only: never stated as the dominant cause
        who = f"{names.get(int(pid), '?')}[{pid}]"
        what = ("first-use costs at start: the module loaded on a kernel's first launch, and the host code's own first "
                "call of each operation, which an entry-only probe cannot tell apart" if bound else
                "kernel modules loaded on first use (lazy loading), a start-up cost")
        t0 = window.start_ns
        # launches of several threads overlap in time: their sum is thread time, which may exceed the span's wall time
        summed = f", summed over {threads} threads" if threads > 1 else ""
        out.append(CausalChain(
            id=f"{rc.COLD_START}:{pid}", op=rc.COLD_START, severity=severity, root_cause=rc.COLD_START,  # type: ignore[arg-type]
            summary=(f"{who}: {cold} first launches of distinct kernels {took} {excess / 1e9:.2f} s beyond a "
                     f"normal launch ({median / 1e6:.3f} ms){summed}, from +{(first - t0) / 1e9:.1f} s to "
                     f"+{(last - t0) / 1e9:.1f} s, the worst {worst / 1e6:.1f} ms: {what}{upper}"),
            explanation=("Each of these launches is the process's first launch of that kernel (the same "
                         "function handle is never launched before it in the trace), and each took at least "
                         f"{COLD_FACTOR}x the median repeat launch: CUDA loads a kernel's module on its first launch. "
                         f"{kernels} distinct kernels were launched in the window." + (" Launches were probed "
                         "entry-only: a launch's time is the gap from its entry to the same thread's next CUDA call "
                         "(an upper bound), and a first launch counts only before the first probe gap of the process "
                         "(after one, it may not be the first)." if bound else "")),
            seconds_lost=round(excess / 1e9, 3), window=TimeWindow(start_ns=int(first), end_ns=int(last)),
            pids=[int(pid)],
            evidence=[Evidence(name="slow first launches / distinct kernels", value=f"{cold} / {kernels}",
                               sql=f"SELECT cold || ' / ' || kernels FROM ({sql}) WHERE pid = {int(pid)}"),
                      Evidence(name="time beyond a normal launch", value=round(excess / 1e9, 3), unit="s",
                               sql=f"SELECT round(excess_ns / 1e9, 3) FROM ({sql}) WHERE pid = {int(pid)}")]
            + ([Evidence(name="threads whose first launches these are", value=int(threads),
                         sql=f"SELECT threads FROM ({sql}) WHERE pid = {int(pid)}")] if threads > 1 else []),
            recommendations=rc.recommend(rc.COLD_START, {"op": "cudaLaunchKernel", "slowest_ms": f"{worst / 1e6:.1f}",
                                                          "call_index": 1, "pid": pid}),
        ))
    return out


CHURN_MIN_PER_S = 10  # allocations/frees per second
CHURN_MIN_SHARE = 0.03  # of the thread's second spent in them


def churn_sql(pid: int, tid: int, window: TimeWindow, t0: int) -> str:
    """Per second: the device/host memory allocations and frees of a thread (call_spans.call_class 'alloc')."""
    return " ".join(f"""
        SELECT (start_ns - {t0}) // 1000000000 AS k, count(*) AS calls, sum(end_ns - start_ns)::BIGINT AS ns
        FROM call_spans WHERE pid = {int(pid)} AND tid = {int(tid)} AND call_class = 'alloc'
          AND start_ns BETWEEN {window.start_ns} AND {window.end_ns}
        GROUP BY ALL ORDER BY k""".split())


def _over_run(per_second_sql: str, run: list[int], what: str) -> str:
    """churn_sql's rows summed over a run of seconds: the calls a second, or the seconds in them."""
    secs = run[-1] - run[0] + 1
    value = f"round(sum(calls) / {secs}, 1)" if what == "calls" else "round(sum(ns) / 1e9, 3)"
    return (f"SELECT {value} AS {what}, {secs} AS stretch_s FROM ({per_second_sql}) "
            f"WHERE k BETWEEN {run[0]} AND {run[-1]}")


PINNING_OPS = re.compile(r"egister|Host")  # cudaHostRegister, cuMemHostRegister_v2, cudaHostAlloc, cuMemFreeHost...


def churn_ops_sql(pid: int, tid: int, w: TimeWindow) -> str:
    """A thread's allocation calls in a window by op: count and time, largest first."""
    return " ".join(f"""
        SELECT op, count(*) AS calls, sum(end_ns - start_ns)::BIGINT AS ns FROM call_spans
        WHERE pid = {int(pid)} AND tid = {int(tid)} AND call_class = 'alloc'
          AND start_ns BETWEEN {w.start_ns} AND {w.end_ns}
        GROUP BY op ORDER BY ns DESC, op""".split())


def churn_chains(con: duckdb.DuckDBPyConnection, window: TimeWindow, acc: Accounting,
                 names: dict[int, str] | None = None) -> list[CausalChain]:
    """Allocator churn: stretches of 2 s or more in which the job's pace thread allocated and freed memory at least
    CHURN_MIN_PER_S times a second, spending at least CHURN_MIN_SHARE of its time in those calls."""
    t0 = (acc.origin_ns if acc.origin_ns is not None else origin_ns(con)) or window.start_ns
    names = thread_names(con) if names is None else names
    out = []
    for rank, t in enumerate(pace_threads(acc)[:2]):
        sql = churn_sql(t.pid, t.tid, window, t0)
        per = {int(k): (int(n), int(ns)) for k, n, ns in shared_rows(con, sql)}
        hot = [k for k, (n, ns) in per.items() if n >= CHURN_MIN_PER_S and ns >= CHURN_MIN_SHARE * 1e9]
        for run in second_runs(hot):
            if run[-1] - run[0] + 1 < 2:
                continue
            calls = sum(per.get(k, (0, 0))[0] for k in range(run[0], run[-1] + 1))
            ns = sum(per.get(k, (0, 0))[1] for k in range(run[0], run[-1] + 1))
            secs = run[-1] - run[0] + 1
            share = ns / (secs * 1e9)
            severity = "HIGH" if share >= 0.25 else "MEDIUM" if share >= 0.05 else "LOW"
            if rank > 0 and severity == "HIGH":
                severity = "MEDIUM"
            w = TimeWindow(start_ns=t0 + run[0] * 1_000_000_000, end_ns=t0 + (run[-1] + 1) * 1_000_000_000)
            who = f"{t.process_comm or names.get(t.pid, '?')}[{t.pid}]'s " + ("main thread" if t.tid == t.pid
                                                                              else f"thread {t.tid}")
            osql = churn_ops_sql(t.pid, t.tid, w)
            ops = rows(con, osql)
            pin_ns = sum(int(o_ns) for op, _n, o_ns in ops if PINNING_OPS.search(str(op)))
            named = ", ".join(str(op) for op, _n, _ns in ops[:3])
            if ops and pin_ns >= 0.5 * sum(int(o_ns) for _op, _n, o_ns in ops):  # host memory locked and released
                what = (f"page-locked and released host memory {calls / secs:,.0f} times a second ({named})",
                        "pinning is slow: the driver locks (and unlocks) every page of the buffer each time")
                fixes = rc.recommend(rc.PINNING_FIX, {})
            else:
                what = (f"allocated and freed memory {calls / secs:,.0f} times a second ({named})",
                        "the caching allocator is being emptied and refilled (empty_cache(), changing shapes)")
                fixes = rc.recommend(rc.ALLOCATOR_CHURN, {})
            out.append(CausalChain(
                id=f"{rc.ALLOCATOR_CHURN}:{t.pid}/{t.tid}@{run[0]}s", op=rc.ALLOCATOR_CHURN, severity=severity,  # type: ignore[arg-type]
                root_cause=rc.ALLOCATOR_CHURN,
                summary=(f"{who} {what[0]} from +{run[0]:,.1f} s to +{run[-1] + 1:,.1f} s, {100 * share:.0f}% of its "
                         f"time in those calls ({ns / 1e9:.2f} s): {what[1]}"),
                explanation=("Read from the CUDA calls: memory allocations and frees (cudaMalloc/cudaFree and "
                             "the driver's cuMemAlloc/cuMemFree, host allocations and registrations) of the "
                             "thread, per second. PyTorch's caching allocators normally make them rare after warm-up."),
                seconds_lost=round(ns / 1e9, 3), window=w, pids=[t.pid],
                evidence=[Evidence(name="allocation and free calls a second over the stretch",
                                   value=sql_round(calls / secs, 1), unit="/s", sql=_over_run(sql, run, "calls")),
                          Evidence(name="the time in them over the stretch", value=sql_round(ns / 1e9, 3), unit="s",
                                   sql=_over_run(sql, run, "ns")),
                          Evidence(name="which calls (count, ns), largest first",
                                   value="; ".join(f"{op} {n} {o_ns}" for op, n, o_ns in ops[:5]), sql=osql)],
                recommendations=fixes,
            ))
    return out


LOCK_MIN_NS = 10_000_000  # a call at least this long, overlapping another thread's allocation call


def driver_lock_sql(pid: int, tid: int, window: TimeWindow) -> str:
    """The pace thread's calls of 10 ms or more that overlapped an allocation call (cudaHostAlloc, cuMemHostAlloc,
    cudaMalloc, cudaFree...) of 10 ms or more on another thread of the same process: the driver serialises them."""
    return " ".join(f"""
        WITH slow AS (SELECT start_ns, end_ns, op FROM call_spans
                      WHERE pid = {int(pid)} AND tid = {int(tid)} AND end_ns - start_ns >= {LOCK_MIN_NS}
                        AND start_ns BETWEEN {window.start_ns} AND {window.end_ns}),
        held AS (SELECT tid, start_ns, end_ns, op FROM call_spans
                 WHERE pid = {int(pid)} AND tid <> {int(tid)} AND call_class = 'alloc'
                   AND end_ns - start_ns >= {LOCK_MIN_NS})
        SELECT s.op, h.op AS other_op, h.tid AS other_tid, count(*) AS calls,
               sum(least(s.end_ns, h.end_ns) - greatest(s.start_ns, h.start_ns))::BIGINT AS overlap_ns,
               max(s.end_ns - s.start_ns)::BIGINT AS worst_ns, min(s.start_ns) AS first_ns, max(s.end_ns) AS last_ns
        FROM slow s JOIN held h ON h.start_ns < s.end_ns AND h.end_ns > s.start_ns
        GROUP BY ALL ORDER BY overlap_ns DESC""".split())


def driver_lock_chains(con: duckdb.DuckDBPyConnection, window: TimeWindow, acc: Accounting,
                       minor: list[str] | None, names: dict[int, str] | None = None) -> list[CausalChain]:
    """Slow calls of the pace thread that waited while another thread of the process allocated memory through the
    driver (pinned host memory above all): named with the other thread and its call."""
    names = thread_names(con) if names is None else names
    out = []
    for t in pace_threads(acc)[:2]:
        sql = driver_lock_sql(t.pid, t.tid, window)
        for op, other_op, other_tid, calls, overlap, worst, first, last in shared_rows(con, sql)[:3]:
            wall = t.total.wall_ns or 1
            who = f"{t.process_comm or names.get(t.pid, '?')}[{t.pid}]'s " + ("main thread" if t.tid == t.pid
                                                                              else f"thread {t.tid}")
            name = names.get(int(other_tid))
            other = f"{name}[{t.pid}/{other_tid}]" if name else f"thread {other_tid}"
            summary = (f"{who}: {calls} {op} call{'s' if calls != 1 else ''} (the longest {worst / 1e6:.1f} "
                       f"ms) ran while {other} was in {other_op} for {overlap / 1e6:.1f} ms of them: the driver "
                       "serialises memory allocation with launches and copies of the same context")
            share = overlap / wall
            if share < 0.01:
                if minor is not None:
                    minor.append(f"{rc.DRIVER_LOCK}: {summary} ({100 * share:.1f}% of the feeding time)")
                continue
            out.append(CausalChain(
                id=f"{rc.DRIVER_LOCK}:{t.pid}/{t.tid}", op=rc.DRIVER_LOCK, root_cause=rc.DRIVER_LOCK,
                severity="HIGH" if share >= 0.25 else "MEDIUM" if share >= 0.05 else "LOW",  # type: ignore[arg-type]
                summary=summary, seconds_lost=round(overlap / 1e9, 3), pids=[t.pid],
                window=TimeWindow(start_ns=int(first), end_ns=int(last)),
                culprits=[Culprit(pid=t.pid, tids=[int(other_tid)], comm=names.get(int(other_tid)),
                                  relation="same process", ns=int(overlap))],
                explanation=("Read from the CUDA calls: the slow calls of the thread that feeds the GPU "
                             "overlap, in time, an allocation call of another thread of the same process."),
                evidence=[Evidence(name="overlap with the other thread's allocation calls",
                                   value=round(overlap / 1e6, 1), unit="ms", sql=sql)],
                recommendations=rc.recommend(rc.DRIVER_LOCK, {"other": other, "other_op": other_op}),
            ))
    return out




_RUN_OUTSIDE = PART_LABEL["run_outside"]
_RUN_OUTSIDE_EO = _RUN_OUTSIDE.removesuffix(")") + "; incl. kernel launches, entry-only)"


def _say_entry_only(chain: CausalChain) -> CausalChain:
    """A chain of a store with entry-only launches: 'running outside CUDA calls' includes the launches."""
    return chain.model_copy(update={k: getattr(chain, k).replace(_RUN_OUTSIDE, _RUN_OUTSIDE_EO)
                                    for k in ("summary", "explanation") if getattr(chain, k)})


def causal_chains(
    con: duckdb.DuckDBPyConnection,
    window: TimeWindow | None = None,
    pids: list[int] | None = None,
    *,
    groups: list[CallGroup] | None = None,
    acc: Accounting | None = None,
    minor: list[str] | None = None,
    whole: TimeWindow | None = None,
) -> list[CausalChain]:
    """Own chains (severity, then seconds explained), then the imported ones. `minor` collects the small ones;
    `whole`: the window, or the trace's, where the caller has it (window_or_trace)."""
    del groups  # per-op statistics are the report's; chains read the accounting
    whole = window_or_trace(con, window) if whole is None else whole
    acc = accounting(con, window, pids) if acc is None else acc
    own: list[CausalChain] = []
    if acc.complete:
        names = acc.thread_names or thread_names(con)  # read by the accounting: every kind of chain names threads
        found, small = accounting_chains(con, acc, whole, names)
        if acc.entry_only_launches:  # the launches' time is in run_outside: the chains' label says so
            found = [_say_entry_only(c) for c in found]
            small = [m.replace(_RUN_OUTSIDE, _RUN_OUTSIDE_EO) for m in small]
        own += found
        if minor is not None:
            minor += small
        if table_complete(con, "cuda_calls"):
            extra = (cold_start_chains(con, whole, acc, pids, minor, names) + churn_chains(con, whole, acc, names)
                     + driver_lock_chains(con, whole, acc, minor, names))
            # the accounting's chains come ranked (the job first); these join by severity, then seconds
            for chain in sorted(extra, key=lambda c: -(c.seconds_lost or 0)):
                at = next((i for i, c in enumerate(own) if SEVERITY_RANK[c.severity] > SEVERITY_RANK[chain.severity]
                           or (SEVERITY_RANK[c.severity] == SEVERITY_RANK[chain.severity]
                               and (c.seconds_lost or 0) < (chain.seconds_lost or 0))),
                          len(own))
                own.insert(at, chain)
    elif acc.imported is not None:  # an import: its feeding threads accounted from their complete scheduler rows
        from ingero_mcp.analysis.imported_verdict import imported_accounting_chains

        own += imported_accounting_chains(con, acc.imported)
    seen: dict[str, int] = {}
    for c in own:  # ids are stable (cause:pid/tid@second); two findings of one cause in one second get a suffix
        seen[c.id] = seen.get(c.id, 0) + 1
        if seen[c.id] > 1:
            c.id = f"{c.id}#{seen[c.id]}"
    return own + imported_chains(con, window, acc.imported)
