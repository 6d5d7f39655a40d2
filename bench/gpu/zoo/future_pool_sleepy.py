"""future_pool_sleepy: the main thread (CPUs 2-3) gets each batch from a ThreadPoolExecutor of 4 threads `fetch_pool`
(CPU 4), keeping two requests in flight, and waits for the oldest with future.result(timeout=0.002) in a loop (trying
again after each TimeoutError). A request cuts a batch from a pool after a 1 ms sleep; for 10 s it sleeps 60 ms (a
slower remote source): the pool's threads sleep in turn while the trainer waits, none of them runs, and no one of
them signals most of the waits. Culprits: the fetch_pool threads."""

import collections
import concurrent.futures as cf
import os
import threading
import time

import numpy as np

from common import Scenario, Trainer, comm_of, set_thread_name

sc = Scenario("future_pool_sleepy", "input_bound", "a pool of 4 fetch threads (fetch_pool) takes 60 ms per batch "
              "request for 10 s (1 ms before); the main thread waits with future.result(timeout=0.002) in a loop",
              job_cpus=[2, 3], culprit_cpus=[4])
tr = Trainer(sc)
torch = tr.torch
SLOW_S, FAST_S = 0.06, 0.001
pool_rows = np.random.default_rng(13).integers(0, 256, (16384, tr.in_dim), dtype=np.uint8)
slow = threading.Event()
tids: set[int] = set()
info: dict = {"timeouts": 0, "b": 0}


def named() -> None:
    set_thread_name("fetch_pool")
    os.sched_setaffinity(0, sc.culprit_cpus)
    tids.add(threading.get_native_id())


def fetch(b: int) -> tuple:
    time.sleep(SLOW_S if slow.is_set() else FAST_S)
    rows = pool_rows[(b * tr.batch + np.arange(tr.batch)) % len(pool_rows)]
    return rows, (rows[:, 0] % 10).astype(np.int64)


ex = cf.ThreadPoolExecutor(max_workers=4, initializer=named)
inflight: collections.deque = collections.deque()


def take() -> tuple:
    while len(inflight) < 2:
        inflight.append(ex.submit(fetch, info["b"]))
        info["b"] += 1
    fut = inflight.popleft()
    while True:
        try:
            return fut.result(timeout=0.002)
        except cf.TimeoutError:
            info["timeouts"] += 1


def fed_step() -> None:
    x, y = take()
    x = torch.from_numpy(x).to(tr.dev, non_blocking=True).float().div_(255.0)
    tr.step(x, torch.from_numpy(y).to(tr.dev, non_blocking=True))


def start() -> None:
    slow.set()


def end() -> None:
    slow.clear()
    sc.add_culprit(os.getpid(), sorted(tids), comm_of(os.getpid(), min(tids)), cpus=sc.culprit_cpus)


try:
    for _ in range(20):
        fed_step()
    tr.sync()
    sc.extra.update(slow_s=SLOW_S, fast_s=FAST_S, pool_threads=4)
    sc.standard_phases(fed_step, start, end, before_truth=lambda: sc.extra.update(timeouts=info["timeouts"]))
finally:
    ex.shutdown(wait=False, cancel_futures=True)
