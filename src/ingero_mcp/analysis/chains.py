"""Causal chains: a CUDA op with a heavy tail, tied to what happened to its slow calls, with a root cause.

For each op whose tail is heavy (p99/p50 >= 3 over >= 10 calls), whose worst calls are extreme
outliers, or whose copies run at low bandwidth, the engine takes its slow calls (>= p99) and asks
what their threads went through (per-call attribution, else the scheduler rows inside the calls),
what the host looked like at those moments (the snapshot at each slow call, not the peak of the
run), which processes competed for the CPUs in those buckets, whether another process was using
the GPU, and whether the slow calls were the process's first calls of the op. The root cause is
the explanation the evidence supports best; severity grows with the evidence's strength and the
time lost. GPU starvation, where the feeding thread makes no call at all, is found by gaps.py and ranked with
them; a driver call's chain is folded into the runtime call that encloses it. Own chains come first, then
imported ones (origin "ingero"), never mixed.
"""

from __future__ import annotations

from bisect import bisect_left
from dataclasses import dataclass, field

import duckdb

from ingero_mcp.analysis import chain_sql as q
from ingero_mcp.analysis import recommend as rc
from ingero_mcp.analysis._sql import has_rows, rows, table_complete, ts_in, where
from ingero_mcp.analysis.calls import CallGroup, call_groups
from ingero_mcp.analysis.gaps import find_gap_classes, gap_chain
from ingero_mcp.analysis.imported import imported_chains
from ingero_mcp.analysis.models import CausalChain, Evidence, TimelineEntry, TimeWindow
from ingero_mcp.analysis.stats import sample_note
from ingero_mcp.analysis.throughput import drop_chain, find_drops
from ingero_mcp.analysis.window import window_or_trace

MS = 1_000_000
MIN_CALLS = 10
TAIL_RATIO = 3.0
OUTLIER_RATIO = 100.0
OUTLIER_MIN_NS = 1 * MS
SLOW_MEMCPY_BPS = 8e9  # below this a large host<->device copy is not using pinned-memory bandwidth


@dataclass
class TopCall:
    """One of the longest slow calls of an op."""

    ts_ns: int
    duration_ns: int
    pid: int
    tid: int
    off_cpu_ns: int | None
    preempted_ns: int | None
    blocked_ns: int | None
    context_switches: int | None
    page_allocs: int | None
    bytes: int | None
    memcpy_kind: str | None
    cpu_percent: float | None = None  # the snapshot at the call
    gpu_util_percent: float | None = None
    calls_before: int | None = None  # calls of this op the process made before this one (capped)


@dataclass
class Candidate:
    """An op under suspicion and the evidence gathered about its slow calls."""

    group: CallGroup
    trigger: str  # 'tail', 'outlier', 'bandwidth'
    threshold_ns: int
    n: int = 0
    dur_ns: int = 0
    bytes: int | None = None
    attributed: int = 0
    off_cpu_ns: int = 0
    preempted_ns: int = 0
    blocked_ns: int = 0
    switches: int = 0
    pages: int = 0
    pids: list[int] = field(default_factory=list)
    n_snap: int = 0
    cpu_at_slow: float | None = None
    cpu_max_at_slow: float | None = None
    gpu_at_slow: float | None = None
    first_slow_ns: int = 0
    top: list[TopCall] = field(default_factory=list)
    sched: dict[str, int] = field(default_factory=dict)  # prev_state -> off-CPU ns inside the top calls
    sched_calls: int = 0
    preemptors: dict[int, list] = field(default_factory=dict)  # pid -> [comm, ns, intervals]
    competitors: list[tuple] = field(default_factory=list)  # (event, pid, comm, during, during_ns, overall, overall_ns)
    gpu_others: dict[int, list] = field(default_factory=dict)  # pid -> [calls, top calls hit, busy ns]
    gpu_hit: int = 0
    queued: list[tuple] = field(default_factory=list)  # (call ts, call ns, copy op, copy ts, copy ns, bytes, kind)
    cross: list[tuple] = field(default_factory=list)  # (tid, other op, top calls hit, overlap ns, first ts): same process

    @property
    def op(self) -> str:
        """The op under suspicion."""
        return self.group.op

    @property
    def top_ns(self) -> int:
        """Total duration of the longest slow calls examined one by one."""
        return sum(c.duration_ns for c in self.top)

    def top_rows(self) -> list[tuple[str, int, int, int, int]]:
        """The longest slow calls as (op, ts_ns, duration_ns, pid, tid), the rows chain_sql's batch queries take."""
        return [(self.op, t.ts_ns, t.duration_ns, t.pid, t.tid) for t in self.top]


def _candidates(groups: list[CallGroup]) -> list[Candidate]:
    out = []
    for g in groups:
        if g.pid is not None or g.count < MIN_CALLS or g.p50_ns <= 0:
            continue
        if g.p99_ns / g.p50_ns >= TAIL_RATIO:
            out.append(Candidate(g, "tail", g.p99_ns))
        elif g.max_ns >= OUTLIER_MIN_NS and g.max_ns / g.p50_ns >= OUTLIER_RATIO:
            out.append(Candidate(g, "outlier", max(g.p99_ns, 10 * g.p50_ns)))
        elif "emcpy" in g.op and g.bytes_total and g.total_ns and g.bytes_total / (g.total_ns / 1e9) < SLOW_MEMCPY_BPS \
                and g.bytes_total / g.count >= 1 << 20:
            out.append(Candidate(g, "bandwidth", g.p50_ns))
    return out


def _add_slow_copies(con: duckdb.DuckDBPyConnection, groups: list[CallGroup], cands: list[Candidate],
                     window: TimeWindow | None, pids: list[int] | None) -> None:
    """Large copies whose slower half runs below pinned-memory bandwidth, though the op's total does not (fast
    pinned/async copies of the same op mixed in): a bandwidth candidate over the calls at or above the median."""
    taken = {c.op for c in cands}
    th = {g.op: g.p50_ns for g in groups if g.pid is None and g.op not in taken and "emcpy" in g.op and g.count >= MIN_CALLS
          and g.bytes_total and g.bytes_total / g.count >= 1 << 20 and g.p50_ns > 0}
    if not th:
        return
    by = {g.op: g for g in groups if g.pid is None}
    for op, nbytes, dur, n in rows(con, q.copy_bandwidth_sql(th, window, pids)):
        if nbytes and dur and nbytes / (dur / 1e9) < SLOW_MEMCPY_BPS and nbytes / n >= 1 << 20:
            cands.append(Candidate(by[op], "bandwidth", th[op]))


def _gather(con: duckdb.DuckDBPyConnection, cands: list[Candidate], window: TimeWindow | None,
            pids: list[int] | None, several_gpu_pids: bool) -> None:
    by_op = {c.op: c for c in cands}
    th = {c.op: c.threshold_ns for c in cands}
    for (op, n, dur, nbytes, attributed, off, pre, blk, cs, pages, spids, _ntids, nsnap, cpu, cpu_max, gpu,
         first, _last) in rows(con, q.summary_sql(th, window, pids)):
        c = by_op[op]
        c.n, c.dur_ns, c.bytes, c.attributed = int(n), int(dur), None if nbytes is None else int(nbytes), int(attributed)
        c.off_cpu_ns, c.preempted_ns, c.blocked_ns = int(off or 0), int(pre or 0), int(blk or 0)
        c.switches, c.pages, c.pids = int(cs or 0), int(pages or 0), [int(p) for p in spids]
        c.n_snap, c.cpu_at_slow, c.cpu_max_at_slow, c.gpu_at_slow = int(nsnap), cpu, cpu_max, gpu
        c.first_slow_ns = int(first)
    for op, ts, dur, pid, tid, off, pre, blk, cs, pages, nbytes, kind, cpu, gpu in rows(con, q.top_sql(th, window, pids)):
        by_op[op].top.append(TopCall(int(ts), int(dur), int(pid), int(tid), off, pre, blk, cs, pages, nbytes, kind, cpu, gpu))
    cands[:] = [c for c in cands if c.top]
    if not cands:
        return
    # Were the slow calls the process's first calls of the op?
    firsts = {(int(p), op): list(ts) for p, op, ts in rows(con, q.first_calls_sql(sorted(by_op), pids))}
    for c in cands:
        for call in c.top:
            first = firsts.get((call.pid, c.op), [])
            before = bisect_left(first, call.ts_ns)
            call.calls_before = before if before < len(first) or len(first) < q.FIRST_M else None
    top = [row for c in cands for row in c.top_rows()]
    if has_rows(con, "sched_intervals"):
        for op, state, ppid, pcomm, n_int, overlap, calls_hit in rows(con, q.sched_overlap_sql(top)):
            c = by_op[op]
            c.sched[state] = c.sched.get(state, 0) + int(overlap)
            c.sched_calls = max(c.sched_calls, int(calls_hit))
            if state == "preempted" and ppid is not None:
                entry = c.preemptors.setdefault(int(ppid), [pcomm, 0, 0])
                entry[1] += int(overlap)
                entry[2] += int(n_int)
    if has_rows(con, "host_aggregates", "op IN ('sched_switch', 'mm_page_alloc')"):
        for chain_op, event, pid, comm, during, during_ns, overall, overall_ns in rows(con, q.competitors_sql(top, window)):
            by_op[chain_op].competitors.append(
                (event, int(pid), comm, int(during), int(during_ns), int(overall), int(overall_ns))
            )
    if several_gpu_pids:
        for op, pid, n_calls, hit, busy in rows(con, q.gpu_others_sql(top)):
            if pid is None:
                by_op[op].gpu_hit = int(hit)
            else:
                by_op[op].gpu_others[int(pid)] = [int(n_calls), int(hit), int(busy or 0)]


def _pct(part: float, whole: float) -> float:
    return round(100.0 * part / whole, 1) if whole else 0.0


def _ms(ns: float) -> str:
    return f"{ns / MS:,.2f}"


def _cpus(con: duckdb.DuckDBPyConnection) -> int | None:
    return rows(con, "SELECT max(cpu_count) FROM sessions")[0][0]


def _names(con: duckdb.DuckDBPyConnection) -> dict[int, str]:
    got = rows(con, "SELECT pid, any_value(comm) FROM processes WHERE comm IS NOT NULL GROUP BY pid")
    return {int(p): c for p, c in got}


@dataclass
class _Verdict:
    cause: str
    title: str
    strength: float
    lost_ns: int
    because: list[str]
    numbers: dict[str, object]
    short: list[str] = field(default_factory=list)  # the links of the one-line summary


def _classify(c: Candidate, cpus: int | None, cpu_mean: float | None, gpu_mean: float | None,
              names: dict[int, str], sampled: bool, has_sched: bool = False, sched_sampled: bool = False) -> _Verdict:
    """The root cause the evidence supports best, tested in order: cold start, CPU contention, page-allocation
    storm, memcpy bandwidth (CPU-staged when the thread stays on-CPU), GPU shared with another process, driver lock
    (blocked while another thread of the process was inside a CUDA call: `c.cross`, filled only for blocked verdicts),
    blocked; a sync waiting for the copy queued just before it (`c.queued`, filled only for unexplained syncs);
    else unexplained."""
    g = c.group
    numbers: dict[str, object] = {**rc.slow_call_words(c.op), "op": c.op, "cpus": cpus or "?", "cpu_mean": cpu_mean, "gpu_mean": gpu_mean,
                                  "cpu_at_slow": None if c.cpu_at_slow is None else round(c.cpu_at_slow, 1),
                                  "gpu_at_slow": None if c.gpu_at_slow is None else round(c.gpu_at_slow, 1)}
    # What the calling threads went through: per-call attribution when every slow call has it,
    # else the scheduler rows inside the longest slow calls.
    if c.attributed and c.attributed == c.n:
        base, pre, blk, off, unknown = c.dur_ns, c.preempted_ns, c.blocked_ns, c.off_cpu_ns, 0
        source = "per-call attribution"
    else:
        base = c.top_ns
        pre, blk, unknown = c.sched.get("preempted", 0), c.sched.get("blocked", 0), c.sched.get("unknown", 0)
        off = pre + blk + unknown
        source = "scheduler rows inside the calls"
    weak = source != "per-call attribution" and (sched_sampled or unknown > 0)  # rows are a sample / no prev_state
    pre_s, blk_s, off_s = (pre / base, blk / base, off / base) if base else (0.0, 0.0, 0.0)
    numbers.update(preempted_pct=_pct(pre, base), blocked_pct=_pct(blk, base), off_cpu_pct=_pct(off, base))
    slowest = c.top[0]
    numbers.update(slowest_ms=_ms(slowest.duration_ns), pid=slowest.pid,
                   call_index=(slowest.calls_before + 1) if slowest.calls_before is not None else "?",
                   first_slow=c.first_slow_ns)
    # Start-up: slow calls among the process's first calls of the op.
    cold_limit = {}
    for t in c.top:
        cold_limit[t.pid] = cold_limit.get(t.pid, 0) + 1
    cold = [t for t in c.top if t.calls_before is not None and t.calls_before < min(q.FIRST_M, max(3, 2 * cold_limit[t.pid]))]
    cold_ns = sum(t.duration_ns for t in cold)
    cold_s = cold_ns / c.top_ns if c.top_ns else 0.0
    others = [(p, v) for p, v in sorted(c.gpu_others.items(), key=lambda kv: -kv[1][2])]
    shared_s = c.gpu_hit / len(c.top) if c.top else 0.0
    pages_per_call = c.pages / c.n if c.n and c.attributed else 0.0
    rest = g.count - c.n
    pages_all = max(0, (g.page_allocs or 0) - c.pages) / rest if rest > 0 else 0.0  # the other calls of the op
    numbers.update(pages_per_call=round(pages_per_call), pages_per_call_all=round(pages_all, 1))
    bw = c.bytes / (c.dur_ns / 1e9) if c.bytes and c.dur_ns else None
    per_call = c.bytes / c.n if c.bytes and c.n else 0
    numbers.update(bandwidth_gbs=None if bw is None else round(bw / 1e9, 2), gb_per_call=round(per_call / 1e9, 3))
    comp = _top_competitors(c, names)
    numbers["competitors"] = ", ".join(f"{n}[{p}]" for p, n, _ in comp[:3]) or "other tasks"
    numbers["others"] = ", ".join(f"{names.get(p, '?')}[{p}]" for p, _ in others[:3]) or "none"
    numbers["during"] = f"during {_pct(c.gpu_hit, len(c.top))}% of the slow {c.op} calls"
    lost = max(0, c.dur_ns - c.n * g.p50_ns)
    because: list[str] = []
    stored = "stored " if sampled else ""
    if c.trigger != "bandwidth" and cold_s >= 0.5:
        which = (f"pid {slowest.pid}'s first {stored}{c.op} call" if slowest.calls_before == 0
                 else f"call #{numbers['call_index']} of {c.op} {stored}by pid {slowest.pid}")
        lead = f"one {_ms(slowest.duration_ns)} ms call, {which}" if c.n == 1 else (
            f"the slowest call ({_ms(slowest.duration_ns)} ms) was {which}; {len(cold)} of the {len(c.top)} longest "
            f"slow calls were among the process's first {stored}calls of the op ({_pct(cold_ns, c.top_ns)}% of their time)")
        because.append(lead)
        if c.attributed and c.attributed == c.n:
            if off_s < 0.25:
                because.append(f"the thread was off-CPU only {_pct(off, base)}% of that time (per-call attribution): "
                               "not CPU contention")
        elif c.sched or has_sched:
            because.append(f"the thread's scheduler rows inside the call{'s' if c.n > 1 else ''} add up to "
                           f"{_pct(off, base)}% of its time" + (" (sched_intervals holds a sample)" if sched_sampled else "")
                           + (": not CPU contention" if off_s < 0.25 else ""))
        if c.cpu_at_slow is not None and c.cpu_at_slow < 90:
            because.append(f"CPU was {c.cpu_at_slow:.1f}% in the snapshot at the slow call{'s' if c.n > 1 else ''}")
        short = [f"one {_ms(slowest.duration_ns)} ms call: {which}" if c.n == 1 else
                 f"{len(cold)} of the {len(c.top)} slowest calls are pid {slowest.pid}'s first {stored}calls of the op "
                 f"(slowest {_ms(slowest.duration_ns)} ms: {which})",
                 "cold start" + (
                     (f", not CPU contention (off-CPU {_pct(off, base)}% of the call{'s' if c.n > 1 else ''} in the stored "
                      "scheduler rows" + (f"; CPU {c.cpu_at_slow:.0f}% then)" if c.cpu_at_slow is not None else ")")) if weak
                     else f", not CPU contention (off-CPU {_pct(off, base)}%)") if base and off_s < 0.25 else ""]
        return _Verdict(rc.COLD_START, "cold start (the process's first calls)", cold_s, cold_ns, because, numbers, short)
    if pre_s >= 0.25:
        because.append(f"the calling thread was runnable but not running (preempted) {_pct(pre, base)}% of the slow "
                       f"calls' time ({source})")
        if comp:
            because.append("competing for the CPUs then: " + ", ".join(f"{n}[{p}] ({w})" for p, n, w in comp[:4]))
        short = [f"calling thread preempted (runnable, not running) {_pct(pre, base)}% of the slow calls' time",
                 f"CPU taken by {_group_names(comp)}" + (f" on {cpus} CPUs" if cpus else "")
                 + (f" (CPU {c.cpu_at_slow:.0f}% at the slow calls)" if c.cpu_at_slow is not None else "")]
        return _Verdict(rc.CPU_CONTENTION, "CPU contention: the calling thread was preempted", pre_s, lost, because, numbers, short)
    if c.trigger == "bandwidth" and not (bw is not None and bw < SLOW_MEMCPY_BPS):
        return _Verdict(rc.UNEXPLAINED, "", 0.0, 0, [], numbers)  # only a bandwidth question was asked
    if pages_per_call >= 1024 and pages_per_call >= 3 * max(pages_all, 1.0):
        because.append(f"{round(pages_per_call):,} page allocations per slow call ({pages_per_call * 4096 / 2**20:,.0f} MiB) "
                       f"vs {pages_all:,.1f} per other call of the op")
        short = [f"{round(pages_per_call):,} page allocations per slow call vs {pages_all:,.1f} per other call",
                 "page-allocation storm (allocator pool refilled)"]
        return _Verdict(rc.PAGE_ALLOC_STORM, "page-allocation storm during the calls", min(1.0, 0.5 + pages_per_call / 20000),
                        lost, because, numbers, short)
    if bw is not None and "emcpy" in c.op and per_call >= 1 << 20 and bw < SLOW_MEMCPY_BPS:
        because.append(f"the slow copies moved {per_call / 1e9:.3f} GB each at {bw / 1e9:.2f} GB/s, well below what "
                       f"pinned host memory reaches over PCIe (12-25 GB/s): the speed of pageable copies")
        staged = bool(base) and not weak and c.attributed == c.n and off_s < 0.25
        if staged:
            because.append(f"the calling thread was on-CPU {_pct(base - off, base)}% of the copies' "
                           f"{_ms(c.dur_ns)} ms (per-call attribution: off-CPU {_pct(off, base)}%): the CPU itself was staging "
                           "pageable memory through the driver's pinned bounce buffer, the copy is not a DMA from pinned memory")
        elif base and not weak:
            because.append(f"preempted only {_pct(pre, base)}% of the time: the copy itself is the cost")
        numbers.update(on_cpu_pct=_pct(base - off, base) if base else "?", bytes_total=f"{c.bytes:,}",
                       copies_ms=_ms(c.dur_ns), copies=c.n)
        short = [f"{per_call / 1e9:.3f} GB copies at {bw / 1e9:.2f} GB/s",
                 (f"thread on-CPU {_pct(base - off, base)}% during the copies: the CPU staging pageable memory" if staged else
                  "pageable-memory copy bandwidth" + (f", not CPU contention (preempted {_pct(pre, base)}%)"
                                                      if base and pre_s < 0.25 and not weak else ""))]
        return _Verdict(rc.MEMCPY_BANDWIDTH, "memcpy bandwidth: large copies below pinned-memory speed",
                        1.0 if bw < 4e9 else 0.6, lost if c.trigger != "bandwidth" else g.total_ns, because, numbers, short)
    if blk_s >= 0.5 and shared_s >= 0.5:
        because.append(f"the thread slept (blocked) {_pct(blk, base)}% of the slow calls' time, and another process "
                       f"made CUDA calls during {_pct(c.gpu_hit, len(c.top))}% of them: {numbers['others']}")
        if c.gpu_at_slow is not None:
            because.append(f"GPU utilisation at the slow calls {c.gpu_at_slow:.1f}% vs {gpu_mean}% over the trace")
        short = [f"calling thread blocked (waiting) {_pct(blk, base)}% of the slow calls' time",
                 f"{numbers['others']} using the GPU during {_pct(c.gpu_hit, len(c.top))}% of them"
                 + (f" (GPU {c.gpu_at_slow:.0f}% then)" if c.gpu_at_slow is not None else "")]
        return _Verdict(rc.GPU_SHARED, "the GPU is shared with another process", min(blk_s, shared_s), lost, because, numbers, short)
    if blk_s >= 0.5 and c.cross and c.cross[0][3] >= 0.5 * c.top_ns:
        tid, other, hit, overlap, first = c.cross[0]
        nested = [x[1] for x in c.cross[1:] if x[0] == tid and x[3] >= 0.99 * overlap and x[1] != other]
        what = other + (f" ({nested[0]})" if nested else "")
        numbers.update(other_op=what, other_tid=tid, overlap_ms=_ms(overlap), overlap_pct=_pct(overlap, c.top_ns),
                       top_ms=_ms(c.top_ns), s_plural="s" if len(c.top) != 1 else "")
        because.append(f"the thread slept (blocked) {_pct(blk, base)}% of the slow calls' time ({source})")
        because.append(f"during {_pct(overlap, c.top_ns)}% of the {len(c.top)} longest slow call{'s' if len(c.top) != 1 else ''} "
                       f"({_ms(overlap)} of {_ms(c.top_ns)} ms) thread {tid} of the same process was inside {what}: "
                       "the CUDA driver serialises such calls under a context lock, so the call waited for it")
        short = [f"calling thread blocked (sleeping) {_pct(blk, base)}% of the slow calls' time",
                 f"waited behind {what} on thread {tid} ({_pct(overlap, c.top_ns)}% overlap: driver lock)"]
        return _Verdict(rc.DRIVER_LOCK, f"waited behind {what} on thread {tid} (driver lock)", min(blk_s, overlap / c.top_ns),
                        lost, because, numbers, short)
    if blk_s >= 0.5:
        because.append(f"the thread slept (blocked) {_pct(blk, base)}% of the slow calls' time: waiting on the GPU, "
                       "a lock or IO, not on a CPU")
        short = [f"calling thread blocked (sleeping) {_pct(blk, base)}% of the slow calls' time", "waiting on the GPU, a lock or IO"]
        return _Verdict(rc.BLOCKED, "blocked: the thread waits (GPU, lock or IO)", blk_s, lost, because, numbers, short)
    queued_ns = sum(r[1] for r in c.queued)
    if c.queued and queued_ns >= 0.5 * c.top_ns and off_s < 0.5:
        slow_q = max(c.queued, key=lambda r: r[1])
        ts, dur, cop, cts, cdur, nbytes, kind = slow_q
        gbs = nbytes / ((ts + dur - cts) / 1e9) / 1e9 if ts + dur > cts else 0.0
        numbers.update(copy_op=cop, copy_bytes=f"{nbytes:,}", copy_kind=kind or "", copy_gbs=round(gbs, 2),
                       copy_call_ms=_ms(cdur), slowest_ms=_ms(dur), queued_pct=_pct(queued_ns, c.top_ns))
        because.append(f"{_pct(queued_ns, c.top_ns)}% of the longest slow calls' time was spent waiting for a copy the thread "
                       f"had queued just before: the slowest ({_ms(dur)} ms) followed a {nbytes:,}-byte {kind or ''} {cop} that "
                       f"returned in {_ms(cdur)} ms, so the sync waited for the transfer itself ({gbs:.1f} GB/s from the copy's "
                       "start to the sync's end" + (", the speed of pinned memory" if gbs >= SLOW_MEMCPY_BPS / 1e9 else "") + ")")
        if base:
            because.append(f"the thread was off-CPU {_pct(off, base)}% of it ({source}): the host was not in the way")
        short = [f"waiting for the {nbytes / 1e6:,.0f} MB {kind or ''} {cop} queued just before it ({gbs:.1f} GB/s)",
                 "the transfer's own time on the GPU, not a host problem"]
        return _Verdict(rc.QUEUED_COPY, "the sync waits for the asynchronous copy queued just before it", 0.5, lost,
                        because, numbers, short)
    if not base or (not c.attributed and not c.sched):
        because.append("no per-call attribution and no scheduler rows inside the slow calls"
                       + (" (the store holds a sample)" if sampled else ""))
    else:
        because.append(f"off-CPU {_pct(off, base)}% of the slow calls' time ({source}); no start-up pattern, "
                       "no page-allocation burst")
    return _Verdict(rc.UNEXPLAINED, "not explained by host evidence", 0.0, lost, because, numbers,
                    ["not explained by host evidence: " + because[0]])


def _top_competitors(c: Candidate, names: dict[int, str]) -> list[tuple[int, str, str]]:
    """Other processes busiest on the CPUs during the slow calls: preemptors first, then sched_switch counts."""
    out: list[tuple[int, str, str]] = []
    for pid, (comm, ns, n) in sorted(c.preemptors.items(), key=lambda kv: -kv[1][1]):
        if pid in c.pids or pid == 0:
            continue
        out.append((pid, comm or names.get(pid, "?"), f"took the CPU {n} times, {_ms(ns)} ms"))
    seen = {p for p, _, _ in out}
    switches = [x for x in c.competitors if x[0] == "sched_switch" and x[1] not in c.pids and x[1] not in seen and x[1] != 0]
    for _, pid, comm, during, during_ns, overall, overall_ns in sorted(switches, key=lambda x: -x[3]):
        rate = during / (during_ns / 1e9) if during_ns else 0.0
        base = overall / (overall_ns / 1e9) if overall_ns else 0.0
        # background that switches as often as ever is not a competitor; a task busier then, or busy at all
        # when nothing better is known, is
        if rate >= 1.5 * base or (not c.preemptors and rate >= 100):
            out.append((pid, comm or names.get(pid, "?"), f"{rate:,.0f} switches/s then vs {base:,.0f}/s overall"))
    return out[:6]


def _group_names(comp: list[tuple[int, str, str]]) -> str:
    """'pt_data_worker x4, ffmpeg[8200]': competitors grouped by name."""
    by: dict[str, list[int]] = {}
    for pid, name, _ in comp:
        by.setdefault(name, []).append(pid)
    parts = [f"{n} x{len(p)}" if len(p) > 1 else f"{n}[{p[0]}]" for n, p in by.items()]
    return ", ".join(parts[:3]) or "other tasks"


def _severity(v: _Verdict, c: Candidate, span_ns: int) -> str:
    ratio = c.group.p99_ns / c.group.p50_ns if c.group.p50_ns else 0.0
    share = v.lost_ns / span_ns if span_ns else 0.0
    if v.cause == rc.QUEUED_COPY:
        return "LOW"
    if v.cause in (rc.COLD_START, rc.DRIVER_LOCK):
        return "HIGH" if share >= 0.05 else "MEDIUM" if share >= 0.005 else "LOW"
    if v.cause == rc.UNEXPLAINED:
        return "LOW"
    if v.cause == rc.MEMCPY_BANDWIDTH:
        op_share = c.group.total_ns / span_ns if span_ns else 0.0
        return "HIGH" if op_share >= 0.25 else "MEDIUM" if op_share >= 0.05 else "LOW"
    if v.strength >= 0.5 and (ratio >= 5 or share >= 0.05) and c.trigger == "tail":
        return "HIGH"
    if v.strength >= 0.25:
        return "MEDIUM"
    return "LOW"


def _evidence(c: Candidate, v: _Verdict, th: dict[str, int], window: TimeWindow | None,
              pids: list[int] | None) -> list[Evidence]:
    g, op = c.group, c.op
    ev = [
        Evidence(name="calls", value=g.count, sql=q.op_one(op, "count(*)", window, pids)),
        Evidence(name="p50", value=g.p50_ns, unit="ns", sql=q.op_one(op, "quantile_disc(duration_ns, 0.5)", window, pids)),
        Evidence(name="p99", value=g.p99_ns, unit="ns", sql=q.op_one(op, "quantile_disc(duration_ns, 0.99)", window, pids)),
        Evidence(name="max", value=g.max_ns, unit="ns", sql=q.op_one(op, "max(duration_ns)", window, pids)),
        Evidence(name="slow_calls", value=c.n, unit=f"calls >= {c.threshold_ns} ns", sql=q.slow_one(op, "count(*)", th, window, pids)),
        Evidence(name="slow_calls_time", value=c.dur_ns, unit="ns", sql=q.slow_one(op, "sum(duration_ns)", th, window, pids)),
    ]
    if c.attributed and c.attributed == c.n:
        for name, col in (("slow_calls_preempted", "cpu_wait_ns"), ("slow_calls_blocked", "sleep_ns"),
                          ("slow_calls_context_switches", "context_switches"), ("slow_calls_page_allocs", "page_allocs")):
            value = {"cpu_wait_ns": c.preempted_ns, "sleep_ns": c.blocked_ns, "context_switches": c.switches,
                     "page_allocs": c.pages}[col]
            ev.append(Evidence(name=name, value=value, unit="ns" if col.endswith("_ns") else "", sql=q.slow_one(op, f"sum({col})", th, window, pids)))
    elif c.top:
        ev.append(Evidence(name="longest_slow_calls_time", value=c.top_ns, unit=f"ns (the {len(c.top)} longest)",
                           sql=q.top_sum_one(op, "duration_ns", th, window, pids)))
        ev.append(Evidence(name="off_cpu_inside_longest_slow_calls", value=sum(c.sched.values()), unit="ns (scheduler rows)",
                           sql=q.sched_overlap_one(op, None, th, window, pids)))
        for state in ("preempted", "blocked"):
            if c.sched.get(state):
                ev.append(Evidence(name=f"{state}_inside_longest_slow_calls", value=c.sched[state], unit="ns",
                                   sql=q.sched_overlap_one(op, state, th, window, pids)))
    slowest = c.top[0]
    if slowest.calls_before is not None:
        ev.append(Evidence(name="calls_before_slowest", value=slowest.calls_before,
                           unit=f"earlier {op} calls by pid {slowest.pid} (slowest at {slowest.ts_ns})",
                           sql=q.calls_before_one(slowest.pid, op, slowest.ts_ns)))
    if c.cpu_at_slow is not None:
        ev.append(Evidence(name="cpu_percent_at_slow_calls", value=round(c.cpu_at_slow, 1), unit="% (mean of the snapshot at each slow call)",
                           sql=q.slow_one(op, "round(avg(snap.cpu_percent), 1)", th, window, pids, snapshots=True)))
    if c.gpu_at_slow is not None:
        ev.append(Evidence(name="gpu_util_percent_at_slow_calls", value=round(c.gpu_at_slow, 1), unit="%",
                           sql=q.slow_one(op, "round(avg(snap.gpu_util_percent), 1)", th, window, pids, snapshots=True)))
    if v.cause == rc.CPU_CONTENTION:
        for pid, (comm, ns, _) in sorted(c.preemptors.items(), key=lambda kv: -kv[1][1])[:3]:
            ev.append(Evidence(name=f"preempted_by {comm}[{pid}]", value=ns, unit="ns inside the longest slow calls",
                               sql=q.sched_overlap_one(op, "preempted", th, window, pids, preemptor=pid)))
        switches = [x for x in c.competitors if x[0] == "sched_switch" and x[1] not in c.pids and x[1] != 0]
        for _, pid, comm, during, *_ in sorted(switches, key=lambda x: -x[3])[:3]:
            ev.append(Evidence(name=f"context_switches {comm}[{pid}]", value=during,
                               unit="in the aggregate buckets of the longest slow calls",
                               sql=q.competitor_one(op, pid, "sched_switch", th, window, pids)))
    if v.cause == rc.QUEUED_COPY:
        ev.append(Evidence(name="bytes_queued_before_slowest", value=max(c.queued, key=lambda r: r[1])[5],
                           unit="bytes (the copy the slowest call waited for)", sql=q.queued_copy_one(op, th, window, pids)))
    if v.cause == rc.DRIVER_LOCK:
        tid, other, hit, overlap, _ = c.cross[0]
        ev.append(Evidence(name=f"overlap_with {other} on thread {tid}", value=overlap,
                           unit=f"ns of the {len(c.top)} longest slow calls ({hit} hit)",
                           sql=q.cross_thread_one(op, tid, other, th, window, pids)))
    if v.cause == rc.GPU_SHARED:
        ev.append(Evidence(name="longest_slow_calls_with_other_gpu_process", value=c.gpu_hit, unit=f"of {len(c.top)}",
                           sql=q.gpu_others_one(op, th, window, pids)))
    if v.cause == rc.MEMCPY_BANDWIDTH and c.bytes:
        ev.append(Evidence(name="slow_calls_bytes", value=c.bytes, unit="bytes", sql=q.slow_one(op, "sum(bytes)", th, window, pids)))
        ev.append(Evidence(name="slow_calls_bandwidth", value=round(c.bytes / (c.dur_ns / 1e9) / 1e9, 2), unit="GB/s",
                           sql=q.slow_one(op, "round(sum(bytes) / (sum(duration_ns) / 1e9) / 1e9, 2)", th, window, pids)))
    return ev


def _timeline(c: Candidate, names: dict[int, str]) -> list[TimelineEntry]:
    out = []
    for t in sorted(c.top[:5], key=lambda t: t.ts_ns):
        bits = []
        if t.preempted_ns is not None:
            bits.append(f"preempted {_ms(t.preempted_ns)} ms, blocked {_ms(t.blocked_ns or 0)} ms, "
                        f"{t.context_switches or 0} context switch{'' if t.context_switches == 1 else 'es'}")
        if t.page_allocs:
            bits.append(f"{t.page_allocs:,} page allocations")
        if t.bytes:
            bits.append(f"{t.bytes:,} bytes" + (f" {t.memcpy_kind}" if t.memcpy_kind else ""))
        if t.calls_before is not None and t.calls_before < 3:
            bits.append(f"call #{t.calls_before + 1} of {c.op} by this process")
        if t.cpu_percent is not None:
            bits.append(f"host CPU {t.cpu_percent:.0f}%" + (f", GPU {t.gpu_util_percent:.0f}%" if t.gpu_util_percent is not None else ""))
        who = names.get(t.pid, "?")
        out.append(TimelineEntry(ts_ns=t.ts_ns, pid=t.pid, tid=t.tid, kind="cuda", duration_ns=t.duration_ns,
                                 description=f"{c.op} took {_ms(t.duration_ns)} ms in {who}[{t.pid}]"
                                 + (": " + "; ".join(bits) if bits else "")))
    return out


def _add_context_events(con: duckdb.DuckDBPyConnection, chains: list[tuple[Candidate, CausalChain]], names: dict[int, str]) -> None:
    """The scheduler intervals inside the slowest call, and process events (fork/exec/exit) of the competitors
    named in a chain, on its timeline."""
    for c, chain in chains:
        slowest = c.top[0]
        for off, length, state, ppid, pcomm in rows(con, q.inside_call_sql(slowest.pid, slowest.tid, slowest.ts_ns,
                                                                             slowest.ts_ns + slowest.duration_ns)):
            by = f" (CPU taken by {pcomm or names.get(int(ppid), '?')}[{ppid}])" if ppid is not None else ""
            chain.timeline.append(TimelineEntry(ts_ns=int(off), pid=slowest.pid, tid=slowest.tid, kind="sched",
                                                duration_ns=None if length is None else int(length),
                                                description=f"thread {slowest.tid} off-CPU ({state}) "
                                                f"{_ms(length or 0)} ms inside the slowest {c.op} call{by}"))
        chain.timeline.sort(key=lambda e: e.ts_ns)
        pids = [p for p, _, _ in _top_competitors(c, names)[:3]]
        if not pids:
            continue
        listed = ", ".join(str(p) for p in pids)
        got = rows(con, f"SELECT ts_ns, event, pid, child_pid, comm, filename FROM process_events "
                        f"WHERE (pid IN ({listed}) AND event <> 'fork') OR child_pid IN ({listed}) ORDER BY ts_ns LIMIT 6")
        for ts, event, pid, child, comm, fname in got:
            subject = child if event == "fork" else pid
            text = f"{event} {names.get(subject, comm or '?')}[{subject}]" + (f" {fname}" if fname else "")
            chain.timeline.append(TimelineEntry(ts_ns=int(ts), pid=int(pid), kind="process", description=text))
        chain.timeline.sort(key=lambda e: e.ts_ns)


def _summary(c: Candidate, v: _Verdict, sampled: bool) -> str:
    g = c.group
    ratio = g.p99_ns / g.p50_ns if g.p50_ns else 0.0
    head = f"{c.op} p99 {_ms(g.p99_ns)} ms ({ratio:,.1f}x p50 {_ms(g.p50_ns)} ms, max {_ms(g.max_ns)} ms, {g.count:,} calls"
    head += ", stored sample)" if sampled else ")"
    return f"{head} <- " + " <- ".join(v.short or [v.title])


def _fold_nested(own: list[tuple[Candidate, CausalChain]]) -> set[str]:
    """Drop a driver-API chain whose slowest call runs inside the slowest call of a runtime-API chain with the same
    root cause (cudaMemcpyAsync calls cuMemcpyHtoDAsync_v2: one slow copy, not two); say so in the kept chain."""
    folded: set[str] = set()
    for cd, chd in list(own):
        if cd.group.api != "driver":
            continue
        d = cd.top[0]
        for cr, chr_ in own:
            r = cr.top[0]
            if cr.group.api == "runtime" and chr_.root_cause.split(":")[0] == chd.root_cause.split(":")[0] \
                    and (r.pid, r.tid) == (d.pid, d.tid) and r.ts_ns <= d.ts_ns \
                    and d.ts_ns + d.duration_ns <= r.ts_ns + r.duration_ns:
                chr_.explanation += (f" The driver call {cd.op} runs inside these calls (same thread, nested: its slowest "
                                     f"call, {_ms(d.duration_ns)} ms, lies within this op's slowest) and has the same cause; "
                                     "it is not reported separately.")
                own.remove((cd, chd))
                folded.add(cd.op)
                break
    return folded


def causal_chains(
    con: duckdb.DuckDBPyConnection,
    window: TimeWindow | None = None,
    pids: list[int] | None = None,
    *,
    groups: list[CallGroup] | None = None,
) -> list[CausalChain]:
    """Own chains (strongest first), then the imported ones."""
    groups = call_groups(con, window, pids) if groups is None else groups
    whole = window_or_trace(con, window)
    span = whole.duration_ns
    cands = _candidates(groups)
    _add_slow_copies(con, groups, cands, window, pids)
    calls_seen = any(g.pid is not None for g in groups)
    names, cpus = (_names(con), _cpus(con)) if cands or calls_seen else ({}, None)
    own: list[tuple[Candidate, CausalChain]] = []
    if cands:
        gpu_pids = {g.pid for g in groups if g.pid is not None}
        _gather(con, cands, window, pids, len(gpu_pids) > 1)
        sampled = not table_complete(con, "cuda_calls")
        note = sample_note(con) if sampled else ""
        cpu_mean, gpu_mean = rows(con, "SELECT round(avg(cpu_percent), 1), round(avg(gpu_util_percent), 1) FROM snapshots "
                                       f"{where(ts_in(window))}")[0]
        th = {c.op: c.threshold_ns for c in cands}
        has_sched = has_rows(con, "sched_intervals")
        sched_sampled = not table_complete(con, "sched_intervals")
        for c in cands:
            v = _classify(c, cpus, cpu_mean, gpu_mean, names, sampled, has_sched, sched_sampled)
            if v.cause == rc.BLOCKED:  # was another thread of the process inside a CUDA call all along? (asked only now)
                c.cross = [(int(tid), other, int(hit), int(overlap), int(first))
                           for _, tid, other, hit, overlap, first in rows(con, q.cross_thread_sql(c.top_rows()))]
                if c.cross:
                    v = _classify(c, cpus, cpu_mean, gpu_mean, names, sampled, has_sched, sched_sampled)
            if v.cause == rc.UNEXPLAINED and "ynchronize" in c.op:  # waiting for a copy queued just before?
                c.queued = [tuple(int(x) if isinstance(x, int) else x for x in r[1:])
                            for r in rows(con, q.queued_copy_sql(c.top_rows()))]
                if c.queued:
                    v = _classify(c, cpus, cpu_mean, gpu_mean, names, sampled, has_sched, sched_sampled)
            if not v.title:
                continue
            g = c.group
            explanation = (
                f"{c.n:,} slow {c.op} call{'s' if c.n != 1 else ''} (>= {_ms(c.threshold_ns)} ms, the "
                f"{'p99' if c.trigger == 'tail' else 'outlier threshold' if c.trigger == 'outlier' else 'median'}) "
                f"took {_ms(c.dur_ns)} ms in all. Root cause: {v.title}, because " + "; ".join(v.because) + "."
            )
            if sampled:
                explanation += f" Note: {note}."
            chain = CausalChain(
                id=f"ingero-mcp:{c.op}", op=c.op, severity=_severity(v, c, span), summary=_summary(c, v, sampled),
                root_cause=f"{v.cause}: {v.title}", explanation=explanation, count=g.count, p50_ns=g.p50_ns,
                p99_ns=g.p99_ns, max_ns=g.max_ns, tail_ratio=round(g.p99_ns / g.p50_ns, 1) if g.p50_ns else None,
                pids=c.pids, evidence=_evidence(c, v, th, window, pids),
                recommendations=rc.recommend(v.cause, v.numbers), timeline=_timeline(c, names), from_sample=sampled,
            )
            own.append((c, chain))
        _add_context_events(con, own, names)
    folded = _fold_nested(own)
    rank = {"HIGH": 0, "MEDIUM": 1, "LOW": 2}
    ranked = [(c.dur_ns, ch) for c, ch in own]
    # GPU starvation: long gaps between the feeding thread's calls (time with no CUDA call at all).
    if calls_seen:
        ranked += [(gc.total_ns, gap_chain(gc, span, names, cpus, window, pids))
                   for gc in find_gap_classes(con, window, pids, span)]
    ordered = [ch for _, ch in sorted(ranked, key=lambda x: (rank[x[1].severity], -x[0]))]
    # Throughput drops of each process's busiest op that has no chain of its own yet.
    if calls_seen:
        per_op = {g.op: g for g in groups if g.pid is None}
        chained = {ch.op for ch in ordered} | folded
        busiest: dict[int, tuple[int, str]] = {}
        for g in groups:
            if g.pid is not None and g.count > busiest.get(g.pid, (0, ""))[0]:
                busiest[g.pid] = (g.count, g.op)
        for d in find_drops(con, window, whole.start_ns, span, busiest, chained):
            ordered.append(drop_chain(con, d, window, span, names, per_op.get(d.op), cpus=cpus))
        ordered.sort(key=lambda ch: rank[ch.severity])  # stable: tails before drops within a severity
    return ordered + imported_chains(con, window)
