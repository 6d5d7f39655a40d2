"""natural_pageable_h2d_batches (natural, nothing staged): an image classifier trained from batches already decoded and
normalised in RAM, copied to the GPU each step from pageable memory, as a first script does it with no DataLoader: a
pool of 4 batches of 1024 x 3 x 128 x 128 float32 images (201 MB each) and their labels (100 classes), made at set-up
in ordinary (not pinned) CPU tensors; each step takes the next batch of the pool and copies it with
x.to("cuda"), y.to("cuda") (a synchronous copy from pageable memory: the driver stages it through its own pinned
buffer), then a small conv net (four 3x3 stride-2 convolutions 3-64-128-256-512 with BatchNorm and ReLU, a global
average pool, a linear head; channels_last, bf16 autocast, SGD with momentum) trains on it and the loss is added to a
running sum with loss.item(). CPUs 2-3, 20 s.

The script measures itself: the steps per second; the main thread's time in the copies (wall and CPU clock) and the
copies' own time on the GPU's stream (CUDA events around them, each step); the bytes copied and the bandwidth; its time
queueing the step and in loss.item(); before the run, a copy of one batch alone from pageable memory and from a pinned
copy of it (what pinning would give); a step's GPU time queued from a batch already on the GPU
(common.gpu_seconds_queued), so that the GPU's busy share (its kernels) is known; the device allocator's cudaMalloc
calls (segment.all.allocated), the process's minor page faults (getrusage), and the main thread's time on a CPU and
waiting for one over the run (/proc/thread-self/schedstat)."""

import resource
import time

from common import Scenario, gpu_seconds_queued

sc = Scenario("natural_pageable_h2d_batches", "natural", "a small conv net trained from 201 MB float32 batches held "
              "in RAM, each copied to the GPU with .to('cuda') from pageable memory, loss.item() each step, 20 s, "
              "nothing staged", job_cpus=[2, 3], control=True)
import torch  # noqa: E402

dev = torch.device(sc.device)
POOL, BATCH, SIDE, NCLASS = (4, 1024, 128, 100) if sc.cuda else (4, 32, 64, 100)
MEAN, STD = torch.tensor([0.485, 0.456, 0.406]).view(1, 3, 1, 1), torch.tensor([0.229, 0.224, 0.225]).view(1, 3, 1, 1)
if sc.cuda:
    torch.backends.cudnn.benchmark = True
nn = torch.nn


def block(cin: int, cout: int) -> list:
    return [nn.Conv2d(cin, cout, 3, stride=2, padding=1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(inplace=True)]


torch.manual_seed(0)
model = nn.Sequential(*block(3, 64), *block(64, 128), *block(128, 256), *block(256, 512),
                      nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(512, NCLASS))
model = model.to(dev, memory_format=torch.channels_last)
opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=5e-4, nesterov=True)
loss_fn = nn.CrossEntropyLoss()
gen = torch.Generator().manual_seed(0)
images, labels = [], []
for _ in range(POOL):  # "decoded once, kept in RAM": uint8 pixels, normalised to float32
    raw = torch.randint(0, 256, (BATCH, 3, SIDE, SIDE), dtype=torch.uint8, generator=gen)
    images.append(raw.float().div_(255).sub_(MEAN).div_(STD))
    labels.append(torch.randint(0, NCLASS, (BATCH,), generator=gen))
    del raw
BATCH_BYTES = images[0].numel() * images[0].element_size() + labels[0].numel() * labels[0].element_size()
own = {"steps": 0, "copy_s": 0.0, "copy_cpu_s": 0.0, "issue_s": 0.0, "item_s": 0.0}
copy_events: list = []
copy_gpu = {"s": 0.0, "n": 0}
running = {"loss": 0.0, "i": 0}


def train(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    x = x.contiguous(memory_format=torch.channels_last)
    with torch.autocast(sc.device, dtype=torch.bfloat16, enabled=sc.cuda):
        loss = loss_fn(model(x), y)
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    return loss


def step() -> None:
    i = running["i"] % POOL
    running["i"] += 1
    t0, c0 = time.perf_counter(), time.thread_time()
    if sc.cuda:
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
    x, y = images[i].to(dev), labels[i].to(dev)
    if sc.cuda:
        e1.record()
        copy_events.append((e0, e1))
    t1, c1 = time.perf_counter(), time.thread_time()
    loss = train(x, y)
    t2 = time.perf_counter()
    running["loss"] += loss.item()
    t3 = time.perf_counter()
    if len(copy_events) >= 50:
        read_copy_events()
    own["copy_s"] += t1 - t0
    own["copy_cpu_s"] += c1 - c0
    own["issue_s"] += t2 - t1
    own["item_s"] += t3 - t2
    own["steps"] += 1


def read_copy_events() -> None:
    for e0, e1 in copy_events:
        copy_gpu["s"] += e0.elapsed_time(e1) / 1e3
        copy_gpu["n"] += 1
    copy_events.clear()


def sync() -> None:
    if sc.cuda:
        torch.cuda.synchronize()


def schedstat() -> tuple[float, float | None]:
    """The calling thread's time on a CPU and waiting on a run queue (s), from the kernel's schedstat; where that is
    not kept, the thread's CPU clock and None."""
    try:
        with open("/proc/thread-self/schedstat") as fh:
            run_ns, wait_ns = fh.read().split()[:2]
        return int(run_ns) / 1e9, int(wait_ns) / 1e9
    except (OSError, ValueError):
        return time.thread_time(), None


def mallocs() -> int:
    return int(torch.cuda.memory_stats().get("segment.all.allocated", 0)) if sc.cuda else 0


def copy_alone(src: torch.Tensor, non_blocking: bool = False) -> float:
    """One copy of `src` to the GPU with the GPU idle, median of 5 (s)."""
    times = []
    for _ in range(5):
        sync()
        a = time.perf_counter()
        src.to(dev, non_blocking=non_blocking)
        sync()
        times.append(time.perf_counter() - a)
    return sorted(times)[2]


model.train()
for _ in range(3 * POOL):  # warm-up: cuDNN's benchmark, the allocator
    step()
sync()
pageable_alone_s = copy_alone(images[0])
pinned_alone_s = None
gpu_step_s = None
if sc.cuda:
    pinned = images[0].pin_memory()
    pinned_alone_s = copy_alone(pinned, non_blocking=True)
    del pinned
    xg, yg = images[0].to(dev), labels[0].to(dev)
    train(xg, yg)
    sync()
    runs = sorted(r for r in (gpu_seconds_queued(torch, lambda _: train(xg, yg)) for _ in range(5)) if r is not None)
    gpu_step_s = runs[len(runs) // 2] if runs else None
    del xg, yg
warm_end = time.perf_counter() + 2.0 * sc.scale  # the spin kernels well before the baseline
while time.perf_counter() < warm_end:
    step()
sync()
read_copy_events()
for k in own:
    own[k] = 0 if k == "steps" else 0.0
copy_gpu.update(s=0.0, n=0)
m0 = mallocs()
f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
run0, wait0 = schedstat()
b0 = sc.mark("baseline")
t = time.perf_counter()
sc.run_for(10.0 * sc.scale, step)
mid = sc.mark("half")
sc.run_for(10.0 * sc.scale, step)
b1 = sc.mark("end")
wall = time.perf_counter() - t
run1, wait1 = schedstat()
f1 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
m1 = mallocs()
read_copy_events()
n = own["steps"]
copied = n * BATCH_BYTES
gpu_busy = n * gpu_step_s if gpu_step_s is not None else None


def share(v: float | None) -> float | None:
    return round(v / wall, 4) if v is not None else None


def ms(v: float | None) -> float | None:
    return round(v * 1e3, 4) if v is not None else None


sc.extra["self"] = {**{k: round(v, 4) for k, v in own.items()}, "wall_s": round(wall, 4),
                    "steps_per_s": round(n / wall, 2), "step_ms_mean": round(wall / max(n, 1) * 1e3, 4),
                    "copy_share": share(own["copy_s"]), "copy_cpu_share": share(own["copy_cpu_s"]),
                    "issue_share": share(own["issue_s"]), "item_share": share(own["item_s"]),
                    "copy_ms_mean": round(own["copy_s"] / max(n, 1) * 1e3, 4),
                    "copy_gpu_s": round(copy_gpu["s"], 4) if copy_gpu["n"] else None,
                    "copy_gpu_share": share(copy_gpu["s"]) if copy_gpu["n"] else None,
                    "copy_gpu_ms_mean": round(copy_gpu["s"] / copy_gpu["n"] * 1e3, 4) if copy_gpu["n"] else None,
                    "batch_bytes": BATCH_BYTES, "bytes_copied": copied,
                    "copy_gb_per_s": round(copied / own["copy_s"] / 1e9, 3) if own["copy_s"] else None,
                    "pageable_alone_ms": ms(pageable_alone_s), "pinned_alone_ms": ms(pinned_alone_s),
                    "pageable_alone_gb_per_s": round(BATCH_BYTES / pageable_alone_s / 1e9, 3),
                    "pinned_alone_gb_per_s": round(BATCH_BYTES / pinned_alone_s / 1e9, 3) if pinned_alone_s else None,
                    "pinned_would_save_s": round(own["copy_s"] - n * pinned_alone_s, 4) if pinned_alone_s else None,
                    "gpu_step_ms": ms(gpu_step_s), "gpu_busy_s": round(gpu_busy, 4) if gpu_busy is not None else None,
                    "gpu_busy_share": share(gpu_busy),
                    "cuda_mallocs": m1 - m0, "cuda_mallocs_per_s": round((m1 - m0) / wall, 3),
                    "minor_faults_per_s": round((f1 - f0) / wall, 1),
                    "main_cpu_share": round((run1 - run0) / wall, 4),
                    "main_cpu_wait_share": round((wait1 - wait0) / wall, 4) if wait0 is not None else None,
                    "pool": POOL, "batch": BATCH, "side": SIDE, "intra_op_threads": torch.get_num_threads(),
                    "mean_loss": round(running["loss"] / max(running["i"], 1), 4)}
if not sc.cuda:
    sc.note("batches of 32 x 3 x 64 x 64, no copies (the tensors stay on the CPU), no CUDA events, no pinned memory, "
            "no allocator counters: no CUDA.")
sc.note(f"natural: measured by the script: {n} steps ({n / wall:.1f}/s) in {wall:.2f} s: {own['copy_s']:.2f} s in the "
        f"copies ({copied / 1e9:.1f} GB from pageable memory, {own['copy_cpu_s']:.2f} s of CPU; "
        f"{copy_gpu['s']:.2f} s on the GPU's stream), {own['issue_s']:.2f} s queueing the steps, {own['item_s']:.2f} s "
        f"in loss.item(); a batch alone takes {pageable_alone_s * 1e3:.1f} ms from pageable memory"
        + (f", {pinned_alone_s * 1e3:.1f} ms from pinned" if pinned_alone_s else "") + "; "
        + (f"a step's kernels take {gpu_step_s * 1e3:.2f} ms of GPU time queued (GPU busy {gpu_busy / wall:.0%} of the "
           "run)." if gpu_busy is not None else "no GPU timings (no CUDA)."))
sc.write_truth(baseline=(b0, b1), window=None, ratio_spans=((b0, mid), (mid, b1)))
