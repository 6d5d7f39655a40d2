"""One bad segment must not break the store: a killed recording's folder holding a partial, an empty,
a garbage and two wrong-schema Parquet files, a folder named .parquet and an unknown table's folder
still reads (explain, the MCP server) with the rest, and folds, the bad entries moved aside."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from analysis_fixtures import MS, T0
from mcp import Client

from ingero_mcp.mcp.server import build_server
from ingero_mcp.store import TraceWriter, fold_segments, open_store, segment_dir
from ingero_mcp.store.segments import quarantine_dir

GOOD_CALLS = 30
BAD = {
    "cuda_calls/000000900.parquet": "partial",
    "cuda_calls/000000901.parquet": "empty",
    "cuda_calls/000000902.parquet": "garbage",
    "cuda_calls/000000903.parquet": "unknown column",
    "cuda_calls/000000904.parquet": "wrong type",
    "snapshots/000000905.parquet": "a folder",
    "no_such_table": "unknown table folder",
}


def calls(n: int, start: int) -> dict[str, list[Any]]:
    return {"ts_ns": [T0 + (start + i) * MS for i in range(n)], "duration_ns": [50_000] * n, "pid": [42] * n,
            "tid": [42] * n, "api": ["runtime"] * n, "op": ["cudaLaunchKernel"] * n}


def killed_recording_with_bad_segments(db: Path) -> Path:
    """A live recording never closed (its collector was killed), then the bad entries added beside its segments."""
    writer = TraceWriter(db, live=True)
    writer.replace("sessions", {"source": ["collector"], "started_ns": [T0]})
    for k in range(3):
        writer.append("cuda_calls", calls(10, 10 * k))
        writer.flush()
    segments = segment_dir(db)
    good = sorted((segments / "cuda_calls").glob("0*.parquet"))[0].read_bytes()
    (segments / "cuda_calls" / "000000900.parquet").write_bytes(good[: len(good) // 2])
    (segments / "cuda_calls" / "000000901.parquet").write_bytes(b"")
    (segments / "cuda_calls" / "000000902.parquet").write_bytes(os.urandom(4096))
    pq.write_table(pa.table({"not_a_column": [1, 2]}), segments / "cuda_calls" / "000000903.parquet")
    pq.write_table(pa.table({"ts_ns": ["yesterday"], "duration_ns": ["long"], "pid": [1], "tid": [1], "api": ["x"],
                             "op": ["y"], "session_id": [1]}), segments / "cuda_calls" / "000000904.parquet")
    (segments / "snapshots" / "000000905.parquet").mkdir(parents=True)
    (segments / "no_such_table").mkdir()
    pq.write_table(pa.table({"x": [1]}), segments / "no_such_table" / "000000001.parquet")
    return db


@pytest.fixture
def db(tmp_path: Path) -> Path:
    return killed_recording_with_bad_segments(tmp_path / "run.duckdb")


def test_explain_reads_the_rest_and_says_what_it_skipped(db: Path) -> None:
    exe = [sys.executable, "-m", "ingero_mcp.cli", "explain", "--db", str(db)]
    proc = subprocess.run(exe, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr
    text = " ".join(proc.stdout.split())  # wrapped to the width
    assert f"{len(BAD)} unreadable segment(s) skipped" in text  # the unknown table's folder is one entry
    as_json = json.loads(subprocess.run([*exe, "--json"], capture_output=True, text=True, timeout=120).stdout)
    assert as_json["info"]["row_counts"]["cuda_calls"] == GOOD_CALLS
    assert any("unreadable segment(s) skipped" in n for n in as_json["notes"])


async def test_the_mcp_server_starts_and_answers_with_the_rest(db: Path) -> None:
    server = build_server(db)
    try:
        async with Client(server) as client:
            stats = await client.call_tool("get_trace_stats", {})
            info = await client.call_tool("get_trace_info", {})
    finally:
        server.store.close()
    assert not stats.is_error and stats.structured_content["calls"] == GOOD_CALLS
    assert any("unreadable segment(s) skipped" in n for n in info.structured_content["notes"])


def test_the_fold_moves_bad_segments_aside_and_folds_the_rest(db: Path) -> None:
    bad: list[tuple[Path, str]] = []
    folded = fold_segments(db, bad)
    assert folded >= GOOD_CALLS
    assert not segment_dir(db).exists()
    quarantined = {str(p.relative_to(quarantine_dir(db))) for p, _ in bad}
    assert quarantined == set(BAD), (quarantined, [r for _, r in bad])
    assert all(reason for _, reason in bad)
    for rel in BAD:
        assert (quarantine_dir(db) / rel).exists()  # kept for inspection, not deleted
    con = open_store(db)
    try:
        assert con.execute("SELECT count(*) FROM cuda_calls").fetchall()[0][0] == GOOD_CALLS
        assert con.execute("SELECT source FROM sessions").fetchall() == [("collector",)]
    finally:
        con.close()


def test_segments_are_flushed_to_disk_before_the_rename(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The order of the real calls: every segment's temporary file is fsynced just before its rename, so a final
    name never holds a partial file. (The folder is not synced: a lost rename leaves a temporary name, ignored.)"""
    events: list[tuple[str, str]] = []
    real_fsync, real_replace, real_open = os.fsync, os.replace, os.open
    names: dict[int, str] = {}

    def spy_open(path: Any, flags: int, *args: Any, **kw: Any) -> int:
        fd = real_open(path, flags, *args, **kw)
        names[fd] = os.fspath(path)
        return fd

    def spy_fsync(fd: int) -> None:
        events.append(("fsync", names.get(fd, "?")))
        real_fsync(fd)

    def spy_replace(src: Any, dst: Any) -> None:
        events.append(("replace", os.fspath(src)))
        real_replace(src, dst)

    monkeypatch.setattr(os, "open", spy_open)
    monkeypatch.setattr(os, "fsync", spy_fsync)
    monkeypatch.setattr(os, "replace", spy_replace)
    writer = TraceWriter(tmp_path / "live.duckdb", live=True)
    writer.append("cuda_calls", calls(5, 0))
    writer.flush()
    monkeypatch.undo()
    writer.close()
    renames = [i for i, e in enumerate(events) if e[0] == "replace"]
    assert renames
    for i in renames:
        assert events[i - 1] == ("fsync", events[i][1])  # the data, before its name
