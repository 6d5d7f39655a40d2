"""mp_poll_producer: a producer PROCESS `mp_prod` (multiprocessing, CPU 4) puts batches on a multiprocessing.Queue
(2 deep); the main thread (CPUs 2-3) does not block in get() but polls: get_nowait(), and on queue.Empty a
time.sleep(0.0002) before the next look. For 10 s the producer makes float numpy passes over each batch (~60 ms
a batch, timed on its CPU at start): the queue runs dry and the main thread polls. Culprit: mp_prod."""

import multiprocessing
import os
import queue
import time

import numpy as np

from common import Scenario, Trainer, set_thread_name, tids_of

sc = Scenario("mp_poll_producer", "input_bound", "a producer process (mp_prod) does ~60 ms more numpy work per batch "
              "for 10 s while the main thread polls its queue", job_cpus=[2, 3], culprit_cpus=[4])
tr = Trainer(sc)
torch = tr.torch
HEAVY_S = 0.06
polls = [0]


def heavy_pass(f: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    return np.tanh((f - f.mean(axis=1, keepdims=True)) * rng.uniform(0.9, 1.1)
                   + rng.standard_normal(f.shape, dtype=np.float32) * 0.01)


def produce(out: multiprocessing.Queue, heavy, halt, passes, cpus: list[int], batch: int, dim: int) -> None:
    set_thread_name("mp_prod")
    os.sched_setaffinity(0, cpus)
    rng = np.random.default_rng(3)
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
            g = rows.astype(np.float32) / 255.0
            for _ in range(passes.value):
                g = heavy_pass(g, rng)
            rows = ((g + 1.0) * 127.5).astype(np.uint8)
        out.put((rows, (rows[:, 0] % 10).astype(np.int64)))
        b += 1


ctx = multiprocessing.get_context("fork")
batches = ctx.Queue(maxsize=2)
heavy, halt, passes = ctx.Event(), ctx.Event(), ctx.Value("i", 0)
producer = ctx.Process(target=produce, args=(batches, heavy, halt, passes, sc.culprit_cpus, tr.batch, tr.in_dim),
                       name="mp_prod", daemon=True)
producer.start()


def take() -> tuple:
    """Poll the queue: a look, and a 0.2 ms nap when it is empty."""
    while True:
        try:
            return batches.get_nowait()
        except queue.Empty:
            polls[0] += 1
            time.sleep(0.0002)


def fed_step() -> None:
    x, y = take()
    x = torch.from_numpy(x).to(tr.dev, non_blocking=True).float().div_(255.0)
    tr.step(x, torch.from_numpy(y).to(tr.dev, non_blocking=True))


def start() -> None:
    heavy.set()


def end() -> None:
    heavy.clear()
    sc.add_culprit(producer.pid, tids_of(producer.pid), "mp_prod")


try:
    for _ in range(20):
        fed_step()
    tr.sync()
    sc.extra.update(heavy_passes=passes.value, heavy_s_per_batch=HEAVY_S)
    sc.note(f"the main thread polls the queue (get_nowait, 0.2 ms naps); in the window mp_prod makes {passes.value} "
            f"float passes per batch (~{HEAVY_S * 1e3:.0f} ms).")
    sc.standard_phases(fed_step, start, end, before_truth=lambda: sc.extra.update(polls=polls[0]))
finally:
    halt.set()
    deadline = time.monotonic() + 10
    while producer.is_alive() and time.monotonic() < deadline:
        try:
            batches.get(timeout=0.1)
        except queue.Empty:
            pass
    if producer.is_alive():
        producer.terminate()
    producer.join(5)
