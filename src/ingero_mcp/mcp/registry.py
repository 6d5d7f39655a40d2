"""The tools registered as the SDK registers them, without its work at every start.

The SDK derives each tool's argument model, its input schema and its output schema when the tool is added: 0.06-0.13 s
of pydantic schema generation before the server could answer `initialize`. Here the two schemas come from
tool_schemas.json, written by `python -m ingero_mcp.mcp.registry` and checked by a test against the SDK's own
derivation (tests/mcp/test_mcp_registry.py); the argument model is built at the tool's first call. A tool whose
signature is not the one the file was written from is derived as the SDK does, at start: slower, never wrong.
"""

from __future__ import annotations

import functools
import hashlib
import inspect
import json
import typing
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar

from mcp.server.mcpserver.tools import Tool
from mcp.server.mcpserver.utilities.func_metadata import ArgModelBase, FuncMetadata, func_metadata
from mcp_types import ToolAnnotations
from pydantic import ConfigDict, Field, create_model, model_validator

from ingero_mcp.sanitize import clean

SCHEMAS = Path(__file__).with_name("tool_schemas.json")


class Arguments(ArgModelBase):
    """A tool's arguments, validated at its call: arguments it does not take refused (the SDK ignores them:
    {"start": ...} on a tool without `start` silently answered for the whole trace); the validator built then."""

    model_config = ConfigDict(extra="forbid", defer_build=True)
    tool_name: ClassVar[str] = ""

    @model_validator(mode="before")
    @classmethod
    def known_only(cls, data: Any) -> Any:
        """Unknown argument names named, with the ones the tool takes (extra="forbid" alone says 'extra input')."""
        if isinstance(data, dict):
            accepted = sorted(field.alias or name for name, field in cls.model_fields.items())
            unknown = sorted(str(k) for k in data if k not in accepted)
            if unknown:
                raise ValueError(
                    f"unknown argument(s) {', '.join(json.dumps(clean(u, 60)) for u in unknown[:10])}: "
                    f"{cls.tool_name} takes {', '.join(accepted) or 'no arguments'}"
                )
        return data

    def model_dump_one_level(self) -> dict[str, Any]:
        """The function's parameter names ('from_'), not the wire names ('from')."""
        return {name: getattr(self, name) for name in type(self).model_fields}


def arguments_model(fn: Callable[..., Any], signature: inspect.Signature) -> type[Arguments]:
    """`fn`'s parameters (its `signature`) as an Arguments model: their annotations and defaults, as the SDK's."""
    fields: dict[str, Any] = {}
    for param in signature.parameters.values():
        annotation = typing.Annotated[param.annotation, Field()]
        fields[param.name] = annotation if param.default is inspect.Parameter.empty else (annotation, param.default)
    model = create_model(f"{fn.__name__}Arguments", __base__=Arguments, **fields)
    model.tool_name = fn.__name__
    return model


def output_model(signature: inspect.Signature) -> type[Any]:
    """The result model of a tool annotated `-> Annotated[CallToolResult, ResultModel]`."""
    _, model = typing.get_args(signature.return_annotation)
    return model


@functools.cache
def _versions() -> str:
    from importlib.metadata import version

    import pydantic

    return f"mcp {version('mcp')}, pydantic {pydantic.VERSION}"


def signature_key(signature: inspect.Signature) -> str:
    """What a tool's stored schemas were derived from: its signature (the result model's name in it), the SDK's and
    pydantic's versions. A tool whose key differs is derived at start."""
    model = output_model(signature)
    parts = [repr(signature), model.__module__, model.__qualname__, _versions()]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:16]


def derived(fn: Callable[..., Any]) -> dict[str, Any]:
    """A tool's schemas as the SDK derives them (input: its argument model with extra arguments refused)."""
    meta = func_metadata(fn)
    return {"key": signature_key(inspect.signature(fn, eval_str=True)),
            "input": {"additionalProperties": False, **meta.arg_model.model_json_schema(by_alias=True)},
            "output": meta.output_schema}


def _stored() -> dict[str, Any]:
    try:
        stored = json.loads(SCHEMAS.read_text())
    except (OSError, ValueError):
        return {}
    return stored if isinstance(stored, dict) else {}


def make_tools(specs: list[tuple[Callable[..., Any], str, ToolAnnotations]]) -> list[Tool]:
    """Tools for `specs` (function, description, annotations), their schemas from the stored file where it was
    written from the same signature, else derived now."""
    stored = _stored()
    tools = []
    for fn, description, tool_annotations in specs:
        signature = inspect.signature(fn, eval_str=True)
        schemas = stored.get(fn.__name__)
        if not isinstance(schemas, dict) or schemas.get("key") != signature_key(signature):
            schemas = derived(fn)
        meta = FuncMetadata(arg_model=arguments_model(fn, signature), output_model=output_model(signature),
                            output_schema=schemas["output"])
        tools.append(Tool(fn=fn, name=fn.__name__, description=description, parameters=schemas["input"],
                          fn_metadata=meta, is_async=False, annotations=tool_annotations))
    return tools


def write(specs: list[tuple[Callable[..., Any], str, ToolAnnotations]], path: Path = SCHEMAS) -> None:
    """Write every tool's derived schemas to `path` (tool_schemas.json)."""
    text = json.dumps({fn.__name__: derived(fn) for fn, _, _ in specs}, indent=1, sort_keys=True)
    path.write_text(text + "\n")


if __name__ == "__main__":
    import sys

    from ingero_mcp.mcp.server import build_server

    # the tools' functions as the server defines them; a store that cannot be read is served all the same
    server = build_server(sys.argv[1] if len(sys.argv) > 1 else "/nonexistent/ingero-mcp-registry.duckdb")
    try:
        write(server.tool_specs)
    finally:
        server.store.close()
    print(f"wrote {SCHEMAS}")
