"""natural_activation_hist_hooks (natural, nothing staged): a CNN trained with forward hooks on every layer that record
its activations' statistics, the way fast.ai's course (part 2, notebook 06_cuda_cnn_hooks_init) writes them and many
"look inside your network" scripts copy them: a Hooks class registers a forward hook on each child of the model
(an nn.Sequential of conv layers), and each call of the hook, while the module is training, appends
outp.data.mean().cpu(), outp.data.std().cpu() and outp.data.cpu().histc(40, 0, 10) to the hook's lists (the notebook's
comment: "histc isn't implemented on the GPU"). So every layer of every forward reads two scalars back (each a
synchronisation: the first waits for the layer's kernels), copies its whole activation to pageable host memory
(megabytes: the GPU idle meanwhile) and makes a 40-bin histogram of it on the CPU (PyTorch's CPU kernel, one thread).
The model: 6 conv layers (conv 3x3, BatchNorm, ReLU; channels 32-64-128-128-256-256, stride 2 at the 2nd, 3rd and
5th), global average pooling, a linear head to 10 classes (the hooks on all 9 children, as Hooks(model, append_stats)
does); batches of 128 CIFAR-size images (3x32x32) drawn from a pool held on the GPU, fp32 without TF32,
cudnn.benchmark, SGD with momentum, loss.item() each step. One process on CPUs 2-3, no threads of its own (PyTorch's
autograd thread runs the backward), no workers, no children, no IO, no lock, no sleep; the shapes never change. 20 s
(smaller with --device cpu: channels 8-16-32-32-64-64, batch 32, 16x16 images; there the fix is nearly the same code
and the copies are no copies).

The script measures itself: the steps per second; the main thread's time in the hooks (`hooks_s`), and in them apart
reading the two scalars back (`sync_s`: .cpu() of the mean and the std, the first waiting for the layer's kernels),
copying the activations to the host (`copy_s`: outp.data.cpu(), the stream idle after the scalars' reads, so the copy
alone; `copy_bytes` a step) and making the histograms on the CPU (`histc_s`, wall and its CPU clock `histc_cpu_s`);
queueing the forward (`forward_s`, the hooks in it), in loss.backward() (`backward_s`: PyTorch's autograd thread
queues the backward while the main thread waits), in the optimiser and in loss.item(); before the run, the same steps
with the same statistics kept on the GPU (mean, std and histc there, appended as GPU tensors, nothing read back: the
fix, `gpu_stats_steps_per_s`), so that what recording them on the CPU costs the run is known (`stats_overhead_s`: the
run's wall time beyond its steps at that rate); the main thread's and the autograd thread's time on a CPU and waiting
for one over the run (their schedstat); the process's minor page faults, the device allocator's cudaMalloc calls and
the caching host allocator's cudaHostAlloc calls; and a step's GPU time queued (common.gpu_seconds_queued: the
forward, the backward and SGD with the hooks removed, nothing read back; the hooks' reductions are a few microseconds
of GPU time each), so that the GPU's busy share is known. Truth `autograd` names PyTorch's autograd thread."""

import os
import resource
import threading
import time
from functools import partial

from common import Scenario, gpu_seconds_queued

sc = Scenario("natural_activation_hist_hooks", "natural", "a CNN trained with fast.ai-style forward hooks on every "
              "layer that append the activation's mean().cpu(), std().cpu() and .cpu().histc(40, 0, 10) each step, "
              "loss.item() each step, 20 s, nothing staged", job_cpus=[2, 3], control=True)
import torch  # noqa: E402

nn = torch.nn
F = nn.functional
PID, MAIN = os.getpid(), threading.get_native_id()
dev = torch.device(sc.device)
if sc.cuda:
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cudnn.benchmark = True
CHANNELS, BATCH, SIZE, POOL = (((32, 64, 128, 128, 256, 256), 128, 32, 8) if sc.cuda
                               else ((8, 16, 32, 32, 64, 64), 32, 16, 4))
STRIDES = (1, 2, 2, 1, 2, 1)
KEYS = ("hooks_s", "sync_s", "copy_s", "histc_s", "histc_cpu_s", "forward_s", "backward_s", "opt_s", "item_s")
own = {"steps": 0, **dict.fromkeys(KEYS, 0.0), "hook_calls": 0, "copy_bytes": 0, "running_loss": 0.0}
mode = {"gpu_stats": False}


def conv_layer(ni: int, nf: int, stride: int) -> nn.Module:
    return nn.Sequential(nn.Conv2d(ni, nf, 3, stride, 1, bias=False), nn.BatchNorm2d(nf), nn.ReLU())


def get_cnn_model(n_classes: int = 10) -> nn.Sequential:
    layers, ni = [], 3
    for nf, s in zip(CHANNELS, STRIDES):
        layers.append(conv_layer(ni, nf, s))
        ni = nf
    return nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(ni, n_classes))


class Hook:
    def __init__(self, m: nn.Module, f) -> None:
        self.hook = m.register_forward_hook(partial(f, self))

    def remove(self) -> None:
        self.hook.remove()

    def __del__(self) -> None:
        self.remove()


class Hooks(list):
    def __init__(self, ms, f) -> None:
        super().__init__([Hook(m, f) for m in ms])

    def remove(self) -> None:
        for h in self:
            h.remove()


def append_stats(hook: Hook, mod: nn.Module, inp, outp: torch.Tensor) -> None:
    """fast.ai's append_stats (as the notebook has it), timed in its parts; in the fix's mode the statistics stay on
    the GPU."""
    t0 = time.perf_counter()
    if not hasattr(hook, "stats"):
        hook.stats = ([], [], [])
    means, stds, hists = hook.stats
    if mod.training:
        if mode["gpu_stats"]:
            means.append(outp.data.mean())
            stds.append(outp.data.std())
            hists.append(outp.data.float().histc(40, 0, 10))
        else:
            means.append(outp.data.mean().cpu())
            stds.append(outp.data.std().cpu())
            t1 = time.perf_counter()
            a = outp.data.cpu()
            t2, c2 = time.perf_counter(), time.thread_time()
            hists.append(a.histc(40, 0, 10))  # histc isn't implemented on the GPU
            t3, c3 = time.perf_counter(), time.thread_time()
            own["sync_s"] += t1 - t0
            own["copy_s"] += t2 - t1
            own["histc_s"] += t3 - t2
            own["histc_cpu_s"] += c3 - c2
            own["copy_bytes"] += a.numel() * a.element_size()
        own["hook_calls"] += 1
    own["hooks_s"] += time.perf_counter() - t0


torch.manual_seed(0)
model = get_cnn_model().to(dev)
opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=5e-4)
xs = torch.randn(POOL, BATCH, 3, SIZE, SIZE, device=dev)
ys = torch.randint(0, 10, (POOL, BATCH), device=dev)
pos = {"i": 0}
hooks = Hooks(model, append_stats)


def step() -> None:
    i = pos["i"] % POOL
    pos["i"] += 1
    t0 = time.perf_counter()
    loss = F.cross_entropy(model(xs[i]), ys[i])  # the hooks run in here, on the main thread
    t1 = time.perf_counter()
    loss.backward()  # queued by PyTorch's autograd thread; the main thread waits for it
    t2 = time.perf_counter()
    opt.step()
    opt.zero_grad(set_to_none=True)
    t3 = time.perf_counter()
    own["running_loss"] += loss.item()
    t4 = time.perf_counter()
    own["forward_s"] += t1 - t0
    own["backward_s"] += t2 - t1
    own["opt_s"] += t3 - t2
    own["item_s"] += t4 - t3
    own["steps"] += 1


def sync() -> None:
    if sc.cuda:
        torch.cuda.synchronize()


def reset() -> None:
    for k in own:
        own[k] = 0 if k in ("steps", "hook_calls", "copy_bytes") else 0.0
    for h in hooks:
        if hasattr(h, "stats"):
            for lst in h.stats:
                lst.clear()


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


for _ in range(10):  # warm-up: cuDNN's algorithms chosen, the allocator, the autograd thread started
    step()
sync()
gpu_step_s = None
if sc.cuda:
    def work(_) -> None:
        """One step's GPU work without the hooks (forward, backward, SGD), nothing read back."""
        F.cross_entropy(model(xs[0]), ys[0]).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    hooks.remove()
    runs = sorted(r for r in (gpu_seconds_queued(torch, work) for _ in range(5)) if r is not None)
    gpu_step_s = runs[len(runs) // 2] if runs else None
    hooks = Hooks(model, append_stats)
# The fix, before the run: the same statistics kept on the GPU.
mode["gpu_stats"] = True
for _ in range(5):
    step()
sync()
reset()
fix_steps, fix_wall = timed(3.0 * sc.scale)
fix = {k: own[k] / max(fix_steps, 1) for k in KEYS}
# As the script has it: the statistics read back and the histograms made on the CPU.
mode["gpu_stats"] = False
timed(2.0 * sc.scale)  # the spin kernels well before the run
ag = autograd_thread()
reset()
main0 = schedstat(MAIN)
ag0 = schedstat(ag["tid"]) if ag else None
f0, (m0, h0) = resource.getrusage(resource.RUSAGE_SELF).ru_minflt, allocs()
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
f1, (m1, h1) = resource.getrusage(resource.RUSAGE_SELF).ru_minflt, allocs()
n = own["steps"]


def share(v: float | None) -> float | None:
    return round(v / wall, 4) if v is not None else None


def ms(v: float) -> float:
    return round(v * 1e3, 4)


fix_rate = fix_steps / fix_wall if fix_wall > 0 else None
at_fix_rate = n / fix_rate if fix_rate else None
overhead = max(0.0, wall - at_fix_rate) if at_fix_rate is not None else None
hooks_rest = max(0.0, own["hooks_s"] - own["sync_s"] - own["copy_s"] - own["histc_s"])
issue = max(0.0, own["forward_s"] - own["hooks_s"]) + own["opt_s"]
main_run = round(main1[0] - main0[0], 4) if main0 and main1 else None
main_wait = round(main1[1] - main0[1], 4) if main0 and main1 else None
ag_run = round(ag1[0] - ag0[0], 4) if ag0 and ag1 else None
ag_wait = round(ag1[1] - ag0[1], 4) if ag0 and ag1 else None
gpu_busy = n * gpu_step_s if gpu_step_s is not None else None
sc.extra["autograd"] = ag
sc.extra["self"] = {**{k: round(v, 4) if isinstance(v, float) else v for k, v in own.items()},
                    "wall_s": round(wall, 4), "steps_per_s": round(n / wall, 2), "step_ms_mean": ms(wall / max(n, 1)),
                    "hooks_share": share(own["hooks_s"]), "sync_share": share(own["sync_s"]),
                    "copy_share": share(own["copy_s"]), "histc_share": share(own["histc_s"]),
                    "histc_cpu_share": share(own["histc_cpu_s"]), "hooks_rest_s": round(hooks_rest, 4),
                    "issue_s": round(issue, 4), "issue_share": share(issue),
                    "forward_share": share(own["forward_s"]), "backward_share": share(own["backward_s"]),
                    "item_share": share(own["item_s"]),
                    "hook_calls_per_step": round(own["hook_calls"] / max(n, 1), 2),
                    "syncs_per_step": round(2 * own["hook_calls"] / max(n, 1) + 1, 2),
                    "copy_mb_per_step": round(own["copy_bytes"] / max(n, 1) / 1e6, 3),
                    "copy_gb_per_s": round(own["copy_bytes"] / own["copy_s"] / 1e9, 3) if own["copy_s"] else None,
                    "gpu_stats_steps": fix_steps, "gpu_stats_wall_s": round(fix_wall, 4),
                    "gpu_stats_steps_per_s": round(fix_rate, 2) if fix_rate else None,
                    **{f"gpu_stats_{k.removesuffix('_s')}_ms": ms(v) for k, v in fix.items()},
                    "at_gpu_stats_rate_s": round(at_fix_rate, 4) if at_fix_rate is not None else None,
                    "stats_overhead_s": round(overhead, 4) if overhead is not None else None,
                    "stats_overhead_share": share(overhead),
                    "main_run_s": main_run, "main_cpu_share": share(main_run),
                    "main_cpu_wait_s": main_wait, "main_cpu_wait_share": share(main_wait),
                    "autograd_run_s": ag_run, "autograd_cpu_share": share(ag_run),
                    "autograd_cpu_wait_s": ag_wait, "autograd_cpu_wait_share": share(ag_wait),
                    "minor_faults_per_s": round((f1 - f0) / wall, 1), "cuda_mallocs_per_s": round((m1 - m0) / wall, 3),
                    "host_allocs_per_s": round((h1 - h0) / wall, 3) if h0 is not None and h1 is not None else None,
                    "gpu_step_ms": ms(gpu_step_s) if gpu_step_s is not None else None,
                    "gpu_busy_s": round(gpu_busy, 4) if gpu_busy is not None else None,
                    "gpu_busy_share": share(gpu_busy), "batch": BATCH, "image": [3, SIZE, SIZE],
                    "channels": list(CHANNELS), "hooked_modules": len(hooks),
                    "intra_op_threads": torch.get_num_threads()}
if not sc.cuda:
    sc.note("on the CPU: the copies are no copies and the reads no synchronisations, the fix differs only in leaving "
            "the scalars as tensors, no autograd thread (the backward runs on the main thread), no GPU timings, no "
            "allocator counters.")
sc.note(f"natural: measured by the script: {n} steps ({n / wall:.1f}/s) in {wall:.2f} s: {own['hooks_s']:.2f} s in "
        f"the hooks ({own['sync_s']:.2f} s reading means and stds back, {own['copy_s']:.2f} s copying "
        f"{own['copy_bytes'] / max(n, 1) / 1e6:.1f} MB a step to the host, {own['histc_s']:.2f} s in histc on the CPU, "
        f"{own['histc_cpu_s']:.2f} s of CPU), {issue:.2f} s queueing the rest, {own['backward_s']:.2f} s in "
        f"backward(), {own['item_s']:.2f} s in .item(); with the statistics on the device "
        f"{fix_rate and round(fix_rate, 1)} steps/s (recording them on the CPU cost "
        f"{overhead and round(overhead, 2)} s of the run); the main thread ran {main_run} s, waited for a CPU "
        f"{main_wait} s; the autograd thread {(ag or {}).get('comm')} ran {ag_run} s; "
        + (f"a step's kernels take {gpu_step_s * 1e3:.2f} ms of GPU time queued (GPU busy {gpu_busy / wall:.0%} of the "
           "run)." if gpu_busy is not None else "no GPU timings (no CUDA)."))
sc.write_truth(baseline=(b0, b1), window=None, ratio_spans=((b0, mid), (mid, b1)))
