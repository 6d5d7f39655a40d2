"""Explaining time in CUDA calls (which kind of call grew: copies, allocations, syncs, another GPU user) and time
running outside them (its own work, page faults, more calls per iteration).
"""

from __future__ import annotations

from collections import defaultdict

import duckdb

from ingero_mcp.analysis import recommend as rc
from ingero_mcp.analysis.accounting import SECOND_NS, gpu_util_sql
from ingero_mcp.analysis.answers import shared_rows
from ingero_mcp.analysis.causes.context import Ctx, Finding
from ingero_mcp.analysis.causes.culprits import HOST_WORK_SAMPLES, Explained, _culprit_names, busy_runners, host_work
from ingero_mcp.analysis.causes.culprits import ran_text
from ingero_mcp.analysis.causes.findings import _k_range
from ingero_mcp.analysis.drained import QUEUES, drained_gaps_sql
from ingero_mcp.analysis.models import Culprit, Evidence, TimeWindow
from ingero_mcp.analysis.progress import per_second_sql
from ingero_mcp.analysis.stacks import framework_share_sql, recorded

def call_class_sql(pid: int, tid: int, ks: tuple[int, int], t0: int) -> str:
    """In-call time of a thread by kind of call (call_spans.call_class) over seconds ks, with bytes moved."""
    lo, hi = t0 + ks[0] * SECOND_NS, t0 + (ks[1] + 1) * SECOND_NS
    return (f"SELECT call_class, count(*) AS spans, sum(least(end_ns, {hi}) - greatest(start_ns, {lo}))::BIGINT AS ns, "
            f"sum(bytes)::BIGINT AS bytes FROM call_spans WHERE pid = {pid} AND tid = {tid} "
            f"AND end_ns > {lo} AND start_ns < {hi} GROUP BY call_class ORDER BY ns DESC")


def baseline_class_sql(pid: int, tid: int, spans: list[tuple[int, int]], t0: int) -> str:
    """call_class_sql's in-call time by kind, summed over several spans of seconds in one query: each call span cut
    into the seconds it touches, those of the spans kept (a hash lookup; a range join over the windows was slower)."""
    ks = ", ".join(str(k) for a, b in spans for k in range(a, b + 1))
    return " ".join(f"""
        WITH c AS (SELECT call_class, start_ns, end_ns,
                          unnest(range((start_ns - {t0}) // {SECOND_NS},
                                       (greatest(end_ns, start_ns + 1) - 1 - {t0}) // {SECOND_NS} + 1)) AS k
                   FROM call_spans WHERE pid = {pid} AND tid = {tid})
        SELECT call_class,
               sum(least(end_ns, {t0} + (k + 1) * {SECOND_NS}) - greatest(start_ns, {t0} + k * {SECOND_NS}))::BIGINT
                   AS ns
        FROM c WHERE k IN ({ks}) GROUP BY call_class""".split())


def explain_in_calls(ctx: Ctx, f: Finding, baseline: list[TimeWindow]) -> Explained:
    """Time inside CUDA calls grew (or filled idle GPU time): which kind of call, and whether another process
    used the GPU meanwhile."""
    t = f.thread
    sql = call_class_sql(t.pid, t.tid, f.ks, ctx.t0)
    now = {r[0]: (int(r[1]), int(r[2] or 0), r[3]) for r in shared_rows(ctx.con, sql)}
    wall = max(1, (f.ks[1] - f.ks[0] + 1) * SECOND_NS)
    base: dict[str, int] = defaultdict(int)
    base_wall = 0
    spans = [_k_range(ctx, w) for w in baseline]
    base_wall = sum((b - a + 1) * SECOND_NS for a, b in spans)
    if spans:  # one query for every baseline window (short episodes cut the baseline into many), once per thread
        key = (t.pid, t.tid, tuple(spans))
        if key not in ctx.cache:
            ctx.cache[key] = shared_rows(ctx.con, baseline_class_sql(t.pid, t.tid, spans, ctx.t0))
        for r in ctx.cache[key]:
            base[r[0]] += int(r[1] or 0)
    # Contrast: the kind whose share grew against the baseline. Steady: the baseline is the same time seen whole
    # (the window lies inside it), so every growth is ~0 and the largest kind is the answer.
    growth = {c: v[1] / wall - (base[c] / base_wall if base_wall and f.mode == "contrast" else 0.0)
              for c, v in now.items()}
    top = max(growth, key=lambda c: growth[c]) if growth else "other"
    ev = [Evidence(name="time in CUDA calls by kind (share of the window)", value="; ".join(
        f"{c} {100 * v[1] / wall:.1f}%" + (f" (baseline {100 * base[c] / base_wall:.1f}%)" if base_wall else "")
        for c, v in sorted(now.items(), key=lambda kv: -kv[1][1])[:5]), sql=sql)]
    others = _other_gpu_users(ctx, t.pid, f)
    if others and top in ("sync", "launch", "other", "copy_pinned", "copy") and f.part in ("gpu_wait", "run_inside"):
        culprits, text, osql = others
        ev.append(Evidence(name="other processes' CUDA work in the window", value=text, sql=osql))
        return Explained(cause=rc.GPU_SHARED, culprits=culprits, evidence=ev,
                         reason=f"the GPU was shared with {_culprit_names(culprits, ctx)} ({text})")
    if top == "copy_pageable" or (top == "copy" and _slow_copies(now)):
        return _copies(ctx, f, top, now[top], wall, ev, sql)
    if top == "alloc" and f.startup:
        context = _context_creation(ctx, f, now["alloc"][1])
        if context:
            return context
    if top == "alloc":
        n, ns, _b = now["alloc"]
        return Explained(cause=rc.ALLOCATOR_CHURN, evidence=ev,
                         reason=f"{n} memory allocations and frees took {ns / 1e9:.2f} s ({100 * ns / wall:.0f}% "
                                "of the window)")
    if top == "launch_first":
        n, ns, _b = now["launch_first"]
        return Explained(cause=rc.COLD_START, evidence=ev,
                         reason=f"{n} first launches of distinct kernels took {ns / 1e9:.2f} s (module loading)")
    if top == "sync" or f.part == "gpu_wait":
        return Explained(cause=rc.GPU_SLOWER, evidence=ev, confident=False,
                         reason="its synchronising calls waited longer for the GPU, with no other process "
                                "seen using it: the GPU work per step grew, or a GPU user the tracer cannot see")
    return Explained(cause=rc.LAUNCH_OVERHEAD, evidence=ev,
                     reason=f"CPU time inside {top} calls")


def queued_copies_sql(pid: int, tid: int, call_class: str, lo: int, hi: int) -> str:
    """A thread's copies of `call_class` in [lo, hi) (their time clipped to it, as call_class_sql's): the time of
    those made with nothing queued on the GPU by the process since the thread's last synchronisation (clean_ns:
    waiting for nothing, their time is their own) and of the others (queued_ns: work launched, copied or set by any
    of its threads after that sync and before the copy, which the copy may have waited for)."""
    return " ".join(f"""
        WITH cp AS (SELECT start_ns, least(end_ns, {hi}) - greatest(start_ns, {lo}) AS ns FROM call_spans
                    WHERE pid = {pid} AND tid = {tid} AND call_class = '{call_class}' AND end_ns > {lo}
                      AND start_ns < {hi}),
        sy AS (SELECT ts_ns + coalesce(duration_ns, 0) AS done_ns FROM cuda_calls
               WHERE pid = {pid} AND tid = {tid} AND ts_ns < {hi} AND contains(op, 'Synchronize')
                 AND NOT contains(op, 'Event')),
        q AS (SELECT ts_ns AS queued_ns FROM cuda_calls
              WHERE pid = {pid} AND ts_ns < {hi}
                AND {QUEUES}),
        w AS (SELECT cp.start_ns, cp.ns, sy.done_ns FROM cp ASOF LEFT JOIN sy ON cp.start_ns >= sy.done_ns),
        z AS (SELECT w.ns, w.done_ns, q.queued_ns FROM w ASOF LEFT JOIN q ON w.start_ns > q.queued_ns)
        SELECT coalesce(sum(ns) FILTER (WHERE queued_ns IS NULL OR queued_ns < done_ns), 0)::BIGINT AS clean_ns,
               coalesce(sum(ns) FILTER (WHERE queued_ns >= done_ns OR queued_ns IS NOT NULL AND done_ns IS NULL),
                        0)::BIGINT AS queued_ns
        FROM z""".split())


def _copies(ctx: Ctx, f: Finding, top: str, got: tuple[int, int, object], wall: int, ev: list[Evidence],
            sql: str) -> Explained:
    """Copies between host and device that were slow (pageable, or of unrecorded kind at a low rate). A copy on the
    CPU also waits for the work queued before it on its stream, which pinned memory would not remove. A copy made
    with nothing queued by the process since its thread's last sync waited for nothing of its own; of the others,
    where the GPU's utilisation is known (NVML), no more than the GPU's busy time in the window was waiting: the
    copies' own time is at least the first plus the others less that, and the cause explains no more (a lower bound,
    said so)."""
    n, ns, nbytes = got
    gbs = (nbytes or 0) / ns if ns else 0.0
    pageable = top == "copy_pageable"
    reason = (f"{n} host<->device copies from pageable memory ({(nbytes or 0) / 1e9:.2f} GB at {gbs:.1f} GB/s)"
              if pageable else f"{n} host<->device copies at {gbs:.1f} GB/s (pinned or not: not recorded)")
    plain = Explained(cause=rc.PAGEABLE_COPIES, evidence=ev, confident=pageable, reason=reason,
                      numbers={"gbs": f"{gbs:.1f}"})
    kernels_ns = (f.gpu_util or 0.0) / 100 * wall
    if f.gpu_util is None or ns - kernels_ns >= f.seconds_lost * 1e9:  # unknown, or it covers what is explained
        return plain
    t = f.thread
    lo, hi = ctx.t0 + f.ks[0] * SECOND_NS, ctx.t0 + (f.ks[1] + 1) * SECOND_NS
    qsql = queued_copies_sql(t.pid, t.tid, top, lo, hi)
    clean_ns, queued_ns = (int(v) for v in shared_rows(ctx.con, qsql)[0])
    own_s = (clean_ns + max(0.0, queued_ns - kernels_ns)) / 1e9
    if own_s >= f.seconds_lost:
        return plain
    ev.append(Evidence(name="the copies' own time, at least: those with nothing queued since the thread's last sync, "
                            "and the others' time less the GPU's busy time in the window", value=round(own_s, 2),
                       unit="s", sql=(f"SELECT round((clean_ns + greatest(0, queued_ns - (SELECT avg(gpu_util_percent) "
                                      f"FROM ({gpu_util_sql()}) WHERE k BETWEEN {f.ks[0]} AND {f.ks[1]}) / 100 * "
                                      f"{hi - lo})) / 1e9, 2) FROM ({qsql})")))
    reason += (f"; at least {own_s:.2f} s of their {ns / 1e9:.2f} s the copies' own: {queued_ns / 1e9:.2f} s of them "
               f"came after work the process queued on the GPU, which a copy waits for on the CPU and pinned memory "
               f"would not remove, and the GPU was {f.gpu_util:.0f}% busy in the window (up to "
               f"{kernels_ns / 1e9:.2f} s of kernels)")
    return Explained(cause=rc.PAGEABLE_COPIES, evidence=ev, reason=reason, numbers={"gbs": f"{gbs:.1f}"},
                     confident=pageable and own_s * 1e9 >= 0.5 * ns, seconds=own_s)


def _context_creation(ctx: Ctx, f: Finding, alloc_ns: int) -> Explained | None:
    """At start-up, allocation time that is mostly the process's first CUDA call: the CUDA context created on first
    use (driver initialisation), a cold start, not the caching allocator churning."""
    sql = (f"SELECT op, ts_ns, round(duration_ns / 1e9, 3) AS s FROM cuda_calls WHERE pid = {f.thread.pid} "
           f"ORDER BY ts_ns LIMIT 1")
    got = shared_rows(ctx.con, sql)
    if not got or got[0][2] is None:
        return None
    op, ts, secs = got[0][0], int(got[0][1]), float(got[0][2])
    if not (f.window.start_ns <= ts < f.window.end_ns) or secs * 1e9 < 0.5 * alloc_ns:
        return None
    # the first recorded call: the collector may have attached after the process's own first call, hence 'likely'
    return Explained(cause=rc.COLD_START, numbers={"slowest_ms": f"{secs * 1e3:.0f}"}, confident=False,
                     evidence=[Evidence(name=f"the process's first recorded CUDA call ({op}), seconds", value=secs,
                                        unit="s", sql=f"SELECT s FROM ({sql})")],
                     reason=(f"its first recorded CUDA call ({op}) took {secs:.2f} s of it: likely the CUDA "
                             "context being created on first use (driver initialisation), a start-up cost"))


def _slow_copies(now: dict[str, tuple[int, int, object]]) -> bool:
    n, ns, nbytes = now.get("copy", (0, 0, None))
    return bool(nbytes) and ns > 0 and (nbytes or 0) / ns < 15.0 and (nbytes or 0) / max(n, 1) >= 1 << 20


def _other_gpu_users(ctx: Ctx, pid: int, f: Finding) -> tuple[list[Culprit], str, str] | None:
    fam = {pid}  # a child process with CUDA work of its own shares the GPU like any other process
    lo, hi = f.window.start_ns, f.window.end_ns
    # the process's name in the rows, so that the evidence's text (comm[pid] n CUDA calls) is recomputed by its SQL
    sql = (f"SELECT c.pid, (SELECT any_value(p.comm) FROM processes p WHERE p.pid = c.pid) AS comm, count(*) AS calls, "
           f"sum(duration_ns)::BIGINT AS in_calls_ns FROM cuda_calls c "
           f"WHERE ts_ns BETWEEN {lo} AND {hi} AND c.pid NOT IN ({', '.join(map(str, sorted(fam)))}) "
           f"GROUP BY c.pid ORDER BY calls DESC")
    got = [r for r in shared_rows(ctx.con, sql) if not ctx.is_collector(int(r[0]))]
    gsql = (f"SELECT pid, max(used_memory_bytes) AS mem, avg(sm_util_percent) AS sm FROM gpu_processes "
            f"WHERE ts_ns BETWEEN {lo} AND {hi} AND pid NOT IN ({', '.join(map(str, sorted(fam)))}) GROUP BY pid")
    try:
        nvml = [r for r in shared_rows(ctx.con, gsql) if not ctx.is_collector(int(r[0]))]
    except duckdb.Error:
        nvml = []
    if not got and not nvml:
        return None
    culprits = [Culprit(pid=int(p), tids=[], comm=ctx.procs.get(int(p), (None, None, None))[1],
                        relation=ctx.relation(pid, int(p), None, None), ns=int(ns or 0)) for p, _c, _n, ns in got[:3]]
    seen = {c.pid for c in culprits}
    culprits += [Culprit(pid=int(p), comm=ctx.procs.get(int(p), (None, None, None))[1] or "?", relation="other process")
                 for p, _m, _s in nvml if int(p) not in seen][:3]
    text = "; ".join(f"{c.comm or '?'}[{c.pid}] {n:,} CUDA calls"
                     for c, (_p, _c, n, _ns) in zip(culprits, got, strict=False))
    if nvml:
        text += ("; " if text else "") + "on the GPU per NVML: " + ", ".join(f"pid {int(p)}" for p, _m, _s in nvml[:3])
    return culprits, text, sql


# Fresh memory's cost at most: 4 KiB per 2 us (a minor fault's median is ~1 us; the staged page-fault storm's thread,
# 91% on its CPU, allocated 2 GB/s), zeroing and mapping included; huge pages cost less per byte.
ALLOC_BYTES_PER_S = 2e9
MORE_PER_ITERATION = 2.0  # launches+copies (or syncs) per iteration grew this many times: the work came in pieces


def per_iteration_sql(ctx: Ctx, pid: int, ks: list[tuple[int, int]], what: str) -> str | None:
    """A process's launches+copies ('work': thread_seconds.work_calls, launches scaled where the probes were detached)
    or synchronising calls ('sync': cuda_calls' synchronize ops) per iteration over spans of seconds (progress.py's
    marker counts the iterations); None without a marker."""
    marker = ctx.progress.get(pid)
    if marker is None or not ks:
        return None
    which = " OR ".join(f"k BETWEEN {a} AND {b}" for a, b in ks)
    if what == "work":
        num = f"SELECT sum(work_calls) FROM thread_seconds WHERE pid = {int(pid)} AND ({which})"
    else:  # 'sync', 'copy': host-device copies (cuMemcpy* HtoD / DtoH, cudaMemcpy*), 'read': those back to the host
        op = {"sync": "contains(op, 'ynchronize')", "read": "contains(op, 'emcpy') AND memcpy_kind = 'D2H'"}.get(
            what, "contains(op, 'emcpy') AND NOT contains(op, 'DtoD')")
        num = ("SELECT count(*) FROM cuda_calls, (SELECT min(started_ns) AS t0 FROM sessions) o "
               f"WHERE pid = {int(pid)} AND {op} AND "
               f"({which.replace('k BETWEEN', '(ts_ns - o.t0) // 1000000000 BETWEEN')})")
    den = f"SELECT sum(iterations) FROM ({per_second_sql(marker, ctx.t0)}) WHERE {which}"
    return f"SELECT round(({num}) / nullif(({den}), 0), 1)"


def _grew_per_iteration(ctx: Ctx, f: Finding, baseline: list[TimeWindow], what: str) -> Explained | None:
    """LAUNCH_BOUND ('work') or EXCESS_SYNC ('sync') where the process issued MORE_PER_ITERATION times as many per
    iteration in the window as in the baseline: the same progress came in more, smaller pieces."""
    if f.mode != "contrast" or not baseline:
        return None
    pid = f.thread.pid
    now_sql = per_iteration_sql(ctx, pid, [f.ks], what)
    base_sql = per_iteration_sql(ctx, pid, [_k_range(ctx, w) for w in baseline], what)
    if now_sql is None or base_sql is None:
        return None
    now, base = shared_rows(ctx.con, now_sql)[0][0], shared_rows(ctx.con, base_sql)[0][0]
    if now is None or base is None or float(now) < MORE_PER_ITERATION * max(float(base), 0.5) \
            or float(now) - float(base) < (10 if what == "work" else 2):
        return None
    gpu = f"{f.gpu_util:.0f}" if f.gpu_util is not None else "?"
    marker = ctx.progress[pid]
    label = "launches+copies" if what == "work" else "synchronising calls"
    ev = [Evidence(name=f"{label} per iteration in the window (an iteration: one {marker.label})", value=float(now),
                   sql=now_sql),
          Evidence(name=f"{label} per iteration in the healthy baseline", value=float(base), sql=base_sql)]
    numbers = {"per_iteration": f"{float(now):,.1f}", "base_per_iteration": f"{float(base):,.1f}", "gpu": gpu}
    if what == "work":
        return Explained(cause=rc.LAUNCH_BOUND, evidence=ev, numbers=numbers,
                         reason=(f"the host issued {float(now):,.0f} launches+copies per iteration vs "
                                 f"{float(base):,.0f} in the healthy baseline (GPU {gpu}% busy): the same progress "
                                 "came in more, smaller pieces, and launching them is the work"))
    return Explained(cause=rc.EXCESS_SYNC, evidence=ev, numbers=numbers,
                     reason=(f"it synchronised with the GPU {float(now):,.1f} times per iteration vs "
                             f"{float(base):,.1f} in the healthy baseline: each sync drains the GPU's queue and the "
                             "host waits for it"))


def explain_run_outside(ctx: Ctx, f: Finding, baseline: list[TimeWindow]) -> Explained:
    """Running outside CUDA calls: the feeding thread's own Python/data work; page faults when allocations surged."""
    t = f.thread
    k0, k1 = f.ks
    sql = (f"WITH o AS (SELECT min(started_ns) AS t0 FROM sessions) SELECT sum(count)::BIGINT AS pages, "
           "count(DISTINCT bucket_start_ns) AS seconds FROM host_aggregates, o WHERE op = 'mm_page_alloc' AND "
           f"pid = {t.pid} AND (bucket_start_ns - o.t0) // 1000000000 BETWEEN {k0} AND {k1}")
    pages, _secs = shared_rows(ctx.con, sql)[0]
    alloc_bytes = shared_rows(ctx.con, sql.replace("count(DISTINCT bucket_start_ns) AS seconds",
                                                    "sum(sum_bytes)::BIGINT AS bytes"))[0][1]
    rate = int(pages or 0) / max(1, k1 - k0 + 1)
    base_rate = None
    if baseline:
        tot = n = 0
        for w in baseline:
            b0, b1 = _k_range(ctx, w)
            p, _s = shared_rows(ctx.con, sql.replace(f"BETWEEN {k0} AND {k1}", f"BETWEEN {b0} AND {b1}"))[0]
            tot += int(p or 0)
            n += b1 - b0 + 1
        base_rate = tot / max(n, 1)
    rate_sql = f"SELECT round(coalesce(pages, 0) / {k1 - k0 + 1})::BIGINT FROM ({' '.join(sql.split())})"
    ev = [Evidence(name="pages allocated by the process per second", value=int(shared_rows(ctx.con, rate_sql)[0][0]),
                   sql=rate_sql)]
    # what the allocations could have cost at most, per second, against the part's time they must explain (its growth
    # over the baseline, or its share): a surge too small to fill it is not where the time went (a 4M-index draw's list)
    most_s = (alloc_bytes if alloc_bytes is not None else int(pages or 0) * 4096) / ALLOC_BYTES_PER_S / (k1 - k0 + 1)
    grown = f.share - f.base_share if f.mode == "contrast" and f.base_share is not None else f.share
    if rate >= 20_000 and (base_rate is None or rate >= 4 * max(base_rate, 1)) and most_s >= 0.5 * grown:
        return Explained(cause=rc.PAGE_FAULTS, evidence=ev,
                         reason=(f"allocating {rate:,.0f} pages/s ({rate * 4096 / 1e9:.1f} GB/s of fresh memory"
                                 + (f", vs {base_rate:,.0f}/s before" if base_rate is not None else "")
                                 + "): the time goes to page faults on new memory"))
    for what in ("sync", "work"):  # more syncs or more pieces per iteration: why its own work per step grew
        grew = _grew_per_iteration(ctx, f, baseline, what)
        if grew is not None:
            return grew
    kids = ctx.alive_children(t.pid, f.window)
    note = ("no child process (worker) alive through most of it" if not kids
            else f"{len(kids)} child process{'es' if len(kids) != 1 else ''} alive through most of it")
    own = f"its own work between CUDA calls ({note})"
    numbers: dict[str, object] = {}
    work, gaps_read = _gap_work(ctx, f) if f.drained_s else (None, False)
    if work is None and not gaps_read:  # where the gaps' samples say no one kind, the window's kind is not theirs
        work = host_work(ctx, f.thread.pid, f.thread.tid, f.window, "its", calls="outside")
    if work is not None:  # the stacks say where that work was: compiling GPU code, or PyTorch's own code
        words, numbers, share_ev = work
        ev.append(share_ev)
        own = f"its own work between CUDA calls, {words}; {note}"
    pieces = _copies_per_iteration(ctx, f)
    if pieces is not None:  # a batch moved in many small copies: each dispatched by the thread, and waited for
        copies, syncs, reads, more = pieces
        ev += more
        back = reads >= 0.5 * copies  # mostly values read back (a .tolist() a token, a .cpu() a parameter)
        issuer = _copies_issuer(ctx, f)
        if issuer is None:  # the thread issued them: its own work, with their fix
            numbers = {**numbers, "copies": f"{copies:,.0f}", **({"reads": f"{reads:,.0f}"} if back else {})}
            own += (f"; each iteration it made {copies:,.0f} host-device copies"
                    + (f" ({reads:,.0f} of them back to the host)" if back else "")
                    + f" and {syncs:,.0f} synchronising calls, each issued by the thread: "
                    + ("results read back one by one" if back else "a batch moved in pieces"))
        else:  # another thread of the process issued them: said as its, not the thread's own work
            who, share, issuer_ev = issuer
            ev.append(issuer_ev)
            own += (f"; each iteration its process made {copies:,.0f} host-device copies"
                    + (f" ({reads:,.0f} of them back to the host)" if back else "")
                    + f" and {syncs:,.0f} synchronising calls, {share:.0f}% of the copies issued by {who}, "
                      "not by this thread")
    busy = _busy_runner(ctx, f, baseline)
    if busy is not None:  # the same rows as a busy-wait for that thread: said, not decided
        culprits, words, more = busy
        one = sum(len(c.tids) for c in culprits) == 1
        them, sets = ("that thread", "sets") if one else ("those threads", "set")
        return Explained(cause=rc.HOST_BOUND, evidence=ev + more, culprits=culprits, confident=False,
                         numbers=numbers,
                         reason=f"{own}; meanwhile {words}: if it waits for {them} in a loop (a busy-wait), {them} "
                                f"{sets} the pace, else the GPU waits on its own work")
    return Explained(cause=rc.HOST_BOUND, evidence=ev, numbers=numbers, reason=f"{own}: the GPU waits on it")


def _gap_work(ctx: Ctx, f: Finding) -> tuple[tuple[str, dict[str, object], Evidence] | None, bool]:
    """What a finding in drained gaps ran in the gaps themselves, where its samples there say (host_work within
    drained_gaps_sql): the window's running is mostly the step's own, the gaps' what kept the GPU from the next
    (natural_manager_dict_counters: the model's code over the window, a Manager's proxy round trips in the gaps);
    and whether the gaps held enough samples to be read (then no one kind there is an answer too: a per-step HTTP
    push or SQLite commit in the gaps is not the model's code that fills the window)."""
    gaps = drained_gaps_sql(f.thread.pid, f.thread.tid, f.window.start_ns, f.window.end_ns)
    work = host_work(ctx, f.thread.pid, f.thread.tid, f.window, "its", calls="outside",
                     within=(gaps, "in the gaps with nothing queued"))
    if work is not None or not recorded(ctx.con):
        return work, work is not None
    sampled = shared_rows(ctx.con, framework_share_sql(f.thread.pid, f.thread.tid, f.window, "outside", gaps))[0][2]
    return None, int(sampled or 0) >= HOST_WORK_SAMPLES


MANY_COPIES = 32  # host-device copies per iteration from which a batch is said to move in pieces (a step copies a few)


def _copies_per_iteration(ctx: Ctx, f: Finding) -> tuple[float, float, float, list[Evidence]] | None:
    """The host-device copies (those back to the host among them, and synchronising calls) the thread's process made
    per iteration in the finding's seconds, where MANY_COPIES or more: (copies, syncs, reads, evidence); else None
    (or no iteration marker)."""
    copy_sql = per_iteration_sql(ctx, f.thread.pid, [f.ks], "copy")
    sync_sql = per_iteration_sql(ctx, f.thread.pid, [f.ks], "sync")
    read_sql = per_iteration_sql(ctx, f.thread.pid, [f.ks], "read")
    if copy_sql is None or sync_sql is None or read_sql is None:
        return None
    copies = shared_rows(ctx.con, copy_sql)[0][0]
    if copies is None or float(copies) < MANY_COPIES:
        return None
    marker = ctx.progress[f.thread.pid]
    syncs = float(shared_rows(ctx.con, sync_sql)[0][0] or 0)
    reads = float(shared_rows(ctx.con, read_sql)[0][0] or 0)
    return float(copies), syncs, reads, [
        Evidence(name=f"host-device copies per iteration in the window (an iteration: one {marker.label})",
                 value=float(copies), sql=copy_sql),
        Evidence(name="of them, copies back to the host (device to host) per iteration", value=reads, sql=read_sql),
        Evidence(name="synchronising calls per iteration in the window", value=syncs, sql=sync_sql)]


def _copies_issuer(ctx: Ctx, f: Finding) -> tuple[str, float, Evidence] | None:
    """Where another thread of the process issued most of its host-device copies in the finding's seconds (the
    autograd thread's reads in the backward, a prefetch thread's copies): (who, its share %, evidence); None where
    the finding's thread issued half or more (natural_anomaly_mode_left_on: 310 reads an iteration, all the autograd
    thread's, were said as the main thread's)."""
    k0, k1 = f.ks
    sql = ("SELECT tid, round(100.0 * count(*) / sum(count(*)) OVER (), 1) AS pct FROM cuda_calls, (SELECT "
           f"min(started_ns) AS t0 FROM sessions) o WHERE pid = {f.thread.pid} AND contains(op, 'emcpy') AND NOT "
           f"contains(op, 'DtoD') AND (ts_ns - o.t0) // 1000000000 BETWEEN {k0} AND {k1} GROUP BY tid "
           "ORDER BY pct DESC, tid LIMIT 1")
    got = shared_rows(ctx.con, sql)
    if not got or int(got[0][0]) == f.thread.tid or float(got[0][1]) < 50.0:
        return None
    tid, pct = int(got[0][0]), float(got[0][1])
    return ctx.who(f.thread.pid, tid), pct, Evidence(
        name="the thread of the process that issued most of its host-device copies in the window (its tid, its "
             "share %)", value=pct, unit="%", sql=f"SELECT pct, tid FROM ({sql})")


BUSY_GREW = 3.0  # another thread of the process that ran this many times its baseline share of the time ...


def _busy_runner(ctx: Ctx, f: Finding,
                 baseline: list[TimeWindow]) -> tuple[list[Culprit], str, list[Evidence]] | None:
    """The feeding thread's own running grew in a slow phase while another thread of its process ran most of that
    time and BUSY_GREW times its baseline share or more: a thread working more, or one spinning in a loop until the
    other is done (a busy-wait shows no wake-up); the rows cannot tell which, so the other is named, hedged."""
    if f.mode != "contrast" or not baseline:
        return None
    runners = busy_runners(ctx, f)
    if runners is None:
        return None
    _name, culprits, run_ns, wall_ns, who, ran = runners
    tids = ", ".join(str(tid) for c in culprits for tid in c.tids)
    ranges = " OR ".join("k BETWEEN {} AND {}".format(*_k_range(ctx, w)) for w in baseline)
    sql = (f"SELECT round(100.0 * sum(run_outside_ns + run_inside_ns) / max(w), 1) FROM thread_seconds, (SELECT "
           f"max(s) AS w FROM (SELECT sum(wall_ns) AS s FROM thread_seconds WHERE pid = {f.thread.pid} AND tid IN "
           f"({tids}) AND ({ranges}) GROUP BY tid)) WHERE pid = {f.thread.pid} AND tid IN ({tids}) AND ({ranges})")
    base = shared_rows(ctx.con, sql)[0][0]
    share = 100 * run_ns / wall_ns
    if base is None or share < BUSY_GREW * float(base):
        return None
    ran_then = ran_text(run_ns, wall_ns, sum(len(c.tids) for c in culprits))
    words = f"{who} of the same process ran {ran_then} (vs {float(base):.0f}% in the baseline)"
    return culprits, words, [ran, Evidence(name=f"share of the baseline {who} ran", value=float(base), unit="%",
                                           sql=sql)]
