"""`ingero-mcp trace`: record CUDA calls and kernel events of a GPU job into a trace store (root)."""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

EPILOG = """\
examples:
  sudo ingero-mcp trace --db run.duckdb                      every process using CUDA, until Ctrl-C
  sudo ingero-mcp trace --duration 60 --db run.duckdb        one minute
  sudo ingero-mcp trace --pid 4242 --db run.duckdb           pid 4242 and its children; stops when they exit
  sudo ingero-mcp trace --cuda-lib /usr/lib/x86_64-linux-gnu/libcuda.so.1 --db run.duckdb
                                                             attach now, before the job loads the library
  sudo ingero-mcp trace --api driver --db run.duckdb         half the probes for a launch-heavy job
  ingero-mcp explain --db run.duckdb                         while recording or after

Cost: each traced call pays a uprobe + uretprobe, about 1.5 us on an H200 host; a PyTorch runtime
call also enters the driver, so it is traced twice with --api both (the default).
A virtual environment keeps working under sudo: sudo $(which ingero-mcp) trace ...
Run `ingero-mcp check` first to see what this machine lacks."""


def parse_duration(text: str) -> float:
    """'90', '90s', '5m', '1h' -> seconds."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h)?\s*", text)
    if not m:
        raise argparse.ArgumentTypeError(f"not a duration: {text!r} (use e.g. 60, 60s, 5m)")
    value = float(m.group(1))
    return value * {"ms": 0.001, "s": 1, "m": 60, "h": 3600, None: 1}[m.group(2)]


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the `trace` subcommand."""
    parser = subparsers.add_parser(
        "trace",
        help="record CUDA calls + kernel events (root, BCC)",
        description="Record every CUDA runtime/driver call of the traced processes (with what the kernel did "
        "to the calling thread during each call: preempted, blocked, context switches, page allocations), "
        "their scheduler intervals, fork/exec/exit/oom, exact per-process counts of context switches and "
        "page allocations for the whole host, and a system snapshot each second. The store is readable "
        "while recording.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--db", required=True, type=Path, help="trace store to write (DuckDB file)")
    parser.add_argument("--duration", type=parse_duration, default=None, help="stop after this long (default: Ctrl-C)")
    parser.add_argument("--pid", type=int, action="append", default=[], help="trace this process and its children (repeatable)")
    parser.add_argument("--cuda-lib", action="append", default=[], metavar="PATH",
                        help="attach this libcudart/libcuda file now (repeatable)")
    parser.add_argument("--api", choices=("both", "runtime", "driver"), default="both",
                        help="which CUDA API to probe (default both). Each runtime call also enters the driver, so "
                        "one API halves the cost per call: 'runtime' misses direct driver users (cuBLAS launches, "
                        "Triton, JAX, CuPy); 'driver' misses runtime calls served without an exported driver entry "
                        "(e.g. cudaDeviceSynchronize)")
    parser.add_argument("--quiet", action="store_true", help="no live view")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Check the machine, record, and report."""
    from ingero_mcp.collector.preflight import blocking_failures, run_checks

    failures = blocking_failures(run_checks(include_optional=False))
    if failures:
        print("ingero-mcp trace: this machine cannot run the collector yet:", file=sys.stderr)
        for check in failures:
            print(f"  FAIL {check.name}: {check.detail}\n       -> {check.fix}", file=sys.stderr)
        print("  (`ingero-mcp check` shows every check)", file=sys.stderr)
        return 2

    from ingero_mcp.collector.tracer import TraceOptions, Tracer, install_signal_handlers

    apis = ("runtime", "driver") if args.api == "both" else (args.api,)
    opts = TraceOptions(db=args.db, duration_s=args.duration, pids=args.pid, cuda_libs=args.cuda_lib, apis=apis,
                        quiet=args.quiet)
    tracer = Tracer(opts, argv=sys.argv[1:])
    install_signal_handlers(tracer)
    try:
        tracer.start()
    except (ProcessLookupError, FileNotFoundError, FileExistsError) as exc:
        print(f"ingero-mcp trace: {exc}", file=sys.stderr)
        return 2
    if args.quiet:
        return tracer.run()
    from ingero_mcp.collector.liveview import LiveView

    with LiveView(tracer):
        return tracer.run()
