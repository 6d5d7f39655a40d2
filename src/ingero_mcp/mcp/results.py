"""The structured content of each tool: the analysis models, bounded, with what was left out.

Each result carries the analysis model(s) unchanged in shape (so a program reads the same fields
as `explain --json`), plus `shown`/`total`/`truncated` and notes saying what a cap removed.
"""

from __future__ import annotations

from types import UnionType
from typing import Any, Literal, TypeVar, Union, get_args, get_origin

from pydantic import BaseModel, Field

from ingero_mcp.analysis import (
    HostTotal,
    OpStats,
    ProcessBreakdown,
    StacksResult,
    SystemContext,
    TableCoverage,
    Timeline,
    TimeWindow,
    TraceInfo,
)
from ingero_mcp.sanitize import DATA_NOTE


class Bounds(BaseModel):
    """How much of the answer is shown, and why the rest is not; the same data note as the text."""

    data_note: str = DATA_NOTE
    shown: int = 0
    total: int = 0
    truncated: bool = False
    notes: list[str] = []
    error: str | None = Field(None, description="why the call failed (then the other fields are empty); "
                              "absent on success")
    # The trace's first moment: moments (*_ns >= 1e17) gain a readable '+S s' offset (*_at) from it.
    trace_start_ns: int | None = Field(None, exclude=True)


B = TypeVar("B", bound=Bounds)


def blank(model: type[B], reason: str) -> B:
    """The smallest valid `model` that says only why there is no answer: every required field empty, the reason in
    `error` and `notes` (a client that checks a failed call's structured content against the schema accepts it)."""
    required = {name: _empty(field.annotation) for name, field in model.model_fields.items() if field.is_required()}
    return model.model_validate({**required, "error": reason, "notes": [reason]})


def _empty(annotation: Any) -> Any:
    """The empty value of a type: None where allowed, 0, '', False, [], {}, or a model of empty required fields."""
    origin, args = get_origin(annotation), get_args(annotation)
    if origin in (Union, UnionType):
        return None if type(None) in args else _empty(args[0])
    if origin is Literal:
        return args[0]
    if origin in (list, tuple, set, frozenset):
        return []
    if origin is dict:
        return {}
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return {n: _empty(f.annotation) for n, f in annotation.model_fields.items() if f.is_required()}
    return {bool: False, int: 0, float: 0.0, str: ""}.get(annotation)


class StatsResult(Bounds):
    """get_trace_stats: per-op statistics over the window, the trace span, pids and what was captured."""

    window: TimeWindow
    trace_window: TimeWindow | None
    calls: int
    pids: list[int]
    ops: list[OpStats]
    host: list[HostTotal] = []
    sampled: bool = False
    coverage: list[TableCoverage] = []
    row_counts: dict[str, int] = {}


class ChainsResult(Bounds):
    """get_causal_chains: the chains, most severe first, capped at top_n, each a compact view (mcp.chainview)."""

    window: TimeWindow
    chains: list[dict[str, Any]]


class AccountingResult(Bounds):
    """get_time_accounting: the verdict, where each feeding thread's time went (shares of its wall time), the
    phases of each feeding process, and the causes too small to be chains."""

    window: TimeWindow
    complete: bool
    verdict: list[str]
    threads: list[dict[str, Any]]
    phases: list[dict[str, Any]]
    minor: list[str]


class EvidenceResult(Bounds):
    """get_evidence_sql: one chain's evidence, each with the SQL that recomputes it."""

    window: TimeWindow
    chain_id: str
    evidence: list[dict[str, Any]]


class BreakdownResult(Bounds):
    """get_per_process_breakdown: one entry per pid, capped at top_n."""

    window: TimeWindow
    processes: list[ProcessBreakdown]


class TimelineResult(Bounds):
    """get_timeline: events of a pid/thread in the window, newest first or nearest a moment."""

    timeline: Timeline


class ContextResult(Bounds):
    """get_system_context: host snapshots over the window (downsampled) and their summary."""

    context: SystemContext


class InfoResult(Bounds):
    """get_trace_info: sessions, collector statistics, coverage, row counts."""

    info: TraceInfo


class SqlRows(Bounds):
    """run_sql: the rows a read-only query returned, at most `limit`, fewer if the size budget cut them."""

    columns: list[str]
    types: list[str]
    rows: list[list[Any]]
    limit: int
    more_rows: bool = Field(description="the query had more rows than `limit`")
    elapsed_ms: float


class PictureResult(Bounds):
    """save_picture: where the file is, what it shows (window, chain) and what is in it."""

    path: str
    uri: str
    kind: str = Field(description="'report' (HTML, open in a browser) or 'perfetto' (open at https://ui.perfetto.dev)")
    window: TimeWindow | None = None
    chain_id: str | None = None
    bytes: int = 0
    counts: dict[str, int] = {}


class StacksToolResult(Bounds):
    """get_stacks: where a thread (or process) ran and blocked in its own code over a window, from stacks."""

    stacks: StacksResult
