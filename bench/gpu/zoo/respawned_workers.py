"""respawned_workers: the loop is fed by DataLoader(num_workers=4). Baseline: persistent workers over
one long epoch. For 10 s: short epochs of 4 batches each (a validation-sized loader, or an
IterableDataset re-created per shard) without persistent_workers, so every epoch forks 4 new
workers, and the main thread waits for them to start and hand over their first batch. Trainer on
CPUs 2-3, workers on 4-7. Culprits: the workers of the window's epochs."""

import os

import numpy as np

from common import Scenario, Trainer

sc = Scenario("respawned_workers", "input_bound", "DataLoader workers forked again every 4 batches (no "
              "persistent_workers) for 10 s", job_cpus=[2, 3], culprit_cpus=[4, 5, 6, 7])
tr = Trainer(sc)
torch = tr.torch
POOL = 16384
EPOCH = 4


class Shards(torch.utils.data.Dataset):
    """Index b: the b-th batch of uint8 samples, cut from a pool."""

    def __init__(self, batch: int, dim: int, n: int) -> None:
        self.batch, self.n = batch, n
        self.pool = np.random.default_rng(0).integers(0, 256, (POOL, dim), dtype=np.uint8)

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, b: int):
        rows = self.pool[(b * self.batch + np.arange(self.batch)) % POOL]
        x = torch.from_numpy(rows)
        return x, (x[:, 0] % 10).long()


def pin_worker(k: int) -> None:
    os.sched_setaffinity(0, [sc.culprit_cpus[k % len(sc.culprit_cpus)]])


def loader(n: int, persistent: bool):
    return torch.utils.data.DataLoader(Shards(tr.batch, tr.in_dim, n), batch_size=None, num_workers=4,
                                       prefetch_factor=2, persistent_workers=persistent, worker_init_fn=pin_worker)


state: dict = {"it": iter(loader(1 << 40, True)), "workers": []}


def train_on(batch) -> None:
    x, y = batch
    x = x.to(tr.dev, non_blocking=True).float().div_(255.0)
    tr.step(x, y.to(tr.dev, non_blocking=True))


def steady_step() -> None:
    train_on(next(state["it"]))


def epoch_step() -> None:
    """One short epoch: new workers, EPOCH batches, workers gone (the loop counts one step per batch)."""
    it = iter(state["short"])
    state["workers"] += [w.pid for w in it._workers]
    for k, batch in enumerate(it):
        train_on(batch)
        if k < EPOCH - 1:
            sc.step()


def start() -> None:
    state["it"]._shutdown_workers()
    state["short"] = loader(EPOCH, False)


def end() -> None:
    for pid in state["workers"]:
        sc.add_culprit(pid, [pid], "pt_data_worker")
    state["it"] = iter(loader(1 << 40, True))


try:
    for _ in range(20):
        steady_step()
    tr.sync()
    sc.note(f"baseline and recovery: one persistent DataLoader; window: a fresh 4-worker DataLoader iterator per "
            f"{EPOCH} batches (workers forked each time); every batch counts as a step.")
    sc.standard_phases(steady_step, start, end, epoch_step)
    sc.extra["window_workers"] = len(state["workers"])
finally:
    state["it"]._shutdown_workers()
