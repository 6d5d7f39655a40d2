"""`ingero-mcp import`: bring another tool's trace (Ingero's SQLite databases) into a trace store."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

DESCRIPTION = """\
Import an Ingero trace database (SQLite, schema 0.8 or 0.9) into a DuckDB trace store, without
loss: CUDA/driver calls, scheduler and process events, per-minute aggregates, system snapshots,
Ingero's own causal chains, stacks and metadata. Ingero stores a small sample of events as rows
and exact counts per minute; the store keeps that distinction (see table_coverage). Importing
into an existing store adds new sessions and keeps the ones already there; importing a file the
store already holds is refused (--replace imports it again in place of its sessions). The source
is only read: nothing is written beside it, so a read-only folder works."""

EPILOG = """\
examples:
  ingero-mcp import pytorch-dataloader-starvation.db --db run.duckdb
  ingero-mcp explain --db run.duckdb"""


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Add the `import` subcommand."""
    parser = subparsers.add_parser(
        "import",
        help="import an Ingero SQLite trace into a trace store",
        description=DESCRIPTION,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("src", metavar="SRC.db", type=Path, help="Ingero trace database (SQLite)")
    parser.add_argument("--db", required=True, type=Path, help="trace store to write (DuckDB; created if missing)")
    parser.add_argument("--replace", action="store_true",
                        help="the store already holds this file's Ingero sessions: import them again in their place "
                        "(without it, a second import of the same file is refused rather than counted twice)")
    parser.add_argument("--quiet", "-q", action="store_true", help="no progress bar and no summary")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Import, with a progress bar on a terminal, then print one summary line per session."""
    from ingero_mcp.importers import import_ingero

    show = not args.quiet and sys.stderr.isatty()
    if show:
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        with Progress(
            TextColumn("importing {task.fields[stage]:<18}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
            console=Console(stderr=True), transient=True,
        ) as bar:
            task = bar.add_task("import", total=None, stage="")

            def progress(stage: str, done: int, total: int) -> None:
                bar.update(task, completed=done, total=total, stage=stage)

            summary = import_ingero(args.src, args.db, progress, replace=args.replace)
    else:
        summary = import_ingero(args.src, args.db, replace=args.replace)
    for warning in summary.warnings:
        print(f"ingero-mcp import: warning: {warning}", file=sys.stderr)
    if not args.quiet:
        rows = summary.total_rows_read
        rate = rows / summary.seconds if summary.seconds > 0 else 0.0
        sessions = ", ".join(map(str, summary.session_ids))
        print(
            f"imported {args.src} (Ingero schema {summary.schema_version}) into {args.db}: "
            f"session(s) {sessions}; {rows:,} rows in {summary.seconds:.2f} s ({rate:,.0f} rows/s)"
        )
        written = ", ".join(f"{t} {n:,}" for t, n in sorted(summary.rows_written.items()))
        print(f"  rows written: {written}")
        print(f"  next: ingero-mcp explain --db {args.db}")
    return 0
