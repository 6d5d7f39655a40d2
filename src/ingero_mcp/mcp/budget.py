"""The result budget: every tool result in both halves (structured content and text), each complete on its own, each
within its size, every traced string cleaned on its way out; and the errors a user can act on, as tool errors.

Claude Code forwards the structured content to the model and drops the text when both are present: what is cut from
one half is cut from the other, and each says what was left out.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from typing import Any, ParamSpec, TypeVar

import duckdb
from mcp.server.mcpserver.exceptions import ToolError
from mcp_types import CallToolResult, TextContent
from pydantic import BaseModel

from ingero_mcp.mcp.chainview import with_offsets
from ingero_mcp.mcp.results import Bounds, blank
from ingero_mcp.mcp.sql import SqlError
from ingero_mcp.sanitize import clean, clean_data, clean_lines
from ingero_mcp.store import StoreError

STRUCTURED_BUDGET = 30_000  # characters of JSON per structured result (with the text: < ~17k tokens)


STRING_CAP = 4_000  # characters of any one string in structured content (text output caps tighter)


SQL_CAP = 100_000  # evidence SQL is shown whole (it is the recipe for a number), within reason


R = TypeVar("R", bound=BaseModel)


def error_result(message: str, model: type[Bounds]) -> CallToolResult:
    """A tool error in both halves: the one-line reason as the text, and as the `error` of an empty result of the
    tool's own shape (clients check structured content against the tool's output schema, errors included)."""
    line = " ".join(clean(message, 1000).split())
    return CallToolResult(
        content=[TextContent(type="text", text=line)], structured_content=structured(blank(model, line)), is_error=True
    )


def tool_result(text: str, model: BaseModel) -> CallToolResult:
    """Both halves of a tool result, each through the sanitiser on its way out."""
    return CallToolResult(
        content=[TextContent(type="text", text=clean_lines(text))], structured_content=structured(model)
    )


def structured(model: BaseModel) -> dict[str, Any]:
    """What goes out as structured content: the model as JSON data, every string cleaned and capped
    (evidence SQL whole), every moment with its readable offset from the trace start."""
    data = clean_data(model.model_dump(mode="json"), cap=STRING_CAP, key_caps={"sql": SQL_CAP})
    if data.get("error", "") is None:  # only a failed call says `error`
        del data["error"]
    origin = getattr(model, "trace_start_ns", None)
    return with_offsets(data, origin) if origin is not None else data


def json_size(model: BaseModel) -> int:
    """Characters of the structured content on the wire (compact JSON)."""
    return len(json.dumps(structured(model), ensure_ascii=False, separators=(",", ":")))


def fit(
    model: BaseModel, values: list[Any], put: Callable[[list[Any]], None], budget: int = STRUCTURED_BUDGET - 400
) -> int:
    """The most leading `values` that `put` can place in `model` with its JSON within `budget`.

    Each value is sized once, in order, until the budget is spent: linear in what fits, whatever the
    number of values. The default budget leaves room for the note that says what was cut."""
    put([])
    used = json_size(model)
    keep = 0
    origin = getattr(model, "trace_start_ns", None)
    for value in values:
        data = clean_data(
            value.model_dump(mode="json") if isinstance(value, BaseModel) else value,
            cap=STRING_CAP,
            key_caps={"sql": SQL_CAP},
        )
        if origin is not None:
            data = with_offsets(data, origin)
        used += len(json.dumps(data, ensure_ascii=False, separators=(",", ":"))) + 1
        if used > budget:
            break
        keep += 1
    put(values[:keep])
    return keep


def shrink(model: R, items: str, budget: int = STRUCTURED_BUDGET - 400) -> R:
    """Drop items from the tail of `model.<items>` until its JSON fits `budget`; records what was cut."""
    values = list(getattr(model, items))
    keep = fit(model, values, lambda v: setattr(model, items, v), budget)
    if keep < len(values):
        model.shown = keep  # type: ignore[attr-defined]  # Bounds fields, on every result model
        model.truncated = True  # type: ignore[attr-defined]
        model.notes.append(  # type: ignore[attr-defined]
            f"only {keep} of the {len(values)} {items} asked for fit in one result; narrow the window, filter by pid, "
            "or lower top_n/limit"
        )
    return model


def guard(fn: Callable[[], CallToolResult], model: type[Bounds]) -> CallToolResult:
    """Turn the errors a user can act on into tool errors with their one-line message, in both halves (the text, and
    structured content of the tool's own shape, `model`); the rest stay generic."""
    try:
        return fn()
    except (StoreError, SqlError, ToolError) as exc:
        return error_result(str(exc), model)
    except duckdb.Error as exc:
        # A store that opened but cannot answer this (damage the checks at open did not catch): one line.
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        return error_result(
            f"the trace store could not answer this: {clean(first, 500)} (a damaged or hand-edited "
            "store? run_sql can look inside)",
            model,
        )


def with_note(result: CallToolResult, note: str) -> CallToolResult:
    """`result` with one more note, in both halves (a live recording's answers from its checkpoint say so)."""
    line = clean(note, 4000)
    if isinstance(result.structured_content, dict):
        result.structured_content.setdefault("notes", []).append(line)
    for part in result.content:
        if isinstance(part, TextContent):
            part.text = f"{part.text}\nnote: {line}"
            break
    return result


P = ParamSpec("P")


def guarded(model: type[Bounds]) -> Callable[[Callable[P, CallToolResult]], Callable[P, CallToolResult]]:
    """A tool function whose errors a user can act on come back as tool errors of `model`'s shape (`guard`)."""

    def wrap(fn: Callable[P, CallToolResult]) -> Callable[P, CallToolResult]:
        @functools.wraps(fn)
        def call(*args: P.args, **kwargs: P.kwargs) -> CallToolResult:
            result = guard(lambda: fn(*args, **kwargs), model)
            take_note = getattr(args[0] if args else kwargs.get("store"), "take_note", None)
            note = take_note() if take_note is not None else None  # what the store's connection says of itself
            return with_note(result, note) if note else result

        return call

    return wrap
