"""`ingero-mcp explain`: the incident report of a trace: the answer on one screen by default, every detail with
--full, or its JSON."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ingero_mcp.analysis import Report

DESCRIPTION = """\
Explain why a GPU job was slow. By default the answer on one screen: what happened (who fed the
GPU, its progress), each finding with its window, culprit and fix, the top CUDA ops (each logical
call counted once), the tracing cost in a line. --full adds the detail: every causal chain with
its evidence and timeline, the time accounting, every op and process, the notes in full.
Windows are relative to the TRACE's end, not to now. Piped, the output is plain text wrapped at
$COLUMNS (default 100) columns."""

EPILOG = """\
examples:
  ingero-mcp explain --db run.duckdb                      the answer, on one screen
  ingero-mcp explain --db run.duckdb --full               every chain with its evidence, every table
  ingero-mcp explain --db run.duckdb --sql                --full, with the SQL behind each number
  ingero-mcp explain --db run.duckdb --per-process        --full, with every process and its CUDA ops
  ingero-mcp explain --db run.duckdb --pid 4100 --pid 4101
  ingero-mcp explain --db run.duckdb --since 30s          the last 30 s of the trace
  ingero-mcp explain --db run.duckdb --from 60s --to 30s  from 60 s to 30 s before the trace end
  ingero-mcp explain --db run.duckdb --from +5s           from 5 s after the trace start
  ingero-mcp explain --db run.duckdb --json | jq '.chains[0]'

time values: a duration before the trace end (30s, 250ms, 5m), +DURATION after the trace start,
ns since the epoch, or an ISO time (2026-03-20T14:06:13Z).

A store of 1M events or more without its derived rows (an older version's) is finished once as a
copy in ~/.cache/ingero-mcp/finished/ ($INGERO_MCP_CACHE: another folder, or off); the store
itself is never written, and later runs read the copy."""


JSON_STRING_CAP = 4_000  # characters of one string in --json (a longer one ends in '…[+N chars]')


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the `explain` parser."""
    p = subparsers.add_parser(
        "explain", help="the incident report of a trace", description=DESCRIPTION, epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--db", required=True, help="trace store (DuckDB file; a live recording is read too)")
    p.add_argument("--full", action="store_true", help="the whole report: every chain with its evidence, timeline "
                   "and fixes, the time accounting, the per-op and per-process tables, the notes and tracing cost "
                   "in full")
    p.add_argument("--per-process", action="store_true", help="show every process with its CUDA ops (implies --full)")
    p.add_argument("--pid", type=int, action="append", metavar="PID", help="only these processes (repeatable)")
    p.add_argument("--since", metavar="DUR", help="the last DUR of the trace (e.g. 30s)")
    p.add_argument("--from", dest="start", metavar="TIME", help="window start (see time values below)")
    p.add_argument("--to", dest="end", metavar="TIME", help="window end")
    p.add_argument("--json", action="store_true", help="print the report as one JSON object")
    p.add_argument("--sql", action="store_true", help="show the SQL that recomputes each piece of evidence "
                   "(implies --full: the evidence is there)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Build the report over the requested window and print it."""
    from ingero_mcp.analysis import diagnose
    from ingero_mcp.analysis import resolve_window
    from ingero_mcp.analysis import open_finished

    con = open_finished(args.db)
    try:
        window = None
        if args.since or args.start or args.end:
            window = resolve_window(con, since=args.since, start=args.start, end=args.end)
        report = diagnose(con, window=window, pids=args.pid or None)
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
    print_report(report, str(args.db), full=args.full or args.per_process or args.sql, per_process=args.per_process,
                 show_sql=args.sql)
    return 0


def print_report(report: Report, db: str, *, full: bool, per_process: bool, show_sql: bool) -> None:
    """The report on stdout: a terminal gets colours at its width; a pipe plain text at $COLUMNS (or 100) columns,
    trailing spaces trimmed."""
    import io
    import sys

    from ingero_mcp.render.console import make_console

    out = sys.stdout
    tty = out.isatty()
    console = make_console(out if tty else io.StringIO())
    if full:
        from ingero_mcp.render.report import render_report

        render_report(console, report, db, per_process=per_process, show_sql=show_sql)
    else:
        from ingero_mcp.render.summary import summary_lines

        for line in summary_lines(report, db, console.width):
            console.print(line, soft_wrap=True)  # already wrapped to the width, never at a traced name
    if not tty:
        text = console.file.getvalue()  # type: ignore[attr-defined]
        out.write("\n".join(line.rstrip() for line in text.split("\n")))
