"""natural_ema_on_cpu (natural, nothing staged): a GPT-style language model trained with an exponential moving average
(EMA) of its weights kept on the CPU, as a user short of GPU memory writes it: the EMA copy lives in host memory and,
after each optimiser step, every parameter is copied to the host with .cpu() (pageable memory, a fresh CPU tensor each
time) and the EMA updated with torch CPU ops, ema.mul_(0.999).add_(p, alpha=0.001), parameter by parameter, on
PyTorch's default intra-op threads (no set_num_threads). The model: a token and a position embedding (vocabulary
16,384, d 512, context 512), 8 pre-norm nn.TransformerEncoderLayer blocks (8 heads, feed-forward 2048, GELU, causal
mask), a final LayerNorm and a head tied to the token embedding: ~34 M parameters (136 MB in fp32); batches of 32 x
512 tokens from a random corpus held on the GPU, bf16 autocast, fused AdamW, loss.item() each step (logged). CPUs 2-3,
20 s (smaller with --device cpu: d 64, 2 blocks, context 64, vocabulary 1000, batch 4).

The script measures itself: the steps per second; the main thread's time queueing the step (forward, backward, the
optimiser), in a torch.cuda.synchronize() before the copies (added to time them: the step's kernels are done then), in
the copies to the host (wall and the main thread's run and run-queue wait by schedstat), in the EMA update and the
host copies' release (likewise: the rest of its wall time it slept, at the intra-op threads' barriers), in
loss.item(); the main thread's time on a CPU and waiting for one over the run (/proc/thread-self/schedstat) and asleep
(the rest); the intra-op threads' (those the first EMA update started; truth `intra_op`) and the other threads' CPU
time; the process's minor page faults; before the run, the parameters' copies alone (the GPU idle) to pageable memory
as the loop makes them and into pinned buffers made once (what pinning would give); a step's GPU time queued
(common.gpu_seconds_queued: forward, backward, the optimiser), so that the GPU's busy share (its kernels) is known;
the device allocator's cudaMalloc calls. Truth `threads`: every thread's tid and OS name, `intra_op_threads`:
torch.get_num_threads()."""

import os
import threading
import time

from common import Scenario, comm_of, gpu_seconds_queued, tids_of

sc = Scenario("natural_ema_on_cpu", "natural", "a GPT-style LM (~34 M parameters) with an EMA of its weights kept on "
              "the CPU: every step each parameter copied to the host with .cpu() and the EMA updated with torch CPU "
              "ops, loss.item() each step, 20 s, nothing staged", job_cpus=[2, 3], control=True)
import torch  # noqa: E402

PID, MAIN = os.getpid(), threading.get_native_id()
AT_IMPORT = set(tids_of(PID))
dev = torch.device(sc.device)
VOCAB, D, LAYERS, HEADS, CTX, BATCH = (16384, 512, 8, 8, 512, 32) if sc.cuda else (1000, 64, 2, 4, 64, 4)
DECAY = 0.999
nn = torch.nn
if sc.cuda:
    torch.backends.cuda.matmul.allow_tf32 = True


class GPT(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.tok = nn.Embedding(VOCAB, D)
        self.pos = nn.Embedding(CTX, D)
        layer = nn.TransformerEncoderLayer(D, HEADS, 4 * D, dropout=0.0, activation="gelu", batch_first=True,
                                           norm_first=True)
        self.blocks = nn.TransformerEncoder(layer, LAYERS, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(D)
        self.head = nn.Linear(D, VOCAB, bias=False)
        self.head.weight = self.tok.weight  # tied
        self.register_buffer("mask", nn.Transformer.generate_square_subsequent_mask(CTX), persistent=False)
        nn.init.normal_(self.tok.weight, std=0.02)
        nn.init.normal_(self.pos.weight, std=0.02)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        t = idx.shape[1]
        h = self.tok(idx) + self.pos(torch.arange(t, device=idx.device))
        h = self.blocks(h, mask=self.mask[:t, :t], is_causal=True)
        return self.head(self.norm(h))


torch.manual_seed(0)
model = GPT().to(dev)
opt = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.1, fused=sc.cuda or None)
corpus = torch.randint(0, VOCAB, (64, BATCH, CTX + 1), device=dev)
params = [(n, p) for n, p in model.named_parameters()]  # the tied weight once
NPARAM = sum(p.numel() for _, p in params)
own = {"steps": 0, "issue_s": 0.0, "sync_s": 0.0, "copy_s": 0.0, "copy_run_s": 0.0, "copy_wait_s": 0.0,
       "ema_s": 0.0, "ema_run_s": 0.0, "ema_wait_s": 0.0, "item_s": 0.0}
running = {"loss": 0.0, "i": 0}
_fd = os.open(f"/proc/{PID}/task/{MAIN}/schedstat", os.O_RDONLY)


def my_schedstat() -> tuple[int, int]:
    """The main thread's time on a CPU and waiting on a run queue (ns), as the kernel counts them."""
    run, wait = os.pread(_fd, 128, 0).split()[:2]
    return int(run), int(wait)


def schedstat(tid: int) -> tuple[int, int] | None:
    try:
        with open(f"/proc/{PID}/task/{tid}/schedstat") as fh:
            run, wait = fh.read().split()[:2]
        return int(run), int(wait)
    except (OSError, ValueError):
        return None


def minflt() -> int:
    with open(f"/proc/{PID}/stat") as fh:
        return int(fh.read().rsplit(")", 1)[1].split()[7])


def mallocs() -> int:
    return int(torch.cuda.memory_stats().get("segment.all.allocated", 0)) if sc.cuda else 0


def sync() -> None:
    if sc.cuda:
        torch.cuda.synchronize()


def train(i: int) -> torch.Tensor:
    seq = corpus[i % len(corpus)]
    x, y = seq[:, :-1], seq[:, 1:]
    with torch.autocast(sc.device, dtype=torch.bfloat16, enabled=sc.cuda):
        logits = model(x)
    loss = nn.functional.cross_entropy(logits.float().view(-1, VOCAB), y.reshape(-1))
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    return loss


ema: dict[str, torch.Tensor] = {}


@torch.no_grad()
def ema_to_host() -> dict[str, torch.Tensor]:
    return {n: p.detach().cpu() for n, p in params}  # pageable, a fresh tensor each


@torch.no_grad()
def ema_update(host: dict[str, torch.Tensor]) -> None:
    for n, p in host.items():
        ema[n].mul_(DECAY).add_(p, alpha=1 - DECAY)


def step() -> None:
    i = running["i"]
    running["i"] += 1
    t0 = time.perf_counter()
    loss = train(i)
    t1 = time.perf_counter()
    sync()  # for the timing: the step's kernels done, so that the copies below are timed alone
    t2 = time.perf_counter()
    r2, w2 = my_schedstat()
    host = ema_to_host()
    r3, w3 = my_schedstat()
    t3 = time.perf_counter()
    ema_update(host)
    del host  # the host copies released (their memory unmapped) with the update, not later
    r4, w4 = my_schedstat()
    t4 = time.perf_counter()
    running["loss"] += loss.item()
    t5 = time.perf_counter()
    own["issue_s"] += t1 - t0
    own["sync_s"] += t2 - t1
    own["copy_s"] += t3 - t2
    own["copy_run_s"] += (r3 - r2) / 1e9
    own["copy_wait_s"] += (w3 - w2) / 1e9
    own["ema_s"] += t4 - t3
    own["ema_run_s"] += (r4 - r3) / 1e9
    own["ema_wait_s"] += (w4 - w3) / 1e9
    own["item_s"] += t5 - t4
    own["steps"] += 1


def gpu_work(_) -> None:
    """A step's GPU work, nothing read back."""
    train(0)


for _ in range(5):  # the training alone first: the autograd thread, cuBLAS, the driver's threads started
    train(0).item()
sync()
before = set(tids_of(PID))
ema.update({n: p.detach().to("cpu", copy=True) for n, p in params})  # the EMA, on the host
step()  # the first EMA update: OpenMP starts its intra-op threads
intra = sorted(set(tids_of(PID)) - before)
how = "started by the first EMA update"
if not intra:  # the pool was there already: the threads named as the main thread that importing torch did not start
    intra = [t for t in tids_of(PID) if t != MAIN and t not in AT_IMPORT and comm_of(PID, t) == comm_of(PID, MAIN)]
    how = "named as the main thread, started after importing torch"
for _ in range(5):
    step()
sync()


def median_s(fn, k: int = 5) -> float:
    times = []
    for _ in range(k):
        sync()
        a = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - a)
    return sorted(times)[k // 2]


pageable_alone_s = median_s(ema_to_host)  # the copies as the loop makes them, the GPU idle
pinned_alone_s = None
gpu_step_s = None
if sc.cuda:
    pinned = {n: torch.empty(p.shape, dtype=p.dtype, pin_memory=True) for n, p in params}

    def to_pinned() -> None:
        for n, p in params:
            pinned[n].copy_(p.detach(), non_blocking=True)

    to_pinned()
    pinned_alone_s = median_s(to_pinned)
    del pinned
    runs = sorted(r for r in (gpu_seconds_queued(torch, gpu_work) for _ in range(5)) if r is not None)
    gpu_step_s = runs[len(runs) // 2] if runs else None
warm_end = time.perf_counter() + 2.0 * sc.scale  # the spin kernels well before the baseline
while time.perf_counter() < warm_end:
    step()
sync()
for k in own:
    own[k] = 0 if k == "steps" else 0.0
stats0 = {t: schedstat(t) for t in tids_of(PID)}
flt0, m0 = minflt(), mallocs()
b0 = sc.mark("baseline")
t = time.perf_counter()
sc.run_for(10.0 * sc.scale, step)
mid = sc.mark("half")
sc.run_for(10.0 * sc.scale, step)
b1 = sc.mark("end")
wall = time.perf_counter() - t
flt1, m1 = minflt(), mallocs()
stats1 = {t: schedstat(t) for t in tids_of(PID)}
names = {t: comm_of(PID, t) for t in stats1}


def group_s(tids: list[int], k: int) -> float | None:
    """The CPU time (k=0) or run-queue wait (k=1) of these threads over the run (s); None: schedstat unreadable."""
    got = [(stats1[t][k] - (stats0.get(t) or (0, 0))[k]) for t in tids if stats1.get(t)]
    return round(sum(got) / 1e9, 4) if got or not tids else None


def share(v: float | None) -> float | None:
    return round(v / wall, 4) if v is not None else None


def ms(v: float | None) -> float | None:
    return round(v * 1e3, 4) if v is not None else None


n = own["steps"]
intra_now = [t for t in intra if t in stats1]
others = [t for t in stats1 if t != MAIN and t not in intra]
main_run, main_wait = group_s([MAIN], 0), group_s([MAIN], 1)
main_asleep = max(0.0, wall - main_run - (main_wait or 0.0)) if main_run is not None else None
ema_sleep = max(0.0, own["ema_s"] - own["ema_run_s"] - own["ema_wait_s"])
copy_sleep = max(0.0, own["copy_s"] - own["copy_run_s"] - own["copy_wait_s"])
gpu_busy = n * gpu_step_s if gpu_step_s is not None else None
param_bytes = sum(p.numel() * p.element_size() for _, p in params)
sc.extra["intra_op"] = {"pid": PID, "tids": intra, "comms": [names.get(t) or comm_of(PID, t) for t in intra],
                        "how": how}
sc.extra["threads"] = [{"tid": t, "comm": names[t]} for t in sorted(names)]
sc.extra["intra_op_threads"] = torch.get_num_threads()
sc.extra["self"] = {**{k: round(v, 4) for k, v in own.items()}, "wall_s": round(wall, 4),
                    "steps_per_s": round(n / wall, 2), "step_ms_mean": round(wall / max(n, 1) * 1e3, 4),
                    **{f"{k.removesuffix('_s')}_share": share(own[k]) for k in own if k.endswith("_s")},
                    "ema_sleep_s": round(ema_sleep, 4), "ema_sleep_share": share(ema_sleep),
                    "copy_sleep_s": round(copy_sleep, 4), "copy_sleep_share": share(copy_sleep),
                    "main_run_s": main_run, "main_cpu_share": share(main_run),
                    "main_cpu_wait_s": main_wait, "main_cpu_wait_share": share(main_wait),
                    "main_asleep_s": round(main_asleep, 4) if main_asleep is not None else None,
                    "main_asleep_share": share(main_asleep),
                    "intra_op_run_s": group_s(intra_now, 0), "intra_op_cpu_wait_s": group_s(intra_now, 1),
                    "other_threads_run_s": group_s(others, 0),
                    "intra_op_threads": torch.get_num_threads(), "intra_op_started": len(intra),
                    "job_cpus": len(sc.job_cpus), "host_cpus": os.cpu_count(),
                    "minor_faults_per_s": round((flt1 - flt0) / wall, 1),
                    "cuda_mallocs_per_s": round((m1 - m0) / wall, 3),
                    "params_m": round(NPARAM / 1e6, 3), "param_mb": round(param_bytes / 1e6, 2),
                    "tensors_copied_per_step": len(params),
                    "copy_gb_per_s": round(n * param_bytes / own["copy_s"] / 1e9, 3) if own["copy_s"] else None,
                    "pageable_alone_ms": ms(pageable_alone_s), "pinned_alone_ms": ms(pinned_alone_s),
                    "pinned_would_save_s": round(own["copy_s"] - n * pinned_alone_s, 4) if pinned_alone_s else None,
                    "gpu_step_ms": ms(gpu_step_s), "gpu_busy_s": round(gpu_busy, 4) if gpu_busy is not None else None,
                    "gpu_busy_share": share(gpu_busy), "batch": BATCH, "context": CTX, "decay": DECAY,
                    "mean_loss": round(running["loss"] / max(running["i"], 1), 4),
                    "parallel": torch.__config__.parallel_info().splitlines()[-1].strip()}
if not sc.cuda:
    sc.note("a tiny model, no copies (the parameters are on the CPU already), no pinned buffers, no allocator "
            "counters: no CUDA.")
sc.note(f"natural: measured by the script: {n} steps ({n / wall:.1f}/s) in {wall:.2f} s: {own['issue_s']:.2f} s "
        f"queueing the steps, {own['sync_s']:.2f} s waiting for their kernels, {own['copy_s']:.2f} s copying "
        f"{len(params)} parameters ({param_bytes / 1e6:.0f} MB) to pageable host memory (alone "
        f"{pageable_alone_s * 1e3:.1f} ms" + (f", into pinned buffers {pinned_alone_s * 1e3:.1f} ms" if pinned_alone_s
                                              else "") +
        f"), {own['ema_s']:.2f} s in the EMA update with torch CPU ops on {torch.get_num_threads()} intra-op threads "
        f"({len(intra)} started) over {len(sc.job_cpus)} CPUs, of which the main thread ran {own['ema_run_s']:.2f} s, "
        f"waited for a CPU {own['ema_wait_s']:.2f} s and slept {ema_sleep:.2f} s; over the run the main thread ran "
        f"{main_run} s and waited for a CPU {main_wait} s; "
        + (f"a step's kernels take {gpu_step_s * 1e3:.2f} ms of GPU time queued (GPU busy {gpu_busy / wall:.0%} of the "
           "run)." if gpu_busy is not None else "no GPU timings (no CUDA)."))
sc.write_truth(baseline=(b0, b1), window=None, ratio_spans=((b0, mid), (mid, b1)))
