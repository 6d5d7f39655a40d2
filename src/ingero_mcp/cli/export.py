"""`ingero-mcp export`: the trace as a timeline file for ui.perfetto.dev (or chrome://tracing)."""

from __future__ import annotations

import argparse

from ingero_mcp.cli._args import add_window_args

DESCRIPTION = """\
Export a trace as a timeline: a process track per traced process, a thread track per traced
thread with its CUDA calls, the thread's off-CPU states (waiting for a CPU, sleeping, IO; a gap
between them: running) on a track below it, wake-up arrows, process events, host counters and
the causal chains' windows.
Open the file at https://ui.perfetto.dev (JSON also in chrome://tracing)."""

EPILOG = """\
examples:
  ingero-mcp export --db run.duckdb -o run.pftrace
  ingero-mcp export --db run.duckdb -o run.json --format json --since 30s --pid 4100"""


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the `export` parser."""
    p = subparsers.add_parser("export", help="the trace as a Perfetto / Chrome timeline file", description=DESCRIPTION,
                              epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--db", required=True, help="trace store (DuckDB file)")
    p.add_argument("-o", "--output", required=True, help="file to write (.pftrace, or .json with --format json)")
    p.add_argument("--format", choices=("perfetto", "json"), default=None,
                   help="perfetto (protobuf, default) or json (Chrome trace events); default from the file name")
    p.add_argument("--quiet", "-q", action="store_true", help="no progress bar")
    add_window_args(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Write the file and say what is in it."""
    import sys
    import time
    from functools import partial

    from ingero_mcp.export.run import export_timeline

    fmt = args.format or ("json" if str(args.output).endswith(".json") else "perfetto")
    t0 = time.monotonic()
    run_export = partial(export_timeline, args.db, args.output, fmt, pids=args.pid or None, since=args.since,
                         start=args.start, end=args.end)
    if not args.quiet and sys.stderr.isatty():  # a bar on a terminal, as `import` shows one
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        with Progress(TextColumn("exporting {task.fields[stage]:<14}"), BarColumn(), MofNCompleteColumn(),
                      TimeElapsedColumn(), console=Console(stderr=True), transient=True) as bar:
            task = bar.add_task("export", total=None, stage="")

            def progress(stage: str, done: int, total: int | None) -> None:
                bar.update(task, completed=done, total=total, stage=stage)

            counts = run_export(progress=progress)
    else:
        counts = run_export()
    summary = ", ".join(f"{v:,} {k.replace('_', ' ')}" for k, v in counts.items())
    print(f"wrote {args.output} ({fmt}, {time.monotonic() - t0:.1f} s): {summary}")
    print("open it at https://ui.perfetto.dev" + (" or chrome://tracing" if fmt == "json" else ""))
    return 0
