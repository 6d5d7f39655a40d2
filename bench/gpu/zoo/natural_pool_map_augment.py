"""natural_pool_map_augment (natural, nothing staged): an image classifier whose author parallelised the augmentation
with a multiprocessing.Pool instead of a DataLoader, the way a script grown from a notebook often does it:

    pool = multiprocessing.Pool(3)                      # at the top, before the model is built
    ...
    for step in range(steps):
        idx = rng.choice(len(images), BATCH)
        crops = pool.map(augment, [images[i] for i in idx])      # every step, and wait for all of them
        x = torch.from_numpy(np.stack(crops)).to(device, non_blocking=True)

pool.map() is synchronous: the main thread submits the batch's 128 decoded images (160x160x3 uint8, HWC as PIL gives
them: ~9.8 MB pickled by the pool's task-handler thread and written into the pool's pipe), and sleeps until the three
pool processes (forked at start-up, `ForkPoolWorker-N`, their OS name the parent's) have unpickled them, augmented each
in numpy (a random resized crop to 128x128 with bilinear interpolation, a random horizontal flip, brightness, contrast
and saturation jitter: ~1-3 ms an image) and pickled the 128 crops back (~6.3 MB), which the pool's result-handler
thread reads and unpickles; nothing overlaps the GPU's step, which waits for the next batch, and the pool idles while
the GPU works. Then the main thread stacks the crops, copies the batch to the GPU (pageable, non_blocking), normalises
it there and trains a ResNet-34-style net (BasicBlocks 3-4-6-3, widths 64-128-256-512, a stride-2 stem; channels_last,
bf16 autocast, SGD with Nesterov momentum, 100 classes, loss.item() each step). The pool's work per batch is several
times the step's GPU work: the main thread waits in pool.map() most of the run. The job (the main process, the pool
processes it forked) on CPUs 2-5: three pool processes, the main thread and the pool's threads; no DataLoader, no
other children, no IO (the images are made in memory at set-up), no lock of the job's own, no sleep. 20 s (smaller
with --device cpu: 64 crops a batch, a narrower net).

The script measures itself: the steps per second; the main thread's time in pool.map() (`map_s`, its CPU clock in it
`map_cpu_s`, the rest `map_off_cpu_s`: off its CPU), building the task list (`gather_s`), stacking the crops
(`stack_s`), copying the batch to the GPU (`h2d_s`), queueing the forward and the optimiser step (`issue_s`), in
loss.backward() (`backward_s`, its wait on PyTorch's autograd thread) and in loss.item() (`item_s`); each pool
process's (truth `pool`: pids, tids) images, its time in augment() (wall and CPU clock, sent through shared memory),
its time on a CPU and waiting for one over the run (schedstat); the pool's task-handler and result-handler threads
(truth `pool.handler_tids`: threads of the main process that pickle the tasks and unpickle the results) and their CPU
time; before the run, the same loop on one augmented batch kept on the GPU (no pool: `gpu_only`), so that what the
pool's synchronous map costs the run is known (`pool_overhead_s`: the run's time beyond its steps at that rate); the
main thread's and the autograd thread's time on a CPU and waiting for one over the run (schedstat); the process's
minor page faults and the device allocator's cudaMalloc calls; and a step's GPU time (queued behind a spin:
common.gpu_seconds_queued, the forward, loss, backward and SGD step on a batch already on the GPU, nothing read back;
failing that, CUDA events around 10 steps queued back to back; failing that, the host's clock around them: truth
`gpu_time_method`), so that the GPU's busy share is known. Truth `autograd` names PyTorch's autograd thread, `augment`
the function and what the pool does."""

import multiprocessing
import os
import resource
import threading
import time

from common import Scenario, comm_of, gpu_seconds_queued, tids_of

sc = Scenario("natural_pool_map_augment", "natural", "a ResNet-34-style classifier whose batches are augmented by "
              "multiprocessing.Pool(3).map() every step (the decoded images pickled to 3 pool processes, numpy crops, "
              "flips and colour jitter, the crops pickled back), synchronously: the main thread waits in pool.map(), "
              "20 s, nothing staged", job_cpus=[2, 3, 4, 5], control=True)
import numpy as np  # noqa: E402

SRC, OUT, NIMG = 160, 128, 512
BATCH = 128 if sc.cuda else 64
PROCS = 3
NSTAT = 3  # per pool process: images, augment() wall, augment() CPU clock
CTX = multiprocessing.get_context("fork")
STATS = CTX.RawArray("d", NSTAT * PROCS)  # shared with the pool's processes
SLOT = CTX.RawValue("i", 0)
SLOT_LOCK = CTX.Lock()
_slot = -1
_rng = None
LUMA = np.array([0.299, 0.587, 0.114], np.float32)


def pool_init() -> None:
    """Each pool process: its slot in STATS and its own random stream."""
    global _slot, _rng
    with SLOT_LOCK:
        _slot = SLOT.value
        SLOT.value += 1
    _rng = np.random.default_rng(1000 + _slot)


def random_resized_crop(img: np.ndarray, rng, out: int = OUT, scale=(0.35, 1.0), ratio=(3 / 4, 4 / 3)) -> np.ndarray:
    """torchvision's RandomResizedCrop in numpy: a random area and aspect, resized to out x out bilinearly."""
    h, w = img.shape[:2]
    area = h * w * rng.uniform(*scale)
    ar = np.exp(rng.uniform(np.log(ratio[0]), np.log(ratio[1])))
    ch = int(min(h, max(8, round(np.sqrt(area / ar)))))
    cw = int(min(w, max(8, round(np.sqrt(area * ar)))))
    y0, x0 = int(rng.integers(0, h - ch + 1)), int(rng.integers(0, w - cw + 1))
    ys = np.clip((np.arange(out) + 0.5) * ch / out - 0.5, 0, ch - 1) + y0
    xs = np.clip((np.arange(out) + 0.5) * cw / out - 0.5, 0, cw - 1) + x0
    y_lo, x_lo = np.floor(ys).astype(np.intp), np.floor(xs).astype(np.intp)
    y_hi, x_hi = np.minimum(y_lo + 1, h - 1), np.minimum(x_lo + 1, w - 1)
    wy = (ys - y_lo).astype(np.float32)[:, None, None]
    wx = (xs - x_lo).astype(np.float32)[None, :, None]
    f = img.astype(np.float32)
    top = f[y_lo][:, x_lo] * (1 - wx) + f[y_lo][:, x_hi] * wx
    bot = f[y_hi][:, x_lo] * (1 - wx) + f[y_hi][:, x_hi] * wx
    return top * (1 - wy) + bot * wy


def augment(img: np.ndarray) -> np.ndarray:
    """One training view of a decoded HWC uint8 image: crop, flip, brightness, contrast, saturation; HWC uint8."""
    t0, c0 = time.perf_counter(), time.thread_time()
    rng = _rng if _rng is not None else np.random.default_rng()
    x = random_resized_crop(img, rng)
    if rng.random() < 0.5:
        x = x[:, ::-1]
    x = x * rng.uniform(0.6, 1.4)  # brightness
    mean = float((x @ LUMA).mean())
    x = (x - mean) * rng.uniform(0.6, 1.4) + mean  # contrast
    g = (x @ LUMA)[..., None]
    x = g + (x - g) * rng.uniform(0.6, 1.4)  # saturation
    out = np.clip(x, 0, 255).astype(np.uint8)
    if _slot >= 0:
        base = NSTAT * _slot
        STATS[base] += 1
        STATS[base + 1] += time.perf_counter() - t0
        STATS[base + 2] += time.thread_time() - c0
    return out


# The pool first, at the top of the script (before torch and CUDA), as the author wrote it.
pool = CTX.Pool(PROCS, initializer=pool_init)
pool_pids = sorted(p.pid for p in pool._pool)
handlers = {"task_handler": pool._task_handler, "result_handler": pool._result_handler,
            "worker_handler": pool._worker_handler}
import torch  # noqa: E402

nn = torch.nn
F = nn.functional
PID, MAIN = os.getpid(), threading.get_native_id()
dev = torch.device(sc.device)
if sc.cuda:
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
CLASSES = 100
LAYERS, WIDTHS = ((3, 4, 6, 3), (64, 128, 256, 512)) if sc.cuda else ((1, 1, 1, 1), (16, 32, 64, 64))
KEYS = ("map_s", "map_cpu_s", "gather_s", "stack_s", "h2d_s", "issue_s", "backward_s", "item_s")
own = {"steps": 0, "images": 0, **dict.fromkeys(KEYS, 0.0), "running_loss": 0.0}


def make_images(n: int) -> tuple[np.ndarray, np.ndarray]:
    """n decoded HWC uint8 images (a class's 10x10 colour template upsampled, and noise) and their labels."""
    rng = np.random.default_rng(0)
    templates = rng.integers(0, 256, (CLASSES, 10, 10, 3)).astype(np.float32)
    labels = rng.integers(0, CLASSES, n)
    rep = SRC // 10
    base = templates[labels].repeat(rep, axis=1).repeat(rep, axis=2)
    noise = rng.normal(0, 30, (n, SRC, SRC, 3)).astype(np.float32)
    return np.clip(base + noise, 0, 255).astype(np.uint8), labels


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
    layers = [nn.Conv2d(3, WIDTHS[0], 3, 2, 1, bias=False), nn.BatchNorm2d(WIDTHS[0]), nn.ReLU()]
    cin = WIDTHS[0]
    for k, (n, cout) in enumerate(zip(LAYERS, WIDTHS)):
        for j in range(n):
            layers.append(Block(cin, cout, 2 if (k > 0 and j == 0) else 1))
            cin = cout
    return nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(cin, CLASSES))


def schedstat(pid: int, tid: int) -> tuple[float, float] | None:
    try:
        with open(f"/proc/{pid}/task/{tid}/schedstat") as fh:
            run, wait = fh.read().split()[:2]
        return int(run) / 1e9, int(wait) / 1e9
    except (OSError, ValueError):
        return None


def autograd_thread() -> dict | None:
    for tid in tids_of(PID):
        comm = comm_of(PID, tid) or ""
        if comm.startswith("pt_autograd"):
            return {"pid": PID, "tid": tid, "comm": comm}
    return None


images, labels = make_images(NIMG)
torch.manual_seed(0)
model = resnet().to(dev).to(memory_format=torch.channels_last)
opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, nesterov=True, weight_decay=5e-4)
mean = torch.tensor([0.485, 0.456, 0.406], device=dev).view(1, 3, 1, 1) * 255
std = torch.tensor([0.229, 0.224, 0.225], device=dev).view(1, 3, 1, 1) * 255
NPARAM = sum(p.numel() for p in model.parameters())
sampler = np.random.default_rng(7)


def to_input(xb: torch.Tensor) -> torch.Tensor:
    """A uint8 NHWC batch on the device to the normalised float NCHW (channels_last) input."""
    return ((xb.permute(0, 3, 1, 2).float() - mean) / std).contiguous(memory_format=torch.channels_last)


def train(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    t0 = time.perf_counter()
    with torch.autocast(sc.device, dtype=torch.bfloat16, enabled=sc.cuda):
        logits = model(to_input(x))
    loss = F.cross_entropy(logits.float(), y)
    opt.zero_grad(set_to_none=True)
    t1 = time.perf_counter()
    loss.backward()
    t2 = time.perf_counter()
    opt.step()
    own["backward_s"] += t2 - t1
    own["issue_s"] += (t1 - t0) + (time.perf_counter() - t2)
    return loss


def batch() -> tuple[torch.Tensor, torch.Tensor]:
    """As written: the batch's images through pool.map(augment, ...), stacked and copied to the device."""
    t0 = time.perf_counter()
    idx = sampler.integers(0, NIMG, BATCH)
    tasks = [images[i] for i in idx]
    t1, c1 = time.perf_counter(), time.thread_time()
    crops = pool.map(augment, tasks)
    t2, c2 = time.perf_counter(), time.thread_time()
    xb = torch.from_numpy(np.stack(crops))
    yb = torch.from_numpy(labels[idx])
    t3 = time.perf_counter()
    x, y = xb.to(dev, non_blocking=True), yb.to(dev, non_blocking=True)
    t4 = time.perf_counter()
    own["gather_s"] += t1 - t0
    own["map_s"] += t2 - t1
    own["map_cpu_s"] += c2 - c1
    own["stack_s"] += t3 - t2
    own["h2d_s"] += t4 - t3
    own["images"] += len(idx)
    return x, y


def finish(loss: torch.Tensor) -> None:
    t = time.perf_counter()
    own["running_loss"] += loss.item()
    own["item_s"] += time.perf_counter() - t
    own["steps"] += 1
    if own["steps"] % 50 == 0:
        print(f"step {own['steps']}: loss {own['running_loss'] / own['steps']:.4f}", flush=True)


def step() -> None:
    x, y = batch()
    finish(train(x, y))


held: dict = {}


def step_gpu_only() -> None:
    """The loop with its input already made (one augmented batch kept on the device): the step's own rate."""
    finish(train(*held["xy"]))


def sync() -> None:
    if sc.cuda:
        torch.cuda.synchronize()


def reset() -> None:
    for k in own:
        own[k] = 0 if k in ("steps", "images") else 0.0


def timed(seconds: float, fn) -> tuple[int, float]:
    n0, t = own["steps"], time.perf_counter()
    end = t + seconds
    while time.perf_counter() < end:
        fn()
    sync()
    return own["steps"] - n0, time.perf_counter() - t


def gpu_step_seconds(xy) -> tuple[float | None, str | None]:
    """A step's GPU time (forward, loss, backward, SGD on a batch already on the device; nothing read back): queued
    behind a spin (the median of five), else CUDA events around 10 steps queued back to back, else the host's clock."""
    if not sc.cuda:
        return None, None
    runs = sorted(r for r in (gpu_seconds_queued(torch, lambda _: train(*xy)) for _ in range(5)) if r is not None)
    if runs:
        return runs[len(runs) // 2], "queued"
    k = 10
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    t = time.perf_counter()
    start.record()
    for _ in range(k):
        train(*xy)
    end.record()
    end.synchronize()
    host = (time.perf_counter() - t) / k
    try:
        ms = start.elapsed_time(end)
    except RuntimeError:
        ms = None
    if ms is not None and ms > 0:
        return ms / 1e3 / k, "events"
    return host, "host_clock"


def thread_of(t: threading.Thread) -> dict:
    tid = getattr(t, "native_id", None)
    return {"tid": tid, "name": t.name, "comm": comm_of(PID, tid) if tid else None}


try:
    t_set = time.perf_counter()
    for _ in range(8):  # warm-up: cuDNN's algorithms, the allocator, the autograd thread, the pool's first tasks
        step()
    sync()
    held["xy"] = batch()
    gpu_step_s, gpu_method = gpu_step_seconds(held["xy"])
    # The loop with its input already made: the rate the GPU's step alone allows.
    reset()
    timed(1.0 * sc.scale, step_gpu_only)  # the spin kernels well before the timed stretch
    reset()
    gpu_only_steps, gpu_only_wall = timed(3.0 * sc.scale, step_gpu_only)
    # As the script has it: pool.map() every step.
    timed(1.0 * sc.scale, step)
    ag = autograd_thread()
    handler_info = {k: thread_of(t) for k, t in handlers.items()}
    htids = {k: v["tid"] for k, v in handler_info.items() if v["tid"]}
    reset()
    s0 = list(STATS)
    main0 = schedstat(PID, MAIN)
    ag0 = schedstat(PID, ag["tid"]) if ag else None
    h0 = {k: schedstat(PID, tid) for k, tid in htids.items()}
    w0 = {p: schedstat(p, p) for p in pool_pids}
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
    main1 = schedstat(PID, MAIN)
    ag1 = schedstat(PID, ag["tid"]) if ag else None
    h1 = {k: schedstat(PID, tid) for k, tid in htids.items()}
    w1 = {p: schedstat(p, p) for p in pool_pids}
    f1 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    m1 = int(torch.cuda.memory_stats().get("segment.all.allocated", 0)) if sc.cuda else 0
    s1 = list(STATS)
    procs = [{"pid": p, "tids": tids_of(p), "comm": comm_of(p)} for p in pool_pids]
    setup_s = time.perf_counter() - t_set - wall
finally:
    pool.terminate()
    pool.join()
n = own["steps"]


def share(v: float | None) -> float | None:
    return round(v / wall, 4) if v is not None else None


def r4(v: float | None) -> float | None:
    return round(v, 4) if v is not None else None


def delta(a, b, k: int) -> float | None:
    return r4(b[k] - a[k]) if a and b else None


per_proc = []
for slot in range(PROCS):
    d = [b - a for a, b in zip(s0[NSTAT * slot:NSTAT * (slot + 1)], s1[NSTAT * slot:NSTAT * (slot + 1)])]
    per_proc.append({"slot": slot, "images": int(d[0]), "augment_s": round(d[1], 4), "augment_cpu_s": round(d[2], 4)})
for row in procs:
    a, z = w0.get(row["pid"]), w1.get(row["pid"])
    row.update({"run_s": delta(a, z, 0), "cpu_wait_s": delta(a, z, 1)})
    row["cpu_share"], row["cpu_wait_share"] = share(row["run_s"]), share(row["cpu_wait_s"])
handler_rows = {k: {**handler_info[k], "run_s": delta(h0.get(k), h1.get(k), 0),
                    "cpu_wait_s": delta(h0.get(k), h1.get(k), 1)} for k in htids}
aug_s = round(sum(r["augment_s"] for r in per_proc), 4)
aug_cpu_s = round(sum(r["augment_cpu_s"] for r in per_proc), 4)
aug_images = int(sum(r["images"] for r in per_proc))
gpu_only_rate = gpu_only_steps / gpu_only_wall if gpu_only_wall > 0 else None
at_gpu_only = n / gpu_only_rate if gpu_only_rate else None
overhead = max(0.0, wall - at_gpu_only) if at_gpu_only is not None else None
main_run, main_wait = delta(main0, main1, 0), delta(main0, main1, 1)
ag_run, ag_wait = delta(ag0, ag1, 0), delta(ag0, ag1, 1)
gpu_busy = n * gpu_step_s if gpu_step_s is not None else None
map_off = max(0.0, own["map_s"] - own["map_cpu_s"])
p_shares = [r["cpu_share"] for r in procs if r["cpu_share"] is not None]
handler_run = round(sum(r["run_s"] or 0.0 for r in handler_rows.values()), 4)
handler_wait = round(sum(r["cpu_wait_s"] or 0.0 for r in handler_rows.values()), 4)
img_bytes, crop_bytes = SRC * SRC * 3, OUT * OUT * 3
sc.extra["pool"] = {"pids": pool_pids, "processes": procs, "per_process": per_proc, "handlers": handler_rows,
                    "handler_tids": sorted(htids.values()), "size": PROCS, "context": "fork",
                    "what": "multiprocessing.Pool(3).map(augment, [images[i] for i in idx]) every step, waited for: "
                            "the images pickled to the pool, the crops pickled back"}
sc.extra["autograd"] = ag
sc.extra["augment"] = {"function": "augment", "calls": ["random_resized_crop", "numpy"],
                       "file": os.path.basename(__file__), "source": [SRC, SRC, 3], "crop": [OUT, OUT, 3],
                       "what": "a random resized crop (bilinear, numpy), a horizontal flip, brightness, contrast and "
                               "saturation jitter, per image, in the pool's processes"}
sc.extra["self"] = {**{k: round(v, 4) if isinstance(v, float) else v for k, v in own.items()},
                    "wall_s": round(wall, 4), "steps_per_s": round(n / wall, 2),
                    "step_ms_mean": round(wall / max(n, 1) * 1e3, 3),
                    "map_share": share(own["map_s"]), "map_cpu_share": share(own["map_cpu_s"]),
                    "map_off_cpu_s": round(map_off, 4), "map_off_cpu_share": share(map_off),
                    "map_ms_per_step": round(own["map_s"] / max(n, 1) * 1e3, 3),
                    "gather_share": share(own["gather_s"]), "stack_share": share(own["stack_s"]),
                    "h2d_share": share(own["h2d_s"]), "issue_share": share(own["issue_s"]),
                    "backward_share": share(own["backward_s"]), "item_share": share(own["item_s"]),
                    "augment_s": aug_s, "augment_cpu_s": aug_cpu_s, "augment_images": aug_images,
                    "augment_ms_per_image": round(aug_s / max(aug_images, 1) * 1e3, 3),
                    # the pool's time augmenting, as a share of its time (processes x run)
                    "augment_share_of_pool": round(aug_s / (PROCS * wall), 4),
                    "pool_run_s": round(sum(r["run_s"] or 0.0 for r in procs), 4),
                    "pool_cpu_share_mean": round(sum(p_shares) / len(p_shares), 4) if p_shares else None,
                    "pool_cpu_wait_s": round(sum(r["cpu_wait_s"] or 0.0 for r in procs), 4),
                    "pool_cpu_wait_max_share": max((r["cpu_wait_share"] or 0.0 for r in procs), default=None),
                    "handlers_run_s": handler_run, "handlers_cpu_wait_s": handler_wait,
                    "pickled_mb_per_step": round(BATCH * (img_bytes + crop_bytes) / 1e6, 3),
                    "gpu_only_steps": gpu_only_steps, "gpu_only_wall_s": round(gpu_only_wall, 4),
                    "gpu_only_steps_per_s": round(gpu_only_rate, 2) if gpu_only_rate else None,
                    "at_gpu_only_rate_s": r4(at_gpu_only), "pool_overhead_s": r4(overhead),
                    "pool_overhead_share": share(overhead),
                    "main_run_s": main_run, "main_cpu_share": share(main_run),
                    "main_cpu_wait_s": main_wait, "main_cpu_wait_share": share(main_wait),
                    "autograd_run_s": ag_run, "autograd_cpu_share": share(ag_run),
                    "autograd_cpu_wait_s": ag_wait, "autograd_cpu_wait_share": share(ag_wait),
                    "minor_faults_per_s": round((f1 - f0) / wall, 1), "cuda_mallocs_per_s": round((m1 - m0) / wall, 3),
                    "gpu_step_ms": round(gpu_step_s * 1e3, 4) if gpu_step_s is not None else None,
                    "gpu_time_method": gpu_method,
                    "gpu_busy_s": r4(gpu_busy), "gpu_busy_share": share(gpu_busy),
                    "batch": BATCH, "image": [SRC, SRC, 3], "crop": [OUT, OUT, 3], "pool_processes": PROCS,
                    "params_m": round(NPARAM / 1e6, 2), "setup_s": round(setup_s, 3)}
if not sc.cuda:
    sc.note("on the CPU: no autograd thread (the backward runs on the main thread), no GPU timings, no allocator "
            "counters; the steps are the CPU's, so the shares differ from the GPU host's.")
if gpu_method not in (None, "queued"):
    sc.note(f"the step's GPU time measured by {gpu_method} (the queued measure failed): an upper bound.")
sc.note(f"natural: measured by the script: {n} steps ({n / wall:.1f}/s) in {wall:.2f} s: {own['map_s']:.2f} s in "
        f"pool.map() ({map_off:.2f} s of it off the main thread's CPU), {own['stack_s']:.2f} s stacking, "
        f"{own['h2d_s']:.2f} s copying; the {PROCS} pool processes spent {aug_s:.2f} s in augment() "
        f"({aug_s / max(aug_images, 1) * 1e3:.2f} ms an image); the pool's handler threads ran {handler_run} s; "
        f"with the "
        f"batch already on the GPU {gpu_only_rate and round(gpu_only_rate, 1)} steps/s (the pool cost "
        f"{overhead and round(overhead, 2)} s of the run); the main thread ran {main_run} s, waited for a CPU "
        f"{main_wait} s; "
        + (f"a step's kernels take {gpu_step_s * 1e3:.2f} ms of GPU time ({gpu_method}; GPU busy {gpu_busy / wall:.0%} "
           "of the run)." if gpu_busy is not None else "no GPU timings (no CUDA)."))
sc.write_truth(baseline=(b0, b1), window=None, ratio_spans=((b0, mid), (mid, b1)))
