"""`ingero-mcp trace`: record CUDA calls and kernel events of a GPU job into a trace store (root)."""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path
from typing import Any

EPILOG = """\
examples:
  sudo ingero-mcp trace --db run.duckdb                      every process using CUDA, until Ctrl-C
  sudo ingero-mcp trace --duration 60 --db run.duckdb        one minute
  sudo ingero-mcp trace --pid 4242 --db run.duckdb           pid 4242 and its children; stops when they exit
  sudo ingero-mcp trace --cuda-lib /usr/lib/x86_64-linux-gnu/libcuda.so.1 --db run.duckdb
                                                             attach now, before the job loads the library
  sudo ingero-mcp trace --max-overhead 5 --db run.duckdb     allow an estimated 5 % (more launches seen)
  sudo ingero-mcp trace --launch-probes full --api both --db run.duckdb
                                                             every call of both APIs, launches with durations
  ingero-mcp explain --db run.duckdb                         while recording or after

Cost, and what the default leaves out: a probe traps into the kernel on every call (0.6-0.8 us for
an entry probe on an H200 host, about twice that with a return probe). By default one layer is probed
per logical call (--api auto: the driver's symbols, which PyTorch's runtime calls enter, plus the
runtime's cudaDeviceSynchronize/cudaEventSynchronize), and kernel launches entry-only: a launch's
row has no duration (duration_ns NULL), so a launch that blocks shows as the thread's time up to its
next call, not as time inside the launch. Syncs, copies and allocations keep entry + return (their
durations are the evidence). At start the collector measures what one hit costs here; while it
records it estimates each process's added time (hits x cost, table tracing_cost) and, above
--max-overhead, attaches the launch probes for only part of each second: launches made meanwhile
are not rows, the gaps are in table probe_gaps, and the analysis scales launch counts by the
covered share. It also measures what tracing a thread adds at each of its context switches (the
scheduler records, probe_costs 'sched_interval') and at each page it allocates (probe_costs
'page_alloc'), and explain adds off-CPU intervals and page allocations x those costs to the
estimate. The estimate leaves out the tracepoints' work for every other process and the collector's
own CPU (explain lists it beside), and it is not an upper bound:
measured slowdowns have been larger on a training-like loop (bench/README.md). With
`sysctl kernel.bpf_stats_enabled=1` while recording, the kernel also times every eBPF program
(some tens of ns per run), and explain adds their run time.
On kernels >= 6.6 uprobes attach as BPF links (uprobe_multi), quicker to detach than perf events;
INGERO_UPROBE_LINKS=0 forces perf events (the path for older kernels).
A virtual environment keeps working under sudo: sudo $(which ingero-mcp) trace ...
Run `ingero-mcp check` first to see what this machine lacks."""


def parse_duration(text: str) -> float:
    """'90', '90s', '5m', '1h' -> seconds."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h)?\s*", text)
    if not m:
        raise argparse.ArgumentTypeError(f"not a duration: {text!r} (use e.g. 60, 60s, 5m)")
    value = float(m.group(1))
    return value * {"ms": 0.001, "s": 1, "m": 60, "h": 3600, None: 1}[m.group(2)]


def _poll_interval(text: str) -> float:
    """--poll-interval: seconds between 0.01 and 1 ('0.25', '250ms')."""
    value = parse_duration(text)
    if not 0.01 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"--poll-interval {text}: must be between 0.01 and 1 s")
    return value


def _stack_hz(text: str) -> int:
    """--stack-hz: on-CPU samples per second per CPU, 0 (none) to 1000."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--stack-hz {text}: a whole number of samples per second") from None
    if not 0 <= value <= 1000:
        raise argparse.ArgumentTypeError(f"--stack-hz {text}: must be between 0 (none) and 1000")
    return value


def _percent(text: str) -> float | None:
    """'2', '2%', '0.5' -> percent; 'off' -> None."""
    if text.strip().lower() in ("off", "none"):
        return None
    try:
        value = float(text.strip().rstrip("%"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a percentage: {text!r} (use e.g. 2, 0.5, or off)") from None
    if not 0 < value <= 100:
        raise argparse.ArgumentTypeError(f"--max-overhead {text}: must be above 0 and at most 100 (or off)")
    return value


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the `trace` subcommand."""
    parser = subparsers.add_parser(
        "trace",
        help="record CUDA calls + kernel events (root, BCC)",
        description="Record every CUDA runtime/driver call of the traced processes (with what the kernel did "
        "to the calling thread during each call: preempted, blocked, context switches, page allocations), "
        "their scheduler intervals, fork/exec/exit/oom, exact per-process counts of context switches and "
        "page allocations for the whole host, and a system snapshot each second; the user and kernel stacks a "
        "traced thread went to sleep in, and on-CPU stack samples of the traced threads (--stack-hz). The store is "
        "readable while recording.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--db", required=True, type=Path, help="trace store to write (DuckDB file)")
    parser.add_argument("--duration", type=parse_duration, default=None, help="stop after this long (default: Ctrl-C)")
    parser.add_argument("--pid", type=int, action="append", default=[],
                        help="trace this process and its children (repeatable)")
    parser.add_argument("--cuda-lib", action="append", default=[], metavar="PATH",
                        help="attach this libcudart/libcuda file now (repeatable)")
    parser.add_argument("--api", choices=("auto", "both", "runtime", "driver"), default="auto",
                        help="which CUDA API to probe. 'auto' (default): one layer per logical call, the driver's "
                        "symbols (runtime calls enter them; direct driver users too) plus the runtime calls that do "
                        "not enter them (cudaDeviceSynchronize, cudaEventSynchronize); a process whose libcudart has "
                        "no probed libcuda beneath it (a runtime that loads none, a driver not found) gets the "
                        "runtime's own symbols, and the log says so. 'both': every symbol of both "
                        "libraries (a runtime call and the driver call nested in it are two rows, two traps). "
                        "'runtime' misses direct driver users (cuBLAS launches, Triton, JAX, CuPy); 'driver' misses "
                        "cudaDeviceSynchronize")
    parser.add_argument("--launch-probes", choices=("entry", "full"), default="entry",
                        help="kernel and graph launches: 'entry' (default) one entry probe per launch, no duration "
                        "(rows with duration_ns NULL); 'full' entry + return like every other call (twice the cost "
                        "per launch; the governor then only estimates, it never detaches)")
    parser.add_argument("--max-overhead", type=_percent, default=2.0, metavar="PCT",
                        help="estimated added time allowed per traced process, in percent of its wall time "
                        "(default 2). Above it, the launch probes are attached for only part of each second; "
                        "'off' never detaches (the estimate is still stored)")
    parser.add_argument("--no-calibrate", action="store_true",
                        help="do not measure the per-hit probe costs (~0.5 s) nor the scheduler records' cost per "
                        "off-CPU interval (~0.2 s) at start; the estimate then uses defaults for the probes (900 ns "
                        "entry-only, 1400 ns entry + return) and says the scheduler records' share is unknown, each "
                        "stored as such in probe_costs")
    parser.add_argument("--poll-interval", type=_poll_interval, default=0.25, metavar="S",
                        help="the longest the collector leaves its ring buffers unread (default 0.25); it reads "
                        "sooner when they fill faster, so nothing is lost. Shorter means more wake-ups, which may "
                        "cost the job too: on the H200 a training loop ran a median 19.5 %% slower traced with "
                        "0.02 and 6.7 %% with the default, in one call (bench/README.md)")
    parser.add_argument("--stack-hz", type=_stack_hz, default=49, metavar="N",
                        help="on-CPU samples of the traced threads per second per CPU (default 49; 0: none), each "
                        "with the thread's user stack (and its kernel stack when it was in the kernel): which of its "
                        "functions a thread ran (stack_samples). User stacks are also taken wherever the kernel "
                        "stack is (a switch-out into sleep: sched_intervals.ustack_id), whatever N is")
    parser.add_argument("--no-checkpoints", dest="checkpoints", action="store_false",
                        help="keep no checkpoint. By default, from 30 s into the recording and then at most every 20 "
                        "times what the last one took, a child process at nice 19 writes DB.checkpoint/, a finished "
                        "copy of everything recorded so far (its accounting and the whole trace's answers made), "
                        "from which an MCP server started mid-recording answers at once (its answers say how far it "
                        "reaches) while it reads the rest; at 10M events one takes ~20 s and ~30 s of CPU")
    parser.add_argument("--quiet", action="store_true", help="no live view")
    parser.add_argument("--no-bpf-cache", dest="bpf_cache", action="store_false",
                        help="compile the eBPF program with clang, neither using nor writing the cache of "
                        "compiled programs. The cache ($XDG_CACHE_HOME/ingero-mcp/bpf, else ~/.cache/ingero-mcp/bpf of "
                        "the user it runs as) saves the 4-5 s of CPU clang takes at every start; it is keyed by the "
                        "program source, flags, kernel and BCC, so a stale copy is never loaded")
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

    apis = ("runtime", "driver") if args.api in ("both", "auto") else (args.api,)
    opts = TraceOptions(db=args.db, duration_s=args.duration, pids=args.pid, cuda_libs=args.cuda_lib, apis=apis,
                        layer="auto" if args.api == "auto" else "both", launch_probes=args.launch_probes,
                        max_overhead_pct=args.max_overhead, calibrate=not args.no_calibrate, quiet=args.quiet,
                        bpf_cache=args.bpf_cache, poll_interval_s=args.poll_interval, derive=_store_accounting,
                        stack_hz=args.stack_hz, checkpoints=args.checkpoints)
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


def _store_accounting(con: Any) -> object:
    """The finished store's accounting, made once at the fold (imported then: recording needs no DuckDB)."""
    from ingero_mcp.analysis import store_derived

    return store_derived(con)
