"""Benchmarks of the trace store and the analysis: writer ingest rows/s and explain latency.

Targets (issue 2, on the 2-core development machine): ingest >= 1M rows/s through `TraceWriter`,
and the explain report (build_report: the time accounting and the causal chains read off it) on a
10M-event trace in <= 3 s; the accounting's share (thread_seconds, accounting, chains) is timed apart.

    .venv/bin/python bench/bench_store.py              # 1M and 10M
    .venv/bin/python bench/bench_store.py --sizes 1m   # quick
    .venv/bin/python bench/bench_store.py --skip-ingest --skip-explain --segments 20000,60000

`--segments`: what writing one second of live segments costs the collector (CPU, process time) and the
disk, at that many CUDA calls a second (plus a third as many scheduler intervals and 600 aggregate rows),
with the writer's per-column encodings against Arrow's defaults.

Numbers go to stdout as a table (and --json FILE). Timings are wall clock; the machine's load
average is printed with them because the development machine is shared.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa

from ingero_mcp.demo import generate
from ingero_mcp.demo.synth import T0_NS
from ingero_mcp.store import TraceWriter, open_store

BATCH_ROWS = 1_000_000
# Events (cuda_calls + sched_intervals rows) per unit of dataloader scale, measured at scale 1 (the v2 demo:
# wakeups followed by CPU waits make fewer, longer steps than the v1 demo's 142,714).
DATALOADER_EVENTS_PER_SCALE = 127_486


def _cuda_batch(n: int, rng: np.random.Generator, offset_ns: int) -> pa.Table:
    """A cuda_calls batch shaped like the collector's: plain string columns, all attribution columns."""
    ops = np.array(["cudaLaunchKernel", "cudaMemcpyAsync", "cudaStreamSynchronize", "cudaMalloc"])
    op_idx = rng.choice(4, n, p=[0.85, 0.08, 0.05, 0.02])
    dur = rng.lognormal(np.log(8_000), 0.6, n).astype(np.int64)
    return pa.table({
        "ts_ns": pa.array(T0_NS + offset_ns + np.cumsum(dur + 20_000)),
        "duration_ns": pa.array(dur),
        "pid": pa.array(np.full(n, 4100, np.int32)),
        "tid": pa.array(np.full(n, 4100, np.int32)),
        "api": pa.array(np.full(n, "runtime").astype(object), pa.string()),
        "op": pa.array(ops[op_idx].astype(object), pa.string()),
        "bytes": pa.array(np.where(op_idx == 1, 1 << 20, 0).astype(np.int64)),
        "memcpy_kind": pa.array(np.where(op_idx == 1, "H2D", None).astype(object), pa.string()),
        "stream": pa.array(np.zeros(n, np.uint64)),
        "return_code": pa.array(np.zeros(n, np.int32)),
        "off_cpu_ns": pa.array(np.zeros(n, np.int64)),
        "cpu_wait_ns": pa.array(np.zeros(n, np.int64)),
        "sleep_ns": pa.array(np.zeros(n, np.int64)),
        "context_switches": pa.array(np.zeros(n, np.int32)),
        "page_allocs": pa.array(rng.poisson(0.1, n).astype(np.int32)),
        "page_alloc_bytes": pa.array(np.zeros(n, np.int64)),
        "gpu_id": pa.array(np.zeros(n, np.int32)),
    })


def _sched_batch(n: int, rng: np.random.Generator) -> pa.Table:
    off = T0_NS + np.cumsum(rng.integers(100_000, 3_000_000, n))
    length = rng.integers(10_000, 2_000_000, n)
    return pa.table({
        "pid": pa.array(np.full(n, 4101, np.int32)), "tid": pa.array(np.full(n, 4101, np.int32)),
        "off_ns": pa.array(off), "on_ns": pa.array(off + length), "off_cpu_ns": pa.array(length),
        "prev_state": pa.array(np.where(rng.random(n) < 0.7, "preempted", "sleeping").astype(object), pa.string()),
        "preemptor_pid": pa.array(rng.integers(4100, 4105, n).astype(np.int32)),
        "preemptor_comm": pa.array(np.full(n, "pt_data_worker").astype(object), pa.string()),
        "cpu": pa.array(rng.integers(0, 4, n).astype(np.int32)),
    })


def _agg_batch(n: int, rng: np.random.Generator) -> pa.Table:
    return pa.table({
        "bucket_start_ns": pa.array(T0_NS + (np.arange(n) // 50) * 1_000_000_000),
        "bucket_ns": pa.array(np.full(n, 1_000_000_000, np.int64)),
        "pid": pa.array((np.arange(n) % 50 + 1000).astype(np.int32)),
        "comm": pa.array(np.full(n, "proc").astype(object), pa.string()),
        "source": pa.array(np.full(n, "sched").astype(object), pa.string()),
        "op": pa.array(np.full(n, "sched_switch").astype(object), pa.string()),
        "count": pa.array(rng.integers(1, 1000, n)), "stored": pa.array(np.zeros(n, np.int64)),
    })


def bench_ingest(rows: int, tmp: Path, mixed: bool) -> dict[str, float]:
    """Rows/s through TraceWriter (direct mode) for `rows` rows; batches are built before the clock starts."""
    rng = np.random.default_rng(1)
    if mixed:  # the collector's mix: ~70 % cuda_calls, 28 % sched_intervals, 2 % aggregates
        plan = [("cuda_calls", 0.70), ("sched_intervals", 0.28), ("host_aggregates", 0.02)]
    else:
        plan = [("cuda_calls", 1.0)]
    batches: list[tuple[str, pa.Table]] = []
    for table, share in plan:
        n_table = int(rows * share)
        size = min(BATCH_ROWS, n_table)
        make = {"cuda_calls": lambda k: _cuda_batch(k, rng, 0), "sched_intervals": lambda k: _sched_batch(k, rng),
                "host_aggregates": lambda k: _agg_batch(k, rng)}[table]
        proto = make(size)
        for _ in range(n_table // size):
            batches.append((table, proto))
        rest = n_table - (n_table // size) * size
        if rest:
            batches.append((table, proto.slice(0, rest)))
    total = sum(t.num_rows for _, t in batches)
    db = tmp / f"ingest-{rows}-{'mixed' if mixed else 'cuda'}.duckdb"
    db.unlink(missing_ok=True)
    t0 = time.perf_counter()
    with TraceWriter(db) as w:
        w.replace("sessions", {"source": ["bench"], "started_ns": [T0_NS]})
        for table, batch in batches:
            w.append(table, batch)
    elapsed = time.perf_counter() - t0
    size_mb = db.stat().st_size / 1e6
    db.unlink()
    return {"rows": total, "seconds": elapsed, "rows_per_s": total / elapsed, "file_mb": size_mb}


def bench_explain(events: int, tmp: Path, repeats: int) -> dict[str, float]:
    """Generate a dataloader trace of ~`events` events, then time open_store + build_report."""
    from ingero_mcp.analysis.report import build_report

    scale = events / DATALOADER_EVENTS_PER_SCALE
    db = tmp / f"explain-{events}.duckdb"
    db.unlink(missing_ok=True)
    t0 = time.perf_counter()
    generate("dataloader", db, scale=scale)
    gen_s = time.perf_counter() - t0
    con = open_store(db)
    calls, intervals, aggs = con.execute(
        "SELECT (SELECT count(*) FROM cuda_calls), (SELECT count(*) FROM sched_intervals), "
        "(SELECT count(*) FROM host_aggregates)").fetchall()[0]
    con.close()
    times = []
    n_chains = 0
    for _ in range(repeats):
        t1 = time.perf_counter()
        con = open_store(db)
        report = build_report(con)
        con.close()
        times.append(time.perf_counter() - t1)
        n_chains = len(report.chains)
        top = report.chains[0] if report.chains else None
    # Where the time goes: the accounting alone (thread_seconds materialised once per connection, then the
    # per-thread totals, wakers and phases), and the chains read off it, each on a fresh connection.
    from ingero_mcp.analysis.accounting import accounting
    from ingero_mcp.analysis.chains import causal_chains
    from ingero_mcp.analysis.derive import materialize_seconds

    con = open_store(db)
    t3 = time.perf_counter()
    materialize_seconds(con)
    seconds_s = time.perf_counter() - t3
    acc = accounting(con)
    accounting_s = time.perf_counter() - t3
    causal_chains(con, acc=acc)
    chains_s = time.perf_counter() - t3 - accounting_s
    con.close()
    # The whole command as a user runs it (`explain --json`: analysis + serialisation), in-process.
    import contextlib
    import io

    from ingero_mcp.cli import main as cli_main

    t2 = time.perf_counter()
    with contextlib.redirect_stdout(io.StringIO()):
        rc = cli_main(["explain", "--db", str(db), "--json"])
    cli_s = time.perf_counter() - t2
    size_mb = db.stat().st_size / 1e6
    db.unlink()
    return {"events": calls + intervals, "cli_json_s": cli_s if rc == 0 else float("nan"), "cuda_calls": calls,
            "sched_intervals": intervals, "host_aggregates": aggs,
            "generate_s": gen_s, "explain_first_s": times[0], "explain_median_s": statistics.median(times),
            "chains": n_chains, "file_mb": size_mb, "thread_seconds_s": seconds_s, "accounting_s": accounting_s,
            "chains_s": chains_s,
            "top_chain": f"{top.severity} {top.op}: {top.root_cause}" if top else None}


def _parse_size(s: str) -> int:
    s = s.strip().lower()
    mult = {"k": 1_000, "m": 1_000_000}.get(s[-1], 1)
    return int(float(s.rstrip("km")) * mult)


def bench_segments(calls: int, tmp: Path, repeats: int = 9) -> dict[str, float]:
    """CPU seconds and bytes of one second's live segments at `calls` CUDA calls/s: the writer's encodings
    (store/writer.py `_encodings`) against Arrow's defaults (a dictionary tried on every column)."""
    import pyarrow.parquet as pq

    from ingero_mcp.store.writer import _encodings

    rng = np.random.default_rng(2)
    second = [_cuda_batch(calls, rng, 0), _sched_batch(max(1, calls // 3), rng), _agg_batch(600, rng)]
    out: dict[str, float] = {"calls": calls}
    for label, options in (("encodings", _encodings), ("arrow_defaults", lambda schema: {})):
        cpu, size = [], 0
        for _ in range(repeats):
            size = 0
            t0 = time.process_time()
            for i, batch in enumerate(second):
                path = tmp / f"seg-{i}.parquet"
                pq.write_table(batch, path, compression="zstd", **options(batch.schema))
                size += path.stat().st_size
            cpu.append(time.process_time() - t0)
        out[f"{label}_cpu_ms"] = statistics.median(cpu) * 1e3
        out[f"{label}_kb"] = size / 1e3
    return out


def main(argv: list[str] | None = None) -> int:
    """Run the benchmarks and print the table."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="1m,10m", help="comma-separated sizes (rows / events), e.g. 1m,10m")
    ap.add_argument("--repeats", type=int, default=3, help="explain runs per size (first + median reported)")
    ap.add_argument("--tmp", type=Path, default=None, help="scratch directory (default: a temp dir)")
    ap.add_argument("--skip-explain", action="store_true")
    ap.add_argument("--skip-ingest", action="store_true")
    ap.add_argument("--segments", default="", help="comma-separated CUDA calls/s for the live-segment benchmark")
    ap.add_argument("--json", type=Path, help="also write the results here")
    args = ap.parse_args(argv)
    sizes = [_parse_size(s) for s in args.sizes.split(",") if s]
    results: dict[str, object] = {"load_before": os.getloadavg(), "cpus": os.cpu_count()}
    with tempfile.TemporaryDirectory(dir=args.tmp) as tmpd:
        tmp = Path(tmpd)
        print(f"cpus {os.cpu_count()}, load average {os.getloadavg()[0]:.2f} {os.getloadavg()[1]:.2f} "
              f"{os.getloadavg()[2]:.2f}")
        if not args.skip_ingest:
            print(f"\n{'ingest':<26}{'rows':>12}{'seconds':>10}{'rows/s':>14}{'file MB':>10}   (target >= "
                  "1,000,000 rows/s)")
            ingest = []
            for n in sizes:
                for mixed in (False, True):
                    r = bench_ingest(n, tmp, mixed)
                    label = "mixed tables" if mixed else "cuda_calls"
                    ingest.append({"kind": label, **r})
                    print(f"{label:<26}{r['rows']:>12,}{r['seconds']:>10.2f}{r['rows_per_s']:>14,.0f}"
                          f"{r['file_mb']:>10.1f}", flush=True)
            results["ingest"] = ingest
        if not args.skip_explain:
            print(f"\n{'explain (dataloader)':<22}{'events':>12}{'generate s':>12}{'first s':>9}{'median s':>10}"
                  f"{'cli s':>8}{'chains':>8}{'file MB':>9}   (target 10M <= 3 s)")
            explain = []
            for n in sizes:
                r = bench_explain(n, tmp, args.repeats)
                explain.append(r)
                print(f"{'build_report + chains':<22}{r['events']:>12,}{r['generate_s']:>12.2f}"
                      f"{r['explain_first_s']:>9.2f}{r['explain_median_s']:>10.2f}{r['cli_json_s']:>8.2f}"
                      f"{r['chains']:>8}{r['file_mb']:>9.1f}", flush=True)
            for r in explain:
                print(f"  {r['events']:,} events, first chain: {r['top_chain']}; of the time: thread_seconds "
                      f"{r['thread_seconds_s']:.2f} s, accounting in all {r['accounting_s']:.2f} s, chains "
                      f"{r['chains_s']:.2f} s")
            results["explain"] = explain
        if args.segments:
            print(f"\n{'one second of live segments':<30}{'encodings CPU ms':>17}{'kB':>8}"
                  f"{'Arrow defaults CPU ms':>23}{'kB':>8}")
            segments = []
            for calls in (_parse_size(x) for x in args.segments.split(",") if x):
                r = bench_segments(calls, tmp)
                segments.append(r)
                print(f"{f'{calls:,} calls/s':<30}{r['encodings_cpu_ms']:>17.1f}{r['encodings_kb']:>8.0f}"
                      f"{r['arrow_defaults_cpu_ms']:>23.1f}{r['arrow_defaults_kb']:>8.0f}", flush=True)
            results["segments"] = segments
    results["load_after"] = os.getloadavg()
    print(f"\nload average after: {os.getloadavg()[0]:.2f}")
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
