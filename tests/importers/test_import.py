"""Ingero import: lossless row counts for every table of the three published databases, the facts
the DataLoader trace holds (checked with SQL over the store), the 0.9 multi-node layout, bad inputs,
and the `import` command run as a user runs it."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
from pathlib import Path

import duckdb
import pytest

from ingero_mcp.importers import IngeroImportError, import_ingero
from ingero_mcp.store import StoreError, open_store

DATALOADER = "pytorch-dataloader-starvation.db"
CLUSTER = "sample-cluster.db"
NODE1 = "sample-gpu-node-01.db"
ALL = (DATALOADER, CLUSTER, NODE1)

# Ingero table -> (store table, extra WHERE) holding exactly one row per Ingero row.
ONE_TO_ONE = {
    "events": ("imported_events", ""),
    "event_aggregates": ("host_aggregates", ""),
    "causal_chains": ("imported_chains", ""),
    "system_snapshots": ("snapshots", ""),
    "stack_traces": ("imported_stacks", ""),
    "sessions": ("sessions", ""),
}


def q(con: duckdb.DuckDBPyConnection, sql: str, params: list[object] | None = None) -> list[tuple]:
    return con.execute(sql, params or []).fetchall()


@pytest.fixture(scope="module")
def stores(ingero_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Each reference database imported into a store of its own."""
    out = {}
    for name in ALL:
        dst = tmp_path_factory.mktemp("imp") / f"{Path(name).stem}.duckdb"
        summary = import_ingero(ingero_dir / name, dst)
        assert summary.session_ids
        out[name] = dst
    return out


@pytest.fixture(scope="module")
def dl(stores: dict[str, Path]) -> duckdb.DuckDBPyConnection:
    return open_store(stores[DATALOADER])


def sqlite_counts(path: Path) -> dict[str, int]:
    con = sqlite3.connect(f"{path.as_uri()}?mode=ro", uri=True)
    names = [r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
    counts = {t: con.execute(f'SELECT count(*) FROM "{t}"').fetchone()[0] for t in names}
    con.close()
    return counts


@pytest.mark.parametrize("name", ALL)
def test_every_row_of_every_table_is_kept(name: str, ingero_dir: Path, stores: dict[str, Path]) -> None:
    counts = sqlite_counts(ingero_dir / name)
    con = open_store(stores[name])
    for table, n in counts.items():
        if table in ONE_TO_ONE:
            store_table, _ = ONE_TO_ONE[table]
            assert q(con, f"SELECT count(*) FROM {store_table}")[0][0] == n, table
        else:
            got = q(con, "SELECT count(*) FROM imported_rows WHERE table_name = ?", [table])[0][0]
            assert got == n, table
    # The Ingero sessions/process_names rows are also kept verbatim.
    assert q(con, "SELECT count(*) FROM imported_rows WHERE table_name = 'sessions'")[0][0] == counts["sessions"]


@pytest.mark.parametrize("name", ALL)
def test_event_values_survive_unchanged(name: str, ingero_dir: Path, stores: dict[str, Path]) -> None:
    """Checksums over every event column: the verbatim copy holds the same values, not just as many rows."""
    lite = sqlite3.connect(f"{(ingero_dir / name).as_uri()}?mode=ro", uri=True)
    want = lite.execute(
        "SELECT count(DISTINCT id), sum(timestamp % 1000000007), sum(duration), sum(pid), sum(tid), "
        "sum(arg0 % 1000003), sum(arg1 % 1000003), sum(ret_code), sum(stack_hash % 1000003), sum(cgroup_id), "
        "sum(source * 100 + op) FROM events"
    ).fetchone()
    con = open_store(stores[name])
    got = q(
        con,
        "SELECT count(DISTINCT event_id), sum(ts_ns % 1000000007), sum(duration_ns), sum(pid), sum(tid), "
        "sum(arg0 % 1000003), sum(arg1 % 1000003), sum(ret_code), sum(stack_hash % 1000003), sum(cgroup_id), "
        "sum(source_id * 100 + op_id) FROM imported_events",
    )[0]
    assert tuple(int(x) for x in got) == tuple(int(x) for x in want)
    # Mapped tables hold exactly the rows of their ops, each once.
    mapped = dict(q(con, "SELECT coalesce(mapped_to, '-'), count(*) FROM imported_events GROUP BY 1"))
    for table in ("cuda_calls", "sched_intervals", "process_events"):
        assert q(con, f"SELECT count(*) FROM {table}")[0][0] == mapped.get(table, 0), table
    agg = lite.execute("SELECT sum(count), sum(stored), sum(sum_dur) FROM event_aggregates").fetchone()
    store_agg = q(con, "SELECT sum(count), sum(stored), coalesce(sum(sum_duration_ns), 0) FROM host_aggregates")[0]
    assert tuple(int(x or 0) for x in store_agg) == tuple(int(x or 0) for x in agg)


def test_dataloader_sched_switch_totals_per_task(dl: duckdb.DuckDBPyConnection) -> None:
    per_pid = dict(q(dl, "SELECT pid, sum(count) FROM host_aggregates WHERE op = 'sched_switch' GROUP BY pid"))
    assert {p: per_pid[p] for p in (2254, 2255, 2256, 2257, 2258, 2233)} == {
        2254: 53_526, 2255: 45_281, 2256: 40_292, 2257: 29_956, 2258: 18_093, 2233: 3_713,
    }
    assert sum(per_pid.values()) == 191_835
    assert q(dl, "SELECT DISTINCT source FROM host_aggregates WHERE op = 'sched_switch'") == [("sched",)]


def test_dataloader_page_allocations(dl: duckdb.DuckDBPyConnection) -> None:
    assert q(dl, "SELECT sum(count), sum(sum_bytes) FROM host_aggregates WHERE op = 'mm_page_alloc'")[0] == (
        1_430_581, 5_861_011_456,
    )
    assert q(dl, "SELECT sum(count) FROM host_aggregates WHERE op = 'mm_page_alloc' AND pid = 2233")[0][0] == 1_173_407
    # Page allocations are never stored as rows by Ingero.
    assert q(dl, "SELECT count(*) FROM imported_events WHERE op = 'mm_page_alloc'")[0][0] == 0


def test_dataloader_process_tree(dl: duckdb.DuckDBPyConnection) -> None:
    children = [r[0] for r in q(dl, "SELECT child_pid FROM process_events "
                                    "WHERE event = 'fork' AND pid = 2233 ORDER BY child_pid")]
    assert children == [2254, 2255, 2256, 2257, 2258, 2259, 2260, 2262]
    ppid = dict(q(dl, "SELECT pid, ppid FROM processes"))
    assert all(ppid[c] == 2233 for c in children)
    assert ppid[2267] == 2254  # a worker's own fork
    comm = dict(q(dl, "SELECT pid, comm FROM processes"))
    assert comm[2233] == "python3" and comm[2255] == "pt_data_worker" and comm[2258] == "pt_data_pin"


def test_dataloader_ingero_chains(dl: duckdb.DuckDBPyConnection) -> None:
    high = {r[0] for r in q(dl, "SELECT DISTINCT op FROM imported_chains "
                                "WHERE severity = 'HIGH' AND origin = 'ingero'")}
    assert high == {"cudaLaunchKernel", "cuLaunchKernel", "cuMemAlloc", "cudaStreamSync"}
    # Ingero's p50 is derived (p99 / tail_ratio): the import says so on every chain.
    assert q(dl, "SELECT count(*) FROM imported_chains WHERE notes LIKE '%p99 / tail_ratio%'")[0][0] == 316
    row = q(dl, "SELECT p99_ns, p50_ns, tail_ratio FROM imported_chains WHERE chain_id = 'chain-001'")[0]
    assert row == (25_799_000, 73_000, 352.5)


def test_dataloader_stored_sample_and_the_cold_start_launch(dl: duckdb.DuckDBPyConnection) -> None:
    assert q(dl, "SELECT count(*) FROM imported_events")[0][0] == 3_807
    assert q(dl, "SELECT max(duration_ns) FROM cuda_calls WHERE op = 'cudaLaunchKernel'")[0][0] == 25_799_899
    first = q(dl, "SELECT duration_ns FROM cuda_calls WHERE op = 'cudaLaunchKernel' ORDER BY ts_ns LIMIT 1")[0][0]
    assert first == 25_799_899  # the longest launch is the process's first one
    assert q(dl, "SELECT count(*) FROM cuda_calls WHERE off_cpu_ns IS NOT NULL OR cpu_wait_ns IS NOT NULL")[0][0] == 0
    coverage = dict(q(dl, "SELECT table_name, complete FROM table_coverage"))
    assert coverage["cuda_calls"] is False and coverage["sched_intervals"] is False
    assert coverage["host_aggregates"] is True


def test_dataloader_memcpy_bytes_and_kind(dl: duckdb.DuckDBPyConnection) -> None:
    kinds = q(dl, "SELECT DISTINCT memcpy_kind FROM cuda_calls WHERE op = 'cudaMemcpyAsync'")
    assert kinds == [("H2D",)]
    assert q(dl, "SELECT count(*) FROM cuda_calls WHERE op = 'cudaLaunchKernel' AND bytes IS NOT NULL")[0][0] == 0
    assert q(dl, "SELECT api, count(*) FROM cuda_calls GROUP BY api ORDER BY api") == [("driver", 54), ("runtime", 61)]


def test_dataloader_sched_intervals_end_at_the_timestamp(dl: duckdb.DuckDBPyConnection) -> None:
    rows = q(dl, "SELECT count(*), sum(on_ns - off_ns - off_cpu_ns), count(preemptor_pid) FROM sched_intervals")[0]
    assert rows == (3_676, 0, 0)  # Ingero's arg1 is the thread itself: no preemptor is claimed


def test_dataloader_snapshots_and_session_units(dl: duckdb.DuckDBPyConnection) -> None:
    mem_total, cpus, notes, source = q(dl, "SELECT memory_bytes, cpu_count, notes, source FROM sessions")[0]
    assert mem_total == 15_989 * 1024 * 1024 and cpus == 4 and source == "ingero-import"
    assert "schema 0.8" in notes
    snap = q(dl, "SELECT mem_available_bytes, cpu_percent, mem_used_percent FROM snapshots ORDER BY ts_ns LIMIT 2")
    assert snap[1][0] == 15_091 * 1024 * 1024
    assert snap[1][1] == pytest.approx(28.7206, abs=1e-3) and snap[1][2] == pytest.approx(5.6152, abs=1e-3)


def test_cluster_file_becomes_one_session_per_node(stores: dict[str, Path]) -> None:
    con = open_store(stores[CLUSTER])
    sessions = q(con, "SELECT session_id, host FROM sessions ORDER BY session_id")
    assert sessions == [(1, "gpu-node-01"), (2, "gpu-node-02"), (3, "gpu-node-03")]
    # Every event and chain lands in the session of its node.
    wrong = q(con, "SELECT count(*) FROM imported_events e JOIN sessions s USING (session_id) WHERE e.node <> s.host")
    assert wrong == [(0,)]
    per_node = dict(q(con, "SELECT s.host, count(*) FROM imported_chains c "
                           "JOIN sessions s USING (session_id) GROUP BY 1"))
    assert per_node == {"gpu-node-01": 4, "gpu-node-02": 1, "gpu-node-03": 1}
    assert q(con, "SELECT count(*) FROM imported_events WHERE event_id LIKE 'gpu-node-0_:%'")[0][0] == 600
    # Block I/O rows have no store table of their own but are kept.
    assert q(con, "SELECT count(*) FROM imported_events WHERE source = 'IO' AND mapped_to IS NULL")[0][0] == 305


def test_node_file_without_aggregates_says_totals_unknown(stores: dict[str, Path]) -> None:
    con = open_store(stores[NODE1])
    assert dict(q(con, "SELECT table_name, complete FROM table_coverage"))["host_aggregates"] is False
    assert q(con, "SELECT count(*) FROM imported_rows WHERE table_name = 'cgroup_schedstat'")[0][0] == 8
    assert q(con, "SELECT row_json ->> 'cgroup_path' FROM imported_rows WHERE table_name = 'cgroup_metadata'") == [
        ("/user.slice/user-1000.slice/session-7.scope",)
    ]


def test_import_into_an_existing_store_adds_a_session(ingero_dir: Path, tmp_path: Path) -> None:
    dst = tmp_path / "both.duckdb"
    first = import_ingero(ingero_dir / NODE1, dst)
    second = import_ingero(ingero_dir / DATALOADER, dst)
    assert first.session_ids == [1] and second.session_ids == [2]
    con = open_store(dst)
    assert q(con, "SELECT session_id, count(*) FROM imported_events GROUP BY 1 ORDER BY 1") == [(1, 200), (2, 3_807)]


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(IngeroImportError, match="no such file"):
        import_ingero(tmp_path / "nope.db", tmp_path / "out.duckdb")
    assert not (tmp_path / "out.duckdb").exists()


@pytest.mark.parametrize("content", [b"", b"hello, not a database\n", b"SQLite format 2\x00" + b"\x00" * 100])
def test_not_sqlite(tmp_path: Path, content: bytes) -> None:
    src = tmp_path / "bad.db"
    src.write_bytes(content)
    with pytest.raises(IngeroImportError, match="not an SQLite database"):
        import_ingero(src, tmp_path / "out.duckdb")


def test_sqlite_without_ingero_tables(tmp_path: Path) -> None:
    src = tmp_path / "other.db"
    lite = sqlite3.connect(src)
    lite.execute("CREATE TABLE events (a INTEGER)")
    lite.commit()
    lite.close()
    with pytest.raises(StoreError, match="not an Ingero trace database"):
        import_ingero(src, tmp_path / "out.duckdb")


def test_failed_import_leaves_no_partial_session(ingero_dir: Path, tmp_path: Path) -> None:
    """An event row that cannot be read mid-import: the store keeps its earlier session and nothing else."""
    dst = tmp_path / "store.duckdb"
    import_ingero(ingero_dir / DATALOADER, dst)  # another file: the broken copy of NODE1 is not a re-import
    src = tmp_path / "broken.db"
    lite = sqlite3.connect(src)
    with sqlite3.connect(f"{(ingero_dir / NODE1).as_uri()}?mode=ro", uri=True) as ref:
        ref.backup(lite)
    lite.execute("UPDATE events SET timestamp = 'not a number' WHERE rowid = (SELECT max(rowid) FROM events)")
    lite.commit()
    lite.close()
    with pytest.raises(IngeroImportError, match="events"):
        import_ingero(src, dst)
    con = open_store(dst)
    assert q(con, "SELECT DISTINCT session_id FROM sessions") == [(1,)]
    assert q(con, "SELECT count(*) FROM imported_events")[0][0] == 3_807


def test_progress_reports_reach_the_total(ingero_dir: Path, tmp_path: Path) -> None:
    seen: list[tuple[str, int, int]] = []
    import_ingero(ingero_dir / DATALOADER, tmp_path / "p.duckdb", lambda s, d, t: seen.append((s, d, t)))
    assert seen[0][0] == "events"
    assert seen[-1][1] == seen[-1][2] == sum(sqlite_counts(ingero_dir / DATALOADER).values())


def test_cli_import_runs_as_a_user_runs_it(ingero_dir: Path, tmp_path: Path) -> None:
    exe = Path(sys.executable).parent / "ingero-mcp"
    dst = tmp_path / "cli.duckdb"
    ok = subprocess.run([str(exe), "import", str(ingero_dir / DATALOADER), "--db", str(dst)], capture_output=True,
                        text=True)
    assert ok.returncode == 0, ok.stderr
    assert "session(s) 1" in ok.stdout and "imported_events 3,807" in ok.stdout
    assert q(open_store(dst), "SELECT count(*) FROM cuda_calls")[0][0] == 115
    bad = subprocess.run([str(exe), "import", str(ingero_dir / "README.md"), "--db", str(dst)], capture_output=True,
                         text=True)
    assert bad.returncode == 2
    assert bad.stderr.count("\n") == 1 and "not an SQLite database" in bad.stderr


def test_destination_that_is_not_a_store_is_refused(ingero_dir: Path, tmp_path: Path) -> None:
    src = ingero_dir / NODE1
    with pytest.raises(IngeroImportError, match="must not be the Ingero file"):
        import_ingero(src, src)
    other = tmp_path / "notes.txt"
    other.write_text("keep me\n")
    with pytest.raises(IngeroImportError, match="not a DuckDB trace store"):
        import_ingero(src, other)
    assert other.read_text() == "keep me\n"


def test_reader_thread_errors_reach_the_caller() -> None:
    from ingero_mcp.importers.ingero_source import prefetch

    def chunks():  # type: ignore[no-untyped-def]
        yield {"a": [1]}
        raise sqlite3.DatabaseError("disk image is malformed")

    got = []
    with pytest.raises(sqlite3.DatabaseError, match="malformed"):
        for chunk in prefetch(chunks()):
            got.append(chunk)
    assert got == [{"a": [1]}]


def test_unknown_ingero_schema_imports_with_a_warning(ingero_dir: Path, tmp_path: Path) -> None:
    """A newer Ingero file (version bumped, an extra table) still imports; nothing of it is dropped."""
    src = tmp_path / "newer.db"
    lite = sqlite3.connect(src)
    with sqlite3.connect(f"{(ingero_dir / NODE1).as_uri()}?mode=ro", uri=True) as ref:
        ref.backup(lite)
    lite.execute("UPDATE schema_info SET value = '1.0' WHERE key = 'version'")
    lite.execute("CREATE TABLE gpu_metrics (ts INTEGER, util REAL)")
    lite.execute("INSERT INTO gpu_metrics VALUES (1, 0.5), (2, 0.75)")
    lite.commit()
    lite.close()
    summary = import_ingero(src, tmp_path / "out.duckdb")
    assert summary.warnings and "1.0" in summary.warnings[0]
    con = open_store(tmp_path / "out.duckdb")
    rows = q(con, "SELECT row_json ->> 'util' FROM imported_rows WHERE table_name = 'gpu_metrics' ORDER BY row_number")
    assert rows == [("0.5",), ("0.75",)]
    assert "no per-minute totals" in q(con, "SELECT notes FROM sessions")[0][0]


def test_aggregate_sum_arg0_that_is_not_bytes_is_kept_verbatim(ingero_dir: Path, tmp_path: Path) -> None:
    src = tmp_path / "odd.db"
    lite = sqlite3.connect(src)
    with sqlite3.connect(f"{(ingero_dir / DATALOADER).as_uri()}?mode=ro", uri=True) as ref:
        ref.backup(lite)
    # cudaLaunchKernel's arg0 is a kernel pointer: a sum of it has no bytes column to go to.
    lite.execute("UPDATE event_aggregates SET sum_arg0 = 12345 WHERE source = 1 AND op = 3")
    lite.commit()
    lite.close()
    import_ingero(src, tmp_path / "out.duckdb")
    con = open_store(tmp_path / "out.duckdb")
    kept = q(con, "SELECT row_json ->> 'sum_arg0', row_json ->> 'count' FROM imported_rows "
                  "WHERE table_name = 'event_aggregates' ORDER BY row_number")
    assert kept == [("12345", "28"), ("12345", "2")]
    assert q(con, "SELECT count(sum_bytes) FROM host_aggregates WHERE op = 'cudaLaunchKernel'") == [(0,)]


def test_failed_import_into_a_new_store_leaves_no_file(ingero_dir: Path, tmp_path: Path) -> None:
    src = tmp_path / "broken.db"
    lite = sqlite3.connect(src)
    with sqlite3.connect(f"{(ingero_dir / NODE1).as_uri()}?mode=ro", uri=True) as ref:
        ref.backup(lite)
    lite.execute("UPDATE events SET pid = 'x' WHERE rowid = (SELECT min(rowid) FROM events)")
    lite.commit()
    lite.close()
    with pytest.raises(IngeroImportError, match="malformed Ingero data in table events"):
        import_ingero(src, tmp_path / "new.duckdb")
    assert not (tmp_path / "new.duckdb").exists() and not (tmp_path / "new.duckdb.wal").exists()


# --- issue 8, item 9: sources only read, re-imports refused, destinations checked -----------------------


def _wal_copy(ingero_dir: Path, folder: Path, name: str = NODE1) -> Path:
    """The published file alone (WAL mode in its header, no -shm/-wal beside it), as a user downloads it."""
    folder.mkdir(parents=True, exist_ok=True)
    copy = folder / name
    copy.write_bytes((ingero_dir / name).read_bytes())
    assert copy.read_bytes()[18:20] == b"\x02\x02", "the published files are in WAL mode"
    return copy


def test_import_writes_nothing_beside_the_source(ingero_dir: Path, tmp_path: Path) -> None:
    src = _wal_copy(ingero_dir, tmp_path / "downloads")
    import_ingero(src, tmp_path / "store.duckdb")
    assert sorted(p.name for p in src.parent.iterdir()) == [NODE1]  # no -shm, no -wal left there


def test_import_from_a_read_only_folder(ingero_dir: Path, tmp_path: Path) -> None:
    """From a folder nobody may write to: a read-only bind mount as root (root ignores permissions), else chmod."""
    import os

    src = _wal_copy(ingero_dir, tmp_path / "ro")
    folder = src.parent
    if os.geteuid() == 0:
        subprocess.run(["mount", "--bind", str(folder), str(folder)], check=True)
        subprocess.run(["mount", "-o", "remount,bind,ro", str(folder)], check=True)
    else:
        os.chmod(folder, 0o555)
    try:
        with pytest.raises(OSError):
            (folder / "probe").write_text("x")  # the folder really is read-only
        proc = subprocess.run(
            [sys.executable, "-m", "ingero_mcp.cli", "import", str(src), "--db", str(tmp_path / "s.duckdb"), "-q"],
            capture_output=True, text=True, timeout=120,
        )
        left = sorted(p.name for p in folder.iterdir())
    finally:
        if os.geteuid() == 0:
            subprocess.run(["umount", str(folder)], check=True)
        else:
            os.chmod(folder, 0o755)
    assert proc.returncode == 0, proc.stderr  # was: "unable to open database file"
    assert left == [NODE1]
    con = open_store(tmp_path / "s.duckdb")
    assert q(con, "SELECT count(*) FROM imported_events")[0][0] == 200


def test_a_pending_wal_is_read_not_ignored(ingero_dir: Path, tmp_path: Path) -> None:
    """A source whose -wal holds committed rows not yet checkpointed: those rows are imported too."""
    src = _wal_copy(ingero_dir, tmp_path / "w")
    writer = sqlite3.connect(src)
    writer.execute("PRAGMA wal_autocheckpoint = 0")
    writer.execute("INSERT INTO events (id, timestamp, pid, tid, source, op, duration) "
                   "SELECT (SELECT max(id) FROM events) + row_number() OVER (), timestamp + 1, pid, tid, source, op, "
                   "duration "
                   "FROM (SELECT * FROM events LIMIT 5)")
    writer.commit()
    before = sorted(p.name for p in src.parent.iterdir())
    assert Path(f"{src}-wal").stat().st_size > 0
    import_ingero(src, tmp_path / "store.duckdb")
    writer.close()
    con = open_store(tmp_path / "store.duckdb")
    assert q(con, "SELECT count(*) FROM imported_events")[0][0] == 205
    assert before == [NODE1, f"{NODE1}-shm", f"{NODE1}-wal"]


def test_importing_the_same_file_again_is_refused_or_replaced(ingero_dir: Path, tmp_path: Path) -> None:
    dst = tmp_path / "store.duckdb"
    import_ingero(ingero_dir / CLUSTER, dst)
    con = duckdb.connect(str(dst), read_only=True)
    rows_before = q(con, "SELECT count(*) FROM imported_events")[0][0]
    con.close()
    with pytest.raises(IngeroImportError, match=r"already holds .* --replace"):
        import_ingero(ingero_dir / CLUSTER, dst)
    again = import_ingero(ingero_dir / CLUSTER, dst, replace=True)
    con = open_store(dst)
    assert q(con, "SELECT count(*) FROM imported_events")[0][0] == rows_before  # not doubled
    assert sorted(r[0] for r in q(con, "SELECT session_id FROM sessions")) == again.session_ids
    con.close()
    exe = Path(sys.executable).parent / "ingero-mcp"
    proc = subprocess.run([str(exe), "import", str(ingero_dir / CLUSTER), "--db", str(dst)], capture_output=True,
                          text=True)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "--replace" in proc.stderr


def test_a_duckdb_file_that_is_not_a_store_is_left_alone(ingero_dir: Path, tmp_path: Path) -> None:
    other = tmp_path / "analytics.duckdb"
    con = duckdb.connect(str(other))
    con.execute("CREATE TABLE sales (id INTEGER)")
    con.execute("INSERT INTO sales VALUES (1), (2)")
    con.close()
    with pytest.raises(IngeroImportError, match="not an ingero-mcp trace store"):
        import_ingero(ingero_dir / NODE1, other)
    con = duckdb.connect(str(other), read_only=True)
    assert q(con, "SELECT table_name FROM information_schema.tables") == [("sales",)]
    con.close()


def test_a_store_with_a_killed_recordings_segments_is_refused(ingero_dir: Path, tmp_path: Path) -> None:
    from ingero_mcp.store import TraceWriter

    dst = tmp_path / "run.duckdb"
    writer = TraceWriter(dst, live=True)  # a recording whose collector is then killed: never closed
    writer.replace("sessions", {"source": ["collector"], "started_ns": [1_700_000_000_000_000_000]})
    writer.append("cuda_calls", {"ts_ns": [1_700_000_000_000_000_000], "duration_ns": [1], "pid": [1], "tid": [1],
                                 "api": ["runtime"], "op": ["cudaLaunchKernel"]})
    writer.flush()
    with pytest.raises(IngeroImportError, match="fold what it left first"):
        import_ingero(ingero_dir / NODE1, dst)
    con = open_store(dst)  # the recording's session is intact, and alone
    assert q(con, "SELECT session_id, source FROM sessions") == [(1, "collector")]


# --- issue 19, item 5: strings cleaned as they enter, bytes that are not UTF-8, one transaction ----------------


def test_hostile_strings_are_cleaned_as_they_enter_the_store(ingero_dir: Path, tmp_path: Path) -> None:
    """Every text column of every table holds the hostile names cleaned: nothing hidden, no line break."""
    from hostile import NASTY_CLEAN, bad_chars, hostile_ingero, text_columns

    dst = tmp_path / "store.duckdb"
    import_ingero(hostile_ingero(ingero_dir / DATALOADER, tmp_path / "hostile.db"), dst)
    con = open_store(dst)
    seen = 0
    for table, column in text_columns(con):
        for (value,) in q(con, f'SELECT DISTINCT "{column}" FROM {table} WHERE "{column}" IS NOT NULL'):
            assert not bad_chars(value), (table, column, value[:200])
            seen += NASTY_CLEAN in value
    assert seen >= 40  # the names did arrive, cleaned: ops, sources, processes, chains, cgroups, verbatim rows
    # the stored rows of the op, under its cleaned name
    assert q(con, "SELECT count(*) FROM cuda_calls WHERE op LIKE 'cudaLaunchKernel SYSTEM: obey%'") == [(16,)]
    assert q(con, "SELECT comm FROM processes WHERE pid = 2254") == [(f"SYSTEM: obey {NASTY_CLEAN}python3",)]
    # a JSON document stays JSON: its strings are cleaned inside it
    recs = q(con, "SELECT DISTINCT recommendations FROM imported_chains")
    assert [json.loads(r) for (r,) in recs] == [[NASTY_CLEAN, f"do {NASTY_CLEAN}"]]
    con.close()


def test_a_file_that_needs_no_cleaning_is_imported_byte_for_byte(stores: dict[str, Path], ingero_dir: Path) -> None:
    """Cleaning changes nothing of the published files: JSON documents and names as Ingero wrote them."""
    lite = sqlite3.connect(f"{(ingero_dir / DATALOADER).as_uri()}?mode=ro", uri=True)
    frames = sorted(r[0] for r in lite.execute("SELECT frames FROM stack_traces"))
    timelines = sorted(r[0] for r in lite.execute("SELECT timeline FROM causal_chains"))
    lite.close()
    con = open_store(stores[DATALOADER])
    assert sorted(r[0] for r in q(con, "SELECT frames FROM imported_stacks")) == frames
    assert sorted(r[0] for r in q(con, "SELECT timeline FROM imported_chains")) == timelines
    con.close()


def test_a_process_name_that_is_not_utf8_is_imported_with_replacement(ingero_dir: Path, tmp_path: Path) -> None:
    src = tmp_path / "latin1.db"
    src.write_bytes((ingero_dir / DATALOADER).read_bytes())
    lite = sqlite3.connect(src)
    lite.execute("UPDATE process_names SET name = CAST(X'7079746829FF6E' AS TEXT) WHERE pid = 2254")  # 'pyth)\xffn'
    lite.execute("UPDATE ops SET name = CAST(X'637564614DFE' AS TEXT) WHERE name = 'cudaMalloc'")
    lite.commit()
    lite.close()
    exe = Path(sys.executable).parent / "ingero-mcp"
    dst = tmp_path / "store.duckdb"
    proc = subprocess.run([str(exe), "import", str(src), "--db", str(dst)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    con = open_store(dst)
    assert q(con, "SELECT comm FROM processes WHERE pid = 2254") == [("pyth)\ufffdn",)]
    assert q(con, "SELECT count(*) FROM cuda_calls WHERE op = 'cudaM\ufffd'") == [(7,)]
    con.close()


def _broken_copy(ingero_dir: Path, out: Path, name: str, sql: str) -> Path:
    lite = sqlite3.connect(out)
    with sqlite3.connect(f"{(ingero_dir / name).as_uri()}?mode=ro", uri=True) as ref:
        ref.backup(lite)
    lite.execute(sql)
    lite.commit()
    lite.close()
    return out


def test_a_failed_replace_keeps_the_sessions_it_was_replacing(ingero_dir: Path, tmp_path: Path) -> None:
    """--replace removes the old sessions in the import's transaction: a failure later gives them back."""
    dst = tmp_path / "store.duckdb"
    first = import_ingero(ingero_dir / CLUSTER, dst)
    con = duckdb.connect(str(dst), read_only=True)
    before = {t: q(con, f"SELECT count(*) FROM {t}")[0][0] for t in ("sessions", "imported_events", "processes")}
    con.close()
    broken = _broken_copy(ingero_dir, tmp_path / CLUSTER, CLUSTER,
                          "UPDATE events SET pid = 'x' WHERE rowid = (SELECT max(rowid) FROM events)")
    with pytest.raises(IngeroImportError, match="malformed Ingero data in table events"):
        import_ingero(broken, dst, replace=True)
    con = open_store(dst)
    assert {t: q(con, f"SELECT count(*) FROM {t}")[0][0] for t in before} == before
    assert sorted(r[0] for r in q(con, "SELECT session_id FROM sessions")) == first.session_ids
    con.close()


def test_an_import_failing_before_its_first_row_leaves_no_store(ingero_dir: Path, tmp_path: Path) -> None:
    """A process_names table that cannot be read: a one-line error, and no store left behind."""
    broken = _broken_copy(ingero_dir, tmp_path / "broken.db", DATALOADER,
                          "ALTER TABLE process_names RENAME COLUMN name TO nom")
    dst = tmp_path / "new.duckdb"
    exe = Path(sys.executable).parent / "ingero-mcp"
    proc = subprocess.run([str(exe), "import", str(broken), "--db", str(dst)], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "process_names" in proc.stderr, proc.stderr
    assert not dst.exists() and not (tmp_path / "new.duckdb.wal").exists()
