"""omp_oversub: each step first builds its batch on the CPU with torch ops (scale, per-feature
normalisation, clamp, tanh over a 1024x512 float tensor: ~10 intra-op parallel regions of 512k
elements, the larger part of a step) in the main thread, then copies it and trains on it; the job
has 2 CPUs (10-11). The baseline runs torch.set_num_threads(2); for 10 s the script has
torch.set_num_threads(16) (as a config copied from a 16-CPU host would), so every parallel region
splits over 16 OpenMP threads on 2 CPUs: they queue for the CPUs, and the main thread waits at
each region's end for the last of them. Culprits: the process's own intra-op threads (the tids
that running those ops created, listed after the window's first step; comm as the OS shows them).
The main thread, which does its share, is the feeder, not a culprit.

libgomp knows the job's 2 CPUs (the affinity when torch loaded it), so with 16 threads it spins
only briefly before sleeping: the cost is the wake-ups and queueing, not spinning, and may be
modest; the recorded steps/s say how much."""

import os
from collections import defaultdict

from common import Scenario, Trainer, comm_of, tids_of

sc = Scenario("omp_oversub", "own_threads_cpu", "torch.set_num_threads(16) on a 2-CPU job that augments each batch "
              "with torch CPU ops, for 10 s", job_cpus=[10, 11])
BASE_THREADS, WINDOW_THREADS = 2, 16
tr = Trainer(sc, batch=1024)
tr.warmup()
torch = tr.torch
before = set(tids_of(os.getpid()))
torch.set_num_threads(BASE_THREADS)
src = torch.randn(tr.batch, tr.in_dim)
labels = torch.randint(0, 10, (tr.batch,))


def cpu_batch():
    """The CPU augmentation: intra-op parallel torch ops over the batch (each pass 512k elements)."""
    x = src.mul(1.01).add_(0.01)
    x = (x - x.mean(dim=0)) / (x.std(dim=0) + 1e-6)
    return x.clamp_(-3.0, 3.0).tanh_()


def aug_step() -> None:
    x = cpu_batch()
    tr.step(x.to(tr.dev), labels.to(tr.dev))


aug_step()
pool = set(tids_of(os.getpid())) - before  # the intra-op threads the baseline's thread count made


def start() -> None:
    torch.set_num_threads(WINDOW_THREADS)
    aug_step()  # the window's first step: OpenMP grows its pool to 16
    pool.update(set(tids_of(os.getpid())) - before)
    by_comm = defaultdict(list)
    for tid in sorted(pool):
        by_comm[comm_of(os.getpid(), tid) or "?"].append(tid)
    for comm, tids in by_comm.items():
        sc.add_culprit(os.getpid(), tids, comm, role="intra-op threads")


def end() -> None:
    torch.set_num_threads(BASE_THREADS)


sc.extra.update(intra_op_threads={"baseline": BASE_THREADS, "window": WINDOW_THREADS},
                parallel_backend=torch.__config__.parallel_info().splitlines()[-1].strip())
sc.note(f"every step (all phases) builds a {tr.batch}x{tr.in_dim} float batch with torch CPU ops in the main thread "
        f"(intra-op threads: {BASE_THREADS}, window {WINDOW_THREADS}, on 2 CPUs), copies it and trains on it.")
sc.standard_phases(aug_step, start, end)
