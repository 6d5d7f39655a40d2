"""eval_pass: for 10 s the loop runs an evaluation every ~2 s on the main thread: the metrics of a
held-out set computed in pure Python (ranking 400k scores, per-class precision and recall in
loops), ~0.5-1 s each, on the CPU, outside any CUDA call, while the GPU idles. CPUs 5-6.
No culprit process: the feeder's own Python. The truth's `episodes_ns` lists each evaluation."""

import random

from common import Scenario, Trainer, now

sc = Scenario("eval_pass", "host_bound_prep", "a pure-Python evaluation every 2 s on the main thread for 10 s",
              job_cpus=[5, 6])
N = 400_000 if sc.scale >= 0.5 else 60_000
PERIOD_S = 2.0 * sc.scale
rnd = random.Random(0)
scores = [rnd.random() for _ in range(N)]
labels = [rnd.randrange(10) for _ in range(N)]
tr = Trainer(sc)
tr.warmup()
episodes: list[list[int]] = []
took = [0.0]


def evaluate() -> dict:
    """Per-class precision/recall at the median score, and a ranking, the slow pure-Python way."""
    order = sorted(range(N), key=lambda i: -scores[i])
    rank = {i: r for r, i in enumerate(order)}
    out = {}
    for c in range(10):
        tp = sum(1 for i in range(N) if labels[i] == c and rank[i] < N // 2)
        pos = sum(1 for i in range(N) if labels[i] == c)
        out[c] = (tp / max(pos, 1), tp / max(N // 2, 1))
    return out


def window_step() -> None:
    k = len(episodes)
    elapsed = (now() - sc.marks["window"]) / 1e9
    if elapsed >= k * PERIOD_S and elapsed + took[0] < sc.window_s - 0.3 * PERIOD_S:
        t0 = now()
        evaluate()
        episodes.append([t0, now()])
        took[0] = (episodes[-1][1] - t0) / 1e9
    tr.step()


def summary() -> None:
    sc.extra["eval_s"] = [round((b - a) / 1e9, 3) for a, b in episodes]
    sc.note(f"{len(episodes)} evaluations of {N:,} samples in the window: "
            f"{', '.join(f'{x:.2f}' for x in sc.extra['eval_s'])} s.")


t0 = now()
evaluate()
took[0] = (now() - t0) / 1e9
sc.extra.update(episodes_ns=episodes, eval_samples=N, eval_period_s=PERIOD_S, first_eval_s=round(took[0], 3))
sc.standard_phases(tr.step, lambda: None, lambda: None, window_step, before_truth=summary)
