"""microbatch: for 10 s the same samples per step are processed as 64 micro-batches (gradient
accumulation: forward + backward per micro-batch of batch/64, one optimizer step and one
loss.item() per step), CPUs 2-3.

The arithmetic per step is the same, cut into 64x as many kernels 64x smaller: the host launches
~1,600-2,300 kernels a step, each finishing on the GPU before the next arrives, so the GPU mostly
idles while the main thread (and the autograd thread it waits on in backward) launches. No culprit:
the feeder's own code."""

from common import Scenario, Trainer

MICRO = 64
sc = Scenario("microbatch", "launch_bound",
              f"the same samples per step as {MICRO} micro-batches (gradient accumulation) for 10 s", job_cpus=[2, 3])
tr = Trainer(sc)
tr.warmup()
torch = tr.torch
rows = tr.batch // MICRO


def accumulated_step() -> float:
    """One optimizer step over the usual batch, as MICRO forward/backward passes whose gradients add up."""
    x, y = tr.xs[tr.i % len(tr.xs)], tr.ys[tr.i % len(tr.ys)]
    tr.i += 1
    total = torch.zeros((), device=tr.dev)
    for k in range(MICRO):
        part = slice(k * rows, (k + 1) * rows)
        loss = tr.loss_fn(tr.model(x[part]), y[part]) / MICRO
        loss.backward()
        total += loss.detach()
    tr.opt.step()
    tr.opt.zero_grad(set_to_none=True)
    return total.item()


sc.extra["micro_batches"] = MICRO
sc.extra["micro_batch_rows"] = rows
sc.note(f"window steps: {tr.batch} samples as {MICRO} micro-batches of {rows}, one optimizer step and one "
        "loss.item() per step; baseline and recovery: the same samples in one pass.")
sc.standard_phases(tr.step, lambda: None, lambda: None, accumulated_step)
