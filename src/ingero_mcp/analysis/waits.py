"""Who a sleeping thread waited on, and why: a wait-for graph that stops where the wait began.

Each sleep of a traced thread is an edge to the task that ended it (its waker). What the waker did while the
thread slept decides where the wait began: a waker that ran was the work waited for; one that waited for a
CPU was starved; one that itself slept, woken by a third task, passes the wait on to that task (the edge is
followed, over the part of the sleep the waker spent waiting on it); one that slept on a timer, in disk IO, on
the network or on a process outside the job is where the wait began, and the graph stops there. Each sleep's
kind (what the kernel was doing: a pipe, a socket, a futex, a timer, a disk) comes from the kernel stack taken
as the thread left the CPU (schema v5) or, before that, from the system call it slept in.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import duckdb

from ingero_mcp.analysis._sql import TIMEOUT_WAITS, rows, sql_round, sql_str
from ingero_mcp.analysis.answers import shared_rows
from ingero_mcp.analysis.models import TimeWindow
from ingero_mcp.store.views import SECONDS_TABLE

MAX_HOPS = 3  # edges followed from the sleeping thread
FOLLOW_SHARE = 0.5  # a waker is followed (or judged) by what filled at least this share of the sleeps it ended
# A waker that ran (a pipeline's middle stage) but also waited on a task for SLACK_SHARE of the time, while that task
# ran SATURATED of it and more than the waker did, had slack: the task it waited on set the pace (a DataLoader's
# pin-memory thread running 73% of the time and waiting on its workers, which ran 99%).
# Both shares over the whole window (busy_share), the task's more than the waker's by half the slack at least.
SLACK_SHARE, SATURATED = 0.15, 0.9

# What a sleep waited in, tried in order: (kind, frames regex (kernel stack, innermost first), system calls). A frame
# matches with or without the underscores kernels prefix to inner variants (6.18: __mem_cgroup_handle_over_high).
# A kind with no frames pattern is known from the system call alone; 'disk' also covers any D-state sleep.
WAIT_KINDS: tuple[tuple[str, str | None, tuple[str, ...]], ...] = (
    ("gpu", r"\[nvidia", ()),
    ("fsync", r"(^| )_*(do_fsync|vfs_fsync_range|ksys_sync|sync_file_range|file_write_and_wait_range|jbd2_log_wait)",
     ("fsync", "fdatasync")),
    # a file's data written out on the thread's own time (ext4 flushes a file renamed over another; writeback
    # throttling), and a deleted or replaced file's blocks freed on the device: writes waited for, as fsync is
    ("writeback", r"(^| )_*(filemap_fdatawrite|filemap_write_and_wait|writeback_single_inode|wbt_wait)", ()),
    ("discard", r"(^| )_*(blkdev_issue_discard|__blkdev_issue_discard)", ()),
    ("reclaim",
     r"(^| )_*(shrink_node|try_to_free_pages|throttle_direct_reclaim|balance_dirty_pages|mem_cgroup_handle_over)",
     ()),
    ("disk", r"(^| )_*(io_schedule|folio_wait|wait_on_page|bit_wait_io|submit_bio_wait|blk_mq|filemap_fault)", ()),
    ("pipe", r"pipe_(read|write|wait)", ()),
    # a Unix-domain socket is a local channel between processes (multiprocessing, torch's shared tensors), like a
    # pipe: its waker is the task at the other end; a TCP/UDP socket is the network (loopback included)
    ("unix_socket", r"(^| )_*(unix_stream|unix_dgram)", ()),
    ("socket", r"(^| )_*(tcp_|udp_|sk_wait|sk_stream_wait|inet_csk_accept|__skb_wait|skb_recv)",
     ("recvfrom", "recvmsg", "recvmmsg", "sendto", "sendmsg", "sendmmsg", "accept", "accept4", "connect")),
    ("poll", r"(^| )_*(ep_poll|do_epoll_wait|do_sys_poll|do_select|core_sys_select)", TIMEOUT_WAITS),
    ("futex", r"(^| )_*(futex_|__futex)", ("futex", "futex_waitv")),
    ("timer", r"(^| )_*(do_nanosleep|hrtimer_nanosleep|msleep|schedule_hrtimeout)", ("nanosleep", "clock_nanosleep")),
    ("child", r"(^| )_*(do_wait|kernel_wait4)", ("wait4", "waitid")),
)
KIND_LABEL = {
    "gpu": "in the GPU driver", "fsync": "in fsync (flushing a file to disk)",
    "writeback": "writing a file's data out to disk", "discard": "freeing a deleted file's blocks on the disk",
    "reclaim": "reclaiming memory",
    "disk": "in disk IO", "pipe": "on a pipe", "socket": "on a socket (the network)",
    "unix_socket": "on a Unix-domain socket (another local process)", "poll": "in poll/select/epoll",
    "futex": "on a futex (a lock, a condition or a queue)", "timer": "on a timer (a sleep it chose)",
    "child": "waiting for a child process", "read": "in read()", "write": "in write()", "other": "in the kernel",
}
# kinds where a sleep began outside the job: the graph stops at them, whoever ended them
STOP_KINDS = frozenset({"timer", "disk", "fsync", "writeback", "discard", "reclaim", "socket", "gpu", "child"})
IO_KINDS = frozenset({"disk", "fsync", "writeback", "discard", "reclaim"})  # sleeps on a device or the memory it backs


def wait_kind_sql(frames: str = "st.frames", syscall: str = "i.syscall", sleep_state: str = "sleep_state") -> str:
    """A SQL CASE naming what a sleep waited in (WAIT_KINDS), from its kernel stack's frames (NULL before v5), its
    system call and its state (D: uninterruptible)."""
    text = f"coalesce(array_to_string({frames}, ' '), '')"
    arms = []
    for kind, pattern, calls in WAIT_KINDS:
        cond = []
        if pattern:
            cond.append(f"regexp_matches({text}, '{pattern}')")
        if calls:
            cond.append(f"({frames} IS NULL AND {syscall} IN ({', '.join(repr(c) for c in calls)}))")
        arms.append(f"WHEN {' OR '.join(cond)} THEN '{kind}'")
    arms.append(f"WHEN {sleep_state} = 'D' THEN 'disk'")
    arms.append(f"WHEN {frames} IS NULL AND {syscall} IN ('read', 'readv', 'pread64', 'preadv', 'preadv2') THEN 'read'")
    arms.append(f"WHEN {frames} IS NULL AND {syscall} IN ('write', 'writev', 'pwrite64', 'pwritev', 'pwritev2') "
                "THEN 'write'")
    return "CASE " + " ".join(arms) + " ELSE 'other' END"


def _sleeps(pid: int, tid: int, lo: int = -(2**62), hi: int = 2**62) -> str:
    """A thread's sleeps (thread_state 'sleeping' rows) touching [lo, hi) with their kind: the interval's kernel stack
    joined in (the rows filtered first: the join and the kind's regular expressions then see only those)."""
    return (f"SELECT ts.*, {wait_kind_sql('st.frames', 'ts.syscall', 'ts.sleep_state')} AS kind "
            f"FROM (SELECT * FROM thread_state WHERE pid = {int(pid)} AND tid = {int(tid)} AND state = 'sleeping' "
            f"AND end_ns > {int(lo)} AND start_ns < {int(hi)}) ts "
            f"LEFT JOIN (SELECT session_id, off_ns, kstack_id FROM sched_intervals WHERE pid = {int(pid)} "
            f"AND tid = {int(tid)} AND on_ns > {int(lo)} AND off_ns < {int(hi)}) i ON i.off_ns = ts.start_ns "
            f"LEFT JOIN stacks st ON st.stack_id = i.kstack_id AND st.session_id = i.session_id")


def sleep_kinds_sql(pid: int, tid: int, w: TimeWindow, inside: bool = False, io: bool = False) -> str:
    """A thread's sleeps outside (inside) CUDA calls in the window by what they waited in, largest first (with `io`:
    those in D state)."""
    cond = ("> 0" if inside else "= 0") + (" AND t.sleep_state = 'D'" if io else "")
    return " ".join(f"""
        WITH s AS ({_sleeps(pid, tid, w.start_ns, w.end_ns)}),
        o AS (SELECT s.kind, s.syscall, least(s.end_ns, {w.end_ns}) - greatest(s.start_ns, {w.start_ns}) AS ns
              FROM s JOIN thread_sleeps t ON t.pid = s.pid AND t.tid = s.tid AND t.start_ns = s.start_ns
              WHERE s.end_ns > {w.start_ns} AND s.start_ns < {w.end_ns} AND t.inside_ns {cond})
        SELECT kind, arg_max(syscall, ns) AS syscall, count(*) AS sleeps, sum(ns)::BIGINT AS ns
        FROM o GROUP BY kind ORDER BY ns DESC""".split())


@dataclass
class Hop:
    """One thread on the wait-for path: what it did during the part of the first thread's sleeps it stands for."""

    pid: int
    tid: int
    total_ns: int  # the part of the sleeping thread's time this hop stands for
    running_ns: int = 0
    cpu_wait_ns: int = 0
    sleeping: list[tuple[str, int | None, int | None, str | None, str | None, int]] = field(default_factory=list)
    # (kind, waker pid, waker tid, waker comm, waker context, ns), largest first
    unknown_ns: int = 0
    followed_kind: str | None = None  # the kind of its sleeps through which the walk went on to the next hop
    timed_out: tuple[int, int] | None = None  # followed past its timeouts (_signaller): how many, and ns, timed out
    sql: str = ""
    summary_sql: str = ""  # one row per thing it did (running, waiting for a CPU, asleep in a kind) with its share
    doing: str | None = None  # summary_sql's rows as text (doing_text), once known

    @property
    def sleeping_ns(self) -> int:
        """Time asleep (any kind, any waker)."""
        return sum(s[5] for s in self.sleeping)

    def share(self, ns: int) -> float:
        """ns as a share of the time this hop stands for."""
        return ns / self.total_ns if self.total_ns else 0.0


@dataclass
class WaitPath:
    """From a sleeping thread to where its waits began: the hops followed and why the walk stopped there."""

    hops: list[Hop]
    stop: str  # 'running', 'cpu_wait', a WAIT_KINDS kind (a sleep that began outside the job), 'sleeper' (woken by the
    #            first thread: they take turns), 'interrupt', 'untraced' (the waker's own time is not recorded),
    #            'depth' (MAX_HOPS reached), 'mixed' (nothing filled FOLLOW_SHARE of the time)
    stop_kind: str | None = None  # the sleeps' kind where the walk stopped on a sleep
    peer: tuple[int | None, int | None, str | None] | None = None  # 'socket': the task a network softirq landed on

    @property
    def end(self) -> Hop:
        """The last hop: the thread the wait is blamed on."""
        return self.hops[-1]


def _overlaps() -> str:
    """Each pair of an interval of the CTE `iv` (a, b) and a row of the CTE `x` (start_ns, end_ns) that overlap, once,
    as x's columns and the overlap's ends (oa, ob). Both sets are disjoint (one thread's sleeps, one thread's states),
    so a pair is the interval holding the row's start or the row holding the interval's start (strictly after its
    own), each found by an ASOF join: DuckDB ran the inequality join as a nested loop (16 s at 99k sleeps)."""
    return """SELECT x.*, greatest(x.start_ns, iv.a) AS oa, least(x.end_ns, iv.b) AS ob
              FROM x ASOF JOIN iv ON x.start_ns >= iv.a WHERE x.start_ns < iv.b
              UNION ALL
              SELECT x.*, greatest(x.start_ns, iv.a), least(x.end_ns, iv.b)
              FROM iv ASOF JOIN x ON iv.a > x.start_ns WHERE iv.a < x.end_ns"""


def _hop_sql(intervals: str, pid: int, tid: int, lo: int, hi: int) -> str:
    """What thread (pid, tid) did during a set of intervals (a CTE body giving a, b): one row per state, sleep kind
    and waker, with the overlap in ns; the running time is what the rows leave of the intervals' total."""
    return " ".join(f"""
        WITH iv AS MATERIALIZED ({intervals}),
        x AS MATERIALIZED (SELECT s.state, s.start_ns, s.end_ns, s.waker_pid, s.waker_tid, s.waker_comm,
                     s.waker_context, CASE WHEN s.state = 'sleeping' THEN k.kind END AS kind
              FROM thread_state s LEFT JOIN ({_sleeps(pid, tid, lo, hi)}) k USING (pid, tid, state, start_ns)
              WHERE s.pid = {int(pid)} AND s.tid = {int(tid)} AND s.end_ns > {int(lo)} AND s.start_ns < {int(hi)}),
        o AS ({_overlaps()})
        SELECT state, kind, waker_pid, waker_tid, any_value(waker_comm) AS waker_comm, waker_context,
               sum(ob - oa)::BIGINT AS ns, (SELECT sum(b - a) FROM iv)::BIGINT AS total_ns
        FROM o GROUP BY ALL ORDER BY ns DESC""".split())


def ended_sql(hop_sql: str, kind: str) -> str:
    """How many of a hop's sleeps of one kind each waker (pid, tid, context) ended, from the hop's own query (its
    CTEs iv, x, o: the sleeps in part in the intervals)."""
    head = hop_sql[:hop_sql.rindex(" SELECT state, kind,")]
    return (f"{head} SELECT waker_pid, waker_tid, waker_context, count(*) AS n, sum(ob - oa)::BIGINT AS ns FROM o "
            f"WHERE state = 'sleeping' AND kind = '{kind}' GROUP BY ALL ORDER BY n DESC")


def _next_intervals(intervals: str, pid: int, tid: int, lo: int, hi: int, waker_tid: int,
                    kind: str | None = None) -> str:
    """The parts of the intervals in which (pid, tid) slept until waker_tid woke it: the next hop's intervals; with
    `kind`, every sleep of that kind however it ended (a timed wait's timeouts are part of the wait for its
    signaller)."""
    x = (f"SELECT start_ns, end_ns FROM ({_sleeps(pid, tid, lo, hi)}) WHERE kind = '{kind}'" if kind else
         f"""SELECT start_ns, end_ns FROM thread_state
              WHERE pid = {int(pid)} AND tid = {int(tid)} AND state = 'sleeping' AND waker_tid = {int(waker_tid)}
                AND waker_context = 'task' AND end_ns > {int(lo)} AND start_ns < {int(hi)}""")
    return " ".join(f"""
        WITH iv AS MATERIALIZED ({intervals}),
        x AS MATERIALIZED ({x})
        SELECT oa AS a, ob AS b FROM ({_overlaps()})""".split())


def first_intervals(pid: int, tid: int, w: TimeWindow, waker_pid: int, waker_tid: int, every: bool = False) -> str:
    """The sleeping thread's sleeps outside CUDA calls in the window that waker ended (the first hop's intervals);
    `every`: all of them, however each ended (a wait mostly timed out, whose few signalled ends would show only the
    moments the waker signalled, when it ran by definition)."""
    ended = "" if every else (f"AND waker_pid = {int(waker_pid)} AND waker_tid = {int(waker_tid)} "
                              "AND waker_context = 'task' ")
    return (f"SELECT greatest(start_ns, {w.start_ns}) AS a, least(end_ns, {w.end_ns}) AS b FROM thread_sleeps "
            f"WHERE pid = {int(pid)} AND tid = {int(tid)} AND inside_ns = 0 {ended}"
            f"AND end_ns > {w.start_ns} AND start_ns < {w.end_ns}")


def summary_sql(hop_sql: str, intervals: str) -> str:
    """What a hop's thread did, as shares of the intervals: 'running' (what its off-CPU rows leave), 'waiting for a
    CPU', 'asleep <kind>' (KIND_LABEL), each at least 5 %, largest first."""
    label = ("CASE kind " + " ".join(f"WHEN '{k}' THEN {sql_str(v)}" for k, v in KIND_LABEL.items())
             + " ELSE 'in the kernel' END")
    return " ".join(f"""
        WITH r AS ({hop_sql}), tot AS (SELECT sum(b - a) AS ns FROM ({intervals})),
        parts AS (SELECT CASE state WHEN 'cpu_wait' THEN 'waiting for a CPU' WHEN 'sleeping' THEN 'asleep ' || {label}
                             ELSE 'off-CPU, split unknown' END AS what, sum(ns) AS ns FROM r GROUP BY 1
                  UNION ALL SELECT 'running', (SELECT ns FROM tot) - coalesce((SELECT sum(ns) FROM r), 0))
        SELECT what, round(100.0 * ns / (SELECT ns FROM tot)) AS pct FROM parts
        WHERE ns >= 0.05 * (SELECT ns FROM tot) ORDER BY ns DESC, what""".split())


def doing_text(con: duckdb.DuckDBPyConnection, h: Hop) -> str:
    """'running 80%, asleep on a timer (a sleep it chose) 15%': the hop's summary_sql rows as text (run once a hop,
    and not at all where hop() could read them off its own rows)."""
    if not h.summary_sql:
        return "not recorded (not traced)"
    if h.doing is None:
        h.doing = _as_text(shared_rows(con, h.summary_sql))
    return h.doing


def _as_text(parts: list[tuple]) -> str:
    return ", ".join(f"{what} {pct:.0f}%" for what, pct in parts) or "not recorded"


_EXACT = 2**53 // 1000  # below this, 100.0 * ns / tot in DuckDB (DECIMAL to DOUBLE) is Python's float division


def _summary_rows(got: list[tuple], total: int) -> list[tuple[str, float]] | None:
    """summary_sql's rows computed from the hop's own rows (the same SQL over the same rows: its CTE r), or None
    where they might differ in a last digit (no time, or ns too large for a double to hold exactly)."""
    if total <= 0 or total >= _EXACT or any(r[6] is None for r in got):
        return None
    parts: dict[str, int] = {}
    for state, kind, *_w, ns, _total in got:
        what = ("waiting for a CPU" if state == "cpu_wait" else  # summary_sql's CASE, as it labels r's rows
                "asleep " + KIND_LABEL.get(kind, "in the kernel") if state == "sleeping" else "off-CPU, split unknown")
        parts[what] = parts.get(what, 0) + int(ns)
    items = [*parts.items(), ("running", total - sum(parts.values()))]
    if any(abs(ns) >= _EXACT for _, ns in items):
        return None
    kept = sorted(((what, ns) for what, ns in items if 100 * ns >= 5 * total), key=lambda p: (-p[1], p[0]))
    return [(what, sql_round(100 * ns / total)) for what, ns in kept]


def hop(con: duckdb.DuckDBPyConnection, intervals: str, pid: int, tid: int, w: TimeWindow) -> Hop:
    """What one thread did during a set of intervals (see _hop_sql)."""
    lo, hi = w.start_ns - 60 * 1_000_000_000, w.end_ns  # a sleep that began up to a minute before the window
    sql = _hop_sql(intervals, pid, tid, lo, hi)
    got = shared_rows(con, sql)
    total = int(got[0][7] or 0) if got else int(rows(con, f"SELECT coalesce(sum(b - a), 0) FROM ({intervals})")[0][0])
    h = Hop(pid=pid, tid=tid, total_ns=total, sql=sql, summary_sql=summary_sql(sql, intervals))
    for state, kind, wpid, wtid, wcomm, wctx, ns, _total in got:
        ns = int(ns or 0)
        if state == "cpu_wait":
            h.cpu_wait_ns += ns
        elif state == "sleeping":
            h.sleeping.append((str(kind or "other"), None if wpid is None else int(wpid),
                               None if wtid is None else int(wtid),
                               wcomm, wctx, ns))
        else:
            h.unknown_ns += ns
    h.running_ns = max(0, total - h.cpu_wait_ns - h.sleeping_ns - h.unknown_ns)
    summary = _summary_rows(got, total)
    h.doing = None if summary is None else _as_text(summary)
    return h


def _by_kind(h: Hop) -> dict[str, int]:
    out: dict[str, int] = {}
    for kind, *_rest, ns in h.sleeping:
        out[kind] = out.get(kind, 0) + ns
    return out


NET_EVENT_SHARE = 0.1  # packets must end at least this share of a poll's sleeps to say what it waits on


def _network_ended(sleeps: list[tuple[str, int | None, int | None, str | None, str | None, int]]) -> bool:
    """Whether what ended these poll/epoll sleeps, leaving out their timeouts (the hardirq timer: a loop that polls
    with a timeout wakes on it whatever it waits for), was mostly packets arriving (softirq) rather than a task (a
    pipe or an eventfd written), and packets ended NET_EVENT_SHARE of the sleeps at least."""
    soft = sum(s[5] for s in sleeps if s[4] == "softirq")
    task = sum(s[5] for s in sleeps if s[4] == "task")
    return soft >= task and soft >= NET_EVENT_SHARE * sum(s[5] for s in sleeps)


# Waits that carry a timeout a program sets again and again (a lock or the GIL asked for every switch interval, a
# queue or a condition polled): the task that ended those that did not time out is what they wait for.
TIMED_KINDS = frozenset({"futex", "poll"})
SIGNALLED_SHARE = 0.2  # ... where tasks ended this share of them (by count) at least


def _signaller(con: duckdb.DuckDBPyConnection, h: Hop, kind: str) -> tuple[int, int] | None:
    """The task that ended most of a hop's sleeps of `kind` that did not time out (an interrupt, its timer, ended the
    rest), where tasks ended SIGNALLED_SHARE of them: CPython's GIL wait times out every 5 ms, asks the holder to drop
    it and waits again, and the holder's release ends that wait. Sets h.timed_out (how many and ns an irq ended)."""
    ended = shared_rows(con, ended_sql(h.sql, kind))
    tasks: dict[tuple[int, int], int] = {}
    for wpid, wtid, wctx, n, _ns in ended:
        if wctx == "task" and wpid is not None and wtid is not None:
            tasks[(int(wpid), int(wtid))] = tasks.get((int(wpid), int(wtid)), 0) + int(n)
    if not tasks or sum(tasks.values()) < SIGNALLED_SHARE * sum(int(r[3]) for r in ended):
        return None
    irq = [r for r in ended if r[2] == "irq"]
    h.timed_out = (sum(int(r[3]) for r in irq), sum(int(r[4] or 0) for r in irq))
    return max(tasks, key=lambda k: tasks[k])


def _top_task(h: Hop, kind: str) -> tuple[int, int] | None:
    """The task that ended most of a hop's sleeps of `kind`, where tasks ended FOLLOW_SHARE of them."""
    tasks: dict[tuple[int, int], int] = {}
    for _k, wpid, wtid, _c, wctx, ns in (s for s in h.sleeping if s[0] == kind):
        if wctx == "task" and wpid is not None and wtid is not None:
            tasks[(wpid, wtid)] = tasks.get((wpid, wtid), 0) + ns
    total = sum(s[5] for s in h.sleeping if s[0] == kind)
    return max(tasks, key=lambda k: tasks[k]) if tasks and sum(tasks.values()) >= FOLLOW_SHARE * total else None


def busy_share_sql(pid: int, tid: int, w: TimeWindow, table: str = SECONDS_TABLE) -> str:
    """A thread's running share of its time over the whole window (not only while another waited on it: a server
    runs whenever its client waits for it, however idle it is otherwise). `table`: thread_seconds' rows as the
    analysis reads them, or the view's name for evidence a user runs."""
    return (f"SELECT sum(run_outside_ns + run_inside_ns) / nullif(sum(wall_ns), 0) FROM {table} "
            f"WHERE pid = {int(pid)} AND tid = {int(tid)} AND start_ns >= {int(w.start_ns)} "
            f"AND start_ns < {int(w.end_ns)}")


def busy_share(con: duckdb.DuckDBPyConnection, pid: int, tid: int, w: TimeWindow) -> float | None:
    """busy_share_sql's answer, None where the thread has no seconds in the window."""
    got = shared_rows(con, busy_share_sql(pid, tid, w))
    return None if not got or got[0][0] is None else float(got[0][0])


def _saturated_upstream(con: duckdb.DuckDBPyConnection, intervals: str, h: Hop, w: TimeWindow,
                        traced: set[tuple[int, int]], seen: set[tuple[int, int]],
                        hops_left: int) -> tuple[str, tuple[int, int]] | None:
    """(the next hop's intervals, the task) where a running hop had slack (SLACK_SHARE asleep in one kind, mostly
    ended by a traced task not already on the path) and the walk from that task, within hops_left hops (a worker's
    queue-feeding thread, then the worker), reaches a thread that ran SATURATED of the time and more than the hop
    did: the pace was set there. None: the hop is the pace."""
    kinds = _by_kind(h)
    kind = max(kinds, key=lambda k: kinds[k]) if kinds else None
    if kind is None or kind in STOP_KINDS or h.share(kinds[kind]) < SLACK_SHARE:
        return None
    first = _top_task(h, kind)
    lo = w.start_ns - 60 * 1_000_000_000
    cur, at, iv, visited = first, h, intervals, set(seen)
    for _ in range(hops_left):
        if cur is None or cur in visited or cur not in traced:
            return None
        iv = _next_intervals(iv, at.pid, at.tid, lo, w.end_ns, cur[1])
        at = hop(con, iv, cur[0], cur[1], w)
        visited.add(cur)
        if at.total_ns <= 0:
            return None
        if at.share(at.running_ns) >= FOLLOW_SHARE:
            mine, theirs = busy_share(con, h.pid, h.tid, w), busy_share(con, cur[0], cur[1], w)
            if theirs is None or theirs < max(SATURATED, (mine or 0.0) + SLACK_SHARE / 2):
                return None
            h.followed_kind = kind
            return _next_intervals(intervals, h.pid, h.tid, lo, w.end_ns, first[1]), first  # type: ignore[index]
        up = _by_kind(at)
        k = max(up, key=lambda x: up[x]) if up else None
        if k is None or k in STOP_KINDS or at.share(up[k]) < FOLLOW_SHARE * 0.6:
            return None
        cur = _top_task(at, k)
    return None


def follow(con: duckdb.DuckDBPyConnection, sleeper: tuple[int, int], waker: tuple[int, int], w: TimeWindow,
           traced: set[tuple[int, int]], every_sleep: bool = False) -> WaitPath:
    """The wait-for path from a thread's sleeps ended by `waker` (see the module's docstring); `every_sleep`: from
    all its sleeps (first_intervals). `traced`: the threads whose scheduler rows exist (a waker outside them is a
    stop: what it did is not recorded)."""
    intervals = first_intervals(sleeper[0], sleeper[1], w, waker[0], waker[1], every_sleep)
    hops: list[Hop] = []
    seen = {sleeper}
    cur = waker
    for _ in range(MAX_HOPS):
        if cur not in traced:
            hops.append(Hop(pid=cur[0], tid=cur[1], total_ns=0))
            return WaitPath(hops=hops, stop="untraced")
        h = hop(con, intervals, cur[0], cur[1], w)
        hops.append(h)
        seen.add(cur)
        if h.total_ns <= 0:
            return WaitPath(hops=hops, stop="mixed")
        if h.share(h.running_ns) >= FOLLOW_SHARE:
            up = _saturated_upstream(con, intervals, h, w, traced, seen | {sleeper}, MAX_HOPS - len(hops))
            if up is None:
                return WaitPath(hops=hops, stop="running")
            intervals, cur = up
            continue
        if h.share(h.cpu_wait_ns) >= 0.3 and h.cpu_wait_ns >= h.running_ns:
            return WaitPath(hops=hops, stop="cpu_wait")
        kinds = _by_kind(h)
        if not kinds or h.share(max(kinds.values())) < FOLLOW_SHARE * 0.6:
            return WaitPath(hops=hops, stop="running" if h.running_ns >= h.sleeping_ns else "mixed")
        kind = max(kinds, key=lambda k: kinds[k])
        of_kind = [s for s in h.sleeping if s[0] == kind]
        if kind == "poll" and _network_ended(of_kind):
            kind = "socket"  # an epoll/select wait that arriving packets end is a wait on the network
        if kind in STOP_KINDS:
            peer = None
            if kind == "socket":  # a packet's softirq runs in the sender's context on loopback: the peer, if one task
                # packets arrive in softirq context; a hardirq (a poll's timeout) names no sender
                soft = [s for s in of_kind if s[4] == "softirq"]
                irq = soft or [s for s in of_kind if s[4] == "irq"]
                if irq and irq[0][5] >= 0.5 * sum(s[5] for s in (irq if soft else of_kind)):
                    peer = (irq[0][1], irq[0][2], irq[0][3])
            return WaitPath(hops=hops, stop=kind, stop_kind=kind, peer=peer)
        # who ended the sleeps of that kind: a task of its own (follow it), the first thread (they take turns), an
        # interrupt (stop)
        by_waker: dict[tuple[int, int] | None, int] = {}
        for _k, wpid, wtid, _c, wctx, ns in of_kind:
            key = (wpid, wtid) if wctx == "task" and wpid is not None and wtid is not None else None
            by_waker[key] = by_waker.get(key, 0) + ns
        tasks = {k: v for k, v in by_waker.items() if k is not None}
        # a wait with a timeout (a queue polled every few seconds, the GIL asked for every 5 ms) is ended by its timer
        # as often as by the task that fills it: that task, where it ended a fifth of the wait, is the one waited on
        top = max(tasks, key=lambda k: tasks[k]) if tasks and sum(tasks.values()) >= 0.2 * sum(by_waker.values()) \
            else None
        every = False
        if top is None and kind in TIMED_KINDS:
            top = _signaller(con, h, kind)  # timed out again and again: its timeouts belong to what ended the rest
            every = top is not None
        if top is None:
            return WaitPath(hops=hops, stop="interrupt", stop_kind=kind)
        if top == sleeper:
            return WaitPath(hops=hops, stop="sleeper", stop_kind=kind)
        if top in seen:
            return WaitPath(hops=hops, stop="mixed", stop_kind=kind)
        intervals = _next_intervals(intervals, cur[0], cur[1], w.start_ns - 60 * 1_000_000_000, w.end_ns, top[1],
                                    kind if every else None)
        h.followed_kind = kind
        cur = top
    return WaitPath(hops=hops, stop="depth")
