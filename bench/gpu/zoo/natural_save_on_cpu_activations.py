"""natural_save_on_cpu_activations (natural, nothing staged): a memory-strapped engineer's trick to fit a deeper model:
a stack of 8 pre-norm Transformer MLP blocks (x + W2(gelu(W1(LayerNorm(x)))), width 1024, hidden 4096, 4096 tokens a
batch, bf16 autocast, fused AdamW, batches already on the GPU) trained with every forward under
`with torch.autograd.graph.save_on_cpu(pin_memory=False):`. Every tensor autograd saves for the backward (the blocks'
inputs, the LayerNorm outputs, the GELU inputs and outputs, the bf16 weights) is copied in the forward to a new tensor
in pageable CPU memory (torch.empty + copy_: a synchronous device-to-host copy into fresh memory, run by the main
thread) and copied back to the GPU in the backward (.to(device): a host-to-device copy from pageable memory, run by
PyTorch's autograd thread, which runs the backward while the main thread waits in loss.backward()). loss.item() each
step. One process on CPUs 2-3, 20 s.

The script measures itself: the steps per second; the main thread's time in the forward, the backward, the optimiser's
step and loss.item() (a torch.cuda.synchronize() after each, added to time each; wall and the main thread's CPU clock);
the bytes autograd saves a step (a forward under a counting saved_tensors_hooks before the run: what save_on_cpu copies
out, and back in: `offload_bytes_per_step` each way); the main thread's time on a CPU and waiting for one over the run
(/proc/thread-self/schedstat), the autograd thread's (its tid seen by a hook in the backward; truth `autograd`); the
process's minor page faults and the device allocator's cudaMalloc calls; a step's GPU time queued without save_on_cpu
(common.gpu_seconds_queued: the kernels, the copies left out), so that the GPU's busy share is known; and, before the
run, 20 steps of the same model without save_on_cpu (`plain_steps_per_s`: what the offload costs)."""

import os
import resource
import threading
import time

from common import Scenario, gpu_seconds_queued, tids_of

sc = Scenario("natural_save_on_cpu_activations", "natural", "8 Transformer MLP blocks (1024/4096, 4096 tokens, bf16) "
              "trained under autograd.graph.save_on_cpu(pin_memory=False): every saved activation copied to pageable "
              "CPU memory in the forward and back in the backward, 20 s, nothing staged", job_cpus=[2, 3],
              control=True)
import torch  # noqa: E402

nn = torch.nn
dev = torch.device(sc.device)
DEPTH, WIDTH, HIDDEN, TOKENS = (8, 1024, 4096, 4096) if sc.cuda else (4, 128, 512, 256)
if sc.cuda:
    torch.backends.cuda.matmul.allow_tf32 = True


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(WIDTH)
        self.up = nn.Linear(WIDTH, HIDDEN)
        self.down = nn.Linear(HIDDEN, WIDTH)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(nn.functional.gelu(self.up(self.norm(x))))


torch.manual_seed(0)
model = nn.Sequential(*[Block() for _ in range(DEPTH)], nn.LayerNorm(WIDTH), nn.Linear(WIDTH, 1000)).to(dev)
opt = torch.optim.AdamW(model.parameters(), lr=3e-4, fused=sc.cuda or None)
xs = torch.randn(4, TOKENS, WIDTH, device=dev)
ys = torch.randint(0, 1000, (4, TOKENS), device=dev)
autograd_tid = {"tid": None}


def note_autograd_thread(grad: torch.Tensor) -> None:
    autograd_tid["tid"] = threading.get_native_id()


def forward(i: int) -> torch.Tensor:
    x = xs[i % len(xs)]
    with torch.autocast(sc.device, dtype=torch.bfloat16, enabled=sc.cuda):
        out = model(x)
    loss = nn.functional.cross_entropy(out.float(), ys[i % len(ys)])
    if autograd_tid["tid"] is None:
        loss.register_hook(note_autograd_thread)
    return loss


def sync() -> None:
    if sc.cuda:
        torch.cuda.synchronize()


own = {"steps": 0, "fwd_s": 0.0, "fwd_cpu_s": 0.0, "bwd_s": 0.0, "bwd_cpu_s": 0.0, "opt_s": 0.0, "item_s": 0.0}
state = {"i": 0}


def step() -> None:
    i = state["i"]
    state["i"] += 1
    t0, c0 = time.perf_counter(), time.thread_time()
    with torch.autograd.graph.save_on_cpu(pin_memory=False):
        loss = forward(i)
    sync()
    t1, c1 = time.perf_counter(), time.thread_time()
    loss.backward()
    sync()
    t2, c2 = time.perf_counter(), time.thread_time()
    opt.step()
    opt.zero_grad(set_to_none=True)
    sync()
    t3 = time.perf_counter()
    loss.item()
    t4 = time.perf_counter()
    own["fwd_s"] += t1 - t0
    own["fwd_cpu_s"] += c1 - c0
    own["bwd_s"] += t2 - t1
    own["bwd_cpu_s"] += c2 - c1
    own["opt_s"] += t3 - t2
    own["item_s"] += t4 - t3
    own["steps"] += 1


def plain_step() -> None:
    """The same step without save_on_cpu: the activations stay on the GPU."""
    loss = forward(state["i"])
    state["i"] += 1
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    loss.item()


def saved_bytes() -> tuple[int, int]:
    """The bytes (and tensors) autograd saves in one forward, counted by a pass-through pack hook."""
    got = [0, 0]

    def pack(t: torch.Tensor) -> torch.Tensor:
        got[0] += t.numel() * t.element_size()
        got[1] += 1
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = forward(0)
    loss.backward()
    opt.zero_grad(set_to_none=True)
    sync()
    return got[0], got[1]


def schedstat(path: str) -> tuple[float, float] | None:
    try:
        with open(path) as fh:
            run, wait = fh.read().split()[:2]
        return int(run) / 1e9, int(wait) / 1e9
    except (OSError, ValueError):
        return None


def mallocs() -> int:
    return int(torch.cuda.memory_stats().get("segment.all.allocated", 0)) if sc.cuda else 0


PID, MAIN = os.getpid(), threading.get_native_id()
for _ in range(5):  # warm-up: the allocator, cuBLAS
    plain_step()
for _ in range(5):
    step()
sync()
offload_bytes, offload_tensors = saved_bytes()
t = time.perf_counter()
for _ in range(20):
    plain_step()
sync()
plain_steps_per_s = 20 / (time.perf_counter() - t)
gpu_step_s = None
if sc.cuda:
    def work(_) -> None:
        """One step's kernels without save_on_cpu (forward, backward, the optimiser), nothing read back."""
        forward(1).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    runs = sorted(r for r in (gpu_seconds_queued(torch, work) for _ in range(5)) if r is not None)
    gpu_step_s = runs[len(runs) // 2] if runs else None
warm_end = time.perf_counter() + 2.0 * sc.scale  # the spin kernels well before the run
while time.perf_counter() < warm_end:
    step()
sync()
for k in own:
    own[k] = 0 if k == "steps" else 0.0
atid = autograd_tid["tid"] if autograd_tid["tid"] != MAIN else None
main0 = schedstat("/proc/thread-self/schedstat")
ag0 = schedstat(f"/proc/{PID}/task/{atid}/schedstat") if atid else None
f0, m0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt, mallocs()
b0 = sc.mark("baseline")
t = time.perf_counter()
sc.run_for(10.0 * sc.scale, step)
mid = sc.mark("half")
sc.run_for(10.0 * sc.scale, step)
b1 = sc.mark("end")
wall = time.perf_counter() - t
main1 = schedstat("/proc/thread-self/schedstat")
ag1 = schedstat(f"/proc/{PID}/task/{atid}/schedstat") if atid else None
f1, m1 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt, mallocs()
n = own["steps"]


def share(v: float | None) -> float | None:
    return round(v / wall, 4) if v is not None else None


def r4(v: float | None) -> float | None:
    return round(v, 4) if v is not None else None


main_run = main1[0] - main0[0] if main0 and main1 else None
main_wait = main1[1] - main0[1] if main0 and main1 else None
main_asleep = max(0.0, wall - (main_run or 0.0) - (main_wait or 0.0))
ag_run = ag1[0] - ag0[0] if ag0 and ag1 else None
ag_wait = ag1[1] - ag0[1] if ag0 and ag1 else None
gpu_busy = n * gpu_step_s if gpu_step_s is not None else None
steps_per_s = n / wall
offload_s = own["fwd_s"] + own["bwd_s"]
overhead = max(0.0, wall - n / plain_steps_per_s)  # the run's time beyond the same steps without save_on_cpu
sc.extra["autograd"] = {"pid": PID, "tid": atid, "comm": None if atid is None else
                        (open(f"/proc/{PID}/task/{atid}/comm").read().strip()
                         if os.path.exists(f"/proc/{PID}/task/{atid}/comm") else None)}
sc.extra["self"] = {**{k: r4(v) for k, v in own.items()}, "wall_s": round(wall, 4),
                    "steps_per_s": round(steps_per_s, 3), "plain_steps_per_s": round(plain_steps_per_s, 3),
                    "slowdown": round(plain_steps_per_s / steps_per_s, 3) if n else None,
                    "offload_overhead_s": round(overhead, 4), "offload_overhead_share": share(overhead),
                    "fwd_share": share(own["fwd_s"]), "fwd_cpu_share": share(own["fwd_cpu_s"]),
                    "bwd_share": share(own["bwd_s"]), "bwd_cpu_share": share(own["bwd_cpu_s"]),
                    "fwd_bwd_s": round(offload_s, 4), "fwd_bwd_share": share(offload_s),
                    "opt_share": share(own["opt_s"]), "item_share": share(own["item_s"]),
                    "offload_bytes_per_step": offload_bytes, "offload_tensors_per_step": offload_tensors,
                    "offload_gb_per_s": round(2 * n * offload_bytes / wall / 1e9, 3),
                    "main_run_s": r4(main_run), "main_cpu_share": share(main_run),
                    "main_cpu_wait_s": r4(main_wait), "main_cpu_wait_share": share(main_wait),
                    "main_asleep_s": round(main_asleep, 4), "main_asleep_share": share(main_asleep),
                    "autograd_tid": atid, "autograd_run_s": r4(ag_run), "autograd_cpu_share": share(ag_run),
                    "autograd_cpu_wait_s": r4(ag_wait), "autograd_cpu_wait_share": share(ag_wait),
                    "minor_faults_per_s": round((f1 - f0) / wall, 1), "cuda_mallocs_per_s": round((m1 - m0) / wall, 3),
                    "gpu_step_ms": round(gpu_step_s * 1e3, 4) if gpu_step_s is not None else None,
                    "gpu_busy_s": r4(gpu_busy), "gpu_busy_share": share(gpu_busy), "tokens": TOKENS,
                    "depth": DEPTH, "threads": len(tids_of(PID))}
if not sc.cuda:
    sc.note("the model shrunk on the CPU: save_on_cpu copies CPU tensors to CPU; no GPU timings, no allocator "
            "counters.")
sc.note(f"natural: measured by the script: {n} steps ({steps_per_s:.2f}/s; {plain_steps_per_s:.2f}/s without "
        f"save_on_cpu) in {wall:.2f} s: {own['fwd_s']:.2f} s in the forward ({own['fwd_cpu_s']:.2f} s of CPU), "
        f"{own['bwd_s']:.2f} s in the backward, {own['opt_s']:.2f} s in the optimiser; {offload_bytes / 1e6:.0f} MB "
        f"in {offload_tensors} saved tensors copied out and back each step; the main thread ran {r4(main_run)} s, "
        f"waited for a CPU {r4(main_wait)} s; "
        + (f"a step's kernels take {gpu_step_s * 1e3:.2f} ms of GPU time queued (GPU busy {gpu_busy / wall:.0%} of the "
           "run)." if gpu_busy is not None else "no GPU timings (no CUDA)."))
sc.write_truth(baseline=(b0, b1), window=None, ratio_spans=((b0, mid), (mid, b1)))
