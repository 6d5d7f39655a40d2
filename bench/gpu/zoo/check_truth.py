"""Checks zoo ground-truth files: every field there, the cause from the vocabulary, the window and
baseline inside the run and apart, the culprits each scenario must (or must not) name, the step
bins adding up. Prints one line per file; exits 1 if any file is wrong.

    python3 bench/gpu/zoo/check_truth.py /tmp/zoo-smoke/*.truth.json
"""

from __future__ import annotations

import json
import sys

CAUSES = {"cpu_contention", "own_workers_cpu", "gpu_shared", "gil_contention", "pageable_copies", "allocator_churn",
          "host_bound_prep", "lazy_module_loading", "disk_io", "page_faults", "lock_contention", "none"}
KEYS = {"scenario", "cause", "description", "feeder", "culprits", "window_ns", "baseline_ns", "cpus", "steps",
        "throughput_ratio", "torch", "notes"}
# scenario -> (culprit comm expected, at least how many); scenarios not listed must name none
CULPRITS = {"cpu_hog": ("hogd", 3), "workers_oversub": ("pt_data_worker", 8), "gpu_shared": ("gpuhog", 1),
            "gil_holder": ("gil_spin", 1), "lock_holder": ("lock_holder", 1)}


def check(t: dict) -> list[str]:
    bad = [f"missing {k}" for k in sorted(KEYS - t.keys())]
    if bad:
        return bad
    if t["cause"] not in CAUSES:
        bad.append(f"cause {t['cause']!r} not in the vocabulary")
    f = t["feeder"]
    if not (f.get("pid") and f.get("tid") and f.get("comm")):
        bad.append(f"feeder incomplete: {f}")
    steps = t["steps"]
    t0, counts = steps["t0_ns"], steps["counts"]
    end = t0 + len(counts) * steps["bin_ns"]
    if sum(counts) != steps.get("total", sum(counts)) or sum(counts) == 0:
        bad.append(f"step bins add to {sum(counts)}, total {steps.get('total')}")
    b = t["baseline_ns"]
    if not (t0 <= b[0] < b[1] <= end):
        bad.append(f"baseline {b} outside the run [{t0}, {end}]")
    w = t["window_ns"]
    if t["cause"] == "none":
        if w is not None:
            bad.append("a control with a window")
    else:
        if not w or not (t0 <= w[0] < w[1] <= end):
            bad.append(f"window {w} outside the run")
        elif not (w[0] >= b[1] or w[1] <= b[0]):
            bad.append("window and baseline overlap")
    want = CULPRITS.get(t["scenario"])
    culprits = t["culprits"]
    if want:
        comm, n = want
        names = [c.get("comm") for c in culprits]
        if len(culprits) < n or any(c != comm for c in names):
            bad.append(f"culprits {names}: want >= {n} named {comm}")
        for c in culprits:
            if not c.get("pid") or not c.get("tids"):
                bad.append(f"culprit without pid/tids: {c}")
    elif culprits:
        bad.append(f"culprits {culprits}: this scenario names none")
    if t["throughput_ratio"] is None:
        bad.append("no throughput_ratio")
    return bad


def main(paths: list[str]) -> int:
    failed = 0
    for path in paths:
        t = json.load(open(path))
        bad = check(t)
        failed += bool(bad)
        w = t.get("window_ns")
        span = f"window {(w[1] - w[0]) / 1e9:.2f} s" if w else "no window"
        print(f"{'BAD ' if bad else 'ok  '} {t.get('scenario', path):18s} {t.get('cause', '?'):20s} {span:15s} "
              f"ratio {t.get('throughput_ratio')}  culprits {[(c.get('comm'), c.get('pid')) for c in t.get('culprits', [])][:3]}"
              + ("".join(f"\n       {b}" for b in bad)))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
