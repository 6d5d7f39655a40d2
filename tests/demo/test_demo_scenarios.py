"""The demo scenarios: each store is internally consistent, carries its ground truth, and yields its chain."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import duckdb
import pytest

from ingero_mcp.demo import EXPECTED, SCENARIOS, generate
from ingero_mcp.store import open_store


@pytest.fixture(scope="module")
def stores(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Every scenario written once, at scale 1, seed 0."""
    out = tmp_path_factory.mktemp("demo")
    paths = {}
    for name in SCENARIOS:
        paths[name] = out / f"{name}.duckdb"
        generate(name, paths[name])
    return paths


@pytest.fixture(params=SCENARIOS)
def scenario(request: pytest.FixtureRequest) -> str:
    """Each scenario name in turn."""
    return str(request.param)


@pytest.fixture
def con(scenario: str, stores: dict[str, Path]) -> Iterator[duckdb.DuckDBPyConnection]:
    """A read-only connection to one scenario's store."""
    c = open_store(stores[scenario])
    yield c
    c.close()


def one(con: duckdb.DuckDBPyConnection, sql: str, params: list[object] | None = None) -> tuple:
    """The first row of a query (whole result fetched: DuckDB 2.0 needs it)."""
    return con.execute(sql, params or []).fetchall()[0]


def test_session_and_coverage(con: duckdb.DuckDBPyConnection, scenario: str) -> None:
    source, started, stopped, cpus = one(con, "SELECT source, started_ns, stopped_ns, cpu_count FROM sessions")
    assert source == f"demo:{scenario}"
    assert stopped > started and cpus >= 1
    cov = dict(con.execute("SELECT table_name, complete FROM table_coverage").fetchall())
    assert all(cov.values())
    for table in ("cuda_calls", "sched_intervals", "host_aggregates", "process_events", "snapshots"):
        assert table in cov
    for table in ("sessions", "table_coverage", "processes", "cuda_calls", "sched_intervals", "host_aggregates",
                  "snapshots", "collector_stats"):
        assert one(con, f"SELECT count(*) FROM {table}")[0] > 0, f"{table} is empty"


def test_call_attribution_is_consistent(con: duckdb.DuckDBPyConnection) -> None:
    bad = one(con, """
        SELECT count(*) FILTER (WHERE off_cpu_ns <> cpu_wait_ns + sleep_ns),
               count(*) FILTER (WHERE off_cpu_ns > duration_ns OR cpu_wait_ns < 0 OR sleep_ns < 0),
               count(*) FILTER (WHERE page_alloc_bytes <> page_allocs * 4096),
               count(*) FILTER (WHERE off_cpu_ns > 0 AND context_switches = 0),
               count(*) FILTER (WHERE ts_ns < s.started_ns OR ts_ns + duration_ns > s.stopped_ns)
        FROM cuda_calls, sessions s""")
    assert bad == (0, 0, 0, 0, 0)
    # Calls of one thread never overlap.
    overlaps = one(con, """
        SELECT count(*) FROM (
          SELECT ts_ns, lag(ts_ns + duration_ns) OVER (PARTITION BY tid ORDER BY ts_ns) AS prev_end FROM cuda_calls)
        WHERE ts_ns < prev_end""")[0]
    assert overlaps == 0


def test_sched_intervals_make_up_the_attribution(con: duckdb.DuckDBPyConnection) -> None:
    bad = one(con, """
        SELECT count(*) FILTER (WHERE on_ns - off_ns <> off_cpu_ns),
               count(*) FILTER (WHERE off_ns < s.started_ns OR on_ns > s.stopped_ns),
               count(*) FILTER (WHERE prev_state NOT IN ('preempted', 'sleeping', 'uninterruptible')),
               count(*) FILTER (WHERE sleep_ns + cpu_wait_ns <> off_cpu_ns OR sleep_ns < 0 OR cpu_wait_ns < 0
                                OR (prev_state = 'preempted') <> (sleep_ns = 0))
        FROM sched_intervals, sessions s""")
    assert bad == (0, 0, 0, 0)
    # Each attributed call's CPU-wait/sleep split is exactly the sum of the intervals' split inside it.
    mismatched = one(con, """
        WITH c AS (SELECT tid, ts_ns, ts_ns + duration_ns AS end_ns, cpu_wait_ns, sleep_ns, context_switches
                   FROM cuda_calls WHERE off_cpu_ns > 0),
             j AS (SELECT c.ts_ns, c.tid, any_value(c.cpu_wait_ns) AS pre, any_value(c.sleep_ns) AS blk,
                          any_value(c.context_switches) AS cs,
                          sum(i.cpu_wait_ns) AS ipre,
                          sum(i.sleep_ns) AS iblk, count(*) AS n
                   FROM c JOIN sched_intervals i ON i.tid = c.tid AND i.off_ns >= c.ts_ns AND i.on_ns <= c.end_ns
                   GROUP BY c.ts_ns, c.tid)
        SELECT (SELECT count(*) FROM c) - count(*),
               count(*) FILTER (WHERE coalesce(ipre, 0) <> pre OR coalesce(iblk, 0) <> blk OR n <> cs)
        FROM j""")
    assert mismatched == (0, 0)
    # Intervals of one thread never overlap.
    overlaps = one(con, """
        SELECT count(*) FROM (SELECT off_ns, lag(on_ns) OVER (PARTITION BY tid ORDER BY off_ns) AS prev_on
                              FROM sched_intervals) WHERE off_ns < prev_on""")[0]
    assert overlaps == 0


def test_aggregates_count_at_least_the_rows(con: duckdb.DuckDBPyConnection) -> None:
    # sched_switch: traced threads' rows are all stored (count = stored = rows per thread, CPU and bucket).
    mismatch = one(con, """
        WITH r AS (SELECT pid, tid, cpu, (off_ns - s.started_ns) // 1000000000 AS b, count(*) AS n
                   FROM sched_intervals, sessions s GROUP BY ALL),
             a AS (SELECT pid, tid, cpu, (bucket_start_ns - s.started_ns) // 1000000000 AS b, count, stored
                   FROM host_aggregates, sessions s WHERE op = 'sched_switch')
        SELECT count(*) FILTER (WHERE a.count IS NULL OR a.count < r.n OR a.stored <> r.n)
        FROM r LEFT JOIN a USING (pid, tid, cpu, b)""")[0]
    assert mismatch == 0
    assert one(con, "SELECT count(*) FROM host_aggregates WHERE stored > count OR count <= 0")[0] == 0
    # mm_page_alloc: the pages allocated during CUDA calls are part of the pid's exact count.
    short = one(con, """
        WITH r AS (SELECT pid, (ts_ns - s.started_ns) // 1000000000 AS b, sum(page_allocs) AS n
                   FROM cuda_calls, sessions s WHERE page_allocs > 0 GROUP BY ALL),
             a AS (SELECT pid, (bucket_start_ns - s.started_ns) // 1000000000 AS b, count
                   FROM host_aggregates, sessions s WHERE op = 'mm_page_alloc')
        SELECT count(*) FILTER (WHERE a.count IS NULL OR a.count < r.n) FROM r LEFT JOIN a USING (pid, b)""")[0]
    assert short == 0
    # Untraced processes appear in the aggregates too (who else used the CPUs).
    assert one(con, """SELECT count(DISTINCT a.pid) FROM host_aggregates a JOIN processes p USING (pid)
                       WHERE NOT p.traced""")[0] >= 3


def test_processes_events_snapshots_stats(con: duckdb.DuckDBPyConnection) -> None:
    unknown = one(con, """
        SELECT count(*) FROM (
          SELECT pid FROM cuda_calls UNION SELECT pid FROM sched_intervals UNION SELECT pid FROM host_aggregates
          UNION SELECT preemptor_pid FROM sched_intervals UNION SELECT last_holder_pid FROM sched_intervals
          UNION SELECT waker_pid FROM sched_intervals)
        WHERE pid <> 0 AND pid NOT IN (SELECT pid FROM processes)""")[0]
    assert unknown == 0
    assert one(con, "SELECT count(*) FROM processes p WHERE pid IN (SELECT pid FROM cuda_calls) AND NOT traced")[0] == 0
    assert one(con, "SELECT count(*) FROM processes WHERE comm IS NULL OR cmdline IS NULL")[0] == 0
    forks = one(con, """SELECT count(*) FROM process_events e LEFT JOIN processes p ON p.pid = e.child_pid
                        WHERE e.event = 'fork' AND (p.ppid IS DISTINCT FROM e.pid)""")[0]
    assert forks == 0
    exits = one(con, """SELECT count(*) FROM process_events e JOIN processes p USING (pid)
                        WHERE e.event = 'exit' AND p.exit_ns IS DISTINCT FROM e.ts_ns""")[0]
    assert exits == 0
    n_snap, span_s = one(con, """SELECT count(*), any_value(ceil((s.stopped_ns - s.started_ns) / 1e9))
                                 FROM snapshots, sessions s""")
    assert n_snap == span_s
    assert one(con, "SELECT count(*) FROM snapshots "
                    "WHERE cpu_percent NOT BETWEEN 0 AND 100 OR gpu_util_percent IS NULL")[0] == 0
    stats = {r[0]: r[1:] for r in con.execute(
        "SELECT source, events_seen, events_stored, events_lost, events_aggregated FROM collector_stats").fetchall()}
    assert all(v[2] == 0 for v in stats.values())
    assert stats["cuda_uprobes"][:2] == (one(con, "SELECT count(*) FROM cuda_calls")[0],) * 2
    assert stats["sched_switch"][0] == one(con, "SELECT sum(count) FROM host_aggregates WHERE op = 'sched_switch'")[0]
    assert stats["sched_switch"][1] == one(con, "SELECT count(*) FROM sched_intervals")[0]
    assert stats["mm_page_alloc"][0] == one(con, "SELECT sum(count) FROM host_aggregates WHERE op = 'mm_page_alloc'")[0]


def test_ground_truth_is_in_the_data(con: duckdb.DuckDBPyConnection, scenario: str) -> None:
    """The symptom EXPECTED names is really there, and so is the cause, measured from the rows."""
    exp = EXPECTED[scenario]
    n, p50, p99 = one(con, """SELECT count(*), quantile_disc(duration_ns, 0.5), quantile_disc(duration_ns, 0.99)
                              FROM cuda_calls WHERE op = ? AND pid = ?""", [exp.op, exp.pid])
    assert n >= 10 and p99 >= 3 * p50
    slow = f"""FROM cuda_calls WHERE op = '{exp.op}' AND pid = {exp.pid}
               AND duration_ns >= (SELECT quantile_disc(duration_ns, 0.99) FROM cuda_calls
                                   WHERE op = '{exp.op}' AND pid = {exp.pid})"""
    dur, pre, blk, pages = one(con, "SELECT sum(duration_ns), sum(cpu_wait_ns), sum(sleep_ns), sum(page_allocs) "
                                    f"{slow}")
    if exp.cause == "cpu-contention":
        assert pre > 0.5 * dur
        who = one(con, f"""SELECT mode(preemptor_comm) FROM sched_intervals i
                           JOIN (SELECT tid, ts_ns, ts_ns + duration_ns AS e {slow}) c
                           ON i.tid = c.tid AND i.off_ns BETWEEN c.ts_ns AND c.e WHERE prev_state = 'preempted'""")[0]
        assert who == exp.competitor
        cpu = one(con, f"""SELECT avg(cpu_percent) FROM snapshots sn JOIN (SELECT ts_ns {slow}) c
                          ON sn.ts_ns BETWEEN c.ts_ns - 500000000 AND c.ts_ns + 500000000""")[0]
        assert cpu > 90
    elif exp.cause == "gpu-shared":
        assert pre == 0 and blk > 0.8 * dur
        other = one(con, f"""SELECT count(DISTINCT c.ts_ns) FROM (SELECT ts_ns, ts_ns + duration_ns AS e {slow}) c
                             JOIN cuda_calls o ON o.pid <> {exp.pid} AND o.op = 'cudaLaunchKernel'
                             AND o.ts_ns BETWEEN c.ts_ns AND c.e""")[0]
        assert other == one(con, f"SELECT count(*) {slow}")[0]
    elif exp.cause == "memcpy-bandwidth":
        assert pre == 0 and blk > 0.5 * dur
        gbps = one(con, f"SELECT sum(bytes) / (sum(duration_ns) / 1e9) / 1e9 {slow}")[0]
        assert gbps < 5
    elif exp.cause == "page-alloc-storm":
        assert pre == 0 and pages > 10_000 * one(con, f"SELECT count(*) {slow}")[0]
    elif exp.cause == "cold-start":
        assert pre == 0
        first_ts, slow_first = one(con, f"""SELECT min(ts_ns), (SELECT min(ts_ns) {slow})
                                            FROM cuda_calls WHERE pid = {exp.pid}""")
        assert slow_first == first_ts
        started = one(con, "SELECT min(ts_ns) FROM process_events WHERE event = 'exec' AND pid = ?", [exp.pid])[0]
        assert started is not None and started < first_ts
    else:  # pragma: no cover - a new scenario must say how its cause shows in the data
        pytest.fail(f"no ground-truth check for cause {exp.cause}")


def test_v2_intervals_name_wakers_holders_and_syscalls(con: duckdb.DuckDBPyConnection) -> None:
    """What the v2 collector records about every off-CPU interval: the waker of every sleep (a task, or the task an
    interrupt landed on), the first and last holders of the CPU, the CPU it came back on, the system call slept in."""
    bad = one(con, """
        SELECT count(*) FILTER (WHERE prev_state <> 'preempted' AND (wakeup_ns <> off_ns + sleep_ns
                                OR waker_pid IS NULL OR waker_tid IS NULL OR waker_comm IS NULL
                                OR waker_context NOT IN ('task', 'irq', 'softirq') OR syscall IS NULL)),
               count(*) FILTER (WHERE prev_state = 'preempted' AND (wakeup_ns IS NOT NULL OR waker_pid IS NOT NULL)),
               count(*) FILTER (WHERE on_cpu IS NULL OR preemptor_tid IS NULL OR last_holder_pid IS NULL
                                OR last_holder_comm IS NULL OR preemptor_comm IS NULL),
               count(*) FILTER (WHERE waker_context IN ('irq', 'softirq') AND waker_pid = 0
                                AND waker_comm NOT LIKE 'swapper/%'),
               count(*) FILTER (WHERE cpu_wait_ns = 0 AND on_cpu <> cpu)
        FROM sched_intervals""")
    assert bad == (0, 0, 0, 0, 0)
    # a sleep inside a CUDA call ends with the GPU's interrupt, in the driver's ioctl
    inside = one(con, """
        SELECT count(*), count(*) FILTER (WHERE i.waker_context = 'irq' AND i.syscall = 'ioctl')
        FROM sched_intervals i
        JOIN cuda_calls c ON i.tid = c.tid AND i.off_ns >= c.ts_ns AND i.on_ns <= c.ts_ns + c.duration_ns
        WHERE i.prev_state = 'sleeping' AND c.op LIKE '%ynchronize'""")
    assert inside[0] == 0 or inside[1] == inside[0]


def test_v2_cpu_time_per_task_and_cpu(con: duckdb.DuckDBPyConnection) -> None:
    """sched_switch aggregates per (task, CPU, second) with the on-CPU time: every CPU-second of the trace is
    accounted for among the tasks and the idle task, and a traced thread's on-CPU time is its wall time less
    its off-CPU intervals."""
    cpus, seconds = one(con, "SELECT cpu_count, (stopped_ns - started_ns) // 1000000000 FROM sessions")
    per_cpu = con.execute("""
        SELECT a.cpu, (a.bucket_start_ns - s.started_ns) // 1000000000 AS k, sum(a.sum_duration_ns)
        FROM host_aggregates a, sessions s WHERE a.op = 'sched_switch' GROUP BY ALL""").fetchall()
    assert len(per_cpu) == cpus * seconds
    assert all(ns == 1_000_000_000 for _c, _k, ns in per_cpu), [r for r in per_cpu if r[2] != 1_000_000_000][:5]
    assert one(con, "SELECT count(*) FROM host_aggregates "
                    "WHERE op = 'sched_switch' AND (tid IS NULL OR cpu IS NULL)")[0] == 0
    assert one(con, "SELECT count(*) FROM host_aggregates "
                    "WHERE op = 'sched_switch' AND pid = 0 AND comm NOT LIKE 'swapper/%'")[0] == 0
    # a traced main thread: second 5 (whole, inside the trace) on-CPU = 1 s - off-CPU overlap
    pid, on, off = one(con, """
        WITH m AS (SELECT min(pid) AS pid FROM cuda_calls), s AS (SELECT started_ns + 5000000000 AS a FROM sessions)
        SELECT m.pid,
               (SELECT sum(sum_duration_ns) FROM host_aggregates, s WHERE op = 'sched_switch' AND tid = m.pid
                AND bucket_start_ns = s.a),
               (SELECT sum(least(on_ns, s.a + 1000000000) - greatest(off_ns, s.a)) FROM sched_intervals, s
                WHERE tid = m.pid AND on_ns > s.a AND off_ns < s.a + 1000000000)
        FROM m""")
    assert abs(on - (1_000_000_000 - off)) <= cpus, (pid, on, off)  # rounding: the time is split over the CPUs


def test_v2_threads_kernels_copies_and_gpu_processes(con: duckdb.DuckDBPyConnection, scenario: str) -> None:
    missing = one(con, """SELECT count(*) FROM (SELECT DISTINCT pid, tid FROM cuda_calls UNION SELECT DISTINCT pid, tid
                                               FROM sched_intervals) t ANTI JOIN threads USING (pid, tid)""")[0]
    assert missing == 0
    # every launch names its kernel; a loop launches the same kernels over and over
    n, handles, no_handle = one(con, """SELECT count(*), count(DISTINCT kernel_handle),
                                               count(*) FILTER (WHERE kernel_handle IS NULL)
                                        FROM cuda_calls WHERE op LIKE '%aunch%'""")
    assert no_handle == 0 and 10 <= handles < n / 20
    assert one(con, "SELECT count(*) FROM cuda_calls WHERE op NOT LIKE '%aunch%' AND kernel_handle IS NOT NULL")[0] == 0
    # copies: the host address, and whether it was pinned
    copies = one(con, """SELECT count(*) FILTER (WHERE host_ptr IS NULL), count(*) FILTER (WHERE host_pinned),
                                count(*) FILTER (WHERE NOT host_pinned), count(*)
                         FROM cuda_calls WHERE memcpy_kind IN ('H2D', 'D2H')""")
    assert copies[0] == 0
    if scenario == "memcpy-bottleneck":
        assert copies[1] == 0 and copies[2] == copies[3]
    if scenario == "dataloader":  # pin_memory=True: the batches come from pinned buffers
        assert one(con, "SELECT bool_and(host_pinned) FROM cuda_calls WHERE memcpy_kind = 'H2D'")[0] is True
    # NVML sees every process using the GPU, each second
    gpu_pids = {p for (p,) in con.execute("SELECT DISTINCT pid FROM gpu_processes").fetchall()}
    assert gpu_pids == {p for (p,) in con.execute("SELECT DISTINCT pid FROM cuda_calls").fetchall()}


def test_v2_dataloader_threads_and_wakers(stores: dict[str, Path]) -> None:
    """The DataLoader story as the kernel tells it: workers rename themselves, a worker wakes the main thread
    through the result queue, and the main thread then waits for a CPU that a worker holds."""
    c = open_store(stores["dataloader"])
    renames = one(c, "SELECT count(*), min(old_comm), min(comm) FROM process_events WHERE event = 'rename'")
    assert renames == (12, "python3", "pt_data_worker")
    assert one(c, "SELECT comm FROM threads WHERE pid = 4100 AND tid <> 4100")[0] == "pt_autograd_0"
    woke = one(c, """SELECT count(*), count(*) FILTER (WHERE waker_comm = 'pt_data_worker' AND syscall = 'poll'
                                                        AND waker_context = 'task'),
                            count(*) FILTER (WHERE cpu_wait_ns > 0 AND last_holder_comm = 'pt_data_worker')
                     FROM sched_intervals WHERE tid = 4100 AND prev_state = 'sleeping' AND syscall <> 'ioctl'""")
    assert woke[0] > 1000 and woke[1] == woke[0] and woke[2] > 0.9 * woke[0]
    c.close()


def test_v2_gpu_shared_nvml_sees_the_server(stores: dict[str, Path]) -> None:
    c = open_store(stores["gpu-shared"])
    got = dict(c.execute("SELECT pid, max(sm_util_percent) FROM gpu_processes GROUP BY pid").fetchall())
    assert set(got) == {9100, 9200} and got[9200] > 30
    assert "serve.py" in one(c, "SELECT cmdline FROM processes WHERE pid = 9200")[0]
    c.close()


def test_same_seed_same_trace(tmp_path: Path) -> None:
    sums = []
    for i, seed in enumerate((3, 3, 4)):
        db = tmp_path / f"s{i}.duckdb"
        generate("cpu-contention", db, seed=seed, scale=0.3)
        c = open_store(db)
        sums.append(one(c, "SELECT count(*), sum(duration_ns), sum(cpu_wait_ns) FROM cuda_calls"))
        c.close()
    assert sums[0] == sums[1] != sums[2]


def test_scale_stretches_the_trace(tmp_path: Path) -> None:
    counts = []
    for scale in (0.5, 1.0):
        db = tmp_path / f"x{scale}.duckdb"
        generate("dataloader", db, scale=scale)
        c = open_store(db)
        counts.append(one(c, "SELECT count(*), (max(ts_ns) - min(ts_ns)) / 1e9 FROM cuda_calls"))
        c.close()
    assert 1.7 < counts[1][0] / counts[0][0] < 2.3
    assert 1.7 < counts[1][1] / counts[0][1] < 2.3


def test_unknown_scenario_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="dataloader"):
        generate("no-such", tmp_path / "x.duckdb")


def test_demo_command_writes_store_and_prints_report(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from ingero_mcp.cli import main

    db = tmp_path / "d.duckdb"
    assert main(["demo", "cpu-contention", "--db", str(db), "--scale", "0.2"]) == 0
    out, err = capsys.readouterr()
    assert str(db) in err and "cudaStreamSynchronize" in out and "Verdict" in out
    # Running again replaces the demo store (one session, not two).
    assert main(["demo", "cpu-contention", "--db", str(db), "--scale", "0.2", "--no-report"]) == 0
    c = open_store(db)
    assert one(c, "SELECT count(*), any_value(source) FROM sessions") == (1, "demo:cpu-contention")
    c.close()


def test_demo_command_refuses_to_overwrite_other_files(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from ingero_mcp.cli import main

    other = tmp_path / "notes.duckdb"
    other.write_text("my notes")
    assert main(["demo", "--db", str(other), "--no-report"]) == 2
    assert "not a demo trace store" in capsys.readouterr().err
    assert other.read_text() == "my notes"
    assert main(["demo", "no-such-scenario", "--db", str(tmp_path / "x.duckdb")]) == 2


def test_v2_cold_start_context_creation_reads_files_in_d_state(stores: dict[str, Path]) -> None:
    """The first cudaMalloc creates the context: the driver reads its files, asleep in D state (uninterruptible),
    woken by the disk's interrupt; no other sleep of the server is uninterruptible."""
    c = open_store(stores["cold-start"])
    got = one(c, """
        WITH f AS (SELECT ts_ns, ts_ns + duration_ns AS e, sleep_ns FROM cuda_calls WHERE pid = 5300
                   ORDER BY ts_ns LIMIT 1)
        SELECT count(*), sum(i.sleep_ns) = any_value(f.sleep_ns),
               bool_and(i.syscall = 'read' AND i.waker_context = 'irq'),
               (SELECT count(*) FROM sched_intervals WHERE prev_state = 'uninterruptible')
        FROM sched_intervals i, f WHERE i.off_ns >= f.ts_ns AND i.on_ns <= f.e AND i.prev_state = 'uninterruptible'""")
    c.close()
    assert got == (24, True, True, 24)


def test_demo_stores_keep_their_accounting(scenario: str, stores: dict[str, Path], tmp_path: Path) -> None:
    """A demo store is finished when written: it holds the accounting's derived tables (schemas/v3.sql), and they
    equal what a reader computes from the trace rows (the same file with acct_meta emptied)."""
    from ingero_mcp.store.views import VIEWS, has_derived, lay_views

    copy = tmp_path / "copy.duckdb"
    copy.write_bytes(stores[scenario].read_bytes())
    raw = duckdb.connect(str(copy))
    raw.execute("DELETE FROM acct_meta").fetchall()
    raw.close()
    got = {}
    for path, derived in ((stores[scenario], True), (copy, False)):
        c = open_store(path)
        assert has_derived(c) is derived
        lay_views(c)
        got[derived] = {v: c.execute(f"SELECT * FROM {v}").fetchall() for v in VIEWS}
        c.close()
    for v in VIEWS:
        assert sorted(got[True][v], key=repr) == sorted(got[False][v], key=repr), v
