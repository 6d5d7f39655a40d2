"""mp_lock_holder: every step takes a multiprocessing.Lock shared with another process (a POSIX semaphore in shared
memory: a futex, not a file lock), as jobs sharing a cache or a device do. For 10 s that process `shmlockd` (CPU 6)
holds it 20 ms of every 25 ms, asleep while it holds it: the main thread (CPUs 4-5) sleeps in the semaphore's futex
until shmlockd lets go; no CPU is short. Culprit: shmlockd."""

import multiprocessing
import os
import signal
import time

from common import Scenario, Trainer, tids_of

sc = Scenario("mp_lock_holder", "ipc_lock", "another process holds a shared multiprocessing.Lock 80% of the time "
              "for 10 s", job_cpus=[4, 5], culprit_cpus=[6])


def hold(lock, cpus: list[int]) -> None:
    """shmlockd: idle until SIGUSR1, then holds the lock 20 ms of every 25 ms until SIGUSR2."""
    import ctypes

    os.sched_setaffinity(0, cpus)
    ctypes.CDLL(None).prctl(15, ctypes.c_char_p(b"shmlockd"), 0, 0, 0)
    busy = [False]
    signal.signal(signal.SIGUSR1, lambda *a: busy.__setitem__(0, True))
    signal.signal(signal.SIGUSR2, lambda *a: busy.__setitem__(0, False))
    signal.signal(signal.SIGTERM, lambda *a: os._exit(0))
    while True:
        if not busy[0]:
            signal.pause()
            continue
        with lock:
            time.sleep(0.020)
        time.sleep(0.005)


# Forked before torch is imported (Trainer imports it): the holder never touches CUDA.
ctx = multiprocessing.get_context("fork")
lock = ctx.Lock()
holder = ctx.Process(target=hold, args=(lock, sc.culprit_cpus), daemon=True)
holder.start()

tr = Trainer(sc)
tr.warmup()


def locked_step() -> None:
    """A step under the shared lock (the cache index, the device's turn), then the step's work."""
    with lock:
        pass
    tr.step()


def start() -> None:
    os.kill(holder.pid, signal.SIGUSR1)


def end() -> None:
    sc.add_culprit(holder.pid, tids_of(holder.pid) or [holder.pid], "shmlockd", hold_s=0.020, period_s=0.025)
    os.kill(holder.pid, signal.SIGUSR2)


try:
    sc.note("every step (all phases) takes the shared lock; only in the window does shmlockd hold it 20 ms of every "
            "25.")
    sc.standard_phases(locked_step, start, end)
finally:
    holder.terminate()
    holder.join(5)
