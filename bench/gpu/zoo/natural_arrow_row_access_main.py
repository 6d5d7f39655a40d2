"""natural_arrow_row_access_main (natural, nothing staged): a tabular classifier trained from a pyarrow Table held in
memory (300,000 rows: a list<float> column of 64 features a row, as a Parquet file of embeddings or sensor windows
loads, and an int64 label), through a map-style Dataset written the obvious way: `row = self.table.slice(i,
1).to_pylist()[0]` in __getitem__ (Arrow's C++ slices the table, then converts the row to Python objects: a dict, a
list of 64 Python floats, an int), and a collate function that builds the batch with torch.tensor() over those lists.
DataLoader(batch_size=512, shuffle=True, num_workers=0, drop_last=True), as a first version over an in-memory table
often is ("the data is already in RAM"): every batch is made on the main thread, inside next(), 512 row slices and
conversions and the walk over 32,768 Python floats, while the GPU waits. The model: an MLP 64-2048-2048-2048-100 with
LayerNorm and GELU, fp32 without TF32, fused AdamW, loss.item() each step (a millisecond or two of GPU work); the batch
copied to the GPU (128 KB, pageable, non_blocking). One process on CPUs 2-3; no threads of the job's own, no workers,
no children, no IO (the table is built in memory before the run), no lock, no sleep. 20 s (smaller with --device cpu:
60,000 rows, batch 128, width 256).

The script measures itself: the steps per second; the main thread's time in next() on the loader (`wait_s`, its CPU
clock in it `wait_cpu_s`): within it in __getitem__ (`getitem_s`: the slice and to_pylist, `getitem_cpu_s`) and in the
collate function (`collate_s`: torch.tensor() over the lists); copying the batch to the GPU (`h2d_s`), queueing the
forward and the optimiser step (`step_s`), in loss.backward() (`backward_s`, its wait on PyTorch's autograd thread) and
in loss.item() (`item_s`); before the run, the same loop with the fix (the feature column made one numpy array once,
in __init__, and each batch gathered by Dataset.__getitems__ with one fancy index and torch.from_numpy), so that what
the row access costs the run is known (`arrow_overhead_s`: the run's wall time beyond its steps at that rate); the
main thread's and the autograd thread's time on a CPU and waiting for one over the run (schedstat); the threads of the
process (pyarrow may start a pool of its own) and their CPU time; the process's minor page faults and the device
allocator's cudaMalloc calls; and a step's GPU time queued (common.gpu_seconds_queued: a batch already on the GPU,
forward, backward, AdamW, nothing read back), so that the GPU's busy share is known. Truth `autograd` names PyTorch's
autograd thread, `dataset` the Dataset's class, its function and what it calls."""

import os
import resource
import threading
import time

from common import Scenario, comm_of, gpu_seconds_queued, tids_of

sc = Scenario("natural_arrow_row_access_main", "natural", "an MLP trained from an in-memory pyarrow Table through a "
              "Dataset whose __getitem__ does table.slice(i, 1).to_pylist() and a collate that calls torch.tensor() "
              "on the rows, DataLoader(num_workers=0): every batch made on the main thread, 20 s, nothing staged",
              job_cpus=[2, 3], control=True)
import numpy as np  # noqa: E402
import pyarrow as pa  # noqa: E402
import torch  # noqa: E402

nn = torch.nn
F = nn.functional
PID, MAIN = os.getpid(), threading.get_native_id()
dev = torch.device(sc.device)
if sc.cuda:
    torch.backends.cuda.matmul.allow_tf32 = False
ROWS, BATCH, WIDTH = (300_000, 512, 2048) if sc.cuda else (60_000, 128, 256)
DIM, CLASSES = 64, 100
KEYS = ("wait_s", "wait_cpu_s", "getitem_s", "getitem_cpu_s", "collate_s", "h2d_s", "step_s", "backward_s", "item_s")
own = {"steps": 0, "rows": 0, **dict.fromkeys(KEYS, 0.0), "running_loss": 0.0}


def make_table() -> pa.Table:
    """ROWS rows: `features` list<float> of DIM (class centroids and noise), `label` int64."""
    rng = np.random.default_rng(0)
    y = rng.integers(0, CLASSES, ROWS)
    centroids = rng.standard_normal((CLASSES, DIM)).astype(np.float32)
    x = centroids[y] + 0.8 * rng.standard_normal((ROWS, DIM), dtype=np.float32)
    offsets = pa.array(np.arange(0, ROWS * DIM + 1, DIM, dtype=np.int32))
    features = pa.ListArray.from_arrays(offsets, pa.array(x.reshape(-1)))
    return pa.table({"features": features, "label": pa.array(y.astype(np.int64))})


class ArrowRows(torch.utils.data.Dataset):
    """Row i of the table. As written: sliced and converted to Python row by row; `columnar` (the fix): the features
    made one (ROWS, DIM) numpy array once, a batch gathered by __getitems__."""

    def __init__(self, table: pa.Table, columnar: bool = False) -> None:
        self.table = table
        self.x = self.y = None
        if columnar:
            self.x = table.column("features").combine_chunks().flatten().to_numpy().reshape(-1, DIM)
            self.y = table.column("label").to_numpy()

    def __len__(self) -> int:
        return self.table.num_rows

    def __getitem__(self, i: int):
        t0, c0 = time.perf_counter(), time.thread_time()
        row = self.table.slice(i, 1).to_pylist()[0]
        own["getitem_s"] += time.perf_counter() - t0
        own["getitem_cpu_s"] += time.thread_time() - c0
        own["rows"] += 1
        return row["features"], row["label"]

    def __getitems__(self, idx: list[int]):  # the fix's batched fetch (the DataLoader calls it when defined)
        if self.x is None:
            return [self[i] for i in idx]
        t0, c0 = time.perf_counter(), time.thread_time()
        order = np.asarray(idx)
        out = torch.from_numpy(self.x[order]), torch.from_numpy(self.y[order])
        own["getitem_s"] += time.perf_counter() - t0
        own["getitem_cpu_s"] += time.thread_time() - c0
        own["rows"] += len(idx)
        return out


def collate_rows(rows):
    """The rows' lists to one float tensor and one label tensor (the fix's batch passes through)."""
    t0 = time.perf_counter()
    if isinstance(rows, tuple):
        out = rows
    else:
        out = torch.tensor([r[0] for r in rows], dtype=torch.float32), torch.tensor([r[1] for r in rows])
    own["collate_s"] += time.perf_counter() - t0
    return out


def mlp() -> nn.Module:
    layers = [nn.Linear(DIM, WIDTH), nn.LayerNorm(WIDTH), nn.GELU()]
    for _ in range(2):
        layers += [nn.Linear(WIDTH, WIDTH), nn.LayerNorm(WIDTH), nn.GELU()]
    return nn.Sequential(*layers, nn.Linear(WIDTH, CLASSES))


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


t_build = time.perf_counter()
table = make_table()
build_s = time.perf_counter() - t_build
torch.manual_seed(0)
model = mlp().to(dev)
opt = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.05, fused=sc.cuda or None)
state: dict = {"it": None, "loader": None}


def make_loader(columnar: bool) -> None:
    loader = torch.utils.data.DataLoader(ArrowRows(table, columnar), batch_size=BATCH, shuffle=True, num_workers=0,
                                         drop_last=True, collate_fn=collate_rows,
                                         generator=torch.Generator().manual_seed(0))
    state["loader"], state["it"] = loader, iter(loader)


def train(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    t0 = time.perf_counter()
    loss = F.cross_entropy(model(x), y)
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
        state["it"] = iter(state["loader"])
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
    own["wait_s"] += t1 - t0
    own["wait_cpu_s"] += c1 - c0
    own["h2d_s"] += t2 - t1
    own["steps"] += 1


def sync() -> None:
    if sc.cuda:
        torch.cuda.synchronize()


def reset() -> None:
    for k in own:
        own[k] = 0 if k in ("steps", "rows") else 0.0


def timed(seconds: float) -> tuple[int, float]:
    n0, t = own["steps"], time.perf_counter()
    end = t + seconds
    while time.perf_counter() < end:
        step()
    sync()
    return own["steps"] - n0, time.perf_counter() - t


def thread_cpu() -> dict[int, float]:
    """Each thread of the process: its time on a CPU so far (schedstat)."""
    out = {}
    for tid in tids_of(PID):
        s = schedstat(PID, tid)
        if s:
            out[tid] = s[0]
    return out


# The fix first: the feature column one numpy array, made once; a batch gathered with one index.
make_loader(columnar=True)
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
fix_wait_share = own["wait_s"] / fix_wall if fix_wall > 0 else None
# As the script has it: a slice and to_pylist() a row, torch.tensor() over the rows.
make_loader(columnar=False)
timed(1.5 * sc.scale)  # the spin kernels well before the run
ag = autograd_thread()
reset()
main0 = schedstat(PID, MAIN)
ag0 = schedstat(PID, ag["tid"]) if ag else None
th0 = thread_cpu()
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
th1 = thread_cpu()
f1 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
m1 = int(torch.cuda.memory_stats().get("segment.all.allocated", 0)) if sc.cuda else 0
n = own["steps"]


def share(v: float | None) -> float | None:
    return round(v / wall, 4) if v is not None else None


def r4(v: float | None) -> float | None:
    return round(v, 4) if v is not None else None


def delta(a, b, k: int) -> float | None:
    return r4(b[k] - a[k]) if a and b else None


fix_rate = fix_steps / fix_wall if fix_wall > 0 else None
at_fix = n / fix_rate if fix_rate else None
overhead = max(0.0, wall - at_fix) if at_fix is not None else None
main_run, main_wait = delta(main0, main1, 0), delta(main0, main1, 1)
ag_run, ag_wait = delta(ag0, ag1, 0), delta(ag0, ag1, 1)
gpu_busy = n * gpu_step_s if gpu_step_s is not None else None
threads = [{"tid": tid, "comm": comm_of(PID, tid), "run_s": round(th1[tid] - th0.get(tid, 0.0), 4)}
           for tid in sorted(th1)]
others_run = sum(r["run_s"] for r in threads if r["tid"] not in (MAIN, ag["tid"] if ag else None))
sc.extra["autograd"] = ag
sc.extra["threads"] = threads
sc.extra["dataset"] = {"class": "ArrowRows", "function": "ArrowRows.__getitem__", "collate": "collate_rows",
                       "file": os.path.basename(__file__),
                       "what": "self.table.slice(i, 1).to_pylist()[0] for every row, then torch.tensor() over the "
                               "batch's lists of Python floats, on the main thread (num_workers=0)",
                       "rows": ROWS, "dim": DIM, "pyarrow": pa.__version__, "build_s": round(build_s, 3)}
sc.extra["self"] = {**{k: round(v, 4) if isinstance(v, float) else v for k, v in own.items()},
                    "wall_s": round(wall, 4), "steps_per_s": round(n / wall, 2),
                    "step_ms_mean": round(wall / max(n, 1) * 1e3, 3),
                    "wait_share": share(own["wait_s"]), "wait_cpu_share": share(own["wait_cpu_s"]),
                    "wait_off_cpu_s": round(max(0.0, own["wait_s"] - own["wait_cpu_s"]), 4),
                    "getitem_share": share(own["getitem_s"]), "getitem_cpu_share": share(own["getitem_cpu_s"]),
                    "collate_share": share(own["collate_s"]),
                    "getitem_us_per_row": round(own["getitem_s"] / max(own["rows"], 1) * 1e6, 2),
                    "h2d_share": share(own["h2d_s"]), "step_share": share(own["step_s"]),
                    "backward_share": share(own["backward_s"]), "item_share": share(own["item_s"]),
                    "fix_steps": fix_steps, "fix_wall_s": round(fix_wall, 4),
                    "fix_steps_per_s": round(fix_rate, 2) if fix_rate else None,
                    "fix_wait_share": r4(fix_wait_share),
                    "at_fix_rate_s": r4(at_fix), "arrow_overhead_s": r4(overhead),
                    "arrow_overhead_share": share(overhead),
                    "main_run_s": main_run, "main_cpu_share": share(main_run),
                    "main_cpu_wait_s": main_wait, "main_cpu_wait_share": share(main_wait),
                    "autograd_run_s": ag_run, "autograd_cpu_share": share(ag_run),
                    "autograd_cpu_wait_s": ag_wait, "autograd_cpu_wait_share": share(ag_wait),
                    "other_threads_run_s": round(others_run, 4),
                    "minor_faults_per_s": round((f1 - f0) / wall, 1), "cuda_mallocs_per_s": round((m1 - m0) / wall, 3),
                    "gpu_step_ms": round(gpu_step_s * 1e3, 4) if gpu_step_s is not None else None,
                    "gpu_busy_s": r4(gpu_busy), "gpu_busy_share": share(gpu_busy),
                    "batch": BATCH, "rows_total": ROWS, "dim": DIM, "width": WIDTH, "num_workers": 0}
if not sc.cuda:
    sc.note("on the CPU: no autograd thread (the backward runs on the main thread), no GPU timings, no allocator "
            "counters.")
sc.note(f"natural: measured by the script: {n} steps ({n / wall:.1f}/s) in {wall:.2f} s: {own['wait_s']:.2f} s in "
        f"next() ({own['wait_cpu_s']:.2f} s of it on the main thread's CPU): {own['getitem_s']:.2f} s slicing and "
        f"converting rows ({own['getitem_s'] / max(own['rows'], 1) * 1e6:.1f} us a row), {own['collate_s']:.2f} s in "
        f"torch.tensor() over them; with the column made a numpy array once {fix_rate and round(fix_rate, 1)} steps/s "
        f"(the row access cost {overhead and round(overhead, 2)} s of the run); the main thread ran {main_run} s, "
        f"waited for a CPU {main_wait} s; "
        + (f"a step's kernels take {gpu_step_s * 1e3:.2f} ms of GPU time queued (GPU busy {gpu_busy / wall:.0%} of the "
           "run)." if gpu_busy is not None else "no GPU timings (no CUDA)."))
sc.write_truth(baseline=(b0, b1), window=None, ratio_spans=((b0, mid), (mid, b1)))
