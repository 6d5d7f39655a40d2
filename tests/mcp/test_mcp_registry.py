"""The tools' stored schemas (mcp/tool_schemas.json) are what the SDK derives from their functions today, their
argument models validate what the schemas advertise, and a tool the file does not match is derived at start."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from mcp import Client

from ingero_mcp.mcp import registry
from ingero_mcp.mcp.server import build_server

MISSING = "/nonexistent/ingero-mcp-registry-test.duckdb"  # served all the same: the tools are listed


def _server_tools(**kw: Any) -> tuple[Any, dict[str, Any]]:
    server = build_server(MISSING, **kw)
    return server, {t.name: t for t in server._tool_manager.list_tools()}  # noqa: SLF001


def test_stored_schemas_are_the_sdks_derivation_of_every_tool() -> None:
    server, tools = _server_tools()
    try:
        stored = json.loads(registry.SCHEMAS.read_text())
        assert sorted(stored) == sorted(tools), "tools added or removed: python -m ingero_mcp.mcp.registry"
        for fn, _, _ in server.tool_specs:
            assert stored[fn.__name__] == registry.derived(fn), (
                f"{fn.__name__}'s stored schemas are stale: rewrite them with python -m ingero_mcp.mcp.registry")
    finally:
        server.store.close()


def test_each_argument_model_is_the_schema_it_advertises() -> None:
    server, tools = _server_tools()
    try:
        for name, tool in tools.items():
            model = tool.fn_metadata.arg_model
            assert model.model_json_schema(by_alias=True) == tool.parameters, name
            assert tool.parameters["additionalProperties"] is False
            assert tool.output_schema is not None and tool.output_schema["type"] == "object", name
    finally:
        server.store.close()


@pytest.mark.parametrize("content", ["{not json", '{"get_trace_stats": {"key": "0", "input": {}, "output": {}}}'])
def test_a_stale_or_damaged_file_is_derived_not_trusted(content: str, tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    stale = tmp_path / "tool_schemas.json"
    stale.write_text(content)
    monkeypatch.setattr(registry, "SCHEMAS", stale)
    server, tools = _server_tools()
    try:
        stats = tools["get_trace_stats"]
        assert stats.parameters["properties"]["top_n"]["maximum"] == 200
        assert stats.output_schema is not None and "ops" in json.dumps(stats.output_schema)
    finally:
        server.store.close()


async def test_listed_schemas_and_validation_over_the_protocol(tmp_path: Path) -> None:
    """What a client lists is the stored file; what it sends is validated by the model built at the first call."""
    server = build_server(MISSING)
    stored = json.loads(registry.SCHEMAS.read_text())
    try:
        async with Client(server) as client:
            listed = {t.name: t for t in (await client.list_tools()).tools}
            assert listed["get_timeline"].input_schema == stored["get_timeline"]["input"]
            assert listed["get_timeline"].output_schema == stored["get_timeline"]["output"]
            bad = await client.call_tool("get_timeline", {"limit": 0})
            assert bad.is_error and "limit" in bad.content[0].text
            aliased = await client.call_tool("get_timeline", {"from": "+1s", "frm": 1})
            assert aliased.is_error and 'unknown argument(s) "frm"' in aliased.content[0].text
    finally:
        server.store.close()
