"""gil_holder: a pure-Python thread `gil_spin` in the trainer's own process spins for 10 s.

The trainer (CPUs 6-7, two CPUs so the thread does not also take the CPU away) must take the GIL
back after every call that released it; the spinning thread keeps it for the switch interval
(5 ms) each time. The main thread waits on a futex (the GIL), not for a CPU. Culprit: gil_spin's tid."""

import os
import threading

from common import Scenario, Trainer, comm_of, set_thread_name

sc = Scenario("gil_holder", "gil_contention", "a pure-Python busy thread gil_spin in the trainer process for 10 s",
              job_cpus=[6, 7], culprit_cpus=[6, 7])
tr = Trainer(sc)
tr.warmup()
halt = threading.Event()
started = threading.Event()
info: dict = {}


def spin() -> None:
    set_thread_name("gil_spin")
    info["tid"] = threading.get_native_id()
    started.set()
    x = 0
    while not halt.is_set():
        for i in range(2000):
            x = (x + i * i) % 1000003


th = threading.Thread(target=spin, name="gil_spin", daemon=True)


def start() -> None:
    th.start()
    started.wait()


def end() -> None:
    sc.add_culprit(os.getpid(), [info["tid"]], comm_of(os.getpid(), info["tid"]) or "gil_spin")
    halt.set()
    th.join()


sc.standard_phases(tr.step, start, end)
