"""natural_manager_dict_sample_cache (natural, nothing staged): an image classifier whose DataLoader workers share a
cache of decoded images through a `multiprocessing.Manager().dict()`, the way the forums answer "how do I share a cache
between DataLoader workers?" (each worker's own dict is lost with it and fills once per worker; a Manager dict is seen
by all of them). Dataset.__getitem__ does `if i in self.cache: img = self.cache[i]` else decodes the sample (zlib, as
a packed shard stores it) and `self.cache[i] = img`. The first epoch fills the cache; from then on every sample is two
round trips to the manager's server process (a `DictProxy.__contains__` and a `__getitem__` whose ~110 KB array the
server pickles and sends over its socket), and that server is one Python process: its thread per connection takes
turns at its GIL. The raw data: 1,024 images of 3x192x192 uint8 (smooth content and sensor noise), each
zlib-compressed (level 4), held in memory as a shard's bytes. After the cache lookup a random 160x160 crop and a random
flip with numpy. DataLoader(batch_size=128, shuffle=True, num_workers=4, persistent_workers=True, drop_last=True), no
pin_memory; the main thread copies each uint8 batch to the GPU, normalises it there and trains a small ResNet (a
stride-2 stem 3-32 and a max pool, residual stages 32-64-128, 100 classes; fp32 without TF32, cudnn.benchmark, SGD
with momentum), loss.item() each step. The four workers wait on the manager's replies, the main thread waits in
next() and the GPU idles. The manager is started (forked) before CUDA is initialised; its process keeps the name of
the script's interpreter (truth `manager`: pid, tids, comm). The main process, its workers and the manager share CPUs
2-5; no threads of the job's own, no children but the workers and the manager (started before the measured run), no
file IO, no sleep. 20 s (smaller with --device cpu: 256 images of 3x64x64, crops of 56, batch 32, a narrower net).

The script measures itself: the steps per second; the main thread's time in next() on the loader (`wait_s`, and its
CPU clock in it: `wait_cpu_s`; the rest, `wait_off_cpu_s`, off its CPU), copying the batch to the GPU (`h2d_s`), in
loss.backward() (`backward_s`, its wait on PyTorch's autograd thread) and in loss.item() (`item_s`); for each worker
(truth `workers`: pid, tids, comm) its time in the two proxy calls (`proxy_s`), the samples it made, the cache hits
and misses, its time on a CPU and waiting for one (schedstat); the manager process's time on a CPU and waiting for one
(schedstat, every thread of it); before the run, the same loop with the cache in shared memory instead (a uint8 tensor
moved to shared memory with share_memory_() and a flag per sample, filled the same way by the first epoch: the fix),
so that what the manager costs the run is known (`manager_overhead_s`: the run's wall time beyond its steps at that
rate); the main thread's and the autograd thread's time on a CPU and waiting for one over the run (schedstat); the
process's minor page faults and the device allocator's cudaMalloc calls; and a step's GPU time queued
(common.gpu_seconds_queued: a batch already on the GPU, normalised, forward, backward, SGD, nothing read back), so
that the GPU's busy share is known. Truth `autograd` names PyTorch's autograd thread."""

import multiprocessing
import os
import resource
import threading
import time
import zlib

from common import Scenario, comm_of, gpu_seconds_queued, tids_of

sc = Scenario("natural_manager_dict_sample_cache", "natural", "a small ResNet fed by 4 DataLoader workers that share "
              "their decoded-image cache through a multiprocessing.Manager().dict(): two proxy round trips to the "
              "manager's server process per sample, 20 s, nothing staged", job_cpus=[2, 3, 4, 5], control=True)
import numpy as np  # noqa: E402
import torch  # noqa: E402

nn = torch.nn
F = nn.functional
PID, MAIN = os.getpid(), threading.get_native_id()
# The manager first, forked before CUDA is initialised (as `manager = Manager()` at the top of a script is).
manager = multiprocessing.get_context("fork").Manager()
dev = torch.device(sc.device)
if sc.cuda:
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cudnn.benchmark = True
N, SIDE, CROP, BATCH, WIDTHS, CLASSES = ((1024, 192, 160, 128, (32, 64, 128), 100) if sc.cuda
                                         else (256, 64, 56, 32, (16, 32, 64), 100))
WORKERS = 4
NSTAT = 5  # per worker: samples, proxy wall, item wall, cache hits, cache misses


def make_shard() -> tuple[list[bytes], np.ndarray]:
    """The raw data as a packed shard holds it: every image's zlib chunk; (chunks, labels)."""
    rng = np.random.default_rng(0)
    labels = rng.integers(0, CLASSES, N)
    chunks = []
    for _ in range(N):
        low = rng.integers(0, 256, (3, SIDE // 16, SIDE // 16)).astype(np.float32)
        img = np.repeat(np.repeat(low, 16, 1), 16, 2) + 12 * rng.standard_normal((3, SIDE, SIDE), dtype=np.float32)
        chunks.append(zlib.compress(np.clip(img, 0, 255).astype(np.uint8).tobytes(), 4))
    return chunks, labels


class CachedImages(torch.utils.data.Dataset):
    """Decoded images cached across the workers: in a Manager dict (`cache`), or (the fix) in a shared-memory tensor
    with a flag per sample (`shared`, `filled`)."""

    def __init__(self, chunks: list[bytes], labels: np.ndarray, stats, cache=None, shared=None, filled=None) -> None:
        self.chunks, self.labels, self.stats = chunks, labels, stats
        self.cache, self.shared, self.filled = cache, shared, filled

    def __len__(self) -> int:
        return N

    def decode(self, i: int) -> np.ndarray:
        return np.frombuffer(zlib.decompress(self.chunks[i]), np.uint8).reshape(3, SIDE, SIDE)

    def __getitem__(self, i: int):
        t0 = time.perf_counter()
        w = torch.utils.data.get_worker_info()
        wid = w.id if w is not None else 0
        hit = True
        if self.cache is not None:
            if i in self.cache:
                img = self.cache[i]
            else:
                hit = False
                img = self.decode(i)
                self.cache[i] = img
        else:  # the fix: one shared-memory array, read in place
            if self.filled[i]:
                img = self.shared[i].numpy()
            else:
                hit = False
                img = self.decode(i)
                self.shared[i].numpy()[...] = img
                self.filled[i] = True
        t1 = time.perf_counter()
        rng = np.random.default_rng()
        y0, x0 = rng.integers(0, SIDE - CROP + 1, 2)
        img = img[:, y0:y0 + CROP, x0:x0 + CROP]
        if rng.random() < 0.5:
            img = img[:, :, ::-1]
        out = torch.from_numpy(np.ascontiguousarray(img))
        base = NSTAT * wid
        self.stats[base] += 1
        self.stats[base + 1] += t1 - t0
        self.stats[base + 2] += time.perf_counter() - t0
        self.stats[base + (3 if hit else 4)] += 1
        return out, int(self.labels[i])


class Block(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.c1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.b1 = nn.BatchNorm2d(cout)
        self.c2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.b2 = nn.BatchNorm2d(cout)
        self.short = (nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))
                      if stride != 1 or cin != cout else nn.Identity())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.relu(self.b2(self.c2(F.relu(self.b1(self.c1(x))))) + self.short(x))


def resnet() -> nn.Module:
    layers = [nn.Conv2d(3, WIDTHS[0], 3, 2, 1, bias=False), nn.BatchNorm2d(WIDTHS[0]), nn.ReLU(), nn.MaxPool2d(3, 2, 1)]
    cin = WIDTHS[0]
    for k, cout in enumerate(WIDTHS):
        layers += [Block(cin, cout, 1 if k == 0 else 2), Block(cout, cout, 1)]
        cin = cout
    return nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(cin, CLASSES))


def schedstat(path: str) -> tuple[float, float] | None:
    try:
        with open(path) as fh:
            run, wait = fh.read().split()[:2]
        return int(run) / 1e9, int(wait) / 1e9
    except (OSError, ValueError):
        return None


def process_schedstat(pid: int) -> tuple[float, float] | None:
    """A process's threads' CPU time and run-queue wait, summed (s): the threads alive now."""
    got = [s for s in (schedstat(f"/proc/{pid}/task/{t}/schedstat") for t in tids_of(pid)) if s]
    return (sum(s[0] for s in got), sum(s[1] for s in got)) if got else None


def autograd_thread() -> dict | None:
    for tid in tids_of(PID):
        comm = comm_of(PID, tid) or ""
        if comm.startswith("pt_autograd"):
            return {"pid": PID, "tid": tid, "comm": comm}
    return None


KEYS = ("wait_s", "wait_cpu_s", "h2d_s", "forward_s", "backward_s", "opt_s", "item_s")
own = {"steps": 0, **dict.fromkeys(KEYS, 0.0), "running_loss": 0.0}
state: dict = {"it": None, "loader": None}


def reset() -> None:
    for k in own:
        own[k] = 0 if k == "steps" else 0.0


try:
    chunks, labels = make_shard()
    raw_mb = sum(len(c) for c in chunks) / 2 ** 20
    torch.manual_seed(0)
    model = resnet().to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, weight_decay=5e-5)
    mean = torch.tensor([0.485, 0.456, 0.406], device=dev).view(1, 3, 1, 1) * 255
    std = torch.tensor([0.229, 0.224, 0.225], device=dev).view(1, 3, 1, 1) * 255

    def make_loader(ds: CachedImages) -> None:
        loader = torch.utils.data.DataLoader(ds, batch_size=BATCH, shuffle=True, num_workers=WORKERS,
                                             persistent_workers=True, drop_last=True,
                                             generator=torch.Generator().manual_seed(0))
        state["loader"], state["it"] = loader, iter(loader)

    def train(img: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        x = (img.float() - mean) / std
        t1 = time.perf_counter()
        loss = F.cross_entropy(model(x), y)
        opt.zero_grad(set_to_none=True)
        t2 = time.perf_counter()
        loss.backward()
        t3 = time.perf_counter()
        opt.step()
        own["forward_s"] += t2 - t1
        own["backward_s"] += t3 - t2
        own["opt_s"] += time.perf_counter() - t3
        return loss

    def next_batch():
        try:
            return next(state["it"])
        except StopIteration:  # a new epoch (the workers stay)
            state["it"] = iter(state["loader"])
            return next(state["it"])

    def step() -> None:
        t0, c0 = time.perf_counter(), time.thread_time()
        img, y = next_batch()
        t1, c1 = time.perf_counter(), time.thread_time()
        img, y = img.to(dev), y.to(dev)
        t2 = time.perf_counter()
        loss = train(img, y)
        t3 = time.perf_counter()
        own["running_loss"] += loss.item()
        own["item_s"] += time.perf_counter() - t3
        own["wait_s"] += t1 - t0
        own["wait_cpu_s"] += c1 - c0
        own["h2d_s"] += t2 - t1
        own["steps"] += 1

    def sync() -> None:
        if sc.cuda:
            torch.cuda.synchronize()

    def timed(seconds: float) -> tuple[int, float]:
        n0, t = own["steps"], time.perf_counter()
        end = t + seconds
        while time.perf_counter() < end:
            step()
        sync()
        return own["steps"] - n0, time.perf_counter() - t

    def first_epoch() -> None:
        """One whole epoch: the workers decode every sample once and fill the cache."""
        for _ in range(N // BATCH):
            step()
        sync()

    # The fix first: the cache in shared memory.
    fix_stats = multiprocessing.RawArray("d", NSTAT * WORKERS)
    shared = torch.zeros((N, 3, SIDE, SIDE), dtype=torch.uint8).share_memory_()
    filled = torch.zeros(N, dtype=torch.bool).share_memory_()
    make_loader(CachedImages(chunks, labels, fix_stats, shared=shared, filled=filled))
    first_epoch()
    gpu_step_s = None
    if sc.cuda:
        fixed = tuple(t.to(dev) for t in next_batch())
        runs = sorted(r for r in (gpu_seconds_queued(torch, lambda _: train(*fixed)) for _ in range(5))
                      if r is not None)
        gpu_step_s = runs[len(runs) // 2] if runs else None
    reset()
    fix_steps, fix_wall = timed(3.0 * sc.scale)
    fix_wait_share = own["wait_s"] / fix_wall if fix_wall > 0 else None
    state["it"]._shutdown_workers()
    del shared, filled
    # As the script has it: the Manager dict.
    STATS = multiprocessing.RawArray("d", NSTAT * WORKERS)
    cache = manager.dict()
    make_loader(CachedImages(chunks, labels, STATS, cache=cache))
    first_epoch()
    timed(1.5 * sc.scale)  # the cache full, the workers connected, the spin kernels well before the run
    cached = len(cache)
    wpids = sorted(p.pid for p in multiprocessing.active_children() if p.pid != manager._process.pid)
    mpid = manager._process.pid
    ag = autograd_thread()
    reset()
    s0 = list(STATS)
    w0 = {p: schedstat(f"/proc/{p}/task/{p}/schedstat") for p in wpids}
    mg0 = process_schedstat(mpid)
    main0 = schedstat(f"/proc/{PID}/task/{MAIN}/schedstat")
    ag0 = schedstat(f"/proc/{PID}/task/{ag['tid']}/schedstat") if ag else None
    f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    m0 = int(torch.cuda.memory_stats().get("segment.all.allocated", 0)) if sc.cuda else 0
    b0 = sc.mark("baseline")
    t = time.perf_counter()
    sc.run_for(10.0 * sc.scale, step)
    mid = sc.mark("half")
    sc.run_for(10.0 * sc.scale, step)
    sync()
    b1 = sc.mark("end")
    wall = time.perf_counter() - t
    main1 = schedstat(f"/proc/{PID}/task/{MAIN}/schedstat")
    ag1 = schedstat(f"/proc/{PID}/task/{ag['tid']}/schedstat") if ag else None
    mg1 = process_schedstat(mpid)
    f1 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    m1 = int(torch.cuda.memory_stats().get("segment.all.allocated", 0)) if sc.cuda else 0
    s1 = list(STATS)
    w1 = {p: schedstat(f"/proc/{p}/task/{p}/schedstat") for p in wpids}
    workers = [{"pid": p, "tids": tids_of(p), "comm": comm_of(p)} for p in wpids]
    manager_row = {"pid": mpid, "tids": tids_of(mpid), "comm": comm_of(mpid), "what": "multiprocessing.Manager() "
                   "server process (SyncManager), serving the DictProxy cache"}
finally:
    if state["it"] is not None:
        state["it"]._shutdown_workers()
    manager.shutdown()
n = own["steps"]


def share(v: float | None) -> float | None:
    return round(v / wall, 4) if v is not None else None


def r4(v: float | None) -> float | None:
    return round(v, 4) if v is not None else None


per_worker = []
for w_id in range(WORKERS):
    d = [b - a for a, b in zip(s0[NSTAT * w_id:NSTAT * (w_id + 1)], s1[NSTAT * w_id:NSTAT * (w_id + 1)])]
    per_worker.append({"worker_id": w_id, "samples": int(d[0]), "proxy_s": round(d[1], 4), "item_s": round(d[2], 4),
                       "hits": int(d[3]), "misses": int(d[4])})
for row in workers:
    a, z = w0.get(row["pid"]), w1.get(row["pid"])
    row.update({"run_s": r4(z[0] - a[0]) if a and z else None, "cpu_wait_s": r4(z[1] - a[1]) if a and z else None})
    row["cpu_share"], row["cpu_wait_share"] = share(row["run_s"]), share(row["cpu_wait_s"])


def total(key: str, rows: list[dict]) -> float | None:
    got = [r[key] for r in rows if r.get(key) is not None]
    return round(sum(got), 4) if got else None


proxy_s = total("proxy_s", per_worker) or 0.0
w_run, w_cpu_wait = total("run_s", workers), total("cpu_wait_s", workers)
fix_rate = fix_steps / fix_wall if fix_wall > 0 else None
at_fix = n / fix_rate if fix_rate else None
overhead = max(0.0, wall - at_fix) if at_fix is not None else None
main_run = r4(main1[0] - main0[0]) if main0 and main1 else None
main_wait = r4(main1[1] - main0[1]) if main0 and main1 else None
ag_run = r4(ag1[0] - ag0[0]) if ag0 and ag1 else None
ag_wait = r4(ag1[1] - ag0[1]) if ag0 and ag1 else None
mg_run = r4(mg1[0] - mg0[0]) if mg0 and mg1 else None
mg_wait = r4(mg1[1] - mg0[1]) if mg0 and mg1 else None
gpu_busy = n * gpu_step_s if gpu_step_s is not None else None
wait_off = max(0.0, own["wait_s"] - own["wait_cpu_s"])
nw = max(len(workers), 1)
samples = int(sum(r["samples"] for r in per_worker))
sc.extra["workers"] = workers
sc.extra["per_worker"] = per_worker
sc.extra["manager"] = manager_row
sc.extra["autograd"] = ag
sc.extra["self"] = {**{k: round(v, 4) if isinstance(v, float) else v for k, v in own.items()},
                    "wall_s": round(wall, 4), "steps_per_s": round(n / wall, 2),
                    "step_ms_mean": round(wall / max(n, 1) * 1e3, 3),
                    "wait_share": share(own["wait_s"]), "wait_cpu_share": share(own["wait_cpu_s"]),
                    "wait_off_cpu_s": round(wait_off, 4), "wait_off_cpu_share": share(wait_off),
                    "h2d_share": share(own["h2d_s"]), "backward_share": share(own["backward_s"]),
                    "item_share": share(own["item_s"]),
                    "samples": samples, "round_trips_per_sample": 2,
                    "cache_hits": int(sum(r["hits"] for r in per_worker)),
                    "cache_misses": int(sum(r["misses"] for r in per_worker)), "cached_samples": cached,
                    "proxy_s": round(proxy_s, 4),
                    # the workers' time in the proxy calls, as a share of their time (workers x run)
                    "proxy_share_of_workers": round(proxy_s / (nw * wall), 4),
                    "proxy_us_per_sample": round(proxy_s / max(samples, 1) * 1e6, 1),
                    "workers_run_s": w_run, "workers_cpu_share": round(w_run / (nw * wall), 4) if w_run else None,
                    "workers_cpu_wait_s": w_cpu_wait,
                    "workers_cpu_wait_max_share": max((r["cpu_wait_share"] or 0.0 for r in workers), default=None),
                    "manager_run_s": mg_run, "manager_cpu_share": share(mg_run),
                    "manager_cpu_wait_s": mg_wait, "manager_cpu_wait_share": share(mg_wait),
                    "manager_threads": len(manager_row["tids"]),
                    "fix_steps": fix_steps, "fix_wall_s": round(fix_wall, 4),
                    "fix_steps_per_s": round(fix_rate, 2) if fix_rate else None,
                    "fix_wait_share": r4(fix_wait_share),
                    "at_fix_rate_s": r4(at_fix), "manager_overhead_s": r4(overhead),
                    "manager_overhead_share": share(overhead),
                    "main_run_s": main_run, "main_cpu_share": share(main_run),
                    "main_cpu_wait_s": main_wait, "main_cpu_wait_share": share(main_wait),
                    "autograd_run_s": ag_run, "autograd_cpu_share": share(ag_run),
                    "autograd_cpu_wait_s": ag_wait, "autograd_cpu_wait_share": share(ag_wait),
                    "minor_faults_per_s": round((f1 - f0) / wall, 1), "cuda_mallocs_per_s": round((m1 - m0) / wall, 3),
                    "gpu_step_ms": round(gpu_step_s * 1e3, 4) if gpu_step_s is not None else None,
                    "gpu_busy_s": r4(gpu_busy), "gpu_busy_share": share(gpu_busy),
                    "batch": BATCH, "image": [3, SIDE, SIDE], "crop": CROP, "num_workers": WORKERS,
                    "raw_mb": round(raw_mb, 2), "cache_mb": round(N * 3 * SIDE * SIDE / 2 ** 20, 2)}
if not sc.cuda:
    sc.note("on the CPU: no autograd thread (the backward runs on the main thread), no GPU timings, no allocator "
            "counters.")
sc.note(f"natural: measured by the script: {n} steps ({n / wall:.1f}/s) in {wall:.2f} s: {own['wait_s']:.2f} s in "
        f"next() ({wait_off:.2f} s of it off the main thread's CPU); the {len(workers)} workers spent {proxy_s:.2f} s "
        f"in the cache's proxy calls ({proxy_s / max(samples, 1) * 1e6:.0f} us a sample); the manager process "
        f"({mpid}) ran {mg_run} s, waited for a CPU {mg_wait} s; with the cache in shared memory "
        f"{fix_rate and round(fix_rate, 1)} steps/s (the manager cost {overhead and round(overhead, 2)} s of the run); "
        f"the main thread ran {main_run} s, waited for a CPU {main_wait} s; "
        + (f"a step's kernels take {gpu_step_s * 1e3:.2f} ms of GPU time queued (GPU busy {gpu_busy / wall:.0%} of the "
           "run)." if gpu_busy is not None else "no GPU timings (no CUDA)."))
sc.write_truth(baseline=(b0, b1), window=None, ratio_spans=((b0, mid), (mid, b1)))