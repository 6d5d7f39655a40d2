"""The analysis's general mechanisms on small stores written through the real TraceWriter: iterations found from a
job's own recurring call, the wait-for graph stopping where a wait began, waits for an idle CPU read as the cgroup's
quota, and damaged rows mended and reported instead of a traceback."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from analysis_fixtures import check_evidence_sql

from ingero_mcp.analysis.accounting import accounting
from ingero_mcp.analysis.info import trace_info
from ingero_mcp.analysis.report import build_report
from ingero_mcp.store.views import lay_views
from ingero_mcp.store import TraceWriter, open_store

T0 = 1_700_000_000_000_000_000
S = 1_000_000_000
MS = 1_000_000
US = 1_000
PID, READER = 500, 501


def _cols(*names: str) -> dict[str, list]:
    return {n: [] for n in names}


def _loop(start: int, end: int, step_ns: int, cols: dict[str, list], pid: int = PID, launches: int = 20) -> list[int]:
    """A training loop's calls: `launches` kernels of 3 handles, then a 4-byte D2H copy and a sync, every step_ns."""
    steps = []
    t = start
    while t < end:
        for i in range(launches):
            _call(cols, t + i * 20 * US, None, "cuLaunchKernel", pid, handle=1000 + i % 3)
        _call(cols, t + launches * 20 * US, 30 * US, "cuMemcpyDtoHAsync_v2", pid, nbytes=4, kind="D2H")
        _call(cols, t + launches * 20 * US + 40 * US, 200 * US, "cuStreamSynchronize", pid)
        steps.append(t)
        t += step_ns
    return steps


def _call(cols: dict[str, list], ts: int, dur: int | None, op: str, pid: int, *, handle: int | None = None,
          nbytes: int | None = None, kind: str | None = None) -> None:
    for k, v in (("ts_ns", ts), ("duration_ns", dur), ("pid", pid), ("tid", pid), ("api", "driver"), ("op", op),
                 ("kernel_handle", handle), ("bytes", nbytes), ("memcpy_kind", kind)):
        cols[k].append(v)


CALL_COLS = ("ts_ns", "duration_ns", "pid", "tid", "api", "op", "kernel_handle", "bytes", "memcpy_kind")
IV_COLS = ("pid", "tid", "off_ns", "on_ns", "off_cpu_ns", "prev_state", "wakeup_ns", "sleep_ns", "cpu_wait_ns", "cpu",
           "on_cpu", "waker_pid", "waker_tid", "waker_comm", "waker_context", "syscall", "kstack_id")


def _iv(cols: dict[str, list], tid: int, off: int, on: int, state: str, *, wake: int | None = None,
        waker: tuple[int, str, str] | None = None, syscall: str | None = None, kstack: int | None = None,
        pid: int = PID, cpu: int = 0) -> None:
    sleep = 0 if state == "preempted" else (wake - off if wake is not None else None)
    wait = on - off if state == "preempted" else (on - wake if wake is not None else None)
    for k, v in (("pid", pid), ("tid", tid), ("off_ns", off), ("on_ns", on), ("off_cpu_ns", on - off),
                 ("prev_state", state), ("wakeup_ns", wake), ("sleep_ns", sleep), ("cpu_wait_ns", wait), ("cpu", cpu),
                 ("on_cpu", cpu), ("waker_pid", waker[0] if waker else None),
                 ("waker_tid", waker[0] if waker else None),
                 ("waker_comm", waker[1] if waker else None), ("waker_context", waker[2] if waker else None),
                 ("syscall", syscall), ("kstack_id", kstack)):
        cols[k].append(v)


def _session(w: TraceWriter, end_s: int = 20) -> None:
    w.replace("sessions", {"source": ["test"], "cpu_count": [4], "started_ns": [T0], "stopped_ns": [T0 + end_s * S]})


def _slowed_loop(slow_step_ns: int) -> tuple[dict[str, list], dict[str, list], list[int]]:
    """The calls of a loop at 100 steps/s slowed to one step per slow_step_ns from +8 s to +16 s, empty interval
    columns, and the slow steps' starts (each store below adds what slowed them)."""
    calls = _cols(*CALL_COLS)
    _loop(T0 + 100 * MS, T0 + 8 * S, 10 * MS, calls)
    steps = _loop(T0 + 8 * S, T0 + 16 * S, slow_step_ns, calls)
    _loop(T0 + 16 * S, T0 + 20 * S - 100 * MS, 10 * MS, calls)
    return calls, _cols(*IV_COLS), steps


def pipe_store(path: Path) -> Path:
    """20 s of a loop at 100 steps/s whose main thread, from +8 s to +16 s, blocks writing its log into a pipe: a
    reader (logsink, pid 501) takes the data only after sleeping on its own timer, 70 ms a step (~12 steps/s)."""
    calls, ivs, steps = _slowed_loop(80 * MS)
    for t in steps:  # the writer sleeps 70 ms in pipe_write; the reader slept on its timer, then read (waking it)
        _iv(ivs, PID, t + 2 * MS, t + 72 * MS, "sleeping", wake=t + 71 * MS, waker=(READER, "logsink", "task"),
            syscall="write", kstack=7)
        _iv(ivs, READER, t, t + 71 * MS - 50 * US, "sleeping", wake=t + 71 * MS - 60 * US,
            waker=(0, "swapper/1", "irq"), syscall="clock_nanosleep", kstack=8, pid=READER, cpu=1)
    with TraceWriter(path) as w:
        _session(w)
        w.replace("processes", {"pid": [PID, READER], "ppid": [1, PID], "comm": ["python3", "logsink"],
                                "traced": [True, True]})
        w.append("cuda_calls", calls)
        w.append("sched_intervals", ivs)
        w.append("stacks", {"stack_id": [7, 8], "kind": ["kernel", "kernel"], "frames": [
            ["__schedule", "schedule", "anon_pipe_write", "vfs_write", "ksys_write"],
            ["__schedule", "schedule", "do_nanosleep", "hrtimer_nanosleep", "__x64_sys_clock_nanosleep"]]})
    return path


def test_iterations_come_from_the_call_that_recurs_once_a_step(tmp_path: Path) -> None:
    """The loop makes 20 launches and one copy and one sync a step: the marker is a sync or the copy (not a launch),
    and the slow phase's rate is in iterations per second, 100 -> ~12."""
    con = open_store(pipe_store(tmp_path / "pipe.duckdb"))
    acc = accounting(con)
    assert [m.op for m in acc.progress] in (["cuStreamSynchronize"], ["cuMemcpyDtoHAsync_v2"]), acc.progress
    slow = [p for p in acc.phases if p.kind == "slow"]
    base = [p for p in acc.phases if p.kind == "baseline"]
    assert slow and base and all(p.unit == "iterations/s" for p in acc.phases)
    assert 90 <= base[0].work_rate <= 105 and 10 <= slow[0].work_rate <= 15, acc.phases
    assert abs(slow[0].window.start_ns - (T0 + 8 * S)) <= S and abs(slow[0].window.end_ns - (T0 + 16 * S)) <= S


def test_a_writer_blocked_on_a_pipe_is_blamed_on_its_timer_sleeping_reader(tmp_path: Path) -> None:
    """The wait-for graph stops at the reader, which slept on its own timer while the writer waited: slow-consumer,
    the reader named, its doing recomputed by the evidence SQL; the walk goes no further."""
    db = pipe_store(tmp_path / "pipe.duckdb")
    report = build_report(open_store(db))
    top = next(c for c in report.chains if c.severity in ("HIGH", "MEDIUM"))
    assert top.root_cause == "slow-consumer", top.summary
    assert top.culprits[0].pid == READER and "timer" in top.summary and "fell" in top.summary
    assert "iterations/s fell" in top.summary
    fresh = open_store(db)
    lay_views(fresh)
    assert check_evidence_sql(fresh, [top]) >= 3


def throttled_store(path: Path, *, samples: bool, cpus: int = 1) -> Path:
    """A loop slowed from +8 s to +16 s by CPU waits during which its CPU was idle (the idle task held it); with
    `samples`, its cgroup's cpu.stat says it was throttled 7 s under a 10 % quota (`cpus`: on that many CPUs' run
    queues, which cpu.stat sums: 14 s on two)."""
    calls, ivs, steps = _slowed_loop(90 * MS)
    for t in steps:
        _iv(ivs, PID, t + 2 * MS, t + 82 * MS, "preempted", syscall=None)
    agg = _cols("bucket_start_ns", "bucket_ns", "pid", "tid", "cpu", "comm", "source", "op", "count", "sum_duration_ns")
    for k in range(20):
        idle = 900 * MS if 8 <= k < 16 else 100 * MS
        for pid, comm, on in ((0, "swapper/0", idle), (PID, "python3", S - idle)):
            for col, v in (("bucket_start_ns", T0 + k * S), ("bucket_ns", S), ("pid", pid), ("tid", pid), ("cpu", 0),
                           ("comm", comm), ("source", "sched"), ("op", "sched_switch"), ("count", 10),
                           ("sum_duration_ns", on)):
                agg[col].append(v)
    with TraceWriter(path) as w:
        _session(w)
        w.replace("processes", {"pid": [PID], "ppid": [1], "comm": ["python3"], "traced": [True]})
        w.append("cuda_calls", calls)
        w.append("sched_intervals", ivs)
        w.append("host_aggregates", agg)
        if samples:
            throttled = [cpus * v for v in [0] * 9 + [int(0.875 * S // 1000) * (k - 8) for k in range(9, 17)]
                         + [7_000_000] * 4]
            w.append("cgroup_samples", {"ts_ns": [T0 + k * S for k in range(21)], "pid": [PID] * 21,
                                        "cgroup": ["/job"] * 21, "own": [True] * 21,
                                        "quota_us": [None] * 8 + [10_000] * 8 + [None] * 5, "period_us": [100_000] * 21,
                                        "usage_usec": [k * 1000 for k in range(21)],
                                        "nr_periods": [k * 10 for k in range(21)],
                                        "nr_throttled": [0] * 9 + [9 * (k - 8) for k in range(9, 17)] + [72] * 4,
                                        "throttled_usec": throttled})
    return path


def test_waiting_for_an_idle_cpu_is_the_quota_where_the_cgroup_says_so(tmp_path: Path) -> None:
    with_samples = build_report(open_store(throttled_store(tmp_path / "q.duckdb", samples=True)))
    top = next(c for c in with_samples.chains if c.severity in ("HIGH", "MEDIUM"))
    assert top.root_cause == "cpu-throttled" and "/job" in top.summary and "10% of one CPU" in top.summary, top.summary
    fresh = open_store(tmp_path / "q.duckdb")
    lay_views(fresh)
    assert check_evidence_sql(fresh, [top]) >= 2
    # without cgroup samples: not contention, and the report says what it cannot tell
    without = build_report(open_store(throttled_store(tmp_path / "n.duckdb", samples=False)))
    top = next(c for c in without.chains if c.severity in ("HIGH", "MEDIUM", "LOW") and c.window)
    assert top.root_cause == "runnable-while-idle" and "no cgroup throttling was recorded" in top.summary
    assert all(c.root_cause != "cpu-contention" for c in without.chains)


def test_a_quota_throttled_on_two_cpus_is_not_said_to_hold_off_more_wall_time_than_its_periods(tmp_path: Path) -> None:
    """cpu.stat sums the throttled time of each CPU's run queue: 14 s on two CPUs in a window of 72 throttled periods
    of 100 ms. The cgroup held the job off for at most 7.2 s of wall time, and that is what its culprit holds."""
    path = throttled_store(tmp_path / "q2.duckdb", samples=True, cpus=2)
    top = next(c for c in build_report(open_store(path)).chains if c.severity in ("HIGH", "MEDIUM"))
    assert top.root_cause == "cpu-throttled", top.summary
    assert "at most 7.2 s of wall time" in top.summary and "summed over the CPUs" in top.summary, top.summary
    cgroup = next(c for c in top.culprits if c.relation == "cgroup quota")
    assert cgroup.ns <= 7.2e9 <= top.window.duration_ns, (cgroup.ns, top.window)
    fresh = open_store(path)
    lay_views(fresh)
    assert check_evidence_sql(fresh, [top]) >= 3


def damaged_store(path: Path) -> Path:
    """A loop whose scheduler rows overlap (two intervals of one thread at once) and run backwards (a wakeup after the
    switch-in): the accounting cannot add them up as they are."""
    calls = _cols(*CALL_COLS)
    ivs = _cols(*IV_COLS)
    steps = _loop(T0 + 100 * MS, T0 + 10 * S, 10 * MS, calls)
    for t in steps:
        _iv(ivs, PID, t + 1 * MS, t + 9 * MS, "sleeping", wake=t + 5 * MS, waker=(PID + 1, "helper", "task"))
        _iv(ivs, PID, t + 2 * MS, t + 10 * MS, "preempted")  # overlaps the one before: 16 ms off-CPU in 10
        _iv(ivs, PID, t + 210 * US, t + 250 * US, "sleeping", wake=t + 900 * US, waker=(PID + 1, "helper", "task"))
    with TraceWriter(path) as w:
        _session(w, 10)
        w.replace("processes", {"pid": [PID], "ppid": [1], "comm": ["python3"], "traced": [True]})
        w.append("cuda_calls", calls)
        w.append("sched_intervals", ivs)
    return path


def test_damaged_rows_are_mended_and_reported_not_a_traceback(tmp_path: Path) -> None:
    db = damaged_store(tmp_path / "bad.duckdb")
    con = open_store(db)
    info = trace_info(con)
    kinds = {q.what: q.count for q in info.data_quality}
    assert kinds.get("overlapping intervals of one thread", 0) >= 900, kinds
    assert kinds.get("intervals with a negative sleep or CPU wait", 0) >= 900, kinds
    for q in info.data_quality:
        assert con.execute(q.sql).fetchall() == [(q.count,)]
    report = build_report(con)
    assert any(n.startswith("data quality: ") and "mended" in n for n in report.notes), report.notes
    assert any(n.startswith("data quality: ") and "overlapping intervals of one thread" in n for n in report.notes)
    for t in report.accounting.threads:
        parts = [t.total.run_outside_ns, t.total.run_inside_ns, t.total.sleep_inside_ns, t.total.sleep_outside_ns,
                 t.total.cpu_wait_inside_ns, t.total.cpu_wait_outside_ns, t.total.off_cpu_unknown_ns]
        assert sum(parts) == t.total.wall_ns and min(parts) >= 0
    out = subprocess.run([sys.executable, "-m", "ingero_mcp.cli", "explain", "--db", str(db)], capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0 and "Traceback" not in out.stderr and "data quality" in out.stdout, out.stderr[-2000:]


def spawn_store(path: Path, *, fresh_child_each_step: bool) -> Path:
    """20 s of a loop at 100 steps/s whose main thread, from +8 s to +16 s, waits ~60 ms a step in wait4()/read() for
    a child to do a job: a new short-lived child `hook` each step (pids 1000...), or one long-lived child `helper`
    (pid 600, alive all along) that the thread asks each time."""
    calls, ivs, steps = _slowed_loop(70 * MS)
    procs = {"pid": [PID], "ppid": [1], "comm": ["python3"], "traced": [True], "first_seen_ns": [T0],
             "exit_ns": [None]}
    if not fresh_child_each_step:
        for k, v in (("pid", 600), ("ppid", PID), ("comm", "helper"), ("traced", True), ("first_seen_ns", T0),
                     ("exit_ns", None)):
            procs[k].append(v)
    for k, t in enumerate(steps):
        child, comm = (1000 + k, "hook") if fresh_child_each_step else (600, "helper")
        if fresh_child_each_step:
            for key, v in (("pid", child), ("ppid", PID), ("comm", comm), ("traced", True),
                           ("first_seen_ns", t + 2 * MS), ("exit_ns", t + 62 * MS)):
                procs[key].append(v)
        _iv(ivs, PID, t + 2 * MS, t + 63 * MS, "sleeping", wake=t + 62 * MS, waker=(child, comm, "task"),
            syscall="wait4" if fresh_child_each_step else "read", kstack=None)
    with TraceWriter(path) as w:
        _session(w)
        w.replace("processes", procs)
        w.append("cuda_calls", calls)
        w.append("sched_intervals", ivs)
    return path


def test_a_child_started_every_step_is_spawning_and_a_long_lived_one_is_not(tmp_path: Path) -> None:
    """The same wait on a child: started afresh each step it is spawning-processes (the children, their rate and
    median life from the process rows, recomputed by the evidence SQL); one child alive all along is not."""
    db = spawn_store(tmp_path / "spawn.duckdb", fresh_child_each_step=True)
    report = build_report(open_store(db))
    top = next(c for c in report.chains if c.severity in ("HIGH", "MEDIUM"))
    assert top.root_cause == "spawning-processes", top.summary
    assert "child processes in that window (hook[1000-11" in top.summary and "median 60 ms" in top.summary
    assert top.culprits[0].comm == "hook" and top.culprits[0].pid >= 1000
    fresh = open_store(db)
    lay_views(fresh)
    assert check_evidence_sql(fresh, [top]) >= 3
    kept = build_report(open_store(spawn_store(tmp_path / "kept.duckdb", fresh_child_each_step=False)))
    top = next(c for c in kept.chains if c.severity in ("HIGH", "MEDIUM"))
    assert top.root_cause != "spawning-processes" and top.culprits[0].pid == 600, top.summary


def two_hop_store(path: Path) -> Path:
    """pipe_store's slow reader, one hop further: from +8 s to +16 s the main thread waits on a futex (a logging lock)
    that thread 502 (`telemetry`) releases only once its own blocked write() into the pipe went through, when the
    reader (logsink, pid 501) took the data after sleeping on its timer."""
    calls, ivs, steps = _slowed_loop(80 * MS)
    for t in steps:
        _iv(ivs, PID, t + 2 * MS, t + 72 * MS, "sleeping", wake=t + 71 * MS, waker=(502, "telemetry", "task"),
            syscall="futex", kstack=9)
        _iv(ivs, 502, t + 1 * MS, t + 71 * MS - 20 * US, "sleeping", wake=t + 71 * MS - 40 * US,
            waker=(READER, "logsink", "task"), syscall="write", kstack=7, cpu=2)
        _iv(ivs, READER, t, t + 71 * MS - 50 * US, "sleeping", wake=t + 71 * MS - 60 * US,
            waker=(0, "swapper/1", "irq"), syscall="clock_nanosleep", kstack=8, pid=READER, cpu=1)
    ivs["waker_pid"] = [PID if tid == 502 else p for p, tid in zip(ivs["waker_pid"], ivs["waker_tid"])]  # a thread
    with TraceWriter(path) as w:
        _session(w)
        w.replace("processes", {"pid": [PID, READER], "ppid": [1, PID], "comm": ["python3", "logsink"],
                                "traced": [True, True]})
        w.replace("threads", {"pid": [PID, PID, READER], "tid": [PID, 502, READER],
                              "comm": ["python3", "telemetry", "logsink"]})
        w.append("cuda_calls", calls)
        w.append("sched_intervals", ivs)
        w.append("stacks", {"stack_id": [7, 8, 9], "kind": ["kernel"] * 3, "frames": [
            ["__schedule", "schedule", "anon_pipe_write", "vfs_write", "ksys_write"],
            ["__schedule", "schedule", "do_nanosleep", "hrtimer_nanosleep", "__x64_sys_clock_nanosleep"],
            ["__schedule", "schedule", "futex_wait_queue", "__futex_wait", "futex_wait", "do_futex"]]})
    return path


def test_a_lock_whose_holder_is_blocked_on_a_slow_pipe_blames_the_reader(tmp_path: Path) -> None:
    """What decides the cause at the end of a wait-for path is what its last waiting thread waited in (the pipe), not
    what the first one did (a futex): slow-consumer and the reader, not 'the reader held the lock'."""
    report = build_report(open_store(two_hop_store(tmp_path / "hop2.duckdb")))
    top = next(c for c in report.chains if c.severity in ("HIGH", "MEDIUM"))
    assert top.root_cause == "slow-consumer", top.summary
    assert top.culprits[0].pid == READER and "itself blocked on a pipe until logsink[501]" in top.summary
    assert "held the lock" not in top.summary


PEER = 700


def polled_store(path: Path, *, packets: bool) -> Path:
    """From +8 s to +16 s the main thread waits (a futex) on its thread 503, which polls sockets with a 10 ms timeout
    (epoll_wait): most of its polls end on the timeout (a hardirq on an idle CPU); the rest end when data arrives,
    from a peer process's packets (softirq in the peer's context on loopback) or, as the control, from a thread of
    its own process writing an eventfd (a task)."""
    calls, ivs, steps = _slowed_loop(80 * MS)
    for t in steps:
        _iv(ivs, PID, t + 2 * MS, t + 72 * MS, "sleeping", wake=t + 71 * MS, waker=(503, "pt_gloo_loop", "task"),
            syscall="futex", kstack=9)
        for k in range(6):  # six polls that time out, then one that data ends
            a = t + 1 * MS + k * 10 * MS
            _iv(ivs, 503, a, a + 10 * MS - 20 * US, "sleeping", wake=a + 10 * MS - 40 * US,
                waker=(0, "swapper/2", "irq"), syscall="epoll_wait", kstack=10, cpu=2)
        a = t + 61 * MS
        ender = (PEER, "peer_rank1", "softirq") if packets else (504, "pt_notifier", "task")
        _iv(ivs, 503, a, a + 10 * MS - 20 * US, "sleeping", wake=a + 10 * MS - 40 * US, waker=ender,
            syscall="epoll_wait", kstack=10, cpu=2)
    ivs["waker_pid"] = [PID if tid in (503, 504) else p for p, tid in zip(ivs["waker_pid"], ivs["waker_tid"])]
    with TraceWriter(path) as w:
        _session(w)
        w.replace("processes", {"pid": [PID, PEER], "ppid": [1, 1], "comm": ["python3", "peer_rank1"],
                                "traced": [True, False]})
        w.replace("threads", {"pid": [PID, PID, PID], "tid": [PID, 503, 504],
                              "comm": ["python3", "pt_gloo_loop", "pt_notifier"]})
        w.append("cuda_calls", calls)
        w.append("sched_intervals", ivs)
        w.append("stacks", {"stack_id": [9, 10], "kind": ["kernel"] * 2, "frames": [
            ["__schedule", "schedule", "futex_wait_queue", "__futex_wait", "futex_wait", "do_futex"],
            ["__schedule", "schedule", "schedule_hrtimeout_range", "ep_poll", "do_epoll_wait"]]})
    return path


def test_a_poll_that_packets_end_is_a_network_wait_and_its_timeouts_do_not_count(tmp_path: Path) -> None:
    """The thread waited on polls six of seven times ended by their timeout: what ended the rest says what it waited
    for. Packets from a peer: network-wait, the peer named. An eventfd written by its own thread: not the network."""
    top = next(c for c in build_report(open_store(polled_store(tmp_path / "net.duckdb", packets=True))).chains
               if c.severity in ("HIGH", "MEDIUM"))
    assert top.root_cause == "network-wait", top.summary
    assert top.culprits[0].pid == PEER and "landed on peer_rank1" in top.summary
    local = next(c for c in build_report(open_store(polled_store(tmp_path / "local.duckdb", packets=False))).chains
                 if c.severity in ("HIGH", "MEDIUM"))
    assert local.root_cause != "network-wait" and PEER not in {c.pid for c in local.culprits}, local.summary


def convoy_store(path: Path, *, members_queue: bool) -> Path:
    """From +8 s to +16 s the main thread sleeps on a futex every 80 ms step until one of four threads `metric_w`
    (601-604, in turn) lets it go, having run through that step. With members_queue, the other three slept that step
    on the futex too, woken by the one that ran (a convoy on one lock); without, they ran (producers of their own)."""
    calls, ivs, steps = _slowed_loop(80 * MS)
    members = [601, 602, 603, 604]
    for m in members:  # traced: a moment off the CPU before the window
        _iv(ivs, m, T0 + 1 * S, T0 + 1 * S + 50 * US, "preempted", cpu=1 + m % 3)
    for k, t in enumerate(steps):
        holder = members[k % 4]
        _iv(ivs, PID, t + 2 * MS, t + 72 * MS, "sleeping", wake=t + 71 * MS, waker=(holder, "metric_w", "task"),
            syscall="futex", kstack=9)
        if members_queue:
            for other in members:
                if other != holder:
                    _iv(ivs, other, t, t + 78 * MS, "sleeping", wake=t + 77 * MS, waker=(holder, "metric_w", "task"),
                        syscall="futex", kstack=9, cpu=1 + other % 3)
    ivs["waker_pid"] = [PID if tid in members else p for p, tid in zip(ivs["waker_pid"], ivs["waker_tid"])]
    with TraceWriter(path) as w:
        _session(w)
        w.replace("processes", {"pid": [PID], "ppid": [1], "comm": ["python3"], "traced": [True]})
        w.replace("threads", {"pid": [PID] * 5, "tid": [PID] + members, "comm": ["python3"] + ["metric_w"] * 4})
        w.append("cuda_calls", calls)
        w.append("sched_intervals", ivs)
        w.append("stacks", {"stack_id": [9], "kind": ["kernel"], "frames": [
            ["__schedule", "schedule", "futex_wait_queue", "__futex_wait", "futex_wait", "do_futex"]]})
    return path


def test_a_pool_that_takes_turns_at_a_lock_is_a_lock_not_work_waited_for(tmp_path: Path) -> None:
    """The main thread waits on a futex that four threads release in turn after running. Where they also sleep on
    futexes each other releases (a convoy on one lock), the cause is the lock; where they only run, the thread waited
    on their work."""
    top = next(c for c in build_report(open_store(convoy_store(tmp_path / "convoy.duckdb", members_queue=True))).chains
               if c.severity in ("HIGH", "MEDIUM"))
    assert top.root_cause == "gil-or-lock", top.summary
    assert "they hold one lock in turn" in top.summary and {c.tids[0] for c in top.culprits if c.tids} >= {601, 602}
    work = next(c for c in build_report(open_store(convoy_store(tmp_path / "work.duckdb", members_queue=False))).chains
                if c.severity in ("HIGH", "MEDIUM"))
    assert work.root_cause == "waiting-on-thread" and "lock in turn" not in work.summary, work.summary


def gil_pool_store(path: Path) -> Path:
    """From +8 s to +16 s the main thread asks for the GIL every 5 ms (futex waits that end on their timeout, a
    hardirq) while three threads `py_task` (611-613) run pure Python in turn, each ~1/3 of the time; every fourth
    wait ends when the running one drops the GIL (a task wake-up)."""
    calls, ivs, steps = _slowed_loop(80 * MS)
    pool = [611, 612, 613]
    for k, t in enumerate(steps):
        for j in range(14):  # 14 waits of 5 ms: 70 ms of the 80 ms step
            a = t + 2 * MS + j * 5 * MS
            by = (pool[(k + j) % 3], "py_task", "task") if j % 4 == 3 else (0, "swapper/6", "irq")
            _iv(ivs, PID, a, a + 5 * MS - 10 * US, "sleeping", wake=a + 5 * MS - 20 * US, waker=by, syscall="futex",
                kstack=9)
        for i, m in enumerate(pool):  # each py_task waits for the GIL two thirds of the step, then runs
            a = t + ((k + i) % 3) * 26 * MS
            _iv(ivs, m, a, a + 52 * MS, "sleeping", wake=a + 52 * MS - 20 * US, waker=(pool[(i + 1) % 3], "py_task",
                                                                                       "task"),
                syscall="futex", kstack=9, cpu=6 + i)
    ivs["waker_pid"] = [PID if tid in pool else p for p, tid in zip(ivs["waker_pid"], ivs["waker_tid"])]
    with TraceWriter(path) as w:
        _session(w)
        w.replace("processes", {"pid": [PID], "ppid": [1], "comm": ["python3"], "traced": [True]})
        w.replace("threads", {"pid": [PID] * 4, "tid": [PID] + pool, "comm": ["python3"] + ["py_task"] * 3})
        w.append("cuda_calls", calls)
        w.append("sched_intervals", ivs)
        w.append("stacks", {"stack_id": [9], "kind": ["kernel"], "frames": [
            ["__schedule", "schedule", "futex_wait_queue", "__futex_wait", "futex_wait", "do_futex"]]})
    return path


def test_timed_out_gil_waits_behind_a_pool_name_the_pool(tmp_path: Path) -> None:
    """GIL waits that end on their timeout while no one thread ran most of the time, but three threads of one name
    did together: the pool holds the GIL in turn (all three named), not an interrupt."""
    top = next(c for c in build_report(open_store(gil_pool_store(tmp_path / "gil.duckdb"))).chains
               if c.severity in ("HIGH", "MEDIUM"))
    assert top.root_cause == "gil-or-lock", top.summary
    assert "3 threads named py_task (611-613)" in top.summary and "in turn" in top.summary
    assert set(top.culprits[0].tids) == {611, 612, 613}
