"""Stores that open but are damaged give one clear line naming what is wrong (explain, the MCP server),
never a traceback; explain's output survives a closed pipe; windowed shares say 'of the window'."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import duckdb
import pytest
from analysis_fixtures import contention_store
from mcp import Client, StdioServerParameters
from paths import REPO

from ingero_mcp.mcp.server import build_server
from ingero_mcp.store import SCHEMA_VERSION

H200 = REPO / "investigations" / "h200-seed-benchmark-v1.duckdb"
EXPLAIN = [sys.executable, "-m", "ingero_mcp.cli", "explain", "--db"]

DAMAGE: dict[str, tuple[str, str]] = {
    "missing table": ("DROP TABLE snapshots", "table snapshots is missing"),
    "missing column": ("ALTER TABLE cuda_calls DROP COLUMN duration_ns", "table cuda_calls has no column duration_ns"),
    "wrong type": ("ALTER TABLE processes ALTER pid TYPE VARCHAR",
                   f"processes.pid is VARCHAR, schema v{SCHEMA_VERSION} says INTEGER"),
    "ts_ns near INT64 max": ("UPDATE cuda_calls SET ts_ns = 9223372036854775000 WHERE duration_ns > 20000000",
                             "cuda_calls.ts_ns holds 9,223,372,036,854,775,000"),
}


@pytest.fixture(scope="module")
def pristine(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return contention_store(tmp_path_factory.mktemp("damage") / "pristine.duckdb")


def damaged(pristine: Path, folder: Path, sql: str) -> Path:
    db = folder / "damaged.duckdb"
    shutil.copyfile(pristine, db)
    con = duckdb.connect(str(db))
    con.execute(sql)
    con.close()
    return db


@pytest.mark.parametrize("kind", sorted(DAMAGE))
def test_explain_names_the_damage_in_one_line(pristine: Path, tmp_path: Path, kind: str) -> None:
    sql, says = DAMAGE[kind]
    db = damaged(pristine, tmp_path, sql)
    for extra in ([], ["--json"], ["--per-process"]):
        proc = subprocess.run([*EXPLAIN, str(db), *extra], capture_output=True, text=True, timeout=120)
        assert proc.returncode == 2, (kind, proc.stdout[-500:], proc.stderr[-2000:])
        assert "Traceback" not in proc.stderr
        assert proc.stderr.count("\n") == 1 and says in proc.stderr, proc.stderr


@pytest.mark.parametrize("kind", sorted(DAMAGE))
async def test_mcp_names_the_damage_at_start_and_in_tools(pristine: Path, tmp_path: Path, kind: str) -> None:
    """Damaged while served, or before the server starts: the server runs (it exited at start, and the client saw
    "Connection closed"), lists its tools, and each one names the damage in one line, in both halves."""
    sql, says = DAMAGE[kind]
    db = tmp_path / "served.duckdb"
    shutil.copyfile(pristine, db)
    server = build_server(db, reopen_min_s=0.0)
    try:
        async with Client(server) as client:
            assert not (await client.call_tool("get_trace_stats", {})).is_error
            shutil.copyfile(_damaged_copy(pristine, tmp_path, sql), db)  # the store is replaced on disk
            results = [await client.call_tool(name, {})
                       for name in ("get_trace_stats", "get_causal_chains", "get_trace_info")]
    finally:
        server.store.close()
    stdio = StdioServerParameters(command=sys.executable, args=["-m", "ingero_mcp.cli", "mcp", "--db",
                                                                str(_damaged_copy(pristine, tmp_path, sql))], cwd=REPO)
    async with Client(stdio) as client:
        tools = [t.name for t in (await client.list_tools()).tools]
        results += [await client.call_tool(name, {}) for name in ("get_trace_stats", "get_time_accounting")]
        results.append(await client.call_tool("run_sql", {"sql": "SELECT 1"}))
    assert len(tools) == 11
    for result in results:
        text = result.content[0].text
        assert result.is_error and says in text and "\n" not in text, text
        assert result.structured_content["error"] == text and result.structured_content["notes"] == [text]


def _damaged_copy(pristine: Path, tmp_path: Path, sql: str) -> Path:
    folder = tmp_path / "copy"
    folder.mkdir(exist_ok=True)
    return damaged(pristine, folder, sql)


def test_a_closed_pipe_ends_explain_quietly() -> None:
    proc = subprocess.Popen([*EXPLAIN, str(H200), "--json"], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout is not None and proc.stderr is not None
    head = proc.stdout.read(100)  # `| head -c 100`
    proc.stdout.close()
    err = proc.stderr.read().decode()
    proc.wait(timeout=120)
    assert head.startswith(b"{")
    assert "Traceback" not in err and "BrokenPipeError" not in err, err
    assert proc.returncode == 0


def test_a_window_s_report_speaks_of_the_window() -> None:
    """With --since, the accounting covers the window only, and every chain's window lies inside it."""
    proc = subprocess.run([*EXPLAIN, str(H200), "--since", "25s", "--json"], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    w = report["window"]
    assert w["end_ns"] - w["start_ns"] <= 25_000_000_000
    for thread in report["accounting"]["threads"]:
        assert thread["total"]["wall_ns"] <= 26_000_000_000
    for chain in report["chains"]:
        if chain.get("window"):
            assert (w["start_ns"] - 1_000_000_000 <= chain["window"]["start_ns"] <= chain["window"]["end_ns"]
                    <= w["end_ns"] + 1)
