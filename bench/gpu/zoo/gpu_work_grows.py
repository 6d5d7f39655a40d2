"""gpu_work_grows: the trainer's step (MLP from GPU-resident batches, loss.item() each step, CPU 2) gains, for 10 s,
bf16 matmuls queued behind it on the GPU, about twice the step's own GPU time (timed at start): iterations/s fall
~3x because the GPU has more work per step, and the host waits in loss.item() for it. Nothing on the host changed:
no host-side cause may be blamed (a synchronize waited longer, it was not called more). No culprit."""

import time

from common import Scenario, Trainer

sc = Scenario("gpu_work_grows", "gpu_bound", "each step queues ~2x its own GPU time in extra bf16 matmuls for 10 s",
              job_cpus=[2])
tr = Trainer(sc)
torch = tr.torch
tr.warmup()
n = 4096 if sc.cuda else 128
a = torch.randn(n, n, device=tr.dev, dtype=torch.bfloat16 if sc.cuda else torch.float32)
b = torch.randn_like(a)
c = torch.empty_like(a)


def timed(fn, reps: int) -> float:
    tr.sync()
    t0 = time.perf_counter()
    for _ in range(reps):
        fn()
    tr.sync()
    return (time.perf_counter() - t0) / reps


def matmul() -> None:
    torch.matmul(a, b, out=c)


step_s = min(timed(tr.step, 20) for _ in range(3))
mm_s = min(timed(matmul, 20) for _ in range(3))
extra = max(1, round(2.0 * step_s / mm_s))


def heavy_step() -> None:
    for _ in range(extra):
        matmul()
    tr.step()


sc.extra.update(step_s=round(step_s, 5), matmul_s=round(mm_s, 6), extra_matmuls=extra)
sc.note(f"a step takes {step_s * 1e3:.2f} ms (timed at start, loss.item() each step); in the window {extra} "
        f"{n}x{n} matmuls ({mm_s * 1e3:.3f} ms each) are queued before each step: the GPU does ~3x the work per step, "
        "the host's calls and their count are the same.")
sc.standard_phases(tr.step, lambda: None, lambda: None, window_step=heavy_step)
