"""natural_healthy_sleepy_fetch_workers (natural, nothing staged): a control. A ViT-B/16 image classifier (width 768,
12 pre-norm layers, 12 heads, 196 patches and a class token, 1,000 classes; 64 images of 224 px a step, normalised on
the GPU, fp32 without TF32, fused AdamW, loss.item() each step its one wait for the GPU: ~100 ms of GPU work a step)
fed by DataLoader(num_workers=8, pin_memory=True, persistent_workers=True, prefetch_factor=4) over an infinite random
sampler, whose Dataset fetches each image from a rate-limited remote store, simulated: `time.sleep(FETCH_S)` a sample
(the request's round trip, sized at start-up to half the workers' time at the GPU's pace: FETCH_S = 0.5 x workers x
a step's GPU time / images a step, a few ms), then "decodes" it (the image's bytes from an in-memory blob store,
np.frombuffer) and takes a random 224 px crop and flip. The workers sleep most of their time (half the run each), the
decoys: eight processes asleep in clock_nanosleep, a wait on a remote fetch in every sample; the loader keeps ~32
batches ready and the main thread's next() returns at once. The pin-memory thread pins each 9.6 MB batch. The main
process and its workers on CPUs 2-7; no threads of the job's own, no children but the workers (started before the
run), no IO (the blobs are in memory), no lock; the sleeps are the workers' alone. 20 s (smaller with --device cpu: 64
px images, patches of 8, a ViT of width 64 and 2 layers, 8 images a step).

The script measures itself: the steps per second; the main thread's time in next() on the loader (`wait_s`, its CPU
clock `wait_cpu_s`), copying the pinned batch to the GPU (`h2d_s`), queueing the forward and the optimiser step
(`step_s`), in loss.backward() (`backward_s`, its wait on PyTorch's autograd thread) and in loss.item() (`item_s`: its
wait for the GPU); for each worker (truth `workers`: pid, tids, comm) the images it made, its time asleep in the fetch
(`fetch_s`), in __getitem__ in all, and its time on a CPU and waiting for one (schedstat); the pin-memory thread's
(truth `pin_thread`) time on a CPU and waiting for one; before the run, the same loop on one batch kept on the GPU (no
loader at all), so that what the loader costs the run is known (`loader_overhead_s`: the run's wall time beyond its
steps at that rate); the main thread's and the autograd thread's time on a CPU and waiting for one over the run
(schedstat); the process's minor and major page faults, the device allocator's cudaMalloc calls and the caching host
allocator's cudaHostAlloc calls; and a step's GPU time queued (common.gpu_seconds_queued, in three parts so that none
fills the launch queue: the forward with the loss, the backward, AdamW), so that the GPU's busy share is known. Truth
`autograd` names PyTorch's autograd thread, `decoys` the workers and the pin-memory thread, `fetch` the sleep."""

import multiprocessing
import os
import resource
import threading
import time

from common import Scenario, comm_of, gpu_seconds_queued, tids_of

sc = Scenario("natural_healthy_sleepy_fetch_workers", "natural", "a GPU-bound ViT-B/16 (64 images of 224 px a step) "
              "fed by 8 DataLoader workers that sleep in a simulated rate-limited remote fetch of every image (half "
              "their time) yet keep ~32 batches ready, and a pin-memory thread, as decoys, 20 s, nothing staged",
              job_cpus=[2, 3, 4, 5, 6, 7], control=True)
import numpy as np  # noqa: E402
import torch  # noqa: E402

nn = torch.nn
F = nn.functional
PID, MAIN = os.getpid(), threading.get_native_id()
dev = torch.device(sc.device)
if sc.cuda:
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
N, SRC, OUT, PATCH, WIDTH, DEPTH, HEADS, BATCH = ((512, 256, 224, 16, 768, 12, 12, 64) if sc.cuda
                                                  else (64, 72, 64, 8, 64, 2, 4, 8))
WORKERS, PREFETCH, CLASSES, SLEEP_SHARE = 8, 4, 1000, 0.5
FETCH_BOUNDS = (0.002, 0.05)  # the simulated round trip, clamped to 2-50 ms
NSTAT = 3  # per worker: images, fetch (asleep) wall, __getitem__ wall
STATS = multiprocessing.RawArray("d", NSTAT * WORKERS)  # shared with the forked workers
FETCH = {"s": FETCH_BOUNDS[0]}  # set before the workers are forked; they inherit it


def make_blobs() -> tuple[dict[str, bytes], np.ndarray]:
    """The "remote store": one raw 3xSRCxSRC uint8 blob a key (smooth colours and sensor noise), and the labels."""
    rng = np.random.default_rng(0)
    low = rng.integers(0, 256, (N, 3, SRC // 8, SRC // 8)).astype(np.float32)
    blobs = {}
    for i in range(N):
        img = np.repeat(np.repeat(low[i], 8, 1), 8, 2) + 12 * rng.standard_normal((3, SRC, SRC), dtype=np.float32)
        blobs[f"train/{i:06d}.raw"] = np.clip(img, 0, 255).astype(np.uint8).tobytes()
    return blobs, rng.integers(0, CLASSES, N)


class RemoteImages(torch.utils.data.Dataset):
    """Image i fetched from the store (a rate-limited request: a sleep), decoded, cropped and flipped."""

    def __init__(self, blobs: dict[str, bytes], labels: np.ndarray) -> None:
        self.blobs, self.labels = blobs, labels

    def __len__(self) -> int:
        return len(self.labels)

    def fetch(self, key: str) -> bytes:
        time.sleep(FETCH["s"])  # the store's round trip (rate-limited)
        return self.blobs[key]

    def __getitem__(self, i: int):
        t0 = time.perf_counter()
        w = torch.utils.data.get_worker_info()
        wid = w.id if w is not None else 0
        raw = self.fetch(f"train/{i:06d}.raw")
        t1 = time.perf_counter()
        img = np.frombuffer(raw, np.uint8).reshape(3, SRC, SRC)
        rng = np.random.default_rng()
        y0, x0 = rng.integers(0, SRC - OUT + 1, 2)
        img = img[:, y0:y0 + OUT, x0:x0 + OUT]
        if rng.random() < 0.5:
            img = img[:, :, ::-1]
        out = torch.from_numpy(np.ascontiguousarray(img))
        base = NSTAT * wid
        STATS[base] += 1
        STATS[base + 1] += t1 - t0
        STATS[base + 2] += time.perf_counter() - t0
        return out, int(self.labels[i])


class InfiniteSampler(torch.utils.data.Sampler):
    """A new random permutation after another, for ever (DINOv2's and detectron2's training sampler)."""

    def __init__(self, n: int, seed: int = 0) -> None:
        self.n, self.seed = n, seed

    def __iter__(self):
        g = torch.Generator().manual_seed(self.seed)
        while True:
            yield from torch.randperm(self.n, generator=g).tolist()


class ViT(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.patch = nn.Conv2d(3, WIDTH, PATCH, PATCH)
        ntok = (OUT // PATCH) ** 2 + 1
        self.cls = nn.Parameter(torch.zeros(1, 1, WIDTH))
        self.pos = nn.Parameter(0.02 * torch.randn(1, ntok, WIDTH))
        layer = nn.TransformerEncoderLayer(WIDTH, HEADS, 4 * WIDTH, dropout=0.0, activation="gelu", batch_first=True,
                                           norm_first=True)
        self.blocks = nn.TransformerEncoder(layer, DEPTH, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(WIDTH)
        self.head = nn.Linear(WIDTH, CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.patch(x).flatten(2).transpose(1, 2)
        x = torch.cat([self.cls.expand(len(x), -1, -1), x], 1) + self.pos
        return self.head(self.norm(self.blocks(x))[:, 0])


def schedstat(pid: int, tid: int) -> tuple[float, float] | None:
    try:
        with open(f"/proc/{pid}/task/{tid}/schedstat") as fh:
            run, wait = fh.read().split()[:2]
        return int(run) / 1e9, int(wait) / 1e9
    except (OSError, ValueError):
        return None


def thread_named(prefix: str) -> dict | None:
    for tid in tids_of(PID):
        comm = comm_of(PID, tid) or ""
        if comm.startswith(prefix):
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


KEYS = ("wait_s", "wait_cpu_s", "h2d_s", "step_s", "backward_s", "item_s")
own = {"steps": 0, **dict.fromkeys(KEYS, 0.0), "running_loss": 0.0}
mode = {"loader": True}
state: dict = {"it": None, "fixed": None}
blobs, labels_np = make_blobs()
loader = torch.utils.data.DataLoader(RemoteImages(blobs, labels_np), batch_size=BATCH, sampler=InfiniteSampler(N),
                                     num_workers=WORKERS, pin_memory=sc.cuda, persistent_workers=True, drop_last=True,
                                     prefetch_factor=PREFETCH)
torch.manual_seed(0)
model = ViT().to(dev)
opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.05, fused=sc.cuda or None)
mean = torch.tensor([0.485, 0.456, 0.406], device=dev).view(1, 3, 1, 1) * 255
std = torch.tensor([0.229, 0.224, 0.225], device=dev).view(1, 3, 1, 1) * 255


def loss_of(img: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(model((img.float() - mean) / std), y, label_smoothing=0.1)


def train(img: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    t0 = time.perf_counter()
    loss = loss_of(img, y)
    opt.zero_grad(set_to_none=True)
    t1 = time.perf_counter()
    loss.backward()
    t2 = time.perf_counter()
    opt.step()
    own["backward_s"] += t2 - t1
    own["step_s"] += (t1 - t0) + (time.perf_counter() - t2)
    return loss


def step() -> None:
    t0, c0 = time.perf_counter(), time.thread_time()
    img, y = next(state["it"]) if mode["loader"] else state["fixed"]
    t1, c1 = time.perf_counter(), time.thread_time()
    img, y = img.to(dev, non_blocking=True), y.to(dev, non_blocking=True)
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


def reset() -> None:
    for k in own:
        own[k] = 0 if k == "steps" else 0.0


def timed(seconds: float) -> tuple[int, float]:
    n0, t = own["steps"], time.perf_counter()
    end = t + seconds
    while time.perf_counter() < end:
        step()
    sync()
    return own["steps"] - n0, time.perf_counter() - t


def median_gpu_s(work, prepare=None) -> float | None:
    runs = sorted(r for r in (gpu_seconds_queued(torch, work, prepare) for _ in range(3)) if r is not None)
    return runs[len(runs) // 2] if runs else None


try:
    # Before the workers exist: the step warmed up on a batch made here, its GPU time measured, the fetch sized.
    g = torch.Generator().manual_seed(1)
    state["fixed"] = (torch.randint(0, 256, (BATCH, 3, OUT, OUT), dtype=torch.uint8, generator=g).to(dev),
                      torch.randint(0, CLASSES, (BATCH,), generator=g).to(dev))
    mode["loader"] = False
    for _ in range(5):  # warm-up: cuBLAS and the attention kernels chosen, the allocator, the autograd thread
        step()
    sync()
    gpu_step_s = gpu_fwd_s = gpu_bwd_s = gpu_opt_s = None
    if sc.cuda:
        def backward_prepared() -> torch.Tensor:
            opt.zero_grad(set_to_none=True)
            return loss_of(*state["fixed"])

        def grads_prepared() -> None:
            opt.zero_grad(set_to_none=True)
            loss_of(*state["fixed"]).backward()

        gpu_fwd_s = median_gpu_s(lambda _: loss_of(*state["fixed"]))
        gpu_bwd_s = median_gpu_s(lambda loss: loss.backward(), backward_prepared)
        gpu_opt_s = median_gpu_s(lambda _: opt.step(), grads_prepared)
        if None not in (gpu_fwd_s, gpu_bwd_s, gpu_opt_s):
            gpu_step_s = gpu_fwd_s + gpu_bwd_s + gpu_opt_s
        opt.zero_grad(set_to_none=True)
    # Without the loader first: one batch kept on the GPU (what the loader costs, were it a cost).
    timed(0.5 * sc.scale)
    reset()
    fix_steps, fix_wall = timed(3.0 * sc.scale)
    fix_rate = fix_steps / fix_wall if fix_wall > 0 else None
    pace = gpu_step_s or (1 / fix_rate if fix_rate else 0.1)  # a step's GPU time (the loop's, on the CPU)
    FETCH["s"] = min(max(SLEEP_SHARE * WORKERS * pace / BATCH, FETCH_BOUNDS[0]), FETCH_BOUNDS[1])
    mode["loader"] = True
    state["it"] = iter(loader)  # the workers forked now, with FETCH's value
    for _ in range(3):
        step()
    timed(4.0 * sc.scale)  # the loader's queue full, the spin kernels well before the run
    wpids = sorted(p.pid for p in multiprocessing.active_children())
    ag, pin = thread_named("pt_autograd"), thread_named("pt_data_pin")
    reset()
    s0 = list(STATS)
    w0 = {p: schedstat(p, p) for p in wpids}
    main0, ag0 = schedstat(PID, MAIN), schedstat(PID, ag["tid"]) if ag else None
    pin0 = schedstat(PID, pin["tid"]) if pin else None
    r0 = resource.getrusage(resource.RUSAGE_SELF)
    m0, h0 = allocs()
    b0 = sc.mark("baseline")
    t = time.perf_counter()
    sc.run_for(10.0 * sc.scale, step)
    mid = sc.mark("half")
    sc.run_for(10.0 * sc.scale, step)
    sync()
    b1 = sc.mark("end")
    wall = time.perf_counter() - t
    main1, ag1 = schedstat(PID, MAIN), schedstat(PID, ag["tid"]) if ag else None
    pin1 = schedstat(PID, pin["tid"]) if pin else None
    r1 = resource.getrusage(resource.RUSAGE_SELF)
    m1, h1 = allocs()
    s1 = list(STATS)
    w1 = {p: schedstat(p, p) for p in wpids}
    workers = [{"pid": p, "tids": tids_of(p), "comm": comm_of(p)} for p in wpids]
finally:
    if state["it"] is not None:
        state["it"]._shutdown_workers()
n = own["steps"]


def share(v: float | None) -> float | None:
    return round(v / wall, 4) if v is not None else None


def r4(v: float | None) -> float | None:
    return round(v, 4) if v is not None else None


def delta(a, b, k: int) -> float | None:
    return r4(b[k] - a[k]) if a and b else None


per_worker = []
for w_id in range(WORKERS):
    d = [b - a for a, b in zip(s0[NSTAT * w_id:NSTAT * (w_id + 1)], s1[NSTAT * w_id:NSTAT * (w_id + 1)])]
    per_worker.append({"worker_id": w_id, "images": int(d[0]), "fetch_s": round(d[1], 4),
                       "getitem_s": round(d[2], 4), "fetch_share": share(d[1])})
for row in workers:
    a, z = w0.get(row["pid"]), w1.get(row["pid"])
    row.update({"run_s": delta(a, z, 0), "cpu_wait_s": delta(a, z, 1)})
    row["cpu_share"], row["cpu_wait_share"] = share(row["run_s"]), share(row["cpu_wait_s"])
nw = max(len(workers), 1)
fetch_s = sum(r["fetch_s"] for r in per_worker)
getitem_s = sum(r["getitem_s"] for r in per_worker)
imgs = sum(r["images"] for r in per_worker)
w_shares = [r["cpu_share"] for r in workers if r["cpu_share"] is not None]
at_fix = n / fix_rate if fix_rate else None
overhead = max(0.0, wall - at_fix) if at_fix is not None else None
main_run, main_wait = delta(main0, main1, 0), delta(main0, main1, 1)
ag_run, ag_wait = delta(ag0, ag1, 0), delta(ag0, ag1, 1)
pin_run, pin_wait = delta(pin0, pin1, 0), delta(pin0, pin1, 1)
gpu_busy = n * gpu_step_s if gpu_step_s is not None else None
busy_share = getitem_s / (nw * wall) if wall > 0 else None
span = [b0, b1]
pin_row = ({**pin, "tids": [pin["tid"]]} if pin else None)
sc.extra["workers"] = workers
sc.extra["per_worker"] = per_worker
sc.extra["pin_thread"] = pin_row
sc.extra["autograd"] = ag
sc.extra["fetch"] = {"what": "time.sleep(FETCH_S) in RemoteImages.fetch, a simulated rate-limited remote read of every "
                             "image, in the DataLoader workers", "class": "RemoteImages",
                     "function": "RemoteImages.fetch", "file": os.path.basename(__file__),
                     "fetch_ms": round(FETCH["s"] * 1e3, 3)}
sc.extra["decoys"] = ([{"what": "DataLoader worker asleep in a simulated remote fetch", **w, "span_ns": span}
                       for w in workers]
                      + ([{"what": "PyTorch's pin-memory thread", **pin_row, "span_ns": span}] if pin_row else []))
sc.extra["self"] = {**{k: round(v, 4) if isinstance(v, float) else v for k, v in own.items()},
                    "wall_s": round(wall, 4), "steps_per_s": round(n / wall, 2),
                    "step_ms_mean": round(wall / max(n, 1) * 1e3, 3),
                    "wait_share": share(own["wait_s"]), "wait_cpu_share": share(own["wait_cpu_s"]),
                    "wait_off_cpu_s": round(max(0.0, own["wait_s"] - own["wait_cpu_s"]), 4),
                    "h2d_share": share(own["h2d_s"]), "step_share": share(own["step_s"]),
                    "backward_share": share(own["backward_s"]), "item_share": share(own["item_s"]),
                    "fetch_ms": round(FETCH["s"] * 1e3, 3), "images": imgs, "fetch_s": round(fetch_s, 4),
                    "getitem_s": round(getitem_s, 4),
                    "getitem_ms_per_image": round(getitem_s / max(imgs, 1) * 1e3, 3),
                    # the workers' time asleep in the fetch and in __getitem__ in all, as shares of their time
                    # (workers x run); the inverse of the second is how many times the run's rate they could feed
                    "workers_sleep_share": round(fetch_s / (nw * wall), 4),
                    "workers_busy_share": r4(busy_share),
                    "loader_headroom": round(1 / busy_share, 3) if busy_share else None,
                    "workers_cpu_share_mean": round(sum(w_shares) / len(w_shares), 4) if w_shares else None,
                    "workers_cpu_share_max": max(w_shares, default=None),
                    "workers_cpu_wait_max_share": max((r["cpu_wait_share"] or 0.0 for r in workers), default=None),
                    "pin_run_s": pin_run, "pin_cpu_share": share(pin_run),
                    "pin_cpu_wait_s": pin_wait, "pin_cpu_wait_share": share(pin_wait),
                    "fix_steps": fix_steps, "fix_wall_s": round(fix_wall, 4),
                    "fix_steps_per_s": round(fix_rate, 3) if fix_rate else None,
                    "at_fix_rate_s": r4(at_fix), "loader_overhead_s": r4(overhead),
                    "loader_overhead_share": share(overhead),
                    "main_run_s": main_run, "main_cpu_share": share(main_run),
                    "main_cpu_wait_s": main_wait, "main_cpu_wait_share": share(main_wait),
                    "autograd_run_s": ag_run, "autograd_cpu_share": share(ag_run),
                    "autograd_cpu_wait_s": ag_wait, "autograd_cpu_wait_share": share(ag_wait),
                    "minor_faults_per_s": round((r1.ru_minflt - r0.ru_minflt) / wall, 1),
                    "major_faults": r1.ru_majflt - r0.ru_majflt,
                    "cuda_mallocs_per_s": round((m1 - m0) / wall, 3),
                    "host_allocs_per_s": round((h1 - h0) / wall, 3) if h0 is not None and h1 is not None else None,
                    "gpu_fwd_ms": round(gpu_fwd_s * 1e3, 3) if gpu_fwd_s is not None else None,
                    "gpu_bwd_ms": round(gpu_bwd_s * 1e3, 3) if gpu_bwd_s is not None else None,
                    "gpu_opt_ms": round(gpu_opt_s * 1e3, 3) if gpu_opt_s is not None else None,
                    "gpu_step_ms": round(gpu_step_s * 1e3, 3) if gpu_step_s is not None else None,
                    "gpu_busy_s": r4(gpu_busy), "gpu_busy_share": share(gpu_busy),
                    "batch": BATCH, "width": WIDTH, "depth": DEPTH, "image_px": OUT, "num_workers": WORKERS,
                    "prefetch_factor": PREFETCH}
if not sc.cuda:
    sc.note("on the CPU: no autograd thread (the backward runs on the main thread), no pin-memory thread, no GPU "
            "timings, no allocator counters; the job is not GPU-bound there.")
sc.note(f"natural: measured by the script: {n} steps ({n / wall:.2f}/s) in {wall:.2f} s: {own['wait_s']:.3f} s in "
        f"next(), {own['item_s']:.2f} s in .item() (waiting for the GPU); the {len(workers)} workers made {imgs} "
        f"images, asleep in the fetch ({FETCH['s'] * 1e3:.1f} ms each) {fetch_s:.1f} s, "
        f"{fetch_s / (nw * wall):.0%} of their time; the pin-memory thread ran {pin_run} s; without the loader "
        f"{fix_rate and round(fix_rate, 2)} steps/s (the loader cost {overhead and round(overhead, 2)} s of the run); "
        f"the main thread ran {main_run} s, waited for a CPU {main_wait} s; "
        + (f"a step's kernels take {gpu_step_s * 1e3:.1f} ms of GPU time queued (GPU busy {gpu_busy / wall:.0%} of the "
           "run)." if gpu_busy is not None else "no GPU timings (no CUDA)."))
sc.write_truth(baseline=(b0, b1), window=None, ratio_spans=((b0, mid), (mid, b1)))
