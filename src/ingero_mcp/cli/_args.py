"""Arguments several subcommands share: the pid filter and the time window, read as `explain` reads them."""

from __future__ import annotations

import argparse


def add_window_args(p: argparse.ArgumentParser) -> None:
    """--pid (repeatable), --since, --from, --to, with explain's meaning."""
    p.add_argument("--pid", type=int, action="append", metavar="PID", help="only these processes (repeatable)")
    p.add_argument("--since", metavar="DUR", help="the last DUR of the trace (as in explain)")
    p.add_argument("--from", dest="start", metavar="TIME", help="window start (as in explain)")
    p.add_argument("--to", dest="end", metavar="TIME", help="window end")
