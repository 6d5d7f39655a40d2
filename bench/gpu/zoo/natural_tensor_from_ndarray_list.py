"""natural_tensor_from_ndarray_list (natural, nothing staged): a classifier head trained on precomputed image embeddings
(a linear-probe style job after a feature-extraction pass: CLIP-like 768-d float32 embeddings, L2-normalised, one
numpy array per record, as a pickle of the extraction's output leaves them: {"emb": ndarray, "label": int,
"image_id": str}, 32,768 records in memory), fed by a DataLoader with the default num_workers=0 ("the data is already
in memory") and a hand-written collate_fn that builds the batch with
`torch.tensor([r["emb"] for r in batch])`: PyTorch then reads the list of 256 arrays element by element as nested
Python sequences (196,608 numpy scalars) instead of copying one block; it warns once ("Creating a tensor from a list
of numpy.ndarrays is extremely slow. Please consider converting the list to a single numpy.ndarray with numpy.array()
before converting to a tensor."), the warning scrolls away with the rest of the start-up log. The conversion runs on
the main thread (num_workers=0: the loader's work is the main thread's) inside PyTorch's C++ tensor constructor, under
the GIL. The model: LayerNorm, 768-4096-4096-1000 with GELU and dropout (fp32 without TF32, fused AdamW, label
smoothing); the batch copied to the GPU (786 KB, pageable, non_blocking=True) each step, loss.item() each step (its one
wait for the GPU). One process on CPUs 2-3, no threads of its own, no workers, no children, no IO, no lock, no sleep;
every batch has the same shape. 20 s (smaller with --device cpu: 4,096 records of 128 values, batch 64, hidden 256).

The script measures itself: the steps per second; the main thread's time in next() on the loader (`next_s`, its CPU
clock `next_cpu_s`), within it in the collate function (`collate_s`) and, within that, in the conversion of the
embeddings (`convert_s`, its CPU clock `convert_cpu_s`); copying the batch to the GPU (`h2d_s`), queueing the forward
and the optimiser step (`step_s`), in loss.backward() (`backward_s`, its wait on PyTorch's autograd thread) and in
loss.item() (`item_s`); before the run, the same loop with the collate function stacking the arrays with np.stack and
wrapping them with torch.from_numpy (the fix), so that what the conversion costs the run is known
(`convert_overhead_s`: the run's wall time beyond its steps at that rate); the main thread's and the autograd thread's
time on a CPU and waiting for one over the run (schedstat); the process's minor page faults and the device
allocator's cudaMalloc calls; and a step's GPU time queued (common.gpu_seconds_queued: a batch already on the GPU,
forward, backward, AdamW, nothing read back), so that the GPU's busy share is known. Truth `autograd` names PyTorch's
autograd thread."""

import os
import resource
import threading
import time

from common import Scenario, comm_of, gpu_seconds_queued, tids_of

sc = Scenario("natural_tensor_from_ndarray_list", "natural", "a classifier head on precomputed 768-d embeddings whose "
              "collate_fn, on the main thread (num_workers=0), builds each batch with torch.tensor() over a list of "
              "256 numpy arrays, 20 s, nothing staged", job_cpus=[2, 3], control=True)
import numpy as np  # noqa: E402
import torch  # noqa: E402

nn = torch.nn
F = nn.functional
PID, MAIN = os.getpid(), threading.get_native_id()
dev = torch.device(sc.device)
if sc.cuda:
    torch.backends.cuda.matmul.allow_tf32 = False
N, DIM, BATCH, HIDDEN, CLASSES = (32768, 768, 256, 4096, 1000) if sc.cuda else (4096, 128, 64, 256, 100)
KEYS = ("next_s", "next_cpu_s", "collate_s", "convert_s", "convert_cpu_s", "h2d_s", "step_s", "backward_s", "item_s")
own = {"steps": 0, **dict.fromkeys(KEYS, 0.0), "running_loss": 0.0}
mode = {"fix": False}


def load_records() -> list[dict]:
    """The extraction pass's output as pickle.load returns it: a dict per image, its embedding an array of its own."""
    rng = np.random.default_rng(0)
    centers = rng.standard_normal((CLASSES, DIM), dtype=np.float32)
    labels = rng.integers(0, CLASSES, N)
    embs = centers[labels] + 2.0 * rng.standard_normal((N, DIM), dtype=np.float32)
    embs /= np.linalg.norm(embs, axis=1, keepdims=True)
    return [{"emb": embs[i].copy(), "label": int(labels[i]), "image_id": f"train/{i:08d}.jpg"} for i in range(N)]


class EmbeddingRecords(torch.utils.data.Dataset):
    def __init__(self, records: list[dict]) -> None:
        self.records = records

    def __len__(self) -> int:
        return len(self.records)

    def __getitem__(self, i: int) -> dict:
        return self.records[i]


def collate_records(batch: list[dict]) -> tuple[torch.Tensor, torch.Tensor]:
    """The job's collate_fn; with mode["fix"], the arrays stacked first (the fix)."""
    t0, c0 = time.perf_counter(), time.thread_time()
    if mode["fix"]:
        x = torch.from_numpy(np.stack([r["emb"] for r in batch]))
    else:
        x = torch.tensor([r["emb"] for r in batch])
    t1, c1 = time.perf_counter(), time.thread_time()
    y = torch.tensor([r["label"] for r in batch])
    own["convert_s"] += t1 - t0
    own["convert_cpu_s"] += c1 - c0
    own["collate_s"] += time.perf_counter() - t0
    return x, y


def schedstat(tid: int) -> tuple[float, float] | None:
    try:
        with open(f"/proc/{PID}/task/{tid}/schedstat") as fh:
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


records = load_records()
loader = torch.utils.data.DataLoader(EmbeddingRecords(records), batch_size=BATCH, shuffle=True, drop_last=True,
                                     collate_fn=collate_records, generator=torch.Generator().manual_seed(0))
state = {"it": iter(loader)}
torch.manual_seed(0)
model = nn.Sequential(nn.LayerNorm(DIM), nn.Linear(DIM, HIDDEN), nn.GELU(), nn.Dropout(0.1),
                      nn.Linear(HIDDEN, HIDDEN), nn.GELU(), nn.Dropout(0.1), nn.Linear(HIDDEN, CLASSES)).to(dev)
opt = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.05, fused=sc.cuda or None)


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


def next_batch():
    try:
        return next(state["it"])
    except StopIteration:  # a new epoch
        state["it"] = iter(loader)
        return next(state["it"])


def step() -> None:
    t0, c0 = time.perf_counter(), time.thread_time()
    x, y = next_batch()
    t1, c1 = time.perf_counter(), time.thread_time()
    x, y = x.to(dev, non_blocking=True), y.to(dev, non_blocking=True)
    t2 = time.perf_counter()
    loss = train(x, y)
    t3 = time.perf_counter()
    own["running_loss"] += loss.item()
    own["item_s"] += time.perf_counter() - t3
    own["next_s"] += t1 - t0
    own["next_cpu_s"] += c1 - c0
    own["h2d_s"] += t2 - t1
    own["steps"] += 1


def sync() -> None:
    if sc.cuda:
        torch.cuda.synchronize()


def reset() -> None:
    for k in own:
        own[k] = 0 if k == "steps" else 0.0


def timed(seconds: float) -> tuple[int, float]:
    n0, t = own["steps"], time.perf_counter()
    end = t + seconds
    while time.perf_counter() < end:
        step()
    sync()
    return own["steps"] - n0, time.perf_counter() - t


# The fix first: the arrays stacked, then wrapped.
mode["fix"] = True
for _ in range(20):  # warm-up: cuBLAS, the allocator, the autograd thread
    step()
sync()
gpu_step_s = None
if sc.cuda:
    fixed = tuple(t.to(dev) for t in next_batch())
    runs = sorted(r for r in (gpu_seconds_queued(torch, lambda _: train(*fixed)) for _ in range(5)) if r is not None)
    gpu_step_s = runs[len(runs) // 2] if runs else None
reset()
fix_steps, fix_wall = timed(3.0 * sc.scale)
fix_next_share = own["next_s"] / fix_wall if fix_wall > 0 else None
# As the script has it: torch.tensor over the list of arrays.
mode["fix"] = False
timed(1.5 * sc.scale)  # its one warning printed, the spin kernels well before the run
ag = autograd_thread()
reset()
main0 = schedstat(MAIN)
ag0 = schedstat(ag["tid"]) if ag else None
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
main1 = schedstat(MAIN)
ag1 = schedstat(ag["tid"]) if ag else None
f1 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
m1 = int(torch.cuda.memory_stats().get("segment.all.allocated", 0)) if sc.cuda else 0
n = own["steps"]


def share(v: float | None) -> float | None:
    return round(v / wall, 4) if v is not None else None


def delta(a, b, k: int) -> float | None:
    return round(b[k] - a[k], 4) if a and b else None


fix_rate = fix_steps / fix_wall if fix_wall > 0 else None
at_fix = n / fix_rate if fix_rate else None
overhead = max(0.0, wall - at_fix) if at_fix is not None else None
main_run, main_wait = delta(main0, main1, 0), delta(main0, main1, 1)
ag_run, ag_wait = delta(ag0, ag1, 0), delta(ag0, ag1, 1)
gpu_busy = n * gpu_step_s if gpu_step_s is not None else None
sc.extra["autograd"] = ag
sc.extra["self"] = {**{k: round(v, 4) if isinstance(v, float) else v for k, v in own.items()},
                    "wall_s": round(wall, 4), "steps_per_s": round(n / wall, 2),
                    "step_ms_mean": round(wall / max(n, 1) * 1e3, 3),
                    "next_share": share(own["next_s"]), "next_cpu_share": share(own["next_cpu_s"]),
                    "collate_share": share(own["collate_s"]), "convert_share": share(own["convert_s"]),
                    "convert_cpu_share": share(own["convert_cpu_s"]),
                    "convert_ms_mean": round(own["convert_s"] / max(n, 1) * 1e3, 3),
                    "h2d_share": share(own["h2d_s"]), "step_share": share(own["step_s"]),
                    "backward_share": share(own["backward_s"]), "item_share": share(own["item_s"]),
                    "elements_per_batch": BATCH * DIM,
                    "fix_steps": fix_steps, "fix_wall_s": round(fix_wall, 4),
                    "fix_steps_per_s": round(fix_rate, 2) if fix_rate else None,
                    "fix_next_share": round(fix_next_share, 4) if fix_next_share is not None else None,
                    "at_fix_rate_s": round(at_fix, 4) if at_fix is not None else None,
                    "convert_overhead_s": round(overhead, 4) if overhead is not None else None,
                    "convert_overhead_share": share(overhead),
                    "main_run_s": main_run, "main_cpu_share": share(main_run),
                    "main_cpu_wait_s": main_wait, "main_cpu_wait_share": share(main_wait),
                    "autograd_run_s": ag_run, "autograd_cpu_share": share(ag_run),
                    "autograd_cpu_wait_s": ag_wait, "autograd_cpu_wait_share": share(ag_wait),
                    "minor_faults_per_s": round((f1 - f0) / wall, 1), "cuda_mallocs_per_s": round((m1 - m0) / wall, 3),
                    "gpu_step_ms": round(gpu_step_s * 1e3, 4) if gpu_step_s is not None else None,
                    "gpu_busy_s": round(gpu_busy, 4) if gpu_busy is not None else None,
                    "gpu_busy_share": share(gpu_busy), "batch": BATCH, "dim": DIM, "hidden": HIDDEN, "records": N}
if not sc.cuda:
    sc.note("on the CPU: no autograd thread (the backward runs on the main thread), no GPU timings, no allocator "
            "counters.")
sc.note(f"natural: measured by the script: {n} steps ({n / wall:.1f}/s) in {wall:.2f} s: {own['next_s']:.2f} s in "
        f"next(), {own['collate_s']:.2f} s of it in the collate function, {own['convert_s']:.2f} s in torch.tensor() "
        f"over the list of arrays ({own['convert_cpu_s']:.2f} s on the CPU); with np.stack first "
        f"{fix_rate and round(fix_rate, 1)} steps/s (the conversion cost {overhead and round(overhead, 2)} s of the "
        f"run); the main thread ran {main_run} s, waited for a CPU {main_wait} s; "
        + (f"a step's kernels take {gpu_step_s * 1e3:.2f} ms of GPU time queued (GPU busy {gpu_busy / wall:.0%} of the "
           "run)." if gpu_busy is not None else "no GPU timings (no CUDA)."))
sc.write_truth(baseline=(b0, b1), window=None, ratio_spans=((b0, mid), (mid, b1)))