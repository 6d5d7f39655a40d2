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
               count(*) FILTER (WHERE prev_state NOT IN ('preempted', 'sleeping')),
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
    # sched_switch: traced threads' rows are all stored (count = stored = rows per pid and bucket).
    mismatch = one(con, """
        WITH r AS (SELECT pid, (off_ns - s.started_ns) // 1000000000 AS b, count(*) AS n
                   FROM sched_intervals, sessions s GROUP BY ALL),
             a AS (SELECT pid, (bucket_start_ns - s.started_ns) // 1000000000 AS b, count, stored
                   FROM host_aggregates, sessions s WHERE op = 'sched_switch')
        SELECT count(*) FILTER (WHERE a.count IS NULL OR a.count < r.n OR a.stored <> r.n)
        FROM r LEFT JOIN a USING (pid, b)""")[0]
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
          UNION SELECT preemptor_pid FROM sched_intervals WHERE preemptor_pid <> 0)
        WHERE pid NOT IN (SELECT pid FROM processes)""")[0]
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
    assert one(con, "SELECT count(*) FROM snapshots WHERE cpu_percent NOT BETWEEN 0 AND 100 OR gpu_util_percent IS NULL")[0] == 0
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
    dur, pre, blk, pages = one(con, f"SELECT sum(duration_ns), sum(cpu_wait_ns), sum(sleep_ns), sum(page_allocs) {slow}")
    if exp.cause == "cpu-contention":
        assert pre > 0.5 * dur
        who = one(con, f"""SELECT mode(preemptor_comm) FROM sched_intervals i JOIN (SELECT tid, ts_ns, ts_ns + duration_ns AS e {slow}) c
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


SEVERITY_RANK = {"LOW": 0, "MEDIUM": 1, "HIGH": 2}


def test_scenario_yields_its_chain(con: duckdb.DuckDBPyConnection, scenario: str) -> None:
    """The chain engine finds the scenario's cause on its op, and raises nothing unrelated to HIGH."""
    from ingero_mcp.analysis.chains import causal_chains

    exp = EXPECTED[scenario]
    chains = [c for c in causal_chains(con) if c.origin == "ingero-mcp"]
    seen = [(c.op, c.severity, c.root_cause) for c in chains]
    mine = [c for c in chains if c.op == exp.op and (not c.pids or exp.pid in c.pids)]
    assert mine, f"no chain on {exp.op}; chains: {seen}"
    chain = mine[0]
    assert SEVERITY_RANK[chain.severity] >= SEVERITY_RANK[exp.severity], seen
    assert any(k in chain.root_cause.lower() for k in exp.keywords), chain.root_cause
    # The cause named is this scenario's and no other's.
    for other, oexp in EXPECTED.items():
        if oexp.cause != exp.cause:
            assert not any(k in chain.root_cause.lower() for k in oexp.keywords), (other, chain.root_cause)
    if exp.competitor:
        text = " ".join([chain.summary, chain.explanation, *(str(e.value) for e in chain.evidence)])
        assert exp.competitor in text, text
    # Every HIGH chain is on the scenario's op or an op slowed by the same cause.
    for c in chains:
        if c.severity == "HIGH":
            assert c.op in (exp.op, *exp.related_ops), seen
            assert any(k in c.root_cause.lower() for k in exp.keywords), seen
    # The numbers the chain quotes are the store's (over the op's calls by its pids, or by everyone).
    q = "SELECT quantile_disc(duration_ns, 0.5), quantile_disc(duration_ns, 0.99), count(*) FROM cuda_calls WHERE op = ?"
    per_pid = one(con, q + " AND pid = ?", [exp.op, exp.pid])
    op_wide = one(con, q, [exp.op])
    assert (chain.p50_ns, chain.p99_ns, chain.count) in (per_pid, op_wide)


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
    assert str(db) in err and "cudaStreamSynchronize" in out
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
