"""healthy_poll_loop (control): the main thread (CPUs 2-3) waits for each batch by polling a one-slot mailbox with
time.sleep(0), as spin_wait_producer does, but the producer thread `batch_fast` (CPU 4) only cuts uint8 rows from a
pool and keeps ahead all along, 15 s: a poll loop whose producer keeps up is not a slow job."""

import os
import threading
import time

import numpy as np

from common import Scenario, Trainer, set_thread_name

sc = Scenario("healthy_poll_loop", "none", "a poll loop on a mailbox a fast producer thread keeps full, 15 s, "
              "no cause", job_cpus=[2, 3], culprit_cpus=[4], control=True)
tr = Trainer(sc)
torch = tr.torch
slot: list = [None]
halt = threading.Event()


def produce(batch: int, dim: int) -> None:
    set_thread_name("batch_fast")
    os.sched_setaffinity(0, sc.culprit_cpus)
    pool = np.random.default_rng(4).integers(0, 256, (16384, dim), dtype=np.uint8)
    b = 0
    while not halt.is_set():
        rows = pool[(b * batch + np.arange(batch)) % len(pool)]
        item = (rows, (rows[:, 0] % 10).astype(np.int64))
        while slot[0] is not None and not halt.is_set():
            time.sleep(0.0005)
        slot[0] = item
        b += 1


def take() -> tuple:
    while slot[0] is None:
        time.sleep(0)
    item, slot[0] = slot[0], None
    return item


producer = threading.Thread(target=produce, args=(tr.batch, tr.in_dim), name="batch_fast", daemon=True)
producer.start()


def fed_step() -> None:
    x, y = take()
    x = torch.from_numpy(x).to(tr.dev, non_blocking=True).float().div_(255.0)
    tr.step(x, torch.from_numpy(y).to(tr.dev, non_blocking=True))


try:
    for _ in range(20):
        fed_step()
    tr.sync()
    b0 = sc.mark("baseline")
    sc.run_for(7.5 * sc.scale, fed_step)
    mid = sc.mark("half")
    sc.run_for(7.5 * sc.scale, fed_step)
    b1 = sc.mark("end")
    sc.note("control: baseline_ns is the whole run; throughput_ratio compares its first and second halves.")
    sc.write_truth(baseline=(b0, b1), window=None, ratio_spans=((b0, mid), (mid, b1)))
finally:
    halt.set()
    producer.join(5)
