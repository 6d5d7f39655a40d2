"""Causes, read off the time accounting: what the feeding thread's lost time went to, and who took it.

Two readings of the accounting (accounting.py), per feeding process and its busiest feeding thread:
- contrast: in a slow phase (the work rate fell to half or less), the parts of the thread's time whose
  share grew against the healthy baseline are the symptom; the time lost (the phase's wall time
  times 1 - 1/slowdown) is shared among them by how much each grew; a recurrent phase (short slow
  episodes, accounting.py) is contrasted the same way over the seconds holding its episodes, and each
  part is explained in the episode where it grew most;
- steady: outside slow phases, time in which the GPU sat idle (1 - utilisation, per second) while
  the thread did something other than wait for it; without a GPU utilisation record this reading
  is labelled as such and kept LOW.
Each part then maps to a cause through one short table (`_PART_CAUSE`) and an explainer that names
the culprits from the rows: the tasks that held the CPU (per-CPU on-CPU aggregates, else the first
holders), the tasks that woke the thread (and what they themselves were doing), the other processes
using the GPU, the kind of CUDA calls whose time grew. Chains are ranked by the seconds they explain.
"""

from __future__ import annotations

import re
from collections import defaultdict
from dataclasses import dataclass, field, replace

import duckdb

from ingero_mcp.analysis import recommend as rc
from ingero_mcp.analysis._sql import rows, sql_round
from ingero_mcp.analysis.views import SECONDS_TABLE
from ingero_mcp.analysis.accounting import (
    HEALTHY_FRACTION,
    MIN_EPISODE_LOSS_S,
    SCAN_FRACTION,
    SECOND_NS,
    gpu_util_sql,
    origin_ns,
    second_runs,
    sum_seconds,
    wakers_sql,
)
from ingero_mcp.analysis.progress import per_second_sql
from ingero_mcp.analysis.waits import KIND_LABEL, WaitPath, doing_text, follow, sleep_kinds_sql
from ingero_mcp.analysis.models import (
    Account,
    Accounting,
    CausalChain,
    Culprit,
    Evidence,
    Phase,
    Progress,
    SEVERITY_RANK,
    SecondAccount,
    ThreadAccount,
    TimeWindow,
)

MIN_GROWTH = 0.03  # a part's excess must be at least this share of the slow phase's wall time
MIN_EXCESS = 0.05  # ... and at least this share of the time lost in it
STEADY_MIN_SHARE = 0.05  # a part must hold this share of the idle-GPU time to count outside slow phases
IDLE_GPU = 50.0  # %: below this utilisation a second counts as the GPU waiting on the host
MINOR_SHARE = 0.01  # chains explaining less of the feeding time are listed as minor
HIGH_SHARE, MEDIUM_SHARE = 0.25, 0.05

# The accounting's parts as the causes read them.
PARTS = ("cpu_wait", "sleep_outside", "io", "gpu_wait", "run_inside", "run_outside", "unknown")
_PART_LABEL = {
    "cpu_wait": "waiting for a CPU", "sleep_outside": "sleeping outside CUDA calls", "io": "in IO sleep (D state)",
    "gpu_wait": "asleep in CUDA calls (waiting for the GPU)", "run_inside": "on the CPU inside CUDA calls",
    "run_outside": "running outside CUDA calls (Python, data preparation)", "unknown": "off-CPU (split not recorded)",
}
_COLLECTOR = re.compile(r"ingero[-_]mcp(\.cli)?\s+trace|ingero_mcp\.cli\s+trace")


def part_ns(a: Account, part: str) -> int:
    """One part of an account, in the causes' terms."""
    return {
        "cpu_wait": a.cpu_wait_inside_ns + a.cpu_wait_outside_ns,
        "sleep_outside": a.sleep_outside_ns - a.sleep_io_ns,
        "io": a.sleep_io_ns,
        "gpu_wait": a.sleep_inside_ns,
        "run_inside": a.run_inside_ns,
        "run_outside": a.run_outside_ns,
        "unknown": a.off_cpu_unknown_ns,
    }[part]


def part_sql(part: str) -> str:
    """The same part as a SQL expression over thread_seconds."""
    return {
        "cpu_wait": "cpu_wait_inside_ns + cpu_wait_outside_ns",
        "sleep_outside": "sleep_outside_ns - sleep_io_ns",
        "io": "sleep_io_ns",
        "gpu_wait": "sleep_inside_ns",
        "run_inside": "run_inside_ns",
        "run_outside": "run_outside_ns",
        "unknown": "off_cpu_unknown_ns",
    }[part]


@dataclass
class Finding:
    """A part of a feeding thread's time that explains lost feeding time in a window."""

    thread: ThreadAccount
    part: str
    window: TimeWindow
    seconds_lost: float
    mode: str  # 'contrast' or 'steady'
    share: float  # the part's share of wall time in the window
    base_share: float | None = None  # in the baseline (contrast)
    slowdown: float | None = None
    stopped: bool = False
    gpu_util: float | None = None
    util_known: bool = True
    ks: tuple[int, int] = (0, 0)  # seconds (since the trace start) of the window, inclusive
    startup: bool = False  # a slow phase before the first healthy second: the process starting, not slowing
    phase: Phase | None = None  # a recurrent phase: the short slow episodes this finding sums
    kset: tuple[int, ...] = ()  # recurrent: the seconds holding its episodes (the contrast's seconds)
    rates: tuple[float, float] | None = None  # contrast: the process's progress rate in the baseline and in the phase
    unit: str = "launches+copies/s"  # what the rates count (Phase.unit)
    worst: tuple[int, int] | None = None  # recurrent: the seconds of the episode where the part grew most (explained)


@dataclass
class Ctx:
    """What every explainer needs: the connection, names, the process tree, the trace's second 0."""

    con: duckdb.DuckDBPyConnection
    t0: int
    window: TimeWindow
    names: dict[int, str]
    procs: dict[int, tuple[int | None, str | None, str | None]]  # pid -> (ppid, comm, cmdline)
    has_cpu_aggregates: bool
    progress: dict[int, Progress] = field(default_factory=dict)  # pid -> the call that marks its iterations
    chains: list[CausalChain] = field(default_factory=list)
    cache: dict[tuple, list[tuple]] = field(default_factory=dict)  # query results reused by explainers

    def family(self, pid: int) -> set[int]:
        """The process and its descendants (forked workers); worked out once per process (relation() asks often)."""
        key = ("family", pid)
        if key in self.cache:
            return set(self.cache[key])  # type: ignore[arg-type]
        out, todo = {pid}, [pid]
        kids: dict[int, list[int]] = defaultdict(list)
        for p, (pp, _c, _m) in self.procs.items():
            if pp is not None:
                kids[pp].append(p)
        while todo:
            for k in kids.get(todo.pop(), []):
                if k not in out:
                    out.add(k)
                    todo.append(k)
        self.cache[key] = list(out)  # type: ignore[assignment]
        return out

    def alive_children(self, pid: int, w: TimeWindow) -> list[int]:
        """Descendants of a process alive for at least half of the window."""
        got = rows(self.con, "SELECT pid, min(first_seen_ns), max(coalesce(exit_ns, last_seen_ns)) FROM processes GROUP BY pid")
        life = {int(p): (a, b) for p, a, b in got}
        def overlap(p: int) -> int:
            a, b = life.get(p, (None, None))
            return min(b or 2**62, w.end_ns) - max(a or 0, w.start_ns)

        # alive for most of the window: a worker forked in its last seconds did not share the work
        return [p for p in self.family(pid) - {pid} if overlap(p) >= 0.5 * w.duration_ns]

    def traced_threads(self) -> list[tuple[int, int]]:
        """Every (pid, tid) with scheduler rows: the threads whose time is recorded."""
        key = ("traced_threads",)
        if key not in self.cache:
            self.cache[key] = rows(self.con, "SELECT DISTINCT pid, tid FROM sched_intervals")
        return self.cache[key]

    def is_collector(self, pid: int | None) -> bool:
        """Whether a pid is this project's collector (it is labelled, never blamed)."""
        return pid is not None and bool(_COLLECTOR.search((self.procs.get(pid, (None, None, None))[2]) or ""))

    def who(self, pid: int | None, tid: int | None = None, comm: str | None = None) -> str:
        """'comm[pid]' or 'comm[pid]/tid', a thread named by its own name where known."""
        name = (self.names.get(tid) if tid is not None else None) or comm or (self.procs.get(pid or -1, (None, None, None))[1]) or "?"
        if pid is None:
            return f"{name}"
        if tid is None or tid == pid:
            return f"{name}[{pid}]"
        return f"{name}[{pid}/{tid}]"

    def relation(self, job: int, pid: int | None, tid: int | None, comm: str | None) -> str:
        """How a task relates to the job: same process, child process, other process, kernel."""
        if pid is None:
            return "unknown"
        if pid == job:
            return "same process"
        if pid in self.family(job):
            return "child process"
        if pid == 0 or re.match(r"(kworker|ksoftirqd|swapper|irq/|rcu_|migration|kthreadd|nvidia)", comm or ""):
            return "kernel"
        if self.is_collector(pid):
            return "the collector"
        return "other process"

    def offset(self, ns: int) -> str:
        """'+12.0 s': a moment relative to the start of the trace."""
        return f"+{(ns - self.t0) / 1e9:,.1f} s"

    def span(self, w: TimeWindow) -> str:
        """'+8.0 s to +18.0 s'."""
        return f"{self.offset(w.start_ns)} to {self.offset(w.end_ns)}"


def _context(con: duckdb.DuckDBPyConnection, window: TimeWindow, names: dict[int, str]) -> Ctx:
    procs = {int(p): (None if pp is None else int(pp), c, m)
             for p, pp, c, m in rows(con, "SELECT pid, any_value(ppid), any_value(comm), any_value(cmdline) FROM processes GROUP BY pid")}
    has_cpu = bool(rows(con, "SELECT 1 FROM host_aggregates WHERE op = 'sched_switch' AND cpu IS NOT NULL LIMIT 1"))
    return Ctx(con=con, t0=origin_ns(con) or window.start_ns, window=window, names=names, procs=procs, has_cpu_aggregates=has_cpu)


# ---- finding the parts that lost time --------------------------------------------------------


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


def contrast_findings(ctx: Ctx, thread: ThreadAccount, phases: list[Phase], steady_from: int | None = None) -> list[Finding]:
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
            found.append(Finding(thread=thread, part=p, window=w, seconds_lost=lost_ns * e / total / 1e9, mode="contrast",
                                 share=_shares(sub)[p], base_share=base_share[p], slowdown=phase.slowdown,
                                 stopped=phase.slowdown is None, gpu_util=_util(thread.seconds, w), ks=ks,
                                 startup=startup, rates=(base_rate, phase.work_rate), unit=phase.unit))
    return found


def _idle(seconds: list[SecondAccount], w: TimeWindow) -> int:
    """A thread's idle time in the seconds starting in a window (accounting.idle_sql)."""
    return sum(s.idle_ns for s in seconds if w.start_ns <= s.start_ns < w.end_ns)


def _minus_idle(a: Account, idle: int) -> Account:
    """An account without its idle time (of its sleep outside CUDA calls): the busy time the contrast compares."""
    return a if not idle else a.model_copy(update={"wall_ns": a.wall_ns - idle, "sleep_outside_ns": a.sleep_outside_ns - idle})


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
    grown = {p: e for p, e in excess.items() if lost_ns > 0 and e >= MIN_EXCESS * lost_ns and e >= MIN_GROWTH * acc.wall_ns}
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
                             mode="contrast", share=_shares(acc)[p], base_share=_shares(base)[p], slowdown=phase.slowdown,
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


def _part_seconds(ctx: Ctx, seconds: list[SecondAccount], w: TimeWindow, part: str, base_share: float) -> tuple[int, int]:
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
    got = [s.gpu_util_percent for s in seconds if w.start_ns <= s.start_ns < w.end_ns and s.gpu_util_percent is not None]
    return sum(got) / len(got) if got else None


def _busy_part(s: SecondAccount, part: str) -> int:
    """A part of a second less the thread's idle time in it (an idle wait for input is no part of the feeding)."""
    return part_ns(s, part) - (s.idle_ns if part == "sleep_outside" else 0)


def steady_findings(ctx: Ctx, thread: ThreadAccount, phases: list[Phase], steady_from: int | None = None) -> list[Finding]:
    """Outside slow phases: the parts that filled stretches (2 s or more) in which the GPU sat idle."""
    # a recurrent phase's seconds stay in: short episodes must not cut a steady stretch into pieces
    slow = [p.window for p in phases if p.kind == "slow"]
    seconds = [s for s in thread.seconds if not any(w.start_ns <= s.start_ns < w.end_ns for w in slow)]
    if not seconds:
        return []
    util_known = any(s.gpu_util_percent is not None for s in seconds)
    wall = sum(s.wall_ns - s.idle_ns for s in seconds)
    by_k = {s.k: s for s in seconds}
    found = []
    for p in PARTS:
        if p == "gpu_wait":
            continue
        member = []
        for s in seconds:
            util = s.gpu_util_percent
            if util_known and (util is None or util >= IDLE_GPU):
                continue
            if _busy_part(s, p) >= 0.2 * s.wall_ns:
                member.append(s.k)
        for run in second_runs(member):
            if run[-1] - run[0] + 1 < 2:
                continue
            lost = sum(_busy_part(by_k[k], p) * (1.0 - (by_k[k].gpu_util_percent or 0.0) / 100.0) for k in run if k in by_k)
            if lost < STEADY_MIN_SHARE * wall:
                continue
            ks = (run[0], run[-1])
            w = TimeWindow(start_ns=ctx.t0 + ks[0] * SECOND_NS, end_ns=ctx.t0 + (ks[1] + 1) * SECOND_NS)
            acc = sum_seconds(seconds, w)
            found.append(Finding(thread=thread, part=p, window=w, seconds_lost=lost / 1e9, mode="steady",
                                 share=part_ns(acc, p) / acc.wall_ns if acc.wall_ns else 0.0,
                                 gpu_util=_util(seconds, w), util_known=util_known, ks=ks,
                                 startup=in_startup(w, steady_from)))
    return found




# ---- explaining a part: culprits and the cause ------------------------------------------------


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
    ev = [Evidence(name="share of the CPU waits during which that CPU was idle", value=idle_pct, unit="%", sql=idle_sql),
          Evidence(name=f"seconds cgroup {cgroup} was throttled in the window (cpu.stat)", value=float(throttled_s),
                   unit="s", sql=f"SELECT throttled_s FROM ({sql}) LIMIT 1"),
          Evidence(name="the cgroup and its CPU quota (the tightest in the window: us per period)",
                   value=f"{cgroup}: {quota or 'max'} / {period or '?'}", sql=sql)]
    return Explained(cause=rc.CPU_THROTTLED, evidence=ev, culprits=[Culprit(comm=f"cgroup {cgroup}", relation="cgroup quota",
                                                                          ns=int(float(throttled_s) * 1e9))],
                     numbers={"cgroup": cgroup, "quota": limit, "throttled_s": f"{float(throttled_s):.1f}"},
                     reason=(f"held off the CPU by its cgroup's CPU quota: {cgroup} allows {limit} and was throttled "
                             f"{float(throttled_s):.1f} s in {int(periods or 0):,} periods of this window, while the CPU "
                             f"it waited on was idle {idle_pct:.0f}% of that time"))


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
        comm = (ctx.names.get(tid) if tid is not None else None) or ctx.procs.get(pid or -1, (None, None, None))[1] or comm
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


def _is_data_worker(comm: str | None) -> bool:
    """A DataLoader worker as PyTorch names it (pt_data_worker), or a worker of another loader by its name."""
    return bool(comm) and bool(re.search(r"data_?worker|dataloader|loader", comm or "", re.I))


def explain_cpu_wait(ctx: Ctx, f: Finding, job: int | None = None) -> Explained:
    """Waiting for a CPU: who held it (named from the rows) decides between other processes and the job's own."""
    t = f.thread
    job = t.pid if job is None else job
    w = f.window
    if ctx.has_cpu_aggregates:
        idle_sql = idle_during_waits_sql(t.pid, t.tid, w)
        idle = rows(ctx.con, idle_sql)[0][0]
        if idle is not None and float(idle) >= 50:
            throttled = _throttled(ctx, f, job, float(idle), idle_sql)
            if throttled is not None:
                return throttled
            return Explained(cause=rc.CPU_IDLE_WAIT, confident=False, evidence=[Evidence(
                name="share of the CPU waits during which that CPU was idle", value=float(idle), unit="%", sql=idle_sql)],
                reason=(f"runnable while the CPU it waited on was idle {float(idle):.0f}% of that time: not behind "
                        "other tasks; a CPU quota would explain it, but no cgroup throttling was recorded (the store "
                        "has no cgroup samples, or they show none)"))
    sql = holders_sql(ctx, t.pid, t.tid, w) if ctx.has_cpu_aggregates else first_holders_sql(t.pid, t.tid, w)
    got = rows(ctx.con, sql)
    method = "per-CPU on-CPU time in the same second" if ctx.has_cpu_aggregates else "the task that took the CPU at each preemption"
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
    return Explained(cause=cause, reason=reason, culprits=culprits[:5], evidence=ev,
                     numbers={"holders": names, "cpus": ",".join(map(str, cpus)) or "?"})


TIMED_SLEEPS = frozenset({"nanosleep", "clock_nanosleep"})


def _wakers(ctx: Ctx, pid: int, tid: int, w: TimeWindow) -> tuple[str, list[tuple]]:
    sql = " ".join(wakers_sql(pid, tid, w).split())
    return sql, rows(ctx.con, sql)


def _is_timed(syscall: str | None, wctx: str | None, rel: str) -> bool:
    """A sleep the thread chose (time.sleep): a timer syscall ended by the kernel, not by another task of the job."""
    return (syscall or "") in TIMED_SLEEPS and (wctx in ("irq", "softirq") or rel in ("kernel", "unknown"))


def _timed_lock_holder(ctx: Ctx, f: Finding, sql: str, known: list[tuple], total: int) -> Explained | None:
    """Futex waits ended by their timeout (the GIL is asked for every 5 ms; locks with timeouts): the waiter is not
    woken by the holder, so name the thread of the same process that kept running meanwhile."""
    t = f.thread
    got = rows(ctx.con, f"""
        SELECT tid, sum(run_outside_ns + run_inside_ns)::BIGINT AS run_ns, sum(wall_ns)::BIGINT AS wall_ns
        FROM {SECONDS_TABLE} WHERE pid = {t.pid} AND tid <> {t.tid} AND k BETWEEN {f.ks[0]} AND {f.ks[1]}
        GROUP BY tid ORDER BY run_ns DESC LIMIT 3""")
    if not got or not got[0][2] or int(got[0][1]) < 0.5 * int(got[0][2]):
        return None
    tid, run_ns, wall_ns = int(got[0][0]), int(got[0][1]), int(got[0][2])
    timed = int(known[0][5] or 0)
    who = ctx.who(t.pid, tid)
    ev = [Evidence(name="who ended the sleeps (share of the sleep time)", value="; ".join(
              f"{'a timer interrupt (' + str(r[3]) + ', landed on ' + str(r[2]) + ')' if r[3] in ('irq', 'softirq') else ctx.who(int(r[0]), int(r[1]), r[2])} "
              f"{100 * int(r[5] or 0) / total:.0f}%" for r in known[:4]), sql=sql),
          Evidence(name=f"share of the window {who} was running", value=sql_round(100 * run_ns / wall_ns, 1), unit="%",
                   sql=_seconds_sql(t.pid, tid, f.ks, "100.0 * sum(run_outside_ns + run_inside_ns) / sum(wall_ns)"))]
    return Explained(
        cause=rc.LOCK_OR_GIL, evidence=ev,
        culprits=[Culprit(pid=t.pid, tids=[tid], comm=ctx.names.get(tid), relation="same process", ns=timed)],
        numbers={"waker": who, "doing": f"running {100 * run_ns / wall_ns:.0f}% of that time"},
        reason=(f"asleep in futex() waits that ended on their timeout ({100 * timed / total:.0f}% of the sleep: a lock "
                f"or the GIL, asked for again every few ms) while {who} of the same process ran "
                f"{100 * run_ns / wall_ns:.0f}% of that time: {who} holds the GIL (or the lock)"))


def _own_kind(ctx: Ctx, f: Finding) -> tuple[str, str | None, float, str]:
    """What the thread's own sleeps outside CUDA calls waited in (waits.WAIT_KINDS), its system call, the kind's share
    of the sleep, and the SQL."""
    t = f.thread
    sql = sleep_kinds_sql(t.pid, t.tid, f.window)
    got = rows(ctx.con, sql)
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
    waited for), one starved of CPU, a timer, a disk, the network, a process outside the job."""
    t = f.thread
    sql, got = _wakers(ctx, t.pid, t.tid, f.window)
    total = sum(int(r[5] or 0) for r in got) or 1
    known = [r for r in got if r[0] is not None]
    if not known:
        return _sleep_without_waker(ctx, f, io, sql)
    kind, own_syscall, kind_share, kind_sql = _own_kind(ctx, f)
    tasks = [r for r in known if r[3] not in ("irq", "softirq")]
    if known[0][3] in ("irq", "softirq") and known[0][7] in ("futex", "futex_waitv"):
        holder = _timed_lock_holder(ctx, f, sql, known, total)
        if holder:
            return holder
    if known[0][3] in ("irq", "softirq") and known[0][7] in ("futex", "futex_waitv") and tasks \
            and int(tasks[0][5] or 0) >= 0.2 * total:
        # a lock wait with a timeout (the GIL waits 5 ms, then asks for the lock): the timer ends the wait, the task
        # that releases the lock is the one it waits on
        known = tasks + [r for r in known if r not in tasks]
    wpid, wtid, wcomm, wctx, _n, wns, io_ns, syscall = known[0]
    wpid, wtid = int(wpid), int(wtid)
    rel = "interrupt" if wctx in ("irq", "softirq") else ctx.relation(t.pid, wpid, wtid, wcomm)
    culprits = []
    for r in known[:5]:
        if r[3] in ("irq", "softirq"):
            continue  # the task an interrupt landed on did not wake anyone
        culprits.append(Culprit(pid=int(r[0]), tids=[int(r[1])], comm=ctx.names.get(int(r[1])) or r[2],
                                relation=ctx.relation(t.pid, int(r[0]), int(r[1]), r[2]), ns=int(r[5] or 0)))
    share = int(wns or 0) / total
    ev = [Evidence(name="who ended the sleeps (share of the sleep time)", value="; ".join(
        f"{'an interrupt (' + str(r[3]) + ', landed on ' + str(r[2]) + ')' if r[3] in ('irq', 'softirq') else ctx.who(int(r[0]), int(r[1]), r[2])} "
        f"{100 * int(r[5] or 0) / total:.0f}%" for r in known[:5]), sql=sql),
        Evidence(name="what the sleeps waited in (kernel stack at switch-out, or the system call)",
                 value=f"{kind}: {KIND_LABEL.get(kind, kind)} {100 * kind_share:.0f}%", sql=kind_sql)]
    in_what = f" {KIND_LABEL.get(kind, kind)}" + (f" ({own_syscall}())" if own_syscall else "")
    if _is_timed(syscall, wctx, rel) or (kind == "timer" and rel in ("interrupt", "kernel")):
        return Explained(cause=rc.TIMED_SLEEP, evidence=ev, confident=False,
                         reason=f"asleep{in_what} until its timer fired ({100 * share:.0f}% of the sleep): "
                                "the program sleeps on purpose (time.sleep, a rate limit, polling)")
    if rel in ("interrupt", "kernel") or (io_ns or 0) >= 0.5 * int(wns or 1):
        by = "an interrupt" if rel == "interrupt" else f"the kernel ({wcomm})"
        named = ([Culprit(comm=f"{wctx} (landed on {wcomm})", relation="interrupt", ns=int(wns or 0))] if rel == "interrupt"
                 else [Culprit(pid=wpid, tids=[wtid], comm=wcomm, relation="kernel", ns=int(wns or 0))])
        if kind == "socket":
            peer = f"; the packets' interrupts landed on {wcomm}[{wpid}]" if rel == "interrupt" else ""
            landed = ctx.relation(t.pid, wpid, wtid, wcomm) if rel == "interrupt" else "kernel"
            if rel == "interrupt" and landed not in ("kernel", "unknown") and wpid not in (0, t.pid):
                # on loopback a packet's softirq runs in the context of the task at the other end: the peer
                named = [Culprit(pid=wpid, tids=[wtid], comm=ctx.procs.get(wpid, (None, wcomm, None))[1] or wcomm,
                                 relation=landed, ns=int(wns or 0))] + named
            return Explained(cause=rc.NETWORK_WAIT, culprits=named, evidence=ev, numbers={"syscall": own_syscall or "?"},
                             confident=f.mode == "contrast",
                             reason=f"asleep{in_what}, woken by {by} ({100 * share:.0f}% of the sleep){peer}: "
                                    "it waited on the network")
        cause = rc.IO_WAIT if (io_ns or 0) > 0 or io or kind in ("disk", "fsync", "reclaim") else rc.SLEEP_KERNEL
        reason = (f"asleep{in_what}, woken by {by}"
                  + (f": {100 * (io_ns or 0) / max(int(wns or 1), 1):.0f}% uninterruptible (IO)" if io_ns else ""))
        # Outside a slowdown, a sleep the kernel ends (a packet, a device) is the job waiting for its input: the pace
        # of what feeds it, not lost time, unless it is IO (D state) or it grew in a slow phase.
        return Explained(cause=cause, reason=reason, culprits=named, evidence=ev, numbers={"syscall": own_syscall or "?"},
                         confident=cause == rc.IO_WAIT or f.mode == "contrast")
    traced = {(int(p), int(x)) for p, x in ctx.traced_threads()}
    pool = _waker_pool(ctx, t.pid, known, total)
    if pool is not None and share < POOL_SHARE:
        return _explain_pool(ctx, f, pool, traced, ev, culprits, total, kind, in_what)
    path = follow(ctx.con, (t.pid, t.tid), (wpid, wtid), f.window, traced)
    ev += _path_evidence(ctx, path, f"{ctx.who(t.pid, t.tid)} slept")
    return _explain_path(ctx, f, path, ev, culprits, share, kind, in_what)


POOL_SHARE = 0.5  # no one waker ended this share of the sleep, but threads of one name together did: a pool
POOL_MIN, POOL_FOLLOWED = 3, 8  # a pool has this many members at least; the walk is taken from this many at most


def _waker_pool(ctx: Ctx, job: int, known: list[tuple], total: int) -> list[tuple[int, int, int]] | None:
    """The wakers that together ended most of the sleep though none did alone: threads of one name and relation
    (an OpenMP or intra-op pool, the DataLoader's workers), as (pid, tid, ns), largest first; None where there is
    no such pool."""
    groups: dict[tuple[str, str | None], list[tuple[int, int, int]]] = defaultdict(list)
    for wpid, wtid, wcomm, wctx, _n, wns, _io, _sc in known:
        if wctx in ("irq", "softirq") or wpid is None or wtid is None:
            continue
        comm = ctx.names.get(int(wtid)) or wcomm
        groups[(ctx.relation(job, int(wpid), int(wtid), comm), comm)].append((int(wpid), int(wtid), int(wns or 0)))
    best = max(groups.values(), key=lambda g: sum(m[2] for m in g), default=[])
    if len(best) < POOL_MIN or sum(m[2] for m in best) < POOL_SHARE * total:
        return None
    return sorted(best, key=lambda m: -m[2])


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
    name = ctx.names.get(pool[0][1]) or "?"
    ids = _id_range(sorted(m[1] for m in pool))
    ev.append(Evidence(name=f"where the wait-for walks from the {len(paths)} busiest of {len(pool)} waking threads named "
                            f"{name} stopped (share of the sleep they ended)",
                       value="; ".join(f"{k} {100 * v / max(followed, 1):.0f}%"
                                       for k, v in sorted(weight.items(), key=lambda kv: -kv[1]))))
    ev += _path_evidence(ctx, path, f"{ctx.who(t.pid, t.tid)} slept")
    seen = {c.tids[0] for c in culprits if c.tids}
    culprits += [Culprit(pid=pid, tids=[tid], comm=ctx.names.get(tid) or name,
                         relation=ctx.relation(t.pid, pid, tid, ctx.names.get(tid)), ns=ns)
                 for pid, tid, ns in pool if tid not in seen]
    ex = _explain_path(ctx, f, path, ev, culprits, pool_ns / total, kind, in_what)
    pooled = f"woken by {len(pool)} threads named {name} ({ids}, {100 * pool_ns / total:.0f}% of the sleep together)"
    return replace(ex, reason=f"{pooled}; {ex.reason}")


def _explain_path(ctx: Ctx, f: Finding, path: WaitPath, ev: list[Evidence], culprits: list[Culprit], share: float,
                  kind: str, in_what: str) -> Explained:
    """The cause where the wait-for path stopped (waits.follow), named from what its last thread did."""
    t = f.thread
    first, end = path.hops[0], path.end
    who, end_who = ctx.who(first.pid, first.tid), ctx.who(end.pid, end.tid)
    end_rel = ctx.relation(t.pid, end.pid, end.tid, ctx.names.get(end.tid))
    via = "" if end is first else f", itself waiting on {end_who}"
    if end is not first:
        ev.append(Evidence(name="wait chain (who woke whom)", value=" <- ".join(ctx.who(h.pid, h.tid) for h in path.hops)))
        culprits.insert(0, Culprit(pid=end.pid, tids=[end.tid], comm=ctx.names.get(end.tid), relation=end_rel,
                                   ns=end.total_ns))
    woke = f"woken by {who} ({100 * share:.0f}% of the sleep{';' if not via else ''}{in_what if not via else ''})"
    doing = doing_text(ctx.con, end)
    numbers = {"waker": end_who, "doing": doing}
    if path.stop == "cpu_wait":
        starved = explain_cpu_wait(ctx, Finding(thread=ThreadAccount(pid=end.pid, tid=end.tid, role="waited-on",
                                                                     total=Account()), part="cpu_wait", window=f.window,
                                                seconds_lost=0.0, mode=f.mode, share=0.0, ks=f.ks), job=t.pid)
        what = "worker processes" if end_rel == "child process" else "thread"
        return Explained(cause=starved.cause, culprits=starved.culprits, evidence=ev + starved.evidence,
                         numbers={**starved.numbers, "waker": end_who, "doing": doing},
                         reason=(f"waiting on its {what} {end_who} ({100 * share:.0f}% of the sleep,{in_what}), which were "
                                 f"{doing}: they waited for a CPU {starved.reason}"))
    if path.stop == "running":
        if end_rel == "child process":
            kids = [c for c in culprits if c.relation == "child process"]
            names = f"{kids[0].comm}[{_id_range(sorted({c.pid for c in kids if c.pid}))}]" if kids else end_who
            return Explained(cause=rc.INPUT_WAIT, culprits=culprits, evidence=ev, numbers=numbers,
                             reason=f"waiting on its worker processes {names} ({100 * share:.0f}% of the sleep,{in_what}"
                                    f"{via}), which were {doing}: they do not keep up")
        if end_rel == "same process":
            return Explained(cause=rc.WAITING_ON_THREAD, culprits=culprits, evidence=ev, numbers=numbers,
                             reason=f"{woke}{via}; {end_who} was {doing} while it waited: the thread waited on "
                                    f"{end_who}'s work")
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
                                    f"blocked on a pipe until {end_who} took its data; {end_who} was {doing}: the other "
                                    "end sleeps on its own timer and keeps both waiting")
        if channel == "futex":
            return Explained(cause=rc.LOCK_OR_GIL, culprits=culprits, evidence=ev, numbers=numbers,
                             reason=f"{woke}{via}; {end_who} was {doing} while the thread waited: {end_who} held the "
                                    "lock (or the queue) the thread needed while it slept")
        return Explained(cause=rc.WAITING_ON_PROCESS if end_rel != "same process" else rc.WAITING_ON_THREAD,
                         culprits=culprits, evidence=ev, numbers=numbers,
                         reason=f"{woke}{via}; {end_who} was {doing}: it paces the thread with its own sleeps")
    if path.stop in ("disk", "fsync", "reclaim"):
        return Explained(cause=rc.IO_WAIT, culprits=culprits, evidence=ev, numbers=numbers,
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
    cause = rc.INPUT_WAIT if end_rel == "child process" else rc.WAITING_ON_THREAD if end_rel == "same process" \
        else rc.WAITING_ON_PROCESS
    turns = f"; it waits on {ctx.who(t.pid, t.tid)} in turn" if path.stop == "sleeper" else ""
    return Explained(cause=cause, culprits=culprits, evidence=ev, numbers=numbers, confident=path.stop != "mixed",
                     reason=f"{woke}{via}; {end_who} was {doing}{turns}")


def _channel(path: WaitPath) -> str | None:
    """What the last waiting thread of a path waited in when its end woke it (a pipe the end drained, a futex the end
    released): the end's part in the wait, whatever the first thread itself waited in."""
    before, end = path.hops[-2], path.hops[-1]
    woken = [s for s in before.sleeping if s[2] == end.tid]
    return max(woken, key=lambda s: s[5])[0] if woken else None


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
                                                             f"({', '.join(map(str, kids))}) AND k BETWEEN {f.ks[0]} AND {f.ks[1]}")})
            comm = ctx.names.get(pids[0]) or ctx.procs.get(pids[0], (None, "?", None))[1]
            helpers = roles.get("helper threads")
            aside = f"; their {helpers[0]} helper threads ran {helpers[1]:.0f}%" if helpers and helpers[1] is not None else ""
            ev.append(Evidence(name="the workers' share of the window on a CPU, per role (each process's busiest thread; "
                                    "its other threads apart)", value=f"worker threads {workers[1]:.0f}%{aside}",
                               sql=share_sql))
            culprits = [Culprit(pid=None, tids=pids, comm=comm, relation="child process", ns=0)]
            return Explained(cause=rc.INPUT_WAIT, culprits=culprits, evidence=ev, confident=False,
                             reason=(f"while its child processes {comm}[{_id_range(pids)}] ran on-CPU {workers[1]:.0f}% of "
                                     f"that time (their busiest threads{aside}; waker not recorded: likely waiting on them)"))
    cause = rc.IO_WAIT if io else rc.SLEEP_UNKNOWN
    return Explained(cause=cause, reason="on something the store does not name (waker not recorded)", evidence=ev,
                     confident=False)


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
                          unnest(range((start_ns - {t0}) // {SECOND_NS}, (greatest(end_ns, start_ns + 1) - 1 - {t0}) // {SECOND_NS} + 1)) AS k
                   FROM call_spans WHERE pid = {pid} AND tid = {tid})
        SELECT call_class, sum(least(end_ns, {t0} + (k + 1) * {SECOND_NS}) - greatest(start_ns, {t0} + k * {SECOND_NS}))::BIGINT AS ns
        FROM c WHERE k IN ({ks}) GROUP BY call_class""".split())


def explain_in_calls(ctx: Ctx, f: Finding, baseline: list[TimeWindow]) -> Explained:
    """Time inside CUDA calls grew (or filled idle GPU time): which kind of call, and whether another process
    used the GPU meanwhile."""
    t = f.thread
    sql = call_class_sql(t.pid, t.tid, f.ks, ctx.t0)
    now = {r[0]: (int(r[1]), int(r[2] or 0), r[3]) for r in rows(ctx.con, sql)}
    wall = max(1, (f.ks[1] - f.ks[0] + 1) * SECOND_NS)
    base: dict[str, int] = defaultdict(int)
    base_wall = 0
    spans = [_k_range(ctx, w) for w in baseline]
    base_wall = sum((b - a + 1) * SECOND_NS for a, b in spans)
    if spans:  # one query for every baseline window (short episodes cut the baseline into many), once per thread
        key = (t.pid, t.tid, tuple(spans))
        if key not in ctx.cache:
            ctx.cache[key] = rows(ctx.con, baseline_class_sql(t.pid, t.tid, spans, ctx.t0))
        for r in ctx.cache[key]:
            base[r[0]] += int(r[1] or 0)
    # Contrast: the kind whose share grew against the baseline. Steady: the baseline is the same time seen whole
    # (the window lies inside it), so every growth is ~0 and the largest kind is the answer.
    growth = {c: v[1] / wall - (base[c] / base_wall if base_wall and f.mode == "contrast" else 0.0) for c, v in now.items()}
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
        n, ns, nbytes = now.get(top, (0, 0, None))
        gbs = (nbytes or 0) / ns if ns else 0.0
        return Explained(cause=rc.PAGEABLE_COPIES, evidence=ev, confident=top == "copy_pageable",
                         reason=(f"{n} host<->device copies from pageable memory ({(nbytes or 0) / 1e9:.2f} GB at "
                                 f"{gbs:.1f} GB/s)" if top == "copy_pageable" else
                                 f"{n} host<->device copies at {gbs:.1f} GB/s (pinned or not: not recorded)"),
                         numbers={"gbs": f"{gbs:.1f}"})
    if top == "alloc" and f.startup:
        context = _context_creation(ctx, f, now["alloc"][1])
        if context:
            return context
    if top == "alloc":
        n, ns, _b = now["alloc"]
        return Explained(cause=rc.ALLOCATOR_CHURN, evidence=ev,
                         reason=f"{n} memory allocations and frees took {ns / 1e9:.2f} s ({100 * ns / wall:.0f}% of the window)")
    if top == "launch_first":
        n, ns, _b = now["launch_first"]
        return Explained(cause=rc.COLD_START, evidence=ev,
                         reason=f"{n} first launches of distinct kernels took {ns / 1e9:.2f} s (module loading)")
    if top == "sync" or f.part == "gpu_wait":
        return Explained(cause=rc.GPU_SLOWER, evidence=ev, confident=False,
                         reason="its synchronising calls waited longer for the GPU, with no other process seen using it: "
                                "the GPU work per step grew, or a GPU user the tracer cannot see")
    return Explained(cause=rc.LAUNCH_OVERHEAD, evidence=ev,
                     reason=f"CPU time inside {top} calls")


def _context_creation(ctx: Ctx, f: Finding, alloc_ns: int) -> Explained | None:
    """At start-up, allocation time that is mostly the process's first CUDA call: the CUDA context created on first
    use (driver initialisation), a cold start, not the caching allocator churning."""
    sql = (f"SELECT op, ts_ns, round(duration_ns / 1e9, 3) AS s FROM cuda_calls WHERE pid = {f.thread.pid} "
           f"ORDER BY ts_ns LIMIT 1")
    got = rows(ctx.con, sql)
    if not got or got[0][2] is None:
        return None
    op, ts, secs = got[0][0], int(got[0][1]), float(got[0][2])
    if not (f.window.start_ns <= ts < f.window.end_ns) or secs * 1e9 < 0.5 * alloc_ns:
        return None
    # the first recorded call: the collector may have attached after the process's own first call, hence 'likely'
    return Explained(cause=rc.COLD_START, numbers={"slowest_ms": f"{secs * 1e3:.0f}"}, confident=False,
                     evidence=[Evidence(name=f"the process's first recorded CUDA call ({op}), seconds", value=secs, unit="s",
                                        sql=f"SELECT s FROM ({sql})")],
                     reason=(f"its first recorded CUDA call ({op}) took {secs:.2f} s of it: likely the CUDA context being "
                             "created on first use (driver initialisation), a start-up cost"))


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
    got = [r for r in rows(ctx.con, sql) if not ctx.is_collector(int(r[0]))]
    gsql = (f"SELECT pid, max(used_memory_bytes) AS mem, avg(sm_util_percent) AS sm FROM gpu_processes "
            f"WHERE ts_ns BETWEEN {lo} AND {hi} AND pid NOT IN ({', '.join(map(str, sorted(fam)))}) GROUP BY pid")
    try:
        nvml = [r for r in rows(ctx.con, gsql) if not ctx.is_collector(int(r[0]))]
    except duckdb.Error:
        nvml = []
    if not got and not nvml:
        return None
    culprits = [Culprit(pid=int(p), tids=[], comm=ctx.procs.get(int(p), (None, None, None))[1],
                        relation=ctx.relation(pid, int(p), None, None), ns=int(ns or 0)) for p, _c, _n, ns in got[:3]]
    seen = {c.pid for c in culprits}
    culprits += [Culprit(pid=int(p), comm=ctx.procs.get(int(p), (None, None, None))[1] or "?", relation="other process")
                 for p, _m, _s in nvml if int(p) not in seen][:3]
    text = "; ".join(f"{c.comm or '?'}[{c.pid}] {n:,} CUDA calls" for c, (_p, _c, n, _ns) in zip(culprits, got, strict=False))
    if nvml:
        text += ("; " if text else "") + "on the GPU per NVML: " + ", ".join(f"pid {int(p)}" for p, _m, _s in nvml[:3])
    return culprits, text, sql


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
    else:
        num = (f"SELECT count(*) FROM cuda_calls, (SELECT min(started_ns) AS t0 FROM sessions) o WHERE pid = {int(pid)} "
               f"AND contains(op, 'ynchronize') AND ({which.replace('k BETWEEN', '(ts_ns - o.t0) // 1000000000 BETWEEN')})")
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
    now, base = rows(ctx.con, now_sql)[0][0], rows(ctx.con, base_sql)[0][0]
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
                         reason=(f"the host issued {float(now):,.0f} launches+copies per iteration vs {float(base):,.0f} in "
                                 f"the healthy baseline (GPU {gpu}% busy): the same progress came in more, smaller pieces, "
                                 "and launching them is the work"))
    return Explained(cause=rc.EXCESS_SYNC, evidence=ev, numbers=numbers,
                     reason=(f"it synchronised with the GPU {float(now):,.1f} times per iteration vs {float(base):,.1f} in "
                             "the healthy baseline: each sync drains the GPU's queue and the host waits for it"))


def explain_run_outside(ctx: Ctx, f: Finding, baseline: list[TimeWindow]) -> Explained:
    """Running outside CUDA calls: the feeding thread's own Python/data work; page faults when allocations surged."""
    t = f.thread
    k0, k1 = f.ks
    sql = (f"WITH o AS (SELECT min(started_ns) AS t0 FROM sessions) SELECT sum(count)::BIGINT AS pages, "
           f"count(DISTINCT bucket_start_ns) AS seconds FROM host_aggregates, o WHERE op = 'mm_page_alloc' AND pid = {t.pid} "
           f"AND (bucket_start_ns - o.t0) // 1000000000 BETWEEN {k0} AND {k1}")
    pages, _secs = rows(ctx.con, sql)[0]
    rate = int(pages or 0) / max(1, k1 - k0 + 1)
    base_rate = None
    if baseline:
        tot = n = 0
        for w in baseline:
            b0, b1 = _k_range(ctx, w)
            p, _s = rows(ctx.con, sql.replace(f"BETWEEN {k0} AND {k1}", f"BETWEEN {b0} AND {b1}"))[0]
            tot += int(p or 0)
            n += b1 - b0 + 1
        base_rate = tot / max(n, 1)
    rate_sql = f"SELECT round(coalesce(pages, 0) / {k1 - k0 + 1})::BIGINT FROM ({' '.join(sql.split())})"
    ev = [Evidence(name="pages allocated by the process per second", value=int(rows(ctx.con, rate_sql)[0][0]), sql=rate_sql)]
    if rate >= 20_000 and (base_rate is None or rate >= 4 * max(base_rate, 1)):
        return Explained(cause=rc.PAGE_FAULTS, evidence=ev,
                         reason=(f"allocating {rate:,.0f} pages/s ({rate * 4096 / 1e9:.1f} GB/s of fresh memory"
                                 + (f", vs {base_rate:,.0f}/s before" if base_rate is not None else "")
                                 + "): the time goes to page faults on new memory"))
    for what in ("sync", "work"):  # more syncs or more pieces per iteration: why its own work per step grew
        grew = _grew_per_iteration(ctx, f, baseline, what)
        if grew is not None:
            return grew
    kids = ctx.alive_children(t.pid, f.window)
    note = "no child process (worker) alive then" if not kids else f"{len(kids)} child processes alive"
    return Explained(cause=rc.HOST_BOUND, evidence=ev,
                     reason=f"its own work between CUDA calls (Python, data preparation; {note}): the GPU waits on it")


# ---- chains -------------------------------------------------------------------------------------


def _severity(seconds: float, wall_s: float, f: Finding, confident: bool) -> str:
    if f.startup or not confident and f.mode == "steady":
        return "LOW"
    share = seconds / wall_s if wall_s else 0.0
    level = "HIGH" if share >= HIGH_SHARE else "MEDIUM" if share >= MEDIUM_SHARE else "LOW"
    if f.mode == "steady" and (not f.util_known or not confident) and level != "LOW":
        level = "LOW" if not f.util_known else "MEDIUM"
    if not confident and level == "HIGH":
        level = "MEDIUM"
    return level


def _seconds_sql(pid: int, tid: int, ks: tuple[int, int], expr: str, kset: tuple[int, ...] = ()) -> str:
    which = f"k IN ({', '.join(map(str, kset))})" if kset else f"k BETWEEN {ks[0]} AND {ks[1]}"
    return f"SELECT {expr} FROM thread_seconds WHERE pid = {pid} AND tid = {tid} AND {which}"


def _worst(ctx: Ctx, f: Finding) -> Finding:
    """A recurrent finding narrowed to its worst episode's seconds, for the explainers (they read one window)."""
    if f.worst is None:
        return f
    w = TimeWindow(start_ns=ctx.t0 + f.worst[0] * SECOND_NS, end_ns=ctx.t0 + (f.worst[1] + 1) * SECOND_NS)
    return replace(f, window=w, ks=f.worst)


def _chain(ctx: Ctx, f: Finding, ex: Explained, wall_s: float, n: int) -> CausalChain:
    t = f.thread
    who = f"{t.process_comm or t.comm or '?'}[{t.pid}]'s " + ("main thread" if t.tid == t.pid else f"thread {ctx.who(t.pid, t.tid)}")
    label = _PART_LABEL[f.part]
    pct = 100 * f.share
    if f.startup:
        who = "during start-up, " + who
    ph = f.phase
    if ph is not None and f.worst is not None:
        n = len(ph.episodes)
        mean = sum(w.duration_ns for w in ph.episodes) / n / 1e9
        every = f", every {ph.period_s:.1f} s" if ph.period_s else ""
        worst = f"+{f.worst[0]:,.1f} s to +{f.worst[1] + 1:,.1f} s"
        drop = f"{_fell(f)} in them" if f.slowdown else "its CUDA work stopped in them"
        summary = (f"{who} stalled {n} time{'s' if n != 1 else ''} from {ctx.span(f.window)} ({mean:.2f} s each{every}; "
                   f"{drop}): in those seconds it was {label} {pct:.0f}% of the time (vs {100 * (f.base_share or 0):.0f}% "
                   f"in the healthy baseline), {ex.reason} (read in the worst episode, {worst})")
    elif f.mode == "contrast":
        before = f" (vs {100 * (f.base_share or 0):.0f}% in the healthy baseline)"
        drop = ("its CUDA work stopped" if f.stopped else _fell(f)) if f.slowdown or f.stopped else ""
        summary = f"{who} was {label} {pct:.0f}% of the time from {ctx.span(f.window)}{before}, {ex.reason}; {drop}"
    else:
        gpu = f", GPU {f.gpu_util:.0f}% busy" if f.gpu_util is not None else ", GPU utilisation not recorded"
        summary = f"{who} was {label} {pct:.0f}% of the time from {ctx.span(f.window)}{gpu}: {ex.reason}"
    ev = []
    if ph is not None and ph.sql:
        ev.append(Evidence(name=f"short slow episodes (runs of {(ph.bin_ns or SECOND_NS) / 1e6:.0f} ms bins under "
                                f"{100 * SCAN_FRACTION:.0f}% of the healthy work rate, one under {100 * HEALTHY_FRACTION:.0f}%, "
                                f"each costing {MIN_EPISODE_LOSS_S} s or more)", value=len(ph.episodes),
                           sql=f"SELECT count(*) FROM ({ph.sql})"))
        if ph.period_s is not None:
            ev.append(Evidence(name="mean time from one episode's start to the next's", value=float(ph.period_s), unit="s",
                               sql=f"SELECT round((max(start_s) - min(start_s)) / (count(*) - 1), 2) FROM ({ph.sql})"))
        if ph.lost_s is not None:
            ev.append(Evidence(name="the process's work lost in the episodes (their length less their work at the healthy "
                                    "rate)", value=float(ph.lost_s), unit="s", sql=f"SELECT round(sum(lost_s), 3) FROM ({ph.sql})"))
    ev.append(Evidence(name=f"share of the thread's time {label}" + (" in the seconds holding the episodes" if f.kset else ""),
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
                           sql=f"SELECT avg(gpu_util_percent) FROM ({gpu_util_sql()}) WHERE k IN ({', '.join(map(str, f.kset))})"))
    elif f.gpu_util is not None:
        ev.append(Evidence(name="GPU utilisation in the window", value=sql_round(f.gpu_util, 1), unit="%",
                           sql=f"SELECT avg(gpu_util_percent) FROM snapshots WHERE ts_ns BETWEEN {f.window.start_ns} AND {f.window.end_ns}"))
    ev.append(Evidence(name="feeding time explained (s)", value=round(f.seconds_lost, 2), unit="s"))
    ev += ex.evidence
    numbers = {"who": who, "share": f"{pct:.0f}", "window": ctx.span(f.window), "cpus_total": "?", **ex.numbers}
    return CausalChain(
        id=f"{ex.cause}:{t.pid}/{t.tid}@{f.ks[0]}s", op=ex.cause,
        severity=_severity(f.seconds_lost, wall_s, f, ex.confident),  # type: ignore[arg-type]
        summary=summary, root_cause=ex.cause, explanation=_explanation(f, ex),
        seconds_lost=round(f.seconds_lost, 3), window=f.window, culprits=ex.culprits, pids=[t.pid],
        evidence=ev, recommendations=rc.recommend(ex.cause, numbers))


def _fell(f: Finding) -> str:
    """'iterations/s fell 4.7x (83 -> 18)': the drop, in its unit, with the two rates."""
    if f.rates is None:
        return f"throughput fell {f.slowdown:.1f}x"
    base, now = f.rates
    digits = 0 if base >= 10 else 1 if base >= 1 else 2
    return f"{f.unit} fell {f.slowdown:.1f}x ({base:,.{digits}f} -> {now:,.{digits}f})"


def _explanation(f: Finding, ex: Explained) -> str:
    if f.phase is not None:
        return (f"Read from the time accounting: in the seconds holding {len(f.phase.episodes)} short slow episodes (the "
                f"process's work rate under {100 * HEALTHY_FRACTION:.0f}% of its healthy rate over each, read in sub-second "
                f"bins), the part of the feeding thread's time {_PART_LABEL[f.part]} grew from "
                f"{100 * (f.base_share or 0):.1f}% to {100 * f.share:.1f}% of its time; its cost per unit of CUDA work "
                f"against the baseline explains {f.seconds_lost:.2f} s of the time lost in them. The culprits are read in "
                f"the episode where it grew most: " + ex.reason + ".")
    if f.mode == "contrast":
        return (f"Read from the time accounting: in this slow phase the part of the feeding thread's time "
                f"{_PART_LABEL[f.part]} grew from {100 * (f.base_share or 0):.1f}% to {100 * f.share:.1f}%; "
                f"{f.seconds_lost:.2f} s of the time lost to the slowdown is attributed to it. " + ex.reason + ".")
    return (f"Read from the time accounting: while the GPU was idle, the feeding thread was {_PART_LABEL[f.part]} "
            f"{100 * f.share:.1f}% of the time; {f.seconds_lost:.2f} s of GPU-idle time is attributed to it. " + ex.reason + ".")


def pace_threads(acc: Accounting) -> list[ThreadAccount]:
    """Per feeding process, the thread that sets its pace: the main thread when it starts CUDA work (it runs the
    training loop; PyTorch's autograd thread launches the backward kernels but sleeps until the main thread hands
    it work), else the busiest feeding thread. Processes come busiest first."""
    by_pid: dict[int, list[ThreadAccount]] = defaultdict(list)
    for t in acc.threads:
        if t.role == "feeder":
            by_pid[t.pid].append(t)
    out = []
    for pid, threads in by_pid.items():
        main = next((t for t in threads if t.tid == pid), None)
        out.append(main or threads[0])
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
    ctx = _context(con, window, names)
    ctx.progress = {m.pid: m for m in acc.progress}
    chains: list[tuple[int, CausalChain]] = []
    minor: list[str] = []
    paces = [t for t in pace_threads(acc) if not ctx.is_collector(t.pid)]
    for rank, t in enumerate(paces):
        phases = [p for p in acc.phases if p.pid == t.pid]
        baseline = [p.window for p in phases if p.kind == "baseline"]
        wall_s = t.busy_ns / 1e9  # the feeding time: an idle wait for input is not (accounting.idle_sql)
        steady_from = acc.steady_from_ns.get(t.pid)
        found: list[tuple[Finding, CausalChain]] = []
        for i, f in enumerate(contrast_findings(ctx, t, phases, steady_from) + steady_findings(ctx, t, phases, steady_from)):
            ex = _explain(ctx, _worst(ctx, f), baseline)
            chain = _chain(ctx, f, ex, wall_s, i)
            if rank > 0 and chain.severity == "HIGH":
                chain.severity = "MEDIUM"
            found.append((f, chain))
        found = _one_story(found, wall_s)
        # a phase that lost progress leads: the steady state around it (host-bound all along, say) is its context
        lost = any(f.mode == "contrast" and c.severity != "LOW" for f, c in found)
        for f, chain in found:
            if wall_s and chain.seconds_lost is not None and chain.seconds_lost / wall_s < MINOR_SHARE:
                minor.append(f"{chain.root_cause}: {chain.summary} ({chain.seconds_lost:.2f} s)")
                continue
            if lost and f.mode == "steady" and chain.severity == "HIGH":
                chain.severity = "MEDIUM"
            chains.append((min(rank, 1) * 2 + (f.mode == "steady" and lost), chain))
    order = SEVERITY_RANK
    # contrast before steady context (odd keys), then severity, the job before other GPU users, seconds explained
    return [c for _, c in sorted(chains, key=lambda kc: (kc[0] % 2, order[kc[1].severity], kc[0],
                                                          -(kc[1].seconds_lost or 0)))], minor


def _one_story(found: list[tuple[Finding, CausalChain]], wall_s: float) -> list[tuple[Finding, CausalChain]]:
    """Findings of one thread that name the same cause over overlapping windows are one story (a launch-bound step
    shows as running and as waiting on the autograd thread): the largest keeps its words and takes the others'
    seconds, their summaries as evidence, and the severity of the sum."""
    out: list[tuple[Finding, CausalChain]] = []
    for f, chain in sorted(found, key=lambda fc: -(fc[1].seconds_lost or 0)):
        # the steady state is one story wherever it shows (host-bound before a slowdown and after it); a phase's
        # findings are one where their windows meet
        into = next((c for g, c in out if c.root_cause == chain.root_cause and g.mode == f.mode and c.window
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
    return _io_story(out, wall_s)


def _raise(into: CausalChain, wall_s: float, f: Finding) -> None:
    """A chain that took another's seconds: the severity of the sum (never lowered; start-up stays as it was)."""
    share = (into.seconds_lost or 0) / wall_s if wall_s else 0.0
    level = "HIGH" if share >= HIGH_SHARE else "MEDIUM" if share >= MEDIUM_SHARE else "LOW"
    if SEVERITY_RANK[level] < SEVERITY_RANK[into.severity] and not f.startup:
        into.severity = level  # type: ignore[assignment]


# What a thread does when it writes data out (a checkpoint, a log flush, a dataset cache): copies to host memory,
# page faults on the fresh buffers and page cache, its own serialising, and the disk IO that ends it.
_DATA_OUT = frozenset({rc.PAGE_FAULTS, rc.PAGEABLE_COPIES, rc.HOST_BOUND})
IO_SHARE = 0.2  # disk IO must explain this share of the stall's seconds to lead it


def _io_story(found: list[tuple[Finding, CausalChain]], wall_s: float) -> list[tuple[Finding, CausalChain]]:
    """Disk IO of a thread in a slow phase, with page faults, pageable copies and its own running in the same stall,
    is one story: the thread writing data out. The IO chain leads (its wait on the device is what the others lead up
    to) and takes the others' seconds; each stays as evidence with its own numbers."""
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
        for g, c in parts:
            out.remove((g, c))
            chain.evidence.append(Evidence(name=f"in the same stalls ({c.root_cause})",
                                           value=f"{c.summary} [{c.seconds_lost or 0:.2f} s]"))
        chain.seconds_lost = round(total, 3)
        chain.summary += "; in the same stalls: " + "; ".join(
            f"{_PART_LABEL[g.part]} {100 * g.share:.0f}% ({c.root_cause}) [{c.seconds_lost or 0:.1f} s]" for g, c in parts)
        start = min([chain.window.start_ns] + [c.window.start_ns for _g, c in parts if c.window])
        end = max([chain.window.end_ns] + [c.window.end_ns for _g, c in parts if c.window])
        chain.window = TimeWindow(start_ns=start, end_ns=end)
        _raise(chain, wall_s, f)
    return out


def _explain(ctx: Ctx, f: Finding, baseline: list[TimeWindow]) -> Explained:
    if f.part == "cpu_wait":
        return explain_cpu_wait(ctx, f)
    if f.part in ("sleep_outside", "io"):
        return _spawning(ctx, f, baseline, _per_iteration(ctx, f, baseline, explain_sleep(ctx, f, io=f.part == "io")))
    if f.part in ("gpu_wait", "run_inside"):
        return _per_iteration(ctx, f, baseline, explain_in_calls(ctx, f, baseline))
    if f.part == "run_outside":
        return _spawning(ctx, f, baseline, explain_run_outside(ctx, f, baseline))
    return Explained(cause=rc.UNEXPLAINED, reason="the store does not say what the thread was doing off-CPU", confident=False)


# Explanations that say whose work or wait filled the time, not why there was more of it: where the process's calls
# per iteration grew, that is why (the same progress in more pieces, or more syncs per step).
_REFINED = {rc.WAITING_ON_THREAD: ("sync", "work"), rc.GPU_SLOWER: ("sync", "work"), rc.LAUNCH_OVERHEAD: ("sync", "work")}


def _per_iteration(ctx: Ctx, f: Finding, baseline: list[TimeWindow], ex: Explained) -> Explained:
    """ex, or LAUNCH_BOUND / EXCESS_SYNC carrying ex's culprits and evidence where the calls per iteration grew."""
    for what in _REFINED.get(ex.cause, ()):
        grew = _grew_per_iteration(ctx, f, baseline, what)
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
    n, comm, life_ns, kids = rows(ctx.con, sql)[0]
    seconds = f.window.duration_ns / 1e9
    if not n or n < SPAWN_MIN or n / seconds < SPAWN_RATE or life_ns is None or life_ns >= SPAWN_LIFE_NS:
        return ex
    base_n = sum(int(rows(ctx.con, spawned_sql(t.pid, w))[0][0] or 0) for w in baseline)
    base_s = sum(w.duration_ns for w in baseline) / 1e9
    if base_s and base_n / base_s * SPAWN_OVER_BASE > n / seconds:
        return ex  # as many before: the loop's habit all along, not what changed
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


def _merge_same(chains: list[CausalChain]) -> list[CausalChain]:
    """Order by severity, then seconds explained."""
    rank = SEVERITY_RANK
    return sorted(chains, key=lambda c: (rank[c.severity], -(c.seconds_lost or 0)))
