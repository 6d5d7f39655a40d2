"""Collector benchmark: the highest rate of stand-in CUDA calls recorded with zero loss, and the
cost each traced call adds to the calling thread.

Root, BCC and gcc needed (as for tests/collector/test_collector.py). Stand-in libcudart.so.13 / libcuda.so.1
are built into a temporary pip-like tree; `workload rate N` calls cudaLaunchKernel N times back to
back (each call does nothing: the measured time is the probe cost) and prints how long its loop
took. Runs are interleaved: untraced, empty uprobe pair (the kernel's own uprobe/uretprobe cost,
no collector), and traced by `ingero-mcp trace --pid`. A last run has two producer processes on
the two CPUs at once, so the collector competes with them for CPU.

    sudo .venv/bin/python bench/bench_collector.py                   # 1M calls x 3 rounds
    sudo .venv/bin/python bench/bench_collector.py --calls 300000 --rounds 2 --json out.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "standin"))

from harness import Collector, StandIn, Workload, build_standin  # noqa: E402


def loop_ns(standin: StandIn, calls: int, cpu: int | None = None) -> float:
    """ns per call of an untraced (or externally probed) `workload rate` run."""
    cmd = [str(standin.workload), "rate", str(calls)]
    env = {**os.environ, **({"WL_CPU": str(cpu)} if cpu is not None else {})}
    out = subprocess.run(cmd, capture_output=True, text=True, check=True, env=env).stdout.split()
    return int(out[3]) / calls


def empty_probe_ns(standin: StandIn, calls: int) -> float:
    """ns per call with an empty BPF program on cudaLaunchKernel's entry and return: the floor."""
    from ingero_mcp.collector.bccload import import_bcc

    bpf = import_bcc().BPF(text="int e(struct pt_regs *ctx) { return 0; } int r(struct pt_regs *ctx) { return 0; }")
    bpf.attach_uprobe(name=str(standin.cudart), sym="cudaLaunchKernel", fn_name="e")
    bpf.attach_uretprobe(name=str(standin.cudart), sym="cudaLaunchKernel", fn_name="r")
    try:
        return loop_ns(standin, calls)
    finally:
        bpf.cleanup()


def traced_run(standin: StandIn, calls: int, producers: int, tmp: Path, *, entry_only: bool = False) -> dict[str, Any]:
    """`producers` workloads of `calls` calls each, traced; returns rates, loss and collector CPU.

    entry_only: the collector's defaults (launches entry-only, one layer) on driver launches (cuLaunchKernel),
    with the governor off so that every call must be a row; else the old mode on runtime launches."""
    from ingero_mcp.store import open_store

    db = tmp / f"bench-{time.monotonic_ns()}.duckdb"
    mode = ["driver"] if entry_only else []
    workloads = [Workload(standin, "rate", str(calls), *mode, cpu=(i % 2) if producers > 1 else None)
                 for i in range(producers)]
    extra = ("--max-overhead", "off") if entry_only else ()
    collector = Collector(db, *[a for w in workloads for a in ("--pid", str(w.pid))], *extra, defaults=entry_only)
    try:
        collector.wait_for("recording to", timeout=120)
        for w in workloads:
            w.go()
        outs = [w.wait()[1].split() for w in workloads]
        rc = collector.wait(timeout=300)
    finally:
        for w in workloads:
            w.kill()
        collector.kill()
    assert rc == 0, collector.output()
    per_call = [int(o[3]) / calls for o in outs]
    con = open_store(db)
    stats = {r[0]: r[1:] for r in con.execute("SELECT source, events_seen, events_stored, events_lost FROM "
                                              "collector_stats").fetchall()}
    notes = json.loads(con.execute("SELECT notes FROM sessions").fetchall()[0][0])
    rows = con.execute("SELECT count(*) FROM cuda_calls").fetchall()[0][0]
    estimated = con.execute("SELECT sum(added_ns) FROM tracing_cost").fetchall()[0][0]
    con.close()
    for path in (db, Path(f"{db}.wal")):
        path.unlink(missing_ok=True)
    total = calls * producers
    wall = max(int(o[3]) for o in outs) / 1e9
    return {
        "producers": producers,
        "calls": total,
        "rows": rows,
        "lost": sum(v[2] for v in stats.values()),
        "cuda_lost": stats["cuda_calls"][2],
        "ns_per_call": statistics.mean(per_call),
        "calls_per_s": total / wall,
        "collector_cpu_s": notes.get("collector_cpu_s"),
        "estimated_added_s": None if estimated is None else estimated / 1e9,  # the store's tracing_cost
        "loop_s": [int(o[3]) / 1e9 for o in outs],
    }


def main() -> int:
    """Run the rounds and print a table (and JSON)."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=1_000_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    if os.geteuid() != 0:
        print("bench_collector.py loads eBPF: run it as root", file=sys.stderr)
        return 2
    load = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as tmpdir:
        tmp = Path(tmpdir)
        standin = build_standin(tmp / "standin")
        fixed = traced_run(standin, 1, 1, tmp)["collector_cpu_s"]  # compile + attach + fold, no calls
        print(f"collector fixed cost (1 call): {fixed} s CPU", flush=True)
        rounds = []
        for _ in range(args.rounds):
            base = loop_ns(standin, args.calls)
            floor = empty_probe_ns(standin, args.calls)
            traced = traced_run(standin, args.calls, 1, tmp)
            rounds.append({"untraced_ns": base, "empty_probes_ns": floor, **traced})
            print(f"untraced {base:7.1f} ns/call | empty uprobe pair {floor:7.1f} | traced "
                  f"{traced['ns_per_call']:7.1f} ({traced['calls_per_s']:,.0f} calls/s, rows {traced['rows']:,}, lost "
                  f"{traced['lost']}, collector CPU {traced['collector_cpu_s']} s)", flush=True)
        dual = traced_run(standin, args.calls, 2, tmp)
        print(f"2 producers: {dual['calls_per_s']:,.0f} calls/s together, rows {dual['rows']:,}/{dual['calls']:,}, "
              f"lost {dual['lost']}, collector CPU {dual['collector_cpu_s']} s", flush=True)
        entry = [traced_run(standin, args.calls, 2, tmp, entry_only=True) for _ in range(args.rounds)]
        # the stored estimate against the measured added time, one producer (no competition for the CPU)
        estimate = []
        for _ in range(args.rounds):
            base = loop_ns(standin, args.calls)
            one = traced_run(standin, args.calls, 1, tmp, entry_only=True)
            measured = (one["ns_per_call"] - base) * args.calls / 1e9
            estimate.append({"measured_added_s": measured, "estimated_added_s": one["estimated_added_s"]})
            print(f"1 producer, default mode: measured {measured:.3f} s added, stored estimate "
                  f"{one['estimated_added_s']:.3f} s ({100 * (one['estimated_added_s'] / measured - 1):+.0f} %)",
                  flush=True)
        for e in entry:
            print("2 producers, default mode (entry-only driver launches, governor off): "
                  f"{e['calls_per_s']:,.0f} calls/s together, rows {e['rows']:,}/{e['calls']:,}, lost {e['lost']}, "
                  f"collector CPU {e['collector_cpu_s']} s",
                  flush=True)
    zero_loss = [r["calls_per_s"] for r in [*rounds, dual] if r["lost"] == 0 and r["rows"] == r["calls"]]
    entry_zero_loss = [r["calls_per_s"] for r in entry if r["lost"] == 0 and r["rows"] == r["calls"]]
    summary = {
        "load_avg_1m_at_start": load,
        "calls_per_run": args.calls,
        "untraced_ns_per_call": statistics.median(r["untraced_ns"] for r in rounds),
        "empty_uprobe_pair_ns_per_call": statistics.median(r["empty_probes_ns"] for r in rounds),
        "traced_ns_per_call": statistics.median(r["ns_per_call"] for r in rounds),
        "added_ns_per_call": statistics.median(r["ns_per_call"] - r["untraced_ns"] for r in rounds),
        "of_which_collector_programs_ns": statistics.median(r["ns_per_call"] - r["empty_probes_ns"] for r in rounds),
        "max_zero_loss_calls_per_s": max(zero_loss) if zero_loss else None,
        "entry_only_zero_loss_calls_per_s": sorted(entry_zero_loss),
        "entry_only_lost": sum(r["lost"] for r in entry),
        "collector_fixed_cpu_s": fixed,
        "collector_cpu_ns_per_call": statistics.median((r["collector_cpu_s"] - fixed) / r["calls"] * 1e9
                                                       for r in rounds),
        "lost_total": sum(r["lost"] for r in [*rounds, dual]),
        "rounds": rounds,
        "two_producers": dual,
        "two_producers_entry_only": entry,
        "estimate_vs_measured": estimate,
    }
    print(json.dumps({k: v for k, v in summary.items() if k not in ("rounds", "two_producers")}, indent=2))
    if args.json:
        args.json.write_text(json.dumps(summary, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
