"""An MCP server started on a recording that has a checkpoint (store/checkpoint.py) answers from it at once, every
answer saying so in both halves, while it reads the whole recording; then it answers from that, without the note."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from analysis_fixtures import MS, T0
from mcp import Client
from mcp_types import CallToolResult

from ingero_mcp.analysis import store_derived
from ingero_mcp.mcp.server import build_server
from ingero_mcp.store import TraceWriter
from ingero_mcp.store.checkpoint import write_checkpoint


def launches(n: int, start: int) -> dict[str, list[Any]]:
    return {"ts_ns": [T0 + (start + i) * MS for i in range(n)], "duration_ns": [50_000] * n, "pid": [42] * n,
            "tid": [42] * n, "api": ["runtime"] * n, "op": ["cudaLaunchKernel"] * n}


def said(result: CallToolResult) -> tuple[int, bool, bool]:
    """The calls a get_trace_stats result counts, and whether each half says it came from a checkpoint."""
    assert not result.is_error and result.structured_content is not None
    notes = " ".join(result.structured_content.get("notes", []))
    return (result.structured_content["calls"], "recording's checkpoint" in notes,
            "recording's checkpoint" in result.content[0].text)  # type: ignore[union-attr]


async def test_a_server_started_late_answers_from_the_checkpoint_then_from_the_whole_recording(
        tmp_path: Path) -> None:
    db = tmp_path / "live.duckdb"
    writer = TraceWriter(db, live=True)
    writer.replace("sessions", {"source": ["collector"], "started_ns": [T0]})
    writer.append("cuda_calls", launches(10, 0))
    writer.flush()
    made = write_checkpoint(db, store_derived)
    assert made is not None
    writer.append("cuda_calls", launches(5, 10))  # newer than the checkpoint
    writer.flush()

    server = build_server(db)
    async with Client(server) as client:
        first = said(await client.call_tool("get_trace_stats", {}))
        sql = await client.call_tool("run_sql", {"sql": "SELECT count(*) FROM cuda_calls"})
        assert server.store.served_checkpoint == int(made.stem)
        rereading = server.store._rereading
        if rereading is not None:
            rereading.join(60)
        after = said(await client.call_tool("get_trace_stats", {}))
    server.store.close()
    writer.close()
    # The first answer came from the checkpoint (10 calls, both halves say so), or from the whole recording where its
    # re-read was already done (15, neither says so): never the one without the note.
    assert first in ((10, True, True), (15, False, False))
    assert after == (15, False, False)
    # run_sql asks its own process, which reads the whole recording: no checkpoint note there
    assert sql.structured_content is not None and sql.structured_content["rows"] == [[15]]
    assert not any("checkpoint" in n for n in sql.structured_content.get("notes", []))
