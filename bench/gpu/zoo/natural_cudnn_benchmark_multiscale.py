"""natural_cudnn_benchmark_multiscale (natural, nothing staged): an image classifier trained with multi-scale inputs the
way YOLOv5's train.py does it (`sz = random.randrange(imgsz * 0.5, imgsz * 1.5 + gs) // gs * gs`, then the batch
resized on the GPU with F.interpolate(..., mode="bilinear")): a new random side every batch, one of 41 (160 to 480
px in steps of 8), with torch.backends.cudnn.benchmark=True left on, as most training templates set it. cuDNN's
benchmark mode caches one algorithm per convolution shape: at each side not seen before, every convolution of the
forward (on the main thread) and of the backward (on PyTorch's autograd thread, the main thread waiting in
loss.backward()) first times the candidate kernels of cuDNN's find (up to benchmark_limit of them, each run until its
time is stable, a synchronisation each) before the step goes on; at a side seen before the cached algorithm runs at
once. The 41 sides keep appearing for the first hundreds of batches, so new ones arrive all through the measured run.
The model: a ResNet-18-style backbone (stem 7x7 of stride 2 and a max pool, stages 64-128-256-512) and a 100-class
head; batch 32 of 3x320x320 uint8 images held on the GPU (256 of them, smooth colours and noise, a class each),
normalised there and resized to the batch's side; fp32 without TF32, SGD with Nesterov momentum, loss.item() each step.
One process on CPUs 2-3; no threads of the job's own, no workers, no children, no IO, no lock, no sleep; the
warm-up (20 steps at 320 px) before the run. 20 s (smaller with --device cpu: 64 px sides 32-96, a narrower net,
batch 8; cuDNN does not run there).

The script measures itself: the steps per second; each step's side and wall time (from the batch to the end of
.item(), which waits for it), whether its side was new, the wall time of the steps at new sides (`new_shape_s`,
`new_shape_steps`) and at sides seen before (`seen_shape_s`); the main thread's time queueing the forward and the
optimiser step (`step_s`), in loss.backward() (`backward_s`, its wait on PyTorch's autograd thread, which autotunes
the backward's convolutions at a new side) and in loss.item() (`item_s`); after the run, at every side the run used
(all tuned by then), the wall time of a step (median of 3: `tuned_ms`) and its GPU time queued
(common.gpu_seconds_queued, median of 3), so that what the autotuning cost is known (`autotune_overhead_s`: the new
sides' steps beyond their tuned time; `tuned_overhead_s`: the run's wall time beyond all its steps at their tuned
times) and the GPU's busy share (the steps' own kernels, not the candidates cuDNN timed); before the run, the fix
(benchmark=False: cuDNN's heuristics pick an algorithm without timing any), on the same draw of sides at batch 31 so
that none of its cached plans is one the run looks up (cuDNN's cache is keyed by the shapes, batch included, not by the
mode), its step time fitted to the pixels a step (`nobench_overhead_s`: the run's wall time beyond its steps at that
fit); the main thread's and the autograd thread's time on a CPU and waiting for one over the run (schedstat); the
process's minor page faults and the device allocator's cudaMalloc calls. Truth `autograd` names PyTorch's autograd
thread, `autotune` the setting, the sides and where the time goes."""

import os
import random
import resource
import threading
import time

from common import Scenario, comm_of, gpu_seconds_queued, tids_of

sc = Scenario("natural_cudnn_benchmark_multiscale", "natural", "a ResNet-18-style classifier trained on multi-scale "
              "batches (a random side of 41, 160-480 px, each batch, resized on the GPU) with "
              "torch.backends.cudnn.benchmark=True: every new side makes cuDNN time its candidate kernels for each "
              "convolution before the step goes on, 20 s, nothing staged", job_cpus=[2, 3], control=True)
import numpy as np  # noqa: E402
import torch  # noqa: E402

nn = torch.nn
F = nn.functional
PID, MAIN = os.getpid(), threading.get_native_id()
dev = torch.device(sc.device)
if sc.cuda:
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
IMG, GS, BATCH, POOL, WIDTHS = (320, 8, 32, 256, (64, 128, 256, 512)) if sc.cuda else (64, 8, 8, 64, (8, 16, 32, 32))
CLASSES = 100
SIDES = sorted({s // GS * GS for s in range(int(IMG * 0.5), int(IMG * 1.5) + GS)})  # what randrange // gs * gs gives
KEYS = ("new_shape_s", "seen_shape_s", "step_s", "backward_s", "item_s")
own = {"steps": 0, "new_shape_steps": 0, **dict.fromkeys(KEYS, 0.0), "running_loss": 0.0}
steps_log: list[tuple[int, float, bool]] = []  # (side, wall s, new side)
seen: set[int] = set()
state: dict = {"batch": BATCH, "rng": random.Random(0), "fixed_side": None, "log": True}


def make_pool() -> tuple[torch.Tensor, torch.Tensor]:
    """POOL images of 3xIMGxIMG uint8 (each class its own smooth colours, then noise) and their classes, on the
    device."""
    rng = np.random.default_rng(0)
    y = rng.integers(0, CLASSES, POOL)
    looks = rng.integers(0, 256, (CLASSES, 3, IMG // 16, IMG // 16)).astype(np.float32)
    img = np.repeat(np.repeat(looks[y], 16, 2), 16, 3)
    img += 20 * rng.standard_normal(img.shape, dtype=np.float32)
    return (torch.from_numpy(np.clip(img, 0, 255).astype(np.uint8)).to(dev),
            torch.from_numpy(y.astype(np.int64)).to(dev))


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


def resnet18() -> nn.Module:
    layers = [nn.Conv2d(3, WIDTHS[0], 7, 2, 3, bias=False), nn.BatchNorm2d(WIDTHS[0]), nn.ReLU(), nn.MaxPool2d(3, 2, 1)]
    cin = WIDTHS[0]
    for k, cout in enumerate(WIDTHS):
        layers += [Block(cin, cout, 1 if k == 0 else 2), Block(cout, cout, 1)]
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


def mallocs() -> int:
    return int(torch.cuda.memory_stats().get("segment.all.allocated", 0)) if sc.cuda else 0


pool, pool_y = make_pool()
torch.manual_seed(0)
model = resnet18().to(dev)
opt = torch.optim.SGD(model.parameters(), lr=0.02, momentum=0.9, nesterov=True, weight_decay=5e-4)
mean = torch.tensor([0.485, 0.456, 0.406], device=dev).view(1, 3, 1, 1) * 255
std = torch.tensor([0.229, 0.224, 0.225], device=dev).view(1, 3, 1, 1) * 255


def next_side() -> int:
    """YOLOv5's multi-scale draw: a random side in [0.5, 1.5] x IMG, a multiple of GS."""
    if state["fixed_side"] is not None:
        return state["fixed_side"]
    return state["rng"].randrange(int(IMG * 0.5), int(IMG * 1.5) + GS) // GS * GS


def batch_at(side: int, idx: torch.Tensor) -> torch.Tensor:
    x = (pool[idx].float() - mean) / std
    return F.interpolate(x, size=(side, side), mode="bilinear", align_corners=False) if side != IMG else x


def train(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    t0 = time.perf_counter()
    loss = F.cross_entropy(model(x), y, label_smoothing=0.1)
    opt.zero_grad(set_to_none=True)
    t1 = time.perf_counter()
    loss.backward()
    t2 = time.perf_counter()
    opt.step()
    own["backward_s"] += t2 - t1
    own["step_s"] += (t1 - t0) + (time.perf_counter() - t2)
    return loss


def step() -> None:
    side = next_side()
    t0 = time.perf_counter()
    idx = torch.randint(0, POOL, (state["batch"],), device=dev)
    loss = train(batch_at(side, idx), pool_y[idx])
    t1 = time.perf_counter()
    own["running_loss"] += loss.item()
    t2 = time.perf_counter()
    own["item_s"] += t2 - t1
    own["steps"] += 1
    if not state["log"]:
        return
    new = side not in seen
    seen.add(side)
    steps_log.append((side, t2 - t0, new))
    if new:
        own["new_shape_s"] += t2 - t0
        own["new_shape_steps"] += 1
    else:
        own["seen_shape_s"] += t2 - t0


def sync() -> None:
    if sc.cuda:
        torch.cuda.synchronize()


def reset() -> None:
    for k in own:
        own[k] = 0 if k in ("steps", "new_shape_steps") else 0.0
    steps_log.clear()


def timed(seconds: float) -> tuple[int, float]:
    n0, t = own["steps"], time.perf_counter()
    end = t + seconds
    while time.perf_counter() < end:
        step()
    sync()
    return own["steps"] - n0, time.perf_counter() - t


# The fix first: benchmark=False (cuDNN's heuristics, no timing), at batch BATCH - 1 so that none of the plans it
# caches is one the run will look up; its step time fitted to the pixels a step.
torch.backends.cudnn.benchmark = False
state.update(batch=BATCH - 1, fixed_side=IMG, rng=random.Random(1))
for _ in range(10):  # warm-up: the allocator, the autograd thread, cuBLAS
    step()
sync()
state["fixed_side"] = None
reset()
fix_steps, fix_wall = timed(3.0 * sc.scale)
fix_log = list(steps_log)
px = np.array([(BATCH - 1) * s * s for s, _, _ in fix_log], dtype=np.float64)
ws = np.array([w for _, w, _ in fix_log], dtype=np.float64)
fit = np.polyfit(px, ws, 1) if len(fix_log) >= 10 and px.std() > 0 else None  # seconds = fit[0] * pixels + fit[1]
# As the script has it: benchmark=True, a new random side each batch.
torch.backends.cudnn.benchmark = True
state.update(batch=BATCH, fixed_side=IMG, rng=random.Random(0), log=False)
for _ in range(20):  # warm-up at the base side: its convolutions tuned, the allocator, the autograd thread
    step()
sync()
timed(0.5 * sc.scale)  # the spin kernels well before the run
state.update(fixed_side=None, log=True)
seen.clear()
seen.add(IMG)
ag = autograd_thread()
reset()
main0 = schedstat(PID, MAIN)
ag0 = schedstat(PID, ag["tid"]) if ag else None
f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
m0 = mallocs()
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
f1 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
m1 = mallocs()
ran, run_log = dict(own), list(steps_log)
n = ran["steps"]
# After the run, at every side it used (all tuned now): a step's wall time and its GPU time queued.
state["log"] = False
tuned: dict[int, float] = {}
gpu_by_side: dict[int, float] = {}
for side in sorted({s for s, _, _ in run_log}):
    state["fixed_side"] = side
    walls = []
    for _ in range(3):
        t0 = time.perf_counter()
        step()
        walls.append(time.perf_counter() - t0)
    tuned[side] = sorted(walls)[1]
    if sc.cuda:
        idx = torch.randint(0, POOL, (BATCH,), device=dev)
        runs = sorted(r for r in (gpu_seconds_queued(torch, lambda _: train(batch_at(side, idx), pool_y[idx]))
                                  for _ in range(3)) if r is not None)
        if runs:
            gpu_by_side[side] = runs[len(runs) // 2]
sync()


def share(v: float | None) -> float | None:
    return round(v / wall, 4) if v is not None else None


def r4(v: float | None) -> float | None:
    return round(v, 4) if v is not None else None


def delta(a, b, k: int) -> float | None:
    return r4(b[k] - a[k]) if a and b else None


new_steps = [(s, w) for s, w, new in run_log if new]
autotune = sum(max(0.0, w - tuned[s]) for s, w in new_steps)
at_tuned = sum(tuned[s] for s, _, _ in run_log)
tuned_overhead = max(0.0, wall - at_tuned)
at_nobench = float(sum(fit[0] * BATCH * s * s + fit[1] for s, _, _ in run_log)) if fit is not None else None
nobench_overhead = max(0.0, wall - at_nobench) if at_nobench is not None else None
seen_walls = sorted(w for _, w, new in run_log if not new)
new_walls = sorted(w for _, w, new in run_log if new)
main_run, main_wait = delta(main0, main1, 0), delta(main0, main1, 1)
ag_run, ag_wait = delta(ag0, ag1, 0), delta(ag0, ag1, 1)
gpu_busy = (sum(gpu_by_side[s] for s, _, _ in run_log)
            if sc.cuda and all(s in gpu_by_side for s, _, _ in run_log) else None)
first_half = sum(1 for k, (_, _, new) in enumerate(run_log) if new and k < len(run_log) // 2)
new_sides = [s for s, _ in new_steps]
sc.extra["autograd"] = ag
sc.extra["autotune"] = {"what": "torch.backends.cudnn.benchmark=True with a new random input side each batch "
                                "(YOLOv5's multi-scale draw): cuDNN's find times candidate kernels for every "
                                "convolution at each new shape",
                        "setting": "torch.backends.cudnn.benchmark", "benchmark_limit":
                            getattr(torch.backends.cudnn, "benchmark_limit", None),
                        "file": os.path.basename(__file__), "function": "step (F.interpolate, model forward, "
                                                                        "loss.backward)",
                        "sides": SIDES, "new_sides_in_run": new_sides,
                        "cudnn_version": torch.backends.cudnn.version() if sc.cuda else None}
sc.extra["self"] = {**{k: round(v, 4) if isinstance(v, float) else v for k, v in ran.items()},
                    "wall_s": round(wall, 4), "steps_per_s": round(n / wall, 2),
                    "step_ms_mean": round(wall / max(n, 1) * 1e3, 3),
                    "new_shape_share": share(ran["new_shape_s"]), "seen_shape_share": share(ran["seen_shape_s"]),
                    "new_sides": len(new_sides), "new_sides_first_half": first_half,
                    "new_sides_second_half": len(new_sides) - first_half, "sides_total": len(SIDES),
                    "new_step_ms_median": round(new_walls[len(new_walls) // 2] * 1e3, 3) if new_walls else None,
                    "seen_step_ms_median": round(seen_walls[len(seen_walls) // 2] * 1e3, 3) if seen_walls else None,
                    "step_share": share(ran["step_s"]), "backward_share": share(ran["backward_s"]),
                    "item_share": share(ran["item_s"]),
                    "tuned_ms": {str(s): round(v * 1e3, 3) for s, v in tuned.items()},
                    "autotune_overhead_s": r4(autotune), "autotune_overhead_share": share(autotune),
                    "at_tuned_s": r4(at_tuned), "tuned_overhead_s": r4(tuned_overhead),
                    "tuned_overhead_share": share(tuned_overhead),
                    "fix_steps": fix_steps, "fix_wall_s": round(fix_wall, 4), "fix_batch": BATCH - 1,
                    "fix_fit_s_per_mpx": round(float(fit[0]) * 1e6, 6) if fit is not None else None,
                    "fix_fit_intercept_ms": round(float(fit[1]) * 1e3, 3) if fit is not None else None,
                    "at_nobench_s": r4(at_nobench), "nobench_overhead_s": r4(nobench_overhead),
                    "nobench_overhead_share": share(nobench_overhead),
                    "main_run_s": main_run, "main_cpu_share": share(main_run),
                    "main_cpu_wait_s": main_wait, "main_cpu_wait_share": share(main_wait),
                    "autograd_run_s": ag_run, "autograd_cpu_share": share(ag_run),
                    "autograd_cpu_wait_s": ag_wait, "autograd_cpu_wait_share": share(ag_wait),
                    "minor_faults_per_s": round((f1 - f0) / wall, 1), "cuda_mallocs_per_s": round((m1 - m0) / wall, 3),
                    "gpu_step_ms_by_side": {str(s): round(v * 1e3, 4) for s, v in gpu_by_side.items()},
                    "gpu_busy_s": r4(gpu_busy), "gpu_busy_share": share(gpu_busy),
                    "batch": BATCH, "base_side": IMG, "side_step": GS}
if not sc.cuda:
    sc.note("on the CPU: no cuDNN (nothing is autotuned: the new sides cost only their own work), no autograd thread, "
            "no GPU timings, no allocator counters.")
sc.note(f"natural: measured by the script: {n} steps ({n / wall:.1f}/s) in {wall:.2f} s: {len(new_sides)} new sides "
        f"({first_half} in the first half of the steps), their steps {ran['new_shape_s']:.2f} s (median "
        f"{new_walls and round(new_walls[len(new_walls) // 2] * 1e3, 1)} ms against "
        f"{seen_walls and round(seen_walls[len(seen_walls) // 2] * 1e3, 1)} ms at a side seen before); the "
        f"autotuning cost {autotune:.2f} s of the run (all steps at their tuned time: {tuned_overhead:.2f} s); with "
        f"benchmark=False the run would have taken {at_nobench and round(at_nobench, 2)} s; {ran['backward_s']:.2f} s "
        f"in loss.backward(); the main thread ran {main_run} s, waited for a CPU {main_wait} s; "
        + (f"the steps' own kernels take {gpu_busy:.2f} s of GPU time queued (GPU busy {gpu_busy / wall:.0%} of the "
           "run)." if gpu_busy is not None else "no GPU timings (no CUDA)."))
sc.write_truth(baseline=(b0, b1), window=None, ratio_spans=((b0, mid), (mid, b1)))
