"""Tool and prompt arguments: windows, unknown names refused, Ingero's names, bad pids answered as
INVALID_PARAMS, ATTACH of the store itself refused, resources that exist, a slow query that does
not hold up the other tools."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import anyio
import duckdb
import pytest
from analysis_fixtures import contention_store
from mcp import Client, MCPError
from mcp_types import INVALID_PARAMS

from ingero_mcp.demo.scenarios import EXPECTED, generate
from ingero_mcp.mcp.server import build_server

TOOLS_ARGS: dict[str, dict[str, Any]] = {
    "get_trace_stats": {}, "get_causal_chains": {}, "get_per_process_breakdown": {}, "get_timeline": {},
    "get_system_context": {}, "get_trace_info": {}, "run_sql": {"sql": "SELECT 1"},
    "get_evidence_sql": {"chain_id": "ingero-mcp:cudaStreamSynchronize"}, "save_picture": {},
    "get_stacks": {"pid": 100},
}


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return contention_store(tmp_path_factory.mktemp("args") / "contention.duckdb")


@pytest.fixture(scope="module")
def demo_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("args") / "dataloader.duckdb"
    generate("dataloader", path)
    return path


async def session(db: Path, fn: Any, **server_kw: Any) -> Any:
    server = build_server(db, **server_kw)
    try:
        async with Client(server) as client:
            return await fn(client)
    finally:
        server.store.close()


@pytest.mark.parametrize("name", sorted(TOOLS_ARGS))
async def test_unknown_arguments_are_refused_by_every_tool(store: Path, name: str) -> None:
    async def go(client: Client) -> Any:
        listed = {t.name: t for t in (await client.list_tools()).tools}
        return listed[name], await client.call_tool(name, TOOLS_ARGS[name] | {"start": "+1s", "end": "+2s"})

    tool, result = await session(store, go)
    assert tool.input_schema.get("additionalProperties") is False
    assert result.is_error
    text = result.content[0].text
    assert 'unknown argument(s) "end", "start"' in text and f"{name} takes" in text


async def test_timeline_takes_a_from_to_window(store: Path) -> None:
    async def go(client: Client) -> Any:
        return await client.call_tool("get_timeline", {"pid": 100, "from": "+5s", "to": "+5.5s", "limit": 1000})

    got = (await session(store, go)).structured_content["timeline"]
    assert got["window"]["end_ns"] - got["window"]["start_ns"] == 500_000_000
    assert got["window"]["start_at"] == "+5.000000 s"
    assert got["entries"] and all(got["window"]["start_ns"] <= e["ts_ns"] <= got["window"]["end_ns"]
                                  for e in got["entries"])


async def test_without_around_snapshots_do_not_fill_the_limit(demo_store: Path) -> None:
    pid = EXPECTED["dataloader"].pid

    async def go(client: Client) -> Any:
        return await client.call_tool("get_timeline", {"pid": pid, "limit": 20})

    entries = (await session(demo_store, go)).structured_content["timeline"]["entries"]
    assert len(entries) == 20
    kinds = [e["kind"] for e in entries]
    assert kinds.count("snapshot") < 10 and {"cuda", "sched"} & set(kinds), kinds


@pytest.mark.parametrize(
    ("args", "says"),
    [
        ({"pid": "\u00b2"}, "pid must be a process id"),
        ({"pid": "9" * 5000}, "pid must be a process id"),
        ({"pid": "100", "verbose": "yes"}, 'unknown argument(s) "verbose"'),
        ({"pid": "4242"}, "pid 4242 is not in this trace; pids with CUDA calls: 100"),
    ],
)
async def test_investigate_prompt_refuses_bad_arguments_as_invalid_params(store: Path, args: dict[str, str],
                                                                          says: str) -> None:
    async def go(client: Client) -> Any:
        with pytest.raises(MCPError) as caught:
            await client.get_prompt("investigate", args)
        return caught.value

    error = await session(store, go)
    assert error.error.code == INVALID_PARAMS and says in error.error.message, error.error.message


async def test_investigate_prompt_arguments_are_described_and_a_known_pid_works(store: Path) -> None:
    async def go(client: Client) -> Any:
        return (await client.list_prompts()).prompts[0], await client.get_prompt("investigate", {"pid": "100"})

    prompt, got = await session(store, go)
    assert all(a.description for a in prompt.arguments or [])
    assert "process 100" in got.messages[0].content.text


async def test_run_sql_takes_ingeros_query_name(store: Path) -> None:
    async def go(client: Client) -> Any:
        return (await client.call_tool("run_sql", {"query": "SELECT count(*) FROM cuda_calls"}),
                await client.call_tool("run_sql", {"query": "SELECT 1", "sql": "SELECT 2"}),
                await client.call_tool("run_sql", {}))

    query, both, neither = await session(store, go)
    assert not query.is_error and query.structured_content["rows"] == [[2000]]
    assert both.is_error and neither.is_error and "exactly one" in both.content[0].text


async def test_attach_of_the_stores_own_file_is_refused_and_leaves_nothing_attached(store: Path) -> None:
    async def go(client: Client) -> Any:
        attach = await client.call_tool("run_sql", {"sql": f"ATTACH '{store}' AS again (READ_ONLY)"})
        sneaky = await client.call_tool("run_sql", {"sql": f"SELECT 1; ATTACH '{store}' AS again2"})
        dbs = await client.call_tool("run_sql", {"sql": "SELECT database_name FROM duckdb_databases() ORDER BY 1"})
        return attach, sneaky, dbs

    attach, sneaky, dbs = await session(store, go)
    assert attach.is_error and "ATTACH is refused" in attach.content[0].text
    assert sneaky.is_error and "ATTACH is refused" in sneaky.content[0].text
    assert [r[0] for r in dbs.structured_content["rows"]] == sorted(["contention", "system", "temp"])


async def test_resources_are_advertised_because_they_exist(store: Path) -> None:
    async def go(client: Client) -> Any:
        listed = (await client.list_resources()).resources
        return listed, {str(r.uri): await client.read_resource(r.uri) for r in listed}

    listed, read = await session(store, go)
    assert {str(r.uri) for r in listed} == {"ingero://schema", "ingero://report"}
    schema = read["ingero://schema"].contents[0].text
    assert "cuda_calls(" in schema and "sched_intervals(" in schema
    report = read["ingero://report"].contents[0].text
    assert "Causal chains" in report and "cudaStreamSynchronize" in report


async def test_a_slow_query_does_not_hold_up_the_other_tools(store: Path) -> None:
    done: dict[str, float] = {}

    async def go(client: Client) -> None:
        started = time.monotonic()

        async def slow() -> None:
            result = await client.call_tool("run_sql", {
                "sql": "SELECT count(*) FROM range(1000000000000) t(x) WHERE x % 7 = 3"})
            assert result.is_error and "timeout" in result.content[0].text
            done["slow"] = time.monotonic() - started

        async def fast() -> None:
            await anyio.sleep(0.3)
            result = await client.call_tool("get_trace_info", {})
            assert not result.is_error
            done["fast"] = time.monotonic() - started

        async with anyio.create_task_group() as tg:
            tg.start_soon(slow)
            tg.start_soon(fast)

    await session(store, go, sql_timeout_s=4)
    assert done["fast"] < 2.5 and done["slow"] >= 3.9, done


def test_duckdb_still_sees_the_store_unchanged(store: Path) -> None:
    con = duckdb.connect(str(store), read_only=True)
    try:
        assert con.execute("SELECT count(*) FROM cuda_calls").fetchall()[0][0] == 2000
    finally:
        con.close()
