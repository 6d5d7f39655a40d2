"""natural_locked_sample_cache (natural, nothing staged): a vision training script with a hand-written data path: a
Dataset of 384 images (3x320x320 uint8, ~300 KB each) kept zlib-compressed in RAM (as they came from a packed shard),
read through a shared in-memory LRU cache of decoded samples (an OrderedDict of 128 entries, a third of the dataset)
guarded by one threading.Lock held over the whole lookup-or-load: a miss inflates the sample with zlib.decompress and
np.frombuffer(...).reshape()s it (and copies it, so that the cache owns its array) under the lock, then inserts it and
evicts the oldest; so misses (about two in three, at random indices) are decoded one at a time. __getitem__ then crops
a random 256x256 window and flips it at random outside the lock. The samples are made by a
concurrent.futures.ThreadPoolExecutor(4, thread_name_prefix="cache_pool") in the main process (no DataLoader): the
main thread submits a batch's 64 indices, gathers them (f.result()), submits the next batch's (one batch of prefetch),
stacks the uint8 crops, copies the batch to the GPU (pageable), normalises it there and trains a small conv net (five
strided 3x3 convolutions with BatchNorm, channels_last, bf16 autocast, SGD with momentum, loss.item() each step). The
pool's threads are named cache_pool_0..3 (the OS name too, set in the pool's initializer). CPUs 2-5 for the whole
process, 20 s. The script measures itself: the steps per second; the main thread's time in f.result() (waiting for
the batch: wall and CPU), stacking and copying, queueing the step and in .item(), its time on a CPU and waiting for one
(schedstat); the pool threads' time waiting to acquire the cache lock and holding it (timed around acquire() and the
locked block), their tasks' wall and CPU time, and their schedstat; the cache's hits and misses; the process's minor
page faults and cudaMalloc calls; and a step's GPU time queued (common.gpu_seconds_queued, from a batch already on the
GPU), so that the GPU's busy share is known. Truth `pool` names the threads (pid, tids, comms)."""

import collections
import concurrent.futures
import os
import resource
import threading
import time
import zlib

import numpy as np

from common import Scenario, gpu_seconds_queued, set_thread_name

sc = Scenario("natural_locked_sample_cache", "natural", "a conv net fed by a 4-thread pool reading samples through "
              "an LRU cache of decoded images guarded by one lock held while a miss is inflated (zlib), 20 s, "
              "nothing staged", job_cpus=[2, 3, 4, 5], control=True)
import torch  # noqa: E402

nn = torch.nn
PID, MAIN = os.getpid(), threading.get_native_id()
dev = torch.device(sc.device)
NIMG, SIDE, CROP, NCLASS, THREADS, CACHE = (384, 320, 256, 100, 4, 128) if sc.cuda else (96, 160, 128, 100, 4, 32)
BATCH, WIDTHS = (64, (32, 64, 128, 256, 256)) if sc.cuda else (16, (8, 16, 16, 32, 32))

rng0 = np.random.default_rng(0)


def make_image() -> bytes:
    """A smooth picture with sensor noise (compresses to about half), zlib level 1 as a shard packer writes it."""
    low = rng0.integers(0, 256, (3, SIDE // 16, SIDE // 16), dtype=np.uint8)
    img = np.repeat(np.repeat(low, 16, axis=1), 16, axis=2)
    img = img + rng0.integers(0, 12, img.shape, dtype=np.uint8)
    return zlib.compress(img.tobytes(), 1)


shards = [make_image() for _ in range(NIMG)]
labels = rng0.integers(0, NCLASS, NIMG)


class CachedDataset:
    """Decoded samples behind an LRU cache; one lock over the lookup and the load (a miss decodes under it)."""

    def __init__(self) -> None:
        self.cache: collections.OrderedDict[int, np.ndarray] = collections.OrderedDict()
        self.lock = threading.Lock()
        self.count_lock = threading.Lock()
        self.stats = {"hits": 0, "misses": 0, "lock_wait_s": 0.0, "lock_held_s": 0.0, "tasks": 0, "task_s": 0.0,
                      "task_cpu_s": 0.0}
        self.local = threading.local()

    def _decoded(self, i: int) -> np.ndarray:
        t0 = time.perf_counter()
        with self.lock:
            t1 = time.perf_counter()
            img = self.cache.get(i)
            if img is not None:
                self.cache.move_to_end(i)
                self.stats["hits"] += 1
            else:
                raw = zlib.decompress(shards[i])
                img = np.frombuffer(raw, np.uint8).reshape(3, SIDE, SIDE).copy()
                self.cache[i] = img
                if len(self.cache) > CACHE:
                    self.cache.popitem(last=False)
                self.stats["misses"] += 1
            t2 = time.perf_counter()
            self.stats["lock_wait_s"] += t1 - t0
            self.stats["lock_held_s"] += t2 - t1
        return img

    def __getitem__(self, i: int) -> tuple[np.ndarray, int]:
        t0, c0 = time.perf_counter(), time.thread_time()
        img = self._decoded(i)
        rng = self.local.rng
        top, left = rng.integers(0, SIDE - CROP + 1, 2)
        x = img[:, top:top + CROP, left:left + CROP]
        if rng.random() < 0.5:
            x = x[:, :, ::-1]
        x = np.ascontiguousarray(x)
        t1, c1 = time.perf_counter(), time.thread_time()
        with self.count_lock:  # the measurement's own counters, apart from the cache's lock
            self.stats["tasks"] += 1
            self.stats["task_s"] += t1 - t0
            self.stats["task_cpu_s"] += c1 - c0
        return x, int(labels[i])


ds = CachedDataset()
pool_threads: dict[int, str] = {}
names_lock = threading.Lock()


def name_thread() -> None:
    with names_lock:
        k = len(pool_threads)
        pool_threads[threading.get_native_id()] = f"cache_pool_{k}"
    set_thread_name(f"cache_pool_{k}")
    ds.local.rng = np.random.default_rng(1000 + k)


def conv_net() -> nn.Module:
    layers, cin = [], 3
    for w in WIDTHS:
        layers += [nn.Conv2d(cin, w, 3, 2, 1, bias=False), nn.BatchNorm2d(w), nn.ReLU()]
        cin = w
    return nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(cin, NCLASS))


torch.manual_seed(0)
model = conv_net().to(dev, memory_format=torch.channels_last)
opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
mean = torch.tensor([0.485, 0.456, 0.406], device=dev).view(1, 3, 1, 1) * 255
std = torch.tensor([0.229, 0.224, 0.225], device=dev).view(1, 3, 1, 1) * 255
pool = concurrent.futures.ThreadPoolExecutor(THREADS, thread_name_prefix="cache_pool", initializer=name_thread)
order = np.random.default_rng(7)
own = {"steps": 0, "wait_s": 0.0, "wait_cpu_s": 0.0, "stack_copy_s": 0.0, "issue_s": 0.0, "item_s": 0.0}


def submit() -> list:
    return [pool.submit(ds.__getitem__, int(i)) for i in order.integers(0, NIMG, BATCH)]


def train(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    x = ((x.float() - mean) / std).contiguous(memory_format=torch.channels_last)
    with torch.autocast(sc.device, dtype=torch.bfloat16, enabled=sc.cuda):
        loss = nn.functional.cross_entropy(model(x).float(), y)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    return loss


pending = [submit()]


def step() -> None:
    t0, c0 = time.perf_counter(), time.thread_time()
    samples = [f.result() for f in pending[0]]
    t1, c1 = time.perf_counter(), time.thread_time()
    pending[0] = submit()  # the next batch is made while this one trains
    x = torch.from_numpy(np.stack([s[0] for s in samples])).to(dev)
    y = torch.tensor([s[1] for s in samples]).to(dev)
    t2 = time.perf_counter()
    loss = train(x, y)
    t3 = time.perf_counter()
    loss.item()
    t4 = time.perf_counter()
    own["steps"] += 1
    own["wait_s"] += t1 - t0
    own["wait_cpu_s"] += c1 - c0
    own["stack_copy_s"] += t2 - t1
    own["issue_s"] += t3 - t2
    own["item_s"] += t4 - t3


def schedstat(tid: int) -> tuple[float, float] | None:
    try:
        with open(f"/proc/{PID}/task/{tid}/schedstat") as fh:
            run, wait = fh.read().split()[:2]
        return int(run) / 1e9, int(wait) / 1e9
    except (OSError, ValueError):
        return None


def mallocs() -> int:
    return int(torch.cuda.memory_stats().get("segment.all.allocated", 0)) if sc.cuda else 0


def sync() -> None:
    if sc.cuda:
        torch.cuda.synchronize()


for _ in range(10):  # warm-up: cuDNN's algorithms, the allocator, the cache's first samples
    step()
sync()
gpu_step_s = None
if sc.cuda:
    gx = torch.randint(0, 256, (BATCH, 3, CROP, CROP), dtype=torch.uint8, device=dev)
    gy = torch.randint(0, NCLASS, (BATCH,), device=dev)

    def work(_) -> None:
        """One step's GPU work from a batch already on the GPU, nothing read back."""
        train(gx, gy)

    work(None)
    runs = sorted(r for r in (gpu_seconds_queued(torch, work) for _ in range(5)) if r is not None)
    gpu_step_s = runs[len(runs) // 2] if runs else None
warm_end = time.perf_counter() + 1.5 * sc.scale  # the spin kernels well before the run
while time.perf_counter() < warm_end:
    step()
sync()
for k in own:
    own[k] = 0 if k == "steps" else 0.0
with ds.lock, ds.count_lock:
    for k in ds.stats:
        ds.stats[k] = 0 if k in ("hits", "misses", "tasks") else 0.0
ptids = sorted(pool_threads)
main0, pool0 = schedstat(MAIN), {t: schedstat(t) for t in ptids}
f0, m0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt, mallocs()
b0 = sc.mark("baseline")
t = time.perf_counter()
sc.run_for(10.0 * sc.scale, step)
mid = sc.mark("half")
sc.run_for(10.0 * sc.scale, step)
sync()
b1 = sc.mark("end")
wall = time.perf_counter() - t
main1, pool1 = schedstat(MAIN), {t: schedstat(t) for t in ptids}
f1, m1 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt, mallocs()
with ds.lock, ds.count_lock:
    cst = dict(ds.stats)
pool.shutdown(wait=True, cancel_futures=True)
n = own["steps"]


def share(v: float | None, of: float | None = None) -> float | None:
    return round(v / (of or wall), 4) if v is not None else None


main_run = round(main1[0] - main0[0], 4) if main0 and main1 else None
main_wait = round(main1[1] - main0[1], 4) if main0 and main1 else None
ok = all(pool0[t] and pool1[t] for t in ptids)
pool_run = round(sum(pool1[t][0] - pool0[t][0] for t in ptids), 4) if ok else None
pool_cpu_wait = round(sum(pool1[t][1] - pool0[t][1] for t in ptids), 4) if ok else None
lookups = max(cst["hits"] + cst["misses"], 1)
gpu_busy = n * gpu_step_s if gpu_step_s is not None else None
thread_s = THREADS * wall
sc.extra["pool"] = {"pid": PID, "tids": ptids, "comms": [pool_threads[k] for k in ptids]}
sc.extra["self"] = {**{k: round(v, 4) for k, v in own.items()}, "wall_s": round(wall, 4),
                    "steps_per_s": round(n / wall, 2), "wait_share": share(own["wait_s"]),
                    "wait_off_cpu_s": round(max(0.0, own["wait_s"] - own["wait_cpu_s"]), 4),
                    "stack_copy_share": share(own["stack_copy_s"]), "issue_share": share(own["issue_s"]),
                    "item_share": share(own["item_s"]),
                    "main_run_s": main_run, "main_cpu_share": share(main_run),
                    "main_cpu_wait_s": main_wait, "main_cpu_wait_share": share(main_wait),
                    "hits": cst["hits"], "misses": cst["misses"], "hit_rate": round(cst["hits"] / lookups, 4),
                    "lock_wait_s": round(cst["lock_wait_s"], 4), "lock_held_s": round(cst["lock_held_s"], 4),
                    "lock_wait_share_of_pool": share(cst["lock_wait_s"], thread_s),
                    "lock_held_share": share(cst["lock_held_s"]),
                    "lock_wait_per_lookup_ms": round(cst["lock_wait_s"] / lookups * 1e3, 4),
                    "lock_held_per_miss_ms": round(cst["lock_held_s"] / max(cst["misses"], 1) * 1e3, 4),
                    "samples_made": cst["tasks"], "task_s": round(cst["task_s"], 4),
                    "task_cpu_s": round(cst["task_cpu_s"], 4),
                    "pool_busy_share": share(cst["task_s"], thread_s),
                    "pool_run_s": pool_run, "pool_cpu_share": share(pool_run, thread_s),
                    "pool_cpu_wait_s": pool_cpu_wait, "pool_cpu_wait_share": share(pool_cpu_wait, thread_s),
                    "minor_faults_per_s": round((f1 - f0) / wall, 1), "cuda_mallocs_per_s": round((m1 - m0) / wall, 3),
                    "gpu_step_ms": round(gpu_step_s * 1e3, 4) if gpu_step_s is not None else None,
                    "gpu_busy_s": round(gpu_busy, 4) if gpu_busy is not None else None,
                    "gpu_busy_share": share(gpu_busy), "batch": BATCH, "threads": THREADS,
                    "cache_entries": CACHE, "dataset": NIMG}
sc.note(f"natural: measured by the script: {n} steps ({n / wall:.1f}/s) in {wall:.2f} s, {own['wait_s']:.2f} s in "
        f"f.result() (waiting for the batch); the pool's threads waited {cst['lock_wait_s']:.2f} s for the cache lock "
        f"and held it {cst['lock_held_s']:.2f} s; hit rate {cst['hits'] / lookups:.0%}; the main thread ran "
        f"{main_run} s; "
        + (f"a step's kernels take {gpu_step_s * 1e3:.2f} ms of GPU time queued (GPU busy {gpu_busy / wall:.0%} of the "
           "run)." if gpu_busy is not None else "no GPU timings (no CUDA)."))
sc.write_truth(baseline=(b0, b1), window=None, ratio_spans=((b0, mid), (mid, b1)))
