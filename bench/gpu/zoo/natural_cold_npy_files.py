"""natural_cold_npy_files (natural, nothing staged): the first epoch over a dataset of per-sample .npy files that is not
in the page cache, as after a reboot, on a fresh node or for a dataset larger than memory. At set-up the script writes
the dataset into a folder under /var/tmp, laid out as an image folder is (100 class folders; on the GPU run ~2.4 GB:
about 48,000 files of one 3x128x128 uint8 image each, np.save; fewer and smaller with --device cpu / --scale), syncs it
(os.sync(): one flush for the whole folder, not an fsync per file, which costs a journal flush each), then evicts it
from the page cache: per file os.posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED), its pages clean, and reads back from a
sample of files how much of them is still cached (mincore). A Dataset whose __getitem__ reads one file with np.load and
flips it at random is read by DataLoader(batch_size=256, shuffle=True, num_workers=2, pin_memory=True,
persistent_workers=True), the workers pinned to CPUs 4 and 5, the main process on CPUs 2-3; the main thread copies each
batch with .to(dev, non_blocking=True), scales it to float and normalises it on the GPU, and trains a small ResNet (a
stride-2 stem and three stages of two basic blocks, 32-64-128 channels, BatchNorm, channels_last) under bf16 autocast
with SGD, loss.item() each step. The model is warmed up on a batch made on the GPU (no file read); the loader's first
batch is taken before the measured run (the workers started); the measured run is the rest of the first epoch, or 20 s
if the epoch lasts longer. The folder is removed at the end.

The script measures itself: the steps per second; the main thread's time in next() on the loader (wall and CPU) and in
its steps; the workers' time in np.load (per worker, wall and the thread's CPU time: the rest is their wait for the
disk) and the files and bytes they loaded, from counters in shared memory; the bytes the workers read from storage
(/proc/PID/io read_bytes) and their rchar; each worker's time on a CPU and waiting for one (schedstat) and minor and
major page faults (/proc/PID/stat), the main process's page faults and the main thread's schedstat; the caching host
allocator's cudaHostAlloc calls and the device allocator's cudaMalloc calls over the run; and a step's GPU time queued
(common.gpu_seconds_queued: the copy from a pinned batch and the training), so that the GPU's busy share is known. Truth
`workers` names the worker processes (pid, tids, comm)."""

import ctypes
import glob
import multiprocessing
import os
import resource
import shutil
import tempfile
import time

import numpy as np

from common import Scenario, comm_of, gpu_seconds_queued, map_cpus, tids_of

sc = Scenario("natural_cold_npy_files", "natural", "a small ResNet trained from per-sample .npy files read by a "
              "2-worker pinned DataLoader (np.load), the first epoch with the files not in the page cache, up to 20 s, "
              "nothing staged", job_cpus=[2, 3], culprit_cpus=[4, 5], control=True)
import torch  # noqa: E402

dev = torch.device(sc.device)
NCLASS, WORKERS = 100, 2
SIDE, BATCH, WIDTHS = (128, 256, (32, 64, 128)) if sc.cuda else (32, 64, (8, 16, 32))
FILE_BYTES = 3 * SIDE * SIDE + 128  # np.save's header is 128 bytes here
TARGET_BYTES = (2.4e9 if sc.cuda else 0.1e9) * min(1.0, sc.scale)
NFILES = max(20 * BATCH, int(TARGET_BYTES / FILE_BYTES))
WORKER_CPUS = map_cpus([4, 5])
ROOT = "/var/tmp" if os.access("/var/tmp", os.W_OK) else None
# (load wall s, load CPU s, files, bytes) per worker, shared with the forked workers
STATS = multiprocessing.RawArray("d", 4 * WORKERS)
for stale in glob.glob("/var/tmp/zoo_npy_*"):  # what a run killed before its cleanup left
    shutil.rmtree(stale, ignore_errors=True)
DATA = tempfile.mkdtemp(prefix="zoo_npy_", dir=ROOT)


def write_dataset() -> tuple[list[str], dict]:
    """The image folder, written, synced and evicted from the page cache."""
    times = {}
    t0 = time.perf_counter()
    rng = np.random.default_rng(0)
    pool = rng.integers(0, 256, (64, 3, SIDE, SIDE), dtype=np.uint8)  # the pixels do not matter, the bytes do
    for c in range(NCLASS):
        os.mkdir(os.path.join(DATA, f"class_{c:03d}"))
    paths = []
    for i in range(NFILES):
        path = os.path.join(DATA, f"class_{i % NCLASS:03d}", f"{i:06d}.npy")
        np.save(path, np.roll(pool[i % len(pool)], i % SIDE, axis=2))
        paths.append(path)
    t1 = time.perf_counter()
    os.sync()
    t2 = time.perf_counter()
    for path in paths:  # every page clean now (synced): each file's dropped from the page cache
        fd = os.open(path, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
    t3 = time.perf_counter()
    times.update(write_s=round(t1 - t0, 3), sync_s=round(t2 - t1, 3), evict_s=round(t3 - t2, 3))
    return paths, times


def resident_share(paths: list[str]) -> float | None:
    """The share of these files' pages in the page cache (mmap + mincore), None where that cannot be read."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p]
    page = os.sysconf("SC_PAGE_SIZE")
    cached = total = 0
    for path in paths:
        size = os.path.getsize(path)
        fd = os.open(path, os.O_RDONLY)
        try:
            addr = libc.mmap(None, size, 1, 1, fd, 0)  # PROT_READ, MAP_SHARED
            if addr in (None, ctypes.c_void_p(-1).value):
                return None
            pages = (size + page - 1) // page
            vec = ctypes.create_string_buffer(pages)
            ok = libc.mincore(addr, size, vec) == 0
            libc.munmap(addr, size)
            if not ok:
                return None
            cached += sum(b & 1 for b in vec.raw)
            total += pages
        finally:
            os.close(fd)
    return cached / total if total else None


class NpyFolder(torch.utils.data.Dataset):
    """Sample i: the image in file i (np.load), flipped at random, and its class (its folder)."""

    def __init__(self, root: str) -> None:
        self.files = sorted(glob.glob(os.path.join(root, "class_*", "*.npy")))
        self.labels = [int(os.path.basename(os.path.dirname(f)).split("_")[1]) for f in self.files]

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        t0, c0 = time.perf_counter(), time.thread_time()
        x = np.load(self.files[i])
        t1, c1 = time.perf_counter(), time.thread_time()
        w = torch.utils.data.get_worker_info()
        k = 4 * (w.id if w is not None else 0)
        STATS[k] += t1 - t0
        STATS[k + 1] += c1 - c0
        STATS[k + 2] += 1
        STATS[k + 3] += x.nbytes
        if np.random.random() < 0.5:
            x = x[:, :, ::-1]
        return torch.from_numpy(np.ascontiguousarray(x)), self.labels[i]


def pin_worker(k: int) -> None:
    os.sched_setaffinity(0, [WORKER_CPUS[k % len(WORKER_CPUS)]])
    np.random.seed(1000 + k)


class Basic(torch.nn.Module):
    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.c1 = torch.nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.b1 = torch.nn.BatchNorm2d(cout)
        self.c2 = torch.nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.b2 = torch.nn.BatchNorm2d(cout)
        self.skip = (torch.nn.Sequential(torch.nn.Conv2d(cin, cout, 1, stride, bias=False), torch.nn.BatchNorm2d(cout))
                     if stride != 1 or cin != cout else torch.nn.Identity())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.b1(self.c1(x)))
        return torch.relu(self.b2(self.c2(y)) + self.skip(x))


def resnet() -> torch.nn.Module:
    w0, w1, w2 = WIDTHS
    return torch.nn.Sequential(
        torch.nn.Conv2d(3, w0, 3, 2, 1, bias=False), torch.nn.BatchNorm2d(w0), torch.nn.ReLU(),
        Basic(w0, w0, 1), Basic(w0, w0, 1), Basic(w0, w1, 2), Basic(w1, w1, 1), Basic(w1, w2, 2), Basic(w2, w2, 1),
        torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(w2, NCLASS))


def proc_io(pid: int) -> dict[str, int] | None:
    try:
        with open(f"/proc/{pid}/io") as fh:
            return {k: int(v) for k, v in (line.split(":") for line in fh)}
    except (OSError, ValueError):
        return None


def proc_stat(pid: int) -> tuple[int, int] | None:
    """A process's minor and major page faults."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            f = fh.read().rsplit(")", 1)[1].split()
        return int(f[7]), int(f[9])
    except (OSError, ValueError, IndexError):
        return None


def schedstat(path: str) -> tuple[float, float] | None:
    try:
        with open(path) as fh:
            run, wait = fh.read().split()[:2]
        return int(run) / 1e9, int(wait) / 1e9
    except (OSError, ValueError):
        return None


def host_counters() -> tuple[int, int] | None:
    """cudaHostAlloc calls (the caching host allocator's) and cudaMalloc calls (the device allocator's) so far."""
    if not sc.cuda:
        return None
    try:
        host = int(torch.cuda.host_memory_stats().get("num_host_alloc", 0))
    except (RuntimeError, AttributeError):
        host = 0
    return host, int(torch.cuda.memory_stats().get("segment.all.allocated", 0))


it = None
try:
    paths, setup = write_dataset()
    sample = [paths[i] for i in np.random.default_rng(1).choice(len(paths), min(200, len(paths)), replace=False)]
    setup["cached_share_after_evict"] = resident_share(sample)
    print(f"[{sc.name}] {NFILES} files, {NFILES * FILE_BYTES / 1e9:.2f} GB in {DATA}: {setup}", flush=True)
    torch.manual_seed(0)
    model = resnet().to(dev, memory_format=torch.channels_last)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, weight_decay=5e-5)
    mean = torch.tensor([0.485, 0.456, 0.406], device=dev).view(1, 3, 1, 1) * 255
    std = torch.tensor([0.229, 0.224, 0.225], device=dev).view(1, 3, 1, 1) * 255
    own = {"steps": 0, "wait_s": 0.0, "wait_cpu_s": 0.0, "step_s": 0.0, "running_loss": 0.0}

    def train_step(img: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        img, y = img.to(dev, non_blocking=True), y.to(dev, non_blocking=True)
        x = ((img.float() - mean) / std).contiguous(memory_format=torch.channels_last)
        with torch.autocast(sc.device, dtype=torch.bfloat16, enabled=sc.cuda):
            loss = torch.nn.functional.cross_entropy(model(x).float(), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        return loss

    gen = torch.Generator(device=dev).manual_seed(0)
    fake = torch.randint(0, 256, (BATCH, 3, SIDE, SIDE), dtype=torch.uint8, device=dev, generator=gen)
    fake_y = torch.randint(0, NCLASS, (BATCH,), device=dev, generator=gen)
    for _ in range(20):  # warm-up on a batch made on the GPU: cuDNN's choices, the allocator; no file read
        train_step(fake, fake_y).item()
    gpu_step_s = None
    if sc.cuda:
        host_x, host_y = fake.cpu().pin_memory(), fake_y.cpu().pin_memory()
        runs = sorted(r for r in (gpu_seconds_queued(torch, lambda _: train_step(host_x, host_y)) for _ in range(5))
                      if r is not None)
        gpu_step_s = runs[len(runs) // 2] if runs else None
        torch.cuda.synchronize()
    ds = NpyFolder(DATA)
    loader = torch.utils.data.DataLoader(ds, batch_size=BATCH, shuffle=True, num_workers=WORKERS,
                                         pin_memory=sc.cuda, persistent_workers=True, worker_init_fn=pin_worker,
                                         drop_last=True, generator=torch.Generator().manual_seed(0))
    it = iter(loader)
    train_step(*next(it)).item()  # the epoch's first batch: the workers started
    wpids = [w.pid for w in it._workers]
    done = [False]

    def step() -> bool:
        t0, c0 = time.perf_counter(), time.thread_time()
        try:
            img, y = next(it)
        except StopIteration:
            done[0] = True
            return False
        t1, c1 = time.perf_counter(), time.thread_time()
        own["running_loss"] += train_step(img, y).item()
        t2 = time.perf_counter()
        own["wait_s"] += t1 - t0
        own["wait_cpu_s"] += c1 - c0
        own["step_s"] += t2 - t1
        own["steps"] += 1
        return True

    s0 = list(STATS)
    io0 = {p: proc_io(p) for p in wpids}
    st0 = {p: proc_stat(p) for p in wpids}
    ws0 = {p: schedstat(f"/proc/{p}/schedstat") for p in wpids}
    main0 = schedstat("/proc/thread-self/schedstat")
    f0 = resource.getrusage(resource.RUSAGE_SELF)
    h0 = host_counters()
    b0 = sc.mark("baseline")
    t = time.perf_counter()
    deadline = t + 20.0 * sc.scale
    while time.perf_counter() < deadline and step():
        sc.step()
    if sc.cuda:
        torch.cuda.synchronize()
    b1 = sc.mark("epoch_end" if done[0] else "end")
    wall = time.perf_counter() - t
    main1 = schedstat("/proc/thread-self/schedstat")
    f1 = resource.getrusage(resource.RUSAGE_SELF)
    h1 = host_counters()
    s1 = list(STATS)
    io1 = {p: proc_io(p) for p in wpids}
    st1 = {p: proc_stat(p) for p in wpids}
    ws1 = {p: schedstat(f"/proc/{p}/schedstat") for p in wpids}
    workers = [{"pid": p, "tids": tids_of(p), "comm": comm_of(p)} for p in wpids]
finally:
    if it is not None:
        it._shutdown_workers()
    shutil.rmtree(DATA, ignore_errors=True)

n = own["steps"]
mid = (b0 + b1) // 2
sc.marks["half"] = mid


def share(v: float | None) -> float | None:
    return round(v / wall, 4) if v is not None else None


per_worker = []
for k, p in enumerate(wpids):
    load_s, load_cpu, files, nbytes = (s1[4 * k + j] - s0[4 * k + j] for j in range(4))
    a, b = io0[p], io1[p]
    disk = b["read_bytes"] - a["read_bytes"] if a and b else None
    rchar = b["rchar"] - a["rchar"] if a and b else None
    fa, fb = st0[p], st1[p]
    ra, rb = ws0[p], ws1[p]
    per_worker.append({"pid": p, "load_s": round(load_s, 4), "load_cpu_s": round(load_cpu, 4),
                       "load_share": share(load_s), "files": int(files), "bytes_loaded": int(nbytes),
                       "disk_read_bytes": disk, "rchar": rchar,
                       "minor_faults_per_s": round((fb[0] - fa[0]) / wall, 1) if fa and fb else None,
                       "major_faults": fb[1] - fa[1] if fa and fb else None,
                       "run_s": round(rb[0] - ra[0], 4) if ra and rb else None,
                       "cpu_wait_s": round(rb[1] - ra[1], 4) if ra and rb else None,
                       "cpu_wait_share": share(rb[1] - ra[1]) if ra and rb else None})
load_s = sum(w["load_s"] for w in per_worker)
load_cpu = sum(w["load_cpu_s"] for w in per_worker)
loaded = sum(w["bytes_loaded"] for w in per_worker)
disks = [w["disk_read_bytes"] for w in per_worker]
disk = sum(disks) if all(d is not None for d in disks) else None
gpu_busy = n * gpu_step_s if gpu_step_s is not None else None
sc.extra["workers"] = workers
sc.extra["setup"] = {**setup, "files": NFILES, "file_bytes": FILE_BYTES, "dataset_bytes": NFILES * FILE_BYTES,
                     "folder": DATA}
sc.extra["self"] = {**{k: round(v, 4) for k, v in own.items()}, "wall_s": round(wall, 4),
                    "steps_per_s": round(n / wall, 2), "epoch_done": done[0],
                    "wait_share": share(own["wait_s"]), "wait_cpu_share": share(own["wait_cpu_s"]),
                    "step_share": share(own["step_s"]),
                    "per_worker": per_worker, "load_s": round(load_s, 4), "load_cpu_s": round(load_cpu, 4),
                    "load_blocked_s": round(load_s - load_cpu, 4),
                    "load_blocked_fraction": round((load_s - load_cpu) / load_s, 4) if load_s else None,
                    "load_share_per_worker": share(load_s / WORKERS),
                    "files_loaded": sum(w["files"] for w in per_worker), "bytes_loaded": loaded,
                    "disk_read_bytes": disk, "disk_read_fraction": round(disk / loaded, 4) if disk and loaded else (
                        0.0 if disk == 0 else None),
                    "disk_mb_per_s": round(disk / wall / 1e6, 2) if disk is not None else None,
                    "load_ms_mean": round(load_s / max(1, sum(w["files"] for w in per_worker)) * 1e3, 4),
                    "workers_cpu_wait_share_max": max((w["cpu_wait_share"] or 0.0) for w in per_worker),
                    "workers_minor_faults_per_s_max": max((w["minor_faults_per_s"] or 0.0) for w in per_worker),
                    "main_run_s": round(main1[0] - main0[0], 4) if main0 and main1 else None,
                    "main_cpu_share": share(main1[0] - main0[0]) if main0 and main1 else None,
                    "main_cpu_wait_s": round(main1[1] - main0[1], 4) if main0 and main1 else None,
                    "main_cpu_wait_share": share(main1[1] - main0[1]) if main0 and main1 else None,
                    "minor_faults_per_s": round((f1.ru_minflt - f0.ru_minflt) / wall, 1),
                    "major_faults": f1.ru_majflt - f0.ru_majflt,
                    "host_allocs_per_s": round((h1[0] - h0[0]) / wall, 3) if h0 and h1 else None,
                    "cuda_mallocs_per_s": round((h1[1] - h0[1]) / wall, 3) if h0 and h1 else 0.0,
                    "gpu_step_ms": round(gpu_step_s * 1e3, 4) if gpu_step_s is not None else None,
                    "gpu_busy_s": round(gpu_busy, 4) if gpu_busy is not None else None,
                    "gpu_busy_share": round(gpu_busy / wall, 4) if gpu_busy is not None else None,
                    "batch": BATCH, "workers": WORKERS, "pin_memory": sc.cuda}
if not sc.cuda:
    sc.note("pin_memory off: no CUDA.")
sc.note(f"natural: measured by the script: {n} steps ({n / wall:.1f}/s) in {wall:.2f} s "
        f"({'the first epoch ended' if done[0] else 'the first epoch not over'}): {own['wait_s']:.2f} s in next() on "
        f"the loader, {own['step_s']:.2f} s in steps; the workers spent {load_s:.2f} s in np.load ({load_cpu:.2f} s of "
        f"it on a CPU) for {loaded / 1e6:.0f} MB, {'?' if disk is None else f'{disk / 1e6:.0f}'} MB read from storage; "
        f"setup {setup}; "
        + (f"a step's copy and kernels take {gpu_step_s * 1e3:.2f} ms of GPU time queued (GPU busy "
           f"{gpu_busy / wall:.0%} of the run)." if gpu_busy is not None else "no GPU timings (no CUDA)."))
sc.write_truth(baseline=(b0, b1), window=None, ratio_spans=((b0, mid), (mid, b1)))
