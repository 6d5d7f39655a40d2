"""`ingero-mcp explain`: the incident report of a trace (causal chains, top ops, processes), or its JSON."""

from __future__ import annotations

import argparse

DESCRIPTION = """\
Explain why a GPU job was slow: causal chains (a CUDA op's slow calls tied to what their thread
and the host went through, with a root cause and a fix), the top CUDA ops with exact
percentiles, and the processes involved. Windows are relative to the TRACE's end, not to now."""

EPILOG = """\
examples:
  ingero-mcp explain --db run.duckdb                      the incident report
  ingero-mcp explain --db run.duckdb --per-process        every process, with its CUDA ops
  ingero-mcp explain --db run.duckdb --pid 4100 --pid 4101
  ingero-mcp explain --db run.duckdb --since 30s          the last 30 s of the trace
  ingero-mcp explain --db run.duckdb --from 60s --to 30s  from 60 s to 30 s before the trace end
  ingero-mcp explain --db run.duckdb --from +5s           from 5 s after the trace start
  ingero-mcp explain --db run.duckdb --json | jq '.chains[0]'

time values: a duration before the trace end (30s, 250ms, 5m), +DURATION after the trace start,
ns since the epoch, or an ISO time (2026-03-20T14:06:13Z)."""


JSON_STRING_CAP = 4_000  # characters of one string in --json (a longer one ends in '…[+N chars]')


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the `explain` parser."""
    p = subparsers.add_parser(
        "explain", help="the incident report of a trace", description=DESCRIPTION, epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--db", required=True, help="trace store (DuckDB file; a live recording is read too)")
    p.add_argument("--per-process", action="store_true", help="show every process with its CUDA ops")
    p.add_argument("--pid", type=int, action="append", metavar="PID", help="only these processes (repeatable)")
    p.add_argument("--since", metavar="DUR", help="the last DUR of the trace (e.g. 30s)")
    p.add_argument("--from", dest="start", metavar="TIME", help="window start (see time values below)")
    p.add_argument("--to", dest="end", metavar="TIME", help="window end")
    p.add_argument("--json", action="store_true", help="print the report as one JSON object")
    p.add_argument("--sql", action="store_true", help="show the SQL that recomputes each piece of evidence")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Build the report over the requested window and print it."""
    from ingero_mcp.analysis.report import build_report
    from ingero_mcp.analysis.window import resolve_window
    from ingero_mcp.store import open_store

    con = open_store(args.db)
    try:
        window = None
        if args.since or args.start or args.end:
            window = resolve_window(con, since=args.since, start=args.start, end=args.end)
        report = build_report(con, window=window, pids=args.pid or None)
    finally:
        con.close()
    from ingero_mcp.store.segments import describe, skipped_segments

    skipped = skipped_segments(args.db)
    if skipped:
        report.notes.append(describe(skipped) + "; the report is of the rest")
    if args.json:
        import json

        from ingero_mcp.sanitize import clean_data

        # Traced strings cleaned and capped as everywhere else; evidence SQL whole (it recomputes a number).
        data = clean_data(report.model_dump(mode="json"), cap=JSON_STRING_CAP, key_caps={"sql": 1_000_000})
        print(json.dumps(data, ensure_ascii=False))
        return 0
    from ingero_mcp.render.report import make_console, render_report

    render_report(make_console(), report, str(args.db), per_process=args.per_process, show_sql=args.sql)
    return 0
