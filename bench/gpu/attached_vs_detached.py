"""The launch loop's pace in the same traced process with the launch probes attached and detached.

Cross-process pairs on the GPU host differ by more than the probes cost, so the cost of the windowed
launch probes is also read inside each traced run: the workload stamps the wall clock every
`marks_every` launches (`marks`), and the collector's probe_gaps say when the launch probes were
detached. Each segment between two marks gets its attached fraction f and the number of gap edges
(detach or re-attach) inside it, k; a least-squares fit

    ns per unit = base + c * f + d * k / marks_every      (a unit: a launch, or a training step)

gives c, the added ns per attached launch (to set beside the calibrated entry-only hit), and d, what
one detach or re-attach costs the workload (ns). The in-process measure of added time is then
sum(c * f + d * k / marks_every) * marks_every over the segments, beside the stored estimate.

    python3 bench/gpu/attached_vs_detached.py same-process.json [overhead.json ...]
"""

from __future__ import annotations

import json
import sys

import numpy as np


def fit(run: dict) -> dict | None:
    """The fit for one traced run with marks and gaps (None when it has no gaps to contrast)."""
    gaps, every, marks = (run.get("probe_gaps") or {}).get("gaps"), run.get("marks_every"), run.get("marks")
    if not gaps or not marks or len(marks) < 10:
        return None
    rows, pace = [], []
    for a, b in zip(marks, marks[1:]):
        inside = sum(max(0, min(b, g1) - max(a, g0)) for g0, g1 in gaps) / (b - a)
        edges = sum((a < g0 <= b) + (a < g1 <= b) for g0, g1 in gaps)
        rows.append((1.0, 1.0 - inside, edges / every))
        pace.append((b - a) / every)
    x, y = np.array(rows), np.array(pace)
    if np.linalg.matrix_rank(x) < 3:
        return None
    (base, per_attached, per_edge), *_ = np.linalg.lstsq(x, y, rcond=None)
    added_s = float((x[:, 1] * per_attached + x[:, 2] * per_edge).sum() * every / 1e9)
    cost = {c["probe"]: c["cost_ns"] for c in run.get("probe_costs") or []}
    return {"rep": run["rep"], "workload": run["workload"], "unit": run.get("marks_unit", "launch"), "segments": len(pace), "attached_fraction": float(x[:, 1].mean()),
            "edges": int(round(x[:, 2].sum() * every)), "base_ns": float(base), "per_attached_unit_ns": float(per_attached),
            "per_edge_us": float(per_edge) / 1e3, "calibrated_entry_ns": cost.get("entry"),
            "fitted_added_s": added_s, "estimated_added_s": run.get("estimated_added_s"),
            "mean_vs_detached_ns": float(y.mean() - np.median(y[x[:, 1] < 0.02])) if (x[:, 1] < 0.02).any() else None}


def main(paths: list[str]) -> int:
    for path in paths:
        print(path)
        for run in json.load(open(path))["runs"]:
            if run["mode"] != "traced" or (got := fit(run)) is None:
                continue
            est = got["estimated_added_s"]
            print(f"  {got['workload']} rep {got['rep']}: {got['segments']} segments, {got['attached_fraction']:.0%} attached, "
                  f"{got['edges']} edges; +{got['per_attached_unit_ns']:,.0f} ns per attached {got['unit']} "
                  f"(calibrated entry-only hit {got['calibrated_entry_ns'] or 0:,.0f}), "
                  f"{got['per_edge_us']:+,.0f} us per detach/attach; added {got['fitted_added_s']:.3f} s in-process vs "
                  f"estimate {est if est is None else round(est, 3)} s")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
