"""healthy_dataloader (control): the loop is fed by DataLoader(num_workers=4, pin_memory=True,
persistent_workers=True) whose workers cut uint8 batches from a pool (~1 ms of numpy a batch) and
easily keep up; the main thread (CPUs 2-3) makes them float on the GPU. Workers on CPUs 4-7.
15 s, nothing staged. Window: none. throughput_ratio: first half over second half."""

import os

import numpy as np

from common import Scenario, Trainer

sc = Scenario("healthy_dataloader", "none", "a training loop fed by 4 DataLoader workers that easily keep up, 15 s, "
              "no cause", job_cpus=[2, 3], culprit_cpus=[4, 5, 6, 7], control=True)
tr = Trainer(sc)
torch = tr.torch
POOL = 16384


class Shards(torch.utils.data.Dataset):
    """Index b: the b-th batch of uint8 samples, cut from a pool."""

    def __init__(self, batch: int, dim: int) -> None:
        self.batch = batch
        self.pool = np.random.default_rng(0).integers(0, 256, (POOL, dim), dtype=np.uint8)

    def __len__(self) -> int:
        return 1 << 40

    def __getitem__(self, b: int):
        rows = self.pool[(b * self.batch + np.arange(self.batch)) % POOL]
        x = torch.from_numpy(rows)
        return x, (x[:, 0] % 10).long()


def pin_worker(k: int) -> None:
    os.sched_setaffinity(0, [sc.culprit_cpus[k % len(sc.culprit_cpus)]])


loader = torch.utils.data.DataLoader(Shards(tr.batch, tr.in_dim), batch_size=None, num_workers=4,
                                     pin_memory=sc.cuda, prefetch_factor=2, persistent_workers=True,
                                     worker_init_fn=pin_worker)
it = iter(loader)


def fed_step() -> None:
    """A step on the next batch from the workers: uint8 to the GPU, made float there."""
    x, y = next(it)
    x = x.to(tr.dev, non_blocking=True).float().div_(255.0)
    tr.step(x, y.to(tr.dev, non_blocking=True))


try:
    for _ in range(20):
        fed_step()
    tr.sync()
    sc.extra["workers"] = [w.pid for w in it._workers]
    if not sc.cuda:
        sc.note("--device cpu: pin_memory off (no CUDA).")
    b0 = sc.mark("baseline")
    sc.run_for(7.5 * sc.scale, fed_step)
    mid = sc.mark("half")
    sc.run_for(7.5 * sc.scale, fed_step)
    b1 = sc.mark("end")
    sc.note(f"control: every step trains on a {tr.batch}-sample uint8 batch from 4 workers that keep up; "
            "baseline_ns is the whole run; throughput_ratio compares its first and second halves.")
    sc.write_truth(baseline=(b0, b1), window=None, ratio_spans=((b0, mid), (mid, b1)))
finally:
    it._shutdown_workers()
