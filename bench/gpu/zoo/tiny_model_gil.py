"""tiny_model_gil: a tiny-model training loop that is host-bound all along (the GPU ~10 % busy: the
host spends longer launching a step than the GPU running it), and for 10 s a pure-Python thread
`gil_spin` in the same process spins (CPUs 6-7, two CPUs so the thread does not take the CPU).

Every PyTorch op releases the GIL around its dispatch and must take it back; gil_spin keeps it
for the switch interval (5 ms) each time, so the loop slows many times over. It is host-bound
before and after as well: the staged slowdown must outrank that steady state. Culprit: gil_spin's tid."""

import os
import threading

from common import Scenario, Trainer, comm_of, set_thread_name

sc = Scenario("tiny_model_gil", "gil_contention", "a pure-Python busy thread gil_spin in a host-bound tiny-model "
              "trainer for 10 s", job_cpus=[6, 7], culprit_cpus=[6, 7])
tr = Trainer(sc, width=256, batch=512, in_dim=128)
tr.warmup()
halt = threading.Event()
started = threading.Event()
info: dict = {}


def spin() -> None:
    """Pure Python: holds the GIL whenever it runs."""
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


sc.note("tiny MLP 128-256-256-256-10, batch 512, from device-resident batches: host-bound in every phase.")
sc.standard_phases(tr.step, start, end)
