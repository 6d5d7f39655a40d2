"""`ingero-mcp report`: the incident report as one self-contained HTML file (opens offline)."""

from __future__ import annotations

import argparse

from ingero_mcp.cli._args import add_window_args

DESCRIPTION = """\
Write the incident report as one HTML file that opens offline (no network at view time): the
verdict, a time-accounting chart per feeding thread (per second: running outside CUDA, in CUDA,
waiting for a CPU, sleeping; the culprits on hover), GPU utilisation and host CPU, the causal
chains with their evidence and the SQL behind each number, and the per-process table."""

EPILOG = """\
examples:
  ingero-mcp report --db run.duckdb -o report.html
  ingero-mcp report --db run.duckdb -o last30s.html --since 30s"""


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the `report` parser."""
    p = subparsers.add_parser("report", help="the incident report as a self-contained HTML file",
                              description=DESCRIPTION,
                              epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--db", required=True, help="trace store (DuckDB file)")
    p.add_argument("-o", "--output", required=True, help="HTML file to write")
    add_window_args(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Write the report and say where."""
    from ingero_mcp.export.html import write_report

    size = write_report(args.db, args.output, pids=args.pid or None, since=args.since, start=args.start, end=args.end)
    print(f"wrote {args.output} ({size / 1e6:.1f} MB): open it in a browser (no network needed)")
    return 0
