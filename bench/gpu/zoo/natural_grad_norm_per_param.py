"""natural_grad_norm_per_param (natural, nothing staged): a small language model's training loop that logs every
parameter's gradient norm each step the way it is usually written, `{n: p.grad.norm().item() for n, p in
model.named_parameters()}` after loss.backward() and before opt.step(): one .item() per parameter tensor, so one
device-to-host copy and one wait for the GPU each (the first waits for the whole backward pass). The model: a
12-layer pre-norm Transformer encoder (nn.TransformerEncoderLayer, d_model 512, 8 heads, feed-forward 2048, batch
first), a token embedding (8,192 words), a learned position embedding, a final LayerNorm and an untied head: 149
parameter tensors. Batches of 32 x 256 random tokens already on the GPU, bf16 autocast, fused AdamW, loss.item() each
step for the running loss (smaller with --device cpu: d_model 64, 64 tokens, batch 4). CPUs 2-3, 20 s.

The script measures itself: the steps per second; the main thread's time in the logging loop (wall, and its CPU time
by thread_time), the first .item() of it apart (the wait for the backward pass) and the rest (the other 148 syncs);
the syncs (.item() calls) per step; its time queueing the forward and backward, in opt.step() and in loss.item();
the main thread's schedstat (time on a CPU, wait for one) and the process's page faults over the run, cudaMalloc
calls, and a step's GPU time queued (common.gpu_seconds_queued: forward, backward, the 149 norms, the optimiser step,
nothing read back), so that the GPU's busy share is known."""

import math
import resource
import time

from common import Scenario, gpu_seconds_queued

sc = Scenario("natural_grad_norm_per_param", "natural", "a 12-layer Transformer LM logging each of its 149 parameters' "
              "gradient norm with .item() every step (149 syncs a step), 20 s, nothing staged",
              job_cpus=[2, 3], control=True)
import torch  # noqa: E402

dev = torch.device(sc.device)
VOCAB, D, HEADS, FF, LAYERS, SEQ, BATCH = ((8192, 512, 8, 2048, 12, 256, 32) if sc.cuda
                                           else (1024, 64, 4, 128, 12, 64, 4))


class TinyLM(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.tok = torch.nn.Embedding(VOCAB, D)
        self.pos = torch.nn.Parameter(torch.zeros(1, SEQ, D))
        layer = torch.nn.TransformerEncoderLayer(D, HEADS, FF, dropout=0.1, activation="gelu", batch_first=True,
                                                 norm_first=True)
        self.blocks = torch.nn.TransformerEncoder(layer, LAYERS, enable_nested_tensor=False)
        self.norm = torch.nn.LayerNorm(D)
        self.head = torch.nn.Linear(D, VOCAB, bias=False)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        mask = torch.nn.Transformer.generate_square_subsequent_mask(idx.shape[1], device=idx.device)
        h = self.blocks(self.tok(idx) + self.pos[:, :idx.shape[1]], mask=mask, is_causal=True)
        return self.head(self.norm(h))


def schedstat() -> tuple[int, int] | None:
    try:
        with open("/proc/thread-self/schedstat") as fh:
            run, wait = fh.read().split()[:2]
        return int(run), int(wait)
    except (OSError, ValueError):
        return None


def cuda_mallocs() -> int:
    return int(torch.cuda.memory_stats().get("segment.all.allocated", 0)) if sc.cuda else 0


torch.manual_seed(0)
model = TinyLM().to(dev)
opt = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.1, fused=sc.cuda or None)
NPARAMS = sum(1 for _ in model.parameters())
data = torch.randint(0, VOCAB, (8, BATCH, SEQ + 1), device=dev)
own = {"steps": 0, "log_s": 0.0, "log_cpu_s": 0.0, "first_item_s": 0.0, "rest_items_s": 0.0, "items": 0,
       "queue_s": 0.0, "opt_s": 0.0, "loss_item_s": 0.0, "running_loss": 0.0}
history: list[dict[str, float]] = []  # the last step's norms (a real run would send them to a logger)
state = {"i": 0}


def forward_backward(i: int) -> torch.Tensor:
    batch = data[i % len(data)]
    x, y = batch[:, :-1], batch[:, 1:]
    with torch.autocast(sc.device, dtype=torch.bfloat16, enabled=sc.cuda):
        logits = model(x)
    loss = torch.nn.functional.cross_entropy(logits.float().reshape(-1, VOCAB), y.reshape(-1))
    loss.backward()
    return loss


def step() -> None:
    t0 = time.perf_counter()
    loss = forward_backward(state["i"])
    state["i"] += 1
    t1, c1 = time.perf_counter(), time.thread_time()
    grad_norms = {}
    first = None
    for n, p in model.named_parameters():
        if p.grad is not None:
            grad_norms[n] = p.grad.norm().item()
            if first is None:
                first = time.perf_counter()
    t2, c2 = time.perf_counter(), time.thread_time()
    opt.step()
    opt.zero_grad(set_to_none=True)
    t3 = time.perf_counter()
    own["running_loss"] += loss.item()
    t4 = time.perf_counter()
    history[:] = [grad_norms]
    own["queue_s"] += t1 - t0
    own["log_s"] += t2 - t1
    own["log_cpu_s"] += c2 - c1
    own["first_item_s"] += (first or t2) - t1
    own["rest_items_s"] += t2 - (first or t2)
    own["items"] += len(grad_norms)
    own["opt_s"] += t3 - t2
    own["loss_item_s"] += t4 - t3
    own["steps"] += 1


for _ in range(10):  # warm-up: the allocator, the kernels' first launches
    step()
gpu_step_s = None
if sc.cuda:
    torch.cuda.synchronize()

    def work(_) -> None:
        """One step's GPU work (the norms included), nothing read back."""
        forward_backward(0)
        _ = [p.grad.norm() for p in model.parameters() if p.grad is not None]
        opt.step()
        opt.zero_grad(set_to_none=True)

    runs = sorted(r for r in (gpu_seconds_queued(torch, work) for _ in range(5)) if r is not None)
    gpu_step_s = runs[len(runs) // 2] if runs else None
warm_end = time.perf_counter() + 2.0 * sc.scale  # the spin kernels well before the baseline
while time.perf_counter() < warm_end:
    step()
if sc.cuda:
    torch.cuda.synchronize()
for k in own:
    own[k] = 0 if k in ("steps", "items") else 0.0
main0 = schedstat()
f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
m0 = cuda_mallocs()
b0 = sc.mark("baseline")
t = time.perf_counter()
sc.run_for(10.0 * sc.scale, step)
mid = sc.mark("half")
sc.run_for(10.0 * sc.scale, step)
if sc.cuda:
    torch.cuda.synchronize()
b1 = sc.mark("end")
wall = time.perf_counter() - t
main1 = schedstat()
f1 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
m1 = cuda_mallocs()
n = max(own["steps"], 1)
gpu_busy = own["steps"] * gpu_step_s if gpu_step_s is not None else None
main_run = (main1[0] - main0[0]) / 1e9 if main0 and main1 else None
main_wait = (main1[1] - main0[1]) / 1e9 if main0 and main1 else None


def share(v: float | None) -> float | None:
    return round(v / wall, 4) if v is not None else None


assert math.isfinite(own["running_loss"])
sc.extra["self"] = {**{k: round(v, 4) for k, v in own.items()}, "wall_s": round(wall, 4),
                    "steps_per_s": round(own["steps"] / wall, 2), "params": NPARAMS,
                    "items_per_step": round(own["items"] / n, 2), "syncs_per_step": round(own["items"] / n + 1, 2),
                    "syncs_per_s": round((own["items"] + own["steps"]) / wall, 1),
                    "log_share": share(own["log_s"]), "log_cpu_share": share(own["log_cpu_s"]),
                    "first_item_share": share(own["first_item_s"]), "rest_items_share": share(own["rest_items_s"]),
                    "queue_share": share(own["queue_s"]), "opt_share": share(own["opt_s"]),
                    "loss_item_share": share(own["loss_item_s"]),
                    "log_ms_per_step": round(own["log_s"] / n * 1e3, 4),
                    "rest_items_us_each": round(own["rest_items_s"] / max(own["items"] - own["steps"], 1) * 1e6, 2),
                    "main_run_s": round(main_run, 4) if main_run is not None else None,
                    "main_cpu_share": share(main_run),
                    "main_cpu_wait_s": round(main_wait, 4) if main_wait is not None else None,
                    "main_cpu_wait_share": share(main_wait),
                    "minor_faults_per_s": round((f1 - f0) / wall, 1), "cuda_mallocs_per_s": round((m1 - m0) / wall, 3),
                    "gpu_step_ms": round(gpu_step_s * 1e3, 4) if gpu_step_s is not None else None,
                    "gpu_busy_s": round(gpu_busy, 4) if gpu_busy is not None else None,
                    "gpu_busy_share": share(gpu_busy), "batch": BATCH, "seq": SEQ, "layers": LAYERS}
sc.note(f"natural: measured by the script: {own['steps']} steps ({own['steps'] / wall:.1f}/s) in {wall:.2f} s; "
        f"{own['log_s']:.2f} s in the per-parameter .item() loop ({own['items'] / n:.0f} syncs a step; its first "
        f".item(), the wait for backward, {own['first_item_s']:.2f} s; the rest {own['rest_items_s']:.2f} s), "
        f"{own['queue_s']:.2f} s queueing forward and backward, {own['opt_s']:.2f} s in opt.step(), "
        f"{own['loss_item_s']:.2f} s in loss.item(); "
        + (f"a step's kernels take {gpu_step_s * 1e3:.2f} ms of GPU time queued (GPU busy {gpu_busy / wall:.0%} of the "
           "run)." if gpu_busy is not None else "no GPU timings (no CUDA)."))
sc.write_truth(baseline=(b0, b1), window=None, ratio_spans=((b0, mid), (mid, b1)))
