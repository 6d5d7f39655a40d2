"""lock_convoy: the trainer's step records its metrics under a global threading.Lock (a shared aggregator). For 10 s
eight threads `metric_w` (in the same process) hammer that lock: each takes it, computes for ~1 ms in numpy (the
GIL released), releases it, and comes back at once. The main thread queues for the lock every step behind the
convoy, woken by whichever of them lets go: a pool of lock holders, no CPU short (CPUs 6-9). Culprits: the
metric_w threads."""

import os
import threading

import numpy as np

from common import Scenario, Trainer, comm_of, set_thread_name

sc = Scenario("lock_convoy", "lock_contention", "eight threads hammer the lock the step takes for 10 s",
              job_cpus=[6, 7, 8, 9], culprit_cpus=[6, 7, 8, 9])
tr = Trainer(sc)
tr.warmup()
lock = threading.Lock()
halt = threading.Event()
tids: list[int] = []
totals = {"n": 0}
block = np.random.default_rng(0).standard_normal((160, 160))


def hammer() -> None:
    set_thread_name("metric_w")
    tids.append(threading.get_native_id())
    local = block.copy()
    while not halt.is_set():
        with lock:
            local = np.tanh(local @ block * 0.01)  # ~1 ms, the GIL released inside the matmul
            totals["n"] += 1


threads = [threading.Thread(target=hammer, daemon=True) for _ in range(8)]


def locked_step() -> None:
    loss = tr.step()
    with lock:
        totals["loss"] = loss


def start() -> None:
    for th in threads:
        th.start()


def end() -> None:
    halt.set()
    for th in threads:
        th.join()
    by_comm: dict[str, list[int]] = {}
    for tid in tids:
        by_comm.setdefault(comm_of(os.getpid(), tid) or "metric_w", []).append(tid)
    for comm, ids in by_comm.items():
        sc.add_culprit(os.getpid(), sorted(ids), comm)


sc.note("every step (all phases) takes the lock once after training; in the window eight metric_w threads take it "
        "back to back, ~1 ms of numpy each time.")
sc.standard_phases(locked_step, start, end, before_truth=lambda: sc.extra.update(holds=totals["n"]))
