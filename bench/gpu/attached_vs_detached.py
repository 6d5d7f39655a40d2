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
    python3 bench/gpu/attached_vs_detached.py --fast-below 1.2 --pooled 7-train-wakeups.json

--fast-below MS keeps only segments faster than MS per unit (ms): the H200 host has a slow state that comes
and goes regardless of the probes (pace_states.py), and its segments would otherwise dominate the fit.
--pooled fits all traced blocks of each variant together (one base), with a bootstrap standard error.
"""

from __future__ import annotations

import json
import sys

import numpy as np


def segments(run: dict, fast_below_ns: float | None = None) -> tuple[list[tuple[float, float, float]], list[float]]:
    """Each segment's regressors (1, attached fraction, gap edges per unit) and its pace (ns per unit)."""
    gaps, every, marks = (run.get("probe_gaps") or {}).get("gaps") or [], run.get("marks_every"), run.get("marks") or []
    rows, pace = [], []
    for a, b in zip(marks, marks[1:]):
        if fast_below_ns is not None and (b - a) / every >= fast_below_ns:
            continue
        inside = sum(max(0, min(b, g1) - max(a, g0)) for g0, g1 in gaps) / (b - a)
        edges = sum((a < g0 <= b) + (a < g1 <= b) for g0, g1 in gaps)
        rows.append((1.0, 1.0 - inside, edges / every))
        pace.append((b - a) / every)
    return rows, pace


def fit(run: dict, fast_below_ns: float | None = None) -> dict | None:
    """The fit for one traced run with marks and gaps (None when it has no gaps to contrast)."""
    gaps, every, marks = (run.get("probe_gaps") or {}).get("gaps"), run.get("marks_every"), run.get("marks")
    if not gaps or not marks or len(marks) < 10:
        return None
    rows, pace = segments(run, fast_below_ns)
    if len(pace) < 10:
        return None
    x, y = np.array(rows), np.array(pace)
    if np.linalg.matrix_rank(x) < 3:
        return None
    (base, per_attached, per_edge), *_ = np.linalg.lstsq(x, y, rcond=None)
    added_s = float((x[:, 1] * per_attached + x[:, 2] * per_edge).sum() * every / 1e9)
    cost = {c["probe"]: c["cost_ns"] for c in run.get("probe_costs") or []}
    return {"rep": run["rep"], "workload": run["workload"], "unit": run.get("marks_unit", "launch"),
            "segments": len(pace), "attached_fraction": float(x[:, 1].mean()),
            "edges": int(round(x[:, 2].sum() * every)), "base_ns": float(base),
            "per_attached_unit_ns": float(per_attached),
            "per_edge_us": float(per_edge) / 1e3, "calibrated_entry_ns": cost.get("entry"),
            "fitted_added_s": added_s, "estimated_added_s": run.get("estimated_added_s"),
            "mean_vs_detached_ns": float(y.mean() - np.median(y[x[:, 1] < 0.02])) if (x[:, 1] < 0.02).any() else None}


def pooled(runs: list[dict], fast_below_ns: float | None) -> dict | None:
    """One fit over the segments of several traced blocks: the added ns per fully attached unit, its bootstrap
    standard error, and the stored estimate per unit at full attachment (estimate / attached share)."""
    rows, pace, estimate = [], [], []
    for run in runs:
        r, p = segments(run, fast_below_ns)
        rows += r
        pace += p
        units = run.get("steps") or run.get("calls")
        if run.get("estimated_added_s") and units:
            estimate.append(run["estimated_added_s"] * 1e9 / units)
    if len(pace) < 30:
        return None
    x, y = np.array(rows), np.array(pace)
    coef, *_ = np.linalg.lstsq(x, y, rcond=None)
    rng = np.random.default_rng(0)
    boot = [np.linalg.lstsq(x[i], y[i], rcond=None)[0][1]
            for i in (rng.integers(0, len(y), len(y)) for _ in range(200))]
    share = float(x[:, 1].mean())
    return {"segments": len(y), "attached_fraction": share, "base_ns": float(coef[0]),
            "per_attached_unit_ns": float(coef[1]), "stderr_ns": float(np.std(boot)),
            "estimate_full_ns": float(np.median(estimate)) / share if estimate and share else None}


def main(argv: list[str]) -> int:
    fast_below_ns = None
    if "--fast-below" in argv:
        i = argv.index("--fast-below")
        fast_below_ns = float(argv[i + 1]) * 1e6
        argv = argv[:i] + argv[i + 2:]
    if "--pooled" in argv:
        argv = [a for a in argv if a != "--pooled"]
        for path in argv:
            with open(path) as fh:
                runs = [r for r in json.load(fh)["runs"] if r["mode"] == "traced" and r.get("probe_gaps")]
            for variant in dict.fromkeys(r.get("variant") or "traced" for r in runs):
                got = pooled([r for r in runs if (r.get("variant") or "traced") == variant], fast_below_ns)
                if got:
                    est = got["estimate_full_ns"]
                    print(f"{path} {variant}: {got['segments']} segments, {got['attached_fraction']:.0%} attached; "
                          f"detached {got['base_ns'] / 1e3:,.1f} us per unit, attached "
                          f"+{got['per_attached_unit_ns'] / 1e3:,.1f} (se {got['stderr_ns'] / 1e3:.1f}) us; the "
                          f"estimate at full attachment {'?' if est is None else f'{est / 1e3:.1f}'} us")
        return 0
    for path in argv:
        print(path)
        for run in json.load(open(path))["runs"]:
            if run["mode"] != "traced" or (got := fit(run, fast_below_ns)) is None:
                continue
            est = got["estimated_added_s"]
            print(f"  {got['workload']} rep {got['rep']}: {got['segments']} segments, "
                  f"{got['attached_fraction']:.0%} attached, {got['edges']} edges; +{got['per_attached_unit_ns']:,.0f} "
                  f"ns per attached {got['unit']} (calibrated entry-only hit {got['calibrated_entry_ns'] or 0:,.0f}), "
                  f"{got['per_edge_us']:+,.0f} us per detach/attach; added {got['fitted_added_s']:.3f} s in-process vs "
                  f"estimate {est if est is None else round(est, 3)} s")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
