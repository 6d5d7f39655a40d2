"""healthy_cond_fast_decoy (control): healthy_cond_decoy_hog staged again. Its producer never kept up (~6 ms of numpy
per batch took longer than a step: the job was producer-bound all run); here the producer thread `batch_cf` (CPU 4)
only cuts uint8 rows from a pool (as healthy_queue_timeout's does), the main thread waits in
cond.wait(timeout=0.002), and three busy loops `hogd` run on CPU 6, which no thread of the job uses, for 10 s
mid-run: a CPU hog on the host that starves nothing of the job is not a cause."""

import os
import threading

import numpy as np

from common import BUSY_LOOP, Scenario, Trainer, map_cpus, set_thread_name, spawn_python, stop

sc = Scenario("healthy_cond_fast_decoy", "none", "three busy loops on a CPU the job does not use, for 10 s, beside a "
              "fast producer thread and a timed condition wait; no cause", job_cpus=[2, 3], culprit_cpus=[4],
              control=True)
tr = Trainer(sc)
torch = tr.torch
HOG_CPUS = map_cpus([6])
cond = threading.Condition()
slot: list = [None]
halt = threading.Event()
info: dict = {"timeouts": 0}


def produce(batch: int, dim: int) -> None:
    set_thread_name("batch_cf")
    os.sched_setaffinity(0, sc.culprit_cpus)
    pool = np.random.default_rng(9).integers(0, 256, (16384, dim), dtype=np.uint8)
    b = 0
    while not halt.is_set():
        rows = pool[(b * batch + np.arange(batch)) % len(pool)]
        item = (rows, (rows[:, 0] % 10).astype(np.int64))
        with cond:
            while slot[0] is not None and not halt.is_set():
                cond.wait(0.05)
            slot[0] = item
            cond.notify_all()
        b += 1


def take() -> tuple:
    with cond:
        while slot[0] is None:
            if not cond.wait(timeout=0.002):
                info["timeouts"] += 1
        item, slot[0] = slot[0], None
        cond.notify_all()
    return item


producer = threading.Thread(target=produce, args=(tr.batch, tr.in_dim), name="batch_cf", daemon=True)
producer.start()


def fed_step() -> None:
    x, y = take()
    x = torch.from_numpy(x).to(tr.dev, non_blocking=True).float().div_(255.0)
    tr.step(x, torch.from_numpy(y).to(tr.dev, non_blocking=True))


hogs: list = []
try:
    for _ in range(20):
        fed_step()
    tr.sync()
    b0 = sc.mark("baseline")
    sc.run_for(4.0 * sc.scale, fed_step)
    mid = sc.mark("half")
    for _ in range(3):
        hogs.append(spawn_python(BUSY_LOOP.format(seconds=10 * sc.scale + 5), "hogd", HOG_CPUS))
    sc.run_for(10.0 * sc.scale, fed_step)
    stop(hogs)
    sc.run_for(3.0 * sc.scale, fed_step)
    b1 = sc.mark("end")
    sc.extra.update(timeouts=info["timeouts"], hog_cpus=HOG_CPUS)
    sc.note("control: baseline_ns is the whole run; throughput_ratio compares the 4 s before the decoy hogs with the "
            "rest (hogs on CPU 6 for 10 s, then 3 s without).")
    sc.write_truth(baseline=(b0, b1), window=None, ratio_spans=((b0, mid), (mid, b1)))
finally:
    stop(hogs)
    halt.set()
    with cond:
        cond.notify_all()
    producer.join(5)
