"""natural_epoch_loss_list_stats (natural, nothing staged): an image classifier whose loop keeps every sample's loss
and hit of the epoch so far in Python lists (for the end-of-epoch report and a later look at the hard examples) and
shows a progress line every step computed over those lists, the way a tqdm `set_postfix` is often fed:

    epoch_losses.extend(loss_vec.detach().tolist()); epoch_correct.extend((logits.argmax(1) == y).tolist())
    postfix = {"loss": np.mean(epoch_losses), "p90": np.percentile(epoch_losses, 90), "acc": np.mean(epoch_correct)}

Each of those numpy calls converts the whole list (every Python float or bool of the epoch so far) to an array, and
np.percentile partitions it: the work grows by a batch's worth every step and falls back to nothing at each epoch's
start, all of it on the main thread while the GPU waits for the next step. The data: Tiny-ImageNet-sized 3x64x64
uint8 images of 200 classes (class templates and noise) held on the GPU, a new random permutation each epoch, the
batch flipped at random and normalised on the GPU; batch 256. The model: a ResNet-18-style net (a stride-2 stem 3-64,
stages 64-128-256-512), channels_last, bf16 autocast, SGD with Nesterov momentum, per-sample cross-entropy
(reduction="none") and its mean as the loss; the two .tolist() calls are the step's reads back (the first waits for
the step's kernels). The dataset's size (so the epoch's length) is set at start-up so that the progress line costs
about a third of the run at this host's speeds: the steps' time measured with the fix first, then a list's cost per
element, then steps_per_epoch = that step time over (cost per element x batch), 16-800 steps (a dataset of 4,096 to
204,800 images; Tiny-ImageNet has 100,000). One process on CPUs 2-3; no threads of the job's own, no workers, no
children, no IO, no lock, no sleep; every batch has the same shape. 20 s (smaller with --device cpu: 32 px images,
batch 64, a narrower net, 8-64 steps an epoch).

The script measures itself: the steps per second; the main thread's time in the progress line (`stats_s`, its CPU
clock `stats_cpu_s`), in the two .tolist() calls (`sync_s`: the wait for the step's kernels and the copies), in the
lists' extend (`extend_s`), at the epochs' ends (`epoch_end_s`: the summary and the lists dropped), making the batch
(`batch_s`: the index and the normalisation queued), queueing the forward and the optimiser step (`step_s`) and in
loss.backward() (`backward_s`, its wait on PyTorch's autograd thread); the progress line's time in the first and the
last tenth of the epochs' steps (its growth); the epochs' spans (truth `epochs_ns`); before the run, the same loop with
the progress line made from running sums and the batch's own 90th percentile (the fix: the same lists kept, nothing
over them), so that what the progress line costs the run is known (`stats_overhead_s`: the run's wall time beyond its
steps at that rate); the main thread's and the autograd thread's time on a CPU and waiting for one over the run
(schedstat); the process's minor page faults and the device allocator's cudaMalloc calls; and a step's GPU time queued
(common.gpu_seconds_queued: a batch already on the GPU, forward, loss, backward, SGD, nothing read back), so that the
GPU's busy share is known. Truth `autograd` names PyTorch's autograd thread, `stats` the function, its calls and the
lists."""

import os
import resource
import threading
import time

from common import Scenario, comm_of, gpu_seconds_queued, now, tids_of

sc = Scenario("natural_epoch_loss_list_stats", "natural", "a ResNet-18-style classifier on GPU-resident 64 px images "
              "whose every step shows np.mean / np.percentile over Python lists of the epoch's per-sample losses and "
              "hits so far, on the main thread, the epoch's length set so that it costs about a third of the run, "
              "20 s, nothing staged", job_cpus=[2, 3], control=True)
import numpy as np  # noqa: E402
import torch  # noqa: E402

nn = torch.nn
F = nn.functional
PID, MAIN = os.getpid(), threading.get_native_id()
dev = torch.device(sc.device)
if sc.cuda:
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
SIDE, BATCH, WIDTHS, EPOCH_STEPS = ((64, 256, (64, 128, 256, 512), (16, 800)) if sc.cuda
                                   else (32, 64, (16, 32, 64, 64), (8, 64)))
CLASSES, TARGET_SHARE = 200, 1 / 3
POOL = EPOCH_STEPS[1] * BATCH  # the most images an epoch can have (the dataset is a prefix of them)
KEYS = ("stats_s", "stats_cpu_s", "sync_s", "extend_s", "epoch_end_s", "batch_s", "step_s", "backward_s")
own = {"steps": 0, "epochs": 0, **dict.fromkeys(KEYS, 0.0), "running_loss": 0.0}
epoch_spans: list[list[int]] = []
stats_by_pos: list[tuple[float, float]] = []  # (position of the step in its epoch in [0, 1), the progress line's s)


def make_images(n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """n uint8 images 3xSIDExSIDE (a class's 8x8 template upsampled, and noise) and their labels, made on the device."""
    g = torch.Generator(device=dev).manual_seed(0)
    templates = torch.rand(CLASSES, 3, 8, 8, generator=g, device=dev) * 255
    labels = torch.randint(0, CLASSES, (n,), generator=g, device=dev)
    images = torch.empty(n, 3, SIDE, SIDE, dtype=torch.uint8, device=dev)
    for a in range(0, n, 4096):
        y = labels[a:a + 4096]
        base = F.interpolate(templates[y], size=(SIDE, SIDE), mode="nearest")
        noise = torch.randn(len(y), 3, SIDE, SIDE, generator=g, device=dev) * 40
        images[a:a + 4096] = (base + noise).clamp_(0, 255).to(torch.uint8)
    return images, labels


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
    layers = [nn.Conv2d(3, WIDTHS[0], 3, 2, 1, bias=False), nn.BatchNorm2d(WIDTHS[0]), nn.ReLU()]
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


def progress(losses: list[float], correct: list[bool]) -> dict[str, str]:
    """The progress line as the script has it: the epoch so far's mean loss, its 90th percentile and the accuracy."""
    return {"loss": f"{np.mean(losses):.4f}", "p90": f"{np.percentile(losses, 90):.4f}",
            "acc": f"{np.mean(correct):.3f}"}


def progress_running(run: dict, losses: list[float], correct: list[bool]) -> dict[str, str]:
    """The fix: running sums for the mean and the accuracy, the batch's own 90th percentile (nothing over the lists)."""
    run["loss"] += sum(losses)
    run["hits"] += sum(correct)
    run["n"] += len(losses)
    return {"loss": f"{run['loss'] / run['n']:.4f}", "p90": f"{np.percentile(losses, 90):.4f}",
            "acc": f"{run['hits'] / run['n']:.3f}"}


pool_x, pool_y = make_images(POOL)
torch.manual_seed(0)
model = resnet18().to(dev).to(memory_format=torch.channels_last)
opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, nesterov=True, weight_decay=5e-4)
mean = torch.tensor([0.480, 0.448, 0.398], device=dev).view(1, 3, 1, 1) * 255
std = torch.tensor([0.277, 0.269, 0.282], device=dev).view(1, 3, 1, 1) * 255
ep: dict = {"n": POOL, "steps": POOL // BATCH, "perm": None, "k": 0, "losses": [], "correct": [], "fix": True,
            "run": None, "start": None}


def new_epoch() -> None:
    ep["perm"] = torch.randperm(ep["n"], device=dev)
    ep["k"] = 0
    ep["losses"], ep["correct"] = [], []
    ep["run"] = {"loss": 0.0, "hits": 0, "n": 0}
    ep["start"] = now()


def batch(k: int) -> tuple[torch.Tensor, torch.Tensor]:
    idx = ep["perm"][k * BATCH:(k + 1) * BATCH]
    x, y = pool_x[idx], pool_y[idx]
    flip = torch.rand(len(idx), 1, 1, 1, device=dev) < 0.5
    x = torch.where(flip, x.flip(3), x)
    x = ((x.float() - mean) / std).contiguous(memory_format=torch.channels_last)
    return x, y


def forward_backward(x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    t0 = time.perf_counter()
    with torch.autocast(sc.device, dtype=torch.bfloat16, enabled=sc.cuda):
        logits = model(x)
    loss_vec = F.cross_entropy(logits.float(), y, reduction="none")
    loss = loss_vec.mean()
    opt.zero_grad(set_to_none=True)
    t1 = time.perf_counter()
    loss.backward()
    t2 = time.perf_counter()
    opt.step()
    own["backward_s"] += t2 - t1
    own["step_s"] += (t1 - t0) + (time.perf_counter() - t2)
    return loss_vec, logits


def end_epoch() -> None:
    t0 = time.perf_counter()
    if ep["losses"]:
        print(f"epoch {own['epochs']}: {len(ep['losses'])} samples, loss {np.mean(ep['losses']):.4f}, "
              f"acc {np.mean(ep['correct']):.3f}", flush=True)
    if ep["start"] is not None and not ep["fix"]:
        epoch_spans.append([ep["start"], now()])
    own["epochs"] += 1
    new_epoch()
    own["epoch_end_s"] += time.perf_counter() - t0


def step() -> None:
    if ep["perm"] is None or ep["k"] >= ep["steps"]:
        end_epoch()
    k = ep["k"]
    ep["k"] += 1
    t0 = time.perf_counter()
    x, y = batch(k)
    own["batch_s"] += time.perf_counter() - t0
    loss_vec, logits = forward_backward(x, y)
    t1 = time.perf_counter()
    losses = loss_vec.detach().tolist()  # waits for the step's kernels
    correct = (logits.argmax(1) == y).tolist()
    t2 = time.perf_counter()
    ep["losses"].extend(losses)
    ep["correct"].extend(correct)
    t3, c3 = time.perf_counter(), time.thread_time()
    if ep["fix"]:
        postfix = progress_running(ep["run"], losses, correct)
    else:
        postfix = progress(ep["losses"], ep["correct"])
    t4 = time.perf_counter()
    own["stats_s"] += t4 - t3
    own["stats_cpu_s"] += time.thread_time() - c3
    own["sync_s"] += t2 - t1
    own["extend_s"] += t3 - t2
    own["running_loss"] += losses[0]
    own["steps"] += 1
    if not ep["fix"]:
        stats_by_pos.append((k / ep["steps"], t4 - t3))
    if own["steps"] % 100 == 0:
        print(f"step {own['steps']} epoch {own['epochs']} [{k + 1}/{ep['steps']}] " + " ".join(
            f"{a}={b}" for a, b in postfix.items()), flush=True)


def restart(fix: bool) -> None:
    """The next step starts a new epoch (with the fix's progress line or the script's); the lists dropped here."""
    ep["fix"], ep["perm"], ep["start"] = fix, None, None
    ep["losses"], ep["correct"] = [], []


def sync() -> None:
    if sc.cuda:
        torch.cuda.synchronize()


def reset() -> None:
    for k in own:
        own[k] = 0 if k in ("steps", "epochs") else 0.0


def timed(seconds: float) -> tuple[int, float]:
    n0, t = own["steps"], time.perf_counter()
    end = t + seconds
    while time.perf_counter() < end:
        step()
    sync()
    return own["steps"] - n0, time.perf_counter() - t


def list_cost_per_element(m: int = 200_000) -> float:
    """The progress line's seconds per element of the lists (the faster of three on m of each)."""
    rng = np.random.default_rng(0)
    losses = (rng.random(m) * 5).tolist()
    correct = (rng.random(m) < 0.3).tolist()
    best = None
    for _ in range(3):
        t = time.perf_counter()
        progress(losses, correct)
        dt = time.perf_counter() - t
        best = dt if best is None else min(best, dt)
    return best / m


# The fix first (running sums), over the whole pool, while the epoch's length is not known yet.
for _ in range(15):  # warm-up: cuDNN's algorithms, the allocator, the autograd thread
    step()
sync()
gpu_step_s = None
if sc.cuda:
    fixed = batch(0)
    runs = sorted(r for r in (gpu_seconds_queued(torch, lambda _: forward_backward(*fixed)) for _ in range(5))
                  if r is not None)
    gpu_step_s = runs[len(runs) // 2] if runs else None
reset()
cal_steps, cal_wall = timed(2.0 * sc.scale)
step_s_fix = cal_wall / max(cal_steps, 1)
per_elem_s = list_cost_per_element()
# The mean cost of the line over an epoch of E steps is per_elem x batch x (E + 1) / 2; a third of the run is half
# the step's own time: E = step time / (per_elem x batch).
epoch_steps = int(min(max(round(step_s_fix / (per_elem_s * BATCH)), EPOCH_STEPS[0]), EPOCH_STEPS[1]))
ep["n"], ep["steps"] = epoch_steps * BATCH, epoch_steps
restart(fix=True)  # a new epoch over the dataset's size
reset()
fix_steps, fix_wall = timed(3.0 * sc.scale)
fix_stats_s = own["stats_s"]
# As the script has it: the progress line over the epoch's lists every step.
restart(fix=False)
ag = autograd_thread()
reset()
stats_by_pos.clear()
main0 = schedstat(PID, MAIN)
ag0 = schedstat(PID, ag["tid"]) if ag else None
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
if ep["start"] is not None:
    epoch_spans.append([ep["start"], b1])  # the last epoch, cut by the run's end
main1 = schedstat(PID, MAIN)
ag1 = schedstat(PID, ag["tid"]) if ag else None
f1 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
m1 = int(torch.cuda.memory_stats().get("segment.all.allocated", 0)) if sc.cuda else 0
n = own["steps"]


def share(v: float | None) -> float | None:
    return round(v / wall, 4) if v is not None else None


def r4(v: float | None) -> float | None:
    return round(v, 4) if v is not None else None


def delta(a, b, k: int) -> float | None:
    return r4(b[k] - a[k]) if a and b else None


def mean_ms(rows: list[tuple[float, float]]) -> float | None:
    return round(sum(s for _, s in rows) / len(rows) * 1e3, 3) if rows else None


fix_rate = fix_steps / fix_wall if fix_wall > 0 else None
at_fix = n / fix_rate if fix_rate else None
overhead = max(0.0, wall - at_fix) if at_fix is not None else None
main_run, main_wait = delta(main0, main1, 0), delta(main0, main1, 1)
ag_run, ag_wait = delta(ag0, ag1, 0), delta(ag0, ag1, 1)
gpu_busy = n * gpu_step_s if gpu_step_s is not None else None
first = [r for r in stats_by_pos if r[0] < 0.1]
last = [r for r in stats_by_pos if r[0] >= 0.9]
sc.extra["autograd"] = ag
sc.extra["epochs_ns"] = epoch_spans
sc.extra["stats"] = {"function": "progress", "file": os.path.basename(__file__),
                     "what": "np.mean(epoch_losses), np.percentile(epoch_losses, 90), np.mean(epoch_correct) over "
                             "Python lists of every sample of the epoch so far, every step, on the main thread",
                     "calls": ["numpy.mean", "numpy.percentile", "numpy.mean"],
                     "lists": ["epoch_losses (float)", "epoch_correct (bool)"],
                     "per_element_ns": round(per_elem_s * 1e9, 2), "steps_per_epoch": epoch_steps,
                     "dataset_images": epoch_steps * BATCH, "list_len_max": epoch_steps * BATCH}
sc.extra["self"] = {**{k: round(v, 4) if isinstance(v, float) else v for k, v in own.items()},
                    "wall_s": round(wall, 4), "steps_per_s": round(n / wall, 2),
                    "step_ms_mean": round(wall / max(n, 1) * 1e3, 3),
                    "stats_share": share(own["stats_s"]), "stats_cpu_share": share(own["stats_cpu_s"]),
                    "stats_ms_per_step": round(own["stats_s"] / max(n, 1) * 1e3, 3),
                    "stats_ms_first_tenth": mean_ms(first), "stats_ms_last_tenth": mean_ms(last),
                    "sync_share": share(own["sync_s"]), "extend_share": share(own["extend_s"]),
                    "epoch_end_share": share(own["epoch_end_s"]), "batch_share": share(own["batch_s"]),
                    "step_share": share(own["step_s"]), "backward_share": share(own["backward_s"]),
                    "epoch_steps": epoch_steps, "dataset_images": epoch_steps * BATCH,
                    "list_cost_ns_per_element": round(per_elem_s * 1e9, 2),
                    "calibration_step_ms": round(step_s_fix * 1e3, 3),
                    "fix_steps": fix_steps, "fix_wall_s": round(fix_wall, 4),
                    "fix_steps_per_s": round(fix_rate, 2) if fix_rate else None,
                    "fix_stats_ms_per_step": round(fix_stats_s / max(fix_steps, 1) * 1e3, 4),
                    "at_fix_rate_s": r4(at_fix), "stats_overhead_s": r4(overhead),
                    "stats_overhead_share": share(overhead),
                    "main_run_s": main_run, "main_cpu_share": share(main_run),
                    "main_cpu_wait_s": main_wait, "main_cpu_wait_share": share(main_wait),
                    "autograd_run_s": ag_run, "autograd_cpu_share": share(ag_run),
                    "autograd_cpu_wait_s": ag_wait, "autograd_cpu_wait_share": share(ag_wait),
                    "minor_faults_per_s": round((f1 - f0) / wall, 1), "cuda_mallocs_per_s": round((m1 - m0) / wall, 3),
                    "gpu_step_ms": round(gpu_step_s * 1e3, 4) if gpu_step_s is not None else None,
                    "gpu_busy_s": r4(gpu_busy), "gpu_busy_share": share(gpu_busy),
                    "batch": BATCH, "image": [3, SIDE, SIDE], "classes": CLASSES}
if not sc.cuda:
    sc.note("on the CPU: no autograd thread (the backward runs on the main thread), no GPU timings, no allocator "
            "counters.")
sc.note(f"natural: measured by the script: {n} steps ({n / wall:.1f}/s) in {wall:.2f} s over {own['epochs']} epoch "
        f"starts of {epoch_steps} steps: {own['stats_s']:.2f} s in the progress line ({own['stats_cpu_s']:.2f} s on "
        f"the main thread's CPU; {mean_ms(first)} ms a step in the epochs' first tenth, {mean_ms(last)} ms in their "
        f"last), {own['sync_s']:.2f} s in the .tolist() reads; with running sums {fix_rate and round(fix_rate, 1)} "
        f"steps/s (the line cost {overhead and round(overhead, 2)} s of the run); the main thread ran {main_run} s, "
        f"waited for a CPU {main_wait} s; "
        + (f"a step's kernels take {gpu_step_s * 1e3:.2f} ms of GPU time queued (GPU busy {gpu_busy / wall:.0%} of the "
           "run)." if gpu_busy is not None else "no GPU timings (no CUDA)."))
sc.write_truth(baseline=(b0, b1), window=None, ratio_spans=((b0, mid), (mid, b1)))
