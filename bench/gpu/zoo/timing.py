"""One scenario's line in the zoo driver's log: its steps and ratio, and where the scenario's wall
time went: the collector's start, the scenario before its first phase (python, torch import, CUDA
start-up, warm-up, staging), its phases, after them, and the collector's stop. The overhead is all
but the phases (the packing, which runs beside the next collector's start, is logged apart).

    python3 bench/gpu/zoo/timing.py NAME.truth.json T_START T_READY T_LAUNCH T_EXIT T_STOPPED    (epoch ms)
"""

from __future__ import annotations

import json
import sys


def line(truth: dict, start: float, ready: float, launch: float, exited: float, stopped: float) -> str:
    """The summary: steps, ratio, culprits, then seconds per part."""
    marks = truth["marks_ns"]
    first, last = min(marks.values()) / 1e9, max(marks.values()) / 1e9
    phases = last - first
    overhead = (stopped - start) - phases
    rates = truth.get("steps_per_s") or {}
    rate = "/".join(f"{rates[k]:.1f}" if rates.get(k) else "-" for k in ("baseline", "window"))
    return (f"steps {truth['steps']['total']} ({rate} steps/s) ratio {truth['throughput_ratio']} "
            f"culprits {len(truth['culprits'])}; seconds: collector start {ready - start:.1f}, "
            f"wait {launch - ready:.1f}, before the phases {first - launch:.1f}, phases {phases:.1f}, "
            f"after {exited - last:.1f}, stop {stopped - exited:.1f}; overhead {overhead:.1f}")


if __name__ == "__main__":
    stamps = [float(x) / 1e3 for x in sys.argv[2:7]]
    print(line(json.load(open(sys.argv[1])), *stamps))
