"""The analysis, one function per question: pure functions from a read-only store connection (store.open_store) to
pydantic models (models.py). `cli/`, `mcp/`, `export/`, `render/` and `demo/` import the analysis only from here.

Each question delegates in a line and imports its module when first asked, so a command pays only for what it asks
(the models and the other names below load the same way, on first use).

    diagnose               everything `explain` shows: verdict, accounting, chains, stats, processes (Report)
    account                the verdict, the time accounting and the chains, no more (Diagnosis)
    causal_chains          the causal chains, most severe first
    trace_stats            per-op statistics and exact host totals (TraceStats)
    trace_info             what the trace is: sessions, coverage, row counts (TraceInfo)
    per_process_breakdown  per-process figures
    thread_timeline        the rows of a window, a process or a thread, in time order (timeline.timeline)
    system_context         the host: CPUs, memory, GPUs over time
    resolve_window         a window from since/start/end; trace_window, window_or_trace
    stacks_of              where a thread ran and blocked in its own code, from stacks (StacksResult)
    open_finished          a store opened, or its finished copy where it is large and lacks its derived rows

A name here never repeats a module's (`chains`, `timeline`): importing the module would replace it.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import duckdb

    from ingero_mcp.analysis.models import Diagnosis, Report, TimeWindow


def diagnose(con: duckdb.DuckDBPyConnection, window: TimeWindow | None = None,
             pids: list[int] | None = None) -> Report:
    """Everything `explain` shows over the window (default: the whole trace)."""
    from ingero_mcp.analysis.report import build_report

    return build_report(con, window, pids)


def account(con: duckdb.DuckDBPyConnection, window: TimeWindow | None = None,
            pids: list[int] | None = None) -> Diagnosis:
    """The verdict, the time accounting and the chains: the part of `diagnose` that says where the time went."""
    from ingero_mcp.analysis.report import diagnosis

    return diagnosis(con, window, pids)


# Names other rooms use, by the module that holds them (loaded on first use): the models, the timeline, windows,
# and the few helpers the renderers and exporters share with the analysis.
_NAMES = {
    "causal_chains": "chains", "trace_stats": "stats", "trace_info": "info", "per_process_breakdown": "processes",
    "system_context": "context", "thread_timeline": "timeline", "resolve_window": "window", "trace_window": "window",
    "window_or_trace": "window", "stacks_of": "stacks",
    "events_lost": "info", "cost_lines": "cost", "short_why": "imported_accounting",
    "pace_threads": "causes", "origin_ns": "accounting", "recording_notes": "accounting", "store_derived": "derive",
    "materialize": "derive", "open_finished": "finished", "finished_copy": "finished", "wants_copy": "finished",
    "AnalysisError": "_sql", "interval_in": "_sql", "pid_in": "_sql", "rows": "_sql", "ts_in": "_sql", "where": "_sql",
}
_RENAMED = {"thread_timeline": "timeline"}


def __getattr__(name: str) -> Any:
    """The models (models.py) and the names above, imported when first asked for."""
    if name in _NAMES:
        return getattr(import_module(f"ingero_mcp.analysis.{_NAMES[name]}"), _RENAMED.get(name, name))
    models = import_module("ingero_mcp.analysis.models")
    if hasattr(models, name) and not name.startswith("_"):
        return getattr(models, name)
    raise AttributeError(f"module 'ingero_mcp.analysis' has no attribute {name!r}")
