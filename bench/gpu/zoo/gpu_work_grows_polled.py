"""gpu_work_grows_polled: gpu_work_grows waited for as some loops do, keeping the thread free: after each step's work
is queued, a CUDA event is recorded and polled, query() then time.sleep(0.5 ms) until done, before loss.item() (then
immediate). For 10 s each step queues ~2x its own GPU time in extra bf16 matmuls: iterations/s fall ~3x, the main
thread sleeps on its timer ~3x longer per step. Its sleeps are the wait for the GPU, not the cause: removing them
would not help. No host-side cause may be blamed; no culprit. Job on CPU 2."""

import time

from common import Scenario, Trainer

sc = Scenario("gpu_work_grows_polled", "gpu_bound", "each step, waited for by polling an event with 0.5 ms sleeps, "
              "queues ~2x its own GPU time in extra bf16 matmuls for 10 s", job_cpus=[2])
tr = Trainer(sc)
torch = tr.torch
tr.warmup()
n = 4096 if sc.cuda else 128
a = torch.randn(n, n, device=tr.dev, dtype=torch.bfloat16 if sc.cuda else torch.float32)
b = torch.randn_like(a)
c = torch.empty_like(a)
polls = {"sleeps": 0}


def timed(fn, reps: int) -> float:
    tr.sync()
    t0 = time.perf_counter()
    for _ in range(reps):
        fn()
    tr.sync()
    return (time.perf_counter() - t0) / reps


def matmul() -> None:
    torch.matmul(a, b, out=c)


def polled_step(extra: int = 0) -> float:
    """tr.step's work with its wait made a poll: queue it, record an event, sleep 0.5 ms until the event is done."""
    for _ in range(extra):
        matmul()
    x, y = tr.xs[tr.i % len(tr.xs)], tr.ys[tr.i % len(tr.ys)]
    tr.i += 1
    loss = tr.loss_fn(tr.model(x), y)
    loss.backward()
    tr.opt.step()
    tr.opt.zero_grad(set_to_none=True)
    if sc.cuda:
        done = torch.cuda.Event()
        done.record()
        while not done.query():
            time.sleep(0.0005)
            polls["sleeps"] += 1
    return loss.item()


step_s = min(timed(polled_step, 20) for _ in range(3))
mm_s = min(timed(matmul, 20) for _ in range(3))
extra = max(1, round(2.0 * step_s / mm_s))
sc.extra.update(step_s=round(step_s, 5), matmul_s=round(mm_s, 6), extra_matmuls=extra)


def before_truth() -> None:
    sc.extra["poll_sleeps"] = polls["sleeps"]


sc.note(f"a step takes {step_s * 1e3:.2f} ms (timed at start), its end waited for by polling a CUDA event with "
        f"0.5 ms sleeps; in the window {extra} {n}x{n} matmuls ({mm_s * 1e3:.3f} ms each) are queued before each "
        "step: the GPU does ~3x the work per step, the host sleeps longer waiting for it.")
sc.standard_phases(polled_step, lambda: None, lambda: None, window_step=lambda: polled_step(extra),
                   before_truth=before_truth)
