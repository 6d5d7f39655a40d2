"""natural_thread_prefetch_python (natural, nothing staged): "I moved data loading to a thread so it overlaps the GPU".
A CIFAR-style classifier fed by a threading.Thread producer (threading's name and OS name `batch_prefetch`) that builds
each batch of 256 from 20,000 images held in memory (3x32x32 uint8) with the augmentation written per sample in Python
over numpy rows, as torchvision's transforms do one image at a time: a reflect pad of 4 and a random 32x32 crop, a
random horizontal flip, to float32, a brightness, contrast and saturation jitter (a Python loop over the channels), the
per-channel normalisation (a loop again) and a random 8x8 cutout; then np.stack and torch.from_numpy, put on a
queue.Queue(maxsize=4). The main thread takes each batch with q.get(), copies it to the GPU (.to(dev,
non_blocking=True) from the producer's pageable memory, as written) and trains a small ResNet (a stem and three stages
of two basic blocks, 64-128-256 channels, BatchNorm) under bf16 autocast, SGD with momentum and nesterov, loss.item()
each step for the running loss. Both threads run Python, so they take turns on the GIL. One process on CPUs 2-3, 20 s.

The script measures itself: the steps per second; the main thread's time blocked in q.get() (wall and CPU; apart: the
gets that found the queue empty and those that did not), copying to the GPU, queueing the step (wall and the thread's
CPU time: the rest is its waits for the GIL, for the autograd thread's backward and for a CPU) and in .item(); the
producer's time making each batch (wall and its thread's CPU time) and blocked in put() (the queue full); the main
thread's and the producer's time on a CPU and waiting for one over the run (schedstat); the process's minor page
faults; and a step's GPU time queued (common.gpu_seconds_queued, on a batch already on the GPU), so that the GPU's busy
share is known. Truth `producer` names the thread (pid, tid, comm)."""

import queue
import random
import resource
import sys
import threading
import time

import numpy as np

from common import Scenario, gpu_seconds_queued, set_thread_name

sc = Scenario("natural_thread_prefetch_python", "natural", "a small ResNet fed by a producer thread (queue.Queue of 4) "
              "augmenting CIFAR-size images per sample in Python over numpy (pad, crop, flip, jitter, normalise, "
              "cutout), 20 s, nothing staged", job_cpus=[2, 3], control=True)
import torch  # noqa: E402

dev = torch.device(sc.device)
NIMG, SIDE, PAD, NCLASS, DEPTH = 20_000, 32, 4, 10, 4
BATCH, WIDTHS = (256, (64, 128, 256)) if sc.cuda else (64, (8, 16, 32))
MEAN = [0.4914, 0.4822, 0.4465]
STD = [0.2470, 0.2435, 0.2616]
GRAY = np.array([0.299, 0.587, 0.114], np.float32)

rng0 = np.random.default_rng(0)
images = rng0.integers(0, 256, (NIMG, 3, SIDE, SIDE), dtype=np.uint8)
labels = rng0.integers(0, NCLASS, NIMG)


def augment(img: np.ndarray, rnd: random.Random) -> np.ndarray:
    """One training sample: pad + random crop, flip, colour jitter, normalise, cutout (per sample, as transforms do)."""
    padded = np.pad(img, ((0, 0), (PAD, PAD), (PAD, PAD)), mode="reflect")
    top, left = rnd.randint(0, 2 * PAD), rnd.randint(0, 2 * PAD)
    x = padded[:, top:top + SIDE, left:left + SIDE]
    if rnd.random() < 0.5:
        x = x[:, :, ::-1]
    x = x.astype(np.float32) / 255.0
    b, c, s = rnd.uniform(0.8, 1.2), rnd.uniform(0.8, 1.2), rnd.uniform(0.8, 1.2)
    gray = (GRAY[:, None, None] * x).sum(0)
    mean_gray = float(gray.mean())
    for ch in range(3):  # brightness, contrast, saturation: channel by channel
        row = x[ch] * b
        row = (row - mean_gray) * c + mean_gray
        x[ch] = np.clip((row - gray) * s + gray, 0.0, 1.0)
    for ch in range(3):
        x[ch] = (x[ch] - MEAN[ch]) / STD[ch]
    cy, cx = rnd.randrange(SIDE), rnd.randrange(SIDE)
    x[:, max(0, cy - 4):cy + 4, max(0, cx - 4):cx + 4] = 0.0
    return x


q: queue.Queue = queue.Queue(maxsize=DEPTH)
halt = threading.Event()
producer_info: dict = {}
made = {"batches": 0, "make_s": 0.0, "make_cpu_s": 0.0, "put_s": 0.0}
made_lock = threading.Lock()


def schedstat(tid: int | None = None) -> tuple[float, float | None]:
    """A thread's time on a CPU and waiting on a run queue (s), from the kernel's schedstat (the caller's by default);
    where that is not kept, the caller's CPU clock and None."""
    try:
        with open(f"/proc/self/task/{tid}/schedstat" if tid else "/proc/thread-self/schedstat") as fh:
            run_ns, wait_ns = fh.read().split()[:2]
        return int(run_ns) / 1e9, int(wait_ns) / 1e9
    except (OSError, ValueError):
        return time.thread_time(), None


def produce() -> None:
    set_thread_name("batch_prefetch")
    producer_info.update(tid=threading.get_native_id(), comm="batch_prefetch")
    rnd = random.Random(1)
    order = list(range(NIMG))
    pos = NIMG
    while not halt.is_set():
        w0, c0 = time.perf_counter(), time.thread_time()
        idx = []
        for _ in range(BATCH):
            if pos == NIMG:  # a new epoch: reshuffle
                rnd.shuffle(order)
                pos = 0
            idx.append(order[pos])
            pos += 1
        xb = torch.from_numpy(np.stack([augment(images[i], rnd) for i in idx]))
        yb = torch.from_numpy(labels[idx])
        w1, c1 = time.perf_counter(), time.thread_time()
        while not halt.is_set():
            try:
                q.put((xb, yb), timeout=1.0)
                break
            except queue.Full:
                continue
        w2 = time.perf_counter()
        with made_lock:
            made["batches"] += 1
            made["make_s"] += w1 - w0
            made["make_cpu_s"] += c1 - c0
            made["put_s"] += w2 - w1


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
        torch.nn.Conv2d(3, w0, 3, 1, 1, bias=False), torch.nn.BatchNorm2d(w0), torch.nn.ReLU(),
        Basic(w0, w0, 1), Basic(w0, w0, 1), Basic(w0, w1, 2), Basic(w1, w1, 1), Basic(w1, w2, 2), Basic(w2, w2, 1),
        torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(w2, NCLASS))


torch.manual_seed(0)
model = resnet().to(dev)
opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, nesterov=True, weight_decay=5e-4)
own = {"steps": 0, "get_s": 0.0, "get_cpu_s": 0.0, "get_empty_s": 0.0, "gets_empty": 0, "copy_s": 0.0,
       "launch_s": 0.0, "launch_cpu_s": 0.0, "item_s": 0.0, "running_loss": 0.0}


def train_step(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    with torch.autocast(sc.device, dtype=torch.bfloat16, enabled=sc.cuda):
        loss = torch.nn.functional.cross_entropy(model(x).float(), y)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    return loss


def step() -> None:
    t0, c0 = time.perf_counter(), time.thread_time()
    empty = q.empty()
    xb, yb = q.get()
    t1, c1 = time.perf_counter(), time.thread_time()
    x, y = xb.to(dev, non_blocking=True), yb.to(dev, non_blocking=True)
    t2, c2 = time.perf_counter(), time.thread_time()
    loss = train_step(x, y)
    t3, c3 = time.perf_counter(), time.thread_time()
    own["running_loss"] += loss.item()
    t4 = time.perf_counter()
    own["get_s"] += t1 - t0
    own["get_cpu_s"] += c1 - c0
    if empty:
        own["get_empty_s"] += t1 - t0
        own["gets_empty"] += 1
    own["copy_s"] += t2 - t1
    own["launch_s"] += t3 - t2
    own["launch_cpu_s"] += c3 - c2
    own["item_s"] += t4 - t3
    own["steps"] += 1


thread = threading.Thread(target=produce, name="batch_prefetch", daemon=True)
thread.start()
try:
    for _ in range(20):  # warm-up: cuDNN's choices, the allocator
        step()
    gpu_step_s = None
    if sc.cuda:
        torch.cuda.synchronize()
        xg, yg = q.get()
        xg, yg = xg.to(dev), yg.to(dev)

        def work(_) -> None:
            """One step's GPU work on a batch already there, nothing read back."""
            train_step(xg, yg)

        work(None)
        runs = sorted(r for r in (gpu_seconds_queued(torch, work) for _ in range(5)) if r is not None)
        gpu_step_s = runs[len(runs) // 2] if runs else None
    warm_end = time.perf_counter() + 2.0 * sc.scale  # the spin kernels well before the baseline
    while time.perf_counter() < warm_end:
        step()
    if sc.cuda:
        torch.cuda.synchronize()
    for k in own:
        own[k] = 0 if k in ("steps", "gets_empty") else 0.0
    with made_lock:
        made.update(batches=0, make_s=0.0, make_cpu_s=0.0, put_s=0.0)
    ptid = producer_info["tid"]
    p_run0, p_wait0 = schedstat(ptid)
    run0, wait0 = schedstat()
    f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    b0 = sc.mark("baseline")
    t = time.perf_counter()
    sc.run_for(10.0 * sc.scale, step)
    mid = sc.mark("half")
    sc.run_for(10.0 * sc.scale, step)
    if sc.cuda:
        torch.cuda.synchronize()
    b1 = sc.mark("end")
    wall = time.perf_counter() - t
    run1, wait1 = schedstat()
    p_run1, p_wait1 = schedstat(ptid)
    f1 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    with made_lock:
        produced = dict(made)
finally:
    halt.set()
    thread.join(10)

n, nb = own["steps"], max(produced["batches"], 1)
gpu_busy = n * gpu_step_s if gpu_step_s is not None else None


def share(v: float | None) -> float | None:
    return round(v / wall, 4) if v is not None else None


def delta(a: float | None, b: float | None) -> float | None:
    return round(b - a, 4) if a is not None and b is not None else None


main_wait, prod_wait = delta(wait0, wait1), delta(p_wait0, p_wait1)
sc.extra["producer"] = {"pid": sc.feeder["pid"], **producer_info}
sc.extra["self"] = {**{k: round(v, 4) for k, v in own.items()}, "wall_s": round(wall, 4),
                    "steps_per_s": round(n / wall, 2), "get_share": share(own["get_s"]),
                    "get_cpu_share": share(own["get_cpu_s"]), "get_empty_share": share(own["get_empty_s"]),
                    "copy_share": share(own["copy_s"]), "launch_share": share(own["launch_s"]),
                    "launch_cpu_share": share(own["launch_cpu_s"]),
                    "launch_off_cpu_s": round(own["launch_s"] - own["launch_cpu_s"], 4),
                    "item_share": share(own["item_s"]),
                    "producer_batches": produced["batches"], "producer_make_s": round(produced["make_s"], 4),
                    "producer_make_cpu_s": round(produced["make_cpu_s"], 4),
                    "producer_put_s": round(produced["put_s"], 4),
                    "producer_make_ms_mean": round(produced["make_s"] / nb * 1e3, 3),
                    "producer_make_cpu_ms_mean": round(produced["make_cpu_s"] / nb * 1e3, 3),
                    "producer_busy_share": share(produced["make_s"]),
                    "producer_run_s": delta(p_run0, p_run1), "producer_cpu_wait_s": prod_wait,
                    "producer_cpu_wait_share": share(prod_wait),
                    "main_run_s": round(run1 - run0, 4), "main_cpu_share": share(run1 - run0),
                    "main_cpu_wait_s": main_wait, "main_cpu_wait_share": share(main_wait),
                    "minor_faults_per_s": round((f1 - f0) / wall, 1),
                    "gpu_step_ms": round(gpu_step_s * 1e3, 4) if gpu_step_s is not None else None,
                    "gpu_busy_s": round(gpu_busy, 4) if gpu_busy is not None else None,
                    "gpu_busy_share": round(gpu_busy / wall, 4) if gpu_busy is not None else None,
                    "batch": BATCH, "queue_depth": DEPTH, "batch_mb": round(BATCH * 3 * SIDE * SIDE * 4 / 2 ** 20, 2),
                    "switch_interval_s": sys.getswitchinterval()}
sc.note(f"natural: measured by the script: {n} steps ({n / wall:.1f}/s) in {wall:.2f} s: {own['get_s']:.2f} s in "
        f"q.get() ({own['get_empty_s']:.2f} s in the {own['gets_empty']} gets that found the queue empty), "
        f"{own['copy_s']:.2f} s copying, {own['launch_s']:.2f} s queueing the steps ({own['launch_cpu_s']:.2f} s of it "
        f"on the CPU), {own['item_s']:.2f} s in .item(); the producer (tid {producer_info.get('tid')}) made "
        f"{produced['batches']} batches, {produced['make_s'] / nb * 1e3:.1f} ms each "
        f"({produced['make_cpu_s'] / nb * 1e3:.1f} ms of its CPU), {produced['put_s']:.2f} s blocked in put(); "
        + (f"a step's kernels take {gpu_step_s * 1e3:.2f} ms of GPU time queued (GPU busy {gpu_busy / wall:.0%} of the "
           "run)." if gpu_busy is not None else "no GPU timings (no CUDA)."))
sc.write_truth(baseline=(b0, b1), window=None, ratio_spans=((b0, mid), (mid, b1)))
