"""select_poll_producer: producer_thread's producer, `batch_sel` (CPU 4), handing each batch over through a one-slot
mailbox and a byte on a pipe; the main thread (CPUs 2-3) waits for that byte as an event loop does: select() on the
pipe with a 5 ms timeout, again and again, until it is readable. For 10 s the producer makes ~60 ms of float numpy
passes per batch: most of the main thread's waits then end on their own timeout (the timer's interrupt), one in ~12
by the producer's write. It waits for the producer, not on purpose: an edge of the rule that a poll wait a hard
interrupt ended is a chosen sleep. Culprit: batch_sel's tid."""

import os
import select
import threading
import time

import numpy as np

from common import Scenario, Trainer, comm_of, set_thread_name

sc = Scenario("select_poll_producer", "input_bound", "a producer thread (batch_sel) handing batches over through a "
              "pipe the main thread select()s with a 5 ms tick does ~60 ms more numpy per batch for 10 s",
              job_cpus=[2, 3], culprit_cpus=[4])
tr = Trainer(sc)
torch = tr.torch
HEAVY_S = 0.06  # the producer's extra numpy time per batch in the window
slot: list = []  # the one batch made and not yet taken
slot_free = threading.Condition()
ready_r, ready_w = os.pipe()  # a byte per batch made: what the main thread's select() waits on
TICK_S = 0.005
heavy, halt = threading.Event(), threading.Event()
producer_info: dict = {"passes": 0}


def heavy_pass(f: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """One float pass over the batch: centre each sample, random contrast, noise, squash (numpy, GIL released)."""
    return np.tanh((f - f.mean(axis=1, keepdims=True)) * rng.uniform(0.9, 1.1)
                   + rng.standard_normal(f.shape, dtype=np.float32) * 0.01)


def produce(batch: int, dim: int) -> None:
    """The producer's loop: a batch cut from a pool and jittered (uint8), worked over more while `heavy` is set.
    At start it times a float pass, so that a heavy batch costs ~HEAVY_S more on whatever CPU it runs."""
    set_thread_name("batch_sel")
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
        with slot_free:
            while slot and not halt.is_set():
                slot_free.wait(0.2)
            if halt.is_set():
                break
            slot.append(item)
        os.write(ready_w, b"b")
        b += 1


producer = threading.Thread(target=produce, args=(tr.batch, tr.in_dim), name="batch_sel", daemon=True)
producer.start()


def take() -> tuple:
    """The next batch: an event loop's wait, select() on the pipe with a 5 ms tick (its timers, its other work), until
    the producer's byte arrives."""
    while not select.select([ready_r], [], [], TICK_S)[0]:
        pass
    os.read(ready_r, 1)
    with slot_free:
        item = slot.pop()
        slot_free.notify()
    return item


def fed_step() -> None:
    """A step on the next batch from the mailbox."""
    x, y = take()
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
    sc.note(f"every step (all phases) takes a {tr.batch}-sample uint8 batch from a one-slot mailbox the thread "
            "batch_sel fills, announced by a byte on a pipe the main thread select()s with a 5 ms timeout in a loop; "
            f"in the window batch_sel makes {producer_info['passes']} float numpy passes over each batch "
            f"(~{HEAVY_S * 1e3:.0f} ms, timed on its CPU at start).")
    sc.standard_phases(fed_step, start, end)
finally:
    halt.set()
    with slot_free:
        slot_free.notify_all()
    producer.join(5)
