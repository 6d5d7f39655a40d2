"""Who took the time: the tasks that held the CPU a thread waited for (or the cgroup quota that held it off an
idle one), grouped and named; the explanation of CPU waits.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
import re

from ingero_mcp.analysis import recommend as rc
from ingero_mcp.analysis._sql import rows, sql_round
from ingero_mcp.analysis.answers import shared_rows
from ingero_mcp.analysis.causes.context import Ctx, Finding, part_ns
from ingero_mcp.analysis.causes.sampler import sampler_work
from ingero_mcp.analysis.models import Culprit, Evidence, TimeWindow
from ingero_mcp.analysis.stacks import FRAMEWORK_COLUMNS, framework_share_sql, recorded
from ingero_mcp.analysis.waits import SATURATED, Hop, WaitPath, busy_share
from ingero_mcp.store.views import SECONDS_TABLE

def holders_sql(ctx: Ctx, pid: int, tid: int, w: TimeWindow) -> str:
    """Who held the CPU while the thread waited for one: its waits on each CPU in each 1 s bucket, shared among
    the other tasks by their on-CPU time on that CPU in that bucket (host_aggregates, kept per thread and CPU)."""
    return f"""
        WITH w AS (SELECT cpu, end_ns, dur_ns FROM thread_state
                   WHERE pid = {pid} AND tid = {tid} AND state = 'cpu_wait' AND cpu IS NOT NULL
                     AND end_ns > {w.start_ns} AND end_ns <= {w.end_ns}),
        occ AS (SELECT cpu, bucket_start_ns, bucket_ns, pid, tid, comm, sum_duration_ns AS on_ns FROM host_aggregates
                WHERE op = 'sched_switch' AND cpu IS NOT NULL AND pid <> 0 AND tid IS DISTINCT FROM {tid}
                  AND bucket_start_ns < {w.end_ns} AND bucket_start_ns + bucket_ns > {w.start_ns} - 1000000000),
        b AS (SELECT DISTINCT cpu, bucket_start_ns, bucket_ns FROM occ),
        wb AS (SELECT b.cpu, b.bucket_start_ns, sum(w.dur_ns) AS wait_ns
               FROM w ASOF JOIN b ON w.cpu = b.cpu AND b.bucket_start_ns <= w.end_ns
               WHERE w.end_ns < b.bucket_start_ns + b.bucket_ns GROUP BY ALL),
        tot AS (SELECT cpu, bucket_start_ns, sum(on_ns) AS all_on FROM occ GROUP BY ALL)
        SELECT o.pid, o.tid, min(o.comm) AS comm, sum(wb.wait_ns * o.on_ns / tot.all_on)::BIGINT AS ns,
               list(DISTINCT o.cpu ORDER BY o.cpu) AS cpus
        FROM wb JOIN occ o USING (cpu, bucket_start_ns) JOIN tot USING (cpu, bucket_start_ns)
        WHERE tot.all_on > 0
        GROUP BY o.pid, o.tid ORDER BY ns DESC LIMIT 50"""


def idle_during_waits_sql(pid: int, tid: int, w: TimeWindow) -> str:
    """The share of a thread's CPU waits during which the CPU it waited on was idle: each wait weighted by its CPU's
    idle time (host_aggregates pid 0, that CPU's idle task) in its 1 s bucket over all time on that CPU then. A
    runnable thread whose CPU was idle was not waiting behind anyone (a quota, an affinity, the scheduler)."""
    return " ".join(f"""
        WITH w AS (SELECT cpu, end_ns, dur_ns FROM thread_state
                   WHERE pid = {pid} AND tid = {tid} AND state = 'cpu_wait' AND cpu IS NOT NULL
                     AND end_ns > {w.start_ns} AND end_ns <= {w.end_ns}),
        occ AS (SELECT cpu, bucket_start_ns, bucket_ns, sum(sum_duration_ns) AS on_ns,
                       sum(sum_duration_ns) FILTER (WHERE pid = 0) AS idle_ns FROM host_aggregates
                WHERE op = 'sched_switch' AND cpu IS NOT NULL AND tid IS DISTINCT FROM {tid}
                  AND bucket_start_ns < {w.end_ns} AND bucket_start_ns + bucket_ns > {w.start_ns} - 1000000000
                GROUP BY ALL),
        wb AS (SELECT o.cpu, o.bucket_start_ns, sum(w.dur_ns) AS wait_ns
               FROM w ASOF JOIN occ o ON w.cpu = o.cpu AND o.bucket_start_ns <= w.end_ns
               WHERE w.end_ns < o.bucket_start_ns + o.bucket_ns GROUP BY ALL)
        SELECT round(100.0 * sum(wb.wait_ns * coalesce(o.idle_ns, 0) / o.on_ns) / sum(wb.wait_ns), 1) AS idle_pct
        FROM wb JOIN occ o USING (cpu, bucket_start_ns) WHERE o.on_ns > 0""".split())


def throttling_sql(pid: int, w: TimeWindow) -> str:
    """The process's cgroup CPU quota and throttling over the window (cgroup_samples: counters are cumulative, so a
    window's throttling is the last sample's less the first's), its own cgroup and ancestors with a quota."""
    return " ".join(f"""
        SELECT cgroup, own, min(quota_us) AS quota_us, any_value(period_us) AS period_us,
               round((max(throttled_usec) - min(throttled_usec)) / 1e6, 2) AS throttled_s,
               max(nr_throttled) - min(nr_throttled) AS throttled_periods
        FROM cgroup_samples WHERE pid = {int(pid)}
          AND ts_ns BETWEEN {w.start_ns - 1_000_000_000} AND {w.end_ns + 1_000_000_000}
        GROUP BY cgroup, own ORDER BY throttled_s DESC NULLS LAST, own DESC""".split())


def _throttled(ctx: Ctx, f: Finding, job: int, idle_pct: float, idle_sql: str) -> Explained | None:
    """A thread runnable while its CPU was mostly idle: its cgroup's CPU quota, where the cgroup samples say it
    throttled the process; else nothing (the caller says the waits were not behind other tasks)."""
    t = f.thread
    sql = throttling_sql(t.pid, f.window)  # the waiting thread's own process: a worker's cgroup is not the job's
    got = rows(ctx.con, sql)
    if not got or got[0][4] is None or float(got[0][4]) <= 0:
        return None
    cgroup, _own, quota, period, throttled_s, periods = got[0]
    wait_s = part_ns(f.thread.total, "cpu_wait") / 1e9 if f.thread.total.wall_ns else None
    if wait_s is not None and wait_s > 0 and float(throttled_s) < 0.2 * min(wait_s, f.window.duration_ns / 1e9):
        return None
    limit = (f"{quota:,} us per {period:,} us ({100 * quota / period:.0f}% of one CPU)" if quota and period
             else "no quota on its own cgroup (an ancestor's, or a change within the window)")
    # cpu.stat's throttled time is summed over the CPUs whose run queues were throttled (the kernel adds each run
    # queue's throttled stretch): a cgroup on two CPUs counts up to twice the wall time. Each throttled period holds
    # the cgroup off for at most that period, so periods x period bounds the wall time it was held off.
    throttled = float(throttled_s)
    bound_s = int(periods) * int(period) / 1e6 if periods and period else None
    summed = bound_s is not None and bound_s < throttled  # over its periods: a sum over CPUs
    wall_s = bound_s if summed and bound_s is not None else throttled
    if summed:
        held = (f"was throttled in {int(periods):,} periods of this window, at most {bound_s:.1f} s of wall time "
                f"(periods x period; {throttled:.1f} s summed over the CPUs whose run queues were throttled, as "
                "cpu.stat counts it)")
    else:
        held = f"was throttled {throttled:.1f} s in {int(periods or 0):,} periods of this window"
    ev = [Evidence(name="share of the CPU waits during which that CPU was idle", value=idle_pct, unit="%",
                   sql=idle_sql),
          Evidence(name=f"seconds cgroup {cgroup} was throttled in the window (cpu.stat)", value=float(throttled_s),
                   unit="s", sql=f"SELECT throttled_s FROM ({sql}) LIMIT 1"),
          Evidence(name="the cgroup and its CPU quota (the tightest in the window: us per period)",
                   value=f"{cgroup}: {quota or 'max'} / {period or '?'}", sql=sql)]
    if summed and bound_s is not None:
        ev.append(Evidence(name=f"throttled periods x period of cgroup {cgroup} (the most wall time it was held off)",
                           value=round(bound_s, 1), unit="s",
                           sql=f"SELECT round(throttled_periods * period_us / 1e6, 1) FROM ({sql}) LIMIT 1"))
    return Explained(cause=rc.CPU_THROTTLED, evidence=ev,
                     culprits=[Culprit(comm=f"cgroup {cgroup}", relation="cgroup quota", ns=int(wall_s * 1e9))],
                     numbers={"cgroup": cgroup, "quota": limit,
                              "throttled": held.removeprefix("was ")},
                     reason=(f"held off the CPU by its cgroup's CPU quota: {cgroup} allows {limit} and {held}, "
                             f"while the CPU it waited on was idle {idle_pct:.0f}% of that time"))


def first_holders_sql(pid: int, tid: int, w: TimeWindow) -> str:
    """Fallback without per-CPU aggregates: the task that took the CPU when the thread was preempted, or that
    left it as the thread came back, weighted by the wait."""
    return f"""
        SELECT coalesce(first_holder_pid, last_holder_pid) AS hpid, coalesce(first_holder_tid, last_holder_tid) AS htid,
               min(coalesce(first_holder_comm, last_holder_comm)) AS comm, sum(dur_ns)::BIGINT AS ns,
               list(DISTINCT cpu ORDER BY cpu) AS cpus
        FROM thread_state WHERE pid = {pid} AND tid = {tid} AND state = 'cpu_wait'
          AND end_ns > {w.start_ns} AND end_ns <= {w.end_ns}
          AND coalesce(first_holder_pid, last_holder_pid) IS NOT NULL
        GROUP BY ALL ORDER BY ns DESC LIMIT 50"""


def _group_culprits(ctx: Ctx, job: int, got: list[tuple]) -> list[Culprit]:
    """Holder rows (pid, tid, comm, ns, cpus) -> culprits, largest first: a thread of the job each, the job's child
    processes by name, other processes each (merged by name later), kernel threads by name."""
    by: dict[tuple, Culprit] = {}
    for pid, tid, comm, ns, _cpus in got:
        pid = None if pid is None else int(pid)
        tid = None if tid is None else int(tid)
        # names as they ended up (renames followed: threads, then processes), not the aggregate's first comm
        comm = ((ctx.names.get(tid) if tid is not None else None) or ctx.procs.get(pid or -1, (None, None, None))[1]
                or comm)
        rel = ctx.relation(job, pid, tid, comm)
        if rel == "same process":
            key: tuple = (rel, tid)
            c = by.setdefault(key, Culprit(pid=pid, tids=[tid] if tid is not None else [], comm=comm, relation=rel))
        elif rel == "child process":
            c = by.setdefault((rel, comm), Culprit(pid=None, comm=comm, relation=rel))
            if pid is not None and pid not in c.tids:
                c.tids.append(pid)
        elif rel in ("other process", "the collector"):
            c = by.setdefault((rel, pid), Culprit(pid=pid, tids=[], comm=comm, relation=rel))
        else:
            c = by.setdefault((rel, comm), Culprit(pid=None, comm=comm, relation=rel))
        c.ns += int(ns or 0)
    return sorted(by.values(), key=lambda c: -c.ns)


def _culprit_text(ctx: Ctx, culprits: list[Culprit], limit: int = 3) -> str:
    parts = []
    for c in culprits[:limit]:
        if c.relation == "child process":
            ids = sorted(c.tids) or ([c.pid] if c.pid is not None else [])
            parts.append(f"{c.comm}[{_id_range(ids)}] (child process{'es' if len(ids) > 1 else ''})")
        elif c.relation == "same process":
            parts.append(f"{ctx.who(c.pid, c.tids[0] if len(c.tids) == 1 else None, c.comm)}"
                         + (f" threads {_id_range(sorted(c.tids))}" if len(c.tids) > 1 else "") + " (same process)")
        elif c.pid is not None:
            parts.append(f"{c.comm}[{c.pid}]" + (f" ({c.relation})" if c.relation != "other process" else ""))
        else:
            parts.append(f"{c.comm} ({c.relation})")
    return ", ".join(parts) if parts else "no task recorded"


ID_LIST_MAX = 8  # ids listed one by one at most; a longer scattered list is cut and counted


def _id_range(ids: list[int]) -> str:
    """Ids as a range (3-7), a list (3,5,9), or the first few and how many in all."""
    if not ids:
        return ""
    if ids == list(range(ids[0], ids[-1] + 1)) and len(ids) > 2:
        return f"{ids[0]}-{ids[-1]}"
    if len(ids) > ID_LIST_MAX:
        return ",".join(map(str, ids[:ID_LIST_MAX])) + f",... ({len(ids)} in all)"
    return ",".join(map(str, ids))


def _merge_hogs(culprits: list[Culprit]) -> list[Culprit]:
    """Other processes with the same name are one culprit (three `hogd` processes: hogd[609-611])."""
    out: list[Culprit] = []
    by_name: dict[str, Culprit] = {}
    for c in culprits:
        if c.relation == "other process" and c.comm:
            if c.comm in by_name:
                m = by_name[c.comm]
                m.ns += c.ns
                m.tids = sorted(set(m.tids) | {c.pid} | set()) if c.pid is not None else m.tids
                continue
            c = c.model_copy(update={"tids": [c.pid] if c.pid is not None else []})
            by_name[c.comm] = c
        out.append(c)
    return sorted(out, key=lambda c: -c.ns)


def _culprit_names(culprits: list[Culprit], ctx: Ctx, limit: int = 3) -> str:
    parts = []
    for c in culprits[:limit]:
        if c.relation == "other process":
            parts.append(f"{c.comm}[{_id_range(sorted(c.tids))}]" if c.tids else f"{c.comm}")
        else:
            parts.append(_culprit_text(ctx, [c], 1))
    return ", ".join(parts) if parts else "no task recorded"


@dataclass
class Explained:
    """A cause for a finding: id, the one-line reason, culprits, extra evidence and recommendation numbers."""

    cause: str
    reason: str
    culprits: list[Culprit] = field(default_factory=list)
    evidence: list[Evidence] = field(default_factory=list)
    numbers: dict[str, object] = field(default_factory=dict)
    confident: bool = True
    seconds: float | None = None  # where less than the finding's: the part the cause explains (a lower bound, said)


def _is_data_worker(comm: str | None) -> bool:
    """A DataLoader worker as PyTorch names it (pt_data_worker), or a worker of another loader by its name."""
    return bool(comm) and bool(re.search(r"data_?worker|dataloader|loader", comm or "", re.I))


def torch_loader(comm: str | None) -> bool:
    """A PyTorch DataLoader's worker or helper thread as PyTorch names them (pt_data_worker, pt_data_pin): the
    DataLoader's own knobs are then the fix to name."""
    return bool(comm) and (comm or "").startswith("pt_data")


def explain_cpu_wait(ctx: Ctx, f: Finding, job: int | None = None) -> Explained:
    """Waiting for a CPU: who held it (named from the rows) decides between other processes and the job's own."""
    t = f.thread
    job = t.pid if job is None else job
    w = f.window
    if ctx.has_cpu_aggregates:
        idle_sql = idle_during_waits_sql(t.pid, t.tid, w)
        idle = shared_rows(ctx.con, idle_sql)[0][0]
        if idle is not None and float(idle) >= 50:
            throttled = _throttled(ctx, f, job, float(idle), idle_sql)
            if throttled is not None:
                return throttled
            return Explained(cause=rc.CPU_IDLE_WAIT, confident=False, evidence=[Evidence(
                name="share of the CPU waits during which that CPU was idle", value=float(idle), unit="%",
                sql=idle_sql)],
                reason=(f"runnable while the CPU it waited on was idle {float(idle):.0f}% of that time: not behind "
                        "other tasks; a CPU quota would explain it, but no cgroup throttling was recorded (the store "
                        "has no cgroup samples, or they show none)"))
    sql = holders_sql(ctx, t.pid, t.tid, w) if ctx.has_cpu_aggregates else first_holders_sql(t.pid, t.tid, w)
    got = shared_rows(ctx.con, sql)
    method = ("per-CPU on-CPU time in the same second" if ctx.has_cpu_aggregates
              else "the task that took the CPU at each preemption")
    culprits = _merge_hogs(_group_culprits(ctx, job, got))
    cpus = sorted({int(c) for r in got for c in (r[4] or [])})
    total = sum(c.ns for c in culprits) or 1
    own_threads = sum(c.ns for c in culprits if c.relation == "same process")
    data_workers = sum(c.ns for c in culprits if c.relation == "child process" and _is_data_worker(c.comm))
    if data_workers >= 0.5 * total:
        cause = rc.OWN_WORKERS_CPU
    elif own_threads >= 0.5 * total:
        cause = rc.OWN_THREADS_CPU
    else:
        cause = rc.CPU_CONTENTION
    names = _culprit_names(culprits, ctx)
    cpu_text = f" on CPU {','.join(map(str, cpus[:8]))}" if cpus and len(cpus) <= 4 else ""
    reason = f"behind {names}{cpu_text}"
    ev = [Evidence(name="CPU holders (share of the wait)", value="; ".join(
        f"{_culprit_names([c], ctx, 1)} {100 * c.ns / total:.0f}%" for c in culprits[:5]) or "none recorded",
        sql=" ".join(sql.split())),
        Evidence(name="how the holders were found", value=method)]
    confined = _confined(ctx, job, w) if cause in (rc.OWN_WORKERS_CPU, rc.OWN_THREADS_CPU) else None
    if confined is not None:  # the job's own tasks queued on one or two CPUs of many: where they may run, not how many
        reason += confined[0]
        ev.append(confined[1])
    # PyTorch's autograd thread (the backward pass) holding the CPUs: no pool to size, the two threads take turns
    autograd = sum(c.ns for c in culprits if c.relation == "same process" and (c.comm or "").startswith("pt_autograd"))
    turns = {"autograd": "yes"} if cause == rc.OWN_THREADS_CPU and autograd >= 0.5 * total else {}
    return Explained(cause=cause, reason=reason, culprits=culprits[:5], evidence=ev,
                     numbers={"holders": names, "cpus": ",".join(map(str, cpus)) or "?", **turns})


CONFINED_CPUS = 2  # the job's threads all on this many CPUs or fewer, of a host with more: said where they queued


def _confined(ctx: Ctx, job: int, w: TimeWindow) -> tuple[str, Evidence] | None:
    """Where the job's threads (its process and its children's) queued behind each other, the CPUs they ran on in the
    window, if CONFINED_CPUS or fewer for more threads than that, on a host with more CPUs, and (where per-CPU time was
    recorded) other CPUs idle half the window or more: the scheduler moves a waiting thread to a free CPU where its
    CPU mask allows, so a mask (taskset, a cpuset, a launcher's binding) likely keeps them there
    (natural_inherited_one_cpu: a process and 3 workers on CPU 2 of 16, 14 others idle). Words and evidence."""
    lo, hi = int(w.start_ns), int(w.end_ns)
    occ = (f"SELECT cpu, sum(sum_duration_ns) AS on_ns, sum(sum_duration_ns) FILTER (WHERE pid = 0) AS idle_ns FROM "
           f"host_aggregates WHERE op = 'sched_switch' AND cpu IS NOT NULL AND bucket_start_ns < {hi} AND "
           f"bucket_start_ns + bucket_ns > {lo} GROUP BY cpu" if ctx.has_cpu_aggregates
           else "SELECT NULL::INTEGER AS cpu, 0 AS on_ns, 0 AS idle_ns WHERE false")
    sql = " ".join(f"""
        WITH j AS (SELECT i.cpu, i.tid FROM sched_intervals i
                   WHERE i.pid IN (SELECT pid FROM processes WHERE pid = {int(job)} OR ppid = {int(job)})
                     AND i.on_ns >= {lo} AND i.on_ns < {hi} AND i.cpu IS NOT NULL),
        occ AS ({occ})
        SELECT CASE WHEN count(DISTINCT j.cpu) = 1 THEN 'CPU ' ELSE 'CPUs ' END
                   || string_agg(DISTINCT j.cpu::VARCHAR, ',' ORDER BY j.cpu::VARCHAR) AS cpus,
               count(DISTINCT j.tid) AS threads, (SELECT max(cpu_count) FROM sessions) AS host_cpus,
               count(DISTINCT j.cpu) AS n_cpus,
               (SELECT count(*) FROM occ WHERE cpu NOT IN (SELECT cpu FROM j) AND idle_ns >= 0.5 * on_ns) AS idle_cpus,
               (SELECT count(*) FROM occ) AS cpus_recorded
        FROM j""".split())
    where, threads, host, n, idle, recorded_cpus = shared_rows(ctx.con, sql)[0]
    if not n or int(n) > CONFINED_CPUS or not host or int(host) <= int(n) or int(threads) <= int(n):
        return None
    if recorded_cpus and not idle:
        return None  # no other CPU was free: the scheduler had nowhere to move them, whatever the mask
    free = (f", while {idle} other CPU{'s were' if idle != 1 else ' was'} idle half that time or more"
            if recorded_cpus else "")
    return (f"; the job's {threads} threads ran on {where} only, of the host's {host}{free}: a CPU mask (taskset, a "
            "cpuset, a launcher's CPU binding) likely keeps them there"), Evidence(
        name="CPUs the job's threads ran on in the window (list, threads, host CPUs; other CPUs idle half of it)",
        value=f"{where}; {threads} threads; {host} CPUs" + (f"; {idle} idle" if recorded_cpus else ""), sql=sql)


def _role(relation: str) -> str:
    """How a task the thread waited on is introduced: its worker process, its thread, or a process of its own."""
    return {"child process": "its worker process", "same process": "its thread"}.get(relation, "the process")


def _by_name(ctx: Ctx, culprits: list[Culprit], least: float = 0.01, also: list[int] | tuple[int, ...] = ()) -> str:
    """'batchsrv[1125], loader[1133,1134]': processes grouped by their name, each group's pids as ranges; those whose
    time is under `least` of the largest's (one wake-up at a window's edge) left out of the words (not the culprits);
    `also`: processes said with their name's group though not culprits (siblings)."""
    most = max((c.ns or 0 for c in culprits), default=0)
    pids: dict[str, set[int]] = {}
    for c in culprits:
        if c.pid and (c.ns is None or c.ns >= least * most) and not any(c.pid in got for got in pids.values()):
            pids.setdefault(ctx.procs.get(c.pid, (None, None, None))[1] or c.comm or "?", set()).add(c.pid)
    for pid in also:
        if not any(pid in got for got in pids.values()):
            pids.setdefault(ctx.procs.get(pid, (None, None, None))[1] or "?", set()).add(pid)
    return ", ".join(f"{comm}[{_id_range(sorted(p))}]" for comm, p in pids.items())


def siblings(ctx: Ctx, job: int, pid: int, w: TimeWindow) -> list[int]:
    """The job's other child processes named as `pid` is, alive through most of the window, whose main thread was busy
    SATURATED of it: the rest of the pool one member of which a wait-for walk reached, running alike."""
    comm = ctx.procs.get(pid, (None, None, None))[1]
    return [p for p in ctx.alive_children(job, w) if p != pid and comm
            and ctx.procs.get(p, (None, None, None))[1] == comm and (busy_share(ctx.con, p, p, w) or 0.0) >= SATURATED]


def pool_stem(comm: str | None) -> str | None:
    """A pool member's name without its index ('augment_3', 'worker-12', 'ThreadPool-0_1' -> 'augment', 'worker',
    'ThreadPool'): a pool names its threads alike, told apart by a trailing number."""
    return re.sub(r"(?:[-_.:#]?\d+)+$", "", comm) or comm if comm else comm


def _autograd(comm: str | None) -> bool:
    """PyTorch's autograd engine threads (pt_autograd_0, one per device), which run the backward passes."""
    return bool(comm) and comm.startswith("pt_autograd")


HOST_WORK_SHARE = 50  # % of a thread's on-CPU samples in one kind of code that says what its host work was
HOST_WORK_SAMPLES = 20  # on-CPU samples from which a thread's host work is read at all
# What the samples say, first match wins: (the numbers' key its fix cites, the query's column, where the samples
# were, what that work is, the code its evidence counts).
_HOST_WORK = (
    ("profiling", 4, "in a profiler", "in a profiler (torch.profiler's records and the trace it builds and writes, "
     "CUPTI's callbacks): the job being profiled, not the model's own work",
     "a profiler (torch/profiler, torch/autograd/profiler*, Kineto, CUPTI)"),
    ("compiling", 1, "in a compiler of GPU code (the CUDA runtime's or torch.compile's)", "compiling GPU code at "
     "run time (the CUDA runtime compiler, or torch.compile tracing and building kernels: again for each new shape "
     "or dtype)",
     "a compiler (NVRTC, nvJitLink; torch.compile's Dynamo, Inductor, Triton)"),
    ("importing", 8, "importing modules", "importing modules (Python finding, loading and compiling code: a new "
     "process starting up, as spawned workers do before their first batch, or a module first imported mid-run)",
     "Python's import system (<frozen importlib._bootstrap>)"),
    ("cpu_ops", 3, "in PyTorch's CPU kernels", "in PyTorch's CPU kernels (math on tensors kept on the CPU: ATen's "
     "loops, its OpenMP pool), not issuing GPU kernels", "PyTorch's CPU kernels (ATen on CPU tensors, OpenMP)"),
    ("compressing", 10, "compressing data", "compressing data (zlib's deflate under PNG or gzip output, zstd, lz4, "
     "bz2): output written compressed on this thread", "a compressor (zlib's deflate, zstd, lz4, bz2, lzma)"),
    ("decompressing", 6, "decompressing data", "decompressing data (zlib, zip, gzip, lzma, bz2, zstd, lz4): data "
     "stored compressed, inflated again each time it is read", "a decompressor (zlib, zipfile, gzip, lzma, "
     "bz2, zstd, lz4)"),
    ("serialising", 5, "serialising data", "serialising or deserialising data (torch.save or torch.load, pickle, "
     "numpy's save: a checkpoint or a cache written or read on this thread), not issuing GPU kernels",
     "serialisation code (torch/serialization.py, pickle, safetensors, numpy's save and load)"),
    ("ipc", 9, "talking to another process", "talking to another process through multiprocessing (a Manager's "
     "proxies, a Queue, a Pipe: each access pickled, sent and waited for)", "multiprocessing's connections, "
     "proxies and queues (its innermost Python frame)"),
    ("loading", 7, "in PyTorch's data loading", "in PyTorch's data loading (a DataLoader's fetch and collate, the "
     "dataset's __getitem__) on this thread", "torch.utils.data (a DataLoader's fetch and collate, the dataset)"),
    ("tensor_text", 11, "turning tensors into text", "turning tensors into text (str, repr, print, an f-string or "
     "a log record of a tensor: torch's formatter reads a GPU tensor's values back, a synchronisation each, and "
     "formats them in Python)", "torch's tensor printing (torch/_tensor_str.py)"),
    ("framework", 0, "in PyTorch's own code", "in PyTorch's own code (the model's layers, autograd, the optimiser: "
     "issuing its kernels)", "PyTorch's own code issuing kernels (the innermost Python frame PyTorch's, not "
     "torch.utils.data, or a CUDA library on the stack)"),
)


def host_work(ctx: Ctx, pid: int, tid: int, window: TimeWindow | None, whose: str, calls: str | None = None,
              within: tuple[str, str] | None = None) -> tuple[str, dict[str, object], Evidence] | None:
    """What a thread's host work was, where its on-CPU samples in the window (a store with stacks, 20 samples at
    least) say: HOST_WORK_SHARE or more in a profiler (the job being profiled), else in a CUDA runtime compiler (GPU
    code compiled as the job runs), else importing modules (a process starting up), else in PyTorch's CPU kernels
    (math on CPU tensors), else compressing data (output written compressed), else decompressing data
    (stored compressed), else serialising data (a checkpoint written on the thread), else talking to another process
    (multiprocessing's proxies and queues), else in PyTorch's data loading
    (batches prepared on the thread), else turning tensors into text (str or print of a tensor), else in PyTorch's
    own code (the model's layers, autograd, the optimiser: issuing
    its kernels). The words (`whose` samples), the numbers its fix cites (`profiling`, `compiling`, `importing`,
    `cpu_ops`, `compressing`, `decompressing`, `serialising`, `ipc`, `loading`, `tensor_text` or `framework`) and
    the evidence whose SQL recomputes it.
    `calls` 'outside': the samples taken outside the thread's CUDA calls only (its running outside them, not its
    copies'). `within`: (a query of intervals (a, b), what they are) the samples in them only (the drained gaps)."""
    if window is None or not recorded(ctx.con):
        return None
    sql = framework_share_sql(pid, tid, window, calls, within[0] if within else None)
    got = shared_rows(ctx.con, sql)[0]
    if int(got[2] or 0) < HOST_WORK_SAMPLES:
        return None
    for key, column, where, what, code in _HOST_WORK:
        if got[column] is not None and float(got[column]) >= HOST_WORK_SHARE:
            if key == "loading" and (drawn := sampler_work(ctx, pid, tid, window, whose, calls, within)):
                return drawn  # batches' indices drawn: the workers' fix does not reach a sampler
            samples = (f"{whose} on-CPU samples{f' {calls} CUDA calls' if calls else ''}"
                       f"{f' {within[1]}' if within else ''}")
            share = f"{float(got[column]):.0f}% of {samples}"
            return f"{share} {what}", {key: f"{share} {where}"}, Evidence(  # the share shown first, the rest beside
                name=f"{samples} with a frame in {code}", value=float(got[column]), unit="%",
                sql=f"SELECT {FRAMEWORK_COLUMNS[column]}, * FROM ({sql})")
    return None


def _channel(path: WaitPath) -> str | None:
    """What the last waiting thread of a path waited in when its end woke it (a pipe the end drained, a futex the end
    released): the end's part in the wait, whatever the first thread itself waited in."""
    before, end = path.hops[-2], path.hops[-1]
    woken = [s for s in before.sleeping if s[2] == end.tid]
    return max(woken, key=lambda s: s[5])[0] if woken else None


# PyTorch's names for the threads that run a process group's collectives (gloo's loop, NCCL's watchdog and
# heartbeat) and NCCL's own: a wait that passes through one waits on the job's collective communication.
COLLECTIVE_THREADS = ("pt_gloo", "pt_nccl", "gloo", "nccl", "NCCL")


def collective(ctx: Ctx, path: WaitPath) -> tuple[dict[str, object], Evidence] | None:
    """The first thread of the wait-for path that runs the process group's collectives, as the numbers its fix cites
    and evidence: an all-reduce ends when every rank's part has arrived, whatever held that thread up."""
    for hop in path.hops:
        comm = ctx.names.get(hop.tid)
        if comm and comm.startswith(COLLECTIVE_THREADS):
            who = ctx.who(hop.pid, hop.tid)
            return {"collective": f"through {who}, its process group's communication thread"}, Evidence(
                name="a thread on the wait's path that runs the process group's collectives", value=who,
                sql=f"SELECT pid, tid, comm FROM threads WHERE pid = {hop.pid} AND tid = {hop.tid}")
    return None


def ran_text(run_ns: int, wall_ns: int, threads: int) -> str:
    """'65% of that time' for one thread that kept running; for several, their sum and what it means (it can pass
    100%): '159% of that time together, 1.6 threads busy on average'. The number is busy_runners' evidence."""
    share = 100 * run_ns / wall_ns
    if threads == 1:
        return f"{share:.0f}% of that time"
    return f"{share:.0f}% of that time together, {share / 100:.1f} threads busy on average"


def busy_runners(ctx: Ctx, f: Finding,
                 family: bool = False) -> tuple[str, list[Culprit], int, int, str, Evidence] | None:
    """The threads of the finding's process (`family`: and of its descendants) that kept running while it waited: one
    thread, or threads of one name that ran in turn (a pool), together at least half of the window; (name, culprits,
    run_ns, wall_ns, who, evidence)."""
    t = f.thread
    pids = sorted(ctx.family(t.pid)) if family else [t.pid]
    in_pids = f"pid = {t.pid}" if len(pids) == 1 else f"pid IN ({', '.join(map(str, pids))})"
    run_sql = (f"SELECT pid, tid, sum(run_outside_ns + run_inside_ns)::BIGINT AS run_ns, sum(wall_ns)::BIGINT AS "
               f"wall_ns FROM {SECONDS_TABLE} WHERE {in_pids} AND tid <> {t.tid} AND k BETWEEN {f.ks[0]} AND "
               f"{f.ks[1]} GROUP BY pid, tid ORDER BY run_ns DESC")
    groups: dict[str, list[tuple[int, int, int, int]]] = defaultdict(list)
    for pid, tid, run_ns, wall_ns in rows(ctx.con, run_sql):
        groups[ctx.names.get(int(tid)) or "?"].append((int(pid), int(tid), int(run_ns or 0), int(wall_ns or 0)))
    if not groups:
        return None
    name, members = max(groups.items(), key=lambda kv: sum(m[2] for m in kv[1]))
    run_ns, wall_ns = sum(m[2] for m in members), max(m[3] for m in members)
    if not wall_ns or run_ns < 0.5 * wall_ns:
        return None
    ran = sorted((m[0], m[1]) for m in members if m[2] > 0)
    tids = [tid for _pid, tid in ran]
    who = ctx.who(*ran[0]) if len(ran) == 1 else f"{len(ran)} threads named {name} ({_id_range(tids)})"
    by_pid: dict[int, list[int]] = {pid: [tid for p, tid in ran if p == pid] for pid, _tid in ran}
    culprits = [Culprit(pid=pid, tids=ts, comm=name, relation=ctx.relation(t.pid, pid, ts[0], name),
                        ns=sum(m[2] for m in members if m[0] == pid)) for pid, ts in by_pid.items()]
    kset = ", ".join(map(str, tids))
    in_pids = f"pid = {t.pid}" if len(by_pid) == 1 and t.pid in by_pid else f"pid IN ({', '.join(map(str, by_pid))})"
    ev = Evidence(name=f"share of the window {who} ran (together; of one thread's wall time)",
                  value=sql_round(100 * run_ns / wall_ns, 1), unit="%",
                  sql=f"SELECT 100.0 * sum(run_outside_ns + run_inside_ns) / max(w) FROM thread_seconds, "
                      f"(SELECT max(s) AS w FROM (SELECT sum(wall_ns) AS s FROM thread_seconds WHERE {in_pids} "
                      f"AND tid IN ({kset}) AND k BETWEEN {f.ks[0]} AND {f.ks[1]} GROUP BY tid)) "
                      f"WHERE {in_pids} AND tid IN ({kset}) AND k BETWEEN {f.ks[0]} AND {f.ks[1]}")
    return name, culprits, run_ns, wall_ns, who, ev


POOL_SHARE = 0.5  # no one waker ended this share of the sleep, but threads of one name together did: a pool
POOL_MIN, POOL_FOLLOWED = 3, 8  # a pool has this many members at least; the walk is taken from this many at most


def waker_pool(ctx: Ctx, job: int, known: list[tuple], total: int) -> list[tuple[int, int, int]] | None:
    """The wakers that together ended most of the sleep though none did alone: threads of one name and relation
    (an OpenMP or intra-op pool, the DataLoader's workers), as (pid, tid, ns), largest first; None where there is
    no such pool."""
    groups: dict[tuple[str, str | None], list[tuple[int, int, int]]] = defaultdict(list)
    for wpid, wtid, wcomm, wctx, _n, wns, _io, _sc in known:
        if wctx in ("irq", "softirq") or wpid is None or wtid is None:
            continue
        comm = ctx.names.get(int(wtid)) or wcomm
        groups[(ctx.relation(job, int(wpid), int(wtid), comm), pool_stem(comm))].append(
            (int(wpid), int(wtid), int(wns or 0)))
    best = max(groups.values(), key=lambda g: sum(m[2] for m in g), default=[])
    if len(best) < POOL_MIN or sum(m[2] for m in best) < POOL_SHARE * total:
        return None
    return sorted(best, key=lambda m: -m[2])


CONVOY_SHARE = 0.3  # a pool whose members sleep this share of the window, woken by one another, queue for one lock


def convoy_sql(pid: int, tids: list[int], w: TimeWindow) -> str:
    """The share of a pool's window time its threads slept on futexes that another member ended (taking turns at one
    lock), per member on average."""
    members = ", ".join(str(int(x)) for x in sorted(set(tids)))
    return " ".join(f"""
        SELECT sum(least(end_ns, {w.end_ns}) - greatest(start_ns, {w.start_ns}))::DOUBLE
               / ({len(set(tids))} * {w.duration_ns}) AS share
        FROM thread_state WHERE pid = {int(pid)} AND tid IN ({members}) AND state = 'sleeping'
          AND waker_tid IN ({members}) AND waker_tid <> tid AND waker_context = 'task'
          AND end_ns > {w.start_ns} AND start_ns < {w.end_ns}""".split())


def workers_pace(ctx: Ctx, job: int, end: Hop, w: TimeWindow) -> dict[str, object]:
    """What the fix for workers that do not keep up can say of them (recommend.workers_advice): the share of the
    time the walk's end ran, how many processes of its name the job started in the window after one of them had
    exited in it (workers started anew, an epoch's; not those that exit as the job ends), and whether its samples
    were mostly decompressing data or importing modules (host_work: starting up)."""
    name = ctx.procs.get(end.pid, (None, None, None))[1]
    anew = rows(ctx.con, "SELECT count(DISTINCT p.pid) FROM processes p WHERE p.ppid = ? AND p.comm = ? "
                         "AND p.first_seen_ns BETWEEN ? AND ? AND EXISTS (SELECT 1 FROM processes q WHERE "
                         "q.ppid = p.ppid AND q.comm = p.comm AND q.exit_ns >= ? AND q.exit_ns < p.first_seen_ns)",
                [job, name, w.start_ns, w.end_ns, w.start_ns])[0][0] if name else 0
    work = host_work(ctx, end.pid, end.tid, w, "their")
    return {"workers_busy": f"{100 * end.running_ns / end.total_ns:.0f}" if end.total_ns else None,
            "workers_restarted": int(anew or 0),
            "workers_decompressing": work[1]["decompressing"] if work and "decompressing" in work[1] else None,
            "workers_importing": work[1]["importing"] if work and "importing" in work[1] else None}


def through_pool(ctx: Ctx, culprits: list[Culprit], path: WaitPath, job: int) -> None:
    """Where the walk entered the end's process through a hop that a pool of processes of its name woke (a pin-memory
    thread woken by either of two workers), credit each other process of that name with the part of the first
    thread's sleep it stands for, scaled as the walk scaled the end's own: the walk follows the largest waker only, so
    its fellows, ending as much, kept only what they ended of the first thread's sleep directly (natural_zlib's two
    workers: 9.38 s and 0.18 s, where each stood for ~9.5 s). Never the job's own process (`job`), named as its
    children are where it forked them (natural_pool_map_augment: a thread of the main process woke the pool's result
    handler too, and the main process was listed among the pool's processes)."""
    end = path.end
    entry = next(i for i, h in enumerate(path.hops) if h.pid == end.pid)
    name = ctx.procs.get(end.pid, (None, None, None))[1]
    if entry == 0 or not name:
        return
    ended: dict[int, int] = defaultdict(int)
    for _kind, wpid, _wtid, _comm, _wctx, ns in path.hops[entry - 1].sleeping:
        if wpid is not None:
            ended[wpid] += ns
    own = ended.get(end.pid, 0)
    if not own:
        return
    for pid, ns in ended.items():
        if pid in (end.pid, job) or ctx.procs.get(pid, (None, None, None))[1] != name:
            continue
        share = int(path.hops[entry].total_ns * ns / own)
        got = next((c for c in culprits if c.pid == pid and c.relation == "child process"), None)
        if got is not None:
            got.ns = (got.ns or 0) + share
        else:
            culprits.append(Culprit(pid=pid, tids=[pid], comm=name, relation="child process", ns=share))
