"""natural_pk_sampler_label_scan (natural, nothing staged): a person re-identification model trained with the usual
"P x K" batches (P identities, K images of each, so that a batch-hard triplet loss finds positives and negatives in
every batch), its batch sampler written the way many metric-learning repositories write it: for each of the P
identities drawn, `idx = [i for i, y in enumerate(self.labels) if y == pid]` over the dataset's label list, then K of
them drawn with random.sample. Nothing caches the per-identity index lists, so every batch scans the 38,400-entry
Python list of labels 16 times (614,400 comparisons in Python). PyTorch's DataLoader always runs the sampler in the
main process, on the main thread, inside next(): after each batch it receives it asks the sampler for the next batch's
indices to hand to a worker. The four workers (DataLoader(num_workers=4, persistent_workers=True), no pin_memory) have
little to do (a random crop and a flip of a 3x128x64 uint8 image held in memory) and wait for indices; the main thread
is on its CPU, in next(), in the sampler. The model: a ResNet-18-style backbone (stem 3-64, stages 64-128-256-512, the
last of stride 1 as re-id baselines have it), a BNNeck and a 1,200-identity classifier; the loss a batch-hard triplet
loss (margin 0.3, on the GPU) plus label-smoothed cross-entropy; fp32 without TF32, cudnn.benchmark, Adam; the uint8
batch copied to the GPU (pageable, non_blocking) and normalised there; loss.item() each step. The sampler is infinite
in practice (2,000 batches an "epoch", iteration-based as re-id frameworks count them). The main process and its
workers on CPUs 2-5; no threads of the job's own, no children but the workers (started before the measured run), no
IO, no lock, no sleep. 20 s (smaller with --device cpu: 9,600 records of 3x64x32, P 8, a narrower net).

The script measures itself: the steps per second; the main thread's time in next() on the loader (`wait_s`, its CPU
clock in it `wait_cpu_s`, the rest `wait_off_cpu_s`), within it in the sampler's body between two batches
(`sampler_s`, its CPU clock `sampler_cpu_s`, `sampler_batches`), copying the batch to the GPU (`h2d_s`), queueing the
forward and the optimiser step (`step_s`), in loss.backward() (`backward_s`, its wait on PyTorch's autograd thread)
and in loss.item() (`item_s`); for each worker (truth `workers`: pid, tids, comm) the samples it made, its time in
__getitem__ and its time on a CPU and waiting for one (schedstat); before the run, the same loop with the sampler's
per-identity index lists built once in __init__ (the fix), so that what the scan costs the run is known
(`sampler_overhead_s`: the run's wall time beyond its steps at that rate); the main thread's and the autograd
thread's time on a CPU and waiting for one over the run (schedstat); the process's minor page faults and the device
allocator's cudaMalloc calls; and a step's GPU time queued (common.gpu_seconds_queued: a batch already on the GPU,
normalised, forward, loss, backward, Adam, nothing read back), so that the GPU's busy share is known. Truth `autograd`
names PyTorch's autograd thread, `workers` the workers, `sampler` the sampler's class and function."""

import multiprocessing
import os
import random
import resource
import threading
import time

from common import Scenario, comm_of, gpu_seconds_queued, tids_of

sc = Scenario("natural_pk_sampler_label_scan", "natural", "a re-id ResNet trained on P x K batches whose batch "
              "sampler scans the 38,400-entry Python label list once per identity drawn, 16 times a batch, on the "
              "main thread inside next(), while 4 DataLoader workers wait for indices, 20 s, nothing staged",
              job_cpus=[2, 3, 4, 5], control=True)
import numpy as np  # noqa: E402
import torch  # noqa: E402

nn = torch.nn
F = nn.functional
PID, MAIN = os.getpid(), threading.get_native_id()
dev = torch.device(sc.device)
if sc.cuda:
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cudnn.benchmark = True
IDS, PER_ID, H, W, P, K, WIDTHS = ((1200, 32, 128, 64, 16, 8, (64, 128, 256, 512)) if sc.cuda
                                   else (300, 32, 64, 32, 8, 4, (16, 32, 64, 64)))
N, BATCH, PAD, WORKERS, EPOCH_BATCHES = IDS * PER_ID, P * K, 8, 4, 2000
NSTAT = 2  # per worker: samples, __getitem__ wall
STATS = multiprocessing.RawArray("d", NSTAT * WORKERS)  # shared with the forked workers
KEYS = ("wait_s", "wait_cpu_s", "sampler_s", "sampler_cpu_s", "h2d_s", "step_s", "backward_s", "item_s")
own = {"steps": 0, "sampler_batches": 0, **dict.fromkeys(KEYS, 0.0), "running_loss": 0.0}


def make_data() -> tuple[np.ndarray, list[int]]:
    """Every identity's appearance (a padded 3x(H+2*PAD)x(W+2*PAD) uint8 image: smooth colours and noise) and the
    dataset's label list as a Python list, in the shuffled order a crawled dataset's file list has."""
    rng = np.random.default_rng(0)
    low = rng.integers(0, 256, (IDS, 3, (H + 2 * PAD) // 8, (W + 2 * PAD) // 8)).astype(np.float32)
    looks = np.repeat(np.repeat(low, 8, 2), 8, 3)
    looks += 10 * rng.standard_normal(looks.shape, dtype=np.float32)
    labels = np.repeat(np.arange(IDS), PER_ID)
    rng.shuffle(labels)
    return np.clip(looks, 0, 255).astype(np.uint8), [int(y) for y in labels]


class PersonCrops(torch.utils.data.Dataset):
    """Record i: a random crop and flip of its identity's image, and its identity."""

    def __init__(self, looks: np.ndarray, labels: list[int]) -> None:
        self.looks, self.labels = looks, labels

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int):
        t0 = time.perf_counter()
        w = torch.utils.data.get_worker_info()
        wid = w.id if w is not None else 0
        rng = np.random.default_rng()
        y = self.labels[i]
        y0, x0 = rng.integers(0, 2 * PAD + 1, 2)
        img = self.looks[y, :, y0:y0 + H, x0:x0 + W]
        if rng.random() < 0.5:
            img = img[:, :, ::-1]
        out = torch.from_numpy(np.ascontiguousarray(img))
        STATS[NSTAT * wid] += 1
        STATS[NSTAT * wid + 1] += time.perf_counter() - t0
        return out, y


class PKSampler(torch.utils.data.Sampler):
    """P identities, K records of each, a batch at a time. As written: each identity's records found by a scan of the
    label list, every batch; `cached` (the fix): the per-identity index lists built once."""

    def __init__(self, labels: list[int], p: int, k: int, batches: int, cached: bool = False) -> None:
        self.labels, self.p, self.k, self.batches = labels, p, k, batches
        self.pids = sorted(set(labels))
        self.index: dict[int, list[int]] | None = None
        if cached:
            self.index = {pid: [] for pid in self.pids}
            for i, y in enumerate(labels):
                self.index[y].append(i)

    def __len__(self) -> int:
        return self.batches

    def __iter__(self):
        for _ in range(self.batches):
            t0, c0 = time.perf_counter(), time.thread_time()
            batch = []
            for pid in random.sample(self.pids, self.p):
                if self.index is not None:
                    idx = self.index[pid]
                else:
                    idx = [i for i, y in enumerate(self.labels) if y == pid]
                batch.extend(random.sample(idx, self.k) if len(idx) >= self.k else random.choices(idx, k=self.k))
            own["sampler_s"] += time.perf_counter() - t0
            own["sampler_cpu_s"] += time.thread_time() - c0
            own["sampler_batches"] += 1
            yield batch


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


class ReID(nn.Module):
    """A ResNet-18-style backbone (last stage stride 1), global average pooling, a BNNeck and an identity classifier."""

    def __init__(self) -> None:
        super().__init__()
        layers = [nn.Conv2d(3, WIDTHS[0], 7, 2, 3, bias=False), nn.BatchNorm2d(WIDTHS[0]), nn.ReLU(),
                  nn.MaxPool2d(3, 2, 1)]
        cin = WIDTHS[0]
        for k, cout in enumerate(WIDTHS):
            stride = 1 if k in (0, len(WIDTHS) - 1) else 2
            layers += [Block(cin, cout, stride), Block(cout, cout, 1)]
            cin = cout
        self.backbone = nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten())
        self.neck = nn.BatchNorm1d(cin)
        self.neck.bias.requires_grad_(False)
        self.classifier = nn.Linear(cin, IDS, bias=False)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        f = self.backbone(x)
        return f, self.classifier(self.neck(f))


def batch_hard_triplet(f: torch.Tensor, y: torch.Tensor, margin: float = 0.3) -> torch.Tensor:
    sq = (f * f).sum(1)
    d = (sq[:, None] + sq[None, :] - 2 * f @ f.T).clamp_min(1e-12).sqrt()
    same = (y[:, None] == y[None, :]).float()
    hardest_pos = (d * same).max(1).values
    hardest_neg = (d + 1e6 * same).min(1).values
    return F.relu(hardest_pos - hardest_neg + margin).mean()


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


looks, labels = make_data()
dataset = PersonCrops(looks, labels)
torch.manual_seed(0)
random.seed(0)
model = ReID().to(dev)
opt = torch.optim.Adam(model.parameters(), lr=3.5e-4, weight_decay=5e-4)
mean = torch.tensor([0.485, 0.456, 0.406], device=dev).view(1, 3, 1, 1) * 255
std = torch.tensor([0.229, 0.224, 0.225], device=dev).view(1, 3, 1, 1) * 255
state: dict = {"it": None, "loader": None}


def make_loader(cached: bool) -> None:
    loader = torch.utils.data.DataLoader(dataset, batch_sampler=PKSampler(labels, P, K, EPOCH_BATCHES, cached),
                                         num_workers=WORKERS, persistent_workers=True)
    state["loader"], state["it"] = loader, iter(loader)


def train(img: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    t0 = time.perf_counter()
    x = (img.float() - mean) / std
    f, logits = model(x)
    loss = batch_hard_triplet(f, y) + F.cross_entropy(logits, y, label_smoothing=0.1)
    opt.zero_grad(set_to_none=True)
    t1 = time.perf_counter()
    loss.backward()
    t2 = time.perf_counter()
    opt.step()
    own["backward_s"] += t2 - t1
    own["step_s"] += (t1 - t0) + (time.perf_counter() - t2)
    return loss


def next_batch():
    try:
        return next(state["it"])
    except StopIteration:  # a new "epoch" (the workers stay)
        state["it"] = iter(state["loader"])
        return next(state["it"])


def step() -> None:
    t0, c0 = time.perf_counter(), time.thread_time()
    img, y = next_batch()
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
        own[k] = 0 if k in ("steps", "sampler_batches") else 0.0


def timed(seconds: float) -> tuple[int, float]:
    n0, t = own["steps"], time.perf_counter()
    end = t + seconds
    while time.perf_counter() < end:
        step()
    sync()
    return own["steps"] - n0, time.perf_counter() - t


try:
    # The fix first: the per-identity index lists built once.
    make_loader(cached=True)
    for _ in range(20):  # warm-up: the workers started, cuDNN's algorithms chosen, the allocator, the autograd thread
        step()
    sync()
    gpu_step_s = None
    if sc.cuda:
        fixed = tuple(t.to(dev) for t in next_batch())
        runs = sorted(r for r in (gpu_seconds_queued(torch, lambda _: train(*fixed)) for _ in range(5))
                      if r is not None)
        gpu_step_s = runs[len(runs) // 2] if runs else None
    reset()
    fix_steps, fix_wall = timed(3.0 * sc.scale)
    fix_wait_share = own["wait_s"] / fix_wall if fix_wall > 0 else None
    fix_sampler_ms = own["sampler_s"] / max(own["sampler_batches"], 1) * 1e3
    state["it"]._shutdown_workers()
    # As the script has it: a scan of the label list per identity drawn.
    make_loader(cached=False)
    timed(1.5 * sc.scale)  # the new workers started and primed, the spin kernels well before the run
    wpids = sorted(p.pid for p in multiprocessing.active_children())
    ag = autograd_thread()
    reset()
    s0 = list(STATS)
    w0 = {p: schedstat(p, p) for p in wpids}
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
    main1 = schedstat(PID, MAIN)
    ag1 = schedstat(PID, ag["tid"]) if ag else None
    f1 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    m1 = int(torch.cuda.memory_stats().get("segment.all.allocated", 0)) if sc.cuda else 0
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
    per_worker.append({"worker_id": w_id, "samples": int(d[0]), "getitem_s": round(d[1], 4)})
for row in workers:
    a, z = w0.get(row["pid"]), w1.get(row["pid"])
    row.update({"run_s": delta(a, z, 0), "cpu_wait_s": delta(a, z, 1)})
    row["cpu_share"], row["cpu_wait_share"] = share(row["run_s"]), share(row["cpu_wait_s"])
nw = max(len(workers), 1)
getitem_s = sum(r["getitem_s"] for r in per_worker)
w_shares = [r["cpu_share"] for r in workers if r["cpu_share"] is not None]
fix_rate = fix_steps / fix_wall if fix_wall > 0 else None
at_fix = n / fix_rate if fix_rate else None
overhead = max(0.0, wall - at_fix) if at_fix is not None else None
main_run, main_wait = delta(main0, main1, 0), delta(main0, main1, 1)
ag_run, ag_wait = delta(ag0, ag1, 0), delta(ag0, ag1, 1)
gpu_busy = n * gpu_step_s if gpu_step_s is not None else None
wait_off = max(0.0, own["wait_s"] - own["wait_cpu_s"])
sc.extra["workers"] = workers
sc.extra["per_worker"] = per_worker
sc.extra["autograd"] = ag
sc.extra["sampler"] = {"class": "PKSampler", "function": "PKSampler.__iter__", "file": os.path.basename(__file__),
                       "what": "a list comprehension over the label list per identity drawn: "
                               "[i for i, y in enumerate(self.labels) if y == pid]",
                       "labels": N, "identities_per_batch": P, "comparisons_per_batch": N * P}
sc.extra["self"] = {**{k: round(v, 4) if isinstance(v, float) else v for k, v in own.items()},
                    "wall_s": round(wall, 4), "steps_per_s": round(n / wall, 2),
                    "step_ms_mean": round(wall / max(n, 1) * 1e3, 3),
                    "wait_share": share(own["wait_s"]), "wait_cpu_share": share(own["wait_cpu_s"]),
                    "wait_off_cpu_s": round(wait_off, 4), "wait_off_cpu_share": share(wait_off),
                    "sampler_share": share(own["sampler_s"]), "sampler_cpu_share": share(own["sampler_cpu_s"]),
                    "sampler_ms_per_batch": round(own["sampler_s"] / max(own["sampler_batches"], 1) * 1e3, 3),
                    "h2d_share": share(own["h2d_s"]), "step_share": share(own["step_s"]),
                    "backward_share": share(own["backward_s"]), "item_share": share(own["item_s"]),
                    "samples": int(sum(r["samples"] for r in per_worker)), "getitem_s": round(getitem_s, 4),
                    # the workers' time making samples, as a share of their time (workers x run)
                    "workers_busy_share": round(getitem_s / (nw * wall), 4),
                    "workers_cpu_share_mean": round(sum(w_shares) / len(w_shares), 4) if w_shares else None,
                    "workers_cpu_share_max": max(w_shares, default=None),
                    "workers_cpu_wait_max_share": max((r["cpu_wait_share"] or 0.0 for r in workers), default=None),
                    "fix_steps": fix_steps, "fix_wall_s": round(fix_wall, 4),
                    "fix_steps_per_s": round(fix_rate, 2) if fix_rate else None,
                    "fix_wait_share": r4(fix_wait_share), "fix_sampler_ms_per_batch": round(fix_sampler_ms, 4),
                    "at_fix_rate_s": r4(at_fix), "sampler_overhead_s": r4(overhead),
                    "sampler_overhead_share": share(overhead),
                    "main_run_s": main_run, "main_cpu_share": share(main_run),
                    "main_cpu_wait_s": main_wait, "main_cpu_wait_share": share(main_wait),
                    "autograd_run_s": ag_run, "autograd_cpu_share": share(ag_run),
                    "autograd_cpu_wait_s": ag_wait, "autograd_cpu_wait_share": share(ag_wait),
                    "minor_faults_per_s": round((f1 - f0) / wall, 1), "cuda_mallocs_per_s": round((m1 - m0) / wall, 3),
                    "gpu_step_ms": round(gpu_step_s * 1e3, 4) if gpu_step_s is not None else None,
                    "gpu_busy_s": r4(gpu_busy), "gpu_busy_share": share(gpu_busy),
                    "batch": BATCH, "p": P, "k": K, "records": N, "identities": IDS, "image": [3, H, W],
                    "num_workers": WORKERS}
if not sc.cuda:
    sc.note("on the CPU: no autograd thread (the backward runs on the main thread), no GPU timings, no allocator "
            "counters.")
sc.note(f"natural: measured by the script: {n} steps ({n / wall:.1f}/s) in {wall:.2f} s: {own['wait_s']:.2f} s in "
        f"next() ({own['wait_cpu_s']:.2f} s of it on the main thread's CPU), {own['sampler_s']:.2f} s of it in the "
        f"sampler's scans ({own['sampler_s'] / max(own['sampler_batches'], 1) * 1e3:.1f} ms a batch); the "
        f"{len(workers)} workers spent {getitem_s:.2f} s making samples; with the index lists built once "
        f"{fix_rate and round(fix_rate, 1)} steps/s (the scans cost {overhead and round(overhead, 2)} s of the run); "
        f"the main thread ran {main_run} s, waited for a CPU {main_wait} s; "
        + (f"a step's kernels take {gpu_step_s * 1e3:.2f} ms of GPU time queued (GPU busy {gpu_busy / wall:.0%} of the "
           "run)." if gpu_busy is not None else "no GPU timings (no CUDA)."))
sc.write_truth(baseline=(b0, b1), window=None, ratio_spans=((b0, mid), (mid, b1)))
