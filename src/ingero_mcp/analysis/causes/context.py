"""The causes' common ground: the accounting's parts as the causes read them, a finding, and the context
every explainer reads (the job's processes and threads, names, relations, a cache of query results).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
import re

import duckdb

from ingero_mcp.analysis._sql import rows
from ingero_mcp.analysis.answers import shared_rows
from ingero_mcp.analysis.accounting import origin_ns
from ingero_mcp.analysis.models import Account, CausalChain, Phase, Progress, ThreadAccount, TimeWindow

MIN_GROWTH = 0.03  # a part's excess must be at least this share of the slow phase's wall time


MIN_EXCESS = 0.05  # ... and at least this share of the time lost in it


STEADY_MIN_SHARE = 0.05  # a part must hold this share of the idle-GPU time to count outside slow phases


IDLE_GPU = 50.0  # %: below this utilisation a second counts as the GPU waiting on the host

GPU_SATURATED = 90.0  # %: at or above this mean utilisation over a slow phase, the GPU set its pace (causes.explain)


MINOR_SHARE = 0.01  # chains explaining less of the feeding time are listed as minor


HIGH_SHARE, MEDIUM_SHARE = 0.25, 0.05


# The accounting's parts as the causes read them.
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
    drained_s: float | None = None  # steady at a busy GPU: the part's time with nothing queued on it (drained.py)
    bound_s: float | None = None  # steady at a busy GPU: the GPU's idle time the part held at least (idle_bound.py)
    serialising: bool = False  # host-bound whose samples say it serialised data (culprits.host_work): a write-out


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

    def family(self, pid: int) -> frozenset[int]:
        """The process and its descendants (forked workers); worked out once per process (relation() asks often, so
        the set itself is kept: thousands of workers are not copied at every ask)."""
        key = ("family", pid)
        if key in self.cache:
            return self.cache[key]  # type: ignore[return-value]
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
        kept = frozenset(out)
        self.cache[key] = kept  # type: ignore[assignment]
        return kept

    def alive_children(self, pid: int, w: TimeWindow) -> list[int]:
        """Descendants of a process alive for at least half of the window."""
        got = rows(self.con,
                   "SELECT pid, min(first_seen_ns), max(coalesce(exit_ns, last_seen_ns)) FROM processes GROUP BY pid")
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
            self.cache[key] = shared_rows(self.con, "SELECT DISTINCT pid, tid FROM sched_intervals")
        return self.cache[key]

    def is_collector(self, pid: int | None) -> bool:
        """Whether a pid is this project's collector (it is labelled, never blamed)."""
        return pid is not None and bool(_COLLECTOR.search((self.procs.get(pid, (None, None, None))[2]) or ""))

    def who(self, pid: int | None, tid: int | None = None, comm: str | None = None) -> str:
        """'comm[pid]' or 'comm[pid]/tid', a thread named by its own name where known."""
        name = (self.names.get(tid) if tid is not None else None) or comm or (
            self.procs.get(pid or -1, (None, None, None))[1]) or "?"
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


def _context(con: duckdb.DuckDBPyConnection, window: TimeWindow, names: dict[int, str],
             t0: int | None = None) -> Ctx:
    """The context the explainers share; `t0`: the trace's first moment, as the accounting read it (else read)."""
    procs = {int(p): (None if pp is None else int(pp), c, m)
             for p, pp, c, m in rows(con, "SELECT pid, any_value(ppid), any_value(comm), any_value(cmdline) FROM "
                                          "processes GROUP BY pid")}
    has_cpu = bool(rows(con, "SELECT 1 FROM host_aggregates WHERE op = 'sched_switch' AND cpu IS NOT NULL LIMIT 1"))
    return Ctx(con=con, t0=(origin_ns(con) if t0 is None else t0) or window.start_ns, window=window, names=names,
               procs=procs, has_cpu_aggregates=has_cpu)


def _seconds_sql(pid: int, tid: int, ks: tuple[int, int], expr: str, kset: tuple[int, ...] = ()) -> str:
    which = f"k IN ({', '.join(map(str, kset))})" if kset else f"k BETWEEN {ks[0]} AND {ks[1]}"
    return f"SELECT {expr} FROM thread_seconds WHERE pid = {pid} AND tid = {tid} AND {which}"
