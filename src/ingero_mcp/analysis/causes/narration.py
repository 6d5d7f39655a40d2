"""From findings and their explanations to ranked causal chains: severity, summary, evidence with SQL, one story
per cause.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import replace

import duckdb

from ingero_mcp.analysis import recommend as rc
from ingero_mcp.analysis._sql import rows, sql_round
from ingero_mcp.analysis.answers import shared_rows
from ingero_mcp.analysis.accounting import MIN_PHASE_S, SECOND_NS, SLOW_FACTOR, gpu_util_sql
from ingero_mcp.analysis.causes.context import HIGH_SHARE, MEDIUM_SHARE, MINOR_SHARE, Ctx, Finding, _context
from ingero_mcp.analysis.causes.context import _seconds_sql, part_sql
from ingero_mcp.analysis.causes.culprits import Explained, pool_stem, torch_loader
from ingero_mcp.analysis.episodes import HEALTHY_FRACTION, MIN_EPISODE_LOSS_S, SCAN_FRACTION, STOP_SHARE, pauses_sql
from ingero_mcp.analysis.causes.explain import _explain
from ingero_mcp.analysis.causes.findings import contrast_findings, episode_seconds, explained_phases, steady_context
from ingero_mcp.analysis.causes.findings import steady_findings
from ingero_mcp.analysis.causes.frames import attach_frames
from ingero_mcp.analysis.drained import drained_wakers_sql
from ingero_mcp.analysis.idle_bound import BOUNDED, bound_evidence, bound_reason
from ingero_mcp.analysis.models import (
    PART_LABEL,
    SEVERITY_RANK,
    Accounting,
    CausalChain,
    Evidence,
    Phase,
    ThreadAccount,
    TimeWindow,
)
from ingero_mcp.analysis.stacks import recorded
from ingero_mcp.analysis.waits import SATURATED, busy_share, busy_share_sql

# Causes that are no host-side cause: said, never above LOW (the GPU set the pace).
NOT_HOST = frozenset({rc.GPU_BOUND})
# Causes a process's start-up does not excuse: another process's work on the GPU all through a slow beginning is that
# process's doing, however long, not the job warming up (natural_two_jobs_one_gpu: 2x slower for 21 s from its first
# iteration, said LOW 'during start-up' because it reached its own rate only once the other job stopped).
NOT_STARTUP = frozenset({rc.GPU_SHARED})


def _startup(f: Finding, cause: str) -> bool:
    """Whether the finding is said as the process's start-up (never above LOW): before its steady rate, and of a
    cause start-up can be."""
    return f.startup and cause not in NOT_STARTUP


def _severity(seconds: float, wall_s: float, f: Finding, confident: bool, cause: str = "",
              agreed: bool = False) -> str:
    if _startup(f, cause) or not confident and f.mode == "steady" or cause in NOT_HOST:
        return "LOW"
    if f.drained_s and not agreed:  # drained gaps at a busy GPU, its cause read over all of the part's time in the
        return "LOW"  # window and not found in the gaps themselves: said, not asserted
    share = seconds / wall_s if wall_s else 0.0
    level = "HIGH" if share >= HIGH_SHARE else "MEDIUM" if share >= MEDIUM_SHARE else "LOW"
    if f.mode == "steady" and (not f.util_known or not confident) and level != "LOW":
        level = "LOW" if not f.util_known else "MEDIUM"
    if not confident and level == "HIGH":
        level = "MEDIUM"
    return level


def _worst(ctx: Ctx, f: Finding, span: tuple[int, int] | None = None) -> Finding:
    """A recurrent finding narrowed to its worst episode's seconds (or `span`'s), for the explainers (they read one
    window)."""
    span = span or f.worst
    if span is None:
        return f
    w = TimeWindow(start_ns=ctx.t0 + span[0] * SECOND_NS, end_ns=ctx.t0 + (span[1] + 1) * SECOND_NS)
    return replace(f, window=w, ks=span)


MAX_EPISODES_READ = 8  # a recurrent finding's other episodes read for their culprits, at most


def _every_episode(ctx: Ctx, f: Finding, ex: Explained, baseline: list[TimeWindow]) -> Explained:
    """A recurrent finding explained in its worst episode, with the culprits of its other episodes that the same
    cause explains (a program run and waited for at each stall is a new child each time: every one is named); an
    episode explained by another cause lends nothing. The reason stays the worst episode's, said as such."""
    if f.worst is None or f.phase is None or not ex.culprits:
        return ex
    culprits = list(ex.culprits)
    for span in [s for s in episode_seconds(ctx, f.phase) if s != f.worst][:MAX_EPISODES_READ]:
        other = _explain(ctx, _worst(ctx, f, span), baseline)
        if other.cause != ex.cause:
            continue
        for c in other.culprits:
            same = next((i for i, k in enumerate(culprits) if (k.pid, k.tids, k.comm, k.relation) ==
                         (c.pid, c.tids, c.comm, c.relation)), None)
            if same is None:
                culprits.append(c)
            else:
                culprits[same] = culprits[same].model_copy(update={"ns": culprits[same].ns + c.ns})
    return replace(ex, culprits=culprits)


# A drained finding's cause is asserted where the culprit its explainer named first (reading the whole window), with
# the rest of its pool or its kind, ended at least this share of the thread's sleep inside the drained gaps
# themselves: the same waits filled the gaps (healthy_gloo_pair: the window's sleep was mostly the backward's, named
# first; the gaps' were the gloo collective's, named after it: not asserted).
DRAINED_AGREE = 0.5


def _gap_wakers(ctx: Ctx, f: Finding) -> tuple[str, list[tuple]] | None:
    """Who ended a drained sleep finding's sleeps inside its gaps (drained_wakers_sql) and the SQL, read once for
    _drained_agreement and _gap_enders; None for any other finding."""
    if not f.drained_s or f.part not in ("sleep_outside", "io"):
        return None
    t = f.thread
    sql = drained_wakers_sql(t.pid, t.tid, f.window.start_ns, f.window.end_ns, io=f.part == "io")
    return sql, rows(ctx.con, sql)


AGREED = "sleep inside the drained gaps ended by the culprits named, of all of it (s)"


def _drained_agreement(f: Finding, ex: Explained, gaps: tuple[str, list[tuple]] | None) -> Evidence | None:
    """Evidence that the lead culprits ended most (DRAINED_AGREE) of the thread's sleep inside the drained gaps of a
    sleep finding at a busy GPU, or None (not a drained sleep finding, nobody named, or they did not). The lead: the
    first culprit and those of its pool (pool_stem) and relation (175 nvidia-smi children are one)."""
    if gaps is None or not ex.culprits:
        return None
    sql, got = gaps
    first = ex.culprits[0]
    lead = [c for c in ex.culprits if c.relation == first.relation and pool_stem(c.comm) == pool_stem(first.comm)]
    total = sum(int(ns or 0) for *_w, ns in got)
    threads = {(c.pid, tid) for c in lead for tid in c.tids}
    others = {c.pid for c in lead if c.pid is not None and c.pid != f.thread.pid}  # another process: any thread
    named = [(p, tid) for p, tid, *_w, _ns in got if (p, tid) in threads or p in others]
    ended = sum(int(ns or 0) for p, tid, *_w, ns in got if (p, tid) in named)
    if not total or ended < DRAINED_AGREE * total:
        return None
    keys = ", ".join(f"({int(p)}, {int(tid)})" for p, tid in named)
    return Evidence(name=AGREED,
                    value=f"{ended / 1e9:.2f} of {total / 1e9:.2f}",
                    sql=(f"SELECT printf('%.2f of %.2f', sum(ns) FILTER (WHERE (waker_pid, waker_tid) IN ({keys})) "
                         f"/ 1e9, sum(ns) / 1e9) FROM ({sql})"))


GAP_ENDERS = "who ended its sleeps inside the drained gaps (share of that sleep)"


def _gap_enders(ctx: Ctx, f: Finding, gaps: tuple[str, list[tuple]] | None) -> Evidence | None:
    """For a sleep finding in drained gaps, who ended the sleeps inside the gaps themselves (its explainer read the
    whole window's, where another wait can lead: natural_http_metrics_push's gaps were a POST's reply, its window's
    sleep mostly the backward's)."""
    if gaps is None or f.part != "sleep_outside":  # IO: the device ends what the disk kept waiting, in or out
        return None
    sql, got = gaps
    total = sum(int(ns or 0) for *_w, ns in got)
    if not total:
        return None
    said = []
    for p, tid, comm, wctx, ns in got[:3]:
        who = ctx.who(int(p), int(tid), comm) if p is not None and tid is not None else "unknown"
        said.append(f"{f'an interrupt ({wctx}, landed on {who})' if wctx in ('irq', 'softirq') else who} "
                    f"{100 * int(ns or 0) / total:.0f}%")
    return Evidence(name=GAP_ENDERS, value="; ".join(said), sql=sql)


# How a finding in drained gaps says so (the verdict reads it).
DRAINED = "with nothing of the process queued on the GPU"
EXPLAINED = "feeding time explained (s)"  # the evidence a story's sum updates (_raise)


def _chain(ctx: Ctx, f: Finding, ex: Explained, wall_s: float, n: int) -> CausalChain:
    if ex.seconds is not None and ex.seconds < f.seconds_lost:  # the cause explains less than the part's time
        f = replace(f, seconds_lost=max(ex.seconds, 0.0))
    t = f.thread
    who = f"{t.process_comm or t.comm or '?'}[{t.pid}]'s " + ("main thread" if t.tid == t.pid
                                                              else f"thread {ctx.who(t.pid, t.tid)}")
    label = PART_LABEL[f.part]
    pct = 100 * f.share
    if _startup(f, ex.cause):
        who = "during start-up, " + who
    ph = f.phase
    stops = None
    if ph is not None and f.worst is not None:
        n = len(ph.episodes)
        mean = sum(w.duration_ns for w in ph.episodes) / n / 1e9
        each = f"{mean:.2f} s each"
        stops = _stops(ctx, t.pid, ph)
        if stops is not None:
            lo, hi = min(stops[0]), max(stops[0])
            each = (f"{lo / 1e9:.2f}" + (f"-{hi / 1e9:.2f}" if hi - lo >= 0.01 * SECOND_NS else "")
                    + " s each by the longest pause between two iterations")
        every = f", every {ph.period_s:.1f} s" if ph.period_s else ""
        worst = f"+{f.worst[0]:,.1f} s to +{f.worst[1] + 1:,.1f} s"
        drop = f"{_fell(f)} in them" if f.slowdown else "its CUDA work stopped in them"
        summary = (f"{who} stalled {n} time{'s' if n != 1 else ''} from {ctx.span(f.window)} ({each}"
                   f"{every}; {drop}): in those seconds it was {label} {pct:.0f}% of the time (vs "
                   f"{100 * (f.base_share or 0):.0f}% in the healthy baseline), {ex.reason} (read in the worst "
                   f"episode, {worst})")
    elif f.mode == "contrast":
        before = f" (vs {100 * (f.base_share or 0):.0f}% in the healthy baseline)"
        drop = ("its CUDA work stopped" if f.stopped else _fell(f)) if f.slowdown or f.stopped else ""
        summary = f"{who} was {label} {pct:.0f}% of the time from {ctx.span(f.window)}{before}, {ex.reason}; {drop}"
    else:
        gpu = f", GPU {f.gpu_util:.0f}% busy" if f.gpu_util is not None else ", GPU utilisation not recorded"
        if f.drained_s:
            gpu += f" ({f.drained_s:.2f} s of it {DRAINED})"
        elif f.bound_s:
            gpu += f" (of its idle time, at least {f.bound_s:.2f} s fell in this part: {BOUNDED})"
        summary = f"{who} was {label} {pct:.0f}% of the time from {ctx.span(f.window)}{gpu}: {ex.reason}"
    gaps = _gap_wakers(ctx, f)
    agreed = _drained_agreement(f, ex, gaps)
    ev = []
    if ph is not None and ph.sql:
        ev.append(Evidence(name=_episodes_label(ph), value=len(ph.episodes), sql=f"SELECT count(*) FROM ({ph.sql})"))
        if stops is not None:
            for end, fn, ns in (("shortest", "min", min(stops[0])), ("longest", "max", max(stops[0]))):
                ev.append(Evidence(name=f"the longest pause between two iterations in an episode: the {end}",
                                   value=round(ns / 1e9, 3), unit="s",
                                   sql=f"SELECT round({fn}(pause_ns) / 1e9, 3) FROM ({stops[1]})"))
        if ph.period_s is not None:
            ev.append(Evidence(name="mean time from one episode's start to the next's",
                               value=float(ph.period_s), unit="s",
                               sql=f"SELECT round((max(start_s) - min(start_s)) / (count(*) - 1), 2) FROM ({ph.sql})"))
        if ph.lost_s is not None:
            ev.append(Evidence(name="the process's work lost in the episodes (their length less their work "
                                    "at the healthy rate)", value=float(ph.lost_s), unit="s",
                               sql=f"SELECT round(sum(lost_s), 3) FROM ({ph.sql})"))
    ev.append(Evidence(name=f"share of the thread's time {label}"
                            + (" in the seconds holding the episodes" if f.kset else ""),
                       value=sql_round(pct, 1), unit="%",
                       sql=_seconds_sql(t.pid, t.tid, f.ks, f"round(100 * sum({part_sql(f.part)}) / sum(wall_ns), 1)",
                                        f.kset)))
    if f.base_share is not None:
        ev.append(Evidence(name="the same in the healthy baseline", value=round(100 * f.base_share, 1), unit="%"))
    if f.slowdown and not f.kset:
        # per second whose launches are known (work_calls NULL: the launch probes were detached all that second)
        rate_sql = (f"SELECT round(sum(work_calls) / count(DISTINCT k) FILTER (WHERE work_calls IS NOT NULL), 1) "
                    f"FROM thread_seconds WHERE pid = {t.pid} AND k BETWEEN {f.ks[0]} AND {f.ks[1]}")
        ev.append(Evidence(name="work rate in this window (launches+copies per second)",
                           value=float(rows(ctx.con, rate_sql)[0][0] or 0.0), sql=rate_sql))
    if f.slowdown:
        ev.append(Evidence(name="work rate, healthy baseline / this slow phase" + (" (its episodes)" if f.kset else ""),
                           value=round(f.slowdown, 2), unit="x"))
    if f.gpu_util is not None and f.kset:
        ev.append(Evidence(name="GPU utilisation in the seconds holding the episodes (mean of the per-second means)",
                           value=sql_round(f.gpu_util, 1), unit="%",
                           sql=f"SELECT avg(gpu_util_percent) FROM ({gpu_util_sql()}) WHERE k IN "
                               f"({', '.join(map(str, f.kset))})"))
    elif f.gpu_util is not None:
        ev.append(Evidence(name="GPU utilisation in the window", value=sql_round(f.gpu_util, 1), unit="%",
                           sql=f"SELECT avg(gpu_util_percent) FROM snapshots WHERE ts_ns BETWEEN {f.window.start_ns} "
                               f"AND {f.window.end_ns}"))
    ev.append(Evidence(name=EXPLAINED, value=round(f.seconds_lost, 2), unit="s"))
    if f.bound_s:
        ev.append(bound_evidence(t.pid, t.tid, f.part, f.ks, f.bound_s))
    ev += ex.evidence
    if agreed is not None:
        ev.append(agreed)
    elif (enders := _gap_enders(ctx, f, gaps)) is not None:
        ev.append(enders)
    numbers = {"who": who, "share": f"{pct:.0f}", "window": ctx.span(f.window), "cpus_total": "?", **ex.numbers,
               "loader": any(torch_loader(c.comm) for c in ex.culprits)}
    return CausalChain(
        id=f"{ex.cause}:{t.pid}/{t.tid}@{f.ks[0]}s", op=ex.cause,
        severity=_severity(f.seconds_lost, wall_s, f, ex.confident, ex.cause,  # type: ignore[arg-type]
                           agreed=agreed is not None),
        summary=summary, root_cause=ex.cause, explanation=_explanation(f, ex, agreed is not None),
        seconds_lost=round(f.seconds_lost, 3), window=f.window, culprits=ex.culprits, pids=[t.pid],
        evidence=ev, recommendations=rc.recommend(rc.io_fix(ex.cause, numbers), numbers))


def _stops(ctx: Ctx, pid: int, ph: Phase) -> tuple[list[int], str] | None:
    """The longest pause between two iterations in each of a recurrent phase's episodes, with its SQL
    (episodes.pauses_sql), where every episode was a stop (the pause fills STOP_SHARE of it); else None: a slowdown
    that kept iterating is said by its episodes' mean length."""
    marker = ctx.progress.get(pid)
    if marker is None or not ph.episodes or ph.unit != "iterations/s":
        return None
    sql = pauses_sql(marker, ph.episodes)
    got = [int(p) for _, p in shared_rows(ctx.con, sql)]
    if len(got) != len(ph.episodes) or any(p < STOP_SHARE * w.duration_ns for p, w in zip(got, ph.episodes)):
        return None
    return got, sql


def _episodes_label(ph: Phase) -> str:
    """What a recurrent phase's episodes are: slow stretches that recurred alike, short episodes read in bins, or
    both."""
    short = (f"runs of {(ph.bin_ns or SECOND_NS) / 1e6:.0f} ms bins under {100 * SCAN_FRACTION:.0f}% of the healthy "
             f"work rate, one under {100 * HEALTHY_FRACTION:.0f}%, each costing {MIN_EPISODE_LOSS_S} s or more")
    if not ph.stretches:
        return f"short slow episodes ({short})"
    stretches = (f"{len(ph.stretches)} slow stretches of {MIN_PHASE_S} s or more at {100 / SLOW_FACTOR:.0f}% of the "
                 "healthy work rate or less, alike in length and spacing")
    rest = len(ph.episodes) - len(ph.stretches)
    return f"slow episodes that recur ({stretches}" + (f"; {rest} short: {short})" if rest else ")")


def _fell(f: Finding) -> str:
    """'iterations/s fell 4.7x (83 -> 18)': the drop, in its unit, with the two rates."""
    if f.rates is None:
        return f"throughput fell {f.slowdown:.1f}x"
    base, now = f.rates
    digits = 0 if base >= 10 else 1 if base >= 1 else 2
    return f"{f.unit} fell {f.slowdown:.1f}x ({base:,.{digits}f} -> {now:,.{digits}f})"


def _grew(f: Finding) -> str:
    """'grew from 5.0% to 40.0%', or where the part's share of the time fell while its cost per unit of CUDA work grew
    (the work slowed more than the part: findings.contrast_findings), both shares said without 'grew'."""
    base, now = 100 * (f.base_share or 0), 100 * f.share
    if round(now, 1) > round(base, 1):
        return f"grew from {base:.1f}% to {now:.1f}%"
    return (f"took more per unit of CUDA work than in the baseline, though its share of the time went from {base:.1f}% "
            f"to {now:.1f}%")


def _explanation(f: Finding, ex: Explained, agreed: bool = False) -> str:
    if f.phase is not None:
        n, k = len(f.phase.episodes), len(f.phase.stretches)
        episodes = (f"{n} slow episodes that recur alike ({k} stretches of {MIN_PHASE_S} s or more with the "
                    f"process's work rate at {100 / SLOW_FACTOR:.0f}% of its healthy rate or less"
                    + (f"; {n - k} short, read in sub-second bins" if n > k else "") if k else
                    f"{n} short slow episodes (the process's work rate under "
                    f"{100 * HEALTHY_FRACTION:.0f}% of its healthy rate over each, read in sub-second bins")
        return (f"Read from the time accounting: in the seconds holding {episodes}"
                + f"), the part of the feeding thread's time {PART_LABEL[f.part]} "
                f"{_grew(f)}; its cost per unit of CUDA work against the baseline explains {f.seconds_lost:.2f} s of "
                "the time lost in them. The culprits are read in the episode where it grew most: " + ex.reason + ".")
    if f.mode == "contrast":
        return (f"Read from the time accounting: in this slow phase the part of the feeding thread's time "
                f"{PART_LABEL[f.part]} {_grew(f)}; {f.seconds_lost:.2f} s of the time lost to the slowdown is "
                "attributed to it. " + ex.reason + ".")
    if f.drained_s:
        return (f"Read from the time accounting: in the window the feeding thread was {PART_LABEL[f.part]} "
                f"{100 * f.share:.1f}% of the time; {f.seconds_lost:.2f} s of it fell where nothing of its process was "
                "queued on the GPU (after a synchronising call returned, before the next launch or copy), time the "
                "GPU could not spend on the job whatever its utilisation says (a lower bound). " + ex.reason + ". "
                + ("The culprits named ended most of the sleep inside those stretches (evidence)." if agreed else
                   "The cause is read over all of the part's time in the window, not only those stretches: said, "
                   "not asserted."))
    if f.bound_s:
        return f"{bound_reason(f.bound_s, PART_LABEL[f.part], f.share)} {ex.reason}."
    return (f"Read from the time accounting: while the GPU was idle, the feeding thread was {PART_LABEL[f.part]} "
            f"{100 * f.share:.1f}% of the time; {f.seconds_lost:.2f} s of GPU-idle time is attributed to it. "
            + ex.reason + ".")


def pace_threads(acc: Accounting) -> list[ThreadAccount]:
    """Per feeding process, the thread that sets its pace: the main thread when it starts CUDA work (it runs the
    training loop; PyTorch's autograd thread launches the backward kernels but sleeps until the main thread hands
    it work), else the feeding thread that makes the calls marking its iterations (the loop run in another thread),
    else the busiest feeding thread. Processes come busiest first."""
    by_pid: dict[int, list[ThreadAccount]] = defaultdict(list)
    for t in acc.threads:
        if t.role == "feeder":
            by_pid[t.pid].append(t)
    driver = {m.pid: m.tid for m in acc.progress}
    out = []
    for pid, threads in by_pid.items():
        main = next((t for t in threads if t.tid == pid), None)
        loop = next((t for t in threads if t.tid == driver.get(pid)), None)
        out.append(main or loop or threads[0])
    work = {pid: sum(t.total.work_calls for t in ts) for pid, ts in by_pid.items()}
    return sorted(out, key=lambda t: -work[t.pid])


def accounting_chains(con: duckdb.DuckDBPyConnection, acc: Accounting, window: TimeWindow,
                      names: dict[int, str]) -> tuple[list[CausalChain], list[str]]:
    """Chains from the accounting, ranked by the seconds they explain, and the minor ones as lines.

    The process doing the most CUDA work is the job; the chains of other GPU processes rank after its own
    within a severity, and never above MEDIUM (they are context: another job's idle time is not this one's loss).
    """
    if not acc.complete or not acc.threads:
        return [], []
    ctx = _context(con, window, names, acc.origin_ns)
    ctx.progress = {m.pid: m for m in acc.progress}
    stacked = recorded(con)  # the one query a store without stacks pays for them
    chains: list[tuple[int, CausalChain]] = []
    minor: list[str] = []
    paces = [t for t in pace_threads(acc) if not ctx.is_collector(t.pid)]
    for rank, t in enumerate(paces):
        phases = [p for p in acc.phases if p.pid == t.pid]
        baseline = [p.window for p in phases if p.kind == "baseline"]
        wall_s = t.busy_ns / 1e9  # the feeding time: an idle wait for input is not (accounting.idle_sql)
        steady_from = acc.steady_from_ns.get(t.pid)
        found: list[tuple[Finding, CausalChain]] = []
        contrast = contrast_findings(ctx, t, phases, steady_from)
        steady = steady_findings(ctx, t, explained_phases(phases, contrast), steady_from)
        for i, f in enumerate(contrast + steady):
            ex = _every_episode(ctx, f, _explain(ctx, _worst(ctx, f), baseline), baseline)
            chain = _chain(ctx, f, ex, wall_s, i)
            if stacked:
                attach_frames(ctx, _worst(ctx, f), chain)
            if rank > 0 and chain.severity == "HIGH":
                chain.severity = "MEDIUM"
            found.append((replace(f, serialising=bool(ex.numbers.get("serialising"))), chain))
        found = _paced(ctx, _one_story(found, wall_s))
        minor += [other_work_line(ctx, t, p) for p in phases if p.kind == "other-work"]
        # a phase that lost progress leads, the steady state around it its context (findings.steady_context)
        context = steady_context([(f.mode, c.root_cause, c.severity, c.seconds_lost or 0) for f, c in found])
        for (f, chain), is_context in zip(found, context):
            if wall_s and chain.seconds_lost is not None and chain.seconds_lost / wall_s < MINOR_SHARE:
                minor.append(f"{chain.root_cause}: {chain.summary} ({chain.seconds_lost:.2f} s)")
                continue
            if is_context and chain.severity == "HIGH":
                chain.severity = "MEDIUM"
            chains.append((min(rank, 1) * 2 + is_context, chain))
    order = SEVERITY_RANK
    # contrast before steady context (odd keys), then severity, the job before other GPU users, seconds explained
    return [c for _, c in sorted(chains, key=lambda kc: (kc[0] % 2, order[kc[1].severity], kc[0],
                                                          -(kc[1].seconds_lost or 0)))], minor


# The waits whose lead culprit, another process busy SATURATED of the window, set the pace: a stage that always had
# work did not wait for the thread, so the thread's own work in that window is hidden behind its wait for it. Not a
# thread of its own process: Python threads take turns at one GIL, and the thread's own work takes the other's turns.
PACED_BY = frozenset({rc.INPUT_WAIT, rc.WAITING_ON_PROCESS})
# The thread's own work, which a saturated stage it waits on hides: said LOW where the pace was set elsewhere.
OWN_WORK = frozenset({rc.HOST_BOUND, rc.PAGEABLE_COPIES, rc.PAGE_FAULTS, rc.ALLOCATOR_CHURN, rc.LAUNCH_BOUND})


def _paced(ctx: Ctx, found: list[tuple[Finding, CausalChain]]) -> list[tuple[Finding, CausalChain]]:
    """Findings of the thread's own work (OWN_WORK) inside the window of a HIGH or MEDIUM wait on a task that was busy
    SATURATED of it are said LOW, with why: that task set the pace (natural_big_batches_shm: the trainer waited 55% on
    two DataLoader workers running 100%; its 21% in pageable copies only shortened the wait). Where the task had
    idle time (a server asked one request at a time), the thread's own work adds to the step and stays as it was."""
    paces = []  # (the wait, its window, who it waited on, their pid and tid, their busy share)
    for _f, chain in found:
        lead = chain.culprits[0] if chain.culprits else None
        if (chain.root_cause not in PACED_BY or chain.severity == "LOW" or lead is None or lead.pid is None
                or lead.pid in chain.pids or not lead.tids or chain.window is None):
            continue
        busy = busy_share(ctx.con, lead.pid, lead.tids[0], chain.window)
        if busy is not None and busy >= SATURATED:
            paces.append((chain, chain.window, ctx.who(lead.pid, lead.tids[0]), lead.pid, lead.tids[0], busy))
    for _f, chain in found:
        w = chain.window
        if chain.root_cause not in OWN_WORK or chain.severity == "LOW" or w is None or not w.duration_ns:
            continue
        for pace, pw, who, pid, tid, busy in paces:
            if pace.pids != chain.pids:
                continue
            inside = min(w.end_ns, pw.end_ns) - max(w.start_ns, pw.start_ns)
            if inside >= 0.5 * w.duration_ns:
                chain.severity = "LOW"
                chain.summary += (f"; not what set the pace: it waited on {who} then ({pace.root_cause}, "
                                  f"{pace.severity}), which ran {100 * busy:.0f}% of the time, so this work only "
                                  "shortened that wait")
                ran = busy_share_sql(pid, tid, pw, "thread_seconds")
                chain.evidence.append(Evidence(
                    name=f"the pace: the share of the time {who} ran (its wait on it: {pace.severity})",
                    value=sql_round(100 * busy, 1), unit="%", sql=f"SELECT round(100 * ({ran}), 1)"))
                break
    return found


def other_work_line(ctx: Ctx, t: ThreadAccount, p: Phase) -> str:
    """The short episodes in which a process marked no iteration but kept launching work at its healthy rate."""
    n = len(p.episodes)
    return (f"other-work: {t.process_comm or t.comm or '?'}[{t.pid}] marked no iteration in {n} short episode"
            f"{'s' if n != 1 else ''} from {ctx.span(p.window)} ({p.lost_s or 0:.2f} s of iterations at the healthy "
            f"rate) while its launches and copies went on at their healthy rate ({p.work_rate:,.0f}/s): work that "
            "marks no iteration (another phase of the job: an evaluation pass, a second loop), not a stall")


def _one_story(found: list[tuple[Finding, CausalChain]], wall_s: float) -> list[tuple[Finding, CausalChain]]:
    """Findings of one thread that name the same cause over overlapping windows are one story (a launch-bound step
    shows as running and as waiting on the autograd thread): the largest keeps its words and takes the others'
    seconds, their summaries as evidence, and the severity of the sum."""
    out: list[tuple[Finding, CausalChain]] = []
    for f, chain in sorted(found, key=lambda fc: -(fc[1].seconds_lost or 0)):
        # the steady state is one story wherever it shows (host-bound before a slowdown and after it); a phase's
        # findings are one where their windows meet
        # findings in drained gaps are one story of their own, whatever their causes (_drained_story)
        into = next((c for g, c in out if c.root_cause == chain.root_cause and g.mode == f.mode and c.window
                     and not g.drained_s and not f.drained_s
                     and chain.window and (f.mode == "steady" and g.startup == f.startup
                                           or c.window.start_ns < chain.window.end_ns
                                           and chain.window.start_ns < c.window.end_ns)), None)
        if into is None:
            out.append((f, chain))
            continue
        into.seconds_lost = round((into.seconds_lost or 0) + (chain.seconds_lost or 0), 3)
        into.evidence.append(Evidence(name="also part of this story (another part of the thread's time)",
                                      value=f"{chain.summary} [{chain.seconds_lost or 0:.2f} s]"))
        into.culprits += [c for c in chain.culprits if c not in into.culprits]
        if f.mode == "steady" and into.window and chain.window:  # the steady state: from its first stretch to its last
            into.window = TimeWindow(start_ns=min(into.window.start_ns, chain.window.start_ns),
                                     end_ns=max(into.window.end_ns, chain.window.end_ns))
        _raise(into, wall_s, f)
    return _drained_story(_io_story(out, wall_s))


def _raise(into: CausalChain, wall_s: float, f: Finding) -> None:
    """A chain that took another's seconds: the severity of the sum (never lowered; start-up stays as it was), and
    its evidence of the time explained says the sum (each part's own stays beside it, in its summary's [s])."""
    into.evidence = [e.model_copy(update={"value": round(into.seconds_lost or 0, 2)}) if e.name == EXPLAINED else e
                     for e in into.evidence]
    if f.drained_s:  # said, not asserted, however many seconds it sums
        return
    share = (into.seconds_lost or 0) / wall_s if wall_s else 0.0
    level = "HIGH" if share >= HIGH_SHARE else "MEDIUM" if share >= MEDIUM_SHARE else "LOW"
    if SEVERITY_RANK[level] < SEVERITY_RANK[into.severity] and not f.startup and into.root_cause not in NOT_HOST:
        into.severity = level  # type: ignore[assignment]


# What a thread does when it writes data out (a checkpoint, a log flush, a dataset cache): copies to host memory,
# page faults on the fresh buffers and page cache, its own serialising, and the disk IO that ends it.
_DATA_OUT = frozenset({rc.PAGE_FAULTS, rc.PAGEABLE_COPIES, rc.HOST_BOUND})


IO_SHARE = 0.2  # disk IO must explain this share of the stall's seconds to lead it


def _io_story(found: list[tuple[Finding, CausalChain]], wall_s: float) -> list[tuple[Finding, CausalChain]]:
    """Disk IO of a thread in a slow phase, with page faults, pageable copies and its own running in the same stall,
    is one story: the thread writing data out. The IO leads (page faults on fresh pages and staging copies are how
    the data gets there), unless the thread's own running, its samples in serialisation code, explains more of it:
    then that code leads (natural_sync_torch_save_ckpt's saves were 3.0 s of torch.save's own work and 1.4 s of IO),
    the IO's fix after its own. The lead takes the others' seconds; each stays as evidence with its own numbers."""
    io = [(f, c) for f, c in found if c.root_cause == rc.IO_WAIT and f.mode == "contrast"]
    if not io:
        return found
    out = list(found)
    for f, chain in io:
        parts = [(g, c) for g, c in out if c is not chain and g.mode == "contrast" and c.root_cause in _DATA_OUT
                 and c.window and chain.window and c.window.start_ns < chain.window.end_ns
                 and chain.window.start_ns < c.window.end_ns]
        total = (chain.seconds_lost or 0) + sum(c.seconds_lost or 0 for _g, c in parts)
        if not parts or (chain.seconds_lost or 0) < IO_SHARE * total:
            continue
        own = [(g, c) for g, c in parts if c.root_cause == rc.HOST_BOUND and g.serialising and (
            c.seconds_lost or 0) > (chain.seconds_lost or 0)]  # its own code serialising the data over the IO
        lead_f, lead = own[0] if own else (f, chain)
        rest = [(g, c) for g, c in [(f, chain)] + parts if c is not lead]
        for g, c in rest:
            out.remove((g, c))
            lead.evidence.append(Evidence(name=f"in the same stalls ({c.root_cause})",
                                          value=f"{c.summary} [{c.seconds_lost or 0:.2f} s]"))
        lead.summary += "; in the same stalls: " + "; ".join(
            f"{PART_LABEL[g.part]} {100 * g.share:.0f}% ({c.root_cause}) [{c.seconds_lost or 0:.1f} s]"
            for g, c in rest)
        if lead is not chain:
            lead.recommendations += [r for r in chain.recommendations if r not in lead.recommendations]
        start = min(c.window.start_ns for _g, c in [(f, chain)] + parts if c.window)
        end = max(c.window.end_ns for _g, c in [(f, chain)] + parts if c.window)
        lead.window = TimeWindow(start_ns=start, end_ns=end)
        # the parts of one stall never explain more than the stall's time (as findings._within holds each part)
        lead.seconds_lost = round(min(total, (end - start) / 1e9), 3)
        _raise(lead, wall_s, lead_f)
    return out


def _part_cause(c: CausalChain) -> str:
    """A part of a drained story said by its cause, or, where that cause was read over the window and the gaps' own
    sleeps were ended by others, by who ended those."""
    enders = next((e.value for e in c.evidence if e.name == GAP_ENDERS), None)
    return (f"{c.root_cause} as read over the window; inside the gaps its sleeps were ended by {enders}" if enders
            else c.root_cause)


def _gaps_filled(c: CausalChain) -> bool:
    """Whether a drained part's cause is the gaps' own: no sleeps in the gaps read apart, or the culprits it names
    ended most of them (natural_manager_dict_counters: the window's sleep was the backward's, the gaps' the manager's
    replies; the backward's fix is not the gaps')."""
    names = {e.name for e in c.evidence}
    return GAP_ENDERS not in names or AGREED in names


def _drained_story(found: list[tuple[Finding, CausalChain]]) -> list[tuple[Finding, CausalChain]]:
    """A thread's findings in drained gaps (steady, at a busy GPU) are one story, start-up's and the steady state's
    apart: the gaps after its syncs, in which it ran, slept or waited with nothing of its process queued on the GPU.
    The largest leads with its own seconds; the others are said in it with theirs and their causes (evidence), not
    added: each part's cause is read over the window, and a part the lead's cause did not fill (the step's own code
    run between a sync and the next launch, beside a command started per step) must not swell the lead's."""
    for startup in (True, False):
        group = [(f, c) for f, c in found if f.drained_s and f.mode == "steady" and f.startup == startup
                 and c.root_cause not in NOT_HOST]
        if len(group) < 2:
            continue
        lead = max(group, key=lambda fc: fc[1].seconds_lost or 0)[1]
        rest = [(g, c) for g, c in group if c is not lead]
        for g, c in rest:
            found.remove((g, c))
            lead.evidence.append(Evidence(name=f"in the same gaps, nothing queued on the GPU ({c.root_cause})",
                                          value=f"{c.summary} [{c.seconds_lost or 0:.2f} s]"))
            if _gaps_filled(c):  # a part whose gaps' sleeps others ended: its fix is the window's wait's, not theirs
                lead.recommendations += [r for r in c.recommendations if r not in lead.recommendations]
        lead.summary += "; in the same gaps: " + "; ".join(f"{PART_LABEL[g.part]} {c.seconds_lost or 0:.2f} s "
                                                           f"({_part_cause(c)})" for g, c in rest)
    return found


def _merge_same(chains: list[CausalChain]) -> list[CausalChain]:
    """Order by severity, then seconds explained."""
    rank = SEVERITY_RANK
    return sorted(chains, key=lambda c: (rank[c.severity], -(c.seconds_lost or 0)))
