"""The server over stdio, started the way a client starts it from examples/mcp-config.json.

The config's command and arguments are used as written, run from the repository root (where
Claude Code or ollmcp would be started); only the --db value is swapped for a test store.
The environment is the SDK's minimal one, as MCP clients give their servers.
"""

from __future__ import annotations

import json
import os
import subprocess
import threading
from pathlib import Path
from typing import Any

import duckdb
import jsonschema
import pytest
from analysis_fixtures import contention_store
from mcp import Client, StdioServerParameters
from paths import REPO

from ingero_mcp.sanitize import DATA_NOTE

CONFIG = REPO / "examples" / "mcp-config.json"
INGERO_MCP = REPO / ".venv" / "bin" / "ingero-mcp"


def server_entry() -> dict[str, Any]:
    config = json.loads(CONFIG.read_text())
    assert set(config) == {"mcpServers"}
    (entry,) = config["mcpServers"].values()
    assert set(entry) <= {"command", "args", "env", "type"}
    return entry


def with_db(args: list[str], db: Path) -> list[str]:
    """The config's args with the --db value replaced."""
    i = args.index("--db")
    return [*args[: i + 1], str(db), *args[i + 2 :]]


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return contention_store(tmp_path_factory.mktemp("stdio") / "trace.duckdb")


def test_config_shape_points_at_the_bundled_trace() -> None:
    entry = server_entry()
    assert entry["command"] == ".venv/bin/ingero-mcp"
    assert entry["args"][:1] == ["mcp"] and "--db" in entry["args"]
    db = entry["args"][entry["args"].index("--db") + 1]
    assert db.startswith("investigations/") and (REPO / db).is_file(), "the config serves a trace bundled in the repo"
    assert (REPO / entry["command"]).exists(), "the config's command is the venv's console script"


async def test_over_stdio_as_the_config_starts_it(store: Path) -> None:
    entry = server_entry()
    params = StdioServerParameters(command=entry["command"], args=with_db(entry["args"], store), cwd=REPO)
    async with Client(params) as client:
        tools = {t.name for t in (await client.list_tools()).tools}
        prompts = [p.name for p in (await client.list_prompts()).prompts]
        results = {
            "get_trace_info": await client.call_tool("get_trace_info", {}),
            "get_trace_stats": await client.call_tool("get_trace_stats", {"since": "5s"}),
            "get_causal_chains": await client.call_tool("get_causal_chains", {"top_n": 3}),
            "get_per_process_breakdown": await client.call_tool("get_per_process_breakdown", {"pid": 100}),
            "get_timeline": await client.call_tool("get_timeline", {"pid": 100, "around": "+5.003s", "limit": 20}),
            "get_system_context": await client.call_tool("get_system_context", {"max_points": 4}),
            "run_sql": await client.call_tool("run_sql", {"sql": "SELECT count(*) AS n FROM cuda_calls"}),
            "get_evidence_sql": await client.call_tool("get_evidence_sql", {}),
            "get_time_accounting": await client.call_tool("get_time_accounting", {}),
            "save_picture": await client.call_tool("save_picture", {"kind": "perfetto"}),
            "get_stacks": await client.call_tool("get_stacks", {"pid": 100}),
        }
        unknown = await client.call_tool("get_per_process_breakdown", {"pid": 424242})
        empty = await client.call_tool("get_trace_stats", {"since": "0s"})
        too_many = await client.call_tool("run_sql", {"sql": "SELECT 1", "limit": 100_000})
        none = await client.call_tool("run_sql", {"sql": "SELECT 1", "limit": 0})
        write = await client.call_tool("run_sql", {"sql": "DELETE FROM cuda_calls"})
        read_file = await client.call_tool("run_sql", {"sql": "SELECT * FROM read_csv('/etc/passwd')"})
        prompt = await client.get_prompt("investigate", {"pid": "100"})
    assert len(tools) == 11 and set(results) == tools
    assert prompts == ["investigate"]
    for name, result in results.items():
        assert not result.is_error, (name, result.content)
        assert result.structured_content is not None
    assert DATA_NOTE in results["get_trace_info"].content[0].text
    window = results["get_trace_stats"].structured_content["window"]
    assert window["end_ns"] - window["start_ns"] == 5_000_000_000
    assert results["get_per_process_breakdown"].structured_content["processes"][0]["comm"] == "python"
    assert results["run_sql"].structured_content["rows"] == [[2000]]
    assert results["get_timeline"].structured_content["shown"] <= 20
    assert not unknown.is_error and "424242" in " ".join(unknown.structured_content["notes"])
    assert empty.structured_content["calls"] == 0
    assert too_many.is_error and "less than or equal to 10000" in too_many.content[0].text
    assert none.is_error and "greater than or equal to 1" in none.content[0].text
    assert write.is_error and "read-only" in write.content[0].text
    assert read_file.is_error and "disabled" in read_file.content[0].text
    assert "process 100" in prompt.messages[0].content.text


def test_stdout_carries_only_protocol(store: Path) -> None:
    """Raw JSON-RPC over the pipes: every stdout line is a JSON-RPC message, logs go to stderr."""
    requests = [
        {"jsonrpc": "2.0", "id": 1, "method": "initialize",
         "params": {"protocolVersion": "2025-06-18", "capabilities": {},
                    "clientInfo": {"name": "raw", "version": "0"}}},
        {"jsonrpc": "2.0", "method": "notifications/initialized"},
        {"jsonrpc": "2.0", "id": 2, "method": "tools/list"},
        {"jsonrpc": "2.0", "id": 3, "method": "tools/call",
         "params": {"name": "run_sql", "arguments": {"sql": "SELEC"}}},
        {"jsonrpc": "2.0", "id": 4, "method": "tools/call", "params": {"name": "get_trace_stats", "arguments": {}}},
    ]
    proc = subprocess.Popen(
        [str(INGERO_MCP), "mcp", "--db", str(store)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True, env={"PATH": "/usr/bin:/bin", "HOME": os.environ.get("HOME", "/root")},
    )
    watchdog = threading.Timer(120, proc.kill)
    watchdog.start()
    try:
        assert proc.stdin is not None and proc.stdout is not None
        proc.stdin.write("".join(json.dumps(r) + "\n" for r in requests))
        proc.stdin.flush()
        messages = []
        while not {1, 2, 3, 4} <= {m.get("id") for m in messages}:
            line = proc.stdout.readline()
            assert line, "server closed stdout early"
            messages.append(json.loads(line))  # anything but a JSON-RPC line fails here
        proc.stdin.close()
        rest = proc.stdout.read()
        assert proc.wait() == 0
    finally:
        watchdog.cancel()
        proc.kill()
    assert rest.strip() == ""
    assert all(m.get("jsonrpc") == "2.0" for m in messages)
    by_id = {m["id"]: m for m in messages if "id" in m}
    assert set(by_id) == {1, 2, 3, 4}
    assert by_id[1]["result"]["serverInfo"]["name"] == "ingero-mcp"
    assert len(by_id[2]["result"]["tools"]) == 11
    assert by_id[3]["result"]["isError"] is True
    assert by_id[4]["result"]["structuredContent"]["calls"] == 2000


TOOL_ARGS: dict[str, dict[str, Any]] = {"run_sql": {"sql": "SELECT * FROM cuda_calls"}}
UNREADABLE = {  # kind -> what the reason says
    "missing": "no trace store at", "directory": "is a directory, not a trace store file",
    "garbage": "is not a readable DuckDB trace store", "truncated-header": "Could not read enough bytes",
    "truncated": "Could not read enough bytes", "sqlite": "is a SQLite database (an Ingero trace?)",
    "empty-duckdb": "is a DuckDB file but not an ingero-mcp trace store",
}


def unreadable_store(kind: str, folder: Path, ingero_dir: Path) -> Path:
    """A --db that a user might pass by mistake, or a store damaged on disk."""
    db = folder / f"{kind}.duckdb"
    if kind == "directory":
        db.mkdir()
    elif kind == "garbage":
        db.write_bytes(b"this is not a database\n" * 100)
    elif kind.startswith("truncated"):  # the catalog readable, the data cut off; or the header itself cut
        db.write_bytes((REPO / "investigations" / "h200-seed-benchmark.duckdb").read_bytes()[
            : 5000 if kind == "truncated-header" else 1_000_000])
    elif kind == "sqlite":
        db = ingero_dir / "pytorch-dataloader-starvation.db"
    elif kind == "empty-duckdb":
        duckdb.connect(str(db)).close()
    return db


@pytest.mark.parametrize("kind", sorted(UNREADABLE))
async def test_an_unreadable_store_is_served_and_each_tool_says_why(tmp_path: Path, ingero_dir: Path,
                                                                   kind: str) -> None:
    """The server exited at start on a damaged store: the client saw "Connection closed" and the model nothing.
    It now starts, lists its tools and prompt, and every tool answers with the one-line reason in both halves."""
    db = unreadable_store(kind, tmp_path, ingero_dir)
    entry = server_entry()
    params = StdioServerParameters(command=entry["command"], args=with_db(entry["args"], db), cwd=REPO)
    async with Client(params) as client:
        schemas = {t.name: t.output_schema for t in (await client.list_tools()).tools}
        tools = list(schemas)
        prompts = [p.name for p in (await client.list_prompts()).prompts]
        results = {name: await client.call_tool(name, TOOL_ARGS.get(name, {})) for name in tools}
        prompt = await client.get_prompt("investigate", {})
    assert len(tools) == 11 and prompts == ["investigate"] and prompt.messages
    for name, result in results.items():
        if kind == "truncated" and name == "run_sql" and not result.is_error:
            continue  # the rows it asked for were in the part left
        text = result.content[0].text
        assert result.is_error and "\n" not in text and UNREADABLE[kind] in text, (name, text)
        # the reason in the structured half too, in the tool's own shape: clients that check it against the output
        # schema (the Inspector does, errors included) accept it
        assert result.structured_content["error"] == text and result.structured_content["notes"] == [text], name
        jsonschema.validate(result.structured_content, schemas[name])
        if kind != "truncated":  # the file opened: the reason is the engine's, not the path's
            assert str(db) in text, (name, text)


@pytest.mark.parametrize("kind", ["missing", "sqlite"])
def test_an_unreadable_store_is_one_line_on_stderr_and_the_server_runs(tmp_path: Path, ingero_dir: Path,
                                                                       kind: str) -> None:
    db = unreadable_store(kind, tmp_path, ingero_dir)
    proc = subprocess.run(
        [str(INGERO_MCP), "mcp", "--db", str(db)], input="", capture_output=True, text=True, timeout=60,
        env={"PATH": "/usr/bin:/bin"},
    )
    assert proc.returncode == 0 and proc.stdout == ""
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("ingero-mcp mcp: serving, but the trace store cannot be read: ")
    assert UNREADABLE[kind] in lines[0] and str(db) in lines[0]


@pytest.mark.parametrize("problem", ["a file", "under a file"])
def test_an_out_dir_that_cannot_hold_pictures_is_one_line_at_start(store: Path, tmp_path: Path, problem: str) -> None:
    """`mcp --out-dir` that is a file (or lies under one): one line and exit 2 at start, not a failed tool later."""
    blocker = tmp_path / "pictures"
    blocker.write_text("not a folder\n")
    out_dir = blocker if problem == "a file" else blocker / "sub"
    proc = subprocess.run([str(INGERO_MCP), "mcp", "--db", str(store), "--out-dir", str(out_dir)], input="",
                          capture_output=True, text=True, timeout=60, env={"PATH": "/usr/bin:/bin"})
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.count("\n") == 1 and proc.stderr.startswith("ingero-mcp mcp: --out-dir ")
    assert "is a file, not a folder" in proc.stderr and str(blocker) in proc.stderr


async def test_the_config_as_written_serves_the_bundled_h200_trace() -> None:
    """No substitution at all: what a user gets from `claude --mcp-config examples/mcp-config.json`."""
    entry = server_entry()
    params = StdioServerParameters(command=entry["command"], args=entry["args"], cwd=REPO)
    async with Client(params) as client:
        chains = await client.call_tool("get_causal_chains", {"top_n": 3, "include_sql": True})
        calls = await client.call_tool("run_sql",
                                       {"sql": "SELECT count(*) AS n FROM cuda_calls WHERE op = 'cuMemHostAlloc'"})
        # the first chain: the main thread host-bound over the DataLoader(shuffle) stretch; its evidence's SQL
        # (over the accounting's views) re-runs through the same server and gives the number shown
        first = chains.structured_content["chains"][0]
        share = next(e for e in first["evidence"] if e["name"].startswith("share of the thread's time"))
        again = await client.call_tool("run_sql", {"sql": share["sql"]})
        # the split of every CUDA call adds up, read through run_sql as through every other reader
        v2 = await client.call_tool("run_sql", {"sql": "SELECT count(*) FILTER (WHERE sleep_ns + cpu_wait_ns "
                                                       "= off_cpu_ns) = count(off_cpu_ns) AS ok FROM cuda_calls"})
    text = chains.content[0].text
    assert not chains.is_error and "2111" in text and "host-bound" in text
    assert first["root_cause"] == "host-bound" and first["severity"] == "HIGH" and first["pids"] == [2111]
    assert not again.is_error and float(again.content[0].text.splitlines()[-1]) == share["value"] > 95
    assert not v2.is_error and v2.structured_content["rows"] == [[True]]
    assert calls.content[0].text.splitlines()[-2:] == ['columns: "n" (BIGINT)', "4"]


def test_readme_names_the_prompt_as_claude_code_lists_it() -> None:
    """Claude Code lists MCP prompts as /mcp__<server>__<prompt>; the README and --help say that name."""
    from ingero_mcp.cli.mcp import EPILOG
    from ingero_mcp.mcp.server import build_server

    (server_key,) = json.loads(CONFIG.read_text())["mcpServers"]
    args = server_entry()["args"]
    server = build_server(REPO / args[args.index("--db") + 1])
    try:
        (prompt,) = server._prompt_manager.list_prompts()
    finally:
        server.store.close()
    command = f"/mcp__{server_key}__{prompt.name}"
    readme = (REPO / "README.md").read_text()
    assert f"> {command}" in readme and command in EPILOG
    assert "> /investigate" not in readme


async def test_the_verdict_reaches_the_model_in_both_halves() -> None:
    """get_time_accounting on the bundled H200 trace: the verdict and the shares, the same in text and structure."""
    entry = server_entry()
    params = StdioServerParameters(command=entry["command"], args=entry["args"], cwd=REPO)
    async with Client(params) as client:
        got = await client.call_tool("get_time_accounting", {})
    assert not got.is_error
    data, text = got.structured_content, got.content[0].text
    assert data["complete"] and data["verdict"] and DATA_NOTE in text and data["data_note"] == DATA_NOTE
    assert data["verdict"][0].startswith('process "python3"[2111]\'s main thread fed the GPU')
    for line in data["verdict"]:
        assert json.dumps(line, ensure_ascii=False) in text  # the text carries each verdict line, quoted
    (main,) = [t for t in data["threads"] if t["tid"] == 2111]
    assert sum(v for k, v in main["shares_percent"].items() if k != "sleep_io") == pytest.approx(100.0, abs=0.5)
    assert any(p["kind"] == "slow" and p["slowdown"] for p in data["phases"])
    # each phase's rate in its own unit, in both halves (iterations where a call marks them, not launches/copies),
    # a slow one's rate not rounded to nothing (0.28/s, not 0)
    lines = [line for line in text.splitlines() if line.startswith("phase ")]
    assert len(lines) == len(data["phases"]) and "launches/copies per s" not in text, lines
    for p, line in zip(data["phases"], lines, strict=True):
        assert p["unit"] == "iterations/s" and f" {p['unit']}" in line, (p, line)
        assert p["kind"] != "slow" or (0 < p["work_rate"] < 1 and f"{p['work_rate']:.2f} iterations/s" in line), line
