"""gil_pool: for 10 s twelve threads `py_task` in the trainer each run short pure-Python tasks back to back
(string formatting and dict updates, a few ms each, never sleeping): the main thread gets the GIL only when one of
them is forced to drop it (every 5 ms), from a different holder each time - GIL contention spread over a pool.
CPUs 6-9 (no CPU short: 13 threads, one runs Python at a time). Culprits: the py_task threads."""

import os
import threading

from common import Scenario, Trainer, comm_of, set_thread_name

sc = Scenario("gil_pool", "gil_contention", "twelve threads running pure-Python tasks back to back for 10 s",
              job_cpus=[6, 7, 8, 9], culprit_cpus=[6, 7, 8, 9])
tr = Trainer(sc)
tr.warmup()
halt = threading.Event()
tids: list[int] = []


def task_loop() -> None:
    set_thread_name("py_task")
    tids.append(threading.get_native_id())
    counts: dict[str, int] = {}
    i = 0
    while not halt.is_set():
        for j in range(2000):
            key = f"k{(i * 31 + j) % 997}"
            counts[key] = counts.get(key, 0) + 1
        i += 1


threads = [threading.Thread(target=task_loop, daemon=True) for _ in range(12)]


def start() -> None:
    for th in threads:
        th.start()


def end() -> None:
    halt.set()
    for th in threads:
        th.join()
    by_comm: dict[str, list[int]] = {}
    for tid in tids:
        by_comm.setdefault(comm_of(os.getpid(), tid) or "py_task", []).append(tid)
    for comm, ids in by_comm.items():
        sc.add_culprit(os.getpid(), sorted(ids), comm)


sc.note("in the window twelve py_task threads run pure-Python loops without sleeping.")
sc.standard_phases(tr.step, start, end)
