"""Explaining sleeps: what the thread waited in and who ended its sleeps, followed along the wait-for graph
(waits.py) to where the wait began, through a pool of wakers where no one waker did it alone.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import replace

from ingero_mcp.analysis import recommend as rc
from ingero_mcp.analysis._sql import TIMEOUT_WAITS, rows, sql_round, sql_str
from ingero_mcp.analysis.answers import shared_rows
from ingero_mcp.analysis.accounting import SECOND_NS, latest_name_sql, wakers_sql
from ingero_mcp.analysis.causes.context import Ctx, Finding
from ingero_mcp.analysis.causes.locks import held_lock, own_lock
from ingero_mcp.analysis.causes.turns import with_turns
from ingero_mcp.analysis.causes.culprits import (CONVOY_SHARE, POOL_FOLLOWED, POOL_SHARE, Explained, _autograd,
                                                  _by_name, _channel, _id_range, _is_data_worker, _role, busy_runners,
                                                  collective, convoy_sql, explain_cpu_wait, host_work, pool_stem,
                                                  ran_text, siblings, through_pool, waker_pool, workers_pace)
from ingero_mcp.analysis.models import Account, Culprit, Evidence, ThreadAccount, TimeWindow
from ingero_mcp.analysis.stack_models import Frame
from ingero_mcp.analysis.stacks import leaf_sql, profile, self_share_sql
from ingero_mcp.store.views import SECONDS_TABLE
from ingero_mcp.analysis.waits import IO_KINDS, KIND_LABEL, WaitPath, doing_text, follow, sleep_kinds_sql

TIMED_SLEEPS = frozenset({"nanosleep", "clock_nanosleep"})
# The standard library's waits for another thread's signal (threading's Condition, Event, Semaphore, Barrier and join;
# queue's get and put): a thread asleep in one of them waits for what another thread makes, not for a lock it holds.
PYTHON_WAITS = frozenset({"threading.py", "queue.py"})
WAKER_MIN_SHARE, JOB = 0.01, ("same process", "child process")  # a waker outside the job: a culprit from 1% of it
JOB_WAKER_MIN_SHARE = 0.001  # ... and a task of the job from 0.1% (a thread that ended a few sleeps: evidence)


def _wakers(ctx: Ctx, pid: int, tid: int, w: TimeWindow, io: bool = False) -> tuple[str, list[tuple]]:
    sql = " ".join(wakers_sql(pid, tid, w, io=io).split())
    return sql, shared_rows(ctx.con, sql)


def _is_timed(syscall: str | None, wctx: str | None, rel: str) -> bool:
    """A sleep the thread chose (time.sleep): a timer syscall ended by the kernel, not by another task of the job."""
    return ((syscall or "") in TIMED_SLEEPS and (wctx in ("irq", "softirq") or rel in ("kernel", "unknown"))
            or (syscall or "") in TIMEOUT_WAITS and wctx == "irq")  # a poll/select/epoll wait that ran out its timeout


def _enders(ctx: Ctx, sql: str, known: list[tuple], total: int) -> Evidence:
    return Evidence(name="who ended the sleeps (share of the sleep time)", value="; ".join(
        f"""{'a timer interrupt (' + str(r[3]) + ', landed on ' + str(r[2]) + ')' if r[3] in ('irq', 'softirq')
             else ctx.who(int(r[0]), int(r[1]), r[2])} """
        f"{100 * int(r[5] or 0) / total:.0f}%" for r in known[:4]), sql=sql)


def _timed_lock_holder(ctx: Ctx, f: Finding, sql: str, known: list[tuple], total: int,
                       waited: tuple[Frame, float, Evidence] | None) -> Explained | None:
    """Futex waits ended by their timeout (the GIL is asked for every 5 ms; locks with timeouts): the waiter is not
    woken by the holder, so name the threads of the same process that kept running meanwhile (busy_runners). Where its
    sleeps' own Python frame is a threading or queue wait (_python_wait), it waits for what they make, not a lock."""
    t = f.thread
    runners = busy_runners(ctx, f)
    if runners is None:
        return None
    name, culprits, run_ns, wall_ns, who, ran = runners
    tids = culprits[0].tids
    timed = int(known[0][5] or 0)
    ev = [_enders(ctx, sql, known, total), ran]
    blamed = [Culprit(pid=t.pid, tids=tids, comm=name, relation="same process", ns=timed)]
    if waited is not None:
        frame, share, where = waited
        # a task among the sleeps' enders that is one of the runners: it did signal the wait now and then
        signalled = any(r[3] not in ("irq", "softirq") and int(r[1]) in tids for r in known)
        return Explained(
            cause=rc.WAITING_ON_THREAD, evidence=[*ev, where], confident=signalled, culprits=blamed,
            numbers={"waker": who, "doing": f"running {ran_text(run_ns, wall_ns, len(tids))}"},
            reason=(f"asleep in {frame.label()} for {share:.0f}% of its sleep with a stack, waits that ended on "
                    f"their timeout ({100 * timed / total:.0f}% of the sleep: it looked again every few ms) while "
                    f"{who} of the same process ran {ran_text(run_ns, wall_ns, len(tids))}"
                    + f": it waits for what {'that thread makes' if len(tids) == 1 else 'they make'} (through a "
                      "condition, an event or a queue)"))
    holds = f"{who} holds the GIL (or the lock)" if len(tids) == 1 else "they hold the GIL (or the lock) in turn"
    return Explained(
        cause=rc.LOCK_OR_GIL, evidence=ev, culprits=blamed,
        numbers={"waker": who, "doing": f"running {ran_text(run_ns, wall_ns, len(tids))}"},
        reason=(f"asleep in futex() waits that ended on their timeout ({100 * timed / total:.0f}% of the sleep: a lock "
                f"or the GIL, asked for again every few ms) while {who} of the same process ran "
                f"{ran_text(run_ns, wall_ns, len(tids))}: {holds}"))


def _python_wait(ctx: Ctx, f: Finding, any_frame: bool = False) -> tuple[Frame, float, Evidence] | None:
    """The Python frame the thread slept in (its stacks taken at switch-out), where it is one of PYTHON_WAITS (or, with
    `any_frame`, any Python frame: a poll wait's own system call says what kind of wait it is) for at least half of
    its sleep time with a stack: the frame, its share (%), the evidence whose SQL recomputes it."""
    t = f.thread
    top = profile(ctx.con, "off_cpu", t.pid, t.tid, f.window, top=1, top_stacks=0).top_frames
    frame = top[0].frame if top else None
    if frame is None or not frame.python or not any_frame and (frame.file or "").rsplit("/", 1)[-1] not in PYTHON_WAITS:
        return None
    sql = self_share_sql("off_cpu", t.pid, t.tid, f.window, frame, kernel=False)
    share = rows(ctx.con, sql)[0][0]
    if share is None or float(share) < 50:
        return None
    return frame, float(share), Evidence(name=f"where it slept: {frame.label()} (share of its sleep time with a "
                                              "stack)", value=float(share), unit="%", sql=sql)


def _signaller(ctx: Ctx, f: Finding, frame: Frame, known: list[tuple]) -> tuple[tuple, list[Evidence], int] | None:
    """Timed waits in a Python wait (`frame`) that time out again and again end, once what they wait for comes, by
    the task that signals it: of the frame's sleeps a task ended, the one task that ended at least half (and 10): its
    row of `known`, the evidence (counts, not time: each wait is many timed-out sleeps and one signalled), and the
    time the thread slept in the frame in the window, however each sleep ended: the time it waited on that task."""
    t, (lo, hi) = f.thread, (int(f.window.start_ns), int(f.window.end_ns))
    hit = (f"u.frames[{leaf_sql('u')}] = {sql_str(frame.function)} AND u.files[{leaf_sql('u')}] IS NOT DISTINCT FROM "
           f"{'NULL' if frame.file is None else sql_str(frame.file)}")
    # the thread's sleeps in the window with a stack (`hit`: in the frame, added by each query)
    slept = (f"FROM sched_intervals i JOIN stacks u ON u.session_id = i.session_id AND u.stack_id = i.ustack_id WHERE "
             f"i.pid = {t.pid} AND i.tid = {t.tid} AND i.sleep_ns > 0 AND i.off_ns < {hi} AND "
             f"i.off_ns + i.sleep_ns > {lo} AND ")
    sql = (f"SELECT i.waker_pid, i.waker_tid, {latest_name_sql('i.waker_tid', 'min(i.waker_comm)')} AS waker_comm, "
           f"count(*) AS sleeps {slept}"
           f"i.waker_context = 'task' AND {hit} GROUP BY i.waker_pid, i.waker_tid ORDER BY sleeps DESC, i.waker_tid")
    got = rows(ctx.con, sql)
    signalled = sum(int(r[3]) for r in got)
    if not got or int(got[0][3]) < max(10, 0.5 * signalled):
        return None
    top = next((r for r in known if r[3] == "task" and (r[0], r[1]) == (got[0][0], got[0][1])), None)
    if top is None:
        return None
    who = ctx.who(int(got[0][0]), int(got[0][1]), got[0][2])
    waited_sql = (f"SELECT coalesce(sum(least(i.off_ns + i.sleep_ns, {hi}) - greatest(i.off_ns, {lo})), 0)::BIGINT "
                  f"AS ns {slept}{hit}")
    waited_ns = int(rows(ctx.con, waited_sql)[0][0])
    return top, [Evidence(name=f"who ended the waits in {frame.function} that did not time out (of {signalled:,})",
                          value=f"{who} {int(got[0][3]):,}", sql=sql),
                 Evidence(name=f"time asleep in {frame.function} in the window, however each sleep ended (the wait "
                               f"on {who})", value=sql_round(waited_ns / 1e9, 2), unit="s",
                          sql=f"SELECT round(ns / 1e9, 2) FROM ({waited_sql})")], waited_ns


POLL_MEAN_NS = 1_000_000  # timer sleeps this short on average ...
POLL_PER_S = 100  # ... and this many a second are a poll loop, not a pace the program keeps


def _poll_target(ctx: Ctx, f: Finding, sql: str, known: list[tuple], total: int) -> Explained | None:
    """Short timer sleeps by the thousand (time.sleep(0) or a few µs between looks at a flag, a queue, a future): the
    thread polls for something it checks between sleeps, and no wake-up shows what. Name the threads of its process or
    its children that kept running meanwhile (busy_runners), as the likely thing polled for; none: not a poll (None)."""
    timers = [r for r in known if r[3] in ("irq", "softirq") and (r[7] or "") in TIMED_SLEEPS]
    sleeps, slept = sum(int(r[4] or 0) for r in timers), sum(int(r[5] or 0) for r in timers)
    span_s = max((f.window.end_ns - f.window.start_ns) / 1e9, 1e-9)
    if not sleeps or slept / sleeps >= POLL_MEAN_NS or sleeps / span_s < POLL_PER_S:
        return None
    runners = busy_runners(ctx, f, family=True)  # what it polls may be a queue or memory another process fills
    if runners is None:
        return None
    _name, culprits, run_ns, wall_ns, who, ran = runners
    own = all(c.pid == f.thread.pid for c in culprits)
    ran_words = ran_text(run_ns, wall_ns, sum(len(c.tids) for c in culprits))
    return Explained(
        cause=rc.WAITING_ON_THREAD if own else rc.WAITING_ON_PROCESS, evidence=[_enders(ctx, sql, known, total), ran],
        confident=False, culprits=culprits,
        numbers={"waker": who, "doing": f"running {ran_words}"},
        reason=(f"asleep in {sleeps:,} timer sleeps of {slept / sleeps / 1e3:.0f} us on average ({sleeps / span_s:,.0f}"
                f" a second, {100 * slept / total:.0f}% of the sleep): a poll loop, which checks for something between "
                f"its sleeps that no wake-up shows; meanwhile {who} ({culprits[0].relation}) ran {ran_words}: "
                "most likely what it polls for"))


def _own_kind(ctx: Ctx, f: Finding, io: bool = False) -> tuple[str, str | None, float, str]:
    """What the thread's own sleeps outside CUDA calls (with `io`: in D state) waited in (waits.WAIT_KINDS), its
    system call, the kind's share of the sleep, and the SQL."""
    t = f.thread
    sql = sleep_kinds_sql(t.pid, t.tid, f.window, io=io)
    got = shared_rows(ctx.con, sql)
    total = sum(int(r[3] or 0) for r in got) or 1
    if not got:
        return "other", None, 0.0, sql
    return str(got[0][0]), got[0][1], int(got[0][3] or 0) / total, sql


def _path_evidence(ctx: Ctx, path: WaitPath, label: str) -> list[Evidence]:
    ev = []
    for h in path.hops:
        if not h.sql:
            continue
        ev.append(Evidence(name=f"what {ctx.who(h.pid, h.tid)} did while {label} (share of that time)",
                           value=doing_text(ctx.con, h), sql=h.summary_sql))
    return ev


def explain_sleep(ctx: Ctx, f: Finding, io: bool = False) -> Explained:
    """Sleeping outside CUDA calls: what the thread waited in (its sleeps' kernel stacks or system calls) and who ended
    the sleeps, followed along the wait-for graph (waits.py) to where the wait began: a thread that ran (the work
    waited for), one starved of CPU, a timer, a disk, the network, a process outside the job. Where the waker was
    read from timed waits' few signalled ends (_signaller), the cause is said without confidence, with that count."""
    hedged: list[Evidence] = []
    got = _explain_sleep(ctx, f, io, hedged)
    return replace(got, confident=False, evidence=[*got.evidence, *hedged]) if hedged else got


def _explain_sleep(ctx: Ctx, f: Finding, io: bool, hedged: list[Evidence]) -> Explained:
    t = f.thread
    sql, got = _wakers(ctx, t.pid, t.tid, f.window, io)  # the IO part's sleeps are those in D state
    total = sum(int(r[5] or 0) for r in got) or 1
    known = [r for r in got if r[0] is not None]
    if not known:
        return _sleep_without_waker(ctx, f, io, sql)
    kind, own_syscall, kind_share, kind_sql = _own_kind(ctx, f, io)
    tasks = [r for r in known if r[3] not in ("irq", "softirq")]
    timed_futex = known[0][3] in ("irq", "softirq") and known[0][7] in ("futex", "futex_waitv")
    # a poll/select/epoll wait run out by its timer again and again (an event loop's tick) waits, like a timed futex
    # wait, for whatever ends it when it does not time out: the task that signals it is read the same way
    timed_poll = known[0][3] == "irq" and known[0][7] in TIMEOUT_WAITS
    waited = _python_wait(ctx, f, any_frame=timed_poll) if timed_futex or timed_poll else None
    if timed_futex:
        holder = _timed_lock_holder(ctx, f, sql, known, total, waited)
        if holder:
            return holder
    signaller = _signaller(ctx, f, waited[0], known) if waited is not None else None
    if signaller is not None:
        # timed waits in a Python wait whose signalled ends one task made: that task is what it waits for
        known = [signaller[0]] + [r for r in known if r is not signaller[0]]
        hedged += [waited[2], *signaller[1]]
    elif timed_futex and tasks and int(tasks[0][5] or 0) >= 0.2 * total:
        # a lock wait with a timeout (the GIL waits 5 ms, then asks for the lock): the timer ends the wait, the task
        # that releases the lock is the one it waits on
        known = tasks + [r for r in known if r not in tasks]
    wpid, wtid, wcomm, wctx, _n, wns, io_ns, syscall = (int(known[0][0]), int(known[0][1]), *known[0][2:])
    rel = "interrupt" if wctx in ("irq", "softirq") else ctx.relation(t.pid, wpid, wtid, wcomm)
    culprits = []
    for r in known[:5]:
        if r[3] in ("irq", "softirq"):
            continue  # the task an interrupt landed on did not wake anyone
        rel_r = ctx.relation(t.pid, int(r[0]), int(r[1]), r[2])
        if culprits and int(r[5] or 0) < (JOB_WAKER_MIN_SHARE if rel_r in JOB else WAKER_MIN_SHARE) * total:
            continue  # a task that ended a few sleeps (a harness's signal, a thread's rare wake-up): evidence only
        culprits.append(Culprit(pid=int(r[0]), tids=[int(r[1])], comm=ctx.names.get(int(r[1])) or r[2], relation=rel_r,
                                ns=int(r[5] or 0)))
    if signaller is not None:  # what it waited on for all the time it slept in that wait, not the few signals' time
        culprits[0].ns = signaller[2]
    share = int(wns or 0) / total
    ev = [Evidence(name="who ended the sleeps (share of the sleep time)", value="; ".join(
        f"""{'an interrupt (' + str(r[3]) + ', landed on ' + str(r[2]) + ')' if r[3] in ('irq', 'softirq')
             else ctx.who(int(r[0]), int(r[1]), r[2])} """
        f"{100 * int(r[5] or 0) / total:.0f}%" for r in known[:5]), sql=sql),
        Evidence(name="what the sleeps waited in (kernel stack at switch-out, or the system call)",
                 value=f"{kind}: {KIND_LABEL.get(kind, kind)} {100 * kind_share:.0f}%", sql=kind_sql)]
    in_what = f" {KIND_LABEL.get(kind, kind)}" + (f" ({own_syscall}())" if own_syscall else "")
    if _is_timed(syscall, wctx, rel) or (kind == "timer" and rel in ("interrupt", "kernel")):
        polled = _poll_target(ctx, f, sql, known, total)
        if polled is not None:
            return polled
        return Explained(cause=rc.TIMED_SLEEP, evidence=ev, confident=False,
                         reason=f"asleep{in_what} until its timer fired ({100 * share:.0f}% of the sleep): "
                                "the program sleeps on purpose (time.sleep, a rate limit, polling)")
    if rel in ("interrupt", "kernel") or (io_ns or 0) >= 0.5 * int(wns or 1):
        by = "an interrupt" if rel == "interrupt" else f"the kernel ({wcomm})"
        named = ([Culprit(comm=f"{wctx} (landed on {wcomm})", relation="interrupt", ns=int(wns or 0))]
                 if rel == "interrupt"
                 else [Culprit(pid=wpid, tids=[wtid], comm=wcomm, relation="kernel", ns=int(wns or 0))])
        if kind == "socket":
            peer = f"; the packets' interrupts landed on {wcomm}[{wpid}]" if rel == "interrupt" else ""
            landed = ctx.relation(t.pid, wpid, wtid, wcomm) if rel == "interrupt" else "kernel"
            if rel == "interrupt" and landed not in ("kernel", "unknown") and wpid not in (0, t.pid):
                # on loopback a packet's softirq runs in the context of the task at the other end: the peer
                named = [Culprit(pid=wpid, tids=[wtid], comm=ctx.procs.get(wpid, (None, wcomm, None))[1] or wcomm,
                                 relation=landed, ns=int(wns or 0))] + named
            peer_who = (ctx.who(wpid, None, named[0].comm) if len(named) > 1
                        else f"an interrupt ({wctx}, landed on {wcomm})")
            return Explained(cause=rc.NETWORK_WAIT, culprits=named, evidence=ev,
                             numbers={"syscall": own_syscall or "?", "waker": peer_who,
                                      "doing": f"the thread in {own_syscall or 'a socket call'}()"},
                             confident=f.mode == "contrast",
                             reason=f"asleep{in_what}, woken by {by} ({100 * share:.0f}% of the sleep){peer}: " + (
                                 "it waited for the receiver to take what it sent" if own_syscall in rc.SEND_SYSCALLS
                                 else "it waited on the network"))
        cause = rc.IO_WAIT if (io_ns or 0) > 0 or io or kind in IO_KINDS else rc.SLEEP_KERNEL
        reason = (f"asleep{in_what}, woken by {by}"
                  + (f": {100 * (io_ns or 0) / max(int(wns or 1), 1):.0f}% uninterruptible (IO)" if io_ns else ""))
        if kind == "reclaim" and kind_share >= 0.5:
            # What ends a reclaim wait (the throttle's timer, a write-back's interrupt) did not cause it: the thread's
            # own memory use (a cgroup over memory.high, a host short of free pages) did.
            return Explained(cause=rc.IO_WAIT, evidence=ev, numbers={"syscall": own_syscall or "?", "io_stop": kind},
                             reason=f"asleep{in_what} ({100 * kind_share:.0f}% of the sleep; the kernel reclaimed "
                                    "memory for it, or throttled it, before its allocations could go on): its "
                                    "cgroup was over its memory limit (memory.high) or the host short of free memory")
        # Outside a slowdown, a sleep the kernel ends (a packet, a device) is the job waiting for its input: the pace
        # of what feeds it, not lost time, unless it is IO (D state) or it grew in a slow phase.
        return Explained(cause=cause, reason=reason, culprits=named, evidence=ev,
                         numbers={"syscall": own_syscall or "?", "io_stop": kind},
                         confident=cause == rc.IO_WAIT or f.mode == "contrast")
    traced = {(int(p), int(x)) for p, x in ctx.traced_threads()}
    pool = waker_pool(ctx, t.pid, known, total)
    if pool is not None and share < POOL_SHARE and not hedged:
        return _explain_pool(ctx, f, pool, traced, ev, culprits, total, kind, in_what)
    # a signalled wait: what the signaller did over all the thread's sleeps (it ran at each signal, by definition)
    path = follow(ctx.con, (t.pid, t.tid), (wpid, wtid), f.window, traced, every_sleep=signaller is not None)
    ev += _path_evidence(ctx, path, f"{ctx.who(t.pid, t.tid)} slept")
    # a signalled Python wait: its futex is the signal (a condition, an event, a queue), not a lock the waker holds
    return _explain_path(ctx, f, path, ev, culprits, share, "signal" if hedged else kind, in_what)


def _explain_pool(ctx: Ctx, f: Finding, pool: list[tuple[int, int, int]], traced: set[tuple[int, int]],
                  ev: list[Evidence], culprits: list[Culprit], total: int, kind: str, in_what: str) -> Explained:
    """A sleep ended by a pool of threads: the wait-for path from each member (the largest POOL_FOLLOWED), where they
    stopped weighted by the sleep each ended; the cause is the one most of the pool's share stopped at, explained
    through its largest member's path."""
    t = f.thread
    weight: dict[str, int] = defaultdict(int)
    paths: list[tuple[WaitPath, int]] = []
    for pid, tid, ns in pool[:POOL_FOLLOWED]:
        path = follow(ctx.con, (t.pid, t.tid), (pid, tid), f.window, traced)
        paths.append((path, ns))
        weight[path.stop] += ns
    stop = max(weight, key=lambda k: weight[k])
    path, _ns = max(((p, ns) for p, ns in paths if p.stop == stop), key=lambda pn: pn[1])
    pool_ns = sum(m[2] for m in pool)
    followed = sum(ns for _p, ns in paths)
    names = {ctx.names.get(m[1]) or "?" for m in pool}
    name = names.pop() if len(names) == 1 else f"{pool_stem(ctx.names.get(pool[0][1])) or '?'}*"
    ids = _id_range(sorted(m[1] for m in pool))
    ev.append(Evidence(name=f"where the wait-for walks from the {len(paths)} busiest of {len(pool)} waking "
                            f"threads named {name} stopped (share of the sleep they ended)",
                       value="; ".join(f"{k} {100 * v / max(followed, 1):.0f}%"
                                       for k, v in sorted(weight.items(), key=lambda kv: -kv[1]))))
    ev += _path_evidence(ctx, path, f"{ctx.who(t.pid, t.tid)} slept")
    seen = {c.tids[0] for c in culprits if c.tids}
    culprits += [Culprit(pid=pid, tids=[tid], comm=ctx.names.get(tid) or name,
                         relation=ctx.relation(t.pid, pid, tid, ctx.names.get(tid)), ns=ns)
                 for pid, tid, ns in pool if tid not in seen]
    pooled = f"woken by {len(pool)} threads named {name} ({ids}, {100 * pool_ns / total:.0f}% of the sleep together)"
    ex = _explain_path(ctx, f, path, ev, culprits, pool_ns / total, kind, in_what, pooled)
    if kind == "futex" and ex.cause == rc.WAITING_ON_THREAD:
        # the work waited for ran under a lock the pool itself queues for: a convoy, not a producer to wait on
        sql = convoy_sql(t.pid, [m[1] for m in pool], f.window)
        queued = float(rows(ctx.con, sql)[0][0] or 0.0)
        if queued >= CONVOY_SHARE:
            ev.append(Evidence(name=f"share of the window the {len(pool)} threads named {name} slept on futexes "
                                    "that one of them ended", value=sql_round(queued, 3), sql=sql))
            own = own_lock(ctx, t.pid, [m[1] for m in pool], f.window)  # not the GIL: a lock of the program's
            if own is not None:
                ev.append(own[1])
            lock_text = f" (a lock of the program's own, taken in {own[0]})" if own else ""
            return replace(ex, cause=rc.LOCK_OR_GIL, evidence=ev,
                           numbers={**ex.numbers, **({"lock_own": own[0]} if own else {})},
                           reason=f"{pooled}; they hold one lock in turn{lock_text}: each slept {100 * queued:.0f}% "
                                  "of the window on a futex one of the others released, and the thread queued behind "
                                  "them")
    return ex if ex.reason.startswith(pooled) else replace(ex, reason=f"{pooled}; {ex.reason}")


GIL_WAIT_MS = (4.5, 5.5)  # timed-out futex waits this long on average: CPython's GIL, its 5 ms switch interval


def _explain_path(ctx: Ctx, f: Finding, path: WaitPath, ev: list[Evidence], culprits: list[Culprit], share: float,
                  kind: str, in_what: str, pooled: str | None = None) -> Explained:
    """_explain_walk's cause, and whether the path ran through the job's collective communication (its fix)."""
    ex = with_turns(ctx, _explain_walk(ctx, f, path, ev, culprits, share, kind, in_what, pooled), f.thread.pid,
                    path, f.window)  # workers that queue for what they share: not too few of them
    ex = held_lock(ctx, f, path, ex, kind, pooled)  # a lock of the program's own, held by the waker over its work
    found = collective(ctx, path)
    return ex if found is None else replace(ex, numbers={**ex.numbers, **found[0]}, evidence=[*ex.evidence, found[1]])


def _explain_walk(ctx: Ctx, f: Finding, path: WaitPath, ev: list[Evidence], culprits: list[Culprit], share: float,
                  kind: str, in_what: str, pooled: str | None = None) -> Explained:
    """The cause where the wait-for path stopped (waits.follow), named from what its last thread did; `pooled`: the
    sleep was ended by a pool (_explain_pool), said so in place of the one waker this walk started from."""
    t = f.thread
    first, end = path.hops[0], path.end
    who, end_who = ctx.who(first.pid, first.tid), ctx.who(end.pid, end.tid)
    end_rel = ctx.relation(t.pid, end.pid, end.tid, ctx.names.get(end.tid))
    via = "" if end is first else f", itself waiting on {end_who}"
    before = path.hops[-2] if len(path.hops) >= 2 else None
    locked = False
    if before is not None and before.timed_out and before.pid == end.pid:  # followed past its timeouts
        n, ns = before.timed_out
        mean_ms = ns / max(n, 1) / 1e6
        # CPython's GIL wait times out every switch interval (5 ms), asks the holder to drop it, and waits again
        locked = before.followed_kind == "futex" and GIL_WAIT_MS[0] <= mean_ms <= GIL_WAIT_MS[1]
        via = (f", itself waiting on its GIL most likely, which its thread {end_who} held (futex waits that timed out "
               f"{n:,} times after {mean_ms:.1f} ms on average, the GIL's switch interval)" if locked else
               f", itself waiting on its thread {end_who}, which ended its {before.followed_kind} waits that did not "
               f"time out ({n:,} did)")
    if end is not first:
        ev.append(Evidence(name="wait chain (who woke whom)",
                           value=" <- ".join(ctx.who(h.pid, h.tid) for h in path.hops)))
        culprits.insert(0, Culprit(pid=end.pid, tids=[end.tid], comm=ctx.names.get(end.tid), relation=end_rel,
                                   ns=end.total_ns))
    woke = (f"{pooled};{in_what}" if pooled else
            f"woken by {who} ({100 * share:.0f}% of the sleep{';' if not via else ''}{in_what if not via else ''})")
    doing = doing_text(ctx.con, end)
    numbers = {"waker": end_who, "doing": doing}
    # where a pool ended the sleep (said before, with its share together), the thread walked from is one of them
    read = "the one of them read" if pooled else f"{100 * share:.0f}% of the sleep"
    if path.stop == "cpu_wait":
        starved = explain_cpu_wait(ctx, Finding(thread=ThreadAccount(pid=end.pid, tid=end.tid, role="waited-on",
                                                                     total=Account()), part="cpu_wait", window=f.window,
                                                seconds_lost=0.0, mode=f.mode, share=0.0, ks=f.ks), job=t.pid)
        # the hop it slept on first, then the one that starved (through a socket to a server, a pipe to its
        # worker); hops within one process (a worker's queue thread, then its main thread) are that process
        one = first.pid == end.pid
        lead = f"{_role(ctx.relation(t.pid, first.pid, first.tid, ctx.names.get(first.tid)))} " + (
            end_who if one else who)
        # the share is of the sleep the first waker ended: said of it where the walk went on to another thread
        through = f"through {who}, which ended " if one and end is not first else ""
        return Explained(cause=starved.cause, culprits=starved.culprits, evidence=ev + starved.evidence,
                         numbers={**starved.numbers, "waker": end_who, "doing": doing},
                         reason=(f"waiting on {lead} ({'' if pooled else through}{read},{in_what})"
                                 f"{'' if one else via}, which was "
                                 f"{doing}: it waited for a CPU {starved.reason}"))
    if path.stop == "running":
        ran = _run_to_exit(ctx, t, end.pid, f.window) if end_rel == "child process" else None
        if ran is not None and not _is_data_worker(ctx.names.get(end.tid)):
            span, life = ran
            return Explained(cause=rc.WAITING_ON_PROCESS, culprits=culprits, evidence=[*ev, *life],
                             numbers={**numbers, "child_run": span},
                             reason=f"waiting on its child process {end_who} ({read},"
                                    f"{in_what}{via}), which was {doing} from its start to its exit ({span}), "
                                    "the thread making no CUDA call meanwhile: it waited for a program it ran to "
                                    "finish, not for a worker that feeds it")
        if end_rel == "child process":
            through_pool(ctx, culprits, path, t.pid)
            kids = [c for c in culprits if c.relation == "child process"]
            names = _by_name(ctx, kids, also=() if end is first else siblings(ctx, t.pid, end.pid, f.window)) or end_who
            via = via if locked or end is first else f", through {who}"  # the workers are named: the hop between
            if locked:
                return Explained(cause=rc.INPUT_WAIT, culprits=culprits, evidence=ev,
                                 numbers={**numbers, "worker_gil": end_who},
                                 reason=f"waiting on its worker processes {names} ({100 * share:.0f}% of the "
                                        f"sleep,{in_what}{via}), which was {doing}: the worker waited for that "
                                        "thread, not for work")
            one_kid = "," not in names and "-" not in names.rsplit("[", 1)[-1]  # one process named, not a range
            pace = workers_pace(ctx, t.pid, end, f.window)
            verdict = (f"{'it was' if one_kid else 'they were'} starting up, importing modules" if
                       pace["workers_importing"] else f"{'it does' if one_kid else 'they do'} not keep up")
            return Explained(cause=rc.INPUT_WAIT, culprits=culprits, evidence=ev, numbers={**numbers, **pace},
                             reason=f"waiting on its worker process{'' if one_kid else 'es'} {names} "
                                    f"({100 * share:.0f}% of the sleep,{in_what}{via}), which "
                                    f"{'was' if one_kid else 'were'} {doing}: {verdict}")
        if end_rel == "same process" and end is first and _autograd(ctx.names.get(end.tid)):
            # backward() hands the graph to PyTorch's autograd thread and sleeps until it is done: the step's own
            # host work (its backward's kernels launched there), the same story as the thread's own running
            work = host_work(ctx, end.pid, end.tid, f.window, "its")
            how = "(launching its kernels)"
            extra: dict[str, object] = {"framework": f"its backward pass, run by {end_who}"}
            if work is not None and "compiling" in work[1]:
                how, extra = f"({work[0]})", work[1]
                ev.append(work[2])
            mine = [k for k in culprits if end.tid in k.tids] or culprits  # the backward's thread, not other wakers
            return Explained(cause=rc.HOST_BOUND, culprits=mine, evidence=ev, numbers={**numbers, **extra},
                             reason=f"{woke}; {end_who}, PyTorch's autograd thread, which runs the backward pass the "
                                    f"thread hands it and wakes it when done, was {doing}: the step's own backward "
                                    f"{how} is host work the GPU waits on")
        if end_rel == "same process":
            return Explained(cause=rc.WAITING_ON_THREAD, culprits=culprits, evidence=ev, numbers=numbers,
                             reason=f"{woke}{via}; {end_who} was {doing} while it waited: the thread waited on "
                                    + (f"the pool's work ({end_who}'s and the others')" if pooled else
                                       f"{end_who}'s work"))
        return Explained(cause=rc.WAITING_ON_PROCESS, culprits=culprits, evidence=ev, numbers=numbers,
                         reason=f"{woke}{via}; {end_who} ({end_rel}) was {doing}: that process sets the pace")
    if path.stop == "timer":
        # what the last waiting thread waited in when the end woke it: the first thread's own kind on a direct edge
        channel = kind if end is first else _channel(path)
        if channel == "pipe" and end is first:
            return Explained(cause=rc.SLOW_CONSUMER, culprits=culprits, evidence=ev, numbers=numbers,
                             reason=f"blocked on a pipe ({100 * share:.0f}% of the sleep) until {who} took its data"
                                    f"; {end_who} was {doing}: the other end sleeps on its own timer and keeps the "
                                    "thread waiting")
        if channel == "pipe":
            return Explained(cause=rc.SLOW_CONSUMER, culprits=culprits, evidence=ev, numbers=numbers,
                             reason=f"woken by {who} ({100 * share:.0f}% of the sleep;{in_what}), which was itself "
                                    f"blocked on a pipe until {end_who} took its data; {end_who} was "
                                    f"{doing}: the other end sleeps on its own timer and keeps both waiting")
        # a Python wait for another thread's signal (a queue's get, a condition, an event) ended by a thread that
        # sleeps on its own timer is fed at that thread's pace, not held up by a lock it keeps while asleep
        signalled = _python_wait(ctx, f) if channel == "futex" and end is first else None
        if signalled is not None:
            frame, in_share, where = signalled
            return Explained(cause=rc.WAITING_ON_THREAD if end_rel == "same process" else rc.WAITING_ON_PROCESS,
                             culprits=culprits, evidence=[*ev, where], numbers={**numbers, "paced": "timer"},
                             reason=f"{woke}; asleep in {frame.label()} ({in_share:.0f}% of its sleep with a stack): "
                                    f"it waits for what {end_who} makes, and {end_who} was {doing}: it paces the "
                                    "thread with its own sleeps")
        if channel == "futex":
            return Explained(cause=rc.LOCK_OR_GIL, culprits=culprits, evidence=ev, numbers={**numbers,
                                                                                           "lock_held": "asleep"},
                             reason=f"{woke}{via}; {end_who} was {doing} while the thread waited: {end_who} held the "
                                    "lock (or the queue) the thread needed while it slept")
        return Explained(cause=rc.WAITING_ON_PROCESS if end_rel != "same process" else rc.WAITING_ON_THREAD,
                         culprits=culprits, evidence=ev, numbers=numbers,
                         reason=f"{woke}{via}; {end_who} was {doing}: it paces the thread with its own sleeps")
    if path.stop in IO_KINDS:
        return Explained(cause=rc.IO_WAIT, culprits=culprits, evidence=ev, numbers={**numbers, "io_stop": path.stop},
                         reason=f"{woke}{via}; {end_who} was {doing}: the wait began in its IO")
    if path.stop == "socket":
        peer = ""
        if path.peer and path.peer[1] is not None:
            peer = f"; its packets' interrupts landed on {ctx.who(path.peer[0], path.peer[1], path.peer[2])}"
            ppid = path.peer[0]
            if ppid is not None and ppid not in ctx.family(t.pid) or ppid is not None:
                culprits.insert(0, Culprit(pid=ppid, tids=[], comm=ctx.procs.get(ppid, (None, path.peer[2], None))[1]
                                           or path.peer[2], relation=ctx.relation(t.pid, ppid, None, path.peer[2]),
                                           ns=end.total_ns))
        return Explained(cause=rc.NETWORK_WAIT, culprits=culprits, evidence=ev, numbers=numbers,
                         reason=f"{woke}{via}; {end_who} was {doing}: the wait began on the network{peer}")
    if path.stop == "gpu":
        return Explained(cause=rc.GPU_SLOWER, culprits=culprits, evidence=ev, numbers=numbers, confident=False,
                         reason=f"{woke}{via}; {end_who} was {doing}: the wait began in the GPU driver")
    if path.stop == "untraced":
        return Explained(cause=rc.WAITING_ON_PROCESS, culprits=culprits, evidence=ev, numbers=numbers, confident=False,
                         reason=f"{woke}{via}; {end_who} is not traced, so what it did is not recorded")
    # 'sleeper' (they take turns), 'interrupt', 'mixed', 'depth': the last thread's own share is the answer
    # a walk through PyTorch's autograd thread: its backward pass waited on that process, which a loader's workers
    # never feed (they hand batches to the loop's next(); natural_compile_dynamic_shapes: inductor's compile pool)
    backward = end is not first and _autograd(ctx.names.get(first.tid))
    cause = rc.INPUT_WAIT if end_rel == "child process" and not backward else rc.WAITING_ON_THREAD \
        if end_rel == "same process" else rc.WAITING_ON_PROCESS
    turns = f"; it waits on {ctx.who(t.pid, t.tid)} in turn" if path.stop == "sleeper" else ""
    return Explained(cause=cause, culprits=culprits, evidence=ev, numbers=numbers, confident=path.stop != "mixed",
                     reason=f"{woke}{via}; {end_who} was {doing}{turns}")


def _run_to_exit(ctx: Ctx, t: ThreadAccount, pid: int, w: TimeWindow) -> tuple[str, list[Evidence]] | None:
    """A child process whose whole life lies in the window (started and exited within it, to the second) while the
    waiting thread made no CUDA call: a program the thread ran and waited for (subprocess.run), not a server or worker
    that fed it meanwhile. ('+24.1 s to +25.5 s', the evidence), or None."""
    sql = ("SELECT '+' || round((min(p.first_seen_ns) - any_value(o.t0)) / 1e9, 1) || ' s to +' || "
           "round((max(p.exit_ns) - any_value(o.t0)) / 1e9, 1) || ' s' AS span, min(p.first_seen_ns) AS born, "
           f"max(p.exit_ns) AS gone FROM processes p, (SELECT min(started_ns) AS t0 FROM sessions) o "
           f"WHERE p.pid = {int(pid)}")
    got = rows(ctx.con, sql)
    if not got or got[0][1] is None or got[0][2] is None:
        return None
    span, born, gone = got[0]
    if born < w.start_ns - SECOND_NS or gone > w.end_ns + SECOND_NS:
        return None
    calls_sql = (f"SELECT count(*) FROM cuda_calls WHERE pid = {t.pid} AND tid = {t.tid} AND ts_ns BETWEEN {born} AND "
                 f"{gone}")
    if rows(ctx.con, calls_sql)[0][0]:
        return None  # it went on with its own work meanwhile: fed by the child, not waiting for it to end
    return span, [Evidence(name=f"{ctx.who(pid, None)} lived (from its start to its exit)", value=span,
                           sql=f"SELECT span FROM ({sql})"),
                  Evidence(name=f"CUDA calls of {ctx.who(t.pid, t.tid)} while it lived", value=0, sql=calls_sql)]


def worker_share_sql(pids: list[int], ks: tuple[int, int]) -> str:
    """How much of the window worker processes ran, per role: each process's busiest thread (the one doing its work)
    and, apart, its other threads (queue feeders, pin-memory and other helpers that mostly sleep and would dilute the
    share); columns role, threads, run %."""
    return " ".join(f"""
        WITH t AS (SELECT pid, tid, sum(run_outside_ns + run_inside_ns) AS run_ns, sum(wall_ns) AS wall_ns
                   FROM thread_seconds WHERE pid IN ({', '.join(map(str, pids))}) AND k BETWEEN {ks[0]} AND {ks[1]}
                   GROUP BY pid, tid),
        w AS (SELECT pid, arg_max(tid, run_ns) AS tid FROM t GROUP BY pid)
        SELECT CASE WHEN w.tid IS NULL THEN 'helper threads' ELSE 'worker threads' END AS role, count(*) AS threads,
               round(100.0 * sum(t.run_ns) / nullif(sum(t.wall_ns), 0)) AS run_pct
        FROM t LEFT JOIN w USING (pid, tid) GROUP BY 1 ORDER BY 1 DESC""".split())


def _sleep_without_waker(ctx: Ctx, f: Finding, io: bool, sql: str) -> Explained:
    """No waker recorded (a v1 store): what the job's child processes did meanwhile, per role: each one's busiest
    thread (its work) apart from its helper threads."""
    t = f.thread
    kids = sorted(ctx.family(t.pid) - {t.pid})
    ev = [Evidence(name="wakers", value="not recorded (a v1 store): who woke the thread is unknown", sql=sql)]
    if kids:
        share_sql = worker_share_sql(kids, f.ks)
        roles = {str(r): (int(n), None if pct is None else float(pct)) for r, n, pct in rows(ctx.con, share_sql)}
        workers = roles.get("worker threads")
        if workers and workers[1] is not None and workers[1] >= 30:
            pids = sorted({int(p) for (p,) in rows(ctx.con, f"SELECT DISTINCT pid FROM {SECONDS_TABLE} WHERE pid IN "
                                                             f"({', '.join(map(str, kids))}) AND k BETWEEN {f.ks[0]} "
                                                             f"AND {f.ks[1]}")})
            comm = ctx.names.get(pids[0]) or ctx.procs.get(pids[0], (None, "?", None))[1]
            helpers = roles.get("helper threads")
            aside = (f"; their {helpers[0]} helper threads ran {helpers[1]:.0f}%" if helpers and helpers[1] is not None
                     else "")
            ev.append(Evidence(name="the workers' share of the window on a CPU, per role (each process's "
                                    "busiest thread; its other threads apart)",
                               value=f"worker threads {workers[1]:.0f}%{aside}", sql=share_sql))
            culprits = [Culprit(pid=None, tids=pids, comm=comm, relation="child process", ns=0)]
            return Explained(cause=rc.INPUT_WAIT, culprits=culprits, evidence=ev, confident=False,
                             reason=(f"while its child processes {comm}[{_id_range(pids)}] ran on-CPU "
                                     f"{workers[1]:.0f}% of that time (their busiest threads{aside}; waker not "
                                     "recorded: likely waiting on them)"))
    cause = rc.IO_WAIT if io else rc.SLEEP_UNKNOWN
    return Explained(cause=cause, reason="on something the store does not name (waker not recorded)", evidence=ev,
                     confident=False)
