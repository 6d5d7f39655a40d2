"""Each MCP tool's first call and the calls after it, on one store (issue 20: every call after the first <= 0.5 s
at 10M events, <= 2 s at 100M). Through the SDK's in-process client: the full request path, without a pipe.

    PYTHONPATH=src .venv/bin/python bench/bench_mcp_calls.py /tmp/10m.duckdb --repeat 3

Prints the machine's load with the numbers (the development machine is shared).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import anyio

CALLS: list[tuple[str, dict[str, Any]]] = [
    ("get_trace_info", {}),
    ("get_trace_stats", {}),
    ("get_causal_chains", {}),
    ("get_time_accounting", {}),
    ("get_per_process_breakdown", {}),
    ("get_timeline", {"limit": 200}),
    ("get_system_context", {}),
]


async def bench(db: Path, repeat: int) -> list[tuple[str, float, float, float]]:
    """(tool, start-up or first call s, median of the calls after it s, max of those s) per tool."""
    from mcp import Client

    from ingero_mcp.mcp.server import build_server

    t0 = time.perf_counter()
    server = build_server(db)
    out = [("(start-up: open store)", time.perf_counter() - t0, 0.0, 0.0)]
    async with Client(server) as client:
        for name, args in CALLS:
            times = []
            for _ in range(repeat):
                t1 = time.perf_counter()
                result = await client.call_tool(name, args)
                times.append(time.perf_counter() - t1)
                if result.is_error:
                    raise SystemExit(f"{name} failed: {result.content[0].text}")
            later = times[1:] or times
            out.append((name, times[0], statistics.median(later), max(later)))
    server.store.close()
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("db", type=Path)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    print(f"load {os.getloadavg()[0]:.2f}; {args.db}")
    for name, first, median, worst in anyio.run(bench, args.db, args.repeat):
        print(f"{name:<28} first {first * 1000:>7.0f} ms   after: median {median * 1000:>6.0f} ms, "
              f"max {worst * 1000:>6.0f} ms")
    print(f"load {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
