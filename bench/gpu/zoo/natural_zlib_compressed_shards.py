"""natural_zlib_compressed_shards (natural, nothing staged): an image classifier whose dataset is stored as compressed
NumPy shards, as a preprocessing script that saved disk space with np.savez_compressed left it. At set-up the script
writes 16 shards to the local disk (a folder under /var/tmp): each an .npz of 256 images (3x128x128 uint8 of smooth
content and sensor noise, one member x_NNNN each, deflate-compressed by zipfile/zlib about 1.3x) and their labels
(member y): 201 MB uncompressed in all, in the page cache afterwards. A map-style Dataset opens each shard lazily in the
worker that first needs it (np.load, kept open) and makes sample i by reading its member (npz["x_NNNN"]: zipfile
reads the member and zlib inflates it, np.lib.format parses it), then a random 112x112 crop and a random horizontal
flip. DataLoader(batch_size=256, shuffle=True, num_workers=2, pin_memory=True, persistent_workers=True,
drop_last=True): two workers, on the job's CPUs 2-3 (they inherit them) with the main process; a new epoch's iterator
when one ends. The model is light: four stride-2 3x3 convolutions (32-64-128-256 channels) with BatchNorm, a pool and a
linear head, the uint8 batch normalised on the GPU, bf16 autocast, SGD with momentum, loss.item() each step: a few
milliseconds of GPU work a batch, so that the GPU waits for the workers (smaller with --device cpu: 3 shards of 64
images of 3x48x48, crops of 40, batch 32). 20 s. The folder is removed at the end.

The script measures itself: the steps per second; the main thread's time in next() on the loader (wall and its CPU
time, thread_time) and in its steps; each worker's time per item (its clocks, summed in shared memory per worker: the
item's wall and CPU time, and apart the member's read and inflate, npz[key], wall and CPU), so that the share of a
worker's item time that is decompression is known; each worker process's CPU time and run-queue wait over the run
(/proc/PID/task/*/schedstat at the run's start and end; the workers' pids from multiprocessing.active_children()), its
bytes read from storage and in all (/proc/PID/io read_bytes, rchar) and page faults; the pin-memory thread's and the
main thread's schedstat, the main process's page faults, the allocators' counters (cudaHostAlloc, cudaMalloc calls);
and a step's GPU time queued (common.gpu_seconds_queued on a pinned batch), so that the GPU's busy share is known.
Truth `workers` names the workers (pid, tids, comm), `pin_thread` the pin-memory thread, `shards` the files."""

import multiprocessing
import os
import random
import resource
import shutil
import tempfile
import time

import numpy as np

from common import Scenario, comm_of, gpu_seconds_queued, tids_of

sc = Scenario("natural_zlib_compressed_shards", "natural", "a light conv net fed by a 2-worker DataLoader reading "
              "images from np.savez_compressed shards on the local disk, a zlib-inflated member per item, 20 s, "
              "nothing staged", job_cpus=[2, 3], control=True)
import torch  # noqa: E402

dev = torch.device(sc.device)
NCLASS, WORKERS, NSCENES = 100, 2, 16
SHARDS, PER_SHARD, SIDE, CROP, BATCH, WIDTHS = ((16, 256, 128, 112, 256, (32, 64, 128, 256)) if sc.cuda
                                                else (3, 64, 48, 40, 32, (8, 16, 32, 32)))
ROOT = "/var/tmp" if os.access("/var/tmp", os.W_OK) else None
DATA = tempfile.mkdtemp(prefix="zoo_npz_", dir=ROOT)
# per worker: items, item wall, item CPU, member read+inflate wall, its CPU, bytes inflated (summed in the worker)
NSTAT = 6
STATS = multiprocessing.RawArray("d", NSTAT * WORKERS)


def write_shards() -> tuple[list[str], dict]:
    """The shards: images cut from smooth synthetic scenes, shifted, plus a little sensor noise; saved compressed."""
    t0 = time.perf_counter()
    rng = np.random.default_rng(0)
    yy, xx = np.mgrid[0:2 * SIDE, 0:2 * SIDE].astype(np.float32) / SIDE
    scenes = []
    for _ in range(NSCENES):
        f = rng.uniform(0.5, 3.0, (3, 2, 1, 1)).astype(np.float32)
        ph = rng.uniform(0.0, 6.3, (3, 1, 1)).astype(np.float32)
        scenes.append((128 + 70 * np.sin(f[:, 0] * 6.3 * yy + ph) * np.cos(f[:, 1] * 6.3 * xx)).astype(np.uint8))
    scenes = np.stack(scenes)
    size = 3 * SIDE * SIDE
    noise = rng.integers(0, 5, 4 * size, dtype=np.uint8)
    paths, raw, stored = [], 0, 0
    for s in range(SHARDS):
        members: dict[str, np.ndarray] = {}
        kind, dy, dx = (rng.integers(0, n, PER_SHARD) for n in (NSCENES, SIDE, SIDE))
        off = rng.integers(0, len(noise) - size, PER_SHARD)
        for j in range(PER_SHARD):
            img = scenes[kind[j], :, dy[j]:dy[j] + SIDE, dx[j]:dx[j] + SIDE]
            members[f"x_{j:04d}"] = img + noise[off[j]:off[j] + size].reshape(3, SIDE, SIDE)
            raw += size
        members["y"] = (kind * 6 + rng.integers(0, 6, PER_SHARD)) % NCLASS
        path = os.path.join(DATA, f"shard_{s:03d}.npz")
        np.savez_compressed(path, **members)
        paths.append(path)
        stored += os.path.getsize(path)
    return paths, {"dir": DATA, "shards": SHARDS, "per_shard": PER_SHARD, "raw_bytes": raw, "stored_bytes": stored,
                   "ratio": round(raw / stored, 3), "write_s": round(time.perf_counter() - t0, 3)}


class NpzShards(torch.utils.data.Dataset):
    """Sample i: member x_{i % per_shard} of shard i // per_shard (the shard opened once per worker), cropped and
    flipped at random; its label from the shard's member y."""

    def __init__(self, paths: list[str], per_shard: int) -> None:
        self.paths, self.per_shard = paths, per_shard
        self.files: dict[int, np.lib.npyio.NpzFile] = {}  # opened in the workers, on first use
        self.labels: dict[int, np.ndarray] = {}

    def __len__(self) -> int:
        return len(self.paths) * self.per_shard

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        t0, c0 = time.perf_counter(), time.thread_time()
        k, j = divmod(i, self.per_shard)
        npz = self.files.get(k)
        if npz is None:
            npz = self.files[k] = np.load(self.paths[k])
            self.labels[k] = npz["y"]
        t1, c1 = time.perf_counter(), time.thread_time()
        img = npz[f"x_{j:04d}"]  # zipfile reads the member, zlib inflates it
        t2, c2 = time.perf_counter(), time.thread_time()
        top, left = random.randint(0, SIDE - CROP), random.randint(0, SIDE - CROP)
        x = img[:, top:top + CROP, left:left + CROP]
        if random.random() < 0.5:
            x = x[:, :, ::-1]
        x = torch.from_numpy(np.ascontiguousarray(x))
        w = torch.utils.data.get_worker_info()
        base = NSTAT * (w.id if w is not None else 0)
        STATS[base] += 1
        STATS[base + 1] += time.perf_counter() - t0
        STATS[base + 2] += time.thread_time() - c0
        STATS[base + 3] += t2 - t1
        STATS[base + 4] += c2 - c1
        STATS[base + 5] += img.nbytes
        return x, int(self.labels[k][j])


def conv_net() -> torch.nn.Module:
    layers, cin = [], 3
    for w in WIDTHS:
        layers += [torch.nn.Conv2d(cin, w, 3, 2, 1, bias=False), torch.nn.BatchNorm2d(w), torch.nn.ReLU()]
        cin = w
    return torch.nn.Sequential(*layers, torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(cin, NCLASS))


def schedstat(path: str) -> tuple[int, int] | None:
    try:
        with open(path) as fh:
            run, wait = fh.read().split()[:2]
        return int(run), int(wait)
    except (OSError, ValueError):
        return None


def process_schedstat(pid: int) -> dict[int, tuple[int, int] | None]:
    return {t: schedstat(f"/proc/{pid}/task/{t}/schedstat") for t in tids_of(pid)}


def proc_io(pid: int) -> dict[str, int] | None:
    try:
        with open(f"/proc/{pid}/io") as fh:
            return {k: int(v) for k, v in (line.split(":") for line in fh)}
    except (OSError, ValueError):
        return None


def minflt(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return int(fh.read().rsplit(")", 1)[1].split()[7])
    except (OSError, ValueError, IndexError):
        return None


def alloc_counters() -> tuple[int, int] | None:
    """cudaHostAlloc calls (the caching host allocator's: pinned batches), cudaMalloc calls (the device allocator's)."""
    if not sc.cuda:
        return None
    try:
        host = int(torch.cuda.host_memory_stats().get("num_host_alloc", 0))
    except (RuntimeError, AttributeError):
        host = 0
    return host, int(torch.cuda.memory_stats().get("segment.all.allocated", 0))


state: dict = {"it": None, "epochs": 0}
try:
    paths, shards = write_shards()
    print(f"[{sc.name}] shards {shards}", flush=True)
    torch.manual_seed(0)
    model = conv_net().to(dev, memory_format=torch.channels_last)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, weight_decay=5e-5)
    mean = torch.tensor([0.485, 0.456, 0.406], device=dev).view(1, 3, 1, 1) * 255
    std = torch.tensor([0.229, 0.224, 0.225], device=dev).view(1, 3, 1, 1) * 255
    loader = torch.utils.data.DataLoader(NpzShards(paths, PER_SHARD), batch_size=BATCH, shuffle=True,
                                         num_workers=WORKERS, pin_memory=sc.cuda, persistent_workers=True,
                                         drop_last=True, generator=torch.Generator().manual_seed(0))
    state["it"] = iter(loader)
    own = {"steps": 0, "wait_s": 0.0, "wait_cpu_s": 0.0, "step_s": 0.0, "running_loss": 0.0}

    def train(img: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        img, y = img.to(dev, non_blocking=True), y.to(dev, non_blocking=True)
        x = ((img.float() - mean) / std).contiguous(memory_format=torch.channels_last)
        with torch.autocast(sc.device, dtype=torch.bfloat16, enabled=sc.cuda):
            loss = torch.nn.functional.cross_entropy(model(x).float(), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        return loss

    def next_batch() -> tuple:
        try:
            return next(state["it"])
        except StopIteration:  # the epoch is over: the next one's iterator (the workers stay)
            state["it"] = iter(loader)
            state["epochs"] += 1
            return next(state["it"])

    def step() -> None:
        t0, c0 = time.perf_counter(), time.thread_time()
        batch = next_batch()
        t1, c1 = time.perf_counter(), time.thread_time()
        own["running_loss"] += train(*batch).item()
        t2 = time.perf_counter()
        own["wait_s"] += t1 - t0
        own["wait_cpu_s"] += c1 - c0
        own["step_s"] += t2 - t1
        own["steps"] += 1

    for _ in range(10):  # warm-up: the workers started, cuDNN's choices, the allocator
        step()
    wpids = sorted(p.pid for p in multiprocessing.active_children())
    pin_tid = getattr(getattr(state["it"], "_pin_memory_thread", None), "native_id", None)
    gpu_step_s = None
    if sc.cuda:
        torch.cuda.synchronize()
        fixed = tuple(t.pin_memory() for t in next_batch())
        runs = sorted(r for r in (gpu_seconds_queued(torch, lambda _: train(*fixed)) for _ in range(5))
                      if r is not None)
        gpu_step_s = runs[len(runs) // 2] if runs else None
    warm_end = time.perf_counter() + 2.0 * sc.scale  # the spin kernels well before the baseline
    while time.perf_counter() < warm_end:
        step()
    if sc.cuda:
        torch.cuda.synchronize()
    for k in own:
        own[k] = 0 if k == "steps" else 0.0
    epochs0 = state["epochs"]
    s0 = list(STATS)
    w0 = {p: process_schedstat(p) for p in wpids}
    io0 = {p: proc_io(p) for p in wpids}
    wf0 = {p: minflt(p) for p in wpids}
    pin0 = schedstat(f"/proc/self/task/{pin_tid}/schedstat") if pin_tid else None
    main0 = schedstat("/proc/thread-self/schedstat")
    f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    h0 = alloc_counters()
    b0 = sc.mark("baseline")
    t = time.perf_counter()
    sc.run_for(10.0 * sc.scale, step)
    mid = sc.mark("half")
    sc.run_for(10.0 * sc.scale, step)
    if sc.cuda:
        torch.cuda.synchronize()
    b1 = sc.mark("end")
    wall = time.perf_counter() - t
    main1 = schedstat("/proc/thread-self/schedstat")
    pin1 = schedstat(f"/proc/self/task/{pin_tid}/schedstat") if pin_tid else None
    f1 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    h1 = alloc_counters()
    s1 = list(STATS)
    w1 = {p: process_schedstat(p) for p in wpids}
    io1 = {p: proc_io(p) for p in wpids}
    wf1 = {p: minflt(p) for p in wpids}
    workers = [{"pid": p, "tids": tids_of(p), "comm": comm_of(p)} for p in wpids]
    pin_comm = comm_of(os.getpid(), pin_tid) if pin_tid else None
finally:
    if state["it"] is not None:
        state["it"]._shutdown_workers()
    shutil.rmtree(DATA, ignore_errors=True)
n = own["steps"]


def share(v: float | None) -> float | None:
    return round(v / wall, 4) if v is not None else None


def worker_sum(p: int, k: int) -> float | None:
    """A worker process's threads' CPU time (k=0) or run-queue wait (k=1) over the run (s)."""
    got = [(z[k] - ((w0[p].get(t) or (0, 0))[k])) for t, z in w1[p].items() if z]
    return round(sum(got) / 1e9, 4) if got else None


per_worker = []
for w_id in range(WORKERS):
    d = [b - a for a, b in zip(s0[NSTAT * w_id:NSTAT * (w_id + 1)], s1[NSTAT * w_id:NSTAT * (w_id + 1)])]
    per_worker.append({"worker_id": w_id, "items": int(d[0]), "item_s": round(d[1], 4), "item_cpu_s": round(d[2], 4),
                       "inflate_s": round(d[3], 4), "inflate_cpu_s": round(d[4], 4),
                       "inflate_fraction": round(d[3] / d[1], 4) if d[1] else None,
                       "item_us": round(d[1] / d[0] * 1e6, 2) if d[0] else None,
                       "item_share": share(d[1]), "inflated_mb": round(d[5] / 2 ** 20, 2)})
per_process = []
for p in wpids:
    a, z, fa, fz = io0[p], io1[p], wf0[p], wf1[p]
    per_process.append({"pid": p, "run_s": worker_sum(p, 0), "cpu_wait_s": worker_sum(p, 1),
                        "cpu_share": share(worker_sum(p, 0)), "cpu_wait_share": share(worker_sum(p, 1)),
                        "disk_read_bytes": z["read_bytes"] - a["read_bytes"] if a and z else None,
                        "rchar": z["rchar"] - a["rchar"] if a and z else None,
                        "minor_faults_per_s": round((fz - fa) / wall, 1) if fa is not None and fz is not None
                        else None})


def total(key: str, rows: list[dict]) -> float | None:
    got = [r[key] for r in rows if r[key] is not None]
    return round(sum(got), 4) if got else None


items, item_s, inflate_s = (sum(w[k] for w in per_worker) for k in ("items", "item_s", "inflate_s"))
item_cpu_s, inflate_cpu_s = (sum(w[k] for w in per_worker) for k in ("item_cpu_s", "inflate_cpu_s"))
shares_ = [r["cpu_share"] for r in per_process if r["cpu_share"] is not None]
waits_ = [r["cpu_wait_share"] for r in per_process if r["cpu_wait_share"] is not None]
faults_ = [r["minor_faults_per_s"] for r in per_process if r["minor_faults_per_s"] is not None]
gpu_busy = n * gpu_step_s if gpu_step_s is not None else None
sc.extra["workers"] = workers
sc.extra["pin_thread"] = {"pid": os.getpid(), "tid": pin_tid, "comm": pin_comm} if pin_tid else None
sc.extra["shards"] = shards
sc.extra["self"] = {**{k: round(v, 4) for k, v in own.items()}, "wall_s": round(wall, 4),
                    "steps_per_s": round(n / wall, 2), "epochs": state["epochs"] - epochs0,
                    "wait_share": share(own["wait_s"]), "wait_cpu_share": share(own["wait_cpu_s"]),
                    "step_share": share(own["step_s"]), "items": int(items), "items_per_s": round(items / wall, 1),
                    "item_s": round(item_s, 4), "item_cpu_s": round(item_cpu_s, 4), "inflate_s": round(inflate_s, 4),
                    "inflate_cpu_s": round(inflate_cpu_s, 4),
                    "inflate_fraction": round(inflate_s / item_s, 4) if item_s else None,
                    "inflate_cpu_fraction": round(inflate_cpu_s / item_cpu_s, 4) if item_cpu_s else None,
                    "item_us": round(item_s / max(items, 1) * 1e6, 2),
                    "per_worker": per_worker, "per_process": per_process,
                    "workers_run_s": total("run_s", per_process),
                    "workers_cpu_wait_s": total("cpu_wait_s", per_process),
                    "workers_cpu_share_min": min(shares_) if shares_ else None,
                    "workers_cpu_share_max": max(shares_) if shares_ else None,
                    "workers_cpu_wait_share_max": max(waits_) if waits_ else 0.0,
                    "workers_disk_read_bytes": total("disk_read_bytes", per_process),
                    "workers_rchar": total("rchar", per_process),
                    "workers_minor_faults_per_s_max": max(faults_) if faults_ else 0.0,
                    "pin_run_share": share((pin1[0] - pin0[0]) / 1e9) if pin0 and pin1 else None,
                    "pin_cpu_wait_share": share((pin1[1] - pin0[1]) / 1e9) if pin0 and pin1 else None,
                    "main_run_s": round((main1[0] - main0[0]) / 1e9, 4) if main0 and main1 else None,
                    "main_cpu_share": share((main1[0] - main0[0]) / 1e9) if main0 and main1 else None,
                    "main_cpu_wait_s": round((main1[1] - main0[1]) / 1e9, 4) if main0 and main1 else None,
                    "main_cpu_wait_share": share((main1[1] - main0[1]) / 1e9) if main0 and main1 else None,
                    "minor_faults_per_s": round((f1 - f0) / wall, 1),
                    "host_allocs_per_s": round((h1[0] - h0[0]) / wall, 3) if h0 and h1 else None,
                    "cuda_mallocs_per_s": round((h1[1] - h0[1]) / wall, 3) if h0 and h1 else 0.0,
                    "gpu_step_ms": round(gpu_step_s * 1e3, 4) if gpu_step_s is not None else None,
                    "gpu_busy_s": round(gpu_busy, 4) if gpu_busy is not None else None,
                    "gpu_busy_share": share(gpu_busy), "batch": BATCH, "workers": WORKERS, "pin_memory": sc.cuda}
if not sc.cuda:
    sc.note("pin_memory off: no CUDA.")
sc.note(f"natural: measured by the script: {n} steps ({n / wall:.1f}/s) in {wall:.2f} s: {own['wait_s']:.2f} s in "
        f"next() on the loader ({own['wait_cpu_s']:.2f} s of it on the CPU), {own['step_s']:.2f} s in steps; the "
        f"workers made {int(items)} items ({items / wall:.0f}/s), {item_s / max(items, 1) * 1e6:.0f} us each, "
        f"{inflate_s:.2f} s of their {item_s:.2f} s in reading and inflating members ({shards['ratio']}x compressed); "
        f"the workers' processes ran {total('run_s', per_process)} s and waited for a CPU "
        f"{total('cpu_wait_s', per_process)} s, read {total('disk_read_bytes', per_process)} bytes from storage; "
        + (f"a step's copy and kernels take {gpu_step_s * 1e3:.2f} ms of GPU time queued (GPU busy "
           f"{gpu_busy / wall:.0%} of the run)." if gpu_busy is not None else "no GPU timings (no CUDA)."))
sc.write_truth(baseline=(b0, b1), window=None, ratio_spans=((b0, mid), (mid, b1)))
