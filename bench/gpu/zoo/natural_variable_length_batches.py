"""natural_variable_length_batches (natural, nothing staged): an NLP classifier trained on batches of dynamic shape, as
a text job without padding to a fixed length does it: each batch of 64 sequences has its own length, drawn uniformly
from 32-512 tokens (a length-bucketed sampler), token ids taken from a pre-tokenised corpus held on the GPU; the model
is an embedding (32,000 x 512), a 2-layer nn.TransformerEncoder (d_model 512, 8 heads, feed-forward 2048, batch_first,
dropout 0.1), a mean pool and a linear head (2 classes), under bf16 autocast, fused AdamW, loss.item() each step, no
torch.compile: PyTorch's caching allocator and cuBLAS see a new shape most steps. CPUs 2-3, 20 s. The script measures
itself: the steps per second, each step's wall time (median, and by length), its time in loss.item(), a step's GPU
time queued at 32, 272 (the median) and 512 tokens (common.gpu_seconds_queued on a copy of the model with its own
optimiser), so that the GPU's busy share is known (each step's GPU time interpolated from its length), and the
caching allocator's counters over the run (torch.cuda.memory_stats(): segment.all.allocated and .freed are its
cudaMalloc and cudaFree calls, num_alloc_retries its frees-and-retries, allocation.all.allocated its blocks handed
out)."""

import copy
import random
import time

from common import Scenario, gpu_seconds_queued

sc = Scenario("natural_variable_length_batches", "natural", "a 2-layer Transformer encoder classifier on batches of "
              "64 sequences of a random length (32-512 tokens), bf16 autocast, loss.item() each step, 20 s, nothing "
              "staged", job_cpus=[2, 3], control=True)
import torch  # noqa: E402

dev = torch.device(sc.device)
VOCAB, D, HEADS, FF, LAYERS, NCLASS = 32_000, 512, 8, 2048, 2, 2
BATCH, LMIN, LMAX, CORPUS = (64, 32, 512, 4096) if sc.cuda else (8, 32, 512, 256)
if not sc.cuda:
    D, FF, VOCAB = 64, 128, 1000
LMED = (LMIN + LMAX) // 2
COUNTERS = ("segment.all.allocated", "segment.all.freed", "num_alloc_retries", "allocation.all.allocated")


class Classifier(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(VOCAB, D)
        layer = torch.nn.TransformerEncoderLayer(D, HEADS, FF, dropout=0.1, batch_first=True)
        self.encoder = torch.nn.TransformerEncoder(layer, LAYERS, enable_nested_tensor=False)
        self.head = torch.nn.Linear(D, NCLASS)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(self.encoder(self.embed(tokens)).mean(dim=1))


torch.manual_seed(0)
model = Classifier().to(dev)
opt = torch.optim.AdamW(model.parameters(), lr=3e-4, fused=sc.cuda or None)
gen = torch.Generator(device=dev)
gen.manual_seed(0)
corpus = torch.randint(0, VOCAB, (CORPUS, LMAX), device=dev, generator=gen)
labels = torch.randint(0, NCLASS, (CORPUS,), device=dev, generator=gen)
rng = random.Random(0)
own = {"steps": 0, "item_s": 0.0, "tokens": 0}
walls: list[tuple[int, float]] = []


def batch(length: int) -> tuple[torch.Tensor, torch.Tensor]:
    start = rng.randrange(0, CORPUS - BATCH)
    return corpus[start:start + BATCH, :length], labels[start:start + BATCH]


def train(m: torch.nn.Module, o: torch.optim.Optimizer, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    with torch.autocast(sc.device, dtype=torch.bfloat16, enabled=sc.cuda):
        loss = torch.nn.functional.cross_entropy(m(x).float(), y)
    loss.backward()
    o.step()
    o.zero_grad(set_to_none=True)
    return loss


def step() -> None:
    t0 = time.perf_counter()
    length = rng.randint(LMIN, LMAX)
    loss = train(model, opt, *batch(length))
    t1 = time.perf_counter()
    loss.item()
    t2 = time.perf_counter()
    own["item_s"] += t2 - t1
    own["steps"] += 1
    own["tokens"] += BATCH * length
    walls.append((length, t2 - t0))


def counters() -> dict:
    if not sc.cuda:
        return {k: 0 for k in COUNTERS}
    stats = torch.cuda.memory_stats()
    return {k: int(stats.get(k, 0)) for k in COUNTERS}


model.train()
for _ in range(100 if sc.cuda else 10):  # warm-up: the allocator and cuBLAS meet some lengths, not all
    step()
gpu_at: dict[int, float] = {}
if sc.cuda:
    m2 = copy.deepcopy(model)
    o2 = torch.optim.AdamW(m2.parameters(), lr=3e-4, fused=True)
    for length in (LMIN, LMED, LMAX):
        x2, y2 = corpus[:BATCH, :length], labels[:BATCH]
        train(m2, o2, x2, y2)
        torch.cuda.synchronize()
        runs = sorted(r for r in (gpu_seconds_queued(torch, lambda _: train(m2, o2, x2, y2)) for _ in range(3))
                      if r is not None)
        if runs:
            gpu_at[length] = runs[len(runs) // 2]
    del m2, o2


def gpu_time(length: int) -> float | None:
    """A step's GPU time at `length` tokens, interpolated between the three measured lengths."""
    if len(gpu_at) < 3:
        return None
    lo, hi = (LMIN, LMED) if length <= LMED else (LMED, LMAX)
    return gpu_at[lo] + (gpu_at[hi] - gpu_at[lo]) * (length - lo) / (hi - lo)


warm_end = time.perf_counter() + 2.0 * sc.scale  # the spin kernels well before the baseline
while time.perf_counter() < warm_end:
    step()
if sc.cuda:
    torch.cuda.synchronize()
own.update(steps=0, item_s=0.0, tokens=0)
walls.clear()
c0 = counters()
b0 = sc.mark("baseline")
t = time.perf_counter()
sc.run_for(10.0 * sc.scale, step)
mid = sc.mark("half")
sc.run_for(10.0 * sc.scale, step)
b1 = sc.mark("end")
wall = time.perf_counter() - t
c1 = counters()
n = own["steps"]
grew = {k: c1[k] - c0[k] for k in COUNTERS}
per_step = sorted(w for _, w in walls)
median = per_step[len(per_step) // 2] if per_step else 0.0
thirds = {}
for name, lo, hi in (("short", LMIN, 192), ("middle", 193, 352), ("long", 353, LMAX)):
    ws = sorted(w for ln, w in walls if lo <= ln <= hi)
    thirds[name] = round(ws[len(ws) // 2] * 1e3, 4) if ws else None
gpu_busy = sum(gpu_time(ln) for ln, _ in walls) if len(gpu_at) == 3 else None
sc.extra["self"] = {**{k: round(v, 4) for k, v in own.items()}, "wall_s": round(wall, 4),
                    "steps_per_s": round(n / wall, 2), "step_ms_median": round(median * 1e3, 4),
                    "step_ms_median_by_length": thirds, "item_share": round(own["item_s"] / wall, 4),
                    "gpu_step_ms_at": {str(k): round(v * 1e3, 4) for k, v in gpu_at.items()},
                    "gpu_step_ms_median_length": round(gpu_at[LMED] * 1e3, 4) if LMED in gpu_at else None,
                    "gpu_busy_s": round(gpu_busy, 4) if gpu_busy is not None else None,
                    "gpu_busy_share": round(gpu_busy / wall, 4) if gpu_busy is not None else None,
                    "allocator": {k.replace(".", "_"): v for k, v in grew.items()},
                    "cuda_mallocs": grew["segment.all.allocated"],
                    "cuda_mallocs_per_s": round(grew["segment.all.allocated"] / wall, 3),
                    "alloc_retries": grew["num_alloc_retries"],
                    "batch": BATCH, "lengths": [LMIN, LMAX], "d_model": D, "layers": LAYERS}
if not sc.cuda:
    sc.note("a smaller model (d_model 64), batch 8, fp32, no allocator counters: no CUDA.")
sc.note(f"natural: measured by the script: {n} steps ({n / wall:.0f}/s) in {wall:.2f} s, median step "
        f"{median * 1e3:.2f} ms (short/middle/long lengths {thirds}), {own['item_s']:.2f} s in loss.item(); "
        f"the allocator's counters grew by {grew}; "
        + (f"a step's kernels take {gpu_at[LMIN] * 1e3:.2f}/{gpu_at[LMED] * 1e3:.2f}/{gpu_at[LMAX] * 1e3:.2f} ms "
           f"of GPU time queued at {LMIN}/{LMED}/{LMAX} tokens (GPU busy {gpu_busy / wall:.0%} of the run)."
           if gpu_busy is not None else "no GPU timings (no CUDA)."))
sc.write_truth(baseline=(b0, b1), window=None, ratio_spans=((b0, mid), (mid, b1)))
