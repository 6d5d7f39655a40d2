"""natural_main_thread_prep (natural, nothing staged): no DataLoader: the main thread (CPU 2) makes each batch itself
with numpy (crop a window from a pool of images, flip half, normalise per channel, a little noise), then a small conv
net's training step on the GPU, loss.item() each step, 20 s: the data preparation a first script does inline. The
script measures itself: the time preparing batches and the time in steps."""

import time

import numpy as np

from common import Scenario

sc = Scenario("natural_main_thread_prep", "natural", "batches made with numpy on the main thread before each conv "
              "net step, 20 s, nothing staged", job_cpus=[2], control=True)
import torch  # noqa: E402

dev = torch.device(sc.device)
BATCH, SIDE = (64, 96) if sc.cuda else (8, 32)
rng = np.random.default_rng(0)
pool = rng.integers(0, 256, (256, SIDE + 16, SIDE + 16, 3), dtype=np.uint8)
mean, std = np.array([123.0, 117.0, 104.0], np.float32), np.array([58.0, 57.0, 57.0], np.float32)
torch.manual_seed(0)
model = torch.nn.Sequential(
    torch.nn.Conv2d(3, 64, 3, padding=1), torch.nn.ReLU(), torch.nn.Conv2d(64, 128, 3, stride=2, padding=1),
    torch.nn.ReLU(), torch.nn.Conv2d(128, 256, 3, stride=2, padding=1), torch.nn.ReLU(),
    torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(256, 10)).to(dev)
opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
own = {"prep_s": 0.0, "step_s": 0.0, "steps": 0}


def make_batch() -> tuple[np.ndarray, np.ndarray]:
    idx = rng.integers(0, len(pool), BATCH)
    ox, oy = rng.integers(0, 16, 2)
    x = pool[idx, oy:oy + SIDE, ox:ox + SIDE].astype(np.float32)
    flip = rng.random(BATCH) < 0.5
    x[flip] = x[flip, :, ::-1]
    x = (x - mean) / std + rng.standard_normal(x.shape, dtype=np.float32) * 0.05
    return np.ascontiguousarray(x.transpose(0, 3, 1, 2)), (idx % 10).astype(np.int64)


def step() -> None:
    t0 = time.perf_counter()
    x, y = make_batch()
    t1 = time.perf_counter()
    x, y = torch.from_numpy(x).to(dev), torch.from_numpy(y).to(dev)
    loss = torch.nn.functional.cross_entropy(model(x), y)
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    loss.item()
    own["prep_s"] += t1 - t0
    own["step_s"] += time.perf_counter() - t1
    own["steps"] += 1


for _ in range(10):
    step()
own.update(prep_s=0.0, step_s=0.0, steps=0)
b0 = sc.mark("baseline")
t = time.perf_counter()
sc.run_for(10.0 * sc.scale, step)
mid = sc.mark("half")
sc.run_for(10.0 * sc.scale, step)
b1 = sc.mark("end")
wall = time.perf_counter() - t
sc.extra["self"] = {"prep_s": round(own["prep_s"], 4), "step_s": round(own["step_s"], 4), "steps": own["steps"],
                    "wall_s": round(wall, 4), "prep_share": round(own["prep_s"] / wall, 4)}
sc.note(f"natural: measured by the script: {own['steps']} steps, {own['prep_s']:.2f} s making batches with numpy, "
        f"{own['step_s']:.2f} s in steps, of {wall:.2f} s.")
sc.write_truth(baseline=(b0, b1), window=None, ratio_spans=((b0, mid), (mid, b1)))
