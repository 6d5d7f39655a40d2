"""natural_empty_cache_per_step (natural, nothing staged): a GPT-style language model trained on batches of a variable
shape, whose author calls torch.cuda.empty_cache() after every step "to avoid OOM" (the memory a step needs changes with
its shape): a decoder of 6 blocks (d_model 512, 8 heads, causal scaled_dot_product_attention, a 4x GELU MLP, pre-norm),
a 32,000-token vocabulary with the embedding tied to the head, bf16 autocast, fused AdamW; each step takes a token
budget of 16,384 tokens as sequences of one length drawn from the 16 multiples of 128 up to 2048 (a length-bucketed
sampler: the batch is 16,384 // length sequences) from a pre-tokenised corpus held on the GPU, then loss.item() for
the log, then torch.cuda.empty_cache(): the caching allocator gives every unused segment back (cudaFree) and the next
step cudaMallocs its activations, its logits (16,384 x 32,000) and their gradients again. CPUs 2-3, 20 s.

The script measures itself: the steps per second; the main thread's time queueing each step (forward, backward, the
optimiser), in loss.item() and in empty_cache(); the caching allocator's counters over the run
(torch.cuda.memory_stats(): segment.all.allocated and .freed are its cudaMalloc and cudaFree calls,
reserved_bytes.all.allocated and .freed their bytes; num_alloc_retries; num_device_alloc and _free where kept; the
allocator's settings, PYTORCH_CUDA_ALLOC_CONF); a reference taken before the run, the same loop without empty_cache()
(its step time by length, and its cudaMalloc calls), from which the run's time beyond the same steps without it is
estimated (`lost_s`); a step's GPU time queued at each length (common.gpu_seconds_queued on a copy of the model with
its own optimiser, its blocks cached), so that the GPU's busy share is known; the main thread's time on a CPU and
waiting for one (/proc/thread-self/schedstat) and the process's minor page faults (getrusage)."""

import copy
import os
import random
import resource
import time

from common import Scenario, gpu_seconds_queued

sc = Scenario("natural_empty_cache_per_step", "natural", "a GPT-style LM on a 16k-token budget of sequences of a "
              "bucketed random length (128-2048), bf16 autocast, loss.item() and torch.cuda.empty_cache() after every "
              "step, 20 s, nothing staged", job_cpus=[2, 3], control=True)
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

dev = torch.device(sc.device)
VOCAB, D, HEADS, LAYERS, TOKENS, LMAX, CORPUS = 32_000, 512, 8, 6, 16_384, 2048, 8_000_000
if not sc.cuda:
    VOCAB, D, HEADS, LAYERS, TOKENS, LMAX, CORPUS = 1000, 64, 4, 2, 1024, 256, 100_000
LENGTHS = [LMAX * k // 16 for k in range(1, 17)]  # 16 buckets
COUNTERS = ("segment.all.allocated", "segment.all.freed", "allocated_bytes.all.allocated", "num_alloc_retries",
            "reserved_bytes.all.allocated", "reserved_bytes.all.freed", "num_device_alloc", "num_device_free")
if sc.cuda:
    torch.backends.cuda.matmul.allow_tf32 = True


class Block(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.ln1, self.ln2 = torch.nn.LayerNorm(D), torch.nn.LayerNorm(D)
        self.qkv, self.proj = torch.nn.Linear(D, 3 * D), torch.nn.Linear(D, D)
        self.fc, self.out = torch.nn.Linear(D, 4 * D), torch.nn.Linear(4 * D, D)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, HEADS, D // HEADS).permute(2, 0, 3, 1, 4)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(a.transpose(1, 2).reshape(b, t, D))
        return x + self.out(F.gelu(self.fc(self.ln2(x))))


class GPT(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.tok, self.pos = torch.nn.Embedding(VOCAB, D), torch.nn.Embedding(LMAX, D)
        self.blocks = torch.nn.ModuleList(Block() for _ in range(LAYERS))
        self.ln = torch.nn.LayerNorm(D)
        self.head = torch.nn.Linear(D, VOCAB, bias=False)
        self.head.weight = self.tok.weight

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.tok(idx) + self.pos(torch.arange(idx.shape[1], device=idx.device))
        for blk in self.blocks:
            x = blk(x)
        return self.head(self.ln(x))


torch.manual_seed(0)
model = GPT().to(dev)
opt = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.1, fused=sc.cuda or None)
gen = torch.Generator(device=dev)
gen.manual_seed(0)
corpus = torch.randint(0, VOCAB, (CORPUS,), device=dev, generator=gen)
rng = random.Random(0)
own = {"steps": 0, "tokens": 0, "issue_s": 0.0, "item_s": 0.0, "empty_cache_s": 0.0}
walls: list[tuple[int, float]] = []
losses: list[float] = []


def batch(length: int) -> tuple[torch.Tensor, torch.Tensor]:
    n = TOKENS // length
    start = rng.randrange(0, CORPUS - n * (length + 1))
    rows = corpus[start:start + n * (length + 1)].view(n, length + 1)
    return rows[:, :-1], rows[:, 1:]


def train(m: torch.nn.Module, o: torch.optim.Optimizer, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    with torch.autocast(sc.device, dtype=torch.bfloat16, enabled=sc.cuda):
        logits = m(x)
    loss = F.cross_entropy(logits.float().view(-1, VOCAB), y.reshape(-1))
    loss.backward()
    o.step()
    o.zero_grad(set_to_none=True)
    return loss


def step(free: bool = True) -> None:
    t0 = time.perf_counter()
    length = rng.choice(LENGTHS)
    loss = train(model, opt, *batch(length))
    t1 = time.perf_counter()
    losses.append(loss.item())
    t2 = time.perf_counter()
    if free:
        torch.cuda.empty_cache()  # "to avoid OOM" on the next, maybe longer, batch
    t3 = time.perf_counter()
    own["issue_s"] += t1 - t0
    own["item_s"] += t2 - t1
    own["empty_cache_s"] += t3 - t2
    own["steps"] += 1
    own["tokens"] += TOKENS // length * length
    walls.append((length, t3 - t0))


def counters() -> dict:
    if not sc.cuda:
        return {k: 0 for k in COUNTERS}
    stats = torch.cuda.memory_stats()
    return {k: int(stats.get(k, 0)) for k in COUNTERS}


def schedstat() -> tuple[float, float | None]:
    """The calling thread's time on a CPU and waiting on a run queue (s), from the kernel's schedstat; where that is
    not kept, the thread's CPU clock and None."""
    try:
        with open("/proc/thread-self/schedstat") as fh:
            run_ns, wait_ns = fh.read().split()[:2]
        return int(run_ns) / 1e9, int(wait_ns) / 1e9
    except (OSError, ValueError):
        return time.thread_time(), None


def reset() -> None:
    own.update(steps=0, tokens=0, issue_s=0.0, item_s=0.0, empty_cache_s=0.0)
    walls.clear()


def by_length(rows: list[tuple[int, float]]) -> dict[int, float]:
    """The mean step time at each length."""
    out: dict[int, list[float]] = {}
    for length, w in rows:
        out.setdefault(length, []).append(w)
    return {k: sum(v) / len(v) for k, v in out.items()}


model.train()
for length in LENGTHS * 2:  # warm-up: every shape once before the loop's own draws (cuBLAS, SDPA, the allocator)
    train(model, opt, *batch(length))
    torch.cuda.empty_cache()
for _ in range(20):
    step()
gpu_at: dict[int, float] = {}
if sc.cuda:
    torch.cuda.synchronize()
    m2 = copy.deepcopy(model)
    o2 = torch.optim.AdamW(m2.parameters(), lr=3e-4, weight_decay=0.1, fused=True)
    for length in LENGTHS:
        x2, y2 = batch(length)
        train(m2, o2, x2, y2)  # its blocks cached: no cudaMalloc while the work is queued
        torch.cuda.synchronize()
        runs = sorted(r for r in (gpu_seconds_queued(torch, lambda _, x=x2, y=y2: train(m2, o2, x, y))
                                  for _ in range(3))
                      if r is not None)
        if runs:
            gpu_at[length] = runs[len(runs) // 2]
    del m2, o2, x2, y2
    torch.cuda.empty_cache()
# the reference: the same loop without empty_cache(), its blocks cached after a few steps
for length in LENGTHS:
    train(model, opt, *batch(length))
if sc.cuda:
    torch.cuda.synchronize()
reset()
r0 = counters()
t = time.perf_counter()
while time.perf_counter() - t < 3.0 * sc.scale or own["steps"] < 2 * len(LENGTHS):
    step(free=False)
ref_wall = time.perf_counter() - t
r1 = counters()
ref = by_length(walls)
ref_steps, ref_mallocs = own["steps"], r1["segment.all.allocated"] - r0["segment.all.allocated"]
ref_mean = ref_wall / max(ref_steps, 1)
warm_end = time.perf_counter() + 2.0 * sc.scale  # the loop as written again, the spin kernels well before the baseline
while time.perf_counter() < warm_end:
    step()
if sc.cuda:
    torch.cuda.synchronize()
reset()
c0 = counters()
f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
run0, wait0 = schedstat()
b0 = sc.mark("baseline")
t = time.perf_counter()
sc.run_for(10.0 * sc.scale, step)
mid = sc.mark("half")
sc.run_for(10.0 * sc.scale, step)
b1 = sc.mark("end")
wall = time.perf_counter() - t
run1, wait1 = schedstat()
f1 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
c1 = counters()
n = own["steps"]
grew = {k.replace(".", "_"): c1[k] - c0[k] for k in COUNTERS}
mallocs, frees = grew["segment_all_allocated"], grew["segment_all_freed"]
expected = sum(ref.get(length, ref_mean) for length, _ in walls)  # the same steps without empty_cache()
lost = wall - expected
gpu_busy = sum(gpu_at[length] for length, _ in walls) if len(gpu_at) == len(LENGTHS) else None


def share(v: float | None) -> float | None:
    return round(v / wall, 4) if v is not None else None


sc.extra["self"] = {**{k: round(v, 4) for k, v in own.items()}, "wall_s": round(wall, 4),
                    "steps_per_s": round(n / wall, 2), "step_ms_mean": round(wall / max(n, 1) * 1e3, 4),
                    "issue_share": share(own["issue_s"]), "item_share": share(own["item_s"]),
                    "empty_cache_share": share(own["empty_cache_s"]),
                    "empty_cache_ms_mean": round(own["empty_cache_s"] / max(n, 1) * 1e3, 4),
                    "allocator": grew, "cuda_mallocs": mallocs, "cuda_frees": frees,
                    "cuda_mallocs_per_s": round(mallocs / wall, 3), "cuda_frees_per_s": round(frees / wall, 3),
                    "cuda_mallocs_per_step": round(mallocs / max(n, 1), 2),
                    "malloc_gb_per_s": round(grew["reserved_bytes_all_allocated"] / wall / 2 ** 30, 3),
                    "free_gb_per_s": round(grew["reserved_bytes_all_freed"] / wall / 2 ** 30, 3),
                    "alloc_retries": grew["num_alloc_retries"],
                    "ref_steps": ref_steps, "ref_wall_s": round(ref_wall, 4),
                    "ref_steps_per_s": round(ref_steps / ref_wall, 2), "ref_cuda_mallocs": ref_mallocs,
                    "ref_step_ms_by_length": {str(k): round(v * 1e3, 4) for k, v in sorted(ref.items())},
                    "expected_without_empty_cache_s": round(expected, 4), "lost_s": round(lost, 4),
                    "lost_share": share(lost),
                    "main_cpu_share": round((run1 - run0) / wall, 4),
                    "main_cpu_wait_share": round((wait1 - wait0) / wall, 4) if wait0 is not None else None,
                    "minor_faults_per_s": round((f1 - f0) / wall, 1),
                    "gpu_step_ms_at": {str(k): round(v * 1e3, 4) for k, v in gpu_at.items()},
                    "gpu_busy_s": round(gpu_busy, 4) if gpu_busy is not None else None,
                    "gpu_busy_share": share(gpu_busy),
                    "alloc_conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF"), "tokens_per_step": TOKENS,
                    "lengths": LENGTHS, "d_model": D, "layers": LAYERS, "vocab": VOCAB,
                    "final_loss": round(losses[-1], 4) if losses else None}
if not sc.cuda:
    sc.note("a smaller model (d_model 64, 2 blocks, vocabulary 1000, 1024 tokens a step), fp32; empty_cache() is a "
            "no-op and there are no allocator counters: no CUDA.")
sc.note(f"natural: measured by the script: {n} steps ({n / wall:.1f}/s) in {wall:.2f} s: {own['issue_s']:.2f} s "
        f"queueing the steps, {own['item_s']:.2f} s in loss.item(), {own['empty_cache_s']:.2f} s in empty_cache(); "
        f"{mallocs} cudaMalloc and {frees} cudaFree calls ({mallocs / max(n, 1):.1f} a step; {ref_mallocs} in "
        f"{ref_steps} steps without empty_cache); the same steps without empty_cache() would take {expected:.2f} s "
        f"(lost {lost:.2f} s); "
        + (f"the steps' kernels take {gpu_busy:.2f} s of GPU time queued (GPU busy {gpu_busy / wall:.0%} of the run)."
           if gpu_busy is not None else "no GPU timings (no CUDA)."))
sc.write_truth(baseline=(b0, b1), window=None, ratio_spans=((b0, mid), (mid, b1)))
