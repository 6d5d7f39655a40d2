"""What one py_stack call costs: a sched_switch harness with and without the Python-frame walk.

Two Python threads ping-pong over pipes at a chosen recursion depth (each switch-out is a sleep, as
for a DataLoader thread), while the harness of tests/collector/test_pyframes.py runs on every
switch. The kernel's BPF run-time stats (/proc/sys/kernel/bpf_stats_enabled) give ns per program
run; the walk's cost per call is the difference over the calls py_stack made. Root; prints load.

    python bench/bench_pyframes.py [--depth 30] [--seconds 3] [--rounds 3]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "collector"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "standin"))

from test_pyframes import load_harness, watch

from ingero_mcp.collector.pyframes import PythonFrames

PINGPONG = '''\
import os, sys, threading
depth = int(sys.argv[1])
a_r, a_w = os.pipe()
b_r, b_w = os.pipe()


def player(rd, wr, first, d):
    if d > 0:
        return player(rd, wr, first, d - 1)
    if first:
        os.write(wr, b"x")
    while True:
        os.read(rd, 1)
        os.write(wr, b"x")


threading.Thread(target=player, args=(b_r, a_w, False, depth), daemon=True).start()
print("ready", flush=True)
player(a_r, b_w, True, depth)
'''


def prog_stats(fd: int) -> tuple[int, int]:
    """(run_time_ns, run_cnt) of a loaded BPF program, from its fdinfo."""
    vals = {}
    with open(f"/proc/self/fdinfo/{fd}") as f:
        for line in f:
            key, _, value = line.partition(":")
            vals[key.strip()] = value.strip()
    return int(vals.get("run_time_ns", 0)), int(vals.get("run_cnt", 0))


def one(walk: bool, depth: int, seconds: float, script: Path) -> tuple[float, int, int]:
    """(ns per program run, runs, py_stack calls) for one run of the ping-pong."""
    bpf = load_harness([] if walk else ["-DNO_WALK"])
    try:
        fd = bpf.funcs[b"tracepoint__sched__sched_switch"].fd
        proc = subprocess.Popen([sys.executable, str(script), str(depth)], stdout=subprocess.PIPE, text=True)
        assert proc.stdout is not None and proc.stdout.readline().startswith("ready")
        frames = PythonFrames(bpf)
        assert frames.add_process(proc.pid)[1]
        watch(bpf, proc.pid)
        t0, n0 = prog_stats(fd)
        time.sleep(seconds)
        t1, n1 = prog_stats(fd)
        calls = frames.counters()["calls"]
        proc.kill()
        proc.wait()
        return (t1 - t0) / max(n1 - n0, 1), n1 - n0, calls
    finally:
        bpf.cleanup()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--depth", type=int, default=30, help="extra Python frames under each thread's loop")
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    script = Path("/tmp/ingero-pyframes-pingpong.py")
    script.write_text(PINGPONG)
    with open("/proc/sys/kernel/bpf_stats_enabled") as f:
        before = f.read().strip()
    with open("/proc/sys/kernel/bpf_stats_enabled", "w") as f:
        f.write("1")
    try:
        for r in range(args.rounds):
            got = {}
            for walk in (False, True):  # interleaved pairs
                got[walk] = ns, runs, calls = one(walk, args.depth, args.seconds, script)
                load = os.getloadavg()[0]
                print(f"round {r} walk={walk!s:5} depth={args.depth}: {ns:7.0f} ns/run over {runs} runs, "
                      f"py_stack calls {calls}, load {load:.2f}", flush=True)
            base, (ns, runs, calls) = got[False][0], got[True]
            print(f"round {r}: one py_stack call ~ {(ns - base) * runs / max(calls, 1):.0f} ns "
                  f"(extra run time over the calls made)", flush=True)
    finally:
        with open("/proc/sys/kernel/bpf_stats_enabled", "w") as f:
            f.write(before)
        script.unlink(missing_ok=True)


if __name__ == "__main__":
    main()
