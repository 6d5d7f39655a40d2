"""save_picture: the assistant hands the user a picture of the chain it found (HTML report or Perfetto file)."""

from __future__ import annotations

from pathlib import Path

import pytest
from mcp import Client
from perfetto.protos.perfetto.trace import perfetto_trace_pb2 as pb

from ingero_mcp.demo.scenarios import generate
from ingero_mcp.mcp.server import build_server


@pytest.fixture(scope="module")
def demo_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("pic") / "dataloader.duckdb"
    generate("dataloader", path, scale=0.3)
    return path


async def test_pictures_of_a_chain(demo_store: Path, tmp_path: Path) -> None:
    out_dir = tmp_path / "pictures"
    server = build_server(demo_store, out_dir=out_dir)
    try:
        async with Client(server) as client:
            chains = (await client.call_tool("get_causal_chains", {"top_n": 3})).structured_content["chains"]
            chain = next(c for c in chains if c.get("window"))
            report = await client.call_tool("save_picture", {"kind": "report", "chain_id": chain["id"]})
            timeline = await client.call_tool("save_picture", {"kind": "perfetto", "chain_id": chain["id"], "since": "60s"})
            whole = await client.call_tool("save_picture", {})
            missing = await client.call_tool("save_picture", {"chain_id": "no-such-chain"})
            bad = await client.call_tool("save_picture", {"kind": "svg"})
    finally:
        server.store.close()
    assert not report.is_error and not timeline.is_error and not whole.is_error
    got = report.structured_content
    html = Path(got["path"])
    assert html.parent == out_dir and html.suffix == ".html" and got["uri"] == html.resolve().as_uri()
    assert got["chain_id"] == chain["id"] and got["window"]["start_ns"] == chain["window"]["start_ns"]
    assert got["bytes"] == html.stat().st_size and "<canvas" in html.read_text()
    assert str(html) in report.content[0].text
    pf = Path(timeline.structured_content["path"])
    trace = pb.Trace()
    trace.ParseFromString(pf.read_bytes())
    slices = sum(p.track_event.type == pb.TrackEvent.TYPE_SLICE_BEGIN for p in trace.packet)
    counts = timeline.structured_content["counts"]
    assert slices == counts["call_slices"] + counts["state_slices"] + counts["chains"] > 0
    # a chain's window is part of the trace: its timeline holds fewer calls than the whole one would
    assert whole.structured_content["path"] != got["path"]
    assert missing.is_error and "no chain" in missing.content[0].text
    assert bad.is_error
    assert all(p.parent == out_dir for p in out_dir.iterdir())
