"""natural_accum_workers (natural, nothing staged): a training loop as many scripts write it: a 4-worker DataLoader
(pin_memory, workers on CPUs 3-4, a per-sample numpy augmentation), bf16 autocast, gradient accumulation over 4
micro-batches per optimiser step, a learning-rate schedule, the loss printed every 50 steps, main thread on CPU 2,
20 s. The script measures itself: the time in next() on the loader and the rest of each micro-step."""

import os
import sys
import time

import numpy as np

from common import Scenario, map_cpus

sc = Scenario("natural_accum_workers", "natural", "a 4-worker DataLoader loop with autocast and gradient "
              "accumulation, 20 s, nothing staged", job_cpus=[2], culprit_cpus=[3, 4], control=True)
import torch  # noqa: E402

dev = torch.device(sc.device)
DIM, WIDTH, BATCH, ACCUM = 1024, (4096 if sc.cuda else 64), 256, 4
WORKER_CPUS = map_cpus([3, 4])


class Augmented(torch.utils.data.Dataset):
    """Sample i: a DIM-vector cut from a pool, jittered, normalised and randomly masked (numpy, per sample)."""

    def __init__(self) -> None:
        self.pool = np.random.default_rng(0).standard_normal((8192, DIM), dtype=np.float32)

    def __len__(self) -> int:
        return 1 << 30

    def __getitem__(self, i: int):
        rng = np.random.default_rng(i)
        x = self.pool[i % len(self.pool)] * rng.uniform(0.8, 1.2) + rng.standard_normal(DIM, dtype=np.float32) * 0.1
        x = (x - x.mean()) / (x.std() + 1e-6)
        x[rng.random(DIM) < 0.1] = 0.0
        return torch.from_numpy(x.astype(np.float32)), int(i % 10)


def pin_worker(k: int) -> None:
    os.sched_setaffinity(0, [WORKER_CPUS[k % len(WORKER_CPUS)]])


torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(DIM, WIDTH), torch.nn.GELU(), torch.nn.Linear(WIDTH, WIDTH),
                            torch.nn.GELU(), torch.nn.Linear(WIDTH, 10)).to(dev)
opt = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=sc.cuda or None)
sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=10_000)
loader = torch.utils.data.DataLoader(Augmented(), batch_size=BATCH, num_workers=4, pin_memory=sc.cuda,
                                     persistent_workers=True, worker_init_fn=pin_worker, prefetch_factor=2)
it = iter(loader)
own = {"wait_s": 0.0, "step_s": 0.0, "micro": 0}


def micro_step() -> None:
    t0 = time.perf_counter()
    x, y = next(it)
    t1 = time.perf_counter()
    x, y = x.to(dev, non_blocking=True), y.to(dev, non_blocking=True)
    with torch.autocast(sc.device, dtype=torch.bfloat16, enabled=sc.cuda):
        loss = torch.nn.functional.cross_entropy(model(x), y) / ACCUM
    loss.backward()
    own["micro"] += 1
    if own["micro"] % ACCUM == 0:
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
    if own["micro"] % 50 == 0:
        print(f"step {own['micro']} loss {loss.item() * ACCUM:.4f} lr {sched.get_last_lr()[0]:.2e}", flush=True)
    own["wait_s"] += t1 - t0
    own["step_s"] += time.perf_counter() - t1


for _ in range(20):
    micro_step()
if sc.cuda:
    torch.cuda.synchronize()
own.update(wait_s=0.0, step_s=0.0)
b0 = sc.mark("baseline")
t = time.perf_counter()
sc.run_for(10.0 * sc.scale, micro_step)
mid = sc.mark("half")
sc.run_for(10.0 * sc.scale, micro_step)
if sc.cuda:
    torch.cuda.synchronize()
b1 = sc.mark("end")
wall = time.perf_counter() - t
sc.extra["self"] = {"wait_s": round(own["wait_s"], 4), "step_s": round(own["step_s"], 4), "wall_s": round(wall, 4),
                    "wait_share": round(own["wait_s"] / wall, 4), "micro_steps": own["micro"]}
sc.extra["workers"] = [w.pid for w in it._workers]
sc.note(f"natural: measured by the script: {own['wait_s']:.2f} s in next() on the loader, {own['step_s']:.2f} s in "
        f"micro-steps, of {wall:.2f} s.")
sys.stdout.flush()
sc.write_truth(baseline=(b0, b1), window=None, ratio_spans=((b0, mid), (mid, b1)))
