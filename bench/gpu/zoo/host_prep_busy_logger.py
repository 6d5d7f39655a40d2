"""host_prep_busy_logger: for 10 s the main thread (CPUs 2-3) builds every batch itself with per-slice numpy work, as
host_bound_prep does, and at the same time a logging thread `log_zip` of the same process (CPU 4), idle before,
compresses a metrics buffer with zlib flat out (zlib releases the GIL: it takes nothing from the trainer). The slowdown
is the trainer's own work; the busy thread beside it is a coincidence. No culprit: the feeder's own work."""

import os
import threading
import zlib

import numpy as np

from common import Scenario, Trainer, set_thread_name

sc = Scenario("host_prep_busy_logger", "host_bound_prep", "the main thread prepares each batch with numpy for 10 s "
              "while a logging thread of the process compresses flat out (no effect on the trainer)",
              job_cpus=[2, 3], culprit_cpus=[4])
tr = Trainer(sc)
tr.warmup()
torch = tr.torch
rng = np.random.default_rng(0)
busy, halt = threading.Event(), threading.Event()
blob = np.random.default_rng(1).integers(0, 64, 4 << 20, dtype=np.uint8).tobytes()
info: dict = {"zipped": 0}


def log_zip() -> None:
    set_thread_name("log_zip")
    os.sched_setaffinity(0, sc.culprit_cpus)
    while not halt.is_set():
        if busy.wait(0.05):
            zlib.compress(blob, 6)
            info["zipped"] += 1


logger = threading.Thread(target=log_zip, name="log_zip", daemon=True)
logger.start()


def build_batch():
    x = rng.standard_normal((tr.batch, tr.in_dim), dtype=np.float32)
    for k in range(32):  # per-slice "augmentations": numpy on the main thread
        x[k::32] = np.tanh(x[k::32] * 1.01) + 0.001 * k
    y = rng.integers(0, 10, tr.batch)
    return torch.from_numpy(x), torch.from_numpy(y)


def prep_step() -> None:
    x, y = build_batch()
    tr.step(x, y)


try:
    sc.note(f"window steps: a {tr.batch}x{tr.in_dim} float32 batch made with numpy on the main thread; log_zip "
            "compresses 4 MiB with zlib in a loop only in the window.")
    sc.standard_phases(tr.step, busy.set, busy.clear, prep_step,
                       before_truth=lambda: sc.extra.update(zipped=info["zipped"]))
finally:
    halt.set()
    logger.join(5)
