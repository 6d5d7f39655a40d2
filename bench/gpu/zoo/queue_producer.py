"""queue_producer: a producer process `producer` (multiprocessing.Process, CPU 4) builds batches of
uint8 samples and puts them on a multiprocessing.Queue (2 deep); the main thread (CPUs 2-3)
trains on what it gets, making them float on the GPU. For 10 s the producer does much more CPU
work per batch (float passes of noise, contrast and squashing with numpy: ~100 ms a batch, the
number of passes timed on its CPU at start), so the queue runs dry and the main thread waits in get().
Culprit: producer."""

import multiprocessing
import os
import queue
import time

import numpy as np

from common import Scenario, Trainer, set_thread_name, tids_of

sc = Scenario("queue_producer", "input_bound", "a producer process feeding a multiprocessing.Queue does much "
              "more CPU work per batch for 10 s", job_cpus=[2, 3], culprit_cpus=[4])
tr = Trainer(sc)
torch = tr.torch
HEAVY_S = 0.1  # the producer's extra CPU time per batch in the window


def heavy_pass(f: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """One float pass over the batch: centre each sample, random contrast, noise, squash."""
    return np.tanh((f - f.mean(axis=1, keepdims=True)) * rng.uniform(0.9, 1.1)
                   + rng.standard_normal(f.shape, dtype=np.float32) * 0.01)


def produce(out: multiprocessing.Queue, heavy, halt, passes, cpus: list[int], batch: int, dim: int) -> None:
    """The producer's loop: a batch cut from a pool, worked over more while `heavy` is set, put on the queue.
    At start it times a pass, so that a heavy batch costs ~HEAVY_S on whatever CPU it runs."""
    set_thread_name("producer")
    os.sched_setaffinity(0, cpus)
    rng = np.random.default_rng(1)
    pool = rng.integers(0, 256, (16384, dim), dtype=np.uint8)
    f = pool[:batch].astype(np.float32)
    took = []
    for _ in range(3):
        t0 = time.perf_counter()
        heavy_pass(f, rng)
        took.append(time.perf_counter() - t0)
    passes.value = max(1, round(HEAVY_S / min(took)))
    b = 0
    while not halt.is_set():
        rows = pool[(b * batch + np.arange(batch)) % len(pool)]
        if heavy.is_set():
            f = rows.astype(np.float32) / 255.0
            for _ in range(passes.value):
                f = heavy_pass(f, rng)
            rows = ((f + 1.0) * 127.5).astype(np.uint8)
        out.put((rows, (rows[:, 0] % 10).astype(np.int64)))
        b += 1


ctx = multiprocessing.get_context("fork")
batches = ctx.Queue(maxsize=2)
heavy, halt, passes = ctx.Event(), ctx.Event(), ctx.Value("i", 0)
producer = ctx.Process(target=produce, args=(batches, heavy, halt, passes, sc.culprit_cpus, tr.batch, tr.in_dim),
                       name="producer", daemon=True)
producer.start()


def fed_step() -> None:
    """A step on the next batch from the queue."""
    x, y = batches.get()
    x = torch.from_numpy(x).to(tr.dev, non_blocking=True).float().div_(255.0)
    tr.step(x, torch.from_numpy(y).to(tr.dev, non_blocking=True))


def start() -> None:
    heavy.set()


def end() -> None:
    heavy.clear()
    sc.add_culprit(producer.pid, tids_of(producer.pid), "producer")


try:
    for _ in range(20):
        fed_step()
    tr.sync()
    sc.extra.update(heavy_passes=passes.value, heavy_s_per_batch=HEAVY_S)
    sc.note(f"every step (all phases) trains on a {tr.batch}-sample uint8 batch from the queue (2 deep); in the window "
            f"the producer makes {passes.value} float passes over each batch (~{HEAVY_S * 1e3:.0f} ms, timed on its "
            "CPU at start). Batches queued when the window began or ended (2-3) arrive as they were made.")
    sc.standard_phases(fed_step, start, end)
finally:
    halt.set()  # the producer finishes the batch in hand; its queue's feeder thread flushes while we read
    deadline = time.monotonic() + 10
    while producer.is_alive() and time.monotonic() < deadline:
        try:
            batches.get(timeout=0.1)
        except queue.Empty:
            pass
    if producer.is_alive():
        producer.terminate()
    producer.join(5)
