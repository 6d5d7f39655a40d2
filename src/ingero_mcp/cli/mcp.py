"""`ingero-mcp mcp --db PATH`: serve one trace to an AI assistant over stdio MCP.

The store is opened (read-only) before the server starts, so a missing or unreadable trace is one
line on stderr and exit code 2, never a traceback; stdout carries nothing but the protocol.
"""

from __future__ import annotations

import argparse
import sys

DESCRIPTION = """\
Serve a trace store to an MCP client (Claude Code, ollmcp, the MCP Inspector) over stdio.
Tools: get_trace_stats, get_causal_chains, get_evidence_sql, get_per_process_breakdown,
get_timeline, get_system_context, get_trace_info, run_sql (read-only); resources:
ingero://schema, ingero://report; prompt: investigate.
The store is opened read-only; a trace still being recorded is served with what it holds
so far and re-read when it grows."""

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
        "--sql-timeout", type=float, default=10.0, metavar="SECONDS", help="stop run_sql queries after this long (default 10)"
    )
    parser.add_argument("--out-dir", metavar="DIR", help="where save_picture writes reports and timelines "
                        "(default: ingero-mcp-UID in the temp directory)")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Open the store, then serve until the client closes stdin."""
    from ingero_mcp.store.errors import StoreError

    if args.sql_timeout <= 0:
        print("ingero-mcp mcp: --sql-timeout must be positive", file=sys.stderr)
        return 2
    try:
        from ingero_mcp.mcp.server import build_server

        server = build_server(args.db, sql_timeout_s=args.sql_timeout, out_dir=args.out_dir)
    except StoreError:
        raise  # one line, exit 2 (the dispatcher prints it)
    except Exception as exc:  # noqa: BLE001 - start-up must never print a traceback to the client
        print(f"ingero-mcp mcp: cannot serve {args.db}: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 2
    try:
        server.run("stdio")
    except KeyboardInterrupt:
        return 0
    return 0
