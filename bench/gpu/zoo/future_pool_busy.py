"""future_pool_busy: the main thread (CPUs 2-3) gets each batch from a ThreadPoolExecutor of 2 threads `fetch_busy`
(CPUs 4-5), keeping two requests in flight, and waits for the oldest with future.result(timeout=0.002) in a loop. A
request cuts a batch from a pool; for 10 s it also runs ~50 ms of numpy ufunc passes over a float copy first (timed
on its CPU at start; ufuncs release the GIL): the pool's threads RUN while the trainer waits, and each signals the
future it finished. Culprits: the fetch_busy threads."""

import collections
import concurrent.futures as cf
import os
import threading
import time

import numpy as np

from common import Scenario, Trainer, comm_of, set_thread_name

sc = Scenario("future_pool_busy", "input_bound", "a pool of 2 fetch threads (fetch_busy) computes ~50 ms of numpy per "
              "batch request for 10 s; the main thread waits with future.result(timeout=0.002) in a loop",
              job_cpus=[2, 3], culprit_cpus=[4, 5])
tr = Trainer(sc)
torch = tr.torch
HEAVY_S = 0.05
pool_rows = np.random.default_rng(17).integers(0, 256, (16384, tr.in_dim), dtype=np.uint8)
heavy = threading.Event()
tids: set[int] = set()
info: dict = {"timeouts": 0, "b": 0, "passes": 1}
work = np.random.default_rng(3).standard_normal(1 << 20, dtype=np.float32)


def one_pass(a: np.ndarray, out: np.ndarray) -> None:
    np.sqrt(np.abs(a, out=out), out=out)
    np.tanh(out, out=out)


def calibrate() -> None:
    out = np.empty_like(work)
    took = []
    for _ in range(5):
        t0 = time.perf_counter()
        one_pass(work, out)
        took.append(time.perf_counter() - t0)
    info["passes"] = max(1, round(HEAVY_S / min(took)))


def named() -> None:
    set_thread_name("fetch_busy")
    os.sched_setaffinity(0, sc.culprit_cpus)
    tids.add(threading.get_native_id())


def fetch(b: int) -> tuple:
    if heavy.is_set():
        out = np.empty_like(work)
        for _ in range(info["passes"]):
            one_pass(work, out)
    rows = pool_rows[(b * tr.batch + np.arange(tr.batch)) % len(pool_rows)]
    return rows, (rows[:, 0] % 10).astype(np.int64)


ex = cf.ThreadPoolExecutor(max_workers=2, initializer=named)
ex.submit(calibrate).result()
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
    heavy.set()


def end() -> None:
    heavy.clear()
    sc.add_culprit(os.getpid(), sorted(tids), comm_of(os.getpid(), min(tids)), cpus=sc.culprit_cpus)


try:
    for _ in range(20):
        fed_step()
    tr.sync()
    sc.extra.update(heavy_s=HEAVY_S, passes=info["passes"], pool_threads=2)
    sc.standard_phases(fed_step, start, end, before_truth=lambda: sc.extra.update(timeouts=info["timeouts"]))
finally:
    ex.shutdown(wait=False, cancel_futures=True)
