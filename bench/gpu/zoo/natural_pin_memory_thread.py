"""natural_pin_memory_thread (natural, nothing staged): an image classifier trained from images kept preprocessed in
RAM, as a script does once decoding was found slow: a map-style Dataset holding 512 images already resized, scaled and
normalised (3x224x224 float32, 602 KB each, ~308 MB; made at set-up), whose __getitem__ returns one, flipped at random
(a horizontal flip, torch.flip); a DataLoader(batch_size=256, shuffle=True, num_workers=2, pin_memory=True,
persistent_workers=True) over a long virtual epoch (each image drawn again and again). Each worker (pinned to a CPU of
its own, 4 and 5) collates 256 samples into a 154 MB float32 batch in shared memory; in the main process PyTorch's
pin-memory thread (OS name pt_data_pin) receives each batch and copies it into page-locked memory (Tensor.pin_memory)
before the training loop gets it from next(). The main thread copies the batch to the GPU with non_blocking=True and
trains a small conv net (four 3x3 stride-2 convolutions 3-32-64-128-256 with BatchNorm and ReLU, a global average
pool, a linear head; channels_last, bf16 autocast, SGD with momentum), loss.item() each step. The main process on CPUs
2-3 (its main thread, the pin-memory thread, PyTorch's autograd thread), 20 s. Where /dev/shm has too little room for
the batches in flight, the batch is made smaller and the truth says so.

The script measures itself: the steps per second; the main thread's time in next() (wall and its CPU clock) and in its
steps; every thread of the main process's time on a CPU and waiting for one over the run (/proc/self/task/*/schedstat
and comm, read at the start and the end of the run), the pin-memory thread's among them (truth `pin_thread`: its tid
from the loader's thread); each worker's (the sum over its tasks' schedstat) and its minor page faults (/proc/PID/stat);
the main process's minor page faults (getrusage); a batch's pin_memory() alone, before the run, from ordinary memory
whose pages are mapped (the pin-memory thread also maps each batch's shared memory anew); the caching host allocator's
cudaHostAlloc calls and the device allocator's cudaMalloc calls over the run; and a step's GPU time queued (the copy
from a pinned batch and the training: common.gpu_seconds_queued), so that the GPU's busy share is known. Truth
`workers` names the worker processes (pid, tids, comm), `threads` the main process's threads and their times."""

import os
import random
import resource
import time

from common import Scenario, comm_of, gpu_seconds_queued, map_cpus, tids_of

sc = Scenario("natural_pin_memory_thread", "natural", "a small conv net fed 154 MB float32 batches by a 2-worker "
              "DataLoader with pin_memory=True (the pin-memory thread page-locks each batch), images preprocessed in "
              "RAM, 20 s, nothing staged", job_cpus=[2, 3], culprit_cpus=[4, 5], control=True)
import torch  # noqa: E402

dev = torch.device(sc.device)
NIMG, NCLASS, WORKERS, PREFETCH = 512, 100, 2, 2
SIDE, BATCH, WIDTHS = (224, 256, (32, 64, 128, 256)) if sc.cuda else (64, 16, (8, 16, 32, 32))
WORKER_CPUS = map_cpus([4, 5])
if sc.cuda:
    torch.backends.cudnn.benchmark = True


def shm_fit(batch: int) -> int:
    """The batch, halved while the batches in flight (each worker's prefetch, plus two) would not fit in /dev/shm."""
    try:
        st = os.statvfs("/dev/shm")
        room = st.f_bavail * st.f_frsize
    except OSError:
        return batch
    while batch > 32 and (WORKERS * PREFETCH + 2) * batch * 3 * SIDE * SIDE * 4 > 0.8 * room:
        batch //= 2
    return batch


WANTED = BATCH
BATCH = shm_fit(BATCH)
if BATCH != WANTED:
    sc.note(f"/dev/shm too small for batches of {WANTED}: batch {BATCH}.")
BATCH_BYTES = BATCH * 3 * SIDE * SIDE * 4


class CachedImages(torch.utils.data.Dataset):
    """Images preprocessed once (resized, scaled, normalised: float32 CHW) and kept in RAM; sample i is image
    i % NIMG, flipped at random. Its length is a long virtual epoch: each image drawn again and again."""

    def __init__(self) -> None:
        gen = torch.Generator().manual_seed(0)
        mean = torch.tensor([0.485, 0.456, 0.406]).view(1, 3, 1, 1)
        std = torch.tensor([0.229, 0.224, 0.225]).view(1, 3, 1, 1)
        raw = torch.randint(0, 256, (NIMG, 3, SIDE, SIDE), dtype=torch.uint8, generator=gen)
        self.images = raw.float().div_(255).sub_(mean).div_(std)
        self.labels = torch.randint(0, NCLASS, (NIMG,), generator=gen).tolist()

    def __len__(self) -> int:
        return NIMG * 2048

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        x = self.images[i % NIMG]
        if random.random() < 0.5:
            x = torch.flip(x, (2,))
        return x, self.labels[i % NIMG]


def pin_worker(k: int) -> None:
    os.sched_setaffinity(0, [WORKER_CPUS[k % len(WORKER_CPUS)]])


def schedstat(path: str) -> tuple[float, float] | None:
    try:
        with open(path) as fh:
            run, wait = fh.read().split()[:2]
        return int(run) / 1e9, int(wait) / 1e9
    except (OSError, ValueError):
        return None


def task_times(pid: int) -> dict[int, tuple[str | None, float, float]]:
    """Each thread of `pid`: its name, its time on a CPU and waiting for one so far (s)."""
    out = {}
    for tid in tids_of(pid):
        st = schedstat(f"/proc/{pid}/task/{tid}/schedstat")
        if st is not None:
            out[tid] = (comm_of(pid, tid), *st)
    return out


def task_deltas(before: dict, after: dict) -> dict[int, tuple[str | None, float, float]]:
    """Per thread, the time on a CPU and waiting for one between two task_times (a thread born since: all of it)."""
    return {tid: (comm, run - before.get(tid, (None, 0.0, 0.0))[1], wait - before.get(tid, (None, 0.0, 0.0))[2])
            for tid, (comm, run, wait) in after.items()}


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
    x = x.to(dev, non_blocking=True).contiguous(memory_format=FMT)
    y = y.to(dev, non_blocking=True)
    with torch.autocast(sc.device, dtype=torch.bfloat16, enabled=sc.cuda):
        loss = loss_fn(model(x).float(), y)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    return loss


ds = CachedImages()
loader = torch.utils.data.DataLoader(ds, batch_size=BATCH, shuffle=True, num_workers=WORKERS, pin_memory=sc.cuda,
                                     persistent_workers=True, prefetch_factor=PREFETCH, worker_init_fn=pin_worker,
                                     drop_last=True, generator=torch.Generator().manual_seed(0))
own = {"steps": 0, "wait_s": 0.0, "wait_cpu_s": 0.0, "step_s": 0.0, "running_loss": 0.0}
it = None
try:
    it = iter(loader)

    def step() -> None:
        t0, c0 = time.perf_counter(), time.thread_time()
        x, y = next(it)
        t1, c1 = time.perf_counter(), time.thread_time()
        own["running_loss"] += train_step(x, y).item()
        t2 = time.perf_counter()
        own["wait_s"] += t1 - t0
        own["wait_cpu_s"] += c1 - c0
        own["step_s"] += t2 - t1
        own["steps"] += 1

    for _ in range(10):  # warm-up: the workers started, cuDNN's choices, the host allocator's first blocks
        step()
    wpids = [w.pid for w in it._workers]
    pin_thread = getattr(it, "_pin_memory_thread", None)
    pin_tid = getattr(pin_thread, "native_id", None)
    gpu_step_s = pin_alone_s = None
    if sc.cuda:
        px, py = next(it)  # a batch as the loader gives it: pinned
        runs = sorted(r for r in (gpu_seconds_queued(torch, lambda _: train_step(px, py)) for _ in range(5))
                      if r is not None)
        gpu_step_s = runs[len(runs) // 2] if runs else None
        plain = torch.empty(px.shape, dtype=px.dtype).copy_(px)  # ordinary memory, its pages mapped
        times = []
        for _ in range(5):
            a = time.perf_counter()
            pinned = plain.pin_memory()
            times.append(time.perf_counter() - a)
            del pinned
        pin_alone_s = sorted(times)[2]
        del px, py, plain
        torch.cuda.synchronize()
    warm_end = time.perf_counter() + 2.0 * sc.scale  # the spin kernels well before the baseline
    while time.perf_counter() < warm_end:
        step()
    if sc.cuda:
        torch.cuda.synchronize()
    own.update(steps=0, wait_s=0.0, wait_cpu_s=0.0, step_s=0.0)
    pid = os.getpid()
    main0, work0 = task_times(pid), {p: task_times(p) for p in wpids}
    wf0 = {p: minflt(p) for p in wpids}
    f0, h0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt, counters()
    b0 = sc.mark("baseline")
    t = time.perf_counter()
    sc.run_for(10.0 * sc.scale, step)
    mid = sc.mark("half")
    sc.run_for(10.0 * sc.scale, step)
    if sc.cuda:
        torch.cuda.synchronize()
    b1 = sc.mark("end")
    wall = time.perf_counter() - t
    main1, work1 = task_times(pid), {p: task_times(p) for p in wpids}
    wf1 = {p: minflt(p) for p in wpids}
    f1, h1 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt, counters()
    workers = [{"pid": p, "tids": tids_of(p), "comm": comm_of(p)} for p in wpids]
finally:
    if it is not None:
        it._shutdown_workers()

n = own["steps"]


def share(v: float | None) -> float | None:
    return round(v / wall, 4) if v is not None else None


threads = task_deltas(main0, main1)
feeder_tid = sc.feeder["tid"]
main_t = threads.get(feeder_tid)
pin_t = threads.get(pin_tid) if pin_tid is not None else None
per_worker = []
for p in wpids:
    d = task_deltas(work0[p], work1[p])
    run, wait = sum(v[1] for v in d.values()), sum(v[2] for v in d.values())
    fa, fb = wf0[p], wf1[p]
    per_worker.append({"pid": p, "run_s": round(run, 4), "run_share": share(run), "cpu_wait_s": round(wait, 4),
                       "cpu_wait_share": share(wait), "threads": len(d),
                       "minor_faults_per_s": round((fb - fa) / wall, 1) if fa is not None and fb is not None else None})
run_shares = [w["run_share"] for w in per_worker]
gpu_busy = n * gpu_step_s if gpu_step_s is not None else None
sc.extra["workers"] = workers
sc.extra["pin_thread"] = {"pid": os.getpid(), "tid": pin_tid, "comm": pin_t[0] if pin_t else None} if pin_tid else None
sc.extra["threads"] = [{"tid": tid, "comm": c, "run_s": round(r, 4), "run_share": share(r), "cpu_wait_s": round(w, 4),
                        "cpu_wait_share": share(w)} for tid, (c, r, w) in sorted(threads.items())]
sc.extra["self"] = {**{k: round(v, 4) for k, v in own.items()}, "wall_s": round(wall, 4),
                    "steps_per_s": round(n / wall, 2), "wait_share": share(own["wait_s"]),
                    "wait_cpu_share": share(own["wait_cpu_s"]), "step_share": share(own["step_s"]),
                    "batch": BATCH, "batch_mb": round(BATCH_BYTES / 1e6, 1), "workers": WORKERS,
                    "prefetch_factor": PREFETCH, "pin_memory": sc.cuda, "gb_per_s_to_gpu": round(
                        n * BATCH_BYTES / wall / 1e9, 3),
                    "pin_run_s": round(pin_t[1], 4) if pin_t else None, "pin_run_share": share(pin_t[1]) if pin_t
                    else None, "pin_cpu_wait_share": share(pin_t[2]) if pin_t else None,
                    "pin_ms_per_batch": round(pin_t[1] / max(n, 1) * 1e3, 3) if pin_t else None,
                    "pin_batch_ms_alone": round(pin_alone_s * 1e3, 3) if pin_alone_s is not None else None,
                    "per_worker": per_worker, "workers_run_share_max": max(run_shares),
                    "workers_run_share_min": min(run_shares),
                    "workers_cpu_wait_share_max": max(w["cpu_wait_share"] for w in per_worker),
                    "workers_minor_faults_per_s_max": max((w["minor_faults_per_s"] or 0.0) for w in per_worker),
                    "main_run_s": round(main_t[1], 4) if main_t else None,
                    "main_cpu_share": share(main_t[1]) if main_t else None,
                    "main_cpu_wait_s": round(main_t[2], 4) if main_t else None,
                    "main_cpu_wait_share": share(main_t[2]) if main_t else None,
                    "minor_faults_per_s": round((f1 - f0) / wall, 1),
                    "host_allocs_per_s": round((h1[0] - h0[0]) / wall, 3) if h0 and h1 else None,
                    "cuda_mallocs_per_s": round((h1[1] - h0[1]) / wall, 3) if h0 and h1 else 0.0,
                    "gpu_step_ms": round(gpu_step_s * 1e3, 4) if gpu_step_s is not None else None,
                    "gpu_busy_s": round(gpu_busy, 4) if gpu_busy is not None else None,
                    "gpu_busy_share": share(gpu_busy)}
if not sc.cuda:
    sc.note("pin_memory and channels_last off: no CUDA (no pin-memory thread).")
pin_said = (f"the pin-memory thread ({pin_t[0]}, tid {pin_tid}) on a CPU {pin_t[1]:.2f} s "
            f"({pin_t[1] / max(n, 1) * 1e3:.1f} ms a batch; {pin_alone_s * 1e3:.1f} ms for a batch's pin_memory() "
            "alone)" if pin_t and pin_alone_s is not None else "no pin-memory thread")
sc.note(f"natural: measured by the script: {n} steps ({n / wall:.1f}/s) of {BATCH_BYTES / 1e6:.0f} MB batches in "
        f"{wall:.2f} s: {own['wait_s']:.2f} s in next() on the loader ({own['wait_cpu_s']:.2f} s of it on a CPU), "
        f"{own['step_s']:.2f} s in steps; {pin_said}; the workers on a CPU "
        f"{', '.join(format(w['run_s'], '.2f') for w in per_worker)} s; "
        + (f"a step's copy and kernels take {gpu_step_s * 1e3:.2f} ms of GPU time queued (GPU busy "
           f"{gpu_busy / wall:.0%} of the run)." if gpu_busy is not None else "no GPU timings (no CUDA)."))
sc.write_truth(baseline=(b0, b1), window=None, ratio_spans=((b0, mid), (mid, b1)))
