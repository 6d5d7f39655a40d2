"""natural_metrics_logging (natural, nothing staged): a small MLP (512-1024-1024-1024-10, batch 256: a tabular model)
trained from batches already on the GPU, with the metrics a careful first script logs every step: the loss, the
accuracy, the gradient norm of each parameter (8) and the clipped total, each read with .item() (eleven small
synchronisations a step), a CSV line appended to a file in /tmp and flushed (no fsync), and a progress line printed
every 50 steps. CPU 2, 20 s. The script measures itself: the time in the .item() calls (waiting for the GPU, each a
round trip), in writing the CSV and the rest of the step, and the GPU's own time for a step's kernels, measured with
them queued behind a spin kernel (common.gpu_seconds_queued) so that the GPU's busy share of the run is known."""

import os
import tempfile
import time

from common import Scenario, Trainer, gpu_seconds_queued

sc = Scenario("natural_metrics_logging", "natural", "an MLP whose loop reads eleven metrics a step with .item() and "
              "appends a CSV line, 20 s, nothing staged", job_cpus=[2], control=True)
tr = Trainer(sc, width=1024, batch=256)
torch = tr.torch
model, opt = tr.model, tr.opt
names = [n for n, _ in model.named_parameters()]
path = os.path.join(tempfile.gettempdir(), f"natural-metrics-{os.getpid()}.csv")
log = open(path, "w")
log.write("step,loss,acc,grad_norm," + ",".join(f"gn_{n}" for n in names) + ",step_ms\n")
own = {"sync_s": 0.0, "csv_s": 0.0, "print_s": 0.0, "steps": 0, "syncs": 0}


def work(x, y) -> tuple:
    """The step's GPU work, nothing read back: the logits, the loss, each parameter's gradient norm, the total."""
    logits = model(x)
    loss = tr.loss_fn(logits, y)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    norms = [p.grad.norm() for p in model.parameters()]
    total = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    acc = (logits.argmax(1) == y).float().mean()
    return loss, acc, norms, total


def item(t) -> float:
    s = time.perf_counter()
    v = t.item()
    own["sync_s"] += time.perf_counter() - s
    own["syncs"] += 1
    return v


def step() -> None:
    t0 = time.perf_counter()
    i = tr.i % len(tr.xs)
    tr.i += 1
    x, y = tr.xs[i], tr.ys[i]
    logits = model(x)
    loss = tr.loss_fn(logits, y)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    grad_norms = {n: item(p.grad.norm()) for n, p in model.named_parameters()}
    total = item(torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0))
    opt.step()
    loss_v = item(loss)
    acc = item((logits.argmax(1) == y).float().mean())
    s = time.perf_counter()
    log.write(f"{tr.i},{loss_v:.5f},{acc:.4f},{total:.4f}," + ",".join(f"{grad_norms[n]:.4f}" for n in names)
              + f",{(s - t0) * 1e3:.3f}\n")
    log.flush()
    own["csv_s"] += time.perf_counter() - s
    own["steps"] += 1
    if tr.i % 50 == 0:
        s = time.perf_counter()
        print(f"step {tr.i} loss {loss_v:.4f} acc {acc:.3f} grad norm {total:.3f}", flush=True)
        own["print_s"] += time.perf_counter() - s


for _ in range(20):
    step()
gpu_step_s = None
if sc.cuda:
    runs = [gpu_seconds_queued(torch, lambda _: work(tr.xs[0], tr.ys[0])) for _ in range(5)]
    runs = sorted(r for r in runs if r is not None)
    gpu_step_s = runs[len(runs) // 2] if runs else None
warm_end = time.perf_counter() + 2.0 * sc.scale  # the spin kernels well before the baseline
while time.perf_counter() < warm_end:
    step()
tr.sync()
own.update(sync_s=0.0, csv_s=0.0, print_s=0.0, steps=0, syncs=0)
b0 = sc.mark("baseline")
t = time.perf_counter()
sc.run_for(10.0 * sc.scale, step)
mid = sc.mark("half")
sc.run_for(10.0 * sc.scale, step)
b1 = sc.mark("end")
wall = time.perf_counter() - t
log.close()
size = os.path.getsize(path)
os.unlink(path)
gpu_busy = own["steps"] * gpu_step_s if gpu_step_s is not None else None
sc.extra["self"] = {"sync_s": round(own["sync_s"], 4), "csv_s": round(own["csv_s"], 4),
                    "print_s": round(own["print_s"], 4), "other_s": round(wall - own["sync_s"] - own["csv_s"]
                                                                          - own["print_s"], 4),
                    "steps": own["steps"], "syncs": own["syncs"], "wall_s": round(wall, 4),
                    "steps_per_s": round(own["steps"] / wall, 2), "sync_share": round(own["sync_s"] / wall, 4),
                    "csv_share": round(own["csv_s"] / wall, 4),
                    "gpu_step_ms": round(gpu_step_s * 1e3, 4) if gpu_step_s is not None else None,
                    "gpu_busy_share": round(gpu_busy / wall, 4) if gpu_busy is not None else None,
                    "csv_bytes": size}
sc.note(f"natural: measured by the script: {own['steps']} steps ({own['steps'] / wall:.0f}/s), {own['syncs']} .item() "
        f"calls in {own['sync_s']:.2f} s, the CSV in {own['csv_s']:.2f} s, of {wall:.2f} s; a step's kernels take "
        + (f"{gpu_step_s * 1e3:.3f} ms of GPU time queued (GPU busy {gpu_busy / wall:.0%} of the run)."
           if gpu_busy is not None else "unknown GPU time (no CUDA)."))
sc.write_truth(baseline=(b0, b1), window=None, ratio_spans=((b0, mid), (mid, b1)))
