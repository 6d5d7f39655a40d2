"""healthy_many_threads (control): the training loop (CPUs 2-3) in a process that also holds 32 idle threads
(a thread pool waiting on its queue) and one busy thread `stats_w` that computes statistics in numpy on another
CPU (10) all along. 15 s, nothing staged. Window: none. throughput_ratio: first half over second half."""

import os
import queue
import threading

import numpy as np

from common import Scenario, Trainer, set_thread_name

sc = Scenario("healthy_many_threads", "none", "a training loop beside 32 idle pool threads and a busy numpy thread on "
              "another CPU, 15 s, no cause", job_cpus=[2, 3], culprit_cpus=[10], control=True)
tr = Trainer(sc)
tr.warmup()
halt = threading.Event()
jobs: queue.Queue = queue.Queue()
stats_cpu = sc.culprit_cpus[0]


def idle() -> None:
    while not halt.is_set():
        try:
            jobs.get(timeout=0.5)
        except queue.Empty:
            pass


def stats() -> None:
    set_thread_name("stats_w")
    os.sched_setaffinity(0, [stats_cpu])
    a = np.random.default_rng(0).standard_normal((400, 400))
    while not halt.is_set():
        a = np.tanh(a @ a.T * 1e-3)


threads = [threading.Thread(target=idle, daemon=True) for _ in range(32)] + [
    threading.Thread(target=stats, daemon=True)]
for th in threads:
    th.start()
try:
    b0 = sc.mark("baseline")
    sc.run_for(7.5 * sc.scale, tr.step)
    mid = sc.mark("half")
    sc.run_for(7.5 * sc.scale, tr.step)
    b1 = sc.mark("end")
    sc.note("control: the loop on CPUs 2-3 with 32 idle pool threads and a busy numpy thread pinned to another CPU; "
            "baseline_ns is the whole run; throughput_ratio compares its two halves.")
    sc.write_truth(baseline=(b0, b1), window=None, ratio_spans=((b0, mid), (mid, b1)))
finally:
    halt.set()
