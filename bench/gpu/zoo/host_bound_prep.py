"""host_bound_prep: for 10 s the main thread builds every batch itself (num_workers=0 style) with
CPU-heavy numpy work, then copies it to the GPU; the GPU idles while it does (CPUs 10-11).
Phase A trains from batches already on the GPU. No culprit process: the feeder's own work."""

import numpy as np

from common import Scenario, Trainer

sc = Scenario("host_bound_prep", "host_bound_prep", "the main thread prepares each batch with numpy for 10 s",
              job_cpus=[10, 11])
tr = Trainer(sc)
tr.warmup()
torch = tr.torch
rng = np.random.default_rng(0)


def build_batch():
    x = rng.standard_normal((tr.batch, tr.in_dim), dtype=np.float32)
    for k in range(32):  # per-slice "augmentations": numpy on the main thread
        x[k::32] = np.tanh(x[k::32] * 1.01) + 0.001 * k
    y = rng.integers(0, 10, tr.batch)
    return torch.from_numpy(x), torch.from_numpy(y)


def prep_step() -> None:
    x, y = build_batch()
    tr.step(x, y)


sc.note(f"window steps: a {tr.batch}x{tr.in_dim} float32 batch made with numpy on the main thread, copied from "
        "pageable memory.")
sc.standard_phases(tr.step, lambda: None, lambda: None, prep_step)
