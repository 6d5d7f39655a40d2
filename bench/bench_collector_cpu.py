"""The collector's own CPU while it records: idle, and at a steady rate of stand-in CUDA calls.

What an always-on collector costs the host besides the traced job: its process's CPU time (all threads,
from /proc/PID/stat) over a window of steady recording, after the start-up and before the stop. The
workload (`workload pace PER_SECOND SECONDS`: millisecond bursts of cuLaunchKernel on CPU 1) is traced
with `--max-overhead off`, so every call is a record; the collector runs on CPU 0. Rates are interleaved
over rounds; medians. Root, BCC and gcc needed (as for tests/collector/test_collector.py).

    sudo .venv/bin/python bench/bench_collector_cpu.py                       # rates 0, 20000, 60000 x 3 rounds
    sudo .venv/bin/python bench/bench_collector_cpu.py --rates 0 40000 --window 20 --json out.json
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

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "standin"))

from harness import Collector, StandIn, Workload, build_standin  # noqa: E402

TICKS = os.sysconf("SC_CLK_TCK")
SETTLE_S = 3.0  # after the workload starts: the first flushes and the governor's first look


def cpu_s(pid: int) -> float:
    """utime + stime of the whole process (every thread), seconds."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


def one_run(standin: StandIn, rate: int, window_s: float, tmp: Path) -> dict[str, float]:
    """Collector CPU over `window_s` of steady recording of a workload making `rate` calls per second."""
    seconds = SETTLE_S + window_s + 2.0
    work = Workload(standin, "pace", str(rate), str(seconds), cpu=1)
    db = tmp / f"cpu-{rate}-{time.monotonic_ns()}.duckdb"
    collector = Collector(db, "--pid", str(work.pid), "--max-overhead", "off", defaults=True)
    try:
        os.sched_setaffinity(collector.proc.pid, {0})  # its threads start later and inherit it
        collector.wait_for("recording to", timeout=120)
        work.go()
        time.sleep(SETTLE_S)
        before, t0 = cpu_s(collector.proc.pid), time.monotonic()
        time.sleep(window_s)
        used, wall = cpu_s(collector.proc.pid) - before, time.monotonic() - t0
        assert work.wait(timeout=seconds + 60)[0] == 0
        assert collector.wait(timeout=120) == 0, collector.output()
        stopped = [ln for ln in collector.lines if "stopped" in ln][-1]
        lost = int(stopped.split("lost ")[1].split(";")[0].replace(",", ""))
    finally:
        work.kill()
        collector.kill()
    return {"rate": rate, "cpu_s": used, "wall_s": wall, "cpu_share": used / wall, "lost": lost}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rates", type=int, nargs="+", default=[0, 20_000, 60_000], help="calls per second")
    ap.add_argument("--window", type=float, default=10.0, help="seconds of steady recording measured per run")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json", type=Path, help="write every run here")
    args = ap.parse_args()
    runs: list[dict[str, float]] = []
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        standin = build_standin(tmp / "standin")
        for r in range(args.rounds):
            for rate in args.rates:
                run = one_run(standin, rate, args.window, tmp)
                runs.append(run)
                print(f"round {r + 1} rate {rate:>7,}/s: collector CPU {run['cpu_s']:.2f} s over {run['wall_s']:.1f} s "
                      f"({100 * run['cpu_share']:.2f} % of one CPU), lost {run['lost']}", flush=True)
    idle = [x["cpu_share"] for x in runs if x["rate"] == 0]
    base = statistics.median(idle) if idle else None
    for rate in args.rates:
        shares = [x["cpu_share"] for x in runs if x["rate"] == rate]
        line = (f"rate {rate:>7,}/s: median {100 * statistics.median(shares):.2f} % of one CPU "
                f"(runs {', '.join(f'{100 * s:.2f}' for s in shares)})")
        if rate and base is not None:
            line += f", {(statistics.median(shares) - base) / rate * 1e9:,.0f} ns of collector CPU per call above idle"
        print(line)
    if args.json:
        args.json.write_text(json.dumps(runs, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
