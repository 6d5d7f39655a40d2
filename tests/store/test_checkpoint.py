"""A live recording's checkpoint (store/checkpoint.py): a finished copy of the recording so far, made by a child of
the writer, from which a reader that starts late answers at once. It must say what the recording says."""

from __future__ import annotations

import logging
import time
from pathlib import Path

import duckdb
import pytest
from paths import REPO

from ingero_mcp.analysis import diagnose, store_derived
from ingero_mcp.store import TraceWriter, fold_segments, open_store
from ingero_mcp.store.checkpoint import (
    CHECKPOINT_MAX_FAILURES,
    Checkpointer,
    checkpoint_dir,
    latest_checkpoint,
    open_checkpoint,
    write_checkpoint,
)
from ingero_mcp.store.schema import DERIVED_PREFIX, REPLACE_TABLES, TABLES

BUNDLED = REPO / "investigations" / "h200-seed-benchmark.duckdb"


def recorded_rows() -> dict[str, object]:
    """Every base table of the bundled H200 trace, as Arrow, without its session's id and end."""
    src = duckdb.connect(str(BUNDLED), read_only=True)
    try:
        rows = {}
        for table in TABLES:
            if table.startswith(DERIVED_PREFIX):
                continue
            drop = "session_id, stopped_ns" if table == "sessions" else "session_id"
            got = src.sql(f"SELECT * EXCLUDE ({drop}) FROM {table}").to_arrow_table()
            if got.num_rows:
                rows[table] = got
        return rows
    finally:
        src.close()


def write_half(writer: TraceWriter, rows: dict[str, object], half: int, only: set[str] | None = None) -> None:
    """The first or second half of every appended table's rows (`only` these) as one flush (the latest-state tables
    each time)."""
    for table, arrow in rows.items():
        if only is not None and table not in only:
            continue
        if table in REPLACE_TABLES:
            writer.replace(table, arrow)
            continue
        cut = arrow.num_rows // 2  # type: ignore[attr-defined]
        part = arrow.slice(0, cut) if half == 0 else arrow.slice(cut)  # type: ignore[attr-defined]
        if part.num_rows:
            writer.append(table, part)
    writer.flush()


def report(con: duckdb.DuckDBPyConnection) -> str:
    try:
        return diagnose(con).model_dump_json()
    finally:
        con.close()


def test_a_checkpoint_says_what_the_recording_says_and_grows_by_the_newer_segments(tmp_path: Path) -> None:
    rows = recorded_rows()
    db = tmp_path / "live.duckdb"
    writer = TraceWriter(db, live=True)
    write_half(writer, rows, 0)
    first = write_checkpoint(db, store_derived)
    assert first is not None and latest_checkpoint(db) == (first, int(first.stem))
    assert write_checkpoint(db, store_derived) == first  # nothing newer: the same file, not made again
    # newer host-wide rows alone (the calls and intervals as they were, which key the recorded answers)
    host = {"host_aggregates", "snapshots", "process_events"}
    write_half(writer, rows, 1, only=host)
    between = write_checkpoint(db, store_derived)
    assert between is not None and between != first
    assert report(open_store(between)) == report(open_store(db))
    write_half(writer, rows, 1, only=set(rows) - host)
    second = write_checkpoint(db, store_derived)  # from a copy of the one before, the newer segments added
    assert second is not None and int(second.stem) > int(between.stem)
    assert not first.exists() and sorted(p.name for p in checkpoint_dir(db).glob("*.duckdb")) == [second.name]

    found = open_checkpoint(db)
    assert found is not None
    con, seq, note = found
    assert seq == int(second.stem) and "no segment is newer" in note
    calls = rows["cuda_calls"].num_rows  # type: ignore[attr-defined]
    assert con.execute("SELECT count(*) FROM cuda_calls").fetchall()[0][0] == calls
    # finished as the fold finishes a store: the accounting's rows and the whole trace's answers stored
    assert con.execute("SELECT count(*) FROM acct_answers").fetchall()[0][0] > 0
    assert report(con) == report(open_store(db))  # every word and number the same as the recording's own

    writer.append("cuda_calls", rows["cuda_calls"].slice(0, 3))  # type: ignore[attr-defined]
    writer.flush()
    found = open_checkpoint(db)
    assert found is not None and "1 newer segment(s) are being read" in found[2]
    found[0].close()
    writer.close()  # the fold: the checkpoint goes with the segments
    assert not checkpoint_dir(db).exists()
    assert open_store(db).execute("SELECT count(*) FROM cuda_calls").fetchall()[0][0] == calls + 3


def test_the_writer_keeps_checkpoints_in_a_child_and_says_why_one_failed(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    rows = recorded_rows()
    db = tmp_path / "live.duckdb"
    writer = TraceWriter(db, live=True, derive=store_derived, checkpoints=True)
    assert writer.checkpointer is not None
    writer.checkpointer.min_s = writer.checkpointer.factor = 0.0
    write_half(writer, rows, 0)  # the flush starts the child
    deadline = time.monotonic() + 120
    while writer.checkpointer.made == 0 and writer.checkpointer.failed == 0 and time.monotonic() < deadline:
        time.sleep(0.2)
        writer.checkpointer.poll()
    assert writer.checkpointer.made == 1 and writer.checkpointer.last_cost_s > 0
    assert writer.checkpointer.cpu_s > 0  # the child's CPU, the recording's cost too (the session's notes)
    assert latest_checkpoint(db) is not None
    writer.close()
    assert not checkpoint_dir(db).exists()

    failing = tmp_path / "failing.duckdb"
    checkpointer = Checkpointer(failing, len, min_s=0.0, factor=0.0)  # len(connection): a TypeError in the child
    other = TraceWriter(failing, live=True)
    write_half(other, rows, 0)
    checkpointer.poll()
    deadline = time.monotonic() + 120
    with caplog.at_level(logging.WARNING, logger="ingero_mcp.store"):
        while checkpointer.failed == 0 and time.monotonic() < deadline:
            time.sleep(0.2)
            checkpointer.poll()
    assert checkpointer.failed == 1 and checkpointer.made == 0
    assert "TypeError" in caplog.text and latest_checkpoint(failing) is None
    assert [p.name for p in checkpoint_dir(failing).glob("*.duckdb*")] == []  # its half-made file removed
    with caplog.at_level(logging.WARNING, logger="ingero_mcp.store"):
        while checkpointer.failed < CHECKPOINT_MAX_FAILURES and time.monotonic() < deadline:
            time.sleep(0.2)
            checkpointer.poll()
    assert checkpointer.failed == CHECKPOINT_MAX_FAILURES and "no more will be tried" in caplog.text
    checkpointer.poll()  # failing every time: no child is started again
    assert checkpointer._child is None and checkpointer.failed == CHECKPOINT_MAX_FAILURES
    other.close()


def test_a_checkpoint_of_segments_that_are_gone_is_not_served(tmp_path: Path) -> None:
    rows = recorded_rows()
    db = tmp_path / "live.duckdb"
    writer = TraceWriter(db, live=True)
    write_half(writer, rows, 0)
    made = write_checkpoint(db, store_derived)
    assert made is not None and open_checkpoint(db) is not None
    made.rename(made.with_name(f"{int(made.stem) + 1000:09d}.duckdb"))  # beyond every segment there is
    assert latest_checkpoint(db) is not None and open_checkpoint(db) is None
    # a recording started again on the path (the one before never folded) keeps none of the checkpoints before it
    TraceWriter(db, live=True)
    assert not checkpoint_dir(db).exists()


def test_a_stop_ends_a_checkpoint_under_way_and_the_fold_leaves_nothing(tmp_path: Path) -> None:
    rows = recorded_rows()
    db = tmp_path / "live.duckdb"
    writer = TraceWriter(db, live=True, derive=store_derived, checkpoints=True)
    assert writer.checkpointer is not None
    writer.checkpointer.min_s = writer.checkpointer.factor = 0.0
    write_half(writer, rows, 0)  # a child started
    write_half(writer, rows, 1)
    assert writer.checkpointer._child is not None  # still under way (a checkpoint takes a second or more)
    writer.close()  # ends it before the fold (the fold takes the store file's write lock)
    assert writer.checkpointer is None and writer.checkpoints_cpu_s > 0
    assert not checkpoint_dir(db).exists()
    assert fold_segments(db) == 0
    calls = rows["cuda_calls"].num_rows  # type: ignore[attr-defined]
    assert open_store(db).execute("SELECT count(*) FROM cuda_calls").fetchall()[0][0] == calls
