"""natural_pinned_alloc_per_step (natural, nothing staged): a training loop that makes each batch on the CPU and
stages it in a freshly allocated pinned buffer every step, as a user who has read "pin your memory, copy with
non_blocking=True" writes it: a dataset of 100,000 samples of 512 uint8 features and their labels in CPU memory; each
step draws 8192 random indices (torch.randint on the CPU), gathers the rows (index_select), converts them to float32
and normalises them with per-feature means and scales (sub_, mul_: torch's CPU ops, its default intra-op threads),
then allocates a pinned buffer for them (torch.empty(..., pin_memory=True): PyTorch's caching host allocator, which
calls cudaHostAlloc only when no freed block fits) and copies the batch into it, pins the labels the same way
(.pin_memory()), and copies both to the GPU with .to(dev, non_blocking=True); the zoo's MLP (512-2048-2048-2048-10,
fp32 without TF32, fused AdamW) trains on them; the loss is read back with .item() every 10 steps (the host otherwise
runs ahead of the GPU, one batch's copy in flight while it makes the next). CPUs 2-3, 20 s.

The script measures itself: the steps per second; the main thread's time making the batch (wall and its CPU clock),
in the pinned allocations, in the copy into the pinned buffer (wall and CPU), launching the copies and the training,
in .item(); the host-to-device copies' GPU time (CUDA events around them, each step); a step's GPU time queued (the
copy from a pinned buffer and the training, common.gpu_seconds_queued), so that the GPU's busy share is known; the
caching host allocator's counters over the run (torch.cuda.host_memory_stats(): num_host_alloc is its cudaHostAlloc
calls, host_alloc_time their time, active_requests.allocated the pinned blocks handed out), the device allocator's
cudaMalloc calls (segment.all.allocated), the process's and the main thread's minor page faults (getrusage), and the
main thread's time on a CPU and waiting for one over the run (/proc/thread-self/schedstat)."""

import resource
import time

from common import Scenario, Trainer, gpu_seconds_queued

sc = Scenario("natural_pinned_alloc_per_step", "natural", "the MLP fed batches made on the CPU (gather, to float, "
              "normalise), each staged in a freshly allocated pinned buffer and copied non_blocking, loss.item() "
              "every 10 steps, 20 s, nothing staged", job_cpus=[2, 3], control=True)
tr = Trainer(sc, nbatches=1)
torch = tr.torch
model, opt, loss_fn, dev = tr.model, tr.opt, tr.loss_fn, tr.dev
PIN = sc.cuda  # a CPU-only torch has no pinned memory
N = 100_000 if sc.cuda else 5_000
B, D = tr.batch, tr.in_dim
LOG_EVERY = 10
HOST_COUNTERS = ("num_host_alloc", "num_host_free", "host_alloc_time.total", "active_requests.allocated")

gen = torch.Generator().manual_seed(0)
data = torch.randint(0, 256, (N, D), dtype=torch.uint8, generator=gen)
labels = torch.randint(0, 10, (N,), generator=gen)
mean = data[:10_000].float().mean(0)
inv_std = 1.0 / data[:10_000].float().std(0).clamp_min(1.0)
own = {"steps": 0, "make_s": 0.0, "make_cpu_s": 0.0, "alloc_s": 0.0, "alloc_cpu_s": 0.0, "stage_s": 0.0,
       "stage_cpu_s": 0.0, "copy_launch_s": 0.0, "train_launch_s": 0.0, "item_s": 0.0, "items": 0}
copy_events: list = []  # (start, end) CUDA events around each step's copies, read after each .item()
copy_gpu = {"s": 0.0, "n": 0}


def make_batch() -> tuple:
    idx = torch.randint(0, N, (B,), generator=gen)
    x = data.index_select(0, idx).float().sub_(mean).mul_(inv_std)
    return x, labels.index_select(0, idx)


def read_copy_events() -> None:
    for e0, e1 in copy_events:
        copy_gpu["s"] += e0.elapsed_time(e1) / 1e3
        copy_gpu["n"] += 1
    copy_events.clear()


def step() -> None:
    t0, c0 = time.perf_counter(), time.thread_time()
    x, y = make_batch()
    t1, c1 = time.perf_counter(), time.thread_time()
    xp = torch.empty(x.shape, dtype=x.dtype, pin_memory=PIN)
    t2, c2 = time.perf_counter(), time.thread_time()
    xp.copy_(x)
    yp = y.pin_memory() if PIN else y
    t3, c3 = time.perf_counter(), time.thread_time()
    if sc.cuda:
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
    xg, yg = xp.to(dev, non_blocking=True), yp.to(dev, non_blocking=True)
    if sc.cuda:
        e1.record()
        copy_events.append((e0, e1))
    t4 = time.perf_counter()
    loss = loss_fn(model(xg), yg)
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    t5 = t6 = time.perf_counter()
    own["steps"] += 1
    if own["steps"] % LOG_EVERY == 0:
        loss.item()
        t6 = time.perf_counter()
        own["items"] += 1
        read_copy_events()
    own["make_s"] += t1 - t0
    own["make_cpu_s"] += c1 - c0
    own["alloc_s"] += t2 - t1
    own["stage_s"] += t3 - t2
    own["alloc_cpu_s"] += c2 - c1
    own["stage_cpu_s"] += c3 - c2
    own["copy_launch_s"] += t4 - t3
    own["train_launch_s"] += t5 - t4
    own["item_s"] += t6 - t5


def host_counters() -> dict | None:
    if not sc.cuda or not hasattr(torch.cuda, "host_memory_stats"):
        return None
    try:
        stats = torch.cuda.host_memory_stats()
    except RuntimeError:  # a PyTorch whose host allocator keeps no statistics
        return None
    return {k: stats.get(k, 0) for k in HOST_COUNTERS}


def device_mallocs() -> int:
    return int(torch.cuda.memory_stats().get("segment.all.allocated", 0)) if sc.cuda else 0


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
    for k in own:
        own[k] = 0 if k in ("steps", "items") else 0.0
    copy_events.clear()
    copy_gpu.update(s=0.0, n=0)


for _ in range(3 * LOG_EVERY):  # warm-up: the allocators, cuBLAS
    step()
tr.sync()
gpu_step_s = None
if sc.cuda:
    xs_pinned = make_batch()[0].pin_memory()
    ys_pinned = tr.ys[0].cpu().pin_memory()

    def work(_) -> None:
        """One step's GPU work from a pinned batch: its copy and its training, nothing read back."""
        xg, yg = xs_pinned.to(dev, non_blocking=True), ys_pinned.to(dev, non_blocking=True)
        loss_fn(model(xg), yg).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    work(None)
    torch.cuda.synchronize()
    runs = sorted(r for r in (gpu_seconds_queued(torch, work) for _ in range(5)) if r is not None)
    gpu_step_s = runs[len(runs) // 2] if runs else None
warm_end = time.perf_counter() + 2.0 * sc.scale  # the spin kernels well before the baseline
while time.perf_counter() < warm_end:
    step()
tr.sync()
reset()
h0, m0 = host_counters(), device_mallocs()
f0, ft0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt, resource.getrusage(resource.RUSAGE_THREAD).ru_minflt
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
f1, ft1 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt, resource.getrusage(resource.RUSAGE_THREAD).ru_minflt
h1, m1 = host_counters(), device_mallocs()
read_copy_events()
n = own["steps"]
host = {k.replace(".", "_"): h1[k] - h0[k] for k in HOST_COUNTERS} if h0 is not None and h1 is not None else None
gpu_busy = n * gpu_step_s if gpu_step_s is not None else None
prep_s = own["make_s"] + own["alloc_s"] + own["stage_s"]
shares = {f"{k.removesuffix('_s')}_share": round(own[k] / wall, 4) for k in own if k.endswith("_s")}
sc.extra["self"] = {**{k: round(v, 4) for k, v in own.items()}, **shares, "wall_s": round(wall, 4),
                    "steps_per_s": round(n / wall, 2), "prep_s": round(prep_s, 4),
                    "prep_share": round(prep_s / wall, 4),
                    "prep_cpu_share": round((own["make_cpu_s"] + own["stage_cpu_s"]) / wall, 4),
                    "main_cpu_share": round((run1 - run0) / wall, 4),
                    "main_cpu_wait_share": round((wait1 - wait0) / wall, 4) if wait0 is not None else None,
                    "copy_gpu_ms": round(copy_gpu["s"] / copy_gpu["n"] * 1e3, 4) if copy_gpu["n"] else None,
                    "gpu_step_ms": round(gpu_step_s * 1e3, 4) if gpu_step_s is not None else None,
                    "gpu_busy_s": round(gpu_busy, 4) if gpu_busy is not None else None,
                    "gpu_busy_share": round(gpu_busy / wall, 4) if gpu_busy is not None else None,
                    "host_allocator": host,
                    "host_allocs": host["num_host_alloc"] if host else None,
                    "host_allocs_per_s": round(host["num_host_alloc"] / wall, 3) if host else None,
                    "host_alloc_s": round(host["host_alloc_time_total"] / 1e6, 4) if host else None,
                    "pinned_requests": host["active_requests_allocated"] if host else None,
                    "cuda_mallocs": m1 - m0, "cuda_mallocs_per_s": round((m1 - m0) / wall, 3),
                    "minor_faults": f1 - f0, "minor_faults_per_s": round((f1 - f0) / wall, 1),
                    "main_minor_faults": ft1 - ft0, "intra_op_threads": torch.get_num_threads(),
                    "batch": B, "batch_mb": round(B * D * 4 / 2 ** 20, 2), "log_every": LOG_EVERY}
if not sc.cuda:
    sc.note("no pinned memory, no CUDA events or allocator counters: no CUDA.")
sc.note(f"natural: measured by the script: {n} steps ({n / wall:.1f}/s) in {wall:.2f} s: {own['make_s']:.2f} s making "
        f"batches, {own['alloc_s']:.3f} s allocating pinned buffers, {own['stage_s']:.2f} s copying into them, "
        f"{own['copy_launch_s'] + own['train_launch_s']:.2f} s launching the copies and the training, "
        f"{own['item_s']:.2f} s in .item(); host allocator {host}; "
        + (f"a step's kernels and copies take {gpu_step_s * 1e3:.2f} ms of GPU time queued (GPU busy "
           f"{gpu_busy / wall:.0%} of the run)." if gpu_busy is not None else "no GPU timings (no CUDA)."))
sc.write_truth(baseline=(b0, b1), window=None, ratio_spans=((b0, mid), (mid, b1)))
