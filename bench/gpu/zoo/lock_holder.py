"""lock_holder: for 10 s a thread `lock_holder` in the trainer's process holds a lock the training
step needs (think: a shared queue or a metrics lock) for 20 ms out of every 25 ms, sleeping while
it holds it, so it neither takes the GIL nor a CPU (CPUs 4-5).

The main thread sleeps on the lock's futex before each step; it is woken by lock_holder when the
lock is released. Culprit: lock_holder's tid."""

import os
import threading
import time

from common import Scenario, Trainer, comm_of, set_thread_name

sc = Scenario("lock_holder", "lock_contention", "a thread holds a lock the step needs 80% of the time for 10 s",
              job_cpus=[4, 5], culprit_cpus=[4, 5])
tr = Trainer(sc)
tr.warmup()
lock = threading.Lock()
halt = threading.Event()
started = threading.Event()
info: dict = {}


def hold() -> None:
    set_thread_name("lock_holder")
    info["tid"] = threading.get_native_id()
    started.set()
    while not halt.is_set():
        with lock:
            time.sleep(0.020)
        time.sleep(0.005)


th = threading.Thread(target=hold, name="lock_holder", daemon=True)


def locked_step() -> None:
    with lock:
        pass  # the step's critical section: take the shared lock, then run
    tr.step()


def start() -> None:
    th.start()
    started.wait()


def end() -> None:
    sc.add_culprit(os.getpid(), [info["tid"]], comm_of(os.getpid(), info["tid"]) or "lock_holder")
    halt.set()
    th.join()


sc.note("every step (all phases) takes the lock; only in the window does another thread hold it.")
sc.standard_phases(locked_step, start, end)
