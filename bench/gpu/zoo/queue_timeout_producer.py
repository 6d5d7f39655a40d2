"""queue_timeout_producer: a producer THREAD `batch_qt` in the trainer's own process (CPU 4) puts each batch, built
with numpy, on a queue.Queue(maxsize=2); the main thread (CPUs 2-3) takes it with q.get(timeout=0.003) in a loop,
trying again after each queue.Empty (as loaders with a stop flag do). For 10 s the producer makes float numpy passes
over each batch (~60 ms a batch, timed on its CPU at start; numpy releases the GIL). Culprit: batch_qt's tid."""

import os
import queue
import threading
import time

import numpy as np

from common import Scenario, Trainer, comm_of, set_thread_name

sc = Scenario("queue_timeout_producer", "input_bound", "a producer thread (batch_qt) does ~60 ms more numpy work per "
              "batch for 10 s; the main thread takes batches with queue.get(timeout=0.003) in a loop",
              job_cpus=[2, 3], culprit_cpus=[4])
tr = Trainer(sc)
torch = tr.torch
HEAVY_S = 0.06
q: queue.Queue = queue.Queue(maxsize=2)
heavy, halt = threading.Event(), threading.Event()
info: dict = {"passes": 0, "empties": 0}


def heavy_pass(f: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    return np.tanh((f - f.mean(axis=1, keepdims=True)) * rng.uniform(0.9, 1.1)
                   + rng.standard_normal(f.shape, dtype=np.float32) * 0.01)


def produce(batch: int, dim: int) -> None:
    set_thread_name("batch_qt")
    os.sched_setaffinity(0, sc.culprit_cpus)
    info["tid"] = threading.get_native_id()
    rng = np.random.default_rng(7)
    pool = rng.integers(0, 256, (16384, dim), dtype=np.uint8)
    f = pool[:batch].astype(np.float32)
    took = []
    for _ in range(3):
        t0 = time.perf_counter()
        heavy_pass(f, rng)
        took.append(time.perf_counter() - t0)
    info["passes"] = max(1, round(HEAVY_S / min(took)))
    b = 0
    while not halt.is_set():
        rows = pool[(b * batch + np.arange(batch)) % len(pool)]
        if heavy.is_set():
            g = rows.astype(np.float32) / 255.0
            for _ in range(info["passes"]):
                g = heavy_pass(g, rng)
            rows = ((g + 1.0) * 127.5).astype(np.uint8)
        item = (rows, (rows[:, 0] % 10).astype(np.int64))
        while not halt.is_set():
            try:
                q.put(item, timeout=0.05)
                break
            except queue.Full:
                continue
        b += 1


def take() -> tuple:
    while True:
        try:
            return q.get(timeout=0.003)
        except queue.Empty:
            info["empties"] += 1


producer = threading.Thread(target=produce, args=(tr.batch, tr.in_dim), name="batch_qt", daemon=True)
producer.start()


def fed_step() -> None:
    x, y = take()
    x = torch.from_numpy(x).to(tr.dev, non_blocking=True).float().div_(255.0)
    tr.step(x, torch.from_numpy(y).to(tr.dev, non_blocking=True))


def start() -> None:
    heavy.set()


def end() -> None:
    heavy.clear()
    tid = info["tid"]
    sc.add_culprit(os.getpid(), [tid], comm_of(os.getpid(), tid), cpus=sc.culprit_cpus)


try:
    for _ in range(20):
        fed_step()
    tr.sync()
    sc.extra.update(heavy_passes=info["passes"], heavy_s_per_batch=HEAVY_S)
    sc.standard_phases(fed_step, start, end, before_truth=lambda: sc.extra.update(empties=info["empties"]))
finally:
    halt.set()
    producer.join(5)
