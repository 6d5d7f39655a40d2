"""What a timeline shows, read from the store: the SQL both timeline writers (Perfetto, Chrome JSON) share.

Each query takes the window and pids as `explain` does. The tests count the same rows with the same
SQL, so a track, slice, flow or counter in an exported file is a row here.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

import duckdb
import numpy as np

from ingero_mcp.analysis import interval_in, pid_in, rows, ts_in, where
from ingero_mcp.analysis import CausalChain, TimeWindow
from ingero_mcp.sanitize import clean
from ingero_mcp.store.errors import StoreError

# A thread state as the timeline names it (thread_state's state, sleep_state 'D' -> IO).
STATE_NAMES = {"cpu_wait": "waiting for a CPU", "sleeping": "sleeping", "io": "IO (D sleep)",
               "off_cpu": "off-CPU (split unknown)"}


def state_name(state: str) -> str:
    """A thread state's timeline name; a state the analysis never writes is damage, named in one line."""
    try:
        return STATE_NAMES[state]
    except KeyError:
        raise StoreError(f"the trace's thread states hold an unknown state {clean(repr(state), 80)} (known: "
                         f"{', '.join(STATE_NAMES)}): a damaged or hand-edited store") from None
COUNTERS = (  # snapshots column, track name
    ("cpu_percent", "host CPU %"),
    ("gpu_util_percent", "GPU utilisation %"),
    ("mem_used_percent", "host memory used %"),
    ("gpu_mem_used_bytes", "GPU memory used (bytes)"),
)
PROCESS_EVENTS = ("fork", "exec", "exit", "rename", "thread", "oom_kill")
BATCH = 200_000


@dataclass
class Scope:
    """The window and pids an export covers (None: all)."""

    window: TimeWindow | None = None
    pids: list[int] | None = None

    def calls(self) -> str:
        return where(ts_in(self.window), pid_in(self.pids))

    def intervals(self) -> str:
        return where(interval_in(self.window), pid_in(self.pids))

    def states(self) -> str:
        span = "" if self.window is None else (
            f"start_ns <= {int(self.window.end_ns)} AND start_ns + dur_ns >= {int(self.window.start_ns)}")
        return where(span, pid_in(self.pids))

    def moments(self, column: str = "ts_ns") -> str:
        return where(ts_in(self.window, column), pid_in(self.pids))


def threads_sql(scope: Scope) -> str:
    """Every traced thread with a CUDA call, a scheduler interval or an on-CPU stack sample in scope, with its
    process and names."""
    return f"""
        WITH t AS (
            SELECT DISTINCT pid, tid FROM cuda_calls {scope.calls()}
            UNION SELECT DISTINCT pid, tid FROM sched_intervals {scope.intervals()}
            UNION SELECT DISTINCT pid, tid FROM stack_samples {scope.moments()}
        )
        SELECT t.pid, t.tid, (SELECT any_value(p.comm) FROM processes p WHERE p.pid = t.pid),
               (SELECT any_value(th.comm) FROM threads th WHERE th.tid = t.tid AND th.pid = t.pid)
        FROM t ORDER BY t.pid, t.tid"""


def calls_sql(scope: Scope, sort: bool = True, kernel: str = "kernel_handle") -> str:
    """CUDA calls: the slices on each thread's track, in (tid, time) order; sort=False: in the table's own order
    (only for a table whose rows `calls_in_time_order` found in time order per thread). kernel: the launch's
    kernel as kernel_handle (the number) or kernel_key (the stored text: no cast per row)."""
    return f"""SELECT ts_ns, duration_ns, tid, op, bytes, memcpy_kind, {kernel} AS kernel, off_cpu_ns, sleep_ns,
                      cpu_wait_ns, return_code
               FROM cuda_calls {scope.calls()} {"ORDER BY tid, ts_ns" if sort else ""}"""


def calls_in_time_order(con: duckdb.DuckDBPyConnection, scope: Scope) -> bool:
    """Whether the calls in scope, read without ORDER BY (DuckDB keeps insertion order), come in time order per
    thread: all in time order, or each thread's together in time order. Ingest writes them so; sorting 7M wide rows
    with their strings costs DuckDB 1-2 s, reading these two columns ~0.1 s."""
    got = con.sql(f"SELECT tid, ts_ns FROM cuda_calls {scope.calls()}").to_arrow_table()  # fetchnumpy: 4x slower
    tid, ts = got.column("tid").to_numpy(), got.column("ts_ns").to_numpy()
    if len(ts) < 2:
        return True
    later = ts[1:] >= ts[:-1]
    if later.all():
        return True
    same = tid[1:] == tid[:-1]
    changes = np.flatnonzero(~same)
    return bool(later[same].all()) and len(np.unique(tid[np.concatenate([[0], changes + 1])])) == len(changes) + 1


WAKEUPS = "export_wakeups"  # temp table: the wake-ups in scope, numbered (flow ids)


def make_wakeups(con: duckdb.DuckDBPyConnection, scope: Scope) -> int:
    """Number the wake-ups in scope (flow ids 1..n) into a temp table; returns n."""
    con.execute(f"CREATE OR REPLACE TEMP TABLE {WAKEUPS} AS "
                "SELECT row_number() OVER (ORDER BY wakeup_ns, tid) AS flow_id, * FROM (SELECT * FROM "
                f"({wakeups_sql(scope)}) QUALIFY row_number() OVER (PARTITION BY tid, wakeup_ns ORDER BY "
                "waker_tid) = 1)").fetchall()
    return int(rows(con, f"SELECT count(*) FROM {WAKEUPS}")[0][0])


def woken_sql() -> str:
    """Wake-ups whose wakee has no CPU-wait slice starting then (it ran at once): the arrow ends on an instant."""
    return f"""SELECT w.flow_id, w.wakeup_ns, w.tid FROM {WAKEUPS} w
               WHERE NOT EXISTS (SELECT 1 FROM thread_state s WHERE s.tid = w.tid AND s.state = 'cpu_wait'
                                 AND s.start_ns = w.wakeup_ns) ORDER BY w.flow_id"""


def states_sql(scope: Scope, sort: bool = True) -> str:
    """Thread states: thread_state's off-CPU spans (sleeping split into S and IO); a gap between two is the thread
    running (not written: the store holds no row for it). flow_id: the wake-up arrow that ends on this CPU wait
    (after make_wakeups). sort=False: in no given order."""
    return f"""
        SELECT s.*, w.flow_id FROM (
            SELECT tid, CASE WHEN state = 'sleeping' AND sleep_state = 'D' THEN 'io' ELSE state END AS state,
                   start_ns, end_ns - start_ns AS dur_ns, syscall, waker_comm,
                   coalesce(first_holder_comm, last_holder_comm) AS holder_comm, pid
            FROM thread_state
        ) s LEFT JOIN (SELECT tid AS w_tid, wakeup_ns, flow_id FROM {WAKEUPS}) w
          ON s.state = 'cpu_wait' AND w.w_tid = s.tid AND w.wakeup_ns = s.start_ns
        {scope.states()} {"ORDER BY tid, start_ns" if sort else ""}"""


def wakeups_sql(scope: Scope) -> str:
    """Wake-ups of a traced thread by another traced thread: an arrow from waker to wakee."""
    return f"""
        SELECT wakeup_ns, waker_tid, tid, pid, waker_pid FROM sched_intervals
        {where(interval_in(scope.window), pid_in(scope.pids), 'wakeup_ns IS NOT NULL', 'waker_tid IS NOT NULL',
               "coalesce(waker_context, 'task') = 'task'", 'waker_tid <> tid',
               f"waker_tid IN (SELECT tid FROM ({threads_sql(scope)}) AS traced)")}
        ORDER BY wakeup_ns"""


def process_events_sql(scope: Scope) -> str:
    """fork, exec, exit, rename, thread, oom_kill: instants on the process track."""
    return f"""SELECT ts_ns, event, pid, tid, child_pid, comm, filename, exit_code, old_comm
               FROM process_events {scope.moments()} ORDER BY ts_ns"""


def counters_sql(scope: Scope, column: str) -> str:
    """One host counter from snapshots (NULL samples left out)."""
    return f"SELECT ts_ns, {column} FROM snapshots {where(ts_in(scope.window), f'{column} IS NOT NULL')} ORDER BY ts_ns"


def batches(con: duckdb.DuckDBPyConnection, sql: str) -> Iterator[list[tuple]]:
    """A query's rows a batch at a time (a 10M-row result is never held whole)."""
    cur = con.execute(sql)
    while True:
        got = cur.fetchmany(BATCH)
        if not got:
            return
        yield got


@dataclass
class Thread:
    pid: int
    tid: int
    name: str
    process_name: str


@dataclass
class Timeline:
    """The tracks of an export and the chains to mark on it."""

    threads: list[Thread]
    chains: list[CausalChain] = field(default_factory=list)


def label(text: object, cap: int = 120) -> str:
    """A traced string fit for a track or slice name: cleaned, capped."""
    return clean("" if text is None else str(text), cap)


def gather(con: duckdb.DuckDBPyConnection, scope: Scope, chains: list[CausalChain]) -> Timeline:
    """The threads in scope (cleaned names) and the chains."""
    threads = [Thread(pid, tid, label(tcomm or pcomm or f"tid {tid}"), label(pcomm or f"pid {pid}"))
               for pid, tid, pcomm, tcomm in rows(con, threads_sql(scope))]
    return Timeline(threads=threads, chains=chains)


def batches_flat(con: duckdb.DuckDBPyConnection, sql: str) -> Iterator[tuple]:
    """A query's rows one at a time, fetched in batches."""
    for batch in batches(con, sql):
        yield from batch
