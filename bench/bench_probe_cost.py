"""Cost of each of the collector's kernel programs: mean ns per run and runs per second.

Loads the collector's eBPF program exactly as `ingero-mcp trace` does (every tracepoint attached,
no CUDA uprobes), marks a stand-in workload's process traced, turns on the kernel's BPF run-time
statistics (kernel.bpf_stats_enabled) for the measurement and reads each program's run_time_ns /
run_cnt from /proc/self/fdinfo. The host-wide tracepoints (sched_switch, sched_waking, the irq /
softirq / hrtimer depth counters, mm_page_alloc) cost this on every event of every task, traced or
not. The CUDA uprobes are attached to the stand-in libraries too, and `workload rate N` makes N
cudaLaunchKernel calls during the measurement: their rows show what the kernel side of a traced
call costs (entry program + the shared return program), apart from the uprobe trap itself and
from the machine's load, which make bench_collector.py's end-to-end numbers noisy on a shared host.

    sudo .venv/bin/python bench/bench_probe_cost.py --seconds 10 --calls 200000
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "standin"))

from harness import build_standin  # noqa: E402

from ingero_mcp.collector.discovery import resolve_library  # noqa: E402
from ingero_mcp.collector.tracer import TraceOptions, Tracer  # noqa: E402

STATS = Path("/proc/sys/kernel/bpf_stats_enabled")


def prog_stats(fd: int) -> tuple[int, int]:
    """(run_time_ns, run_cnt) of a loaded BPF program."""
    text = Path(f"/proc/self/fdinfo/{fd}").read_text()
    ns = re.search(r"run_time_ns:\s+(\d+)", text)
    cnt = re.search(r"run_cnt:\s+(\d+)", text)
    return (int(ns.group(1)) if ns else 0), (int(cnt.group(1)) if cnt else 0)


def main() -> int:
    """Measure and print one line per program."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--calls", type=int, default=200_000, help="traced cudaLaunchKernel calls (< the ring's size)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        standin = build_standin(Path(tmp) / "standin")
        tracer = Tracer(TraceOptions(db=Path(tmp) / "unused.duckdb"), log=open("/dev/null", "w"))  # noqa: SIM115
        tracer._compile()  # every tracepoint attached, as when recording; every CUDA caller traced
        for lib in (standin.cudart, standin.cuda):
            found = resolve_library(str(lib))
            assert found is not None
            tracer.attach_library(found, forced=True)
        funcs = {name.decode(): f.fd for name, f in tracer.bpf.funcs.items()
                 if name.startswith(b"tracepoint__") or name in (b"e_cudaLaunchKernel", b"on_return")}
        # a traced process that sleeps and wakes (200 us syncs) and spins, so the traced paths run
        work = subprocess.Popen([str(standin.workload), "mix", "100000", "20000", "200000", "0", "0"],
                                stdout=subprocess.DEVNULL)
        tracer.traced_map[tracer.traced_map.Key(work.pid)] = tracer.traced_map.Leaf(1)
        old = STATS.read_text().strip()
        STATS.write_text("1")
        try:
            before = {name: prog_stats(fd) for name, fd in funcs.items()}
            t0 = time.monotonic()
            subprocess.run([str(standin.workload), "rate", str(args.calls)], check=True, stdout=subprocess.DEVNULL)
            time.sleep(max(0.0, args.seconds - (time.monotonic() - t0)))
            after = {name: prog_stats(fd) for name, fd in funcs.items()}
        finally:
            STATS.write_text(old)
            work.kill()
            work.wait()
            tracer.bpf.cleanup()
    total_ns = 0
    print(f"{'program':45s} {'runs/s':>10s} {'ns/run':>8s} {'CPU %':>7s}")
    for name in sorted(funcs):
        ns = after[name][0] - before[name][0]
        cnt = after[name][1] - before[name][1]
        total_ns += ns
        print(f"{name.removeprefix('tracepoint__'):45s} {cnt / args.seconds:10,.0f} {ns / cnt if cnt else 0:8.0f} "
              f"{100 * ns / 1e9 / args.seconds:7.3f}")
    print(f"{'all tracepoints':45s} {'':10s} {'':8s} {100 * total_ns / 1e9 / args.seconds:7.3f}  (% of one CPU)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
