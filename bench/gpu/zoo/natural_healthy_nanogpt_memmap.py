"""natural_healthy_nanogpt_memmap (natural, nothing staged; a control): a GPU-bound GPT-2 (124M) pre-training loop as
nanoGPT's train.py writes it, with its data path as it is: the token file (train.bin: uint16 ids) is opened anew with
np.memmap for every batch ("we recreate np.memmap every batch to avoid a memory leak"), 12 random windows of 1,024
tokens are sliced out of it, each turned into int64 (.astype) and stacked with torch.stack (x and y, shifted by one),
then pinned (x.pin_memory()) and copied to the GPU with non_blocking=True; the next batch is fetched right after the
forward is queued ("immediately async prefetch next batch while model is doing the forward pass on the GPU"). The
model: nanoGPT's GPT (12 layers, 12 heads, d 768, block 1024, vocabulary 50,304, no biases, no dropout, weights tied,
flash attention through scaled_dot_product_attention), bf16 autocast, fused AdamW (weight decay 0.1 on the matrices,
betas 0.9/0.95), a warm-up-then-cosine learning rate set on the param groups every iteration, 5 micro-steps of
gradient accumulation an iteration, clip_grad_norm_(1.0), zero_grad(set_to_none=True), and the loss read with
loss.item() and printed every iteration (log_interval 1) with the iteration's time. Per micro-step the host's side
activity (a file opened and mapped and unmapped, a few dozen page faults, 24 small numpy copies, two stacks, two pinned
buffers and their copies) is a millisecond or so against tens of milliseconds of GPU work: the job is GPU-bound, its
host queueing ahead of the GPU until the launch queue fills. At set-up the script writes the token file (64 M tokens,
128 MB of synthetic ids, a folder under /var/tmp: the page cache; removed at the end). One process on CPUs 2-3, no
threads of its own (PyTorch's autograd thread runs the backward), no workers, no children, no lock, no sleep. 20 s
(smaller with --device cpu: 2 layers, d 64, block 64, vocabulary 512, batch 4, 2 micro-steps, a 1 M-token file, no
pinning).

The script measures itself: the iterations and micro-steps per second; the main thread's time in get_batch (wall and
its CPU clock, and in the pinning and copies apart: `to_gpu_s`), queueing the forward, in loss.backward()
(`backward_s`: PyTorch's autograd thread queues the backward while the main thread waits; a full launch queue holds
it there too), in clipping and the optimiser, and in loss.item() (its wait for the GPU); the memmaps opened; the main
thread's time on a CPU and waiting for one (schedstat); the process's minor and major page faults, the device
allocator's cudaMalloc calls and the caching host allocator's cudaHostAlloc calls; and an iteration's GPU time queued
(common.gpu_seconds_queued, measured in parts so that no part fills the launch queue: a micro-step's forward, its
backward, and clipping with the optimiser), so that the GPU's busy share is known. Truth `autograd` names PyTorch's
autograd thread."""

import math
import os
import resource
import shutil
import tempfile
import threading
import time

from common import Scenario, gpu_seconds_queued

sc = Scenario("natural_healthy_nanogpt_memmap", "natural", "nanoGPT's GPT-2 (124M) training loop with its get_batch "
              "(np.memmap recreated every batch, astype/stack, pin_memory, non_blocking copies), bf16, 5 micro-steps "
              "an iteration, loss.item() every iteration, 20 s, nothing staged: a control", job_cpus=[2, 3],
              control=True)
import numpy as np  # noqa: E402
import torch  # noqa: E402

nn = torch.nn
F = nn.functional
PID, MAIN = os.getpid(), threading.get_native_id()
dev = torch.device(sc.device)
device_type = "cuda" if sc.cuda else "cpu"
N_LAYER, N_HEAD, N_EMBD, BLOCK, VOCAB, BATCH, ACCUM, TOKENS = (
    (12, 12, 768, 1024, 50304, 12, 5, 64 * 2**20) if sc.cuda else (2, 4, 64, 64, 512, 4, 2, 2**20))
LEARNING_RATE, MIN_LR, WARMUP_ITERS, LR_DECAY_ITERS, GRAD_CLIP = 6e-4, 6e-5, 200, 600_000, 1.0
DATA_DIR = tempfile.mkdtemp(prefix="zoo_nanogpt_", dir="/var/tmp" if os.path.isdir("/var/tmp") else None)


class LayerNorm(nn.Module):
    """LayerNorm with an optional bias (nanoGPT's; PyTorch's has none to leave out)."""

    def __init__(self, ndim: int, bias: bool) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(ndim))
        self.bias = nn.Parameter(torch.zeros(ndim)) if bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.layer_norm(x, self.weight.shape, self.weight, self.bias, 1e-5)


class CausalSelfAttention(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.c_attn = nn.Linear(N_EMBD, 3 * N_EMBD, bias=False)
        self.c_proj = nn.Linear(N_EMBD, N_EMBD, bias=False)
        self.n_head, self.n_embd = N_HEAD, N_EMBD

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.size()
        q, k, v = self.c_attn(x).split(self.n_embd, dim=2)
        k = k.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        q = q.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        v = v.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=True)
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        return self.c_proj(y)


class MLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.c_fc = nn.Linear(N_EMBD, 4 * N_EMBD, bias=False)
        self.gelu = nn.GELU()
        self.c_proj = nn.Linear(4 * N_EMBD, N_EMBD, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.c_proj(self.gelu(self.c_fc(x)))


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.ln_1, self.attn = LayerNorm(N_EMBD, bias=False), CausalSelfAttention()
        self.ln_2, self.mlp = LayerNorm(N_EMBD, bias=False), MLP()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.transformer = nn.ModuleDict(dict(wte=nn.Embedding(VOCAB, N_EMBD), wpe=nn.Embedding(BLOCK, N_EMBD),
                                              h=nn.ModuleList([Block() for _ in range(N_LAYER)]),
                                              ln_f=LayerNorm(N_EMBD, bias=False)))
        self.lm_head = nn.Linear(N_EMBD, VOCAB, bias=False)
        self.transformer.wte.weight = self.lm_head.weight  # weight tying
        self.apply(self._init_weights)
        for pn, p in self.named_parameters():
            if pn.endswith("c_proj.weight"):
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * N_LAYER))

    def _init_weights(self, module: nn.Module) -> None:
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        t = idx.size(1)
        pos = torch.arange(0, t, dtype=torch.long, device=idx.device)
        x = self.transformer.wte(idx) + self.transformer.wpe(pos)
        for block in self.transformer.h:
            x = block(x)
        x = self.transformer.ln_f(x)
        logits = self.lm_head(x)
        loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1), ignore_index=-1)
        return logits, loss

    def configure_optimizers(self, weight_decay: float, learning_rate: float, betas: tuple) -> torch.optim.Optimizer:
        params = [p for p in self.parameters() if p.requires_grad]
        groups = [{"params": [p for p in params if p.dim() >= 2], "weight_decay": weight_decay},
                  {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]
        return torch.optim.AdamW(groups, lr=learning_rate, betas=betas, fused=device_type == "cuda")


own = {"iters": 0, "micro": 0, "get_batch_s": 0.0, "get_batch_cpu_s": 0.0, "to_gpu_s": 0.0, "memmaps": 0,
       "forward_s": 0.0, "backward_s": 0.0, "opt_s": 0.0, "item_s": 0.0, "print_s": 0.0}


def get_batch(split: str) -> tuple[torch.Tensor, torch.Tensor]:
    t0, c0 = time.perf_counter(), time.thread_time()
    # We recreate np.memmap every batch to avoid a memory leak, as per
    # https://stackoverflow.com/questions/45132940/numpy-memmap-memory-usage-want-to-iterate-once/61472122#61472122
    data = np.memmap(os.path.join(DATA_DIR, f"{split}.bin"), dtype=np.uint16, mode="r")
    ix = torch.randint(len(data) - BLOCK, (BATCH,))
    x = torch.stack([torch.from_numpy((data[i:i + BLOCK]).astype(np.int64)) for i in ix])
    y = torch.stack([torch.from_numpy((data[i + 1:i + 1 + BLOCK]).astype(np.int64)) for i in ix])
    t1 = time.perf_counter()
    if device_type == "cuda":
        # pin arrays x,y, which allows us to move them to GPU asynchronously (non_blocking=True)
        x, y = x.pin_memory().to(dev, non_blocking=True), y.pin_memory().to(dev, non_blocking=True)
    else:
        x, y = x.to(dev), y.to(dev)
    t2, c2 = time.perf_counter(), time.thread_time()
    own["get_batch_s"] += t2 - t0
    own["get_batch_cpu_s"] += c2 - c0
    own["to_gpu_s"] += t2 - t1
    own["memmaps"] += 1
    return x, y


def get_lr(it: int) -> float:
    if it < WARMUP_ITERS:
        return LEARNING_RATE * (it + 1) / (WARMUP_ITERS + 1)
    if it > LR_DECAY_ITERS:
        return MIN_LR
    decay_ratio = (it - WARMUP_ITERS) / (LR_DECAY_ITERS - WARMUP_ITERS)
    return MIN_LR + 0.5 * (1.0 + math.cos(math.pi * decay_ratio)) * (LEARNING_RATE - MIN_LR)


# The token file, as prepare.py leaves it (synthetic ids here), written once at set-up.
rng = np.random.default_rng(0)
ids = rng.integers(0, 50257 if sc.cuda else VOCAB, size=TOKENS, dtype=np.uint16)
ids.tofile(os.path.join(DATA_DIR, "train.bin"))
del ids
torch.manual_seed(1337)
if sc.cuda:
    torch.backends.cuda.matmul.allow_tf32 = True  # nanoGPT's settings
    torch.backends.cudnn.allow_tf32 = True
model = GPT().to(dev)
optimizer = model.configure_optimizers(0.1, LEARNING_RATE, (0.9, 0.95))
ctx = torch.autocast(device_type=device_type, dtype=torch.bfloat16, enabled=sc.cuda)
state = {"iter_num": 0, "t0": time.time(), "running_mfu": -1.0}
batch = {"X": None, "Y": None}


def iteration() -> None:
    """One of train.py's iterations: the lr set, ACCUM micro-steps (the next batch fetched behind each forward), the
    clip, the optimiser, the log line."""
    it = state["iter_num"]
    lr = get_lr(it)
    for param_group in optimizer.param_groups:
        param_group["lr"] = lr
    for _ in range(ACCUM):
        t0 = time.perf_counter()
        with ctx:
            logits, loss = model(batch["X"], batch["Y"])
            loss = loss / ACCUM
        own["forward_s"] += time.perf_counter() - t0
        # immediately async prefetch next batch while model is doing the forward pass on the GPU
        batch["X"], batch["Y"] = get_batch("train")
        tb = time.perf_counter()
        loss.backward()
        own["backward_s"] += time.perf_counter() - tb
        own["micro"] += 1
    to = time.perf_counter()
    torch.nn.utils.clip_grad_norm_(model.parameters(), GRAD_CLIP)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    ti = time.perf_counter()
    lossf = loss.item() * ACCUM
    tp = time.perf_counter()
    t1 = time.time()
    dt, state["t0"] = t1 - state["t0"], t1
    print(f"iter {it}: loss {lossf:.4f}, time {dt * 1000:.2f}ms", flush=True)
    own["opt_s"] += ti - to
    own["item_s"] += tp - ti
    own["print_s"] += time.perf_counter() - tp
    state["iter_num"] += 1
    own["iters"] += 1


def sync() -> None:
    if sc.cuda:
        torch.cuda.synchronize()


def reset() -> None:
    for k in own:
        own[k] = 0 if k in ("iters", "micro", "memmaps") else 0.0


def schedstat(tid: int) -> tuple[float, float] | None:
    try:
        with open(f"/proc/{PID}/task/{tid}/schedstat") as fh:
            run, wait = fh.read().split()[:2]
        return int(run) / 1e9, int(wait) / 1e9
    except (OSError, ValueError):
        return None


def autograd_thread() -> dict | None:
    """PyTorch's autograd thread for the GPU (pt_autograd_0), started at the first backward on CUDA tensors."""
    for tid in sorted(int(t) for t in os.listdir(f"/proc/{PID}/task")):
        try:
            with open(f"/proc/{PID}/task/{tid}/comm") as fh:
                comm = fh.read().strip()
        except OSError:
            continue
        if comm.startswith("pt_autograd"):
            return {"pid": PID, "tid": tid, "comm": comm}
    return None


def allocs() -> tuple[int, int | None]:
    """(the device allocator's cudaMalloc calls, the caching host allocator's cudaHostAlloc calls) so far."""
    if not sc.cuda:
        return 0, None
    try:
        host = int(torch.cuda.host_memory_stats().get("num_host_alloc", 0))
    except (RuntimeError, AttributeError):
        host = None
    return int(torch.cuda.memory_stats().get("segment.all.allocated", 0)), host


def median_gpu_s(work, prepare=None) -> float | None:
    runs = sorted(r for r in (gpu_seconds_queued(torch, work, prepare) for _ in range(3)) if r is not None)
    return runs[len(runs) // 2] if runs else None


def micro_loss() -> torch.Tensor:
    with ctx:
        return model(batch["X"], batch["Y"])[1] / ACCUM


try:
    batch["X"], batch["Y"] = get_batch("train")  # fetch the very first batch
    for _ in range(3):  # warm-up: cuBLAS and the attention kernels chosen, the allocators, the autograd thread
        iteration()
    sync()
    gpu_iter_s = gpu_fwd_s = gpu_bwd_s = gpu_opt_s = None
    if sc.cuda:
        def backward_prepared() -> torch.Tensor:
            optimizer.zero_grad(set_to_none=True)
            return micro_loss()

        def grads_prepared() -> None:
            optimizer.zero_grad(set_to_none=True)
            micro_loss().backward()

        def opt_work(_) -> None:
            torch.nn.utils.clip_grad_norm_(model.parameters(), GRAD_CLIP)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)

        gpu_fwd_s = median_gpu_s(lambda _: micro_loss())
        gpu_bwd_s = median_gpu_s(lambda loss: loss.backward(), backward_prepared)
        gpu_opt_s = median_gpu_s(opt_work, grads_prepared)
        if None not in (gpu_fwd_s, gpu_bwd_s, gpu_opt_s):
            gpu_iter_s = ACCUM * (gpu_fwd_s + gpu_bwd_s) + gpu_opt_s
        optimizer.zero_grad(set_to_none=True)
    warm_end = time.perf_counter() + 2.0 * sc.scale  # the spin kernels well before the run
    while time.perf_counter() < warm_end:
        iteration()
    sync()
    ag = autograd_thread()
    reset()
    main0 = schedstat(MAIN)
    r0 = resource.getrusage(resource.RUSAGE_SELF)
    m0, h0 = allocs()
    b0 = sc.mark("baseline")
    t = time.perf_counter()
    sc.run_for(10.0 * sc.scale, iteration)
    mid = sc.mark("half")
    sc.run_for(10.0 * sc.scale, iteration)
    sync()
    b1 = sc.mark("end")
    wall = time.perf_counter() - t
    main1 = schedstat(MAIN)
    r1 = resource.getrusage(resource.RUSAGE_SELF)
    m1, h1 = allocs()
finally:
    shutil.rmtree(DATA_DIR, ignore_errors=True)
n = own["iters"]


def share(v: float | None) -> float | None:
    return round(v / wall, 4) if v is not None else None


def ms(v: float | None) -> float | None:
    return round(v * 1e3, 4) if v is not None else None


main_run = round(main1[0] - main0[0], 4) if main0 and main1 else None
main_wait = round(main1[1] - main0[1], 4) if main0 and main1 else None
main_asleep = round(max(0.0, wall - main_run - main_wait), 4) if main_run is not None and main_wait is not None \
    else None
gpu_busy = n * gpu_iter_s if gpu_iter_s is not None else None
sc.extra["autograd"] = ag
sc.extra["self"] = {**{k: round(v, 4) if isinstance(v, float) else v for k, v in own.items()},
                    "wall_s": round(wall, 4), "steps_per_s": round(n / wall, 2),
                    "micro_steps_per_s": round(own["micro"] / wall, 2), "iter_ms_mean": ms(wall / max(n, 1)),
                    "get_batch_share": share(own["get_batch_s"]), "get_batch_cpu_share": share(own["get_batch_cpu_s"]),
                    "get_batch_ms_mean": ms(own["get_batch_s"] / max(own["memmaps"], 1)),
                    "to_gpu_share": share(own["to_gpu_s"]), "forward_share": share(own["forward_s"]),
                    "backward_share": share(own["backward_s"]), "opt_share": share(own["opt_s"]),
                    "item_share": share(own["item_s"]), "memmaps_per_s": round(own["memmaps"] / wall, 2),
                    "main_run_s": main_run, "main_cpu_share": share(main_run),
                    "main_cpu_wait_s": main_wait, "main_cpu_wait_share": share(main_wait),
                    "main_asleep_s": main_asleep, "main_asleep_share": share(main_asleep),
                    "minor_faults_per_s": round((r1.ru_minflt - r0.ru_minflt) / wall, 1),
                    "major_faults": r1.ru_majflt - r0.ru_majflt,
                    "cuda_mallocs_per_s": round((m1 - m0) / wall, 3),
                    "host_allocs_per_s": round((h1 - h0) / wall, 3) if h0 is not None and h1 is not None else None,
                    "gpu_forward_ms": ms(gpu_fwd_s), "gpu_backward_ms": ms(gpu_bwd_s), "gpu_opt_ms": ms(gpu_opt_s),
                    "gpu_step_ms": ms(gpu_iter_s), "gpu_busy_s": round(gpu_busy, 4) if gpu_busy is not None else None,
                    "gpu_busy_share": share(gpu_busy), "batch": BATCH, "block": BLOCK, "accum": ACCUM,
                    "n_layer": N_LAYER, "n_embd": N_EMBD, "tokens_file": TOKENS}
if not sc.cuda:
    sc.note("on the CPU: no pinning, no autograd thread (the backward runs on the main thread), no GPU timings, no "
            "allocator counters.")
sc.note(f"natural, a control: measured by the script: {n} iterations ({n / wall:.2f}/s, {own['micro']} micro-steps) "
        f"in {wall:.2f} s: {own['get_batch_s']:.3f} s in get_batch ({own['get_batch_cpu_s']:.3f} s of CPU, "
        f"{own['to_gpu_s']:.3f} s pinning and copying; {own['memmaps']} memmaps), {own['forward_s']:.2f} s queueing "
        f"forwards, {own['backward_s']:.2f} s in backward(), {own['opt_s']:.2f} s clipping and in the optimiser, "
        f"{own['item_s']:.2f} s in .item(); the main thread ran {main_run} s, waited for a CPU {main_wait} s; "
        + (f"an iteration's kernels take {gpu_iter_s * 1e3:.1f} ms of GPU time queued (GPU busy "
           f"{gpu_busy / wall:.0%} of the run)." if gpu_busy is not None else "no GPU timings."))
sc.write_truth(baseline=(b0, b1), window=None, ratio_spans=((b0, mid), (mid, b1)))
