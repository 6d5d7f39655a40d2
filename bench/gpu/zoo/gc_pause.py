"""gc_pause: the training script holds a large live object graph, per-sample metadata (a dict with
two small lists for each of 1 million samples: ~3 million containers the cyclic GC must traverse),
built before the baseline. For 10 s the loop calls gc.collect() every ~1.5 s ("free some memory",
as scripts do periodically): each full collection walks every live container and stops the loop
for a large part of a second, the main thread on-CPU in the interpreter, outside any CUDA call
(CPUs 4-5). No culprit process. The truth's `episodes_ns` lists [start, end] of each collection.
Smoke runs (--scale < 0.5) hold scale/3 x 1 million samples."""

import gc

from common import Scenario, Trainer, now

sc = Scenario("gc_pause", "python_gc", "gc.collect() every 1.5 s over ~3 million live containers for 10 s",
              job_cpus=[4, 5])
SAMPLES = 1_000_000 if sc.scale >= 0.5 else int(1_000_000 * sc.scale / 3)  # smoke: pauses as short as its phases
PERIOD_S = 1.5 * sc.scale
t0 = now()
gc.disable()  # built in one go, as a loader that reads an index does; collections resume below
metadata = [{"id": i, "path": f"shard{i % 1024:04d}/{i:09d}.jpg", "label": i % 1000, "bbox": [i % 7, i % 11, 32, 32],
             "tags": ["train", "aug"]} for i in range(SAMPLES)]
gc.enable()
built_s = (now() - t0) / 1e9
t0 = now()
gc.collect()  # once after loading, as scripts do: the graph now sits in the oldest generation
first_s = (now() - t0) / 1e9
tr = Trainer(sc)
tr.warmup()
episodes: list[list[int]] = []
pause = [first_s]


def window_step() -> None:
    """Train; every PERIOD_S collect, as long as the collection ends inside the window."""
    k = len(episodes)
    elapsed = (now() - sc.marks["window"]) / 1e9
    if elapsed >= k * PERIOD_S and elapsed + pause[0] < sc.window_s - 0.2 * PERIOD_S:
        start = now()
        gc.collect()
        episodes.append([start, now()])
        pause[0] = (episodes[-1][1] - start) / 1e9
    tr.step()


def summary() -> None:
    """What the collections took, for the truth."""
    sc.extra["gc_s"] = [round((e - s) / 1e9, 3) for s, e in episodes]
    sc.note(f"{SAMPLES:,} metadata dicts (3 containers each) built in {built_s:.1f} s before the baseline "
            f"(then one gc.collect(): {first_s:.2f} s); "
            f"{len(episodes)} gc.collect() in the window: {', '.join(f'{x:.2f}' for x in sc.extra['gc_s'])} s.")


sc.extra.update(episodes_ns=episodes, samples=SAMPLES, gc_tracked_objects=len(gc.get_objects()),
                gc_period_s=PERIOD_S)
sc.standard_phases(tr.step, lambda: None, lambda: None, window_step, before_truth=summary)
