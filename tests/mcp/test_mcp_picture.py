"""save_picture: the assistant hands the user a picture of the chain it found (HTML report or Perfetto file)."""

from __future__ import annotations

import shutil
from pathlib import Path

import duckdb
import pytest
from mcp import Client
from perfetto.protos.perfetto.trace import perfetto_trace_pb2 as pb

from ingero_mcp.demo.scenarios import generate
from ingero_mcp.mcp.server import build_server
from ingero_mcp.store.views import view_sql


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
            timeline = await client.call_tool("save_picture",
                                              {"kind": "perfetto", "chain_id": chain["id"], "since": "60s"})
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


# --- issue 19, item 6: save_picture says why it could not write --------------------------------------------

async def test_a_picture_that_cannot_be_written_says_why(demo_store: Path, tmp_path: Path) -> None:
    """It answered a bare "Error executing tool" when --out-dir had become a file or the store held a thread state
    no writer knows. Now: the reason, in one line, in both halves; a folder that vanished is made again."""
    out_dir = tmp_path / "pictures"
    damaged = tmp_path / "bogus-state.duckdb"
    nulls = tmp_path / "null-start.duckdb"
    shutil.copyfile(demo_store, damaged)
    shutil.copyfile(demo_store, nulls)
    for copy, damage in ((damaged, "UPDATE acct_thread_state SET state = 'bogus' WHERE state = 'sleeping'"),
                         (nulls, "UPDATE acct_thread_state SET start_ns = NULL WHERE tid % 2 = 0")):
        with duckdb.connect(str(copy)) as con:  # thread states stored (as a v3-v7 fold did), one changed by hand
            con.execute(view_sql("thread_state"))
            con.execute("INSERT INTO acct_thread_state BY NAME SELECT * FROM thread_state")
            con.execute(damage)
    server = build_server(demo_store, out_dir=out_dir)
    bogus = build_server(damaged, out_dir=out_dir)
    null = build_server(nulls, out_dir=out_dir)
    try:
        async with Client(server) as client:
            first = await client.call_tool("save_picture", {"kind": "perfetto"})
            shutil.rmtree(out_dir)
            vanished = await client.call_tool("save_picture", {"kind": "perfetto"})
            remade = Path(vanished.structured_content["path"]).is_file()
            shutil.rmtree(out_dir)
            out_dir.write_text("a file where the folder was\n")
            blocked = await client.call_tool("save_picture", {"kind": "report"})
            out_dir.unlink()
        async with Client(bogus) as client:
            state = await client.call_tool("save_picture", {"kind": "perfetto"})
        async with Client(null) as client:
            unexpected = await client.call_tool("save_picture", {"kind": "report"})
    finally:
        for each in (server, bogus, null):
            each.store.close()
    assert not first.is_error and not vanished.is_error and remade
    for result, says in ((blocked, f"cannot write the picture in {out_dir} (mcp --out-dir): File exists"),
                         (state, "the trace's thread states hold an unknown state 'bogus'"),
                         (unexpected, "could not write the report: TypeError: ")):
        text = result.content[0].text
        assert result.is_error and says in text and "\n" not in text, text
        assert result.structured_content["error"] == text and result.structured_content["notes"] == [text]
    assert sorted(p.name for p in out_dir.iterdir()) == [], "no half-written picture is left"
