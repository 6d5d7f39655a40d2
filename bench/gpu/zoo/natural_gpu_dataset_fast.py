"""natural_gpu_dataset_fast (natural, nothing staged): a small dataset kept whole on the GPU, as a user who has read
that loaders are slow does it: 200,000 samples of 512 float32 features (~410 MB) and their labels in GPU memory, each
step's batch of 8192 drawn by a random index made on the GPU (torch.randint on the device, then an index gather), the
zoo's MLP (512-2048-2048-2048-10, fp32 without TF32, fused AdamW), the loss read back with .item() every 20 steps only
(the host otherwise runs ahead of the GPU, as far as the launch queue lets it). CPUs 2-3, 20 s. The script measures
itself: the steps per second, its time in the .item() calls, and a step's GPU time queued (common.gpu_seconds_queued),
so that the GPU's busy share is known. A fast, healthy, GPU-bound job."""

import time

from common import Scenario, Trainer, gpu_seconds_queued

sc = Scenario("natural_gpu_dataset_fast", "natural", "the MLP trained from a 200k-sample dataset held on the GPU, a "
              "random index per batch made on the GPU, loss.item() every 20 steps, 20 s, nothing staged",
              job_cpus=[2, 3], control=True)
tr = Trainer(sc, nbatches=1)
torch = tr.torch
model, opt, loss_fn = tr.model, tr.opt, tr.loss_fn
N = 200_000 if sc.cuda else 20_000
READ_EVERY = 20
gen = torch.Generator(device=tr.dev)
gen.manual_seed(0)
X = torch.randn(N, tr.in_dim, device=tr.dev, generator=gen)
Y = torch.randint(0, 10, (N,), device=tr.dev, generator=gen)
own = {"steps": 0, "item_s": 0.0, "reads": 0}


def work(_=None):
    """A step's GPU work, nothing read back; returns the loss."""
    idx = torch.randint(0, N, (tr.batch,), device=tr.dev, generator=gen)
    loss = loss_fn(model(X[idx]), Y[idx])
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    return loss


def step() -> None:
    loss = work()
    own["steps"] += 1
    if own["steps"] % READ_EVERY == 0:
        t0 = time.perf_counter()
        loss.item()
        own["item_s"] += time.perf_counter() - t0
        own["reads"] += 1


for _ in range(3 * READ_EVERY):
    step()
tr.sync()
gpu_step_s = None
if sc.cuda:
    runs = sorted(r for r in (gpu_seconds_queued(torch, work) for _ in range(5)) if r is not None)
    gpu_step_s = runs[len(runs) // 2] if runs else None
warm_end = time.perf_counter() + 2.0 * sc.scale  # the spin kernels well before the baseline
while time.perf_counter() < warm_end:
    step()
tr.sync()
own.update(steps=0, item_s=0.0, reads=0)
b0 = sc.mark("baseline")
t = time.perf_counter()
sc.run_for(10.0 * sc.scale, step)
mid = sc.mark("half")
sc.run_for(10.0 * sc.scale, step)
b1 = sc.mark("end")
tr.sync()  # the steps queued at the end: part of the run's GPU time, not of the wall below
wall = time.perf_counter() - t
n = own["steps"]
gpu_busy = n * gpu_step_s if gpu_step_s is not None else None
sc.extra["self"] = {**{k: round(v, 4) for k, v in own.items()}, "wall_s": round(wall, 4),
                    "steps_per_s": round(n / wall, 2), "item_share": round(own["item_s"] / wall, 4),
                    "gpu_step_ms": round(gpu_step_s * 1e3, 4) if gpu_step_s is not None else None,
                    "gpu_busy_share": round(min(gpu_busy / wall, 1.0), 4) if gpu_busy is not None else None,
                    "dataset": [N, tr.in_dim], "batch": tr.batch, "read_every": READ_EVERY}
sc.note(f"natural: measured by the script: {n} steps ({n / wall:.0f}/s) in {wall:.2f} s (to the GPU's end of the last "
        f"step), {own['item_s']:.2f} s in {own['reads']} loss.item() calls; "
        + (f"a step's kernels take {gpu_step_s * 1e3:.2f} ms of GPU time queued (GPU busy {gpu_busy / wall:.0%} of the "
           "run)." if gpu_busy is not None else "no GPU timings (no CUDA)."))
sc.write_truth(baseline=(b0, b1), window=None, ratio_spans=((b0, mid), (mid, b1)))
