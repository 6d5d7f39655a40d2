"""process_pool_sleepy: the main thread (CPUs 2-3) asks a ProcessPoolExecutor of 2 worker PROCESSES `fetch_proc`
(CPU 4) for each batch's rows (a lookup that returns the batch's indices, ~1 ms), keeping two requests in flight,
and waits for the oldest with future.result(timeout=0.002) in a loop. For 10 s a lookup sleeps 60 ms (a slower
remote index): the workers sleep while the trainer waits. The futures are completed by the executor's own manager
thread in the trainer's process, which waits on the workers' result pipe: the wait reaches the workers through it.
Culprits: the fetch_proc processes."""

import collections
import concurrent.futures as cf
import multiprocessing
import os
import time

import numpy as np

from common import Scenario, Trainer, set_thread_name, tids_of

sc = Scenario("process_pool_sleepy", "input_bound", "a process pool of 2 fetch workers (fetch_proc) takes 60 ms per "
              "lookup for 10 s (1 ms before); the main thread waits with future.result(timeout=0.002) in a loop",
              job_cpus=[2, 3], culprit_cpus=[4])
tr = Trainer(sc)
torch = tr.torch
SLOW_S, FAST_S = 0.06, 0.001
pool_rows = np.random.default_rng(19).integers(0, 256, (16384, tr.in_dim), dtype=np.uint8)
ctx = multiprocessing.get_context("fork")
slow = ctx.Event()
info: dict = {"timeouts": 0, "b": 0}
_slow = None


def named(flag, cpus: list[int]) -> None:
    global _slow
    _slow = flag
    set_thread_name("fetch_proc")
    os.sched_setaffinity(0, cpus)


def lookup(b: int, batch: int, n: int) -> np.ndarray:
    time.sleep(SLOW_S if _slow.is_set() else FAST_S)
    return (b * batch + np.arange(batch)) % n


ex = cf.ProcessPoolExecutor(max_workers=2, mp_context=ctx, initializer=named, initargs=(slow, sc.culprit_cpus))
inflight: collections.deque = collections.deque()


def take() -> tuple:
    while len(inflight) < 2:
        inflight.append(ex.submit(lookup, info["b"], tr.batch, len(pool_rows)))
        info["b"] += 1
    fut = inflight.popleft()
    while True:
        try:
            idx = fut.result(timeout=0.002)
            break
        except cf.TimeoutError:
            info["timeouts"] += 1
    rows = pool_rows[idx]
    return rows, (rows[:, 0] % 10).astype(np.int64)


def fed_step() -> None:
    x, y = take()
    x = torch.from_numpy(x).to(tr.dev, non_blocking=True).float().div_(255.0)
    tr.step(x, torch.from_numpy(y).to(tr.dev, non_blocking=True))


def start() -> None:
    slow.set()


def end() -> None:
    slow.clear()
    for pid in sorted(p.pid for p in ex._processes.values()):  # noqa: SLF001 - the executor's worker processes
        sc.add_culprit(pid, tids_of(pid), "fetch_proc", cpus=sc.culprit_cpus)


try:
    for _ in range(20):
        fed_step()
    tr.sync()
    sc.extra.update(slow_s=SLOW_S, fast_s=FAST_S, pool_processes=2)
    sc.standard_phases(fed_step, start, end, before_truth=lambda: sc.extra.update(timeouts=info["timeouts"]))
finally:
    ex.shutdown(wait=False, cancel_futures=True)
