"""natural_big_batches_shm (natural, nothing staged): an image classifier fed large float32 batches by a DataLoader
without pin_memory, as a first vision script often is: a map-style Dataset over a cheap synthetic source (a pool of
64 uint8 images of 3x256x256 made at set-up) whose __getitem__ does light numpy work (a random 224x224 crop, a random
horizontal flip, to float32, normalised by the ImageNet mean and std: a 602 KB float32 array);
DataLoader(batch_size=128, shuffle=True, num_workers=2, persistent_workers=True, drop_last=True) without pin_memory,
each worker (pinned to a CPU of its own, 4 and 5) collating 128 samples into a 77 MB float32 batch in shared memory
(PyTorch's default for worker results: the batch's storage in /dev/shm, its file descriptor sent to the main
process), the main thread getting it from next() and copying it to the GPU with .to(dev, non_blocking=True) from that
pageable memory; a small conv net (four 3x3 stride-2 convolutions 3-32-64-128-256 with BatchNorm and ReLU, a global
average pool, a linear head; channels_last, bf16 autocast, SGD with momentum), loss.item() each step. The main
process on CPUs 2-3, 20 s. Where /dev/shm has too little room for the batches in flight, the batch is made smaller
and the truth says so (smaller with --device cpu: 64x64 crops, batches of 16).

The script measures itself: the steps per second and the bytes per second delivered; the main thread's time in next()
(wall and its CPU clock), in the copy to the GPU (a torch.cuda.synchronize() before and after it, added to time it
alone; wall and CPU clock), in the training step and loss.item(); the workers' time per batch in __getitem__ and in the
collate (their clocks, summed in shared memory); each worker's CPU time and run-queue wait over the run (the sum over
its tasks' schedstat) and its minor page faults; the main thread's time on a CPU and waiting for one over the run
(schedstat), the main process's minor page faults; before the run, a fresh batch's copy alone from the loader's shared
memory and from a pinned copy of it (what pinning would give); the caching host allocator's cudaHostAlloc and the
device allocator's cudaMalloc calls; and a step's GPU time queued from a batch already on the GPU
(common.gpu_seconds_queued), so that the GPU's busy share (its kernels) is known. Truth `workers` names the worker
processes (pid, tids, comm)."""

import multiprocessing
import os
import resource
import time

import numpy as np

from common import Scenario, comm_of, gpu_seconds_queued, map_cpus, tids_of

sc = Scenario("natural_big_batches_shm", "natural", "a small conv net fed 77 MB float32 batches by a 2-worker "
              "DataLoader without pin_memory (light numpy crops and flips, batches collated into shared memory), "
              "copied from that pageable memory with non_blocking=True, loss.item() each step, 20 s, nothing staged",
              job_cpus=[2, 3], culprit_cpus=[4, 5], control=True)
import torch  # noqa: E402
from torch.utils.data import default_collate  # noqa: E402

dev = torch.device(sc.device)
POOL, NCLASS, WORKERS, PREFETCH = 64, 1000, 2, 2
SRC, SIDE, BATCH, WIDTHS = (256, 224, 128, (32, 64, 128, 256)) if sc.cuda else (72, 64, 16, (8, 16, 32, 32))
WORKER_CPUS = map_cpus([4, 5])
MEAN = np.array([0.485, 0.456, 0.406], np.float32).reshape(3, 1, 1) * 255
INV_STD = 1 / (np.array([0.229, 0.224, 0.225], np.float32).reshape(3, 1, 1) * 255)
# per worker k: (samples, __getitem__ wall, batches, collate wall) at 4k..4k+3, summed in memory shared with the workers
STATS = multiprocessing.RawArray("d", 4 * WORKERS)
if sc.cuda:
    torch.backends.cudnn.benchmark = True


def shm_fit(batch: int) -> int:
    """The batch, halved while the batches in flight (each worker's prefetch, plus two) would not fit in /dev/shm."""
    try:
        st = os.statvfs("/dev/shm")
        room = st.f_bavail * st.f_frsize
    except OSError:
        return batch
    while batch > 16 and (WORKERS * PREFETCH + 2) * batch * 3 * SIDE * SIDE * 4 > 0.8 * room:
        batch //= 2
    return batch


WANTED = BATCH
BATCH = shm_fit(BATCH)
if BATCH != WANTED:
    sc.note(f"/dev/shm too small for batches of {WANTED}: batch {BATCH}.")
BATCH_BYTES = BATCH * 3 * SIDE * SIDE * 4 + BATCH * 8


class SyntheticImages(torch.utils.data.Dataset):
    """A cheap synthetic source: sample i is a random crop of pool image i % POOL, flipped at random, as float32
    normalised by the ImageNet mean and std. Its length is a long virtual epoch."""

    def __init__(self) -> None:
        rng = np.random.default_rng(0)
        self.pool = rng.integers(0, 256, (POOL, 3, SRC, SRC), dtype=np.uint8)
        self.labels = rng.integers(0, NCLASS, POOL)
        self.rng = None

    def __len__(self) -> int:
        return POOL * 4096

    def __getitem__(self, i: int) -> tuple[np.ndarray, int]:
        t0 = time.perf_counter()
        if self.rng is None:
            info = torch.utils.data.get_worker_info()
            self.rng = np.random.default_rng(1000 + (info.id if info else 0))
        top, left = self.rng.integers(0, SRC - SIDE + 1, 2)
        x = self.pool[i % POOL, :, top:top + SIDE, left:left + SIDE]
        if self.rng.random() < 0.5:
            x = x[:, :, ::-1]
        x = (x.astype(np.float32) - MEAN) * INV_STD
        _count(0, time.perf_counter() - t0)
        return x, int(self.labels[i % POOL])


def _count(k: int, seconds: float) -> None:
    info = torch.utils.data.get_worker_info()
    w = info.id if info else 0
    STATS[4 * w + k] += 1
    STATS[4 * w + k + 1] += seconds


def collate(samples: list) -> list:
    """default_collate, timed (into shared memory in a worker: the batch's storage is made shared there)."""
    t0 = time.perf_counter()
    out = default_collate(samples)
    _count(2, time.perf_counter() - t0)
    return out


def pin_worker(k: int) -> None:
    os.sched_setaffinity(0, [WORKER_CPUS[k % len(WORKER_CPUS)]])


def schedstat(path: str) -> tuple[float, float] | None:
    try:
        with open(path) as fh:
            run, wait = fh.read().split()[:2]
        return int(run) / 1e9, int(wait) / 1e9
    except (OSError, ValueError):
        return None


def process_schedstat(pid: int) -> tuple[float, float]:
    """A process's tasks' time on a CPU and waiting for one so far (s), summed."""
    got = [s for s in (schedstat(f"/proc/{pid}/task/{t}/schedstat") for t in tids_of(pid)) if s]
    return sum(s[0] for s in got), sum(s[1] for s in got)


def minflt(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return int(fh.read().rsplit(")", 1)[1].split()[7])
    except (OSError, ValueError, IndexError):
        return None


def counters() -> tuple[int, int] | None:
    """cudaHostAlloc calls (the caching host allocator's) and cudaMalloc calls (the device allocator's) so far."""
    if not sc.cuda:
        return None
    try:
        host = int(torch.cuda.host_memory_stats().get("num_host_alloc", 0))
    except (RuntimeError, AttributeError):
        host = 0
    return host, int(torch.cuda.memory_stats().get("segment.all.allocated", 0))


def sync() -> None:
    if sc.cuda:
        torch.cuda.synchronize()


nn = torch.nn


def block(cin: int, cout: int) -> list:
    return [nn.Conv2d(cin, cout, 3, stride=2, padding=1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(inplace=True)]


torch.manual_seed(0)
layers, cin = [], 3
for w in WIDTHS:
    layers += block(cin, w)
    cin = w
model = nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(cin, NCLASS))
FMT = torch.channels_last if sc.cuda else torch.contiguous_format
model = model.to(dev, memory_format=FMT)
opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, weight_decay=5e-4, nesterov=True)
loss_fn = nn.CrossEntropyLoss()


def train_step(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    with torch.autocast(sc.device, dtype=torch.bfloat16, enabled=sc.cuda):
        loss = loss_fn(model(x.contiguous(memory_format=FMT)).float(), y)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    return loss


loader = torch.utils.data.DataLoader(SyntheticImages(), batch_size=BATCH, shuffle=True, num_workers=WORKERS,
                                     collate_fn=collate, persistent_workers=True, prefetch_factor=PREFETCH,
                                     worker_init_fn=pin_worker, drop_last=True,
                                     generator=torch.Generator().manual_seed(0))
own = {"steps": 0, "next_s": 0.0, "next_cpu_s": 0.0, "copy_s": 0.0, "copy_cpu_s": 0.0, "step_s": 0.0,
       "running_loss": 0.0}
it = None
try:
    it = iter(loader)

    def step() -> None:
        t0, c0 = time.perf_counter(), time.thread_time()
        x, y = next(it)
        t1, c1 = time.perf_counter(), time.thread_time()
        sync()  # for the timing: the copy timed alone (the last step's kernels are done: its loss.item() waited)
        x, y = x.to(dev, non_blocking=True), y.to(dev, non_blocking=True)
        sync()
        t2, c2 = time.perf_counter(), time.thread_time()
        own["running_loss"] += train_step(x, y).item()
        t3 = time.perf_counter()
        own["next_s"] += t1 - t0
        own["next_cpu_s"] += c1 - c0
        own["copy_s"] += t2 - t1
        own["copy_cpu_s"] += c2 - c1
        own["step_s"] += t3 - t2
        own["steps"] += 1

    for _ in range(10):  # warm-up: the workers started, cuDNN's choices
        step()
    wpids = [w.pid for w in it._workers]
    gpu_step_s = pageable_alone_s = pinned_alone_s = None
    if sc.cuda:
        times = []
        for _ in range(5):  # fresh batches from the loader: their shared memory not yet touched by this process
            bx, by = next(it)
            sync()
            a = time.perf_counter()
            gx, gy = bx.to(dev, non_blocking=True), by.to(dev, non_blocking=True)
            sync()
            times.append(time.perf_counter() - a)
        pageable_alone_s = sorted(times)[2]
        px, py = bx.pin_memory(), by.pin_memory()
        times = []
        for _ in range(5):
            sync()
            a = time.perf_counter()
            px.to(dev, non_blocking=True)
            py.to(dev, non_blocking=True)
            sync()
            times.append(time.perf_counter() - a)
        pinned_alone_s = sorted(times)[2]
        runs = sorted(r for r in (gpu_seconds_queued(torch, lambda _: train_step(gx, gy)) for _ in range(5))
                      if r is not None)
        gpu_step_s = runs[len(runs) // 2] if runs else None
        del bx, by, px, py, gx, gy
        sync()
    warm_end = time.perf_counter() + 2.0 * sc.scale  # the spin kernels well before the baseline
    while time.perf_counter() < warm_end:
        step()
    sync()
    for k in own:
        own[k] = 0 if k == "steps" else 0.0
    s0 = list(STATS)
    main0 = schedstat("/proc/thread-self/schedstat")
    work0 = {p: process_schedstat(p) for p in wpids}
    wf0 = {p: minflt(p) for p in wpids}
    f0, h0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt, counters()
    b0 = sc.mark("baseline")
    t = time.perf_counter()
    sc.run_for(10.0 * sc.scale, step)
    mid = sc.mark("half")
    sc.run_for(10.0 * sc.scale, step)
    b1 = sc.mark("end")
    wall = time.perf_counter() - t
    main1 = schedstat("/proc/thread-self/schedstat")
    work1 = {p: process_schedstat(p) for p in wpids}
    wf1 = {p: minflt(p) for p in wpids}
    f1, h1 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt, counters()
    s1 = list(STATS)
    workers = [{"pid": p, "tids": tids_of(p), "comm": comm_of(p)} for p in wpids]
finally:
    if it is not None:
        it._shutdown_workers()

n = own["steps"]


def share(v: float | None) -> float | None:
    return round(v / wall, 4) if v is not None else None


def ms(v: float | None) -> float | None:
    return round(v * 1e3, 4) if v is not None else None


ds = [b - a for a, b in zip(s0, s1)]
per_worker = []
for k, p in enumerate(wpids):
    run, wait = (b - a for a, b in zip(work0[p], work1[p]))
    fa, fb = wf0[p], wf1[p]
    samples, get_s, batches, collate_s = ds[4 * k: 4 * k + 4]
    per_worker.append({"pid": p, "run_s": round(run, 4), "run_share": share(run), "cpu_wait_s": round(wait, 4),
                       "cpu_wait_share": share(wait), "samples": int(samples), "getitem_s": round(get_s, 4),
                       "batches": int(batches), "collate_s": round(collate_s, 4),
                       "collate_ms_per_batch": round(collate_s / max(batches, 1) * 1e3, 3),
                       "minor_faults_per_s": round((fb - fa) / wall, 1) if fa is not None and fb is not None
                       else None})
gpu_busy = n * gpu_step_s if gpu_step_s is not None else None
main_run = main1[0] - main0[0] if main0 and main1 else None
main_wait = main1[1] - main0[1] if main0 and main1 else None
sc.extra["workers"] = workers
sc.extra["self"] = {**{k: round(v, 4) for k, v in own.items()}, "wall_s": round(wall, 4),
                    "steps_per_s": round(n / wall, 2), "next_share": share(own["next_s"]),
                    "next_cpu_share": share(own["next_cpu_s"]), "copy_share": share(own["copy_s"]),
                    "copy_cpu_share": share(own["copy_cpu_s"]), "step_share": share(own["step_s"]),
                    "batch": BATCH, "batch_mb": round(BATCH_BYTES / 1e6, 1), "workers": WORKERS,
                    "prefetch_factor": PREFETCH, "pin_memory": False,
                    "bytes_per_s": round(n * BATCH_BYTES / wall, 1), "gb_per_s": round(n * BATCH_BYTES / wall / 1e9, 3),
                    "copy_gb_per_s": round(n * BATCH_BYTES / own["copy_s"] / 1e9, 3) if own["copy_s"] else None,
                    "pageable_alone_ms": ms(pageable_alone_s), "pinned_alone_ms": ms(pinned_alone_s),
                    "pinned_would_save_s": round(own["copy_s"] - n * pinned_alone_s, 4) if pinned_alone_s else None,
                    "per_worker": per_worker,
                    "workers_run_s": round(sum(w["run_s"] for w in per_worker), 4),
                    "workers_run_share_max": max(w["run_share"] for w in per_worker),
                    "workers_run_share_min": min(w["run_share"] for w in per_worker),
                    "workers_cpu_wait_share_max": max(w["cpu_wait_share"] for w in per_worker),
                    "workers_minor_faults_per_s_max": max((w["minor_faults_per_s"] or 0.0) for w in per_worker),
                    "collate_ms_per_batch": round(sum(w["collate_s"] for w in per_worker)
                                                  / max(sum(w["batches"] for w in per_worker), 1) * 1e3, 3),
                    "getitem_us_per_sample": round(sum(w["getitem_s"] for w in per_worker)
                                                   / max(sum(w["samples"] for w in per_worker), 1) * 1e6, 2),
                    "main_run_s": round(main_run, 4) if main_run is not None else None,
                    "main_cpu_share": share(main_run), "main_cpu_wait_s": round(main_wait, 4) if main_wait is not None
                    else None, "main_cpu_wait_share": share(main_wait),
                    "minor_faults_per_s": round((f1 - f0) / wall, 1),
                    "host_allocs_per_s": round((h1[0] - h0[0]) / wall, 3) if h0 and h1 else None,
                    "cuda_mallocs_per_s": round((h1[1] - h0[1]) / wall, 3) if h0 and h1 else 0.0,
                    "gpu_step_ms": ms(gpu_step_s), "gpu_busy_s": round(gpu_busy, 4) if gpu_busy is not None else None,
                    "gpu_busy_share": share(gpu_busy)}
if not sc.cuda:
    sc.note("no copies (the batches stay on the CPU), no pinned memory, no allocator counters: no CUDA.")
sc.note(f"natural: measured by the script: {n} steps ({n / wall:.1f}/s) of {BATCH_BYTES / 1e6:.0f} MB batches in "
        f"{wall:.2f} s ({n * BATCH_BYTES / wall / 1e9:.2f} GB/s): {own['next_s']:.2f} s in next() on the loader "
        f"({own['next_cpu_s']:.2f} s of it on a CPU), {own['copy_s']:.2f} s copying to the GPU from shared memory "
        f"({own['copy_cpu_s']:.2f} s of CPU), {own['step_s']:.2f} s in steps; the workers on a CPU "
        f"{', '.join(format(w['run_s'], '.2f') for w in per_worker)} s, collating "
        f"{', '.join(format(w['collate_ms_per_batch'], '.1f') for w in per_worker)} ms a batch; "
        + (f"a batch alone copies in {pageable_alone_s * 1e3:.1f} ms from shared memory, {pinned_alone_s * 1e3:.1f} ms "
           f"pinned; a step's kernels take {gpu_step_s * 1e3:.2f} ms of GPU time queued (GPU busy "
           f"{gpu_busy / wall:.0%} of the run)." if gpu_busy is not None else "no GPU timings (no CUDA)."))
sc.write_truth(baseline=(b0, b1), window=None, ratio_spans=((b0, mid), (mid, b1)))
