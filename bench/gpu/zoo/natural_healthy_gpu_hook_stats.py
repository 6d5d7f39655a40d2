"""natural_healthy_gpu_hook_stats (natural, nothing staged; a control): a GPU-bound ResNet-style image classifier with a
decoy that looks like trouble: forward hooks on every module of the network recording its activations' statistics each
step, the way a "monitor your activations" script registers them (module.register_forward_hook on each convolution,
BatchNorm, block and the head: 49 hooks), but written to stay on the GPU: each hook adds the activation's mean, its mean
square and a 40-bin torch.histc(0, 10) (on the GPU, a range given so that it needs no min/max read back) into
accumulators preallocated on the GPU, with no .item(), no .cpu() and no Python branch on a value; every 2 s the main
thread reads the accumulators back in one small copy (a [49, 42] tensor: one synchronisation), prints a summary line and
zeroes them. Per step the hooks add a few hundred small kernels and a few milliseconds of the main thread's Python,
queued behind tens of milliseconds of convolutions: the GPU never waits for them. The model: a ResNet-18-style net (a
3x3 stem, BasicBlocks 64-128-256-512, two each, BatchNorm, global average pooling, 100 classes) on batches of 256 images
(3x64x64) drawn from a pool held on the GPU, fp32 without TF32, cudnn.benchmark, SGD with momentum and Nesterov, a
OneCycleLR schedule, loss.item() each step for the running loss. One process on CPUs 2-3, no threads of its own
(PyTorch's autograd thread runs the backward), no workers, no children, no IO but the print, no lock, no sleep; the
shapes never change. 20 s (smaller with --device cpu: channels 8-16-32-64, batch 16, 16x16 images).

The script measures itself: the steps per second; the main thread's time queueing the forward (`forward_s`, the hooks'
Python in it) and in the hooks apart (`hooks_s`), in loss.backward() (`backward_s`: PyTorch's autograd thread queues the
backward while the main thread waits), in the optimiser and schedule, in loss.item() (its wait for the GPU each step)
and in the periodic read-backs (`readback_s`, their count `readbacks`); whether one step with the hooks ran under
torch.cuda.set_sync_debug_mode("error") without a synchronisation (`hooks_sync_free`); the main thread's and the
autograd thread's time on a CPU and waiting for one over the run (their schedstat); the process's minor page faults, the
device allocator's cudaMalloc calls and the caching host allocator's cudaHostAlloc calls; and a step's GPU time queued
(common.gpu_seconds_queued, in two parts so that neither fills the launch queue: the forward with its hooks, then the
backward and SGD; nothing read back), so that the GPU's busy share is known; and, before the run, the same steps with
the hooks removed (`no_hooks_steps_per_s`), so that what the hooks cost is known (`hooks_overhead_s`, which a GPU-bound
job keeps near zero). Truth `autograd` names PyTorch's autograd thread."""

import os
import resource
import threading
import time

from common import Scenario, gpu_seconds_queued

sc = Scenario("natural_healthy_gpu_hook_stats", "natural", "a GPU-bound ResNet-style classifier with forward hooks on "
              "every module accumulating activation statistics (mean, mean square, histc) on the GPU, read back every "
              "2 s, loss.item() each step, 20 s, nothing staged: a control", job_cpus=[2, 3], control=True)
import torch  # noqa: E402

nn = torch.nn
F = nn.functional
PID, MAIN = os.getpid(), threading.get_native_id()
dev = torch.device(sc.device)
if sc.cuda:
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cudnn.benchmark = True
WIDTHS, BATCH, SIZE, POOL, CLASSES = (((64, 128, 256, 512), 256, 64, 4, 100) if sc.cuda
                                      else ((8, 16, 32, 64), 16, 16, 4, 100))
BINS, READ_EVERY_S = 40, 2.0
KEYS = ("forward_s", "hooks_s", "backward_s", "opt_s", "item_s", "readback_s")
own = {"steps": 0, **dict.fromkeys(KEYS, 0.0), "readbacks": 0, "hook_calls": 0, "running_loss": 0.0}


class BasicBlock(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.relu = nn.ReLU()
        self.short = (nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))
                      if stride != 1 or cin != cout else nn.Identity())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.relu(self.bn1(self.conv1(x)))
        return self.relu(self.bn2(self.conv2(out)) + self.short(x))


class ResNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, WIDTHS[0], 3, 1, 1, bias=False), nn.BatchNorm2d(WIDTHS[0]), nn.ReLU())
        blocks, cin = [], WIDTHS[0]
        for k, cout in enumerate(WIDTHS):
            blocks += [BasicBlock(cin, cout, 1 if k == 0 else 2), BasicBlock(cout, cout, 1)]
            cin = cout
        self.blocks = nn.Sequential(*blocks)
        self.fc = nn.Linear(cin, CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.blocks(self.stem(x)).mean(dim=(2, 3)))


torch.manual_seed(0)
model = ResNet().to(dev)
# The monitored modules: every conv, BatchNorm and block (not the containers, identities or the ReLUs, which
# are shared within a block).
watched = [(name, m) for name, m in model.named_modules()
           if isinstance(m, (nn.Conv2d, nn.BatchNorm2d, BasicBlock, nn.Linear))]
acc = torch.zeros(len(watched), 2 + BINS, device=dev)  # per module: sum of means, sum of mean squares, histogram
state = {"on": True}


def make_hook(k: int):
    def hook(mod: nn.Module, inp, out: torch.Tensor) -> None:
        if not (state["on"] and mod.training):
            return
        t0 = time.perf_counter()
        o = out.detach()
        acc[k, 0] += o.mean()
        acc[k, 1] += o.pow(2).mean()
        acc[k, 2:] += o.float().histc(BINS, 0, 10)
        own["hook_calls"] += 1
        own["hooks_s"] += time.perf_counter() - t0

    return hook


handles = [m.register_forward_hook(make_hook(k)) for k, (_, m) in enumerate(watched)]
xs = torch.randn(POOL, BATCH, 3, SIZE, SIZE, device=dev)
ys = torch.randint(0, CLASSES, (POOL, BATCH), device=dev)
opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, nesterov=True, weight_decay=5e-4)
sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=0.1, total_steps=1_000_000)
pos = {"i": 0, "last_read": time.perf_counter(), "steps_since": 0}


def read_back() -> None:
    """The periodic summary: one small copy of the accumulators, a printed line, the accumulators zeroed."""
    t0 = time.perf_counter()
    stats = acc.cpu()
    acc.zero_()
    k = max(pos["steps_since"], 1)
    means = stats[:, 0] / k
    rms = (stats[:, 1] / k).sqrt()
    dead = stats[:, 2] / stats[:, 2:].sum(1).clamp_min(1)
    print(f"[stats] {k} steps: mean act {means.mean():.3f}, rms {rms.mean():.3f}, "
          f"share in the first bin {dead.mean():.2%}", flush=True)
    pos["steps_since"] = 0
    own["readback_s"] += time.perf_counter() - t0
    own["readbacks"] += 1


def step() -> None:
    i = pos["i"] % POOL
    pos["i"] += 1
    t0 = time.perf_counter()
    loss = F.cross_entropy(model(xs[i]), ys[i])  # the hooks queue their kernels in here
    t1 = time.perf_counter()
    loss.backward()  # queued by PyTorch's autograd thread; the main thread waits for it
    t2 = time.perf_counter()
    opt.step()
    opt.zero_grad(set_to_none=True)
    sched.step()
    t3 = time.perf_counter()
    own["running_loss"] += loss.item()
    t4 = time.perf_counter()
    own["forward_s"] += t1 - t0
    own["backward_s"] += t2 - t1
    own["opt_s"] += t3 - t2
    own["item_s"] += t4 - t3
    own["steps"] += 1
    pos["steps_since"] += 1
    if state["on"] and t4 - pos["last_read"] >= READ_EVERY_S * (sc.scale if sc.smoke else 1.0):
        pos["last_read"] = t4
        read_back()


def sync() -> None:
    if sc.cuda:
        torch.cuda.synchronize()


def reset() -> None:
    for k in own:
        own[k] = 0 if k in ("steps", "readbacks", "hook_calls") else 0.0


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


def timed(seconds: float) -> tuple[int, float]:
    """Steps back to back for `seconds` (then synchronised): (steps, wall)."""
    n0, t = own["steps"], time.perf_counter()
    end = t + seconds
    while time.perf_counter() < end:
        step()
    sync()
    return own["steps"] - n0, time.perf_counter() - t


for _ in range(5):  # warm-up: cuDNN's algorithms chosen, the allocator, the autograd thread started
    step()
sync()
hooks_sync_free = None
if sc.cuda:
    # One step's forward and backward with the hooks, any synchronisation an error (then the run goes on as written).
    torch.cuda.set_sync_debug_mode("error")
    try:
        F.cross_entropy(model(xs[0]), ys[0]).backward()
        hooks_sync_free = True
    except RuntimeError:
        hooks_sync_free = False
    finally:
        torch.cuda.set_sync_debug_mode("default")
    opt.zero_grad(set_to_none=True)
    sync()
gpu_step_s = gpu_fwd_s = gpu_bwd_s = None


def median_gpu_s(work, prepare=None) -> float | None:
    runs = sorted(r for r in (gpu_seconds_queued(torch, work, prepare) for _ in range(5)) if r is not None)
    return runs[len(runs) // 2] if runs else None


def fixed_loss() -> torch.Tensor:
    return F.cross_entropy(model(xs[0]), ys[0])


def backward_opt(loss: torch.Tensor) -> None:
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)


if sc.cuda:
    # A step's GPU work with the hooks, measured in two parts so that neither fills the launch queue: the forward and
    # its hooks' kernels, then the backward with SGD (its forward run first, untimed); nothing read back.
    gpu_fwd_s = median_gpu_s(lambda _: fixed_loss())
    gpu_bwd_s = median_gpu_s(backward_opt, fixed_loss)
    gpu_step_s = gpu_fwd_s + gpu_bwd_s if None not in (gpu_fwd_s, gpu_bwd_s) else None
    opt.zero_grad(set_to_none=True)
# Before the run: the same steps with the hooks off (what the hooks cost).
state["on"] = False
for _ in range(2):
    step()
sync()
reset()
plain_steps, plain_wall = timed(3.0 * sc.scale)
acc.zero_()
state["on"] = True
timed(2.0 * sc.scale)  # the spin kernels well before the run
ag = autograd_thread()
reset()
pos["last_read"], pos["steps_since"] = time.perf_counter(), 0
acc.zero_()
main0 = schedstat(MAIN)
ag0 = schedstat(ag["tid"]) if ag else None
r0, (m0, h0) = resource.getrusage(resource.RUSAGE_SELF), allocs()
b0 = sc.mark("baseline")
t = time.perf_counter()
sc.run_for(10.0 * sc.scale, step)
mid = sc.mark("half")
sc.run_for(10.0 * sc.scale, step)
sync()
b1 = sc.mark("end")
wall = time.perf_counter() - t
main1 = schedstat(MAIN)
ag1 = schedstat(ag["tid"]) if ag else None
r1, (m1, h1) = resource.getrusage(resource.RUSAGE_SELF), allocs()
n = own["steps"]


def share(v: float | None) -> float | None:
    return round(v / wall, 4) if v is not None else None


def ms(v: float) -> float:
    return round(v * 1e3, 4)


plain_rate = plain_steps / plain_wall if plain_wall > 0 else None
at_plain_rate = n / plain_rate if plain_rate else None
overhead = max(0.0, wall - at_plain_rate) if at_plain_rate is not None else None
main_run = round(main1[0] - main0[0], 4) if main0 and main1 else None
main_wait = round(main1[1] - main0[1], 4) if main0 and main1 else None
main_asleep = (round(max(0.0, wall - main_run - main_wait), 4) if main_run is not None and main_wait is not None
               else None)
ag_run = round(ag1[0] - ag0[0], 4) if ag0 and ag1 else None
ag_wait = round(ag1[1] - ag0[1], 4) if ag0 and ag1 else None
gpu_busy = n * gpu_step_s if gpu_step_s is not None else None
sc.extra["autograd"] = ag
sc.extra["self"] = {**{k: round(v, 4) if isinstance(v, float) else v for k, v in own.items()},
                    "wall_s": round(wall, 4), "steps_per_s": round(n / wall, 2), "step_ms_mean": ms(wall / max(n, 1)),
                    "forward_share": share(own["forward_s"]), "hooks_share": share(own["hooks_s"]),
                    "backward_share": share(own["backward_s"]), "opt_share": share(own["opt_s"]),
                    "item_share": share(own["item_s"]), "readback_share": share(own["readback_s"]),
                    "hook_calls_per_step": round(own["hook_calls"] / max(n, 1), 2),
                    "hooks_ms_mean": ms(own["hooks_s"] / max(n, 1)), "hooked_modules": len(watched),
                    "hooks_sync_free": hooks_sync_free,
                    "no_hooks_steps": plain_steps, "no_hooks_wall_s": round(plain_wall, 4),
                    "no_hooks_steps_per_s": round(plain_rate, 2) if plain_rate else None,
                    "hooks_overhead_s": round(overhead, 4) if overhead is not None else None,
                    "hooks_overhead_share": share(overhead),
                    "main_run_s": main_run, "main_cpu_share": share(main_run),
                    "main_cpu_wait_s": main_wait, "main_cpu_wait_share": share(main_wait),
                    "main_asleep_s": main_asleep, "main_asleep_share": share(main_asleep),
                    "autograd_run_s": ag_run, "autograd_cpu_share": share(ag_run),
                    "autograd_cpu_wait_s": ag_wait, "autograd_cpu_wait_share": share(ag_wait),
                    "minor_faults_per_s": round((r1.ru_minflt - r0.ru_minflt) / wall, 1),
                    "cuda_mallocs_per_s": round((m1 - m0) / wall, 3),
                    "major_faults": r1.ru_majflt - r0.ru_majflt,
                    "host_allocs_per_s": round((h1 - h0) / wall, 3) if h0 is not None and h1 is not None else None,
                    "gpu_forward_ms": ms(gpu_fwd_s) if gpu_fwd_s is not None else None,
                    "gpu_backward_opt_ms": ms(gpu_bwd_s) if gpu_bwd_s is not None else None,
                    "gpu_step_ms": ms(gpu_step_s) if gpu_step_s is not None else None,
                    "gpu_busy_s": round(gpu_busy, 4) if gpu_busy is not None else None,
                    "gpu_busy_share": share(gpu_busy), "batch": BATCH, "image": [3, SIZE, SIZE],
                    "widths": list(WIDTHS), "intra_op_threads": torch.get_num_threads()}
if not sc.cuda:
    sc.note("on the CPU: no autograd thread (the backward runs on the main thread), no GPU timings, no allocator "
            "counters, no sync check.")
sc.note(f"natural, a control: measured by the script: {n} steps ({n / wall:.1f}/s) in {wall:.2f} s: "
        f"{own['forward_s']:.2f} s queueing forwards ({own['hooks_s']:.2f} s of it in {len(watched)} hooks), "
        f"{own['backward_s']:.2f} s in backward(), {own['opt_s']:.2f} s in the optimiser, {own['item_s']:.2f} s in "
        f".item(), {own['readback_s']:.2f} s in {own['readbacks']} read-backs; without the hooks "
        f"{plain_rate and round(plain_rate, 1)} steps/s (the hooks cost {overhead and round(overhead, 2)} s of the "
        f"run); the hooks synchronise: {not hooks_sync_free if hooks_sync_free is not None else 'not checked'}; the "
        f"main thread ran {main_run} s, waited for a CPU {main_wait} s; the autograd thread "
        f"{(ag or {}).get('comm')} ran {ag_run} s; "
        + (f"a step's kernels take {gpu_step_s * 1e3:.2f} ms of GPU time queued (GPU busy {gpu_busy / wall:.0%} of the "
           "run)." if gpu_busy is not None else "no GPU timings (no CUDA)."))
sc.write_truth(baseline=(b0, b1), window=None, ratio_spans=((b0, mid), (mid, b1)))
