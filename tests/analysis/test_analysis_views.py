"""Golden rows for the accounting's SQL views (store/sql/*.sql): a tiny trace, a query, the expected rows.

Modelled on Perfetto's stdlib diff tests: each store below holds a handful of hand-written rows whose
meaning is spelled out beside them, and the test states every row the view must give for them.
"""

from __future__ import annotations

import random
from pathlib import Path

import duckdb
import pytest
from paths import REPO

from ingero_mcp.analysis.accounting import PARTS, check_sums
from ingero_mcp.analysis.models import Account
from ingero_mcp.store.views import lay_views
from ingero_mcp.store import TraceWriter, open_store

S = 1_000_000_000
MS = 1_000_000
US = 1_000
T0 = 1_700_000_000 * S  # on a second boundary: second k of the trace is [T0 + k s, T0 + (k + 1) s)
PID, TID = 10, 11

SCHED_COLUMNS = ("pid", "tid", "off_ns", "on_ns", "off_cpu_ns", "prev_state", "wakeup_ns", "sleep_ns", "cpu_wait_ns",
                 "cpu", "on_cpu", "preemptor_pid", "preemptor_tid", "preemptor_comm", "last_holder_pid",
                 "last_holder_tid", "last_holder_comm", "waker_pid", "waker_tid", "waker_comm", "waker_context",
                 "syscall")
CALL_COLUMNS = ("pid", "tid", "ts_ns", "duration_ns", "api", "op", "bytes", "memcpy_kind", "host_pinned",
                "kernel_handle")


def sched(off: int, on: int | None, state: str, *, wakeup: int | None = None, sleep: int | None = None,
          wait: int | None = None, cpu: int = 0, on_cpu: int | None = None, first: tuple | None = None,
          last: tuple | None = None, waker: tuple | None = None, syscall: str | None = None, tid: int = TID) -> dict:
    """One sched_intervals row; first/last/waker are (pid, tid, comm[, context]); sleep and wait, where not given, as
    schemas/v10.sql computes them (a store refuses a row whose split disagrees)."""
    f, la, w = first or (None,) * 3, last or (None,) * 3, waker or (None,) * 4
    if sleep is None and wait is None and on is not None:
        if state == "preempted":
            sleep, wait = 0, on - off
        elif wakeup is not None:
            sleep, wait = wakeup - off, on - wakeup
    return dict(zip(SCHED_COLUMNS, (PID, tid, off, on, None if on is None else on - off, state, wakeup, sleep, wait,
                                    cpu, on_cpu, *f, *la, *w, syscall), strict=True))


def call(ts: int, dur: int, op: str, *, api: str = "runtime", nbytes: int | None = None, kind: str | None = None,
         pinned: bool | None = None, handle: int | None = None, tid: int = TID) -> dict:
    return dict(zip(CALL_COLUMNS, (PID, tid, ts, dur, api, op, nbytes, kind, pinned, handle), strict=True))


def columns(rows: list[dict], names: tuple[str, ...]) -> dict[str, list]:
    return {n: [r[n] for r in rows] for n in names}


def random_calls(seed: int = 7, tids: tuple[int, ...] = (11, 12, 13), per_tid: int = 300) -> list[dict]:
    """Calls of several threads at random (distinct start times per thread: which of two calls starting together
    heads a span is not defined), nested, overlapping and zero-length among them, shuffled."""
    rng = random.Random(seed)
    calls = []
    for tid in tids:
        ts = T0 + 10 * MS
        for i in range(per_tid):
            ts += rng.choice([1, 2, 1 * US, 50 * US, 2 * MS])
            op = rng.choice(["cudaLaunchKernel", "cuLaunchKernel", "cudaMemcpy", "cudaStreamSynchronize", "cudaMalloc"])
            handle = rng.choice([1, 2, 3, 4]) if "aunch" in op else None
            calls.append(call(ts, rng.choice([0, 1 * US, 30 * US, 3 * MS]) + i % 3, op, handle=handle, tid=tid,
                              nbytes=rng.choice([None, 4, 1 << 21]), pinned=rng.choice([None, True, False])))
    rng.shuffle(calls)
    return calls


def write_store(path: Path, sched_rows: list[dict], call_rows: list[dict], stop: int | None = T0 + 3 * S) -> Path:
    with TraceWriter(path) as w:
        w.replace("sessions", {"source": ["demo:golden"], "started_ns": [T0], "stopped_ns": [stop]})
        w.replace("table_coverage", {"table_name": ["cuda_calls", "sched_intervals"], "complete": [True, True]})
        if sched_rows:
            w.append("sched_intervals", columns(sched_rows, SCHED_COLUMNS))
        if call_rows:
            w.append("cuda_calls", columns(call_rows, CALL_COLUMNS))
    return path


def query(path: Path, sql: str) -> list[tuple]:
    con = open_store(path)
    lay_views(con)
    try:
        return con.execute(sql).fetchall()
    finally:
        con.close()


# ---- thread_state ---------------------------------------------------------------------------------

STATE_SQL = """SELECT state, sleep_state, start_ns - {t0}, end_ns - {t0}, dur_ns, cpu, waker_pid, waker_tid, waker_comm,
                      waker_context, syscall, first_holder_pid, first_holder_comm, last_holder_pid, last_holder_comm
               FROM thread_state ORDER BY start_ns, state DESC""".format(t0=T0)


def test_thread_state_golden(tmp_path: Path) -> None:
    rows = [
        # preempted at +100 ms on CPU 1 by hog[20]; back at +104 ms on CPU 2, which stress[21] left
        sched(T0 + 100 * MS, T0 + 104 * MS, "preempted", sleep=0, wait=4 * MS, cpu=1, on_cpu=2,
              first=(20, 20, "hog"), last=(21, 21, "stress")),
        # asleep in poll() from +200 ms; a DataLoader worker woke it at +210 ms; it waited for a CPU until +213 ms
        sched(T0 + 200 * MS, T0 + 213 * MS, "sleeping", wakeup=T0 + 210 * MS, sleep=10 * MS, wait=3 * MS, cpu=0,
              on_cpu=3, first=(0, 0, "swapper/0"), last=(20, 20, "hog"), waker=(30, 31, "pt_data_worker", "task"),
              syscall="poll"),
        # disk read (D state), woken from the disk's interrupt onto an idle CPU: no wait
        sched(T0 + 400 * MS, T0 + 420 * MS, "uninterruptible", wakeup=T0 + 420 * MS, sleep=20 * MS, wait=0, cpu=1,
              on_cpu=1, waker=(0, 0, "swapper/1", "irq"), syscall="read"),
        # the wakeup was missed (lost event): off-CPU for 5 ms, split unknown
        sched(T0 + 300 * MS, T0 + 305 * MS, "sleeping", cpu=2),
        # still asleep in futex() when the trace stopped at +3 s: closed at the stop
        sched(T0 + 2_900 * MS, None, "sleeping", cpu=0, syscall="futex"),
    ]
    got = query(write_store(tmp_path / "s.duckdb", rows, []), STATE_SQL)
    assert got == [
        ("cpu_wait", None, 100 * MS, 104 * MS, 4 * MS, 2, None, None, None, None, None, 20, "hog", 21, "stress"),
        ("sleeping", "S", 200 * MS, 210 * MS, 10 * MS, 0, 30, 31, "pt_data_worker", "task", "poll",
         None, None, None, None),
        ("cpu_wait", None, 210 * MS, 213 * MS, 3 * MS, 3, 30, 31, "pt_data_worker", "task", None,
         None, None, 20, "hog"),
        ("off_cpu", None, 300 * MS, 305 * MS, 5 * MS, 2, None, None, None, None, None, None, None, None, None),
        ("sleeping", "D", 400 * MS, 420 * MS, 20 * MS, 1, 0, 0, "swapper/1", "irq", "read", None, None, None, None),
        ("sleeping", "S", 2_900 * MS, 3_000 * MS, 100 * MS, 0, None, None, None, None, "futex", None, None, None, None),
    ]


def test_thread_state_leaves_out_an_open_interval_without_a_stop(tmp_path: Path) -> None:
    rows = [sched(T0 + 100 * MS, None, "preempted", sleep=0),  # preempted: no sleep, its CPU wait not ended
            sched(T0 + 50 * MS, T0 + 60 * MS, "preempted", sleep=0, wait=10 * MS)]
    got = query(write_store(tmp_path / "s.duckdb", rows, [], stop=None),
                "SELECT state, start_ns - %d, end_ns - %d FROM thread_state" % (T0, T0))
    assert got == [("cpu_wait", 50 * MS, 60 * MS)]


def v1_store(path: Path) -> Path:
    """A store written by schema v1 only (as the committed H200 traces are): 'blocked' rows, no split columns."""
    v1 = (REPO / "schemas" / "v1.sql").read_text()
    con = duckdb.connect(str(path))
    con.execute(v1)
    con.execute("INSERT INTO schema_version VALUES (1, 0)")
    con.execute("INSERT INTO sessions (session_id, source, started_ns, stopped_ns) VALUES (1, 'collector', ?, ?)",
                [T0, T0 + 3 * S])
    ins = ("INSERT INTO sched_intervals (session_id, pid, tid, off_ns, on_ns, off_cpu_ns, prev_state, preemptor_pid, "
           "preemptor_comm, cpu, wakeup_ns) VALUES (1, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)")
    # blocked with its wakeup seen: slept 10 ms, then waited 5 ms for a CPU
    con.execute(ins, [PID, TID, T0 + 100 * MS, T0 + 115 * MS, 15 * MS, "blocked", None, None, 1, T0 + 110 * MS])
    # blocked, wakeup not seen: 20 ms off-CPU of unknown kind
    con.execute(ins, [PID, TID, T0 + 200 * MS, T0 + 220 * MS, 20 * MS, "blocked", None, None, 1, None])
    # preempted by hog[20]: 4 ms waiting for a CPU
    con.execute(ins, [PID, TID, T0 + 300 * MS, T0 + 304 * MS, 4 * MS, "preempted", 20, "hog", 2, None])
    con.close()
    return path


def test_thread_state_over_a_v1_store(tmp_path: Path) -> None:
    got = query(v1_store(tmp_path / "v1.duckdb"), STATE_SQL)
    assert got == [
        # v1 did not tell S from D: no sleep_state
        ("sleeping", None, 100 * MS, 110 * MS, 10 * MS, 1, None, None, None, None, None, None, None, None, None),
        ("cpu_wait", None, 110 * MS, 115 * MS, 5 * MS, 1, None, None, None, None, None, None, None, None, None),
        ("off_cpu", None, 200 * MS, 220 * MS, 20 * MS, 1, None, None, None, None, None, None, None, None, None),
        ("cpu_wait", None, 300 * MS, 304 * MS, 4 * MS, 2, None, None, None, None, None, 20, "hog", None, None),
    ]


# ---- call_spans -----------------------------------------------------------------------------------

SPANS_SQL = """SELECT tid, start_ns - {t0}, end_ns - {t0}, calls, before_ns, op, call_class
               FROM call_spans ORDER BY tid, start_ns""".format(t0=T0)


def test_call_spans_golden(tmp_path: Path) -> None:
    t = T0 + S
    calls = [
        # a runtime copy from pinned memory and the driver call nested in it: one span of 2 ms
        call(t, 2 * MS, "cudaMemcpyAsync", nbytes=1 << 20, kind="H2D", pinned=True),
        call(t + 500 * US, 1 * MS, "cuMemcpyHtoDAsync_v2", api="driver", nbytes=1 << 20),
        call(t + 10 * MS, 5 * MS, "cudaMemcpy", nbytes=1 << 20, kind="H2D", pinned=False),  # pageable
        call(t + 16 * MS, 1 * MS, "cudaMemcpy", nbytes=4, kind="D2H"),  # a loss.item(): it waits for the stream
        call(t + 20 * MS, 1 * MS, "cudaLaunchKernel", handle=0xA),  # the process's first launch of kernel A
        call(t + 30 * MS, 10 * US, "cudaLaunchKernel", handle=0xA),
        call(t + 40 * MS, 20 * US, "cudaLaunchKernel", handle=0xB),  # first launch of kernel B
        call(t + 50 * MS, 3 * MS, "cudaStreamSynchronize"),
        call(t + 60 * MS, 2 * MS, "cudaMalloc", nbytes=1 << 20),
        call(t + 61 * MS, 2 * MS, "cudaFree"),  # overlaps the malloc's end (another stream of calls): same span
        call(t + 70 * MS, 1 * MS, "cudaGetDevice"),
        # another thread of the same process: kernel A was launched before, by thread 11
        call(t + 100 * MS, 10 * US, "cudaLaunchKernel", handle=0xA, tid=12),
    ]
    got = query(write_store(tmp_path / "c.duckdb", [], calls), SPANS_SQL)
    assert got == [
        (11, S, S + 2 * MS, 2, 0, "cudaMemcpyAsync", "copy_pinned"),
        (11, S + 10 * MS, S + 15 * MS, 1, 2 * MS, "cudaMemcpy", "copy_pageable"),
        (11, S + 16 * MS, S + 17 * MS, 1, 7 * MS, "cudaMemcpy", "sync"),  # under 1 MiB: a sync, not a transfer
        (11, S + 20 * MS, S + 21 * MS, 1, 8 * MS, "cudaLaunchKernel", "launch_first"),
        (11, S + 30 * MS, S + 30 * MS + 10 * US, 1, 9 * MS, "cudaLaunchKernel", "launch"),
        (11, S + 40 * MS, S + 40 * MS + 20 * US, 1, 9 * MS + 10 * US, "cudaLaunchKernel", "launch_first"),
        (11, S + 50 * MS, S + 53 * MS, 1, 9 * MS + 30 * US, "cudaStreamSynchronize", "sync"),
        (11, S + 60 * MS, S + 63 * MS, 2, 12 * MS + 30 * US, "cudaMalloc", "alloc"),
        (11, S + 70 * MS, S + 71 * MS, 1, 15 * MS + 30 * US, "cudaGetDevice", "other"),
        (12, S + 100 * MS, S + 100 * MS + 10 * US, 1, 0, "cudaLaunchKernel", "launch"),
    ]


# ---- thread_seconds -------------------------------------------------------------------------------

SECONDS_SQL = f"""SELECT k, start_ns - {T0}, wall_ns, {', '.join(PARTS)}, sleep_io_ns, in_call_ns, calls, work_calls
                  FROM thread_seconds WHERE tid = {TID} ORDER BY k"""


def seconds_store(path: Path) -> Path:
    """Thread 11 from +0 s to +2.5 s:
    +0.0   a launch (0 ns): the thread is first seen
    +0.0 - 0.3  running outside CUDA calls
    +0.3 - 0.5  cudaStreamSynchronize, asleep inside it +0.32 - 0.47 (150 ms), woken by the GPU's interrupt
    +0.5 - 0.6  preempted (waiting for a CPU outside calls)
    +0.6 - 0.8  asleep in D state (IO), woken by the disk's interrupt
    +0.8 - 1.2  asleep in futex() until another thread woke it (crosses the second boundary)
    +1.2 - 1.9  running outside, but for +1.3 - 1.4 off-CPU with the wakeup missed (split unknown)
    +1.9 - 2.1  a pageable cudaMemcpy, preempted inside it +1.95 - 2.05 (crosses the boundary)
    +2.1 - 2.5  running outside; a launch at +2.5: last seen
    """
    rows = [
        sched(T0 + 320 * MS, T0 + 470 * MS, "sleeping", wakeup=T0 + 470 * MS, sleep=150 * MS, wait=0,
              waker=(0, 0, "swapper/0", "irq"), syscall="ioctl"),
        sched(T0 + 500 * MS, T0 + 600 * MS, "preempted", sleep=0, wait=100 * MS, first=(20, 20, "hog")),
        sched(T0 + 600 * MS, T0 + 800 * MS, "uninterruptible", wakeup=T0 + 800 * MS, sleep=200 * MS, wait=0,
              waker=(0, 0, "swapper/1", "irq"), syscall="read"),
        sched(T0 + 800 * MS, T0 + 1_200 * MS, "sleeping", wakeup=T0 + 1_200 * MS, sleep=400 * MS, wait=0,
              waker=(PID, 12, "pt_autograd_0", "task"), syscall="futex"),
        sched(T0 + 1_300 * MS, T0 + 1_400 * MS, "sleeping"),
        sched(T0 + 1_950 * MS, T0 + 2_050 * MS, "preempted", sleep=0, wait=100 * MS, first=(20, 20, "hog")),
    ]
    calls = [
        call(T0, 0, "cudaLaunchKernel", handle=1),
        call(T0 + 300 * MS, 200 * MS, "cudaStreamSynchronize"),
        call(T0 + 1_900 * MS, 200 * MS, "cudaMemcpy", nbytes=64 << 20, kind="H2D", pinned=False),
        call(T0 + 2_500 * MS, 0, "cudaLaunchKernel", handle=1),
    ]
    return write_store(path, rows, calls)


def test_thread_seconds_golden(tmp_path: Path) -> None:
    got = query(seconds_store(tmp_path / "t.duckdb"), SECONDS_SQL)
    # k, start, wall, run_outside, run_inside, sleep_inside, sleep_outside, cpu_wait_inside, cpu_wait_outside, unknown,
    # sleep_io, in_call, calls, work_calls
    assert got == [
        (0, 0, S, 300 * MS, 50 * MS, 150 * MS, 400 * MS, 0, 100 * MS, 0, 200 * MS, 200 * MS, 2, 1),
        (1, S, S, 600 * MS, 50 * MS, 0, 200 * MS, 50 * MS, 0, 100 * MS, 0, 100 * MS, 1, 1),
        (2, 2 * S, 500 * MS, 400 * MS, 50 * MS, 0, 0, 50 * MS, 0, 0, 0, 100 * MS, 1, 1),
    ]
    for row in got:
        check_sums(Account(wall_ns=row[2], **dict(zip(PARTS, row[3:10], strict=True))))


def test_check_sums_refuses_what_does_not_add_up() -> None:
    check_sums(Account(wall_ns=10, run_outside_ns=4, sleep_outside_ns=6))
    with pytest.raises(AssertionError):
        check_sums(Account(wall_ns=10, run_outside_ns=4, sleep_outside_ns=5))
    with pytest.raises(AssertionError):
        check_sums(Account(wall_ns=10, run_outside_ns=12, sleep_outside_ns=-2))
