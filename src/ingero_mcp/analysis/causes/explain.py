"""Which explainer reads which part of the accounting (_PART_CAUSE), and the refinements applied after it: calls
per iteration that grew, children started again and again.
"""

from __future__ import annotations

from collections.abc import Callable

from ingero_mcp.analysis import recommend as rc
from ingero_mcp.analysis._sql import rows
from ingero_mcp.analysis.answers import shared_rows
from ingero_mcp.analysis.causes.autotune import autotuning
from ingero_mcp.analysis.causes.context import GPU_SATURATED, Ctx, Finding
from ingero_mcp.analysis.causes.culprits import Explained, _id_range, explain_cpu_wait
from ingero_mcp.analysis.causes.findings import gpu_util_in
from ingero_mcp.analysis.causes.in_calls import (
    _grew_per_iteration,
    _other_gpu_users,
    explain_in_calls,
    explain_run_outside,
)
from ingero_mcp.analysis.causes.sleeps import explain_sleep
from ingero_mcp.analysis.models import Culprit, Evidence, TimeWindow

# The part of the accounting -> the explainer that names its cause (and the refinements applied after it: calls per
# iteration that grew, children started again and again).
_PART_CAUSE: dict[str, Callable[[Ctx, Finding, list[TimeWindow]], Explained]] = {
    "cpu_wait": lambda ctx, f, base: explain_cpu_wait(ctx, f),
    "sleep_outside": lambda ctx, f, base: _spawning(ctx, f, base, _per_iteration(ctx, f, base, explain_sleep(ctx, f))),
    "io": lambda ctx, f, base: _spawning(ctx, f, base, _per_iteration(ctx, f, base, explain_sleep(ctx, f, io=True))),
    "gpu_wait": lambda ctx, f, base: _per_iteration(ctx, f, base, explain_in_calls(ctx, f, base)),
    "run_inside": lambda ctx, f, base: _per_iteration(ctx, f, base, explain_in_calls(ctx, f, base)),
    "run_outside": lambda ctx, f, base: _spawning(ctx, f, base, explain_run_outside(ctx, f, base)),
}


def _explain(ctx: Ctx, f: Finding, baseline: list[TimeWindow]) -> Explained:
    """The finding's cause, from the explainer of its part (_PART_CAUSE), unless the GPU set the pace."""
    explainer = _PART_CAUSE.get(f.part)
    if explainer is None:
        return Explained(cause=rc.UNEXPLAINED, reason="the store does not say what the thread was doing off-CPU",
                         confident=False)
    return _gpu_bound(ctx, f, baseline) or explainer(ctx, f, baseline)


def _more_work(grew: Explained) -> str:
    """The launches per iteration that grew (a LAUNCH_BOUND refinement's numbers), said as more GPU work."""
    return (f"each iteration queued {grew.numbers['per_iteration']} launches+copies vs "
            f"{grew.numbers['base_per_iteration']} in the healthy baseline: more GPU work per step")


def _gpu_bound(ctx: Ctx, f: Finding, baseline: list[TimeWindow]) -> Explained | None:
    """A slow phase through which the GPU was saturated (GPU_SATURATED) with no other process seen on it: the GPU's
    own work set the pace. Whatever the feeding thread did meanwhile (slept polling, spun in a synchronise, waited on
    a thread that did) was waiting for the GPU, not a host-side cause: named as such, never above LOW (narration)."""
    if f.mode != "contrast" or f.kset or f.gpu_util is None or f.gpu_util < GPU_SATURATED or f.startup:
        return None  # short episodes (kset): the per-second utilisation holds the healthy time around them
    if _other_gpu_users(ctx, f.thread.pid, f) is not None:
        return None  # another process on the GPU: its explainer names it (gpu-shared)
    base = gpu_util_in(f.thread.seconds, baseline)
    before = f" (vs {base:.0f}% in the healthy baseline)" if base is not None else ""
    tuned = autotuning(ctx, f, before)  # trials the program asked for on top of its steps: said, with their fix
    if tuned is not None:
        return tuned
    grew = _grew_per_iteration(ctx, f, baseline, "work")
    more, numbers, ev = "", {"gpu": f"{f.gpu_util:.0f}", "more_work": ""}, []
    if grew is not None:
        more = f"; {_more_work(grew)}"
        numbers["more_work"] = (f" (each iteration queued {grew.numbers['per_iteration']} launches+copies vs "
                                f"{grew.numbers['base_per_iteration']} before)")
        ev = grew.evidence
    return Explained(cause=rc.GPU_BOUND, evidence=ev, numbers=numbers, confident=False,
                     reason=(f"the GPU was {f.gpu_util:.0f}% busy in it{before}, no other process seen using it: "
                             f"the GPU's own work set the pace and the thread waited for it{more}; no host-side cause "
                             "(or a GPU user the tracer cannot see)"))


# Explanations that say whose work or wait filled the time, not why there was more of it: where the process's calls
# per iteration grew, that is why (the same progress in more pieces, or more syncs per step).
_REFINED = {rc.WAITING_ON_THREAD: ("sync", "work"), rc.GPU_SLOWER: ("sync", "work"),
            rc.LAUNCH_OVERHEAD: ("sync", "work"), rc.HOST_BOUND: ("sync", "work")}


def _per_iteration(ctx: Ctx, f: Finding, baseline: list[TimeWindow], ex: Explained) -> Explained:
    """ex, or LAUNCH_BOUND / EXCESS_SYNC carrying ex's culprits and evidence where the calls per iteration grew."""
    for what in _REFINED.get(ex.cause, ()):
        grew = _grew_per_iteration(ctx, f, baseline, what)
        if grew is not None and ex.cause == rc.GPU_SLOWER and grew.cause == rc.LAUNCH_BOUND:
            # it waited for the GPU: more launches per iteration were more GPU work, not launching as the work
            return Explained(cause=rc.GPU_SLOWER, culprits=ex.culprits, evidence=ex.evidence + grew.evidence,
                             numbers={**ex.numbers, **grew.numbers}, confident=False,
                             reason=f"{ex.reason}; {_more_work(grew)}")
        if grew is not None:
            return Explained(cause=grew.cause, reason=f"{ex.reason}; {grew.reason}", culprits=ex.culprits,
                             evidence=ex.evidence + grew.evidence, numbers={**ex.numbers, **grew.numbers})
    return ex


SPAWN_MIN, SPAWN_RATE = 10, 1.0  # children started in a window: at least this many, and this many a second


SPAWN_LIFE_NS = 2_000_000_000  # ... living a median under this: started for a step or an epoch, then gone


SPAWN_OVER_BASE = 4  # ... at this many times the healthy baseline's rate at least


# What a thread that starts processes again and again shows as: sleeping until they ran (and exited), or running
# (fork copies its page tables; its next writes fault copy-on-write while the children live).
_SPAWN_SHOWS = frozenset({rc.INPUT_WAIT, rc.WAITING_ON_PROCESS, rc.PAGE_FAULTS, rc.HOST_BOUND})


def spawned_sql(pid: int, w: TimeWindow) -> str:
    """The child processes a process started in a window: how many, their commonest name, how long each lived
    (median, to its exit or its last sighting) and their pids in order of birth."""
    return " ".join(f"""
        WITH kids AS (SELECT pid, any_value(comm) AS comm, min(first_seen_ns) AS born,
                             max(coalesce(exit_ns, last_seen_ns)) AS gone
                      FROM processes WHERE ppid = {int(pid)} GROUP BY pid)
        SELECT count(*), mode(comm), median(gone - born)::BIGINT, list(pid ORDER BY born) FROM kids
        WHERE born >= {int(w.start_ns)} AND born < {int(w.end_ns)}""".split())


def _spawning(ctx: Ctx, f: Finding, baseline: list[TimeWindow], ex: Explained) -> Explained:
    """ex, or SPAWNING where the thread's process started short-lived children again and again in the window (a
    command run per step, DataLoader workers forked every epoch): the sleep they ended, or the running that forking
    costs, is the price of starting them."""
    if ex.cause not in _SPAWN_SHOWS or not f.window:
        return ex
    t = f.thread
    sql = spawned_sql(t.pid, f.window)
    n, comm, life_ns, kids = shared_rows(ctx.con, sql)[0]
    seconds = f.window.duration_ns / 1e9
    if not n or n < SPAWN_MIN or n / seconds < SPAWN_RATE or life_ns is None or life_ns >= SPAWN_LIFE_NS:
        return ex
    base_n = sum(int(rows(ctx.con, spawned_sql(t.pid, w))[0][0] or 0) for w in baseline)
    base_s = sum(w.duration_ns for w in baseline) / 1e9
    if f.mode != "steady" and base_s and base_n / base_s * SPAWN_OVER_BASE > n / seconds:
        return ex  # as many before: the loop's habit all along, not what changed (the steady state is that habit)
    kidset = set(kids)
    if ex.cause in (rc.INPUT_WAIT, rc.WAITING_ON_PROCESS) and not kidset & {c.pid for c in ex.culprits}:
        return ex  # it waited on someone else
    named = [c for c in ex.culprits if c.pid in kidset] or [
        Culprit(pid=p, tids=[p], comm=ctx.procs.get(p, (None, comm, None))[1] or comm, relation="child process")
        for p in kids[:5]]
    rate = n / seconds
    before = "" if not base_s else ", none before" if not base_n else f", vs {base_n / base_s:.1f}/s before"
    reason = (f"{ex.reason.removesuffix(': they do not keep up')}; it started {n} child processes in that window "
              f"({comm}[{_id_range(list(kids))}], {rate:.0f}/s{before}), each living a median {life_ns / 1e6:.0f} ms: "
              "processes started again and again, each paid for (the fork: page tables copied, then each page written "
              "while a child lives copied; the child's start-up) and waited for")
    return Explained(cause=rc.SPAWNING, reason=reason, culprits=named + [c for c in ex.culprits if c not in named],
                     evidence=ex.evidence + [Evidence(name="child processes started in the window (count, name, "
                                                           "median life ns, pids)", value=f"{n}, {comm}, {life_ns}",
                                                      sql=sql)],
                     numbers={**ex.numbers, "spawned": n, "child": comm, "spawn_rate": f"{rate:.0f}",
                              "life_ms": f"{life_ns / 1e6:.0f}"})
