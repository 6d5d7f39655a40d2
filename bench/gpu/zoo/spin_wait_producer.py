"""spin_wait_producer: a producer THREAD `batch_spin` in the trainer's own process (CPU 4) builds each batch with
numpy (uint8 rows cut from a pool) into a one-slot mailbox; the main thread (CPUs 2-3) waits for the next batch
by polling the slot in a Python loop with time.sleep(0), a hand-rolled spin-wait instead of a queue or an event.
For 10 s the producer also makes float numpy passes over each batch (~60 ms a batch, timed on its CPU at start;
numpy releases the GIL): the main thread stays on its CPU, looking busy, while it waits on the producer.
Culprit: batch_spin's tid."""

import os
import threading
import time

import numpy as np

from common import Scenario, Trainer, comm_of, set_thread_name

sc = Scenario("spin_wait_producer", "input_bound", "a producer thread (batch_spin) does ~60 ms more numpy work per "
              "batch for 10 s while the main thread spin-waits for each batch", job_cpus=[2, 3], culprit_cpus=[4])
tr = Trainer(sc)
torch = tr.torch
HEAVY_S = 0.06
slot: list = [None]  # the mailbox: one batch or None
heavy, halt = threading.Event(), threading.Event()
info: dict = {"passes": 0, "spins": 0}


def heavy_pass(f: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    return np.tanh((f - f.mean(axis=1, keepdims=True)) * rng.uniform(0.9, 1.1)
                   + rng.standard_normal(f.shape, dtype=np.float32) * 0.01)


def produce(batch: int, dim: int) -> None:
    set_thread_name("batch_spin")
    os.sched_setaffinity(0, sc.culprit_cpus)
    info["tid"] = threading.get_native_id()
    rng = np.random.default_rng(2)
    pool = rng.integers(0, 256, (16384, dim), dtype=np.uint8)
    f = pool[:batch].astype(np.float32)
    took = []
    for _ in range(3):
        t0 = time.perf_counter()
        heavy_pass(f, rng)
        took.append(time.perf_counter() - t0)
    info["passes"], info["pass_s"] = max(1, round(HEAVY_S / min(took))), round(min(took), 4)
    b = 0
    while not halt.is_set():
        rows = pool[(b * batch + np.arange(batch)) % len(pool)]
        if heavy.is_set():
            g = rows.astype(np.float32) / 255.0
            for _ in range(info["passes"]):
                g = heavy_pass(g, rng)
            rows = ((g + 1.0) * 127.5).astype(np.uint8)
        item = (rows, (rows[:, 0] % 10).astype(np.int64))
        while slot[0] is not None and not halt.is_set():
            time.sleep(0.0005)  # the producer waits politely; only the consumer spins
        slot[0] = item
        b += 1


def take() -> tuple:
    """The consumer's spin-wait: poll the mailbox, yielding the CPU with sleep(0) between looks."""
    while slot[0] is None:
        info["spins"] += 1
        time.sleep(0)
    item, slot[0] = slot[0], None
    return item


producer = threading.Thread(target=produce, args=(tr.batch, tr.in_dim), name="batch_spin", daemon=True)
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
    sc.extra.update(heavy_passes=info["passes"], heavy_pass_s=info["pass_s"], heavy_s_per_batch=HEAVY_S)
    sc.note(f"every step waits for its batch by spinning on a one-slot mailbox (time.sleep(0) between looks); "
            f"in the window batch_spin makes {info['passes']} float numpy passes per batch (~{HEAVY_S * 1e3:.0f} ms).")
    sc.standard_phases(fed_step, start, end, before_truth=lambda: sc.extra.update(spins=info["spins"]))
finally:
    halt.set()
    producer.join(5)
