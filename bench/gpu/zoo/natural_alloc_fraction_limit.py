"""natural_alloc_fraction_limit (natural, nothing staged): an engineer who shares the GPU with colleagues caps the
training process with torch.cuda.set_per_process_memory_fraction(f), f sized as one does it by hand: the largest batch
the sampler can draw is run once alone and the cap set to 1.2 x its peak allocated memory (rounded up to 256 MiB: a
few GB of the H200's 141), then trains a GPT-style language model on batches whose shape changes every step: a
decoder of 6 pre-norm blocks (d_model 512, 8 heads, causal scaled_dot_product_attention, a 4x GELU MLP), a 16,384-token
vocabulary with the embedding tied to the head, bf16 autocast, fused AdamW, loss.item() each step; each step draws
its batch size from {4, 8, 12, 16} and its length from the 8 multiples of 128 up to 1024 (a bucketed sampler, 32
shapes) from a pre-tokenised corpus held on the GPU. Under the cap the caching allocator cannot keep the blocks of
every shape: where no cached block fits and a new segment would pass the cap, it frees cached segments (cudaFree,
which waits for the GPU) and allocates again (cudaMalloc), and where that is not enough it frees every unused segment
and retries (num_alloc_retries); a batch that still does not fit raises OutOfMemoryError, which the loop catches,
counts and skips (the gradients dropped). PYTORCH_CUDA_ALLOC_CONF as the environment has it. CPUs 2-3, 20 s.

The script measures itself: the steps per second and the steps skipped; the main thread's time queueing each step
(forward, backward, the optimiser: the allocations happen there) and in loss.item(); the caching allocator's counters
over the run and per step (torch.cuda.memory_stats(): segment.all.allocated and .freed are its cudaMalloc and cudaFree
calls, num_alloc_retries, num_ooms, reserved_bytes.all.allocated and .freed), their rates a second, the steps with a
cudaMalloc or cudaFree and their time; a reference taken before the cap, the same loop uncapped (its step time by
shape), from which the run's time beyond the same steps uncapped is estimated (`lost_s`; the churn steps' part
`churn_extra_s`); a step's GPU time queued at each shape (common.gpu_seconds_queued on a copy of the model with its
own optimiser, before the cap), so that the GPU's busy share is known; the main thread's time on a CPU and waiting for
one (/proc/thread-self/schedstat), the process's minor page faults, the cap (bytes, fraction) and the peaks."""

import copy
import math
import os
import random
import resource
import time

from common import Scenario, gpu_seconds_queued

sc = Scenario("natural_alloc_fraction_limit", "natural", "a GPT-style LM on batches of a random shape (batch 4-16, "
              "length 128-1024) in a process capped by set_per_process_memory_fraction at 1.2x the largest batch's "
              "peak, bf16 autocast, loss.item() each step, OOMs caught and skipped, 20 s, nothing staged",
              job_cpus=[2, 3], control=True)
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

dev = torch.device(sc.device)
VOCAB, D, HEADS, LAYERS, LMAX, CORPUS = 16_384, 512, 8, 6, 1024, 8_000_000
BATCHES, HEADROOM, ROUND = (4, 8, 12, 16), 1.2, 256 * 2 ** 20
if not sc.cuda:
    VOCAB, D, HEADS, LAYERS, LMAX, CORPUS, BATCHES = 1000, 64, 4, 2, 256, 200_000, (2, 4)
LENGTHS = [LMAX * k // 8 for k in range(1, 9)]
SHAPES = [(b, n) for b in BATCHES for n in LENGTHS]
COUNTERS = ("segment.all.allocated", "segment.all.freed", "num_alloc_retries", "num_ooms",
            "reserved_bytes.all.allocated", "reserved_bytes.all.freed", "allocated_bytes.all.allocated")
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
own = {"steps": 0, "skipped": 0, "tokens": 0, "issue_s": 0.0, "item_s": 0.0, "skipped_s": 0.0}
rows: list[dict] = []
losses: list[float] = []


def batch(shape: tuple[int, int]) -> tuple[torch.Tensor, torch.Tensor]:
    n, length = shape
    start = rng.randrange(0, CORPUS - n * (length + 1))
    seqs = corpus[start:start + n * (length + 1)].view(n, length + 1)
    return seqs[:, :-1], seqs[:, 1:]


def train(m: torch.nn.Module, o: torch.optim.Optimizer, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    with torch.autocast(sc.device, dtype=torch.bfloat16, enabled=sc.cuda):
        logits = m(x)
    loss = F.cross_entropy(logits.float().view(-1, VOCAB), y.reshape(-1))
    loss.backward()
    o.step()
    o.zero_grad(set_to_none=True)
    return loss


def counters() -> dict:
    if not sc.cuda:
        return {k: 0 for k in COUNTERS}
    stats = torch.cuda.memory_stats()
    return {k: int(stats.get(k, 0)) for k in COUNTERS}


def step(record: bool = True) -> None:
    shape = (rng.choice(BATCHES), rng.choice(LENGTHS))
    c0 = counters() if record else None
    t0 = time.perf_counter()
    try:
        loss = train(model, opt, *batch(shape))
        t1 = time.perf_counter()
        losses.append(loss.item())
        t2 = time.perf_counter()
        oom = False
    except torch.cuda.OutOfMemoryError:  # the batch does not fit under the cap: skip it, as the loop was written to
        opt.zero_grad(set_to_none=True)
        t1 = t2 = time.perf_counter()
        oom = True
    if not record:
        return
    c1 = counters()
    if oom:
        own["skipped"] += 1
        own["skipped_s"] += t2 - t0
    else:
        own["steps"] += 1
        own["tokens"] += shape[0] * shape[1]
        own["issue_s"] += t1 - t0
        own["item_s"] += t2 - t1
    rows.append({"shape": shape, "wall": t2 - t0, "oom": oom, **{k: c1[k] - c0[k] for k in COUNTERS[:4]}})


def schedstat() -> tuple[float, float | None]:
    """The calling thread's time on a CPU and waiting on a run queue (s), from the kernel's schedstat; where that is
    not kept, the thread's CPU clock and None."""
    try:
        with open("/proc/thread-self/schedstat") as fh:
            run_ns, wait_ns = fh.read().split()[:2]
        return int(run_ns) / 1e9, int(wait_ns) / 1e9
    except (OSError, ValueError):
        return time.thread_time(), None


def sync() -> None:
    if sc.cuda:
        torch.cuda.synchronize()


def by_shape(recs: list[dict]) -> dict[tuple[int, int], float]:
    out: dict[tuple[int, int], list[float]] = {}
    for r in recs:
        if not r["oom"]:
            out.setdefault(r["shape"], []).append(r["wall"])
    return {k: sum(v) / len(v) for k, v in out.items()}


model.train()
for shape in SHAPES * 2:  # warm-up, uncapped: every shape twice (cuBLAS, SDPA, the allocator's blocks)
    train(model, opt, *batch(shape))
sync()
# The engineer's sizing: the largest batch alone, its peak, 1.2x that (rounded up) as the cap.
largest = (max(BATCHES), max(LENGTHS))
peak = 0
if sc.cuda:
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    train(model, opt, *batch(largest))
    sync()
    peak = torch.cuda.max_memory_allocated()
gpu_at: dict[tuple[int, int], float] = {}
if sc.cuda:
    m2 = copy.deepcopy(model)
    o2 = torch.optim.AdamW(m2.parameters(), lr=3e-4, weight_decay=0.1, fused=True)
    for shape in SHAPES:
        x2, y2 = batch(shape)
        train(m2, o2, x2, y2)  # its blocks cached: no cudaMalloc while the work is queued
        torch.cuda.synchronize()
        runs = sorted(r for r in (gpu_seconds_queued(torch, lambda _, x=x2, y=y2: train(m2, o2, x, y))
                                  for _ in range(3)) if r is not None)
        if runs:
            gpu_at[shape] = runs[len(runs) // 2]
    del m2, o2, x2, y2
# The reference: the same loop uncapped, its blocks cached.
rows.clear()
t = time.perf_counter()
while time.perf_counter() - t < 3.0 * sc.scale or len(rows) < 2 * len(SHAPES):
    step()
ref_wall = time.perf_counter() - t
ref = by_shape(rows)
ref_steps = own["steps"]
ref_mallocs = sum(r["segment.all.allocated"] for r in rows)
ref_mean = ref_wall / max(ref_steps, 1)
total = cap = 0
fraction = None
if sc.cuda:
    sync()
    torch.cuda.empty_cache()
    total = torch.cuda.get_device_properties(0).total_memory
    cap = math.ceil(peak * HEADROOM / ROUND) * ROUND
    fraction = cap / total
    torch.cuda.set_per_process_memory_fraction(fraction)
else:
    sc.note("no CUDA: no cap, no allocator counters; the loop runs uncapped on the CPU.")
warm_end = time.perf_counter() + 2.0 * sc.scale  # the loop under the cap, the spin kernels well before the baseline
while time.perf_counter() < warm_end:
    step(record=False)
sync()
for k in own:
    own[k] = 0 if isinstance(own[k], int) else 0.0
rows.clear()
if sc.cuda:
    torch.cuda.reset_peak_memory_stats()
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
peak_reserved = torch.cuda.max_memory_reserved() if sc.cuda else 0
peak_allocated = torch.cuda.max_memory_allocated() if sc.cuda else 0
n = own["steps"]
grew = {k.replace(".", "_"): c1[k] - c0[k] for k in COUNTERS}
mallocs, frees, retries = grew["segment_all_allocated"], grew["segment_all_freed"], grew["num_alloc_retries"]
done = [r for r in rows if not r["oom"]]
expected = sum(ref.get(r["shape"], ref_mean) for r in done)  # the same steps uncapped
lost = wall - expected
churn = [r for r in rows if r["segment.all.allocated"] or r["segment.all.freed"]]
churn_s = sum(r["wall"] for r in churn)
churn_extra = sum(r["wall"] - ref.get(r["shape"], ref_mean) for r in churn if not r["oom"])
churn_extra += sum(r["wall"] for r in churn if r["oom"])
retry_steps = [r for r in rows if r["num_alloc_retries"]]
gpu_busy = sum(gpu_at[r["shape"]] for r in done) if len(gpu_at) == len(SHAPES) else None


def share(v: float | None) -> float | None:
    return round(v / wall, 4) if v is not None else None


def per_s(v: float) -> float:
    return round(v / wall, 3)


sc.extra["self"] = {**{k: round(v, 4) for k, v in own.items()}, "wall_s": round(wall, 4),
                    "steps_per_s": round(n / wall, 2), "step_ms_mean": round(wall / max(n, 1) * 1e3, 4),
                    "issue_share": share(own["issue_s"]), "item_share": share(own["item_s"]),
                    "skipped_share": share(own["skipped_s"]),
                    "allocator": grew, "cuda_mallocs": mallocs, "cuda_frees": frees, "alloc_retries": retries,
                    "ooms": grew["num_ooms"], "cuda_mallocs_per_s": per_s(mallocs), "cuda_frees_per_s": per_s(frees),
                    "alloc_retries_per_s": per_s(retries),
                    "malloc_gb_per_s": round(grew["reserved_bytes_all_allocated"] / wall / 2 ** 30, 3),
                    "free_gb_per_s": round(grew["reserved_bytes_all_freed"] / wall / 2 ** 30, 3),
                    "churn_steps": len(churn), "churn_steps_s": round(churn_s, 4), "churn_steps_share": share(churn_s),
                    "churn_extra_s": round(churn_extra, 4), "churn_extra_share": share(churn_extra),
                    "retry_steps": len(retry_steps), "retry_steps_s": round(sum(r["wall"] for r in retry_steps), 4),
                    "ref_steps": ref_steps, "ref_wall_s": round(ref_wall, 4),
                    "ref_steps_per_s": round(ref_steps / ref_wall, 2), "ref_cuda_mallocs": ref_mallocs,
                    "expected_uncapped_s": round(expected, 4), "lost_s": round(lost, 4), "lost_share": share(lost),
                    "main_run_s": round(run1 - run0, 4), "main_cpu_share": round((run1 - run0) / wall, 4),
                    "main_cpu_wait_s": round(wait1 - wait0, 4) if wait0 is not None else None,
                    "main_cpu_wait_share": round((wait1 - wait0) / wall, 4) if wait0 is not None else None,
                    "minor_faults_per_s": round((f1 - f0) / wall, 1),
                    "gpu_step_ms_at": {f"{b}x{n_}": round(v * 1e3, 4) for (b, n_), v in gpu_at.items()},
                    "gpu_busy_s": round(gpu_busy, 4) if gpu_busy is not None else None,
                    "gpu_busy_share": share(gpu_busy),
                    "cap_bytes": cap, "cap_fraction": round(fraction, 6) if fraction is not None else None,
                    "device_bytes": total, "largest_shape": list(largest), "largest_peak_bytes": peak,
                    "headroom": HEADROOM, "peak_reserved_bytes": peak_reserved,
                    "peak_allocated_bytes": peak_allocated, "alloc_conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF"),
                    "batches": list(BATCHES), "lengths": LENGTHS, "d_model": D, "layers": LAYERS, "vocab": VOCAB,
                    "final_loss": round(losses[-1], 4) if losses else None}
sc.note(f"natural: measured by the script: {n} steps ({n / wall:.1f}/s) and {own['skipped']} skipped (OOM) in "
        f"{wall:.2f} s: {own['issue_s']:.2f} s queueing the steps, {own['item_s']:.2f} s in loss.item(); under a cap "
        f"of {cap / 2 ** 30:.2f} GiB (the largest batch's peak {peak / 2 ** 30:.2f} GiB): {mallocs} cudaMalloc and "
        f"{frees} cudaFree calls, {retries} retries; {len(churn)} steps with a cudaMalloc or cudaFree took "
        f"{churn_s:.2f} s, {churn_extra:.2f} s more than uncapped; the same steps uncapped would take "
        f"{expected:.2f} s (lost {lost:.2f} s); "
        + (f"the steps' kernels take {gpu_busy:.2f} s of GPU time queued (GPU busy {gpu_busy / wall:.0%} of the run)."
           if gpu_busy is not None else "no GPU timings (no CUDA)."))
sc.write_truth(baseline=(b0, b1), window=None, ratio_spans=((b0, mid), (mid, b1)))
