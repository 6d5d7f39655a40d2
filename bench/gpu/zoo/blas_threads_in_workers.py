"""blas_threads_in_workers: the loop is fed by DataLoader(num_workers=2) whose workers each run a small numpy
matmul per batch (~5 ms). Baseline: the workers' BLAS uses 1 thread (threadpoolctl-style limit set in
worker_init_fn). For 10 s a new loader whose workers use 8 BLAS threads each (the library's default on a big
host) on the job's 2 worker CPUs: each worker's threads queue for its CPUs with the other worker's, and the main
thread waits for batches. Trainer on CPUs 2-3, workers on 4-5. Culprits: the worker processes."""

import ctypes
import glob
import os

import numpy as np

from common import Scenario, Trainer, comm_of, map_cpus, tids_of

sc = Scenario("blas_threads_in_workers", "own_workers_cpu", "DataLoader workers with 8 BLAS threads each on 2 CPUs "
              "for 10 s (1 thread before)", job_cpus=[2, 3], culprit_cpus=[4, 5])
tr = Trainer(sc)
torch = tr.torch
WORKER_CPUS = [4, 5]


def set_blas_threads(n: int) -> str:
    """Set the loaded OpenBLAS's thread count (numpy's bundled one), as threadpoolctl does; returns what it found."""
    for lib in glob.glob(os.path.join(os.path.dirname(np.__file__), "..", "numpy.libs", "libscipy_openblas*")) + \
            glob.glob(os.path.join(os.path.dirname(np.__file__), "..", "numpy.libs", "libopenblas*")):
        try:
            so = ctypes.CDLL(lib)
        except OSError:
            continue
        for name in ("scipy_openblas_set_num_threads64_", "openblas_set_num_threads64_", "openblas_set_num_threads",
                     "scipy_openblas_set_num_threads"):
            fn = getattr(so, name, None)
            if fn is not None:
                fn(ctypes.c_int(n))
                return f"{os.path.basename(lib)}:{name}({n})"
    torch.set_num_threads(n)
    return f"torch.set_num_threads({n}) (no OpenBLAS found)"


class Matmul(torch.utils.data.Dataset):
    """Index b: a batch from a numpy matmul and tanh (~10 ms on one thread)."""

    def __init__(self, batch: int, dim: int) -> None:
        self.batch, self.dim = batch, dim
        self.a = np.random.default_rng(0).standard_normal((batch, 32)).astype(np.float32)
        self.w = np.random.default_rng(1).standard_normal((32, dim)).astype(np.float32)

    def __len__(self) -> int:
        return 1 << 40

    def __getitem__(self, b: int):
        x = np.tanh((self.a * (1 + (b % 7) * 1e-3)) @ self.w * 0.05)
        return torch.from_numpy(np.ascontiguousarray(x))


found: dict = {}


def init_with(threads: int):
    def init(k: int) -> None:
        os.sched_setaffinity(0, map_cpus(WORKER_CPUS))
        found[k] = set_blas_threads(threads)
    return init


def make(threads: int):
    return iter(torch.utils.data.DataLoader(Matmul(tr.batch, tr.in_dim), batch_size=None, num_workers=2,
                                            prefetch_factor=2, persistent_workers=True,
                                            worker_init_fn=init_with(threads)))


state = {"it": make(1)}
labels = torch.randint(0, 10, (tr.batch,), device=tr.dev)


def fed_step() -> None:
    x = next(state["it"]).to(tr.dev, non_blocking=True)
    tr.step(x, labels)


def start() -> None:
    state["it"]._shutdown_workers()
    state["it"] = make(8)
    state["workers"] = [w.pid for w in state["it"]._workers]


def end() -> None:
    for pid in state.get("workers", []):
        sc.add_culprit(pid, tids_of(pid) or [pid], comm_of(pid) or "pt_data_worker")
    state["it"]._shutdown_workers()
    state["it"] = make(1)


try:
    tr.warmup()
    for _ in range(20):
        fed_step()
    sc.extra["blas"] = set_blas_threads(1)
    sc.note("every step trains on a batch from 2 workers doing a numpy matmul on CPUs 4-5; BLAS threads per worker: "
            "1 in the baseline and recovery, 8 in the window (a new persistent loader each time).")
    sc.standard_phases(fed_step, start, end)
finally:
    state["it"]._shutdown_workers()
