"""natural_png_snapshots_main_thread (natural, nothing staged): a training loop with a team's "visualise progress" hook
on its main thread. A convolutional autoencoder (3-64-128-256 channels down with stride-2 4x4 convolutions, and back
up with transposed ones, sigmoid out; fp32 without TF32, cudnn.benchmark, fused AdamW, MSE loss read with .item()
every 10 steps) is trained on 3x128x128 images, batch 64, from a pool of 16 batches made once on the GPU (smooth
random images: low-resolution noise upsampled). Every N steps, N set from the warm-up's step rate so that it comes
about once a second (as a team sets `--sample-every`), the hook saves the batch's 64 reconstructions as an 8x8 grid
PNG (1024x1024 RGB) in a local folder under /tmp: the reconstructions copied to the host (.detach().cpu(), float32,
12.6 MB pageable: it waits for the steps the host has queued), the grid made and converted to uint8 with numpy,
encoded as a PNG with PIL where it is installed (Image.save, its default compression), else with a minimal PNG writer
(zlib level 6 over filter-0 scan lines), and written to its file (open, write, close; the page cache, no fsync). One
process on CPUs 2-3, no threads of its own, no workers, ~20 s measured.

The script measures itself: the steps per second, in and outside the snapshots; the main thread's time in the
snapshots and in each of their parts (the copy, the grid, the encode, the write: `copy_s`, `grid_s`, `encode_s`,
`write_s`) and their spans (truth `snapshots_ns`); its time in .item() and in loss.backward() (`backward_s`: PyTorch's
autograd thread queues the backward while the main thread waits); its time on a CPU and waiting for one
(schedstat); the process's minor page faults and the device allocator's cudaMalloc calls; and a step's GPU time queued
(common.gpu_seconds_queued), so that the GPU's busy share is known."""

import io
import os
import resource
import struct
import tempfile
import time
import zlib

import numpy as np

from common import Scenario, gpu_seconds_queued

sc = Scenario("natural_png_snapshots_main_thread", "natural", "a conv autoencoder whose main thread saves a PNG grid "
              "of 64 reconstructions (copy to host, grid, encode, write) about once a second, 20 s, nothing staged",
              job_cpus=[2, 3], control=True)
import torch  # noqa: E402

try:
    from PIL import Image
except ImportError:
    Image = None
dev = torch.device(sc.device)
BATCH, SIDE, POOL, LOG_EVERY, GRID = (64, 128, 16, 10, 8) if sc.cuda else (64, 128, 4, 10, 8)
if sc.cuda:
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cudnn.benchmark = True
nn = torch.nn
width = (64, 128, 256) if sc.cuda else (8, 16, 32)


def autoencoder() -> nn.Module:
    a, b, c = width
    return nn.Sequential(nn.Conv2d(3, a, 4, 2, 1), nn.ReLU(), nn.Conv2d(a, b, 4, 2, 1), nn.ReLU(),
                         nn.Conv2d(b, c, 4, 2, 1), nn.ReLU(), nn.ConvTranspose2d(c, b, 4, 2, 1), nn.ReLU(),
                         nn.ConvTranspose2d(b, a, 4, 2, 1), nn.ReLU(), nn.ConvTranspose2d(a, 3, 4, 2, 1), nn.Sigmoid())


torch.manual_seed(0)
model = autoencoder().to(dev)
opt = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=sc.cuda or None)
loss_fn = nn.MSELoss()
images = [nn.functional.interpolate(torch.rand(BATCH, 3, 16, 16, device=dev), size=(SIDE, SIDE), mode="bilinear",
                                    align_corners=False) for _ in range(POOL)]
OUT_DIR = tempfile.mkdtemp(prefix="zoo_samples_")
encoder = "PIL" if Image is not None else "zlib"


def png_bytes(rgb: np.ndarray) -> bytes:
    """A PNG of an HxWx3 uint8 array: PIL where installed, else a minimal writer (filter 0, zlib level 6)."""
    if Image is not None:
        buf = io.BytesIO()
        Image.fromarray(rgb).save(buf, format="PNG")
        return buf.getvalue()
    h, w, _ = rgb.shape
    raw = np.concatenate([np.zeros((h, 1), np.uint8), rgb.reshape(h, w * 3)], axis=1).tobytes()

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(raw, 6)) + chunk(b"IEND", b""))


own = {"steps": 0, "backward_s": 0.0, "snapshots": 0, "snapshot_s": 0.0, "copy_s": 0.0, "grid_s": 0.0,
       "encode_s": 0.0, "write_s": 0.0, "item_s": 0.0, "bytes_written": 0, "running_loss": 0.0}
snap_spans: list[tuple[float, float]] = []
pos = {"i": 0, "every": 100}


def snapshot(recon: torch.Tensor, step_no: int) -> None:
    """The hook: the batch's reconstructions as an 8x8 grid PNG in OUT_DIR."""
    t0 = time.perf_counter()
    imgs = recon[:GRID * GRID].detach().cpu()
    t1 = time.perf_counter()
    arr = imgs.numpy().transpose(0, 2, 3, 1)  # N, H, W, C
    grid = arr.reshape(GRID, GRID, SIDE, SIDE, 3).transpose(0, 2, 1, 3, 4).reshape(GRID * SIDE, GRID * SIDE, 3)
    rgb = (grid * 255.0 + 0.5).clip(0, 255).astype(np.uint8)
    t2 = time.perf_counter()
    data = png_bytes(rgb)
    t3 = time.perf_counter()
    with open(os.path.join(OUT_DIR, f"samples_{step_no:07d}.png"), "wb") as fh:
        fh.write(data)
    t4 = time.perf_counter()
    own["snapshots"] += 1
    own["bytes_written"] += len(data)
    for k, a, b in (("copy_s", t0, t1), ("grid_s", t1, t2), ("encode_s", t2, t3), ("write_s", t3, t4),
                    ("snapshot_s", t0, t4)):
        own[k] += b - a
    snap_spans.append((t0, t4))


def train_step(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    recon = model(x)
    loss = loss_fn(recon, x)
    t_b = time.perf_counter()
    loss.backward()  # queued by PyTorch's autograd thread; the main thread waits for it
    own["backward_s"] += time.perf_counter() - t_b
    opt.step()
    opt.zero_grad(set_to_none=True)
    return loss, recon


def step() -> None:
    i = pos["i"]
    pos["i"] += 1
    loss, recon = train_step(images[i % POOL])
    own["steps"] += 1
    if (i + 1) % LOG_EVERY == 0:
        t0 = time.perf_counter()
        own["running_loss"] += loss.item()
        own["item_s"] += time.perf_counter() - t0
    if (i + 1) % pos["every"] == 0:
        snapshot(recon, i + 1)


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


# Warm-up: cudnn's autotuning, the allocator, one snapshot; then N from the step rate (a snapshot about once a second).
pos["every"] = 10 ** 9
for _ in range(3 * LOG_EVERY):
    step()
snapshot(train_step(images[0])[1], 0)
sync()
t_rate = time.perf_counter()
k0 = own["steps"]
while time.perf_counter() - t_rate < 2.0 * sc.scale:
    step()
sync()
rate = (own["steps"] - k0) / (time.perf_counter() - t_rate)
pos["every"] = max(LOG_EVERY, int(round(rate / LOG_EVERY)) * LOG_EVERY)  # a round number of steps, ~1 s
gpu_step_s = None
if sc.cuda:
    runs = sorted(r for r in (gpu_seconds_queued(torch, lambda _: train_step(images[0])) for _ in range(5))
                  if r is not None)
    gpu_step_s = runs[len(runs) // 2] if runs else None
warm_end = time.perf_counter() + 1.0 * sc.scale  # the spin kernels well before the baseline
while time.perf_counter() < warm_end:
    step()
sync()
for k in own:
    own[k] = 0 if k in ("steps", "snapshots", "bytes_written") else 0.0
snap_spans.clear()
step_times: list[tuple[float, float]] = []
m0 = mallocs()
f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
run0, wait0 = schedstat()


def timed_step() -> None:
    t0 = time.perf_counter()
    step()
    step_times.append((t0, time.perf_counter()))


b0 = sc.mark("baseline")
t = time.perf_counter()
sc.run_for(10.0 * sc.scale, timed_step)
mid = sc.mark("half")
sc.run_for(10.0 * sc.scale, timed_step)
sync()
b1 = sc.mark("end")
wall = time.perf_counter() - t
run1, wait1 = schedstat()
f1 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
m1 = mallocs()
n = own["steps"]
gpu_busy = n * gpu_step_s if gpu_step_s is not None else None
outside = [(a, b) for a, b in step_times if not any(a < e and s < b for s, e in snap_spans)]
out_s = sum(b - a for a, b in outside)
rate_outside = len(outside) / out_s if out_s > 0 else None
shift = time.time_ns() - int(time.perf_counter() * 1e9)
sc.extra["snapshots_ns"] = [[int(s * 1e9) + shift, int(e * 1e9) + shift] for s, e in snap_spans]


def share(v: float | None) -> float | None:
    return round(v / wall, 4) if v is not None else None


sc.extra["self"] = {**{k: round(v, 4) for k, v in own.items()}, "wall_s": round(wall, 4),
                    "steps_per_s": round(n / wall, 2), "steps_per_s_outside_snapshots":
                        round(rate_outside, 2) if rate_outside else None,
                    "snapshot_every": pos["every"], "encoder": encoder, "out_dir": OUT_DIR,
                    "snapshot_share": share(own["snapshot_s"]), "copy_share": share(own["copy_s"]),
                    "grid_share": share(own["grid_s"]), "encode_share": share(own["encode_s"]),
                    "write_share": share(own["write_s"]), "item_share": share(own["item_s"]),
                    "snapshot_ms_mean": round(own["snapshot_s"] / max(own["snapshots"], 1) * 1e3, 3),
                    "main_run_s": round(run1 - run0, 4), "main_cpu_share": share(run1 - run0),
                    "main_cpu_wait_s": round(wait1 - wait0, 4) if wait0 is not None else None,
                    "main_cpu_wait_share": share(wait1 - wait0) if wait0 is not None else None,
                    "minor_faults_per_s": round((f1 - f0) / wall, 1),
                    "cuda_mallocs_per_s": round((m1 - m0) / wall, 3),
                    "gpu_step_ms": round(gpu_step_s * 1e3, 4) if gpu_step_s is not None else None,
                    "gpu_busy_s": round(gpu_busy, 4) if gpu_busy is not None else None,
                    "gpu_busy_share": share(gpu_busy), "batch": BATCH}
sc.note(f"natural: measured by the script: {n} steps ({n / wall:.1f}/s) in {wall:.2f} s; {own['snapshots']} snapshots "
        f"every {pos['every']} steps ({encoder}), {own['snapshot_s']:.2f} s in them: copy {own['copy_s']:.3f} s, grid "
        f"{own['grid_s']:.3f} s, encode {own['encode_s']:.3f} s, write {own['write_s']:.3f} s; "
        + (f"a step's kernels take {gpu_step_s * 1e3:.2f} ms of GPU time queued (GPU busy {gpu_busy / wall:.0%} of the "
           "run)." if gpu_busy is not None else "no GPU timings (no CUDA)."))
sc.write_truth(baseline=(b0, b1), window=None, ratio_spans=((b0, mid), (mid, b1)))
