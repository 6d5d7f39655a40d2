"""Clients this project did not write use the server: the MCP Inspector CLI (npm) and the mcp 1.x
Python SDK (what ollmcp is built on), each installed by .ci/run in its own folder.

Both start the server from a copy of examples/mcp-config.json whose paths are made absolute and
whose --db points at a test store. A missing client is a failure that says how to install it.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
from analysis_fixtures import contention_store
from hostile import NASTY_CLEAN, assert_clean_data, assert_clean_text, hostile_store
from paths import REPO

INSPECTOR = REPO / ".mcp-clients" / "node_modules" / ".bin" / "mcp-inspector"
MCP1_PYTHON = REPO / ".venv-mcp1" / "bin" / "python"
TOOLS = {
    "get_trace_stats", "get_causal_chains", "get_per_process_breakdown", "get_timeline",
    "get_system_context", "get_trace_info", "run_sql", "get_evidence_sql", "get_time_accounting", "save_picture",
    "get_stacks",
}


def require(path: Path, what: str) -> Path:
    if not path.exists():
        pytest.fail(f"{what} is not installed at {path}: run .ci/run (its 'mcp clients block') to install it")
    return path


def _config_for(db: Path, tmp: Path) -> Path:
    """examples/mcp-config.json with absolute paths, serving `db`."""
    config = json.loads((REPO / "examples" / "mcp-config.json").read_text())
    for entry in config["mcpServers"].values():
        entry["command"] = str(REPO / entry["command"])
        args = entry["args"]
        args[args.index("--db") + 1] = str(db)
    path = tmp / "mcp-config.json"
    path.write_text(json.dumps(config))
    return path


@pytest.fixture(scope="module")
def config(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """examples/mcp-config.json with absolute paths and a test store."""
    tmp = tmp_path_factory.mktemp("clients")
    return _config_for(contention_store(tmp / "trace.duckdb"), tmp)


@pytest.fixture(scope="module")
def hostile_config(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The same config serving a store written by a hostile host (tests/fixtures/hostile.py)."""
    tmp = tmp_path_factory.mktemp("hostile-clients")
    return _config_for(hostile_store(tmp / "hostile.duckdb"), tmp)


HOSTILE_CALLS: list[tuple[str, dict[str, str]]] = [
    ("get_causal_chains", {}),
    ("get_per_process_breakdown", {"top_n": "50"}),
    ("get_timeline", {"pid": "100", "around": "+5.1s", "limit": "200"}),
    ("get_trace_info", {}),
    ("run_sql", {"sql": "PIVOT (SELECT comm, count FROM host_aggregates) ON comm USING sum(count)"}),
]


def test_hostile_store_through_the_inspector_cli_both_halves(hostile_config: Path) -> None:
    for name, args in HOSTILE_CALLS:
        flags = [flag for key, value in args.items() for flag in ("--tool-arg", f"{key}={value}")]
        got = inspector(hostile_config, "--method", "tools/call", "--tool-name", name, *flags)
        assert got.get("isError") is not True, (name, got)
        text = got["content"][0]["text"]
        assert_clean_text(text)
        assert_clean_data(got["structuredContent"])
        if name in ("get_causal_chains", "get_per_process_breakdown", "run_sql"):
            assert NASTY_CLEAN in text and NASTY_CLEAN in json.dumps(got["structuredContent"], ensure_ascii=False)


def inspector(config: Path, *args: str) -> dict[str, Any]:
    exe = require(INSPECTOR, "the MCP Inspector CLI")
    (server,) = json.loads(config.read_text())["mcpServers"]
    proc = subprocess.run(
        [str(exe), "--cli", "--config", str(config), "--server", server, *args],
        capture_output=True, text=True, timeout=120, cwd=config.parent,
    )
    assert proc.returncode == 0, proc.stderr + proc.stdout
    return json.loads(proc.stdout)


def test_inspector_cli_lists_and_calls_tools(config: Path) -> None:
    listed = inspector(config, "--method", "tools/list")
    tools = {t["name"]: t for t in listed["tools"]}
    assert set(tools) == TOOLS
    assert all(t["annotations"]["readOnlyHint"] is (name != "save_picture") for name, t in tools.items())

    stats = inspector(config, "--method", "tools/call", "--tool-name", "get_trace_stats", "--tool-arg", "since=5s")
    assert stats.get("isError") is not True
    assert "CUDA operation statistics" in stats["content"][0]["text"]
    assert (stats["structuredContent"]["window"]["end_ns"] - stats["structuredContent"]["window"]["start_ns"]
            == 5 * 10**9)

    procs = inspector(config, "--method", "tools/call", "--tool-name", "get_per_process_breakdown",
                      "--tool-arg", "pid=100", "--tool-arg", "top_n=1")
    assert procs["structuredContent"]["processes"][0]["pid"] == 100

    sql = inspector(config, "--method", "tools/call", "--tool-name", "run_sql",
                    "--tool-arg", "sql=SELECT count(*) AS n FROM cuda_calls")
    assert sql["structuredContent"]["rows"] == [[2000]]

    leak = config.parent / "leak.csv"
    refused = inspector(config, "--method", "tools/call", "--tool-name", "run_sql",
                        "--tool-arg", f"sql=COPY cuda_calls TO '{leak}'")
    assert refused["isError"] is True and "disabled" in refused["content"][0]["text"]
    assert not leak.exists()

    prompts = inspector(config, "--method", "prompts/list")
    assert [p["name"] for p in prompts["prompts"]] == ["investigate"]
    prompt = inspector(config, "--method", "prompts/get", "--prompt-name", "investigate", "--prompt-args", "pid=100")
    assert "process 100" in prompt["messages"][0]["content"]["text"]


MCP1_CLIENT = r'''
import json, sys
import anyio
from importlib.metadata import version
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client

async def main():
    entry = next(iter(json.load(open(sys.argv[1]))["mcpServers"].values()))
    params = StdioServerParameters(command=entry["command"], args=entry["args"])
    out = {"sdk": version("mcp")}
    async with stdio_client(params) as (read, write):
        async with ClientSession(read, write) as session:
            init = await session.initialize()
            out["protocol"] = init.protocolVersion
            out["tools"] = sorted(t.name for t in (await session.list_tools()).tools)
            out["prompts"] = [p.name for p in (await session.list_prompts()).prompts]
            calls = {}
            for name, args in [
                ("get_trace_info", {}), ("get_trace_stats", {}), ("get_causal_chains", {"top_n": 2}),
                ("get_per_process_breakdown", {"pid": 100}), ("get_timeline", {"pid": 100, "limit": 5}),
                ("get_system_context", {}), ("run_sql", {"sql": "SELECT count(*) FROM cuda_calls"}),
                ("run_sql", {"sql": "SELECT 1", "limit": 100000}),
            ]:
                r = await session.call_tool(name, args)
                calls[f"{name} {json.dumps(args)}"] = {
                    "isError": r.isError, "text": r.content[0].text, "structured": r.structuredContent,
                }
            out["calls"] = calls
    print(json.dumps(out))

anyio.run(main)
'''


def test_mcp_1x_python_client_lists_and_calls_tools(config: Path) -> None:
    python = require(MCP1_PYTHON, "the mcp 1.x client venv (.venv-mcp1)")
    proc = subprocess.run([str(python), "-c", MCP1_CLIENT, str(config)], capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["sdk"].startswith("1."), out["sdk"]
    assert set(out["tools"]) == TOOLS and out["prompts"] == ["investigate"]
    calls = out["calls"]
    for key, result in calls.items():
        if "100000" in key:
            assert result["isError"] is True and "less than or equal to 10000" in result["text"]
        else:
            assert result["isError"] is False, (key, result["text"])
            assert result["structured"] is not None
    assert calls['run_sql {"sql": "SELECT count(*) FROM cuda_calls"}']["structured"]["rows"] == [[2000]]
    assert calls['get_per_process_breakdown {"pid": 100}']["structured"]["processes"][0]["comm"] == "python"


def test_hostile_store_through_the_mcp_1x_client_both_halves(hostile_config: Path) -> None:
    python = require(MCP1_PYTHON, "the mcp 1.x client venv (.venv-mcp1)")
    proc = subprocess.run([str(python), "-c", MCP1_CLIENT, str(hostile_config)], capture_output=True, text=True,
                          timeout=180)
    assert proc.returncode == 0, proc.stderr[-3000:]
    calls = json.loads(proc.stdout.strip().splitlines()[-1])["calls"]
    arrived = 0
    for key, result in calls.items():
        if "100000" in key:
            continue
        assert result["isError"] is False, (key, result["text"])
        assert_clean_text(result["text"])
        assert_clean_data(result["structured"])
        arrived += NASTY_CLEAN in result["text"] and NASTY_CLEAN in json.dumps(result["structured"], ensure_ascii=False)
    assert arrived >= 2  # the chains and the hog's name reached the client, as data, in both halves
