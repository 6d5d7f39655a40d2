"""The training loop's blocks by variant, separating the host's slow state from the collector's own cost.

On the H200 host the loop's pace (ms per step, from the marks every 10 steps) switches between a fast state
(~0.92-1.05 ms) and a slow one (~1.3-1.6 ms) with or without tracing, independently of the governor's windows.
Block totals mix the two, so besides each variant's pairs against the untraced block of the same round this
prints how many blocks spent most of their time in the slow state, and the median pace of the fast segments
alone (the collector's cost where the host's state is the same). Where the blocks timed the loop's loss.item()
(sets 13-14), it also prints how long the host waited for the GPU in fast and slow segments.

    python3 bench/gpu/pace_states.py bench/gpu/h200-same-process/7-train-wakeups.json [...]
    python3 bench/gpu/pace_states.py --pool 9-train-default-24pairs.json 10-train-default-24pairs.json

Each number comes with a 90 % bootstrap interval (blocks resampled): on this host a set's interval is often
wider than the effect it measures.
"""

from __future__ import annotations

import json
import random
import statistics
import sys
from itertools import pairwise

FAST_MS = 1.2  # a 10-step segment faster than this per step is in the fast state
MOSTLY_SLOW = 0.6  # a block with less than this share of fast segments is "mostly slow"
RESAMPLES = 2000  # bootstrap draws for the 90 % intervals (seeded: the same file prints the same interval)


def interval(values: list[float], stat, others: list[float] | None = None) -> tuple[float, float] | None:
    """90 % bootstrap interval of stat(values) (or stat(values, others), each list resampled on its own): how far
    a set's few blocks on a noisy host pin the number down."""
    if len(values) < 3 or (others is not None and len(others) < 3):
        return None
    rng = random.Random(0)
    draws = sorted(stat(rng.choices(values, k=len(values))) if others is None else
                   stat(rng.choices(values, k=len(values)), rng.choices(others, k=len(others)))
                   for _ in range(RESAMPLES))
    return draws[int(0.05 * RESAMPLES)], draws[int(0.95 * RESAMPLES) - 1]


def _ratio_pct(traced: list[float], untraced: list[float]) -> float:
    return (statistics.median(traced) / statistics.median(untraced) - 1) * 100


def paces(run: dict) -> list[float]:
    """ms per step of each 10-step segment."""
    marks, every = run["marks"], run.get("marks_every", 10)
    return [(b - a) / every / 1e6 for a, b in pairwise(marks)]


def fast_segments(run: dict) -> list[float]:
    """The paces of a block's segments in the host's fast state."""
    return [x for x in paces(run) if x < FAST_MS]


def gpu_waits(runs: list[dict]) -> tuple[float, float] | None:
    """Median µs per step the host waited in loss.item() (workloads.py's item_wait_ns, one per 10-step segment),
    in fast and in slow segments: near zero in both means the loop is host-bound and the slow state is the host's."""
    fast, slow = [], []
    for r in runs:
        for pace, wait_ns in zip(paces(r), r.get("item_wait_ns") or []):
            (fast if pace < FAST_MS else slow).append(wait_ns / r.get("marks_every", 10) / 1e3)
    return (statistics.median(fast), statistics.median(slow)) if fast and slow else None


def summary(runs: list[dict]) -> list[dict]:
    """Per variant (None: untraced): blocks, pairs against the same round's untraced block, slow-state blocks,
    fast-state pace, the stored estimate and the collector's CPU and context switches during the block."""
    by_variant: dict[str, list[dict]] = {}
    for r in runs:
        if r.get("workload") == "train" and "marks" in r and "rep" in r:  # same_process.py blocks
            name = r.get("variant") or ("untraced" if r["mode"] == "untraced" else "default")
            name = "default" if name == "traced" else name  # without VARIANTS: the same collector, its defaults
            by_variant.setdefault(name, []).append(r)
    untraced = {r["rep"]: r["total"] for r in by_variant.get("untraced", [])}
    untraced_fast = [statistics.median(f) for f in (fast_segments(r) for r in by_variant.get("untraced", [])) if f]
    out = []
    for name, rs in by_variant.items():
        diffs = [(r["total"] - untraced[r["rep"]]) / untraced[r["rep"]] * 100 for r in rs
                 if name != "untraced" and r["rep"] in untraced]
        fast_paces, slow_blocks = [], 0
        for r in rs:
            p, fast = paces(r), fast_segments(r)
            if fast:
                fast_paces.append(statistics.median(fast))
            slow_blocks += len(fast) < MOSTLY_SLOW * len(p)

        def med(key: str, rs: list[dict] = rs) -> float | None:
            values = [r[key] for r in rs if r.get(key) is not None]
            return statistics.median(values) if values else None

        estimate = [r["estimated_added_s"] / r["total"] * 100 for r in rs if r.get("estimated_added_s")]
        out.append({
            "variant": name, "blocks": len(rs), "median_s": statistics.median(r["total"] for r in rs),
            "pair_median_pct": statistics.median(diffs) if diffs else None,
            "pair_median_interval": interval(diffs, statistics.median),
            "fast_state_interval": None if name == "untraced" else interval(fast_paces, _ratio_pct, untraced_fast),
            "pairs_slower": sum(d > 0 for d in diffs), "pairs": len(diffs), "mostly_slow_blocks": slow_blocks,
            "fast_state_ms_per_step": statistics.median(fast_paces) if fast_paces else None,
            "estimate_pct": statistics.median(estimate) if estimate else None,
            "collector_cpu_s": med("collector_cpu_during_s"), "collector_switches": med("collector_switches_during"),
            "lost": sum(r.get("lost") or 0 for r in rs), "gpu_wait_us": gpu_waits(rs),
        })
    return out


def _span(bounds: tuple[float, float] | None) -> str:
    return f"{bounds[0]:+.1f} to {bounds[1]:+.1f} %" if bounds else "-"


def _load(path: str, offset: int = 0) -> list[dict]:
    """A same_process.py file's blocks; rounds renumbered from `offset`, so pooled files never pair across files."""
    with open(path) as fh:
        return [{**r, "rep": r["rep"] + offset} if "rep" in r else r for r in json.load(fh)["runs"]]


def print_table(title: str, rows: list[dict]) -> None:
    base = next((r["fast_state_ms_per_step"] for r in rows if r["variant"] == "untraced"), None)
    print(title)
    print("  variant     blocks  median s  pairs: median, slower  mostly slow  fast-state ms/step (vs untraced)  "
          "estimate  collector CPU s  switches  lost  90 % intervals: pairs' median; fast state")
    for r in rows:
        pair = (f"{r['pair_median_pct']:+6.1f} %, {r['pairs_slower']:2d}/{r['pairs']:<2d}"
                if r["pair_median_pct"] is not None else " " * 17)
        fast = r["fast_state_ms_per_step"]
        rel = f" ({(fast / base - 1) * 100:+.1f} %)" if fast and base and r["variant"] != "untraced" else ""
        est = f"{r['estimate_pct']:.1f} %" if r["estimate_pct"] is not None else "-"
        cpu = f"{r['collector_cpu_s']:.2f}" if r["collector_cpu_s"] is not None else "-"
        sw = f"{r['collector_switches']:.0f}" if r["collector_switches"] is not None else "-"
        print(f"  {r['variant']:10s}  {r['blocks']:6d}  {r['median_s']:8.3f}  {pair:>21s}  "
              f"{r['mostly_slow_blocks']:11d}  {fast:.3f}{rel:>12s}{'':17s}  {est:>8s}  {cpu:>15s}  {sw:>8s}  "
              f"{r['lost']:4d}  {_span(r['pair_median_interval'])}; {_span(r['fast_state_interval'])}")
    for r in rows:
        if r["gpu_wait_us"]:
            print(f"  {r['variant']}: waiting for the GPU {r['gpu_wait_us'][0]:.1f} us per step in fast segments, "
                  f"{r['gpu_wait_us'][1]:.1f} in slow ones (median)")


def main() -> int:
    args = sys.argv[1:]
    if args and args[0] == "--pool":  # the files' blocks as one set (same code, same host: more pairs)
        files = args[1:]
        print_table("pooled: " + ", ".join(files),
                    summary([r for i, path in enumerate(files) for r in _load(path, 1000 * i)]))
        return 0
    for path in args:
        print_table(path, summary(_load(path)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
