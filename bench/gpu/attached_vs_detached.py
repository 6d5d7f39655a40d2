"""The launch loop's pace in the same traced process with the launch probes attached and detached.

Cross-process pairs on the GPU host differ by more than the probes cost (the untraced launch loop
alone varies 6.8-7.9 us per launch from run to run), so the per-hit cost in the real workload is
read inside each traced run instead: the workload stamps the wall clock every 10,000 launches
(`marks`), the collector's probe_gaps say when the launch probes were detached; segments wholly
attached are compared with segments wholly detached (medians, ns per launch).

    python3 bench/gpu/attached_vs_detached.py bench/gpu/overhead-h200-v3-launch.json
"""

from __future__ import annotations

import json
import statistics
import sys


def main(path: str) -> int:
    runs = json.load(open(path))["runs"]
    for r in runs:
        if r["mode"] != "traced" or "marks" not in r or not r.get("probe_gaps"):
            continue
        gaps, every = r["probe_gaps"]["gaps"], r["marks_every"]
        attached, detached = [], []
        for a, b in zip(r["marks"], r["marks"][1:]):
            inside = sum(max(0, min(b, g1) - max(a, g0)) for g0, g1 in gaps) / (b - a)
            (detached if inside > 0.98 else attached if inside < 0.02 else []).append((b - a) / every)
        if attached and detached:
            cost = {c["probe"]: c["cost_ns"] for c in r["probe_costs"]}
            marks = r["marks"]
            overall = (marks[-1] - marks[0]) / (every * (len(marks) - 1))
            print(f"rep {r['rep']}: the whole timed loop {overall:,.0f} ns/launch against {statistics.median(detached):,.0f} "
                  f"detached: +{overall - statistics.median(detached):,.0f} ns per launch on average (same process)")
            print(f"rep {r['rep']}: attached {statistics.median(attached):,.0f} ns/launch ({len(attached)} segments), "
                  f"detached {statistics.median(detached):,.0f} ({len(detached)}): "
                  f"+{statistics.median(attached) - statistics.median(detached):,.0f} ns per attached launch; "
                  f"calibrated entry-only hit {cost['entry']:,.0f} ns; launches recorded {r['cuda_calls'] / r['calls']:.0%}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
