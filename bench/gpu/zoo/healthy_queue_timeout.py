"""healthy_queue_timeout (control): the main thread (CPUs 2-3) takes each batch with queue.get(timeout=0.003) in a
loop, as queue_timeout_producer does, but the producer thread `batch_qfast` (CPU 4) only cuts uint8 rows from a pool
and keeps the queue full all along, 15 s: timed queue waits whose producer keeps up are not a slow job."""

import os
import queue
import threading

import numpy as np

from common import Scenario, Trainer, set_thread_name

sc = Scenario("healthy_queue_timeout", "none", "timed queue.get on a queue a fast producer thread keeps full, 15 s, "
              "no cause", job_cpus=[2, 3], culprit_cpus=[4], control=True)
tr = Trainer(sc)
torch = tr.torch
q: queue.Queue = queue.Queue(maxsize=4)
halt = threading.Event()


def produce(batch: int, dim: int) -> None:
    set_thread_name("batch_qfast")
    os.sched_setaffinity(0, sc.culprit_cpus)
    pool = np.random.default_rng(11).integers(0, 256, (16384, dim), dtype=np.uint8)
    b = 0
    while not halt.is_set():
        rows = pool[(b * batch + np.arange(batch)) % len(pool)]
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
            continue


producer = threading.Thread(target=produce, args=(tr.batch, tr.in_dim), name="batch_qfast", daemon=True)
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
