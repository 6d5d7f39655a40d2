"""Latency of each MCP tool on a ~1M-event trace (target: every tool under 1 s).

Makes the demo's dataloader scenario scaled until its rows (CUDA calls, scheduler intervals,
process events, snapshots, aggregates) reach --events, then calls every tool through the SDK's
in-process client (the full MCP request path, without a pipe) and over stdio for one tool, and
prints the median and max of --repeat calls per tool with the result sizes; then the same rows as
a recording in progress (Parquet segments), where a call after a new segment re-reads the store.

    .venv/bin/python bench/bench_mcp.py                      # 1M events, store in /tmp
    .venv/bin/python bench/bench_mcp.py --events 5000000 --json out.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import anyio

ROW_TABLES = ("cuda_calls", "sched_intervals", "process_events", "snapshots", "host_aggregates")
CALLS: list[tuple[str, dict[str, Any]]] = [
    ("get_trace_info", {}),
    ("get_trace_stats", {}),
    ("get_trace_stats", {"since": "10s"}),
    ("get_causal_chains", {}),
    ("get_per_process_breakdown", {}),
    ("get_timeline", {"limit": 200}),
    ("get_timeline", {"pid": 4100, "around": "+30s", "limit": 200}),
    ("get_system_context", {}),
    ("run_sql", {"sql": "SELECT op, count(*), quantile_cont(duration_ns, 0.99) FROM cuda_calls GROUP BY op"}),
    ("run_sql", {"sql": "SELECT * FROM cuda_calls", "limit": 10000}),
]


def rows_in(db: Path) -> int:
    from ingero_mcp.store import open_store

    con = open_store(db)
    try:
        return sum(int(con.execute(f"SELECT count(*) FROM {t}").fetchall()[0][0]) for t in ROW_TABLES)
    finally:
        con.close()


def make_store(db: Path, events: int) -> int:
    """The dataloader scenario scaled to at least `events` rows; reuses a store that already has them."""
    from ingero_mcp.demo.scenarios import generate

    if db.exists():
        have = rows_in(db)
        if have >= events:
            return have
        db.unlink()
    probe = db.with_suffix(".probe.duckdb")
    probe.unlink(missing_ok=True)
    generate("dataloader", probe, scale=1.0)
    per_scale = rows_in(probe)
    probe.unlink()
    generate("dataloader", db, scale=events / per_scale * 1.02)
    return rows_in(db)


async def bench_in_process(db: Path, repeat: int) -> list[dict[str, Any]]:
    from mcp import Client

    from ingero_mcp.mcp.server import build_server

    started = time.perf_counter()
    server = build_server(db)
    startup_s = time.perf_counter() - started
    out: list[dict[str, Any]] = [{"tool": "(start-up: open store + schema)", "args": {}, "median_s": startup_s,
                                  "max_s": startup_s}]
    async with Client(server) as client:
        for name, args in CALLS:
            times = []
            result = None
            for _ in range(repeat):
                t0 = time.perf_counter()
                result = await client.call_tool(name, args)
                times.append(time.perf_counter() - t0)
            assert result is not None
            if result.is_error:
                raise SystemExit(f"{name} {args} failed: {result.content[0].text}")
            out.append({
                "tool": name, "args": args, "median_s": statistics.median(times), "max_s": max(times),
                "text_chars": len(result.content[0].text),
                "json_chars": len(json.dumps(result.structured_content, separators=(",", ":"))),
            })
    server.store.close()
    return out


async def bench_stdio(db: Path, repeat: int) -> dict[str, Any]:
    from mcp import Client, StdioServerParameters

    exe = Path(sys.executable).with_name("ingero-mcp")
    t0 = time.perf_counter()
    async with Client(StdioServerParameters(command=str(exe), args=["mcp", "--db", str(db)])) as client:
        connect_s = time.perf_counter() - t0
        times = []
        for _ in range(repeat):
            t1 = time.perf_counter()
            await client.call_tool("get_causal_chains", {})
            times.append(time.perf_counter() - t1)
    return {"tool": "get_causal_chains over stdio", "connect_s": connect_s, "median_s": statistics.median(times),
            "max_s": max(times)}


def make_live_copy(db: Path) -> Path:
    """The same rows as a recording in progress: a schema-only file plus Parquet segments (100k rows each)."""
    import shutil

    import duckdb

    from ingero_mcp.store import TraceWriter, segment_dir

    live = db.with_name(db.stem + "-live.duckdb")
    live.unlink(missing_ok=True)
    shutil.rmtree(segment_dir(live), ignore_errors=True)
    src = duckdb.connect(str(db), read_only=True)
    writer = TraceWriter(live, live=True)
    session = src.sql("SELECT * EXCLUDE (session_id, stopped_ns) FROM sessions").to_arrow_table()
    writer.replace("sessions", session)
    for table in ROW_TABLES:
        rows = src.sql(f"SELECT * EXCLUDE (session_id) FROM {table}").to_arrow_table()
        for start in range(0, rows.num_rows, 100_000):
            writer.append(table, rows.slice(start, 100_000))
            writer.flush()
    src.close()
    return live  # the writer is left unclosed: the store stays "recording"


async def bench_live(live: Path, repeat: int) -> dict[str, Any]:
    """Tool latency on a live store: each call after a new segment pays for re-reading the store."""
    from mcp import Client

    from ingero_mcp.mcp.server import build_server
    from ingero_mcp.store import TraceWriter

    t0 = time.perf_counter()
    server = build_server(live, reopen_min_s=0.0)
    startup_s = time.perf_counter() - t0
    writer = TraceWriter(live, live=True, session_id=1)
    fresh, cached = [], []
    async with Client(server) as client:
        for i in range(repeat):
            writer.append("snapshots", {"ts_ns": [i], "cpu_percent": [1.0]})
            writer.flush()
            t1 = time.perf_counter()
            await client.call_tool("get_trace_stats", {})
            fresh.append(time.perf_counter() - t1)
            t1 = time.perf_counter()
            await client.call_tool("get_trace_stats", {})
            cached.append(time.perf_counter() - t1)
    server.store.close()
    return {"startup_s": startup_s, "after_new_segment_s": statistics.median(fresh),
            "unchanged_s": statistics.median(cached)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--db", type=Path, default=None,
                        help="store to use/create (default /tmp/ingero-bench-<events>.duckdb)")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--json", type=Path, default=None, help="also write the numbers here")
    args = parser.parse_args()
    db = args.db or Path(f"/tmp/ingero-bench-{args.events}.duckdb")
    t0 = time.perf_counter()
    rows = make_store(db, args.events)
    print(f"store {db}: {rows:,} rows ({time.perf_counter() - t0:.1f} s to make or check)")
    results = anyio.run(bench_in_process, db, args.repeat)
    stdio = anyio.run(bench_stdio, db, args.repeat)
    print(f"{'tool':<28} {'args':<52} {'median':>8} {'max':>8} {'text':>7} {'json':>7}")
    for r in results:
        print(f"{r['tool']:<28} {json.dumps(r['args'])[:52]:<52} {r['median_s'] * 1000:>6.0f}ms "
              f"{r['max_s'] * 1000:>6.0f}ms {r.get('text_chars', ''):>7} {r.get('json_chars', ''):>7}")
    print(f"{stdio['tool']:<81} {stdio['median_s'] * 1000:>6.0f}ms {stdio['max_s'] * 1000:>6.0f}ms "
          f"(server start + connect {stdio['connect_s']:.2f} s)")
    live = anyio.run(bench_live, make_live_copy(db), args.repeat)
    print(f"live store (same rows in Parquet segments): start-up {live['startup_s']:.2f} s; "
          f"get_trace_stats after a new segment {live['after_new_segment_s'] * 1000:.0f}ms (re-reads the store), "
          f"unchanged {live['unchanged_s'] * 1000:.0f}ms")
    slow = [r for r in results[1:] if r["median_s"] >= 1.0]
    print("all tools under 1 s" if not slow else f"OVER 1 s: {[r['tool'] for r in slow]}")
    if args.json:
        args.json.write_text(json.dumps({"rows": rows, "in_process": results, "stdio": stdio, "live": live}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
