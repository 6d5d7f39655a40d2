"""slow_workers: the loop is fed by DataLoader(num_workers=2), each worker pinned to a CPU of its own
(main process on CPUs 8-9, workers on 10 and 11: no CPU is shared). Each index of the dataset is
one batch of uint8 samples (as images are stored; the GPU turns them into floats). For 10 s
__getitem__ also augments every sample with numpy (flip, shift, noise, blur, clip: ~20-40 us a
sample): the two workers run flat out and still deliver fewer batches than the GPU could train
on, so the main thread waits for batches. Culprits: the pt_data_worker processes."""

import multiprocessing
import os

import numpy as np

from common import Scenario, Trainer, comm_of, tids_of

sc = Scenario("slow_workers", "input_bound", "2 DataLoader workers on CPUs of their own augment every sample with "
              "numpy for 10 s", job_cpus=[8, 9], culprit_cpus=[10, 11])
tr = Trainer(sc)
torch = tr.torch
POOL = 16384
heavy = multiprocessing.RawValue("b", 0)  # shared with the forked workers: the augmentation is on


def augment(sample: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """A per-sample augmentation: random flip and shift, brightness and noise, a 3-tap blur, clip."""
    img = sample.reshape(16, -1).astype(np.float32)
    if rng.random() < 0.5:
        img = img[:, ::-1]
    img = np.roll(img, int(rng.integers(-2, 3)), axis=0)
    img = img * rng.uniform(0.8, 1.2) + rng.normal(0.0, 4.0, img.shape)
    img[1:-1] = 0.25 * img[:-2] + 0.5 * img[1:-1] + 0.25 * img[2:]
    return np.clip(img, 0, 255).astype(np.uint8).ravel()


class Shards(torch.utils.data.Dataset):
    """Index b: the b-th batch of samples, cut from a pool (augmented per sample while `heavy` is set)."""

    def __init__(self, batch: int, dim: int) -> None:
        self.batch = batch
        self.pool = np.random.default_rng(0).integers(0, 256, (POOL, dim), dtype=np.uint8)

    def __len__(self) -> int:
        return 1 << 40

    def __getitem__(self, b: int):
        rows = self.pool[(b * self.batch + np.arange(self.batch)) % POOL]
        if heavy.value:
            rng = np.random.default_rng(b)
            rows = np.stack([augment(r, rng) for r in rows])
        x = torch.from_numpy(rows)
        return x, (x[:, 0] % 10).long()


def pin_worker(k: int) -> None:
    os.sched_setaffinity(0, [sc.culprit_cpus[k % len(sc.culprit_cpus)]])


loader = torch.utils.data.DataLoader(Shards(tr.batch, tr.in_dim), batch_size=None, num_workers=2,
                                     pin_memory=sc.cuda, prefetch_factor=2, persistent_workers=True,
                                     worker_init_fn=pin_worker)
it = iter(loader)
workers = [w.pid for w in it._workers]


def fed_step() -> None:
    """A step on the next batch from the workers: uint8 to the GPU, made float there."""
    x, y = next(it)
    x = x.to(tr.dev, non_blocking=True).float().div_(255.0)
    tr.step(x, y.to(tr.dev, non_blocking=True))


def start() -> None:
    heavy.value = 1


def end() -> None:
    heavy.value = 0
    for pid in workers:
        sc.add_culprit(pid, tids_of(pid), comm_of(pid), cpus=sorted(os.sched_getaffinity(pid)))


try:
    for _ in range(20):
        fed_step()
    tr.sync()
    sc.note(f"every step (all phases) trains on a {tr.batch}-sample uint8 batch from 2 workers; in the window "
            "__getitem__ augments each sample with numpy. Batches already queued when the window began "
            "(up to 4) arrive unaugmented.")
    sc.standard_phases(fed_step, start, end)
finally:
    it._shutdown_workers()
