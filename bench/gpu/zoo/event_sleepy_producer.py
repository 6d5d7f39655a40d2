"""event_sleepy_producer: a producer THREAD `batch_ev` in the trainer's own process (CPU 4) hands each batch over in a
one-slot mailbox and sets a threading.Event; the main thread (CPUs 2-3) waits with ev.wait(timeout=0.002) in a loop.
For 10 s the producer sleeps 40 ms before each batch (time.sleep: a rate-limited source, a remote fetch): it does not
run while the trainer waits, so the wait's cause is a thread that sleeps, not one that runs. Culprit: batch_ev."""

import os
import threading
import time

import numpy as np

from common import Scenario, Trainer, comm_of, set_thread_name

sc = Scenario("event_sleepy_producer", "input_bound", "a producer thread (batch_ev) sleeps 40 ms before each batch for "
              "10 s; the main thread waits on a threading.Event with a 2 ms timeout", job_cpus=[2, 3],
              culprit_cpus=[4])
tr = Trainer(sc)
torch = tr.torch
DELAY_S = 0.04
slot: list = [None]
ready, taken = threading.Event(), threading.Event()
slow, halt = threading.Event(), threading.Event()
info: dict = {"timeouts": 0}
taken.set()


def produce(batch: int, dim: int) -> None:
    set_thread_name("batch_ev")
    os.sched_setaffinity(0, sc.culprit_cpus)
    info["tid"] = threading.get_native_id()
    pool = np.random.default_rng(9).integers(0, 256, (16384, dim), dtype=np.uint8)
    b = 0
    while not halt.is_set():
        rows = pool[(b * batch + np.arange(batch)) % len(pool)]
        if slow.is_set():
            time.sleep(DELAY_S)
        item = (rows, (rows[:, 0] % 10).astype(np.int64))
        while not taken.wait(0.05):
            if halt.is_set():
                return
        taken.clear()
        slot[0] = item
        ready.set()
        b += 1


def take() -> tuple:
    while not ready.wait(timeout=0.002):
        info["timeouts"] += 1
    ready.clear()
    item, slot[0] = slot[0], None
    taken.set()
    return item


producer = threading.Thread(target=produce, args=(tr.batch, tr.in_dim), name="batch_ev", daemon=True)
producer.start()


def fed_step() -> None:
    x, y = take()
    x = torch.from_numpy(x).to(tr.dev, non_blocking=True).float().div_(255.0)
    tr.step(x, torch.from_numpy(y).to(tr.dev, non_blocking=True))


def start() -> None:
    slow.set()


def end() -> None:
    slow.clear()
    tid = info["tid"]
    sc.add_culprit(os.getpid(), [tid], comm_of(os.getpid(), tid), cpus=sc.culprit_cpus)


try:
    for _ in range(20):
        fed_step()
    tr.sync()
    sc.extra.update(delay_s=DELAY_S)
    sc.standard_phases(fed_step, start, end, before_truth=lambda: sc.extra.update(timeouts=info["timeouts"]))
finally:
    halt.set()
    taken.set()
    producer.join(5)
