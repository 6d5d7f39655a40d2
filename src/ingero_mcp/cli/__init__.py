"""The `ingero-mcp` command: one entry point, a subcommand per job.

Each subcommand lives in its own module with `register(subparsers)`, which adds its parser and
sets `func(args) -> int`. Modules import their heavy dependencies inside `func`, so `--help`
stays fast.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys

from ingero_mcp.sanitize import clean

# The subcommand modules, in the order a new user meets them.
SUBCOMMANDS: tuple[str, ...] = ("demo", "explain", "export", "report", "query", "import_", "trace", "check", "mcp")

EPILOG = """\
examples:
  ingero-mcp demo dataloader --db demo.duckdb      synthetic trace + its report (no GPU, no root)
  ingero-mcp explain --db run.duckdb               the incident report of a trace
  sudo ingero-mcp trace --duration 60 --db run.duckdb   record CUDA calls + kernel events
  ingero-mcp mcp --db run.duckdb                   serve the trace to an AI assistant (stdio MCP)

Each subcommand has its own --help."""


def build_parser() -> argparse.ArgumentParser:
    """The top-level parser with every subcommand module that exists registered on it."""
    parser = argparse.ArgumentParser(
        prog="ingero-mcp",
        description="Find out why a GPU job is slow when the GPU is not: eBPF traces of CUDA calls "
        "and the Linux kernel, stored in DuckDB, explained as causal chains, served over MCP.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    from ingero_mcp import __version__

    parser.add_argument("--version", action="version", version=f"ingero-mcp {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in SUBCOMMANDS:
        importlib.import_module(f"ingero_mcp.cli.{name}").register(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Parse, dispatch, and turn user-facing errors into one line on stderr and exit code 2."""
    from ingero_mcp.store.errors import StoreError

    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 0
    try:
        return int(args.func(args) or 0)
    except StoreError as exc:
        print(f"ingero-mcp {args.command}: {clean(str(exc), 2000)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"ingero-mcp {args.command}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # The reader went away (`explain --json | head`): not an error of ours, and no traceback.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 0
    except Exception as exc:
        if not _from_duckdb(exc):
            raise
        # A store that opens but cannot answer (damage the checks at open did not catch): one line, not a traceback.
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        db = getattr(args, "db", None)
        print(f"ingero-mcp {args.command}: the trace store {db or ''} could not answer: {clean(first, 500)} "
              "(a damaged or hand-edited store? `ingero-mcp query` can look inside)", file=sys.stderr)
        return 2


def _from_duckdb(exc: BaseException) -> bool:
    """Whether `exc` is one of DuckDB's errors (without importing DuckDB for commands that do not use it)."""
    return any(cls.__module__.split(".")[0] in ("duckdb", "_duckdb") for cls in type(exc).__mro__)


if __name__ == "__main__":
    sys.exit(main())
