"""Collector overhead inside one process: blocks of the same workload, traced and untraced, interleaved.

Separate processes of the same workload differ from run to run by more than the probes cost (the
untraced launch loop: 6.8-7.9 us per launch), so this keeps one workload process
(`workloads.py blocks NAME SIZE`) and starts the collector before each traced block and stops it after.
Pairs alternate their order (U,T then T,U) so drift favours neither side. Each traced block keeps what
the collector stored (calls, losses, probe gaps, the tracing_cost estimate inside the block).

    python3 bench/gpu/same_process.py OUTDIR --pairs 8 --workloads launch,train --size launch=500000

Variants (--variant NAME[:cpus=CPUS][:args=A+B][:decoy][:sleeper][:records][:burn=PERIOD_MS/BUSY_MS][:feeder=PER_S], \
repeatable) are traced blocks that differ in where the
collector runs, its flags, or (decoy) a collector that probes copies of the CUDA libraries, which the workload never
maps, and traces only a sleeping process (`--pid`: no discovery of the real libraries): the collector, its NVML
sampler and its host-wide tracepoints, without a single trap or per-thread record in the workload; or (sleeper)
the real libraries but `--pid` of a sleeping process: the workload traps on every probe, whose programs drop the
call (not a traced process), with no per-thread record either; or (records) the copies of the libraries and
`--pid` of the workload: every per-thread scheduler record of a traced process, without a single trap; or (burn) no
collector at all but a process on `cpus` that wakes every PERIOD_MS and spins BUSY_MS, the collector's CPU pattern
without eBPF (BUSY_MS = PERIOD_MS: always busy); or (feeder) a collector that traces only another process, the stand-in
workload (`tests/standin/build.sh $STANDIN`, default .device2/standin) launching PER_S a second on $FEEDER_CPUS
(default 8): the collector reads and writes as many records as for the job, while the job takes no trap and has no
record. Each round runs the untraced block and every
variant once, in an order that rotates from round to round.

Writes OUTDIR/same-process.json after every block (a call killed at its time limit keeps what finished)
and prints, per workload, the median of the pairs' differences next to the stored estimate's median.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

from run_overhead import COLLECTOR_ARGS, WORKLOAD_CPUS, _pin, cuda_libs, traced

HERE = Path(__file__).resolve().parent
WORKLOADS_PY = os.environ.get("WORKLOADS_PY", str(HERE / "workloads.py"))  # another for a dry run without a GPU
SIZES = {"launch": 500_000, "train": 1500, "seed": 1_000_000}
SETTLE_S = 0.5  # before every block, traced or not: the collector's start-up CPU burst is over


class Blocks:
    """A `workloads.py blocks` process: one JSON result per `go`."""

    def __init__(self, name: str, size: int) -> None:
        cmd = [*_pin(WORKLOAD_CPUS), sys.executable, WORKLOADS_PY, "blocks", name, str(size)]
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        line = self.proc.stdout.readline()
        if line.strip() != "ready":
            raise RuntimeError(f"{name} blocks did not start: {line!r}")

    def run(self) -> dict:
        time.sleep(SETTLE_S)
        self.proc.stdin.write("go\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the workload exited (rc {self.proc.wait()})")
        return json.loads(line)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.stdin.write("stop\n")
            self.proc.stdin.flush()
            self.proc.wait(timeout=60)


def parse_variant(text: str) -> dict:
    """NAME[:cpus=CPUS][:args=A+B][:decoy][:sleeper][:records][:burn=P/B][:feeder=PER_S] -> {name, cpus, args, decoy,
    sleeper, records, burn, feeder}."""
    name, *opts = text.split(":")
    variant: dict = {"name": name, "cpus": None, "args": None, "decoy": False, "sleeper": False, "records": False,
                     "burn": None, "feeder": None}
    for opt in opts:
        key, _, value = opt.partition("=")
        if key == "cpus":
            variant["cpus"] = value
        elif key == "args":
            variant["args"] = value.split("+")
        elif key == "decoy":
            variant["decoy"] = variant["sleeper"] = True
        elif key == "sleeper":
            variant["sleeper"] = True
        elif key == "records":
            variant["decoy"] = variant["records"] = True
        elif key == "feeder":
            variant["feeder"] = int(value)
        elif key == "burn":
            period, busy = value.split("/")
            variant["burn"] = (float(period) / 1e3, float(busy) / 1e3)
        else:
            raise SystemExit(f"unknown variant option {opt!r} in {text!r}")
    return variant


_SLEEPER: subprocess.Popen | None = None


def sleeper_pid() -> int:
    """A process that only sleeps, for a decoy collector's --pid (started once, killed at exit)."""
    global _SLEEPER
    if _SLEEPER is None:
        import atexit

        _SLEEPER = subprocess.Popen(["sleep", "100000"])
        atexit.register(_SLEEPER.kill)
    return _SLEEPER.pid


_BURN = """
import sys, time
period, busy = float(sys.argv[1]), float(sys.argv[2])
while True:
    t = time.perf_counter()
    while time.perf_counter() - t < busy:
        pass
    if period > busy:
        time.sleep(period - (time.perf_counter() - t))
"""


def burning(run, cpus: str | None, period_s: float, busy_s: float) -> dict:
    """`run` while a process on `cpus` spins busy_s of every period_s (no eBPF): CPU load elsewhere alone."""
    burner = subprocess.Popen([*_pin(cpus), sys.executable, "-c", _BURN, str(period_s), str(busy_s)])
    try:
        return run()
    finally:
        burner.kill()
        burner.wait()


STANDIN = Path(os.environ.get("STANDIN", ".device2/standin"))
FEEDER_CPUS = os.environ.get("FEEDER_CPUS", "8")


def feeding(db: Path, variant: dict, run) -> dict:
    """`run` while a collector traces only a stand-in process launching variant['feeder'] times a second: the
    collector's record load without a trap or record in the job."""
    lib_dir = STANDIN / "site-packages" / "nvidia" / "cu13" / "lib"
    feeder = subprocess.Popen([*_pin(FEEDER_CPUS), str(STANDIN / "workload"), "pace", str(variant["feeder"]), "100000"],
                              env={**os.environ, "LD_LIBRARY_PATH": str(lib_dir)}, stdout=subprocess.DEVNULL)
    try:
        args = [*(COLLECTOR_ARGS if variant["args"] is None else variant["args"]), "--pid", str(feeder.pid)]
        return traced(db, [str(lib_dir / "libcudart.so.13"), str(lib_dir / "libcuda.so.1")], run, variant["cpus"], args)
    finally:
        feeder.kill()
        feeder.wait()


def decoys(libs: list[str], work: Path) -> list[str]:
    """Copies of the CUDA libraries under their own names: uprobes are per file, so probes on a copy never
    trap in a workload that maps the original."""
    (work / "decoy").mkdir(exist_ok=True)
    out = []
    for lib in libs:
        copy = work / "decoy" / Path(lib).name
        if not copy.exists():
            shutil.copy2(lib, copy)
        out.append(str(copy))
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("outdir", type=Path)
    parser.add_argument("--pairs", type=int, default=8)
    parser.add_argument("--workloads", default="launch,train,seed",
                        help="comma-separated subset of: " + ", ".join(SIZES))
    parser.add_argument("--size", action="append", default=[], metavar="NAME=N", help="a block's size, e.g. train=1500")
    parser.add_argument("--variant", action="append", default=[], metavar="SPEC",
                        help="a traced variant, NAME[:cpus=CPUS][:args=A+B][:decoy][:sleeper][:records][:burn=P/B]"
                             "[:feeder=PER_S] "
                             "(default: one, 'traced')")
    args = parser.parse_args()
    variants = [parse_variant(v) for v in args.variant] or [parse_variant("traced")]
    sizes = {**SIZES, **{k: int(v) for k, v in (item.split("=") for item in args.size)}}
    args.outdir.mkdir(parents=True, exist_ok=True)
    work = Path("/tmp/ingero-same-process")
    work.mkdir(exist_ok=True)
    libs = cuda_libs()
    import importlib.util

    print(f"CUDA libraries: {libs}; collector args: {COLLECTOR_ARGS or 'the defaults'}; "
          f"pynvml for the collector's GPU sampler: {importlib.util.find_spec('pynvml') is not None}", flush=True)
    runs: list[dict] = []
    for name in args.workloads.split(","):
        blocks = Blocks(name, sizes[name])
        try:
            for pair in range(args.pairs):
                order = [None, *variants]
                if len(order) == 2:
                    order = order if pair % 2 == 0 else order[::-1]
                else:
                    order = order[pair % len(order):] + order[:pair % len(order)]
                for variant in order:
                    mode = "untraced" if variant is None else "traced"
                    entry: dict = {"rep": pair, "workload": name, "mode": mode, "process": "same",
                                   "variant": None if variant is None else variant["name"]}
                    if variant is None:
                        entry.update(blocks.run())
                    elif variant["burn"]:
                        entry.update(burning(blocks.run, variant["cpus"], *variant["burn"]))
                    elif variant["feeder"]:
                        entry.update(feeding(work / f"{name}-{pair}-{variant['name']}.duckdb", variant, blocks.run))
                    else:
                        db = work / f"{name}-{pair}-{variant['name']}.duckdb"
                        vargs = variant["args"]
                        if variant["sleeper"] or variant["records"]:
                            pid = blocks.proc.pid if variant["records"] else sleeper_pid()
                            vargs = [*(COLLECTOR_ARGS if vargs is None else vargs), "--pid", str(pid)]
                        entry.update(traced(db, decoys(libs, work) if variant["decoy"] else libs, blocks.run,
                                            variant["cpus"], vargs, discover=not variant["records"]))
                    runs.append(entry)
                    (args.outdir / "same-process.json").write_text(json.dumps({"libs": libs, "runs": runs}, indent=1))
                    print(json.dumps({k: v for k, v in entry.items()
                                      if k not in ("ops", "sources", "tracing_cost", "marks", "item_wait_ns",
                                                   "probe_gaps", "probe_costs", "bpf_runs_during", "bpf_names")}),
                          flush=True)
        finally:
            blocks.close()
    summary = summarise(runs)
    (args.outdir / "same-process.json").write_text(
        json.dumps({"libs": libs, "runs": runs, "summary": summary}, indent=1))
    print_summary(summary)
    return 0


def summarise(runs: list[dict]) -> list[dict]:
    """Per workload: each pair's traced - untraced, their median, and the stored estimate's median."""
    out = []
    for name, variant in dict.fromkeys((r["workload"], r.get("variant") or "traced")
                                       for r in runs if r["mode"] == "traced"):
        by_pair: dict[int, dict[str, dict]] = {}
        for r in runs:
            if r["workload"] == name and (r["mode"] == "untraced" or (r.get("variant") or "traced") == variant):
                by_pair.setdefault(r["rep"], {})[r["mode"]] = r
        pairs = [p for p in by_pair.values() if len(p) == 2]
        if not pairs:
            continue
        diffs = [p["traced"]["total"] - p["untraced"]["total"] for p in pairs]
        untraced = [p["untraced"]["total"] for p in pairs]
        traced = [p["traced"] for p in pairs]
        calls = traced[0].get("calls")  # launches per block (launch loop only)
        out.append({
            "workload": name, "variant": variant, "pairs": len(pairs), "untraced_median_s": statistics.median(untraced),
            "untraced_spread_pct": (max(untraced) - min(untraced)) / statistics.median(untraced) * 100,
            "traced_median_s": statistics.median(r["total"] for r in traced),
            "pair_diffs_s": diffs, "measured_added_s": statistics.median(diffs),
            "measured_added_pct": statistics.median(d / u * 100 for d, u in zip(diffs, untraced)),
            "added_ns_per_launch": statistics.median(diffs) / calls * 1e9 if calls else None,
            "estimated_added_s": statistics.median(r.get("estimated_added_s") or 0.0 for r in traced),
            "cuda_calls_recorded": statistics.median(r.get("cuda_calls", 0) for r in traced),
            "probe_gaps": statistics.median((r.get("probe_gaps") or {}).get("n", 0) for r in traced),
            "lost": sum(r.get("lost", 0) for r in traced),
            "sm_clock_mhz": {mode: sorted({c for p in pairs for c in p[mode].get("sm_clock_mhz") or [] if c})
                             for mode in ("untraced", "traced")},
            "steal_ms_median": statistics.median(r.get("steal_ms", 0.0) for p in pairs for r in p.values()),
            "steal_ms_max": max(r.get("steal_ms", 0.0) for p in pairs for r in p.values()),
        })
    return out


def print_summary(summary: list[dict]) -> None:
    print("\nworkload/variant  pairs  untraced median s  spread  median(T-U) s  median(T-U)/U  ns/launch  estimate s  "
          "recorded  gaps  lost  steal ms (median/max)")
    for s in summary:
        per_launch = f"{s['added_ns_per_launch']:9.0f}" if s["added_ns_per_launch"] is not None else "        -"
        print(f"{s['workload'] + '/' + s['variant']:16s}  {s['pairs']:5d}  {s['untraced_median_s']:17.3f}  "
              f"{s['untraced_spread_pct']:5.1f}%  {s['measured_added_s']:13.4f}  {s['measured_added_pct']:12.2f}%  "
              f"{per_launch}  {s['estimated_added_s']:10.4f}  {s['cuda_calls_recorded']:8.0f}  {s['probe_gaps']:4.0f}  "
              f"{s['lost']:4d}  {s['steal_ms_median']:.0f}/{s['steal_ms_max']:.0f}")


if __name__ == "__main__":
    sys.exit(main())
