"""`ingero-mcp demo`: write a synthetic scenario as a real trace store, then show its explain report.

No root and no GPU needed: the trace goes through the same writer as the collector, and the
report is printed by the same code as `ingero-mcp explain`.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

DESCRIPTION = """\
Generate a synthetic trace of a known host problem (no GPU, no root), store it as a DuckDB trace
store, and print the incident report that `ingero-mcp explain` gives for it.

The store is written to ./demo-<scenario>.duckdb unless --db says otherwise; an existing demo
store at that path is replaced (any other file is left alone). Without a scenario name, the
DataLoader-starvation scenario runs."""

EPILOG = """\
examples:
  ingero-mcp demo                                   dataloader scenario -> ./demo-dataloader.duckdb
  ingero-mcp demo --list                            the scenarios and what each one shows
  ingero-mcp demo cpu-contention --db /tmp/c.duckdb
  ingero-mcp explain --db demo-dataloader.duckdb --per-process     then dig into the store"""


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Add the `demo` subcommand."""
    p = subparsers.add_parser(
        "demo",
        help="synthetic trace of a known problem + its report (no GPU, no root)",
        description=DESCRIPTION,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("scenario", nargs="?", default="dataloader", help="scenario name (default: dataloader); see --list")
    p.add_argument("--db", type=Path, help="where to write the store (default: ./demo-<scenario>.duckdb)")
    p.add_argument("--list", action="store_true", help="list the scenarios and exit")
    p.add_argument("--seed", type=int, default=0, help="random seed (same seed, same trace; default 0)")
    p.add_argument("--scale", type=float, default=1.0, help="stretch the trace in time (1.0: 20-30 s of trace)")
    p.add_argument("--no-report", action="store_true", help="only write the store")
    p.set_defaults(func=run)


def _list() -> int:
    from ingero_mcp.demo import EXPECTED, base_duration_s

    for name, exp in EXPECTED.items():
        print(f"{name:<18} {exp.op} ({exp.cause}, {base_duration_s(name):.0f} s)")
        print(f"{'':<18} {exp.description}")
    return 0


def _clear_old_demo(db: Path) -> None:
    """Remove a previous demo store at `db`; refuse to touch anything else."""
    from ingero_mcp.analysis import trace_info
    from ingero_mcp.store import StoreError, open_store

    if not db.exists():
        return
    try:
        con = open_store(db)
        try:
            sources = [s.source for s in trace_info(con).sessions]
        finally:
            con.close()
    except StoreError as exc:
        raise StoreError(f"{db} exists and is not a demo trace store; choose another --db ({exc})") from exc
    if not all(s.startswith("demo:") for s in sources):
        raise StoreError(f"{db} holds a non-demo trace ({', '.join(sorted(set(sources)))}); choose another --db")
    db.unlink()
    wal = db.with_name(db.name + ".wal")
    if wal.exists():
        wal.unlink()


def _print_report(db: Path) -> int:
    """Run `ingero-mcp explain --db DB`: the same code path a user would take next."""
    from ingero_mcp.cli import explain

    parser = argparse.ArgumentParser(prog="ingero-mcp")
    explain.register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["explain", "--db", str(db)])
    return int(args.func(args) or 0)


def run(args: argparse.Namespace) -> int:
    """Write the scenario's store, say where, and print its report."""
    if args.list:
        return _list()
    from ingero_mcp.analysis import trace_info
    from ingero_mcp.demo import SCENARIOS, generate
    from ingero_mcp.store import StoreError, open_store

    if args.scenario not in SCENARIOS:
        raise StoreError(f"unknown scenario {args.scenario!r}; scenarios: {', '.join(SCENARIOS)} (see --list)")
    if args.scale <= 0 or args.scale > 1000:
        raise StoreError("--scale must be in (0, 1000]")
    db: Path = args.db or Path.cwd() / f"demo-{args.scenario}.duckdb"
    _clear_old_demo(db)
    generate(args.scenario, db, seed=args.seed, scale=args.scale)
    con = open_store(db)
    try:
        counts = trace_info(con).row_counts
    finally:
        con.close()
    calls, intervals = counts["cuda_calls"], counts["sched_intervals"]
    print(f"demo {args.scenario}: wrote {db} ({calls:,} CUDA calls, {intervals:,} scheduler intervals); "
          f"explore it with `ingero-mcp explain --db {db}`", file=sys.stderr)
    if args.no_report:
        return 0
    sys.stdout.flush()
    return _print_report(db)
