"""cond_producer_starved: a producer THREAD `batch_cs` in the trainer's own process (CPU 4) builds each batch with
~6 ms of numpy into a one-slot mailbox guarded by a threading.Condition; the main thread (CPUs 2-3) waits for it with
cond.wait(timeout=0.002) in a loop. For 10 s three busy-looping processes `hogd` join CPU 4: the producer gets about
a quarter of its CPU, waits for it the rest, and the trainer waits on the producer. Culprits: the hogd processes (the
producer is only the link)."""

import os
import threading
import time

import numpy as np

from common import BUSY_LOOP, Scenario, Trainer, set_thread_name, spawn_python, stop, tids_of

sc = Scenario("cond_producer_starved", "cpu_contention", "three busy loops (hogd) join the CPU of the producer thread "
              "batch_cs for 10 s; the main thread waits on a condition with a 2 ms timeout", job_cpus=[2, 3],
              culprit_cpus=[4])
tr = Trainer(sc)
torch = tr.torch
WORK_S = 0.006
cond = threading.Condition()
slot: list = [None]
halt = threading.Event()
info: dict = {"passes": 1, "timeouts": 0}
hogs: list = []


def a_pass(f: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    return np.tanh((f - f.mean(axis=1, keepdims=True)) * rng.uniform(0.9, 1.1))


def produce(batch: int, dim: int) -> None:
    set_thread_name("batch_cs")
    os.sched_setaffinity(0, sc.culprit_cpus)
    rng = np.random.default_rng(7)
    pool = rng.integers(0, 256, (16384, dim), dtype=np.uint8)
    f = pool[:batch].astype(np.float32)
    took = []
    for _ in range(5):
        t0 = time.perf_counter()
        a_pass(f, rng)
        took.append(time.perf_counter() - t0)
    info["passes"] = max(1, round(WORK_S / min(took)))
    b = 0
    while not halt.is_set():
        rows = pool[(b * batch + np.arange(batch)) % len(pool)]
        g = rows.astype(np.float32) / 255.0
        for _ in range(info["passes"]):
            g = a_pass(g, rng)
        rows = ((g + 1.0) * 127.5).astype(np.uint8)
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


producer = threading.Thread(target=produce, args=(tr.batch, tr.in_dim), name="batch_cs", daemon=True)
producer.start()


def fed_step() -> None:
    x, y = take()
    x = torch.from_numpy(x).to(tr.dev, non_blocking=True).float().div_(255.0)
    tr.step(x, torch.from_numpy(y).to(tr.dev, non_blocking=True))


def start() -> None:
    for _ in range(3):
        hogs.append(spawn_python(BUSY_LOOP.format(seconds=sc.window_s + 5), "hogd", sc.culprit_cpus))


def end() -> None:
    for p in hogs:
        sc.add_culprit(p.pid, tids_of(p.pid) or [p.pid], "hogd")
    stop(hogs)


try:
    for _ in range(20):
        fed_step()
    tr.sync()
    sc.extra.update(work_s=WORK_S, passes=info["passes"])
    sc.standard_phases(fed_step, start, end, before_truth=lambda: sc.extra.update(timeouts=info["timeouts"]))
finally:
    halt.set()
    with cond:
        cond.notify_all()
    producer.join(5)
