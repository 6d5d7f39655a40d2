"""producer_thread: a producer THREAD `batch_prod` in the trainer's own process (CPU 4) builds each
batch with numpy (uint8 samples cut from a pool, one light uint8 pass) and puts it on a
queue.Queue(maxsize=2); the main thread (CPUs 2-3) trains on what it gets, making it float on the
GPU. For 10 s the producer also makes float passes of contrast, noise and squashing over each
batch (~60 ms a batch, the number of passes timed on its CPU at start): numpy releases the GIL in
those passes, so the main thread is not kept off the interpreter but waits in get() for a batch.
Culprit: batch_prod's tid."""

import os
import queue
import threading
import time

import numpy as np

from common import Scenario, Trainer, comm_of, set_thread_name

sc = Scenario("producer_thread", "input_bound", "a producer thread in the trainer's process (batch_prod) does "
              "several times more numpy work per batch for 10 s", job_cpus=[2, 3], culprit_cpus=[4])
tr = Trainer(sc)
torch = tr.torch
HEAVY_S = 0.06  # the producer's extra numpy time per batch in the window
batches: queue.Queue = queue.Queue(maxsize=2)
heavy, halt = threading.Event(), threading.Event()
producer_info: dict = {"passes": 0}


def heavy_pass(f: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """One float pass over the batch: centre each sample, random contrast, noise, squash (numpy, GIL released)."""
    return np.tanh((f - f.mean(axis=1, keepdims=True)) * rng.uniform(0.9, 1.1)
                   + rng.standard_normal(f.shape, dtype=np.float32) * 0.01)


def produce(batch: int, dim: int) -> None:
    """The producer's loop: a batch cut from a pool and jittered (uint8), worked over more while `heavy` is set.
    At start it times a float pass, so that a heavy batch costs ~HEAVY_S more on whatever CPU it runs."""
    set_thread_name("batch_prod")
    os.sched_setaffinity(0, sc.culprit_cpus)  # this thread only
    producer_info["tid"] = threading.get_native_id()
    rng = np.random.default_rng(1)
    pool = rng.integers(0, 256, (16384, dim), dtype=np.uint8)
    jitter = rng.integers(0, 4, (batch, dim), dtype=np.uint8)
    f = pool[:batch].astype(np.float32)
    took = []
    for _ in range(3):
        t0 = time.perf_counter()
        heavy_pass(f, rng)
        took.append(time.perf_counter() - t0)
    producer_info["passes"] = max(1, round(HEAVY_S / min(took)))
    producer_info["pass_s"] = round(min(took), 4)
    b = 0
    while not halt.is_set():
        rows = pool[(b * batch + np.arange(batch)) % len(pool)] ^ jitter
        if heavy.is_set():
            f = rows.astype(np.float32) / 255.0
            for _ in range(producer_info["passes"]):
                f = heavy_pass(f, rng)
            rows = ((f + 1.0) * 127.5).astype(np.uint8)
        item = (rows, (rows[:, 0] % 10).astype(np.int64))
        while not halt.is_set():
            try:
                batches.put(item, timeout=0.2)
                break
            except queue.Full:
                pass
        b += 1


producer = threading.Thread(target=produce, args=(tr.batch, tr.in_dim), name="batch_prod", daemon=True)
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
    tid = producer_info["tid"]
    sc.add_culprit(os.getpid(), [tid], comm_of(os.getpid(), tid), cpus=sc.culprit_cpus)


try:
    for _ in range(20):
        fed_step()
    tr.sync()
    sc.extra.update(heavy_passes=producer_info["passes"], heavy_pass_s=producer_info["pass_s"],
                    heavy_s_per_batch=HEAVY_S)
    sc.note(f"every step (all phases) trains on a {tr.batch}-sample uint8 batch from a queue.Queue(maxsize=2) filled "
            f"by the thread batch_prod; in the window it makes {producer_info['passes']} float numpy passes over each "
            f"batch (~{HEAVY_S * 1e3:.0f} ms, timed on its CPU at start). Batches queued when the window began or "
            "ended (2-3) arrive as they were made.")
    sc.standard_phases(fed_step, start, end)
finally:
    halt.set()
    producer.join(5)
