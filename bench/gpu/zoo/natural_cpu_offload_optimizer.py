"""natural_cpu_offload_optimizer (natural, nothing staged): a hand-rolled ZeRO-offload: the model trains on the GPU but
its optimiser lives on the CPU, as a user short of GPU memory writes it after reading about DeepSpeed's CPU offload.
The zoo's MLP (512-2048-2048-2048-10, fp32 without TF32, ~9.4 M parameters) on the GPU, batches already there; an fp32
master copy of its parameters and their AdamW state (torch.optim.AdamW over the master copies: PyTorch's default CPU
implementation, its default intra-op threads) in CPU memory, the master copies and the gradient buffers pinned once at
the start. Each step: forward and backward on the GPU; each parameter's gradient copied to its pinned CPU buffer
(copy_(non_blocking=True)); the stream synchronised (the gradients are on the host); the loss read (.item()); the AdamW
step on the CPU tensors; the updated master copies copied back into the GPU model (copy_(non_blocking=True), from
pinned memory: the next forward queues behind them). CPUs 2-3, 20 s.

The script measures itself: the steps per second; the main thread's time launching the forward and backward, launching
the gradient copies, waiting in the synchronisation (for the GPU's forward, backward and copies), in .item(), in the
CPU optimiser step (wall and its CPU clock), launching the copies back; the copies' GPU time (CUDA events, each step);
a step's GPU time queued (forward, backward and both copies, common.gpu_seconds_queued), so that the GPU's busy share
is known; the process's CPU time (every thread: the optimiser's intra-op threads too), the main thread's time on a CPU
and waiting for one over the run (/proc/thread-self/schedstat), the minor page faults (getrusage), and the device
allocator's cudaMalloc calls (segment.all.allocated)."""

import os
import resource
import time

from common import Scenario, Trainer, gpu_seconds_queued

sc = Scenario("natural_cpu_offload_optimizer", "natural", "the MLP on the GPU with its AdamW step on the CPU "
              "(gradients copied to pinned buffers, the master copies updated by torch's CPU AdamW and copied back), "
              "20 s, nothing staged", job_cpus=[2, 3], control=True)
tr = Trainer(sc)
torch = tr.torch
model, loss_fn, dev = tr.model, tr.loss_fn, tr.dev
PIN = sc.cuda  # a CPU-only torch has no pinned memory


class OffloadedAdamW:
    """AdamW whose state and fp32 master parameters live on the CPU: grads down, a CPU step, parameters back up."""

    def __init__(self, module: torch.nn.Module, **kwargs) -> None:
        self.params = [p for p in module.parameters() if p.requires_grad]
        self.masters = [p.detach().to("cpu", copy=True) for p in self.params]
        if PIN:
            self.masters = [m.pin_memory() for m in self.masters]
        for m in self.masters:
            m.grad = torch.empty(m.shape, dtype=m.dtype, pin_memory=PIN)
        self.cpu_opt = torch.optim.AdamW(self.masters, **kwargs)

    def grads_to_host(self) -> None:
        for p, m in zip(self.params, self.masters):
            m.grad.copy_(p.grad, non_blocking=True)

    def step(self) -> None:
        self.cpu_opt.step()

    @torch.no_grad()
    def params_to_device(self) -> None:
        for p, m in zip(self.params, self.masters):
            p.copy_(m, non_blocking=True)


offload = OffloadedAdamW(model, lr=1e-4, weight_decay=0.01)
own = {"steps": 0, "fwd_bwd_launch_s": 0.0, "grad_copy_launch_s": 0.0, "sync_wait_s": 0.0, "item_s": 0.0,
       "cpu_opt_s": 0.0, "cpu_opt_cpu_s": 0.0, "param_copy_launch_s": 0.0}
copies = {"d2h_s": 0.0, "h2d_s": 0.0, "n_d2h": 0, "n_h2d": 0}
pending_h2d: list = []


def event_pair() -> tuple:
    return torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)


def step() -> None:
    x, y = tr.xs[tr.i % len(tr.xs)], tr.ys[tr.i % len(tr.ys)]
    tr.i += 1
    t0 = time.perf_counter()
    loss = loss_fn(model(x), y)
    loss.backward()
    t1 = time.perf_counter()
    if sc.cuda:
        d0, d1 = event_pair()
        d0.record()
    offload.grads_to_host()
    if sc.cuda:
        d1.record()
    t2 = time.perf_counter()
    if sc.cuda:
        torch.cuda.current_stream().synchronize()
    t3 = time.perf_counter()
    loss.item()
    t4, c4 = time.perf_counter(), time.thread_time()
    offload.step()
    t5, c5 = time.perf_counter(), time.thread_time()
    if sc.cuda:
        copies["d2h_s"] += d0.elapsed_time(d1) / 1e3
        copies["n_d2h"] += 1
        for h0, h1 in pending_h2d:  # the last step's copies back: done before this step's forward ran
            copies["h2d_s"] += h0.elapsed_time(h1) / 1e3
            copies["n_h2d"] += 1
        pending_h2d.clear()
        h0, h1 = event_pair()
        h0.record()
    offload.params_to_device()
    if sc.cuda:
        h1.record()
        pending_h2d.append((h0, h1))
    model.zero_grad(set_to_none=True)
    t6 = time.perf_counter()
    own["steps"] += 1
    own["fwd_bwd_launch_s"] += t1 - t0
    own["grad_copy_launch_s"] += t2 - t1
    own["sync_wait_s"] += t3 - t2
    own["item_s"] += t4 - t3
    own["cpu_opt_s"] += t5 - t4
    own["cpu_opt_cpu_s"] += c5 - c4
    own["param_copy_launch_s"] += t6 - t5


def schedstat() -> tuple[float, float | None]:
    """The calling thread's time on a CPU and waiting on a run queue (s), from the kernel's schedstat; where that is
    not kept, the thread's CPU clock and None."""
    try:
        with open("/proc/thread-self/schedstat") as fh:
            run_ns, wait_ns = fh.read().split()[:2]
        return int(run_ns) / 1e9, int(wait_ns) / 1e9
    except (OSError, ValueError):
        return time.thread_time(), None


def device_mallocs() -> int:
    return int(torch.cuda.memory_stats().get("segment.all.allocated", 0)) if sc.cuda else 0


for _ in range(10):  # warm-up: the allocators, cuBLAS, the optimiser's state
    step()
tr.sync()
gpu_step_s = None
if sc.cuda:
    def work(_) -> None:
        """One step's GPU work: forward, backward, the gradients down and the parameters up, nothing waited for."""
        loss_fn(model(tr.xs[0]), tr.ys[0]).backward()
        offload.grads_to_host()
        offload.params_to_device()
        model.zero_grad(set_to_none=True)

    runs = sorted(r for r in (gpu_seconds_queued(torch, work) for _ in range(5)) if r is not None)
    gpu_step_s = runs[len(runs) // 2] if runs else None
warm_end = time.perf_counter() + 2.0 * sc.scale  # the spin kernels well before the baseline
while time.perf_counter() < warm_end:
    step()
tr.sync()
for k in own:
    own[k] = 0 if k == "steps" else 0.0
copies.update(d2h_s=0.0, h2d_s=0.0, n_d2h=0, n_h2d=0)
pending_h2d.clear()
m0 = device_mallocs()
f0, ft0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt, resource.getrusage(resource.RUSAGE_THREAD).ru_minflt
p0 = os.times()
run0, wait0 = schedstat()
b0 = sc.mark("baseline")
t = time.perf_counter()
sc.run_for(10.0 * sc.scale, step)
mid = sc.mark("half")
sc.run_for(10.0 * sc.scale, step)
tr.sync()
b1 = sc.mark("end")
wall = time.perf_counter() - t
run1, wait1 = schedstat()
p1 = os.times()
f1, ft1 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt, resource.getrusage(resource.RUSAGE_THREAD).ru_minflt
m1 = device_mallocs()
n = own["steps"]
gpu_busy = n * gpu_step_s if gpu_step_s is not None else None
process_cpu = (p1.user - p0.user) + (p1.system - p0.system)
shares = {f"{k.removesuffix('_s')}_share": round(own[k] / wall, 4) for k in own if k.endswith("_s")}
sc.extra["self"] = {**{k: round(v, 4) for k, v in own.items()}, **shares, "wall_s": round(wall, 4),
                    "steps_per_s": round(n / wall, 2), "step_ms_mean": round(wall / max(n, 1) * 1e3, 4),
                    "d2h_gpu_ms": round(copies["d2h_s"] / copies["n_d2h"] * 1e3, 4) if copies["n_d2h"] else None,
                    "h2d_gpu_ms": round(copies["h2d_s"] / copies["n_h2d"] * 1e3, 4) if copies["n_h2d"] else None,
                    "gpu_step_ms": round(gpu_step_s * 1e3, 4) if gpu_step_s is not None else None,
                    "gpu_busy_s": round(gpu_busy, 4) if gpu_busy is not None else None,
                    "gpu_busy_share": round(gpu_busy / wall, 4) if gpu_busy is not None else None,
                    "main_cpu_share": round((run1 - run0) / wall, 4),
                    "main_cpu_wait_share": round((wait1 - wait0) / wall, 4) if wait0 is not None else None,
                    "process_cpu_s": round(process_cpu, 4), "process_cpus_busy": round(process_cpu / wall, 4),
                    "minor_faults": f1 - f0, "minor_faults_per_s": round((f1 - f0) / wall, 1),
                    "main_minor_faults": ft1 - ft0, "cuda_mallocs": m1 - m0,
                    "cuda_mallocs_per_s": round((m1 - m0) / wall, 3), "intra_op_threads": torch.get_num_threads(),
                    "params_m": round(sum(p.numel() for p in offload.params) / 1e6, 3),
                    "param_mb": round(sum(p.numel() for p in offload.params) * 4 / 2 ** 20, 2), "batch": tr.batch}
if not sc.cuda:
    sc.note("no pinned memory, CUDA events or allocator counters: no CUDA.")
sc.note(f"natural: measured by the script: {n} steps ({n / wall:.1f}/s) in {wall:.2f} s: {own['cpu_opt_s']:.2f} s in "
        f"the CPU AdamW step ({own['cpu_opt_cpu_s']:.2f} s of the main thread's CPU, {torch.get_num_threads()} "
        f"intra-op threads), {own['sync_wait_s']:.2f} s waiting for the GPU's gradients, "
        f"{own['fwd_bwd_launch_s']:.2f} s launching forward and backward, "
        f"{own['grad_copy_launch_s'] + own['param_copy_launch_s']:.2f} s launching the copies; "
        + (f"a step's kernels and copies take {gpu_step_s * 1e3:.2f} ms of GPU time queued (GPU busy "
           f"{gpu_busy / wall:.0%} of the run)." if gpu_busy is not None else "no GPU timings (no CUDA)."))
sc.write_truth(baseline=(b0, b1), window=None, ratio_spans=((b0, mid), (mid, b1)))
