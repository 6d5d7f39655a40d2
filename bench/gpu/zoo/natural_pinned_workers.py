"""natural_pinned_workers (natural, nothing staged): an image classifier as a first vision script trains one: a Dataset
of 256 stored images (3x144x144 uint8, HWC, each kept zlib-compressed in memory as a PNG or JPEG file would be), whose
__getitem__ decompresses one and makes a random 128x128 crop and a random horizontal flip with numpy; a DataLoader with
3 workers (CPUs 3-5), pin_memory=True, persistent_workers=True, prefetch_factor=4, batch 128; the main thread copies
each batch with .to(dev, non_blocking=True), scales it to float in channels_last and trains a small ResNet (a stem and
three stages of two basic blocks, 32-64-128 channels, BatchNorm) under bf16 autocast, SGD with momentum, loss.item()
each step. Main thread on CPU 2, 20 s. The script measures itself: the main thread's time in next() on the loader
(waiting for batches: with pin_memory, for PyTorch's pin-memory thread, which waits for the workers) and in its
steps."""

import os
import time
import zlib

import numpy as np

from common import Scenario, map_cpus

sc = Scenario("natural_pinned_workers", "natural", "a small ResNet (channels_last, bf16 autocast) fed by a 3-worker "
              "pinned DataLoader that decompresses, crops and flips images with numpy, 20 s, nothing staged",
              job_cpus=[2], culprit_cpus=[3, 4, 5], control=True)
import torch  # noqa: E402

dev = torch.device(sc.device)
NIMG, SIDE, CROP, NCLASS = 256, 144, 128, 100
BATCH, WIDTHS = (128, (32, 64, 128)) if sc.cuda else (16, (8, 16, 32))
WORKER_CPUS = map_cpus([3, 4, 5])
# channels_last on the GPU; on the CPU smoke (torch 2.13 CPU wheel) a strided block's backward in it segfaults
FMT = torch.channels_last if sc.cuda else torch.contiguous_format


def make_image(rng: np.random.Generator) -> np.ndarray:
    """A made-up photo: smooth colour fields and edges plus sensor noise (compresses about as a PNG does)."""
    y, x = np.mgrid[0:SIDE, 0:SIDE].astype(np.float32) / SIDE
    chans = []
    for _ in range(3):
        a, b, c, d = rng.uniform(-3, 3, 4)
        chans.append(128 + 60 * np.sin(a * x + b * y + c) + 40 * np.cos(d * x * y * 6) * (x > rng.uniform(0, 1)))
    img = np.stack(chans, -1) + rng.normal(0, 2, (SIDE, SIDE, 3))
    return np.clip(img, 0, 255).astype(np.uint8)


class Images(torch.utils.data.Dataset):
    """Sample i: (a random crop and flip of stored image i % NIMG, decompressed here, HWC uint8; its label)."""

    def __init__(self) -> None:
        rng = np.random.default_rng(0)
        self.blobs = [zlib.compress(make_image(rng).tobytes(), 6) for _ in range(NIMG)]
        self.labels = rng.integers(0, NCLASS, NIMG)

    def __len__(self) -> int:
        return 1 << 30

    def __getitem__(self, i: int) -> tuple[np.ndarray, int]:
        rng = np.random.default_rng(i)
        img = np.frombuffer(zlib.decompress(self.blobs[i % NIMG]), np.uint8).reshape(SIDE, SIDE, 3)
        top, left = rng.integers(0, SIDE - CROP + 1, 2)
        img = img[top:top + CROP, left:left + CROP]
        if rng.random() < 0.5:
            img = img[:, ::-1]
        return np.ascontiguousarray(img), int(self.labels[i % NIMG])


def pin_worker(k: int) -> None:
    os.sched_setaffinity(0, [WORKER_CPUS[k % len(WORKER_CPUS)]])


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


torch.manual_seed(0)
model = resnet().to(dev, memory_format=FMT)
opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, nesterov=True)
mean = torch.tensor([0.485, 0.456, 0.406], device=dev).view(1, 3, 1, 1) * 255
std = torch.tensor([0.229, 0.224, 0.225], device=dev).view(1, 3, 1, 1) * 255
loader = torch.utils.data.DataLoader(Images(), batch_size=BATCH, shuffle=False, num_workers=3, pin_memory=sc.cuda,
                                     persistent_workers=True, prefetch_factor=4, worker_init_fn=pin_worker,
                                     drop_last=True)
it = iter(loader)
own = {"wait_s": 0.0, "step_s": 0.0, "steps": 0}


def step() -> None:
    t0 = time.perf_counter()
    img, y = next(it)
    t1 = time.perf_counter()
    img, y = img.to(dev, non_blocking=True), y.to(dev, non_blocking=True)
    x = (img.permute(0, 3, 1, 2).float() - mean) / std  # NHWC memory seen as NCHW: channels_last already
    x = x.contiguous(memory_format=FMT)
    with torch.autocast(sc.device, dtype=torch.bfloat16, enabled=sc.cuda):
        loss = torch.nn.functional.cross_entropy(model(x).float(), y)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    loss.item()
    t2 = time.perf_counter()
    own["wait_s"] += t1 - t0
    own["step_s"] += t2 - t1
    own["steps"] += 1


for _ in range(15):
    step()
own.update(wait_s=0.0, step_s=0.0, steps=0)
b0 = sc.mark("baseline")
t = time.perf_counter()
sc.run_for(10.0 * sc.scale, step)
mid = sc.mark("half")
sc.run_for(10.0 * sc.scale, step)
b1 = sc.mark("end")
wall = time.perf_counter() - t
sc.extra["self"] = {**{k: round(v, 4) for k, v in own.items()}, "wall_s": round(wall, 4),
                    "wait_share": round(own["wait_s"] / wall, 4), "step_share": round(own["step_s"] / wall, 4),
                    "batch": BATCH, "workers": 3, "pin_memory": sc.cuda,
                    "compressed_bytes_per_image": round(sum(map(len, loader.dataset.blobs)) / NIMG)}
sc.extra["workers"] = [w.pid for w in it._workers]
if not sc.cuda:
    sc.note("pin_memory and channels_last off: no CUDA.")
sc.note(f"natural: measured by the script over the run: {own['steps']} steps, {own['wait_s']:.2f} s in next() on "
        f"the loader, {own['step_s']:.2f} s in steps, of {wall:.2f} s.")
sc.write_truth(baseline=(b0, b1), window=None, ratio_spans=((b0, mid), (mid, b1)))
