"""natural_omp_threads_oversubscribed (natural, nothing staged): an image classifier whose batches are prepared on the
CPU with torch CPU ops in the main thread, its intra-op thread count set explicitly with torch.set_num_threads(8) (the
value copied from a config written for a bigger training box) while the job is pinned to 2 CPUs (CPUs 2-3; PyTorch's
OpenMP threads start on them too). Each step: 32 images drawn from a pool of 256 uint8 images (3x160x160) held in a
CPU tensor (index_select), to float, a random 144x144 crop resized to 112x112 (F.interpolate, bilinear with
antialias), a random horizontal flip per image (torch.where), a brightness jitter per image and channel, a 5x5
Gaussian blur (F.conv2d, one group per channel), clamped and normalised: ten parallel CPU ops a batch. The batch is
page-locked (pin_memory(), PyTorch's caching host allocator) and copied with .to(dev, non_blocking=True), a synchronise
after it (to time the copy), then a small conv net (four stride-2 3x3 convolutions 3-32-64-128-256 with BatchNorm,
bf16 autocast, SGD with momentum) trains on it and the loss is read with loss.item(). 20 s.

The script measures itself: the steps per second; the main thread's time preparing (wall, and within it its own
schedstat: on a CPU, waiting for one, asleep the rest: at OpenMP's barriers), copying (pin, copy, synchronise), queueing
the step and in loss.item(); the preparation's time before the run at 8 intra-op threads (as configured), at the job's 2
CPUs and at 1 (`job_cpus_would_save_s`: the run's preparation beyond its steps at 2 threads); every thread's CPU time
and run-queue wait over the run (/proc/self/task/*/schedstat, with its name: the main thread apart, the OpenMP threads
(started since the first preparation, alive at the run's start) summed, the rest summed), how many threads the process
has; the process's minor page faults, the device allocator's cudaMalloc and the host allocator's cudaHostAlloc calls,
and a step's GPU time queued (common.gpu_seconds_queued: the copy from a pinned batch and the training), so that the
GPU's busy share is known. Truth `intra_op`: the OpenMP threads (tids, names); `threads`: every thread with its CPU time
and wait over the run; `intra_op_threads`: torch.get_num_threads()."""

import os
import resource
import threading
import time

from common import Scenario, comm_of, gpu_seconds_queued, tids_of

sc = Scenario("natural_omp_threads_oversubscribed", "natural", "a conv net fed batches prepared in the main thread "
              "with torch CPU ops (crop, antialiased resize, flip, jitter, blur, normalise) under "
              "torch.set_num_threads(8) on a 2-CPU job, pinned copies, loss.item() each step, 20 s, nothing staged",
              job_cpus=[2, 3], control=True)
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

CPU_THREADS = 8  # "cpu_threads: 8" in the training config
torch.set_num_threads(CPU_THREADS)
PID, MAIN = os.getpid(), threading.get_native_id()
AT_IMPORT = set(tids_of(PID))
dev = torch.device(sc.device)
NIMG, SRC, CROP, OUT, BATCH, NCLASS, WIDTHS = 256, 160, 144, 112, 32, 100, (32, 64, 128, 256)
if not sc.cuda:
    WIDTHS = (8, 16, 16, 32)
MEAN = torch.tensor([0.485, 0.456, 0.406]).view(1, 3, 1, 1)
STD = torch.tensor([0.229, 0.224, 0.225]).view(1, 3, 1, 1)
_g = torch.exp(-torch.arange(-2, 3).float() ** 2 / 2)
_g = _g / _g.sum()
BLUR = (_g[:, None] * _g[None, :]).expand(3, 1, 5, 5).contiguous()
torch.manual_seed(0)
images = torch.randint(0, 256, (NIMG, 3, SRC, SRC), dtype=torch.uint8)
labels = torch.randint(0, NCLASS, (NIMG,))
cpu_gen = torch.Generator().manual_seed(1)


def prepare() -> tuple[torch.Tensor, torch.Tensor]:
    """A batch made with torch CPU ops (each parallel over the intra-op threads where large enough)."""
    idx = torch.randint(0, NIMG, (BATCH,), generator=cpu_gen)
    x = images.index_select(0, idx).float().div_(255)
    top, left = torch.randint(0, SRC - CROP + 1, (2,), generator=cpu_gen).tolist()
    x = x[:, :, top:top + CROP, left:left + CROP]
    x = F.interpolate(x, size=(OUT, OUT), mode="bilinear", antialias=True, align_corners=False)
    flip = torch.rand(BATCH, generator=cpu_gen) < 0.5
    x = torch.where(flip.view(BATCH, 1, 1, 1), x.flip(-1), x)
    x = x * torch.empty(BATCH, 3, 1, 1).uniform_(0.8, 1.2, generator=cpu_gen)
    x = F.conv2d(x, BLUR, padding=2, groups=3)
    x = ((x.clamp_(0, 1) - MEAN) / STD).contiguous()
    return x, labels[idx]


def conv_net() -> torch.nn.Module:
    layers, cin = [], 3
    for w in WIDTHS:
        layers += [torch.nn.Conv2d(cin, w, 3, 2, 1, bias=False), torch.nn.BatchNorm2d(w), torch.nn.ReLU()]
        cin = w
    return torch.nn.Sequential(*layers, torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(cin, NCLASS))


model = conv_net().to(dev)
opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
own = {"steps": 0, "prep_s": 0.0, "prep_run_s": 0.0, "prep_wait_s": 0.0, "copy_s": 0.0, "issue_s": 0.0,
       "item_s": 0.0}
last = {"loss": 0.0}
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


def train(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    with torch.autocast(sc.device, dtype=torch.bfloat16, enabled=sc.cuda):
        loss = F.cross_entropy(model(x).float(), y)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    return loss


def sync() -> None:
    if sc.cuda:
        torch.cuda.synchronize()


def to_device(x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    if not sc.cuda:
        return x, y
    return x.pin_memory().to(dev, non_blocking=True), y.pin_memory().to(dev, non_blocking=True)


def step() -> None:
    t0 = time.perf_counter()
    r0, w0 = my_schedstat()
    x, y = prepare()
    r1, w1 = my_schedstat()
    t1 = time.perf_counter()
    xd, yd = to_device(x, y)
    sync()  # the copy alone, timed
    t2 = time.perf_counter()
    loss = train(xd, yd)
    t3 = time.perf_counter()
    last["loss"] = loss.item()
    t4 = time.perf_counter()
    own["prep_s"] += t1 - t0
    own["prep_run_s"] += (r1 - r0) / 1e9
    own["prep_wait_s"] += (w1 - w0) / 1e9
    own["copy_s"] += t2 - t1
    own["issue_s"] += t3 - t2
    own["item_s"] += t4 - t3
    own["steps"] += 1


def prep_ms(n: int = 15, budget_s: float = 1.5) -> float:
    """The preparation's median wall time (ms) over n batches (fewer if they take over budget_s), the GPU idle."""
    times: list[float] = []
    end = time.perf_counter() + budget_s
    while len(times) < n and (len(times) < 3 or time.perf_counter() < end):
        t0 = time.perf_counter()
        prepare()
        times.append(time.perf_counter() - t0)
    return sorted(times)[len(times) // 2] * 1e3


def host_allocs() -> int | None:
    if not sc.cuda or not hasattr(torch.cuda, "host_memory_stats"):
        return None
    return int(torch.cuda.host_memory_stats().get("num_host_alloc", 0))


def mallocs() -> int:
    return int(torch.cuda.memory_stats().get("segment.all.allocated", 0)) if sc.cuda else 0


# The GPU side first, from a batch made on the device (no CPU op large enough to run in parallel yet): the autograd
# thread and CUDA's threads are started.
rx, ry = torch.randn(BATCH, 3, OUT, OUT, device=dev), torch.randint(0, NCLASS, (BATCH,), device=dev)
for _ in range(5):
    train(rx, ry)
sync()
before = set(tids_of(PID))
prepare()  # the first preparation: OpenMP starts its threads
started_first = len(set(tids_of(PID)) - before)
for _ in range(10):
    step()
sync()
prep_at = {CPU_THREADS: prep_ms()}
for k in (len(sc.job_cpus), 1):  # the same preparation at the job's CPU count and at 1, then back to the config's
    torch.set_num_threads(k)
    prep_at[k] = prep_ms()
torch.set_num_threads(CPU_THREADS)
gpu_step_s = None
if sc.cuda:
    fx, fy = prepare()
    fx, fy = fx.pin_memory(), fy.pin_memory()  # a batch in pinned memory: its copy queues without a sync

    def work(_) -> None:
        train(fx.to(dev, non_blocking=True), fy.to(dev, non_blocking=True))

    runs = sorted(r for r in (gpu_seconds_queued(torch, work) for _ in range(5)) if r is not None)
    gpu_step_s = runs[len(runs) // 2] if runs else None
warm_end = time.perf_counter() + 2.0 * sc.scale  # the spin kernels well before the baseline
while time.perf_counter() < warm_end:
    step()
sync()
for k in own:
    own[k] = 0 if k == "steps" else 0.0
# OpenMP's threads: those started since the first preparation, alive now (libgomp ends the threads a smaller count
# leaves idle and starts new ones when the count grows again: the measures at 2 and 1 thread replaced them).
# With them, any the pool had before (CPU runs: the model's own ops started it): named as the main thread, started
# after importing torch.
intra = sorted((set(tids_of(PID)) - before) | {tid for tid in tids_of(PID) if tid != MAIN and tid not in AT_IMPORT
                                               and comm_of(PID, tid) == comm_of(PID, MAIN)})
how = "started since the first preparation, or named as the main thread and started after importing torch"
stats0 = {tid: schedstat(tid) for tid in tids_of(PID)}
names0 = {tid: comm_of(PID, tid) for tid in stats0}
f0, m0, h0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt, mallocs(), host_allocs()
b0 = sc.mark("baseline")
t = time.perf_counter()
sc.run_for(10.0 * sc.scale, step)
mid = sc.mark("half")
sc.run_for(10.0 * sc.scale, step)
b1 = sc.mark("end")
wall = time.perf_counter() - t
stats1 = {tid: schedstat(tid) for tid in tids_of(PID)}
f1, m1, h1 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt, mallocs(), host_allocs()
names1 = {tid: comm_of(PID, tid) for tid in stats1}
n = own["steps"]


def delta(tid: int, k: int) -> float | None:
    """A thread's CPU time (k=0) or run-queue wait (k=1) over the run (s); started during it: since it started."""
    a, z = stats0.get(tid) or (0, 0), stats1.get(tid)
    return round((z[k] - a[k]) / 1e9, 4) if z else None


def group(tids: list[int], k: int) -> float | None:
    got = [v for v in (delta(tid, k) for tid in tids) if v is not None]
    return round(sum(got), 4) if got or not tids else None


def share(v: float | None) -> float | None:
    return round(v / wall, 4) if v is not None else None


intra_alive = [tid for tid in intra if tid in stats1]
others = [tid for tid in stats1 if tid != MAIN and tid not in intra]
main_run, main_wait = delta(MAIN, 0), delta(MAIN, 1)
prep_sleep = max(0.0, own["prep_s"] - own["prep_run_s"] - own["prep_wait_s"])
saved = own["prep_s"] - n * prep_at[len(sc.job_cpus)] / 1e3
gpu_busy = n * gpu_step_s if gpu_step_s is not None else None
threads = [{"tid": tid, "comm": names1.get(tid) or names0.get(tid), "intra_op": tid in intra, "run_s": delta(tid, 0),
            "cpu_wait_s": delta(tid, 1)} for tid in sorted(set(stats0) | set(stats1))]
sc.extra["intra_op"] = {"pid": PID, "tids": intra, "comms": [names1.get(tid) or comm_of(PID, tid) for tid in intra],
                        "how": how}
sc.extra["threads"] = threads
sc.extra["intra_op_threads"] = torch.get_num_threads()
sc.extra["self"] = {**{k: round(v, 4) for k, v in own.items()}, "wall_s": round(wall, 4),
                    "steps_per_s": round(n / wall, 2), "step_ms_mean": round(wall / max(n, 1) * 1e3, 4),
                    "prep_share": share(own["prep_s"]), "copy_share": share(own["copy_s"]),
                    "issue_share": share(own["issue_s"]), "item_share": share(own["item_s"]),
                    "prep_ms_mean": round(own["prep_s"] / max(n, 1) * 1e3, 4),
                    "prep_run_share": share(own["prep_run_s"]), "prep_wait_share": share(own["prep_wait_s"]),
                    "prep_sleep_s": round(prep_sleep, 4), "prep_sleep_share": share(prep_sleep),
                    "prep_ms_at": {str(k): round(v, 4) for k, v in prep_at.items()},
                    "job_cpus_would_save_s": round(saved, 4), "job_cpus_would_save_share": share(saved),
                    "main_run_s": main_run, "main_cpu_share": share(main_run),
                    "main_cpu_wait_s": main_wait, "main_cpu_wait_share": share(main_wait),
                    "intra_op_threads": torch.get_num_threads(), "intra_op_started": len(intra),
                    "intra_op_started_first": started_first,
                    "intra_op_run_s": group(intra_alive, 0), "intra_op_cpu_wait_s": group(intra_alive, 1),
                    "intra_op_cpu_share": share(group(intra_alive, 0)),
                    "other_threads_run_s": group(others, 0), "other_threads_cpu_wait_s": group(others, 1),
                    "threads": len(stats1), "job_cpus": len(sc.job_cpus), "host_cpus": os.cpu_count(),
                    "minor_faults_per_s": round((f1 - f0) / wall, 1),
                    "cuda_mallocs_per_s": round((m1 - m0) / wall, 3),
                    "host_allocs_per_s": round((h1 - h0) / wall, 3) if h0 is not None and h1 is not None else None,
                    "gpu_step_ms": round(gpu_step_s * 1e3, 4) if gpu_step_s is not None else None,
                    "gpu_busy_s": round(gpu_busy, 4) if gpu_busy is not None else None,
                    "gpu_busy_share": share(gpu_busy), "batch": BATCH, "loss": round(last["loss"], 4),
                    "omp_env": {k: os.environ.get(k) for k in ("OMP_NUM_THREADS", "OMP_WAIT_POLICY", "GOMP_SPINCOUNT",
                                                               "OMP_PROC_BIND", "MKL_NUM_THREADS")},
                    "parallel": torch.__config__.parallel_info().splitlines()[-1].strip()}
sc.note(f"natural: measured by the script: {n} steps ({n / wall:.1f}/s) in {wall:.2f} s: {own['prep_s']:.2f} s "
        f"preparing batches with torch CPU ops on {torch.get_num_threads()} intra-op threads ({len(intra)} started) "
        f"over {len(sc.job_cpus)} CPUs, of which the main thread ran {own['prep_run_s']:.2f} s, waited for a CPU "
        f"{own['prep_wait_s']:.2f} s and slept {prep_sleep:.2f} s; {own['copy_s']:.2f} s copying, {own['issue_s']:.2f} "
        f"s queueing the steps, {own['item_s']:.2f} s in loss.item(); a preparation takes "
        + ", ".join(f"{v:.2f} ms at {k}" for k, v in prep_at.items())
        + f" threads (at {len(sc.job_cpus)} the run's would take {saved:.2f} s less); the main thread ran {main_run} s "
        f"and waited for a CPU {main_wait} s, the OpenMP threads ran {group(intra_alive, 0)} s and waited "
        f"{group(intra_alive, 1)} s; {len(stats1)} threads; "
        + (f"a step's copy and kernels take {gpu_step_s * 1e3:.2f} ms of GPU time queued (GPU busy "
           f"{gpu_busy / wall:.0%} of the run)." if gpu_busy is not None else "no GPU timings (no CUDA)."))
sc.write_truth(baseline=(b0, b1), window=None, ratio_spans=((b0, mid), (mid, b1)))
