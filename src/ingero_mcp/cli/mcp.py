"""`ingero-mcp mcp --db PATH`: serve one trace to an AI assistant over stdio MCP.

The store is opened (read-only) before the server starts. One that cannot be read (missing, damaged, not a
store) is served all the same, with one line on stderr: the client lists the tools and each says why, where
a server that exited would leave it with "Connection closed". A bad --out-dir is one line and exit code 2.
stdout carries nothing but the protocol.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from ingero_mcp.sanitize import clean

DESCRIPTION = """\
Serve a trace store to an MCP client (Claude Code, ollmcp, the MCP Inspector) over stdio.
Tools: get_trace_info, get_trace_stats, get_causal_chains, get_time_accounting,
get_evidence_sql, get_per_process_breakdown, get_timeline, get_stacks, get_system_context,
run_sql (read-only), save_picture; resources: ingero://schema, ingero://report; prompt:
investigate.
The store is opened read-only. A trace still being recorded is served with what it holds
so far and re-read when it grows: at most once per four times what the last re-read cost
(on a large recording the calls in between answer from a snapshot up to a minute old)."""

EPILOG = """\
examples:
  ingero-mcp mcp --db run.duckdb
  claude --mcp-config examples/mcp-config.json        # then /mcp__ingero__investigate
  ollmcp -m qwen2.5:14b -j examples/mcp-config.json
  npx @modelcontextprotocol/inspector --cli ingero-mcp mcp --db run.duckdb --method tools/list

MCP clients start servers with a minimal environment: in a config file use absolute paths
(or the venv's bin/ingero-mcp)."""


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Add the `mcp` subcommand."""
    parser = subparsers.add_parser(
        "mcp",
        help="serve a trace to an AI assistant (stdio MCP server)",
        description=DESCRIPTION,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--db", required=True, help="the trace store (DuckDB file) to serve")
    parser.add_argument(
        "--sql-timeout", type=float, default=10.0, metavar="SECONDS",
        help="stop run_sql queries after this long (default 10)"
    )
    parser.add_argument("--out-dir", metavar="DIR", help="where save_picture writes reports and timelines "
                        "(default: ingero-mcp-UID in the temp directory)")
    parser.set_defaults(func=run)


def out_dir_problem(folder: Path) -> str | None:
    """Why save_picture could not write in `folder` (a file, not writable, under a file), or None when it can."""
    if folder.exists():
        if not folder.is_dir():
            return f"{folder} is a file, not a folder"
        if not os.access(folder, os.W_OK | os.X_OK):
            return f"{folder}: no permission to create files there"
        return None
    parent = folder.parent
    while not parent.exists() and parent != parent.parent:  # the nearest folder that exists gets the new ones
        parent = parent.parent
    if not parent.is_dir():
        return f"{folder} cannot be made: {parent} is a file, not a folder"
    if not os.access(parent, os.W_OK | os.X_OK):
        return f"{folder} cannot be made: no permission to create folders in {parent}"
    return None


def run(args: argparse.Namespace) -> int:
    """Open the store, then serve until the client closes stdin."""
    from ingero_mcp.store.errors import StoreError

    if args.sql_timeout <= 0:
        print("ingero-mcp mcp: --sql-timeout must be positive", file=sys.stderr)
        return 2
    if args.out_dir:
        problem = out_dir_problem(Path(args.out_dir))
        if problem:
            print(f"ingero-mcp mcp: --out-dir {problem}", file=sys.stderr)
            return 2
    try:
        from ingero_mcp.mcp.server import build_server

        server = build_server(args.db, sql_timeout_s=args.sql_timeout, out_dir=args.out_dir)
    except StoreError:
        raise  # one line, exit 2 (the dispatcher prints it)
    except Exception as exc:  # noqa: BLE001 - start-up must never print a traceback to the client
        print(f"ingero-mcp mcp: cannot serve {args.db}: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 2
    unreadable = server.store.unreadable  # type: ignore[attr-defined]
    if unreadable:
        print(f"ingero-mcp mcp: serving, but the trace store cannot be read: {clean(unreadable, 1000)} "
              "(each tool says so)", file=sys.stderr)
    try:
        server.run("stdio")
    except KeyboardInterrupt:
        return 0
    return 0
