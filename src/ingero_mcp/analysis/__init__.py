"""The analysis: pure functions from a read-only store connection to pydantic models (models.py).

window.resolve_window / trace_window, stats.trace_stats, processes.per_process_breakdown,
chains.causal_chains, timeline.timeline, context.system_context, info.trace_info and
report.build_report (what `explain --json` prints). The CLI and the MCP server render these.
"""
