"""Finding the parts of a feeding thread's time that lost it: contrast (a slow or recurrent phase against the
healthy baseline) and steady (time the GPU sat idle while the thread did something else).
"""

from __future__ import annotations

from dataclasses import replace

from ingero_mcp.analysis import recommend as rc
from ingero_mcp.analysis.accounting import SECOND_NS, second_runs, seconds_within, sum_seconds
from ingero_mcp.analysis.causes.context import (
    Ctx,
    Finding,
    IDLE_GPU,
    MIN_EXCESS,
    MIN_GROWTH,
    MINOR_SHARE,
    STEADY_MIN_SHARE,
    part_ns,
)
from ingero_mcp.analysis.drained import drained_parts
from ingero_mcp.analysis.idle_bound import BOUND_PARTS, idle_bound
from ingero_mcp.analysis.models import PARTS, Account, Phase, SecondAccount, ThreadAccount, TimeWindow

def work_done(a: Account) -> float:
    """The progress an account holds: its process's iterations where a marker counts them (progress.py), else the
    launches and copies it started (the last resort)."""
    return a.iterations if a.iterations is not None else float(a.work_calls)


def _shares(a: Account) -> dict[str, float]:
    return {p: (part_ns(a, p) / a.wall_ns if a.wall_ns else 0.0) for p in PARTS}


def _k_range(ctx: Ctx, w: TimeWindow) -> tuple[int, int]:
    return (w.start_ns - ctx.t0) // SECOND_NS, (w.end_ns - 1 - ctx.t0) // SECOND_NS


def in_startup(w: TimeWindow, steady_from: int | None) -> bool:
    """Whether a window lies mostly in the process's start-up: before it first reached its steady rate (accounting's
    steady_from_ns). A window after that is never start-up, however late the first baseline phase began."""
    if steady_from is None:
        return False
    return min(w.end_ns, steady_from) - w.start_ns >= 0.5 * w.duration_ns


def contrast_findings(ctx: Ctx, thread: ThreadAccount, phases: list[Phase],
                      steady_from: int | None = None) -> list[Finding]:
    """In each slow phase, the parts whose time per unit of CUDA work grew against the baseline.

    If every launch or copy had cost what it cost in the baseline, the phase would have lasted
    work_calls x (baseline wall / baseline work_calls); the difference is the time lost, and each part's
    excess over its own baseline cost per unit of work says how much of it that part explains.
    """
    baseline = [p.window for p in phases if p.kind == "baseline"]
    if not baseline:
        return []
    base = _sum_windows(thread.seconds, baseline)
    if base.wall_ns <= 0 or work_done(base) <= 0:
        return []
    base_share = _shares(base)
    # the cost per unit of work is read from the busy time: idle waits for input (accounting.idle_sql) are no cost
    base_busy = _minus_idle(base, sum(_idle(thread.seconds, w) for w in baseline))
    found = []
    base_phases = [p for p in phases if p.kind == "baseline"]
    base_rate = sum(p.work_rate * p.window.duration_ns for p in base_phases) / max(
        1, sum(p.window.duration_ns for p in base_phases))
    for phase in (p for p in phases if p.kind in ("slow", "recurrent")):
        if phase.kind == "recurrent":
            found += [replace(f, rates=(base_rate, phase.work_rate), unit=phase.unit)
                      for f in _recurrent_findings(ctx, thread, phase, base_busy)]
            continue
        acc = sum_seconds(thread.seconds, phase.window)
        if acc.wall_ns <= 0:
            continue
        startup = in_startup(phase.window, steady_from)
        busy = _minus_idle(acc, _idle(thread.seconds, phase.window))
        expected = {p: work_done(acc) * part_ns(base_busy, p) / work_done(base) for p in PARTS}
        excess = {p: part_ns(busy, p) - expected[p] for p in PARTS}
        lost_ns = busy.wall_ns - work_done(acc) * base_busy.wall_ns / work_done(base)
        # a part counts when its cost per unit of work grew enough to explain a share of the loss; its share of
        # wall time need not grow (a copy-bound loop stays copy-bound when its copies get slower)
        grown = {p: e for p, e in excess.items() if lost_ns > 0 and e >= MIN_EXCESS * lost_ns
                 and e >= MIN_GROWTH * acc.wall_ns}
        if lost_ns <= 0 or not grown:
            continue
        total = sum(grown.values())
        for p, e in grown.items():
            ks = _part_seconds(ctx, thread.seconds, phase.window, p, base_share[p])
            w = TimeWindow(start_ns=ctx.t0 + ks[0] * SECOND_NS, end_ns=ctx.t0 + (ks[1] + 1) * SECOND_NS)
            sub = sum_seconds(thread.seconds, w)
            if lost_ns * e / total > sub.wall_ns:  # spread over the phase, not held by the seconds it stood out in
                ks = _k_range(ctx, phase.window)
                w = TimeWindow(start_ns=ctx.t0 + ks[0] * SECOND_NS, end_ns=ctx.t0 + (ks[1] + 1) * SECOND_NS)
                sub = sum_seconds(thread.seconds, w)
            found.append(Finding(thread=thread, part=p, window=w,
                                 seconds_lost=_within(sub, lost_ns * e / total) / 1e9,
                                 mode="contrast", share=_shares(sub)[p], base_share=base_share[p],
                                 slowdown=phase.slowdown,
                                 stopped=phase.slowdown is None, gpu_util=_util(thread.seconds, w), ks=ks,
                                 startup=startup, rates=(base_rate, phase.work_rate), unit=phase.unit))
    return found


def _within(sub: Account, lost_ns: float) -> float:
    """A part's share of a slow phase's lost time, never more than the thread's time in the finding's window (the
    seconds the part stood out in, or the phase's where those cannot hold it): a finding never explains more time than
    its window holds (gil_pool's said 11.7 s in 11 s; mmap_cold_reads' running 2.9 s in the one second it stood out)."""
    return min(lost_ns, float(sub.wall_ns))


def _idle(seconds: list[SecondAccount], w: TimeWindow) -> int:
    """A thread's idle time in the seconds starting in a window (accounting.idle_sql)."""
    return sum(s.idle_ns for s in seconds_within(seconds, w))


def _minus_idle(a: Account, idle: int) -> Account:
    """An account without its idle time (of its sleep outside CUDA calls): the busy time the contrast compares."""
    return a if not idle else a.model_copy(update={"wall_ns": a.wall_ns - idle,
                                                   "sleep_outside_ns": a.sleep_outside_ns - idle})


def episode_seconds(ctx: Ctx, phase: Phase) -> list[tuple[int, int]]:
    """The seconds (first, last) that hold each episode of a recurrent phase."""
    return [_k_range(ctx, w) for w in phase.episodes]


def _recurrent_findings(ctx: Ctx, thread: ThreadAccount, phase: Phase, base: Account) -> list[Finding]:
    """The contrast over the seconds that hold a recurrent phase's short episodes: as for a slow phase, the parts
    whose cost per unit of work grew against the baseline share the time lost; each part is then explained in the
    episode where it grew most (the culprits of one episode, named from its rows)."""
    spans = episode_seconds(ctx, phase)
    kset = sorted({k for a, b in spans for k in range(a, b + 1)})
    inside = [s for s in thread.seconds if s.k in set(kset) and s.wall_ns > 0]
    acc = sum_seconds(inside)
    if acc.wall_ns <= 0:
        return []
    busy = _minus_idle(acc, sum(s.idle_ns for s in inside))
    excess = {p: part_ns(busy, p) - work_done(acc) * part_ns(base, p) / work_done(base) for p in PARTS}
    lost_ns = busy.wall_ns - work_done(acc) * base.wall_ns / work_done(base)
    grown = {p: e for p, e in excess.items()
             if lost_ns > 0 and e >= MIN_EXCESS * lost_ns and e >= MIN_GROWTH * acc.wall_ns}
    if lost_ns <= 0 or not grown:
        return []
    total = sum(grown.values())
    by_k = {s.k: s for s in inside}
    found = []
    for p, e in grown.items():
        def grew(span: tuple[int, int], part: str = p) -> float:
            got = [by_k[k] for k in range(span[0], span[1] + 1) if k in by_k]
            a = _minus_idle(sum_seconds(got), sum(s.idle_ns for s in got))
            return part_ns(a, part) - work_done(a) * part_ns(base, part) / work_done(base)
        worst = max(spans, key=grew)
        found.append(Finding(thread=thread, part=p, window=phase.window, seconds_lost=lost_ns * e / total / 1e9,
                             mode="contrast", share=_shares(acc)[p], base_share=_shares(base)[p],
                             slowdown=phase.slowdown,
                             gpu_util=_util(inside, TimeWindow(start_ns=0, end_ns=2**62)), ks=(kset[0], kset[-1]),
                             phase=phase, kset=tuple(kset), worst=worst))
    return found


def _sum_windows(seconds: list[SecondAccount], windows: list[TimeWindow]) -> Account:
    total = Account()
    for w in windows:
        part = sum_seconds(seconds, w)
        iterations = None if total.iterations is None and part.iterations is None else \
            (total.iterations or 0.0) + (part.iterations or 0.0)
        total = Account(**{f: getattr(total, f) + getattr(part, f) for f in Account.model_fields if f != "iterations"},
                        iterations=iterations)
    return total


def _part_seconds(ctx: Ctx, seconds: list[SecondAccount], w: TimeWindow, part: str,
                  base_share: float) -> tuple[int, int]:
    """The seconds of a window in which a part stood out (its share at least midway between the baseline's and
    the window's): a phase can hold two causes one after the other."""
    inside = [s for s in seconds if w.start_ns <= s.start_ns < w.end_ns and s.wall_ns > 0]
    acc = sum_seconds(inside)
    mid = base_share + 0.5 * (_shares(acc)[part] - base_share)
    member = [s.k for s in inside if part_ns(s, part) >= max(mid, 0.05) * s.wall_ns]
    if not member:
        member = [s.k for s in inside]
    return min(member), max(member)


def _util(seconds: list[SecondAccount], w: TimeWindow) -> float | None:
    return gpu_util_in(seconds, [w])


def gpu_util_in(seconds: list[SecondAccount], windows: list[TimeWindow]) -> float | None:
    """The mean GPU utilisation of the seconds starting in any of the windows (those with a sample), or None."""
    got = [s.gpu_util_percent for s in seconds if s.gpu_util_percent is not None
           and any(w.start_ns <= s.start_ns < w.end_ns for w in windows)]
    return sum(got) / len(got) if got else None


def _busy_part(s: SecondAccount, part: str) -> int:
    """A part of a second less the thread's idle time in it (an idle wait for input is no part of the feeding)."""
    return part_ns(s, part) - (s.idle_ns if part == "sleep_outside" else 0)


STEADY_PART = 0.2  # a part's share of idle-GPU seconds that makes them count: each second's, or a stretch's as a whole
STEADY_FLOOR = 0.1  # the share each second of such a stretch holds at least


def _idle_runs(idle: list[SecondAccount], part: str, steady_from: int | None) -> list[list[int]]:
    """The runs of idle-GPU seconds in which `part` counts: those holding STEADY_PART of it each, and, once the
    process reached its steady rate, the stretches whose every second holds STEADY_FLOOR and which hold STEADY_PART as
    a whole (a part steady near STEADY_PART, a second over it and the next under, is one stretch, not pieces too short
    to count; start-up's shares swing, and are read second by second as before)."""
    share = {s.k: _busy_part(s, part) / s.wall_ns for s in idle if s.wall_ns > 0}
    wall = {s.k: s.wall_ns for s in idle}
    ks = {k for k, v in share.items() if v >= STEADY_PART}
    steady = [s.k for s in idle if s.k in share and (steady_from is None or s.start_ns >= steady_from)]
    for run in second_runs([k for k in steady if share[k] >= STEADY_FLOOR], allow_gap=0):
        if sum(share[k] * wall[k] for k in run) >= STEADY_PART * sum(wall[k] for k in run):
            ks.update(run)
    return second_runs(sorted(ks))


# What a drained gap holds, part by part: the accounting's parts (none waits for the GPU there) and calls that queue
# nothing (drained.py 'in_call').
GAP_HELD = (*(p for p in PARTS if p != "gpu_wait"), "in_call")
DRAINED_MIN = 0.1  # a part's time in drained gaps, as a share of the second, that makes a busy-GPU second count


def _cut(ks: list[int], read: set[int]) -> list[list[int]]:
    """Seconds (ascending) as spans, cut where a second not `read` lies between two."""
    out: list[list[int]] = []
    for k in ks:
        if out and all(j in read for j in range(out[-1][-1] + 1, k)):
            out[-1].append(k)
        else:
            out.append([k])
    return out


def _before_and_after(busy: list[SecondAccount], steady_from: int | None) -> tuple[list[SecondAccount], ...]:
    """The seconds before the process reached its steady rate and those after, apart."""
    return ([s for s in busy if steady_from is not None and s.start_ns < steady_from],
            [s for s in busy if steady_from is None or s.start_ns >= steady_from])


def _drained_spans(busy: list[SecondAccount], drained: dict[int, dict[str, int]], steady_from: int | None,
                   read: set[int]) -> list[list[int]]:
    """The busy-GPU seconds read for drained gaps, before the process reached its steady rate and after it apart:
    each from its first second whose gaps (every part together) hold DRAINED_MIN of it to its last, the seconds
    between included, cut where a slow phase's seconds (not `read` here) lie between. A gap after every step, or one
    at every epoch's end, is the same cost spread thin: its parts (running, IO, a reply waited for) each hold too
    little of a second to count alone (natural_sqlite_metrics_commit: the GPU had nothing queued 12% of the run, 7%
    of it running Python, 5% in fdatasync)."""
    out = []
    for group in _before_and_after(busy, steady_from):
        ks = [s.k for s in group if drained.get(s.k, {}).get("gap", 0) >= DRAINED_MIN * s.wall_ns]
        out += _cut([s.k for s in group if ks and ks[0] <= s.k <= ks[-1]], read)
    return out


def _drained(ctx: Ctx, thread: ThreadAccount, seconds: list[SecondAccount]) -> dict[int, dict[str, int]]:
    """The thread's time per second in drained gaps (drained.py), by part, over its seconds' span."""
    lo = ctx.t0 + min(s.k for s in seconds) * SECOND_NS
    hi = ctx.t0 + (max(s.k for s in seconds) + 1) * SECOND_NS
    return drained_parts(ctx.con, thread.pid, thread.tid, ctx.t0, lo, hi)


def explained_phases(phases: list[Phase], contrast: list[Finding]) -> list[Phase]:
    """The phases with the slow ones no part stood out in left out: a slow phase whose every part cost more alike
    (against a baseline that was host-bound too, no part grew) is read as the rest of the run is, by steady_findings
    (natural_compile_dynamic_shapes: recompiles filled the whole measured run, its baseline the last 2 s)."""
    return [p for p in phases if p.kind != "slow" or any(
        f.mode == "contrast" and f.window.start_ns < p.window.end_ns and f.window.end_ns > p.window.start_ns
        for f in contrast)]


# Readings of the GPU's own pace: a thread that waited on its GPU all along was GPU-bound, no host-side story to lead
# with however long (gpu_work_grows without NVML's rows: its baseline's waits said as the hedged gpu-slower).
GPU_SIDE = frozenset({rc.GPU_BOUND, rc.GPU_SLOWER})


def steady_context(found: list[tuple[str, str, str, float]]) -> list[bool]:
    """Which of a thread's findings (mode, cause, severity, seconds) are context to a phase that lost progress: the
    steady ones, where a phase (contrast, not LOW) lost progress; the phase is the news. But a steady finding of the
    phase's lead cause that explains more seconds than the phase's findings together is not: the phase was a worse
    stretch of what held all along, which leads (natural_pk_sampler_label_scan: the sampler's scan 12.5 s of the run,
    1.3x worse for 12 s)."""
    lost: dict[str, float] = {}
    for mode, cause, severity, seconds in found:
        if mode == "contrast" and severity != "LOW":
            lost[cause] = lost.get(cause, 0.0) + seconds
    lead = max(lost, key=lambda c: lost[c]) if lost else None
    return [mode == "steady" and lead is not None and not (cause == lead and seconds > sum(lost.values())
                                                           and cause not in GPU_SIDE)
            for mode, cause, _, seconds in found]


def steady_findings(ctx: Ctx, thread: ThreadAccount, phases: list[Phase],
                    steady_from: int | None = None) -> list[Finding]:
    """Outside slow phases: the parts that filled stretches (2 s or more) in which the GPU sat idle."""
    # a recurrent phase's seconds stay in: short episodes must not cut a steady stretch into pieces; its slow phases
    # that recurred alike (episodes.repeated) are read as the slow phases they are, not here too
    slow = [p.window for p in phases if p.kind == "slow"] + [w for p in phases for w in p.stretches]
    seconds = [s for s in thread.seconds if not any(w.start_ns <= s.start_ns < w.end_ns for w in slow)]
    if not seconds:
        return []
    util_known = any(s.gpu_util_percent is not None for s in seconds)
    wall = sum(s.wall_ns - s.idle_ns for s in seconds)
    by_k = {s.k: s for s in seconds}
    busy = {s.k for s in seconds if s.gpu_util_percent is not None and s.gpu_util_percent >= IDLE_GPU}
    unmeasured = {s.k for s in seconds if util_known and s.gpu_util_percent is None}  # not weighed, as before
    drained = _drained(ctx, thread, seconds) if busy else {}

    def lost_ns(s: SecondAccount, p: str) -> float:
        """A part's cost to the GPU in a second: where the GPU was under IDLE_GPU busy, the part weighted by its idle
        share; at a busier GPU, only its time in drained gaps (nothing queued)."""
        if s.k in busy:
            got = drained.get(s.k, {}).get(p, 0)
            return max(0, got - s.idle_ns) if p == "sleep_outside" else got
        return _busy_part(s, p) * (1.0 - (s.gpu_util_percent or 0.0) / 100.0)

    spans = _drained_spans([s for s in seconds if s.k in busy], drained, steady_from, set(by_k))
    found = []
    for p in PARTS:
        if p == "gpu_wait":
            continue
        # runs of idle-GPU seconds and spans of busy ones apart: a finding is read one way or the other
        idle = _idle_runs([s for s in seconds if s.k not in unmeasured and s.k not in busy], p, steady_from)
        for run in idle + spans:
            if run[-1] - run[0] + 1 < 2:
                continue
            lost = sum(lost_ns(by_k[k], p) for k in run if k in by_k)
            if run[0] in busy:  # the gaps as a whole must count; each part in them is said where it is not minor
                held = sum(lost_ns(by_k[k], q) for k in run if k in by_k for q in GAP_HELD)
                if held < STEADY_MIN_SHARE * wall or lost < MINOR_SHARE * wall:
                    continue
            elif lost < STEADY_MIN_SHARE * wall:
                continue
            ks = (run[0], run[-1])
            w = TimeWindow(start_ns=ctx.t0 + ks[0] * SECOND_NS, end_ns=ctx.t0 + (ks[1] + 1) * SECOND_NS)
            acc = sum_seconds(seconds, w)
            found.append(Finding(thread=thread, part=p, window=w, seconds_lost=lost / 1e9, mode="steady",
                                 share=part_ns(acc, p) / acc.wall_ns if acc.wall_ns else 0.0,
                                 gpu_util=_util(seconds, w), util_known=util_known, ks=ks,
                                 startup=in_startup(w, steady_from),
                                 drained_s=lost / 1e9 if run[0] in busy else None))
    unsampled = {s.k for s in seconds if s.gpu_util_percent is None}  # inside a span: the bound's SQL skips them
    return _bounded(ctx, thread, [s for s in seconds if s.k in busy], found, wall, steady_from, busy | unsampled)


def _busy_spans(busy: list[SecondAccount], steady_from: int | None, read: set[int]) -> list[list[int]]:
    """The busy-GPU seconds as spans, before the process reached its steady rate and after it apart, cut where
    seconds not `read` (a slow phase's, an idle GPU's) lie between: every second of a span's range is busy or
    unsampled, so its range recomputes it."""
    return [span for group in _before_and_after(busy, steady_from) for span in _cut([s.k for s in group], read)]


def _bounded(ctx: Ctx, thread: ThreadAccount, busy: list[SecondAccount], found: list[Finding], wall: int,
             steady_from: int | None, read: set[int]) -> list[Finding]:
    """found, with the parts that held STEADY_MIN_SHARE of the feeding time or more of the GPU's idle time over a
    span of busy-GPU seconds, by counting (idle_bound.py): each as a steady finding of that bound, in place of the
    part's drained finding in the span where the bound is the larger (the gaps after syncs are in the idle time)."""
    for span in _busy_spans(busy, steady_from, read):
        if len(span) < 2:
            continue
        w = TimeWindow(start_ns=ctx.t0 + span[0] * SECOND_NS, end_ns=ctx.t0 + (span[-1] + 1) * SECOND_NS)
        for p in BOUND_PARTS:
            bound = idle_bound(ctx.con, thread.pid, thread.tid, p, span)
            same = [f for f in found if f.part == p and f.window.start_ns < w.end_ns and w.start_ns < f.window.end_ns]
            if bound * 1e9 < STEADY_MIN_SHARE * wall or any(f.seconds_lost >= bound for f in same):
                continue
            acc = sum_seconds(thread.seconds, w)
            found = [f for f in found if f not in same] + [Finding(
                thread=thread, part=p, window=w, seconds_lost=bound, mode="steady",
                share=part_ns(acc, p) / acc.wall_ns if acc.wall_ns else 0.0, gpu_util=gpu_util_in(busy, [w]),
                ks=(span[0], span[-1]), startup=in_startup(w, steady_from), bound_s=bound)]
    return found
