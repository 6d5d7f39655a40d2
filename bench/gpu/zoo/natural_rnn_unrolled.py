"""natural_rnn_unrolled (natural, nothing staged): a sequence tagger written the way an RNN tutorial writes one: an
LSTMCell (input 64, hidden 256) unrolled step by step in Python over sequences of 64 timesteps, batch 32, a linear
head and a cross-entropy loss added up at every timestep, then loss.backward(), gradient clipping, Adam and
loss.item() once per sequence; batches already on the GPU. Hundreds of kernels of a few microseconds each per
iteration, each launched from Python (forward) or by PyTorch's autograd thread (backward): a job the host's launches
limit, with nothing staged. CPU 2, 20 s. The script measures itself: the wall time per iteration; the GPU's own time for
an iteration's kernels, measured with them queued behind a spin kernel so that none waits for the host
(common.gpu_seconds_queued: the forward, then the backward and the update, of unrolls of 8 and 16 timesteps, each
well under the launch queue's depth, extrapolated linearly to 64: a part per timestep and a fixed part); and, for
comparison,
the CUDA-event time from each iteration's start to its end, which a host-bound loop stretches to its own pace. The
kernel count is not measured (the trace counts the launches)."""

import time

from common import Scenario, gpu_seconds_queued

sc = Scenario("natural_rnn_unrolled", "natural", "an LSTMCell unrolled in Python over 64 timesteps (batch 32, hidden "
              "256), 20 s, nothing staged", job_cpus=[2], control=True)
import torch  # noqa: E402

dev = torch.device(sc.device)
IN, HIDDEN, BATCH, STEPS, NCLASS, NBATCHES = 64, 256, 32, 64, 10, 8
torch.manual_seed(0)
cell = torch.nn.LSTMCell(IN, HIDDEN).to(dev)
head = torch.nn.Linear(HIDDEN, NCLASS).to(dev)
params = list(cell.parameters()) + list(head.parameters())
opt = torch.optim.Adam(params, lr=1e-3, fused=sc.cuda or None)
xs = torch.randn(NBATCHES, STEPS, BATCH, IN, device=dev)
ys = torch.randint(0, NCLASS, (NBATCHES, STEPS, BATCH), device=dev)
own = {"steps": 0, "span_s": 0.0, "spans": 0}
state = {"i": 0}


def forward(k: int, steps: int = STEPS) -> torch.Tensor:
    x, y = xs[k % NBATCHES], ys[k % NBATCHES]
    h = torch.zeros(BATCH, HIDDEN, device=dev)
    c = torch.zeros(BATCH, HIDDEN, device=dev)
    loss = torch.zeros((), device=dev)
    for t in range(steps):
        h, c = cell(x[t], (h, c))
        loss = loss + torch.nn.functional.cross_entropy(head(h), y[t])
    return loss / steps


def update(loss: torch.Tensor) -> None:
    opt.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(params, 1.0)
    opt.step()


def step() -> None:
    state["i"] += 1
    timed = sc.cuda and state["i"] % 10 == 0  # every 10th iteration: its span in CUDA events, start to end
    if timed:
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
    loss = forward(state["i"])
    update(loss)
    if timed:
        e1.record()
    loss.item()
    if timed:
        own["span_s"] += e0.elapsed_time(e1) / 1e3
        own["spans"] += 1
    own["steps"] += 1


for _ in range(5):
    step()


def gpu_iteration(steps: int) -> float | None:
    """The GPU's time for an iteration unrolled over `steps` timesteps (median of 3), its kernels queued."""
    runs = []
    for _ in range(3):
        f = gpu_seconds_queued(torch, lambda _: forward(0, steps))
        b = gpu_seconds_queued(torch, update, prepare=lambda: forward(0, steps))
        if f is not None and b is not None:
            runs.append(f + b)
    return sorted(runs)[len(runs) // 2] if runs else None


gpu_iter_s, g8, g16 = None, None, None
if sc.cuda:
    g8, g16 = gpu_iteration(8), gpu_iteration(16)
    if g8 is not None and g16 is not None:
        per_step = (g16 - g8) / 8
        gpu_iter_s = g8 + per_step * (STEPS - 8)
warm_end = time.perf_counter() + 2.0 * sc.scale  # the spin kernels well before the baseline
while time.perf_counter() < warm_end:
    step()
if sc.cuda:
    torch.cuda.synchronize()
own.update(steps=0, span_s=0.0, spans=0)
b0 = sc.mark("baseline")
t = time.perf_counter()
sc.run_for(10.0 * sc.scale, step)
mid = sc.mark("half")
sc.run_for(10.0 * sc.scale, step)
b1 = sc.mark("end")
wall = time.perf_counter() - t
n = own["steps"]
span = own["span_s"] / own["spans"] if own["spans"] else None
sc.extra["self"] = {"steps": n, "wall_s": round(wall, 4), "wall_per_iter_ms": round(wall / n * 1e3, 4),
                    "gpu_per_iter_ms": round(gpu_iter_s * 1e3, 4) if gpu_iter_s is not None else None,
                    "gpu_busy_share": round(n * gpu_iter_s / wall, 4) if gpu_iter_s is not None else None,
                    "event_span_per_iter_ms": round(span * 1e3, 4) if span is not None else None,
                    "gpu_ms_unrolled_8_16": [round(g * 1e3, 4) if g is not None else None for g in (g8, g16)],
                    "timesteps": STEPS, "batch": BATCH, "hidden": HIDDEN}
sc.note(f"natural: measured by the script: {n} iterations in {wall:.2f} s ({wall / n * 1e3:.2f} ms each); "
        + (f"an iteration's kernels take {gpu_iter_s * 1e3:.2f} ms of GPU time queued (GPU busy "
           f"{n * gpu_iter_s / wall:.0%} of the run); CUDA events from an iteration's start to its end "
           f"{span * 1e3:.2f} ms." if gpu_iter_s is not None and span is not None else "no GPU timings (no CUDA)."))
sc.write_truth(baseline=(b0, b1), window=None, ratio_spans=((b0, mid), (mid, b1)))
