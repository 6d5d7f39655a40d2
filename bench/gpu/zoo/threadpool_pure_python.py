"""threadpool_pure_python: each step's labels are prepared by a ThreadPoolExecutor(max_workers=1) worker
(thread `prep_pool`) while the main thread waits on the future. Baseline: the worker's job is tiny. For 10 s it
tokenises a batch of text in pure Python (~40 ms, holding the GIL while it runs), and the main thread waits for
the result each step: on the future's condition, woken by the worker when it is done. CPUs 4-5. Culprit: the
worker thread."""

import os
import threading
from concurrent.futures import ThreadPoolExecutor

from common import Scenario, Trainer, comm_of, set_thread_name

sc = Scenario("threadpool_pure_python", "input_bound", "a thread-pool worker tokenises each batch in pure Python "
              "(~40 ms) while the main thread waits on the future, for 10 s", job_cpus=[4, 5], culprit_cpus=[4, 5])
tr = Trainer(sc)
tr.warmup()
torch = tr.torch
info: dict = {}
TEXT = ["the quick brown fox jumps over the lazy dog number %d and keeps running" % i for i in range(12000)]
heavy = {"on": False}


def init() -> None:
    set_thread_name("prep_pool")
    info["tid"] = threading.get_native_id()


pool = ThreadPoolExecutor(max_workers=1, initializer=init)


def prepare(step: int) -> list[int]:
    """Labels for a step: in the window from a pure-Python tokenisation of TEXT (a vocabulary lookup per word)."""
    if not heavy["on"]:
        return [step % 10]
    vocab: dict[str, int] = {}
    ids = []
    for line in TEXT:
        for word in line.lower().split():
            ids.append(vocab.setdefault(word, len(vocab)))
    return [sum(ids) % 10]


def pooled_step() -> None:
    pool.submit(prepare, tr.i).result()
    tr.step()


def start() -> None:
    heavy["on"] = True


def end() -> None:
    heavy["on"] = False
    sc.add_culprit(os.getpid(), [info["tid"]], comm_of(os.getpid(), info["tid"]) or "prep_pool")


try:
    pooled_step()
    sc.note(f"every step waits on a pool worker's result; in the window the worker tokenises {len(TEXT)} lines in "
            "pure Python first.")
    sc.standard_phases(pooled_step, start, end)
finally:
    pool.shutdown(wait=False)
