"""Worker processes that take turns: each sleeps until another of them wakes it.

A pool of workers that a job waits on does not keep up for one of two reasons: each is busy (more of them help, where
CPUs are free), or they queue for something they share, a lock around their reads (fcntl.flock, a
multiprocessing.Lock) or one file or connection, so that only one works at a time and more of them do not help. The
second shows in the scheduler's rows: a worker's sleep ended by another worker of the pool, the one that let go
(natural_flock_hdf5_workers: four DataLoader workers took an exclusive flock around every read, each slept 62% of the
run until another released it; in every other store with workers no such sleep was recorded), or by one other process
of the job that all of them ask, a server that answers them in turn (natural_manager_dict_sample_cache: four workers
asked a multiprocessing.Manager's server for every sample, the walk went through them to it).
"""

from __future__ import annotations

from dataclasses import replace

from ingero_mcp.analysis import recommend as rc
from ingero_mcp.analysis._sql import sql_round, sql_str
from ingero_mcp.analysis.answers import shared_rows
from ingero_mcp.analysis.causes.context import Ctx
from ingero_mcp.analysis.causes.culprits import Explained
from ingero_mcp.analysis.models import Evidence, TimeWindow
from ingero_mcp.analysis.waits import WaitPath

TURNS_SHARE = 0.3  # of the window, per worker on average: slept until another worker woke it, the pool takes turns


def turns_sql(job: int, name: str, w: TimeWindow, server: int | None = None) -> str:
    """One row: the share of the window the job's child processes named `name` (their main threads) slept until
    another of them woke it (or, with `server`, until that process woke it), per such process alive in the window,
    and the system call they slept in the longest."""
    lo, hi = w.start_ns, w.end_ns
    woken = (f"waker_pid = {int(server)}" if server is not None else
             "waker_pid IN (SELECT pid FROM k) AND waker_pid <> pid")
    return " ".join(f"""
        WITH k AS (SELECT pid FROM processes WHERE ppid = {int(job)} AND comm = {sql_str(name)}
                     AND coalesce(exit_ns, {hi}) > {lo} AND coalesce(first_seen_ns, {lo}) < {hi}),
        s AS (SELECT syscall, least(end_ns, {hi}) - greatest(start_ns, {lo}) AS ns FROM thread_state
              WHERE pid IN (SELECT pid FROM k) AND tid = pid AND state = 'sleeping' AND waker_context = 'task'
                AND {woken} AND end_ns > {lo} AND start_ns < {hi})
        SELECT round(sum(ns)::DOUBLE / ((SELECT count(*) FROM k) * {w.duration_ns}), 3) AS share,
               (SELECT syscall FROM s GROUP BY syscall ORDER BY sum(ns) DESC LIMIT 1) AS syscall FROM s""".split())


def workers_turns(ctx: Ctx, job: int, end_pid: int, w: TimeWindow, pool: int | None = None
                  ) -> tuple[dict[str, object], Evidence] | None:
    """Where the workers named as the walk's end took turns (TURNS_SHARE or more): the numbers their fix cites
    (`workers_turns`: the share in %, `workers_turns_in`: ' in <syscall>()' where the call is named) and evidence.
    With `pool` (a worker the walk passed through before it reached the end's process, of another name): where
    that pool's workers slept until the end's process woke them, as much (`workers_server`: who it is)."""
    name = ctx.procs.get(pool if pool is not None else end_pid, (None, None, None))[1]
    if not name:
        return None
    sql = turns_sql(job, name, w, server=end_pid if pool is not None else None)
    share, syscall = shared_rows(ctx.con, sql)[0]
    if share is None or float(share) < TURNS_SHARE:
        return None
    named = f" in {syscall}()" if syscall and not str(syscall).startswith("syscall_") else ""
    server = ctx.who(end_pid, None) if pool is not None else None
    until = f"{server} woke it" if server else "another of them woke it"
    return {"workers_turns": f"{100 * float(share):.0f}", "workers_turns_in": named,
            **({"workers_server": server} if server else {})}, Evidence(
        name=f"share of the window each process named {name} slept until {until} (then the system call slept in "
             "the longest)", value=sql_round(float(share), 3), sql=sql)


def _pool_before(ctx: Ctx, job: int, path: WaitPath) -> int | None:
    """The worker process the walk passed through before it entered its end's process, where that is another child
    process of the job of another name (workers asking one server): its pid; else None."""
    end = path.end
    entry = next(i for i, h in enumerate(path.hops) if h.pid == end.pid)
    if not entry:
        return None
    pool = path.hops[entry - 1].pid
    name = ctx.procs.get(pool, (None, None, None))[1]
    if pool == job or not name or name == ctx.procs.get(end.pid, (None, None, None))[1]:
        return None
    return pool if ctx.relation(job, pool, None, name) == ctx.relation(job, end.pid, None, None) == "child process" \
        else None


def with_turns(ctx: Ctx, ex: Explained, job: int, path: WaitPath, w: TimeWindow) -> Explained:
    """A wait on worker processes (INPUT_WAIT; not those starting up, nor one held by its own thread's GIL), where
    they took turns (at something they share, or asking one process they all ask): said so in place of their not
    keeping up, with the numbers of their fix and the evidence."""
    if ex.cause != rc.INPUT_WAIT or ex.numbers.get("workers_importing") or ex.numbers.get("worker_gil"):
        return ex
    pool = _pool_before(ctx, job, path)
    got = workers_turns(ctx, job, path.end.pid, w, pool)
    if got is None:
        return ex
    numbers, evidence = got
    if pool is not None:
        said = (f"the workers waited on {numbers['workers_server']}, each asleep {numbers['workers_turns']}% of the "
                f"time{numbers['workers_turns_in']} until it woke them: one process they all ask answers them in "
                "turn, more workers would queue there too")
    else:
        said = (f"they took turns, each asleep {numbers['workers_turns']}% of the time{numbers['workers_turns_in']} "
                "until another of them woke it: they queue for something they share (a lock), more of them would not "
                "help")
    reason = ex.reason.replace("they do not keep up", said) if "they do not keep up" in ex.reason else \
        f"{ex.reason}; {said}"
    return replace(ex, numbers={**ex.numbers, **numbers}, evidence=[*ex.evidence, evidence], reason=reason)
