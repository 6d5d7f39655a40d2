"""natural_per_sample_h2d (natural, nothing staged): an image classifier whose batches reach the GPU one sample at a
time, as code written for variable-size inputs and then used on fixed-size ones often does: a map-style Dataset over
20,000 CIFAR-size images kept preprocessed in RAM (3x32x32 float32, normalised once at set-up; __getitem__ flips one at
random and returns it with its label: an ordinary pageable CPU tensor of 12 KB each), DataLoader(batch_size=256,
shuffle=True, num_workers=0, collate_fn=list): the batch is a Python list of 256 (tensor, label) pairs, nothing stacked
on the CPU. The main thread moves each sample to the GPU on its own, `[x.to(dev) for x, _ in batch]` (pageable,
non_blocking=False: a copy and a wait for it each), makes the labels with torch.tensor(..., device=dev), stacks the
images on the GPU (torch.stack) and trains a modest ResNet-style conv net (a 3x3 stem of 64 channels and three stages
of two 3x3 convolutions, 128, 256, 512 channels at strides 2, with BatchNorm, ReLU and a residual 1x1, a global average
pool, a linear head for 10 classes; channels_last, bf16 autocast, SGD with Nesterov momentum), loss.item() each step
for the running loss. CPUs 2-3, 20 s (smaller with --device cpu: 2,000 images, narrower stages; the copies are then
no-ops).

The script measures itself: the steps per second and the copies per second; the main thread's time in next() (the
Dataset's __getitem__ for 256 samples and the sampler), in a torch.cuda.synchronize() before the copies (added to time
them alone: the step before is done by then, as loss.item() waited for it), in the per-sample copies and the labels' (a
synchronise after them; wall, and its CPU time and run-queue wait by /proc/thread-self/schedstat), queueing the step
(the stack, forward, backward, the optimiser) and in loss.item(); its time on a CPU and waiting for one over the run
(schedstat); the process's minor page faults and the device allocator's cudaMalloc calls; before the run, one batch's
copies alone as the loop makes them, from pinned samples (non_blocking=True), and as one copy of the batch stacked on
the CPU (pageable, and into a pinned buffer): what collating first would save; and a step's GPU time queued from a
batch already on the GPU (common.gpu_seconds_queued: the stack, forward, backward, the optimiser), so that the GPU's
busy share (its kernels) is known."""

import resource
import time

from common import Scenario, gpu_seconds_queued

sc = Scenario("natural_per_sample_h2d", "natural", "a conv net whose batch is a list of 256 per-sample CPU tensors "
              "(DataLoader with collate_fn=list), each moved to the GPU on its own with .to(dev) from pageable memory, "
              "stacked on the GPU, loss.item() each step, 20 s, nothing staged", job_cpus=[2, 3], control=True)
import torch  # noqa: E402
from torch.utils.data import DataLoader, Dataset  # noqa: E402

dev = torch.device(sc.device)
NIMG, SIDE, NCLASS, BATCH = (20000, 32, 10, 256) if sc.cuda else (2000, 32, 10, 256)
WIDTHS = (64, 128, 256, 512) if sc.cuda else (8, 16, 16, 32)
nn = torch.nn
if sc.cuda:
    torch.backends.cudnn.benchmark = True


class Images(Dataset):
    """CIFAR-size images kept preprocessed (normalised float32) in RAM; a random horizontal flip per sample."""

    def __init__(self, n: int) -> None:
        g = torch.Generator().manual_seed(0)
        self.labels = torch.randint(0, NCLASS, (n,), generator=g)
        raw = torch.randint(0, 256, (n, 3, SIDE, SIDE), dtype=torch.uint8, generator=g)
        tint = self.labels.view(n, 1, 1, 1).float() * 12  # a faint class-dependent tint: something to learn
        x = (raw.float() * 0.5 + tint) / 255
        mean, std = torch.tensor([0.49, 0.48, 0.45]).view(1, 3, 1, 1), torch.tensor([0.25, 0.24, 0.26]).view(1, 3, 1, 1)
        self.images = ((x - mean) / std).contiguous()
        self.flip = torch.Generator().manual_seed(1)

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        x = self.images[i]
        if torch.rand((), generator=self.flip) < 0.5:
            x = x.flip(2)
        return x, int(self.labels[i])


class Block(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.c1, self.b1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False), nn.BatchNorm2d(cout)
        self.c2, self.b2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False), nn.BatchNorm2d(cout)
        self.skip = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.b1(self.c1(x)))
        return torch.relu(self.b2(self.c2(h)) + self.skip(x))


def net() -> nn.Module:
    w = WIDTHS
    return nn.Sequential(nn.Conv2d(3, w[0], 3, 1, 1, bias=False), nn.BatchNorm2d(w[0]), nn.ReLU(),
                         Block(w[0], w[1], 2), Block(w[1], w[2], 2), Block(w[2], w[3], 2),
                         nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(w[3], NCLASS))


torch.manual_seed(0)
dataset = Images(NIMG)
loader = DataLoader(dataset, batch_size=BATCH, shuffle=True, num_workers=0, collate_fn=list, drop_last=True)
model = net().to(dev, memory_format=torch.channels_last)
opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, nesterov=True, weight_decay=5e-4)
loss_fn = nn.CrossEntropyLoss()
own = {"steps": 0, "fetch_s": 0.0, "sync_s": 0.0, "copy_s": 0.0, "copy_run_s": 0.0, "copy_cpu_wait_s": 0.0,
       "issue_s": 0.0, "item_s": 0.0, "copies": 0, "epochs": 0, "running_loss": 0.0}
it = {"batches": iter(loader)}


def schedstat() -> tuple[float, float | None]:
    """The calling thread's time on a CPU and waiting on a run queue (s), by the kernel's schedstat; where that is not
    kept, its CPU clock and None."""
    try:
        with open("/proc/thread-self/schedstat") as fh:
            run_ns, wait_ns = fh.read().split()[:2]
        return int(run_ns) / 1e9, int(wait_ns) / 1e9
    except (OSError, ValueError):
        return time.thread_time(), None


def mallocs() -> int:
    return int(torch.cuda.memory_stats().get("segment.all.allocated", 0)) if sc.cuda else 0


def sync() -> None:
    if sc.cuda:
        torch.cuda.synchronize()


def next_batch() -> list:
    try:
        return next(it["batches"])
    except StopIteration:
        own["epochs"] += 1
        it["batches"] = iter(loader)
        return next(it["batches"])


def to_device(batch: list) -> tuple[list, torch.Tensor]:
    """Each sample on its own, as the loop does (pageable, non_blocking=False), and the labels."""
    xs = [x.to(dev) for x, _ in batch]
    y = torch.tensor([label for _, label in batch], device=dev)
    return xs, y


def train(xs: list, y: torch.Tensor) -> torch.Tensor:
    x = torch.stack(xs).contiguous(memory_format=torch.channels_last)
    with torch.autocast(sc.device, dtype=torch.bfloat16, enabled=sc.cuda):
        loss = loss_fn(model(x).float(), y)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    return loss


def step() -> None:
    t0 = time.perf_counter()
    batch = next_batch()
    t1 = time.perf_counter()
    sync()  # for the timing: the copies below timed alone (loss.item() waited for the step before already)
    t2 = time.perf_counter()
    r2, w2 = schedstat()
    xs, y = to_device(batch)
    sync()
    r3, w3 = schedstat()
    t3 = time.perf_counter()
    loss = train(xs, y)
    t4 = time.perf_counter()
    own["running_loss"] += loss.item()
    t5 = time.perf_counter()
    own["fetch_s"] += t1 - t0
    own["sync_s"] += t2 - t1
    own["copy_s"] += t3 - t2
    own["copy_run_s"] += r3 - r2
    own["copy_cpu_wait_s"] += (w3 - w2) if w2 is not None and w3 is not None else 0.0
    own["issue_s"] += t4 - t3
    own["item_s"] += t5 - t4
    own["copies"] += len(batch) + 1
    own["steps"] += 1
    if own["steps"] % 500 == 0:
        print(f"step {own['steps']}: loss {own['running_loss'] / own['steps']:.4f}", flush=True)


def median_s(fn, k: int = 7) -> float:
    times = []
    for _ in range(k):
        sync()
        a = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - a)
    return sorted(times)[k // 2]


for _ in range(30):  # warm-up: cudnn's choices, the allocator's blocks, the autograd thread
    step()
sync()
sample = next_batch()
alone = {"per_sample_ms": median_s(lambda: to_device(sample)) * 1e3}
gpu_step_s = None
if sc.cuda:
    pinned_samples = [(x.pin_memory(), label) for x, label in sample]
    labels_pinned = torch.tensor([label for _, label in sample]).pin_memory()

    def from_pinned() -> None:
        for x, _ in pinned_samples:
            x.to(dev, non_blocking=True)
        labels_pinned.to(dev, non_blocking=True)

    def stacked() -> None:
        torch.stack([x for x, _ in sample]).to(dev)
        torch.tensor([label for _, label in sample]).to(dev)

    buf = torch.empty((BATCH, 3, SIDE, SIDE), pin_memory=True)

    def stacked_pinned() -> None:
        torch.stack([x for x, _ in sample], out=buf)
        buf.to(dev, non_blocking=True)
        labels_pinned.to(dev, non_blocking=True)

    alone.update(pinned_ms=median_s(from_pinned) * 1e3, stacked_ms=median_s(stacked) * 1e3,
                 stacked_pinned_ms=median_s(stacked_pinned) * 1e3)
    xs_dev, y_dev = to_device(sample)

    def work(_) -> None:
        """A step's GPU work from a batch on the GPU (the stack included), nothing read back."""
        train(xs_dev, y_dev)

    runs = sorted(r for r in (gpu_seconds_queued(torch, work) for _ in range(5)) if r is not None)
    gpu_step_s = runs[len(runs) // 2] if runs else None
    del pinned_samples, buf, xs_dev
warm_end = time.perf_counter() + 2.0 * sc.scale  # the spin kernels well before the baseline
while time.perf_counter() < warm_end:
    step()
sync()
for key in own:
    own[key] = 0 if key in ("steps", "copies", "epochs") else 0.0
run0, wait0 = schedstat()
f0, m0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt, mallocs()
b0 = sc.mark("baseline")
t = time.perf_counter()
sc.run_for(10.0 * sc.scale, step)
mid = sc.mark("half")
sc.run_for(10.0 * sc.scale, step)
sync()
b1 = sc.mark("end")
wall = time.perf_counter() - t
run1, wait1 = schedstat()
f1, m1 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt, mallocs()
n = own["steps"]
gpu_busy = n * gpu_step_s if gpu_step_s is not None else None


def share(v: float | None) -> float | None:
    return round(v / wall, 4) if v is not None else None


def ms(v: float | None) -> float | None:
    return round(v, 4) if v is not None else None


stacked_ms = alone.get("stacked_ms")
would_save = own["copy_s"] - n * stacked_ms / 1e3 if stacked_ms is not None else None
copy_sleep = max(0.0, own["copy_s"] - own["copy_run_s"] - own["copy_cpu_wait_s"])
sc.extra["self"] = {**{k: round(v, 4) for k, v in own.items()}, "wall_s": round(wall, 4),
                    "steps_per_s": round(n / wall, 2), "copies_per_s": round(own["copies"] / wall, 1),
                    "copies_per_step": BATCH + 1, "sample_bytes": 3 * SIDE * SIDE * 4,
                    **{f"{k.removesuffix('_s')}_share": share(own[k]) for k in own if k.endswith("_s")},
                    "copy_us_per_copy": round(own["copy_s"] / max(own["copies"], 1) * 1e6, 3),
                    "copy_sleep_s": round(copy_sleep, 4), "copy_sleep_share": share(copy_sleep),
                    "main_run_s": round(run1 - run0, 4), "main_cpu_share": share(run1 - run0),
                    "main_cpu_wait_s": round(wait1 - wait0, 4) if wait0 is not None else None,
                    "main_cpu_wait_share": share(wait1 - wait0) if wait0 is not None else None,
                    "minor_faults_per_s": round((f1 - f0) / wall, 1), "cuda_mallocs_per_s": round((m1 - m0) / wall, 3),
                    "per_sample_alone_ms": ms(alone["per_sample_ms"]), "pinned_alone_ms": ms(alone.get("pinned_ms")),
                    "stacked_alone_ms": ms(stacked_ms), "stacked_pinned_alone_ms": ms(alone.get("stacked_pinned_ms")),
                    "stacking_would_save_s": round(would_save, 4) if would_save is not None else None,
                    "gpu_step_ms": round(gpu_step_s * 1e3, 4) if gpu_step_s is not None else None,
                    "gpu_busy_s": round(gpu_busy, 4) if gpu_busy is not None else None,
                    "gpu_busy_share": share(gpu_busy), "batch": BATCH, "images": NIMG, "widths": list(WIDTHS),
                    "mean_loss": round(own["running_loss"] / max(n, 1), 4)}
if not sc.cuda:
    sc.note("on the CPU the copies are no-ops (.to('cpu') returns the tensor): no GPU timings, no pinned memory, no "
            "allocator counters.")
sc.note(f"natural: measured by the script: {n} steps ({n / wall:.1f}/s) in {wall:.2f} s, {own['copies']} copies "
        f"({own['copies'] / wall:.0f}/s): {own['fetch_s']:.2f} s in next() (__getitem__ x {BATCH}), "
        f"{own['copy_s']:.2f} s in the per-sample copies (the main thread on a CPU {own['copy_run_s']:.2f} s of it), "
        f"{own['issue_s']:.2f} s queueing the steps, {own['item_s']:.2f} s in .item(); a batch's copies alone "
        f"{alone['per_sample_ms']:.2f} ms as the loop makes them"
        + (f", {alone['pinned_ms']:.2f} ms from pinned samples, {alone['stacked_ms']:.2f} ms stacked first" if sc.cuda
           else "") + "; "
        + (f"a step's kernels take {gpu_step_s * 1e3:.2f} ms of GPU time queued (GPU busy {gpu_busy / wall:.0%} of the "
           "run)." if gpu_busy is not None else "no GPU timings (no CUDA)."))
sc.write_truth(baseline=(b0, b1), window=None, ratio_spans=((b0, mid), (mid, b1)))
