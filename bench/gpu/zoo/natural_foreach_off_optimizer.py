"""natural_foreach_off_optimizer (natural, nothing staged): a deep, narrow residual MLP with many small parameter
tensors trained with the optimiser's per-tensor loop, as a script ported from an old recipe (or one that turned foreach
off to debug) writes it: 250 residual blocks (LayerNorm(256), Linear(256, 256), GELU; y = x + block(x)) between an input
Linear(128, 256) and a head Linear(256, 10): 1,004 parameter tensors of at most 64 K elements; batch 512 on the GPU,
fp32 without TF32; torch.optim.AdamW(foreach=False, fused=False) (one set of small kernels per parameter tensor each
step) and torch.nn.utils.clip_grad_norm_(1.0, foreach=False) (a norm kernel per tensor, then a scale per tensor);
loss.item() each step. One process on CPUs 2-3, no thread of its own but PyTorch's autograd thread, no workers, no
copies, no IO. 8 s. The script measures itself: the steps per second; the main thread's time in forward+backward,
clipping and optimizer.step() (the GPU synchronised before and after each, to time each alone: the loop as a user times
it) and in loss.item(); its time on a CPU and waiting for one (/proc/thread-self/schedstat) over the run; the process's
minor page faults and the device allocator's cudaMalloc calls; the parameter tensors' count and the aten ops one
clipping and one optimiser step dispatch (counted once before the run with a TorchDispatchMode: about the kernels they
launch); and a step's GPU time queued: common.gpu_seconds_queued on one segment of 5 blocks (its forward, backward,
clipping and optimiser step over its own 20 tensors, on a copy with its own AdamW(foreach=False): ~300 kernels), times
the 50 segments (the blocks are alike; the input layer and the head are left out), a whole step's ~15,000 kernels being
more than CUDA's launch queue holds; so that the GPU's busy share is known."""

import copy
import os
import resource
import threading
import time

from common import Scenario, gpu_seconds_queued

sc = Scenario("natural_foreach_off_optimizer", "natural", "a 250-block residual MLP (1,004 small parameter tensors) "
              "trained with AdamW(foreach=False) and clip_grad_norm_(foreach=False), loss.item() each step, 8 s, "
              "nothing staged", job_cpus=[2, 3], control=True)
import torch  # noqa: E402

nn = torch.nn
PID, MAIN = os.getpid(), threading.get_native_id()
dev = torch.device(sc.device)
BLOCKS, SEG, WIDTH, IN, BATCH = (250, 5, 256, 128, 512) if sc.cuda else (250, 5, 32, 16, 32)
if sc.cuda:
    torch.backends.cuda.matmul.allow_tf32 = False


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(WIDTH)
        self.fc = nn.Linear(WIDTH, WIDTH)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + nn.functional.gelu(self.fc(self.norm(x)))


class DeepMLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inp = nn.Linear(IN, WIDTH)
        self.blocks = nn.Sequential(*[Block() for _ in range(BLOCKS)])
        self.head = nn.Linear(WIDTH, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.blocks(self.inp(x)))


torch.manual_seed(0)
model = DeepMLP().to(dev)
for b in model.blocks:  # small residual branches, so that 250 of them keep the activations in range
    nn.init.normal_(b.fc.weight, std=0.02 / BLOCKS ** 0.5)
params = list(model.parameters())
NPARAMS = len(params)
opt = torch.optim.AdamW(params, lr=1e-3, weight_decay=0.01, foreach=False, fused=False)
xs = torch.randn(8, BATCH, IN, device=dev)
ys = torch.randint(0, 10, (8, BATCH), device=dev)
own = {"steps": 0, "fwd_bwd_s": 0.0, "clip_s": 0.0, "opt_s": 0.0, "item_s": 0.0, "running_loss": 0.0}
state = {"i": 0}


def sync() -> None:
    if sc.cuda:
        torch.cuda.synchronize()


def step() -> None:
    i = state["i"]
    state["i"] += 1
    t0 = time.perf_counter()
    loss = nn.functional.cross_entropy(model(xs[i % 8]), ys[i % 8])
    opt.zero_grad(set_to_none=True)
    loss.backward()
    sync()
    t1 = time.perf_counter()
    torch.nn.utils.clip_grad_norm_(params, 1.0, foreach=False)
    sync()
    t2 = time.perf_counter()
    opt.step()
    sync()
    t3 = time.perf_counter()
    own["running_loss"] += loss.item()
    t4 = time.perf_counter()
    own["fwd_bwd_s"] += t1 - t0
    own["clip_s"] += t2 - t1
    own["opt_s"] += t3 - t2
    own["item_s"] += t4 - t3
    own["steps"] += 1
    if own["steps"] % 100 == 0:
        print(f"step {state['i']}: loss {own['running_loss'] / own['steps']:.4f}", flush=True)


def count_ops(fn) -> int | None:
    """The aten ops `fn` dispatches (about the kernels it launches), counted with a TorchDispatchMode; None where that
    private API is missing."""
    try:
        from torch.utils._python_dispatch import TorchDispatchMode
    except ImportError:
        return None

    class Count(TorchDispatchMode):
        n = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            Count.n += 1
            return func(*args, **(kwargs or {}))

    try:
        with Count():
            fn()
    except Exception as e:  # noqa: BLE001 - a count is a nicety, not the job
        print(f"could not count ops: {e!r}", flush=True)
        return None
    return Count.n


def thread_schedstat() -> tuple[float, float | None]:
    """The calling thread's time on a CPU and waiting on a run queue (s), by schedstat; (thread_time, None) without."""
    try:
        with open("/proc/thread-self/schedstat") as fh:
            run, wait = fh.read().split()[:2]
        return int(run) / 1e9, int(wait) / 1e9
    except (OSError, ValueError):
        return time.thread_time(), None


def mallocs() -> int:
    return int(torch.cuda.memory_stats().get("segment.all.allocated", 0)) if sc.cuda else 0


for _ in range(10):  # warm-up: the allocator, cuBLAS, the optimiser's state
    step()
sync()
clip_ops = count_ops(lambda: torch.nn.utils.clip_grad_norm_(params, 1.0, foreach=False))
opt_ops = count_ops(opt.step)
sync()
gpu_step_s = None
if sc.cuda:
    seg = copy.deepcopy(nn.Sequential(*list(model.blocks)[:SEG]))
    seg_params = list(seg.parameters())
    seg_opt = torch.optim.AdamW(seg_params, lr=1e-3, weight_decay=0.01, foreach=False, fused=False)
    seg_x = torch.randn(BATCH, WIDTH, device=dev)

    def work(_) -> None:
        """One segment's GPU work: forward, backward, clipping, the optimiser step over its tensors; nothing read."""
        seg(seg_x).square().mean().backward()
        torch.nn.utils.clip_grad_norm_(seg_params, 1.0, foreach=False)
        seg_opt.step()
        seg_opt.zero_grad(set_to_none=True)

    work(None)
    sync()
    runs = sorted(r for r in (gpu_seconds_queued(torch, work) for _ in range(5)) if r is not None)
    gpu_step_s = runs[len(runs) // 2] * (BLOCKS // SEG) if runs else None
    del seg, seg_opt, seg_params
warm_end = time.perf_counter() + 1.0 * sc.scale  # the spin kernels well before the run
while time.perf_counter() < warm_end:
    step()
sync()
for k in own:
    own[k] = 0 if k == "steps" else 0.0
run0, wait0 = thread_schedstat()
f0, m0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt, mallocs()
b0 = sc.mark("baseline")
t = time.perf_counter()
# 8 s, not the neighbours' 20: a launch-bound loop issues ~150k CUDA calls a second, and its store must stay small
sc.run_for(4.0 * sc.scale, step)
mid = sc.mark("half")
sc.run_for(4.0 * sc.scale, step)
sync()
b1 = sc.mark("end")
wall = time.perf_counter() - t
run1, wait1 = thread_schedstat()
f1, m1 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt, mallocs()
n = own["steps"]
main_run = round(run1 - run0, 4)
main_wait = round(wait1 - wait0, 4) if wait0 is not None and wait1 is not None else None
main_asleep = max(0.0, wall - main_run - (main_wait or 0.0))
gpu_busy = n * gpu_step_s if gpu_step_s is not None else None


def share(v: float | None) -> float | None:
    return round(v / wall, 4) if v is not None else None


sc.extra["self"] = {**{k: round(v, 4) for k, v in own.items()}, "wall_s": round(wall, 4),
                    "steps_per_s": round(n / wall, 2), "step_ms_mean": round(wall / max(n, 1) * 1e3, 4),
                    "fwd_bwd_share": share(own["fwd_bwd_s"]), "clip_share": share(own["clip_s"]),
                    "opt_share": share(own["opt_s"]), "item_share": share(own["item_s"]),
                    "opt_clip_share": share(own["opt_s"] + own["clip_s"]),
                    "param_tensors": NPARAMS, "param_elements": sum(p.numel() for p in params),
                    "clip_ops_per_step": clip_ops, "opt_ops_per_step": opt_ops,
                    "main_run_s": main_run, "main_cpu_share": share(main_run),
                    "main_cpu_wait_s": main_wait, "main_cpu_wait_share": share(main_wait),
                    "main_asleep_s": round(main_asleep, 4), "main_asleep_share": share(main_asleep),
                    "minor_faults_per_s": round((f1 - f0) / wall, 1), "cuda_mallocs_per_s": round((m1 - m0) / wall, 3),
                    "gpu_step_ms": round(gpu_step_s * 1e3, 4) if gpu_step_s is not None else None,
                    "gpu_busy_s": round(gpu_busy, 4) if gpu_busy is not None else None,
                    "gpu_busy_share": share(gpu_busy), "blocks": BLOCKS, "width": WIDTH, "batch": BATCH,
                    "mean_loss": round(own["running_loss"] / max(n, 1), 4)}
if not sc.cuda:
    sc.note("a narrow model on the CPU: no GPU timings, no allocator counters.")
sc.note(f"natural: measured by the script: {n} steps ({n / wall:.1f}/s) in {wall:.2f} s: "
        f"{own['fwd_bwd_s']:.2f} s in forward+backward, {own['clip_s']:.2f} s clipping, {own['opt_s']:.2f} s in "
        f"optimizer.step() ({NPARAMS} tensors; "
        f"{clip_ops} and {opt_ops} aten ops a clip and a step), {own['item_s']:.2f} s in .item(); the main thread ran "
        f"{main_run} s, waited for a CPU {main_wait} s; "
        + (f"a step's kernels take {gpu_step_s * 1e3:.2f} ms of GPU time queued (GPU busy {gpu_busy / wall:.0%} of the "
           "run)." if gpu_busy is not None else "no GPU timings (no CUDA)."))
sc.write_truth(baseline=(b0, b1), window=None, ratio_spans=((b0, mid), (mid, b1)))
