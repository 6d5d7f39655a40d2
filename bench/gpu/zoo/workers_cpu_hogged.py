"""workers_cpu_hogged: the loop is fed by DataLoader(num_workers=2, persistent_workers=True) whose workers each
build a batch with ~4 ms of numpy work, each worker on a CPU of its own (4, 5); the main thread runs on CPUs 2-3.
For 10 s two busy processes `hogd` run on each worker's CPU: the workers wait for their CPUs behind them and the
main thread sleeps waiting for batches, its own CPUs free: a wait two hops from its cause, through a pool of
workers. Culprits: the hogd pids."""

import os

import numpy as np

from common import BUSY_LOOP, Scenario, Trainer, map_cpus, spawn_python, stop, tids_of

sc = Scenario("workers_cpu_hogged", "cpu_contention", "two busy loops on each DataLoader worker's CPU for 10 s",
              job_cpus=[2, 3], culprit_cpus=[4, 5])
tr = Trainer(sc)
torch = tr.torch
WORKER_CPUS = [4, 5]


class Augmented(torch.utils.data.Dataset):
    """Index b: a uint8 batch made with a few numpy passes (~4 ms)."""

    def __init__(self, batch: int, dim: int) -> None:
        self.batch, self.dim = batch, dim
        self.pool = np.random.default_rng(0).integers(0, 256, (4096, dim), dtype=np.uint8)

    def __len__(self) -> int:
        return 1 << 40

    def __getitem__(self, b: int):
        rows = self.pool[(b * 97 + np.arange(self.batch)) % len(self.pool)].astype(np.float32)
        for _ in range(2):
            rows = np.sqrt(rows * 1.001 + 1.0)
        return torch.from_numpy(np.clip(rows, 0, 255).astype(np.uint8))


def pin_worker(k: int) -> None:
    os.sched_setaffinity(0, map_cpus([WORKER_CPUS[k % len(WORKER_CPUS)]]))


loader = torch.utils.data.DataLoader(Augmented(tr.batch, tr.in_dim), batch_size=None, num_workers=2,
                                     prefetch_factor=2, persistent_workers=True, worker_init_fn=pin_worker)
it = iter(loader)
labels = torch.randint(0, 10, (tr.batch,), device=tr.dev)
hogs: list = []


def fed_step() -> None:
    x = next(it).to(tr.dev, non_blocking=True).float().div_(255.0)
    tr.step(x, labels)


def start() -> None:
    for cpu in sc.culprit_cpus:
        for _ in range(2):
            hogs.append(spawn_python(BUSY_LOOP.format(seconds=sc.window_s + 5), "hogd", [cpu]))


def end() -> None:
    for p in hogs:
        sc.add_culprit(p.pid, tids_of(p.pid) or [p.pid], "hogd")
    stop(hogs)


try:
    for _ in range(20):
        fed_step()
    tr.sync()
    sc.extra["workers"] = [w.pid for w in it._workers]
    sc.note("every step trains on a batch from 2 workers (each ~4 ms of numpy, on CPUs 4 and 5); in the window two "
            "hogd run on each worker's CPU.")
    sc.standard_phases(fed_step, start, end)
finally:
    stop(hogs)
    it._shutdown_workers()
