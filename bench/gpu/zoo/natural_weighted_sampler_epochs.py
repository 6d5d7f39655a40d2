"""natural_weighted_sampler_epochs (natural, nothing staged): a click-through-rate model (DLRM-style: 13 dense features
through a bottom MLP, 8 categorical features through embedding tables, their pairwise dot products, a top MLP) trained
on 4,000,000 logged impressions held in memory (numpy arrays in the Dataset, fetched a batch at a time through
Dataset.__getitems__), 3% of them clicks. To balance the classes the loader samples with PyTorch's own
torch.utils.data.WeightedRandomSampler(weights, num_samples=len(weights), replacement=False) over the 4,000,000
per-impression weights ("no impression twice in an epoch"), and the loop counts "epochs" of 200 steps (validation and
a checkpoint each epoch in a real job; here only the count): `for step, batch in enumerate(loader): ... if step + 1 ==
steps_per_epoch: break`. Each epoch's new pass over the loader (iter(loader), persistent workers: the same iterator
reset) asks the sampler for its first index, and WeightedRandomSampler.__iter__ draws ALL 4,000,000 at once with
torch.multinomial(..., replacement=False) (a top-k of 4,000,000 keys: a sort in native code on the main thread) and
turns them into a Python list (.tolist()), of which the epoch uses 1,638,400. Every epoch starts with the main thread
on its CPU inside PyTorch's native code for most of a second while the four workers (DataLoader(num_workers=4,
persistent_workers=True, batch_size=8192), a gather of 8,192 rows each batch) and the GPU wait. The model: tables of
200k, 100k, 50k, 20k, 10k, 5k, 1k and 100 rows of 64, bottom MLP 13-512-256-64, top MLP 100-1024-1024-1024-512-256-1;
fp32 without TF32, fused Adam, BCE with logits, the batch copied to the GPU (pageable, non_blocking), loss.item() each
step. The main process and its workers on CPUs 2-7 (each worker a CPU of its own); no threads of the job's own, no
children but the workers (started before the measured run), no IO, no lock, no sleep; every batch has the same shape.
20 s (smaller with --device cpu: 200,000 impressions, batch 1,024, 40 steps an epoch, narrower nets).

The script measures itself: the steps per second; the main thread's time in iter(loader) at each epoch's start
(`iter_s`, its CPU clock `iter_cpu_s`), in next() on the loader (`wait_s`, its CPU clock `wait_cpu_s`; the first next()
of each epoch apart too, `first_next_s`), copying the batch to the GPU (`h2d_s`), queueing the forward and the
optimiser step (`step_s`), in loss.backward() (`backward_s`, its wait on PyTorch's autograd thread) and in loss.item()
(`item_s`); each epoch start's span and times (truth `epochs`, `epochs_ns`); before the run, the sampler's draw alone
(torch.multinomial over the weights, and its .tolist(), wall and CPU, the faster of two); for each worker (truth
`workers`: pid, tids, comm) the batches it made and its time making them, its time on a CPU and waiting for one
(schedstat); before the run, the same loop with every epoch's order drawn ahead of it (the same weighted draws, made
once before the loop and sliced an epoch at a time: the fix), so that what the per-epoch draws cost the run is known
(`draw_overhead_s`: the run's wall time beyond its steps at that rate); the main thread's and the autograd thread's
time on a CPU and waiting for one over the run (schedstat); the process's minor page faults and the device allocator's
cudaMalloc calls; and a step's GPU time queued (common.gpu_seconds_queued: a batch already on the GPU, forward, loss,
backward, Adam, nothing read back), so that the GPU's busy share is known. Truth `autograd` names PyTorch's autograd
thread, `workers` the workers, `sampler` the sampler's class, function and what it draws."""

import multiprocessing
import os
import resource
import threading
import time

from common import Scenario, comm_of, gpu_seconds_queued, now, tids_of

sc = Scenario("natural_weighted_sampler_epochs", "natural", "a DLRM-style CTR model whose WeightedRandomSampler "
              "(replacement=False, num_samples=4,000,000) draws every impression's place with torch.multinomial on "
              "the main thread at each 200-step epoch's iter(loader) while 4 DataLoader workers and the GPU wait, "
              "20 s, nothing staged", job_cpus=[2, 3, 4, 5, 6, 7], control=True)
import numpy as np  # noqa: E402
import torch  # noqa: E402

nn = torch.nn
F = nn.functional
PID, MAIN = os.getpid(), threading.get_native_id()
dev = torch.device(sc.device)
if sc.cuda:
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
N, BATCH, STEPS_PER_EPOCH, DIM, TABLES, BOTTOM, TOP = (
    (4_000_000, 8192, 200, 64, (200_000, 100_000, 50_000, 20_000, 10_000, 5_000, 1_000, 100), (512, 256),
     (1024, 1024, 1024, 512, 256)) if sc.cuda else
    (200_000, 1024, 40, 16, (20_000, 10_000, 5_000, 2_000, 1_000, 500, 100, 10), (64, 32), (128, 64)))
DENSE, WORKERS, CLICK_RATE = 13, 4, 0.03
NSTAT = 2  # per worker: batches, __getitems__ wall
STATS = multiprocessing.RawArray("d", NSTAT * WORKERS)  # shared with the forked workers
KEYS = ("wait_s", "wait_cpu_s", "iter_s", "iter_cpu_s", "first_next_s", "first_next_cpu_s", "h2d_s", "step_s",
        "backward_s", "item_s")
own = {"steps": 0, "epochs": 0, **dict.fromkeys(KEYS, 0.0), "running_loss": 0.0}
epochs: list[dict] = []


def make_logs() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The impressions: dense features (log-scaled counts, standardised), skewed categorical ids, and a click label
    that depends on both (the top CLICK_RATE of a noisy score)."""
    rng = np.random.default_rng(0)
    dense = rng.standard_normal((N, DENSE), dtype=np.float32)
    cats = np.empty((N, len(TABLES)), dtype=np.int64)
    for k, size in enumerate(TABLES):
        cats[:, k] = (size * rng.random(N, dtype=np.float32) ** 3).astype(np.int64) % size
    score = dense[:, :4] @ np.array([0.8, -0.5, 0.3, 0.2], dtype=np.float32)
    score += 0.3 * ((cats[:, 0] % 7) - 3) + 0.2 * ((cats[:, 2] % 5) - 2) + rng.standard_normal(N, dtype=np.float32)
    clicks = (score > np.quantile(score, 1 - CLICK_RATE)).astype(np.float32)
    return dense, cats, clicks


class ClickLogs(torch.utils.data.Dataset):
    """Impression i: its dense features, its categorical ids, its click. The DataLoader's workers fetch a batch at a
    time through __getitems__ (one numpy gather a batch)."""

    def __init__(self, dense: np.ndarray, cats: np.ndarray, clicks: np.ndarray) -> None:
        self.dense, self.cats, self.clicks = dense, cats, clicks

    def __len__(self) -> int:
        return len(self.clicks)

    def __getitems__(self, idx: list[int]):
        t0 = time.perf_counter()
        w = torch.utils.data.get_worker_info()
        wid = w.id if w is not None else 0
        ix = np.asarray(idx, dtype=np.int64)
        out = (torch.from_numpy(self.dense[ix]), torch.from_numpy(self.cats[ix]), torch.from_numpy(self.clicks[ix]))
        STATS[NSTAT * wid] += 1
        STATS[NSTAT * wid + 1] += time.perf_counter() - t0
        return out

    def __getitem__(self, i: int):
        return self.__getitems__([i])


def as_batch(batch):
    """The collate function: __getitems__ already made the batch."""
    return batch


class EpochOrders(torch.utils.data.Sampler):
    """The fix: the same weighted draws (torch.multinomial without replacement over all the weights), made once before
    the loop; each pass over the loader takes the next epoch's slice of them."""

    def __init__(self, orders: list[torch.Tensor], per_epoch: int) -> None:
        self.slices = [o[k:k + per_epoch] for o in orders for k in range(0, len(o) - per_epoch + 1, per_epoch)]
        self.per_epoch, self.k = per_epoch, 0

    def __len__(self) -> int:
        return self.per_epoch

    def __iter__(self):
        s = self.slices[self.k % len(self.slices)]
        self.k += 1
        yield from s.tolist()


def mlp(sizes: tuple[int, ...], last: bool = True) -> nn.Sequential:
    layers: list[nn.Module] = []
    for a, b in zip(sizes, sizes[1:]):
        layers += [nn.Linear(a, b), nn.ReLU()]
    return nn.Sequential(*(layers if last else layers[:-1]))


class DLRM(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.tables = nn.ModuleList(nn.Embedding(n, DIM) for n in TABLES)
        self.bottom = mlp((DENSE, *BOTTOM, DIM))
        nf = len(TABLES) + 1
        i, j = torch.triu_indices(nf, nf, offset=1)
        self.register_buffer("ti", i, persistent=False)
        self.register_buffer("tj", j, persistent=False)
        self.top = mlp((DIM + nf * (nf - 1) // 2, *TOP, 1), last=False)

    def forward(self, dense: torch.Tensor, cats: torch.Tensor) -> torch.Tensor:
        x = self.bottom(dense)
        feats = torch.stack([x] + [t(cats[:, k]) for k, t in enumerate(self.tables)], dim=1)
        inter = torch.bmm(feats, feats.transpose(1, 2))[:, self.ti, self.tj]
        return self.top(torch.cat([x, inter], dim=1)).squeeze(1)


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


t_make = time.perf_counter()
dense, cats, clicks = make_logs()
make_s = time.perf_counter() - t_make
pos = float(clicks.mean())
weights = np.where(clicks > 0, 0.5 / pos, 0.5 / (1 - pos))  # float64: each class half of the draws
dataset = ClickLogs(dense, cats, clicks)
# The sampler's draw alone, twice (its first index: torch.multinomial over every weight, then the list); the draws
# are kept as the fix's orders.
wt = torch.as_tensor(weights, dtype=torch.double)
orders, draws = [], []
for _ in range(2):
    t0, c0 = time.perf_counter(), time.thread_time()
    order = torch.multinomial(wt, N, False)
    t1, c1 = time.perf_counter(), time.thread_time()
    as_list = order.tolist()
    t2, c2 = time.perf_counter(), time.thread_time()
    del as_list
    orders.append(order)
    draws.append((t1 - t0, c1 - c0, t2 - t1, c2 - c1))
draw_best = min(draws, key=lambda d: d[0] + d[2])
torch.manual_seed(0)
model = DLRM().to(dev)
opt = torch.optim.Adam(model.parameters(), lr=1e-3, fused=sc.cuda or None)
state: dict = {"it": None, "loader": None, "left": 0, "on": False}


def make_loader(fix: bool) -> None:
    sampler = (EpochOrders(orders, STEPS_PER_EPOCH * BATCH) if fix
               else torch.utils.data.WeightedRandomSampler(weights, num_samples=len(weights), replacement=False))
    state["loader"] = torch.utils.data.DataLoader(dataset, batch_size=BATCH, sampler=sampler, num_workers=WORKERS,
                                                  persistent_workers=True, drop_last=True, collate_fn=as_batch)
    state["it"], state["left"] = None, 0


def train(x: torch.Tensor, c: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    t0 = time.perf_counter()
    loss = F.binary_cross_entropy_with_logits(model(x, c), y)
    opt.zero_grad(set_to_none=True)
    t1 = time.perf_counter()
    loss.backward()
    t2 = time.perf_counter()
    opt.step()
    own["backward_s"] += t2 - t1
    own["step_s"] += (t1 - t0) + (time.perf_counter() - t2)
    return loss


def new_epoch():
    """A new pass over the loader (the persistent workers stay; the sampler's iterator is made anew) and its first
    batch."""
    t0, c0, n0 = time.perf_counter(), time.thread_time(), now()
    state["it"] = iter(state["loader"])
    t1, c1 = time.perf_counter(), time.thread_time()
    batch = next(state["it"])
    t2, c2 = time.perf_counter(), time.thread_time()
    own["epochs"] += 1
    own["iter_s"] += t1 - t0
    own["iter_cpu_s"] += c1 - c0
    own["first_next_s"] += t2 - t1
    own["first_next_cpu_s"] += c2 - c1
    own["wait_s"] += t2 - t1
    own["wait_cpu_s"] += c2 - c1
    state["left"] = STEPS_PER_EPOCH - 1
    if state["on"]:
        epochs.append({"start_ns": n0, "end_ns": now(), "iter_ms": round((t1 - t0) * 1e3, 3),
                       "iter_cpu_ms": round((c1 - c0) * 1e3, 3), "first_next_ms": round((t2 - t1) * 1e3, 3)})
    return batch


def next_batch():
    if state["left"] <= 0:
        return new_epoch()
    t0, c0 = time.perf_counter(), time.thread_time()
    try:
        batch = next(state["it"])
    except StopIteration:  # not expected: the sampler holds more than an epoch's batches
        return new_epoch()
    own["wait_s"] += time.perf_counter() - t0
    own["wait_cpu_s"] += time.thread_time() - c0
    state["left"] -= 1
    return batch


def step() -> None:
    x, c, y = next_batch()
    t1 = time.perf_counter()
    x, c, y = x.to(dev, non_blocking=True), c.to(dev, non_blocking=True), y.to(dev, non_blocking=True)
    t2 = time.perf_counter()
    loss = train(x, c, y)
    t3 = time.perf_counter()
    own["running_loss"] += loss.item()
    own["item_s"] += time.perf_counter() - t3
    own["h2d_s"] += t2 - t1
    own["steps"] += 1


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


try:
    # The fix first: every epoch's order drawn before the loop.
    make_loader(fix=True)
    for _ in range(STEPS_PER_EPOCH + 10):  # warm-up: the workers, an epoch's turn, cuBLAS, the allocator, autograd
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
    fix_epochs, fix_iter_s = own["epochs"], own["iter_s"]
    state["it"]._shutdown_workers()
    # As the script has it: WeightedRandomSampler over all the weights, drawn anew at every epoch's iter(loader).
    make_loader(fix=False)
    e0 = own["epochs"]
    timed(1.0 * sc.scale)  # the new workers started, the spin kernels well before the run
    while own["epochs"] < e0 + 2:  # and an epoch's turn (the iterator reset, the sampler's draw made anew)
        step()
    sync()
    wpids = sorted(p.pid for p in multiprocessing.active_children())
    ag = autograd_thread()
    reset()
    state["on"] = True
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
    state["on"] = False
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
    per_worker.append({"worker_id": w_id, "batches": int(d[0]), "getitems_s": round(d[1], 4)})
for row in workers:
    a, z = w0.get(row["pid"]), w1.get(row["pid"])
    row.update({"run_s": delta(a, z, 0), "cpu_wait_s": delta(a, z, 1)})
    row["cpu_share"], row["cpu_wait_share"] = share(row["run_s"]), share(row["cpu_wait_s"])
nw = max(len(workers), 1)
getitems_s = sum(r["getitems_s"] for r in per_worker)
w_shares = [r["cpu_share"] for r in workers if r["cpu_share"] is not None]
fix_rate = fix_steps / fix_wall if fix_wall > 0 else None
at_fix = n / fix_rate if fix_rate else None
overhead = max(0.0, wall - at_fix) if at_fix is not None else None
main_run, main_wait = delta(main0, main1, 0), delta(main0, main1, 1)
ag_run, ag_wait = delta(ag0, ag1, 0), delta(ag0, ag1, 1)
gpu_busy = n * gpu_step_s if gpu_step_s is not None else None
in_run = [e for e in epochs if b0 <= e["start_ns"] < b1]
start_s = own["iter_s"] + own["first_next_s"]
start_cpu_s = own["iter_cpu_s"] + own["first_next_cpu_s"]
loader_s = own["iter_s"] + own["wait_s"]
loader_off = max(0.0, loader_s - own["iter_cpu_s"] - own["wait_cpu_s"])
stalls = [e["iter_ms"] + e["first_next_ms"] for e in in_run]
sc.extra["workers"] = workers
sc.extra["per_worker"] = per_worker
sc.extra["autograd"] = ag
sc.extra["epochs"] = in_run
sc.extra["epochs_ns"] = [[e["start_ns"], e["end_ns"]] for e in in_run]
sc.extra["sampler"] = {"class": "WeightedRandomSampler", "function": "WeightedRandomSampler.__iter__",
                       "file": "torch/utils/data/sampler.py",
                       "what": "torch.multinomial(self.weights, self.num_samples, replacement=False) over every "
                               "weight, then .tolist(), at each epoch's iter(loader), on the main thread",
                       "weights": N, "num_samples": N, "used_per_epoch": STEPS_PER_EPOCH * BATCH,
                       "draw_multinomial_ms": round(draw_best[0] * 1e3, 3),
                       "draw_multinomial_cpu_ms": round(draw_best[1] * 1e3, 3),
                       "draw_tolist_ms": round(draw_best[2] * 1e3, 3),
                       "draw_tolist_cpu_ms": round(draw_best[3] * 1e3, 3),
                       "make_logs_s": round(make_s, 3)}
sc.extra["self"] = {**{k: round(v, 4) if isinstance(v, float) else v for k, v in own.items()},
                    "wall_s": round(wall, 4), "steps_per_s": round(n / wall, 2),
                    "step_ms_mean": round(wall / max(n, 1) * 1e3, 3),
                    "wait_share": share(own["wait_s"]), "wait_cpu_share": share(own["wait_cpu_s"]),
                    "iter_share": share(own["iter_s"]), "iter_cpu_share": share(own["iter_cpu_s"]),
                    # the epochs' starts: iter(loader) and the first next(), the sampler's draw within
                    "epoch_start_s": round(start_s, 4), "epoch_start_cpu_s": round(start_cpu_s, 4),
                    "epoch_start_share": share(start_s), "epoch_start_cpu_share": share(start_cpu_s),
                    "epochs_in_run": len(in_run),
                    "epoch_stall_ms_mean": round(sum(stalls) / len(stalls), 3) if stalls else None,
                    "epoch_stall_ms_min": round(min(stalls), 3) if stalls else None,
                    # the main thread in the loader (iter() and next()), and the part of it off its CPU
                    "loader_s": round(loader_s, 4), "loader_share": share(loader_s),
                    "loader_off_cpu_s": round(loader_off, 4), "loader_off_cpu_share": share(loader_off),
                    "h2d_share": share(own["h2d_s"]), "step_share": share(own["step_s"]),
                    "backward_share": share(own["backward_s"]), "item_share": share(own["item_s"]),
                    "batches": int(sum(r["batches"] for r in per_worker)), "getitems_s": round(getitems_s, 4),
                    "workers_busy_share": round(getitems_s / (nw * wall), 4),
                    "workers_cpu_share_mean": round(sum(w_shares) / len(w_shares), 4) if w_shares else None,
                    "workers_cpu_share_max": max(w_shares, default=None),
                    "workers_cpu_wait_max_share": max((r["cpu_wait_share"] or 0.0 for r in workers), default=None),
                    "fix_steps": fix_steps, "fix_wall_s": round(fix_wall, 4), "fix_epochs": fix_epochs,
                    "fix_iter_s": round(fix_iter_s, 4),
                    "fix_steps_per_s": round(fix_rate, 2) if fix_rate else None,
                    "at_fix_rate_s": r4(at_fix), "draw_overhead_s": r4(overhead),
                    "draw_overhead_share": share(overhead),
                    "main_run_s": main_run, "main_cpu_share": share(main_run),
                    "main_cpu_wait_s": main_wait, "main_cpu_wait_share": share(main_wait),
                    "autograd_run_s": ag_run, "autograd_cpu_share": share(ag_run),
                    "autograd_cpu_wait_s": ag_wait, "autograd_cpu_wait_share": share(ag_wait),
                    "minor_faults_per_s": round((f1 - f0) / wall, 1), "cuda_mallocs_per_s": round((m1 - m0) / wall, 3),
                    "gpu_step_ms": round(gpu_step_s * 1e3, 4) if gpu_step_s is not None else None,
                    "gpu_busy_s": r4(gpu_busy), "gpu_busy_share": share(gpu_busy),
                    "batch": BATCH, "steps_per_epoch": STEPS_PER_EPOCH, "impressions": N, "num_workers": WORKERS}
if not sc.cuda:
    sc.note("on the CPU: no autograd thread (the backward runs on the main thread), no GPU timings, no allocator "
            "counters.")
sc.note(f"natural: measured by the script: {n} steps ({n / wall:.1f}/s) in {wall:.2f} s, {len(in_run)} epochs "
        f"started: {own['iter_s']:.2f} s in iter(loader) ({own['iter_cpu_s']:.2f} s of it on the main thread's CPU), "
        f"{own['wait_s']:.2f} s in next(); the sampler's draw alone {draw_best[0] * 1e3:.0f} ms (multinomial) + "
        f"{draw_best[2] * 1e3:.0f} ms (.tolist()); the {len(workers)} workers spent {getitems_s:.2f} s making batches; "
        f"with the orders drawn ahead {fix_rate and round(fix_rate, 1)} steps/s (the draws cost "
        f"{overhead and round(overhead, 2)} s of the run); the main thread ran {main_run} s, waited for a CPU "
        f"{main_wait} s; "
        + (f"a step's kernels take {gpu_step_s * 1e3:.2f} ms of GPU time queued (GPU busy {gpu_busy / wall:.0%} of the "
           "run)." if gpu_busy is not None else "no GPU timings (no CUDA)."))
sc.write_truth(baseline=(b0, b1), window=None, ratio_spans=((b0, mid), (mid, b1)))
