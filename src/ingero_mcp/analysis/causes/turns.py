"""Worker processes that take turns: each sleeps until another of them wakes it.

A pool of workers that a job waits on does not keep up for one of two reasons: each is busy (more of them help, where
CPUs are free), or they queue for something they share, a lock around their reads (fcntl.flock, a
multiprocessing.Lock) or one file or connection, so that only one works at a time and more of them do not help. The
second shows in the scheduler's rows: a worker's sleep ended by another worker of the pool, the one that let go
(natural_flock_hdf5_workers: four DataLoader workers took an exclusive flock around every read, each slept 62% of the
run until another released it; in every other store with workers no such sleep was recorded).
"""

from __future__ import annotations

from dataclasses import replace

from ingero_mcp.analysis import recommend as rc
from ingero_mcp.analysis._sql import sql_round, sql_str
from ingero_mcp.analysis.answers import shared_rows
from ingero_mcp.analysis.causes.context import Ctx
from ingero_mcp.analysis.causes.culprits import Explained
from ingero_mcp.analysis.models import Evidence, TimeWindow

TURNS_SHARE = 0.3  # of the window, per worker on average: slept until another worker woke it, the pool takes turns


def turns_sql(job: int, name: str, w: TimeWindow) -> str:
    """One row: the share of the window the job's child processes named `name` (their main threads) slept until
    another of them woke it, per such process alive in the window, and the system call they slept in the longest."""
    lo, hi = w.start_ns, w.end_ns
    return " ".join(f"""
        WITH k AS (SELECT pid FROM processes WHERE ppid = {int(job)} AND comm = {sql_str(name)}
                     AND coalesce(exit_ns, {hi}) > {lo} AND coalesce(first_seen_ns, {lo}) < {hi}),
        s AS (SELECT syscall, least(end_ns, {hi}) - greatest(start_ns, {lo}) AS ns FROM thread_state
              WHERE pid IN (SELECT pid FROM k) AND tid = pid AND state = 'sleeping' AND waker_context = 'task'
                AND waker_pid IN (SELECT pid FROM k) AND waker_pid <> pid AND end_ns > {lo} AND start_ns < {hi})
        SELECT round(sum(ns)::DOUBLE / ((SELECT count(*) FROM k) * {w.duration_ns}), 3) AS share,
               (SELECT syscall FROM s GROUP BY syscall ORDER BY sum(ns) DESC LIMIT 1) AS syscall FROM s""".split())


def workers_turns(ctx: Ctx, job: int, end_pid: int, w: TimeWindow) -> tuple[dict[str, object], Evidence] | None:
    """Where the workers named as the walk's end took turns (TURNS_SHARE or more): the numbers their fix cites
    (`workers_turns`: the share in %, `workers_turns_in`: ' in <syscall>()' where the call is named) and evidence."""
    name = ctx.procs.get(end_pid, (None, None, None))[1]
    if not name:
        return None
    sql = turns_sql(job, name, w)
    share, syscall = shared_rows(ctx.con, sql)[0]
    if share is None or float(share) < TURNS_SHARE:
        return None
    named = f" in {syscall}()" if syscall and not str(syscall).startswith("syscall_") else ""
    return {"workers_turns": f"{100 * float(share):.0f}", "workers_turns_in": named}, Evidence(
        name=f"share of the window each process named {name} slept until another of them woke it (then the system "
             "call slept in the longest)", value=sql_round(float(share), 3), sql=sql)


def with_turns(ctx: Ctx, ex: Explained, job: int, end_pid: int, w: TimeWindow) -> Explained:
    """A wait on worker processes (INPUT_WAIT; not those starting up, nor one held by its own thread's GIL), where
    they took turns: said so in place of their not keeping up, with the numbers of their fix and the evidence."""
    if ex.cause != rc.INPUT_WAIT or ex.numbers.get("workers_importing") or ex.numbers.get("worker_gil"):
        return ex
    got = workers_turns(ctx, job, end_pid, w)
    if got is None:
        return ex
    numbers, evidence = got
    said = (f"they took turns, each asleep {numbers['workers_turns']}% of the time{numbers['workers_turns_in']} until "
            "another of them woke it: they queue for something they share (a lock), more of them would not help")
    reason = ex.reason.replace("they do not keep up", said) if "they do not keep up" in ex.reason else \
        f"{ex.reason}; {said}"
    return replace(ex, numbers={**ex.numbers, **numbers}, evidence=[*ex.evidence, evidence], reason=reason)
