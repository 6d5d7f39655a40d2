"""natural_glob_in_getitem (natural, nothing staged): an image classifier over a folder of per-sample .npy files whose
Dataset finds its file by listing the folder in __getitem__, the way a first "ImageFolder of my own" is often
written so that it "picks up new files": `files = sorted(glob.glob(os.path.join(self.root, "*.npy")))`, then
`np.load(files[i])` and the label parsed from the file name. Each sample lists the whole folder (os.scandir, the
kernel's getdents64 over its entries), matches every name against the pattern (fnmatch), joins every path and sorts
them, to read one file. At set-up the script writes the folder under /var/tmp (ZOO_DATA_DIR): 1,500 files
`NNNNNN_cCCC.npy`, each a 3x72x72 uint8 image (smooth colours and sensor noise) of one of 100 classes (~23 MB,
synced, in the page cache afterwards: no disk reads). After the load a random 64x64 crop and a random flip with numpy.
DataLoader(batch_size=64, shuffle=True, num_workers=4, persistent_workers=True, drop_last=True), no pin_memory; the
main thread copies each uint8 batch to the GPU (pageable, non_blocking), normalises it there and trains a
ResNet-18-style classifier (stem 3-64 of stride 1, stages 64-128-256-512; fp32 without TF32, cudnn.benchmark, SGD
with Nesterov momentum), loss.item() each step. The four workers are on their CPUs listing the folder; the main
thread waits in next() and the GPU idles part of each step. The main process and its workers on CPUs 2-7 (each worker
has a CPU to itself); no threads of the job's own, no children but the workers (started before the measured run), no
IO but the page cache's, no lock, no sleep. 20 s (smaller with --device cpu: 600 files of 3x40x40, crops of 32, batch
32, a narrower net).

The script measures itself: the steps per second; the main thread's time in next() on the loader (`wait_s`, its CPU
clock in it `wait_cpu_s`, the rest `wait_off_cpu_s`: off its CPU), copying the batch to the GPU (`h2d_s`), queueing
the forward and the optimiser step (`step_s`), in loss.backward() (`backward_s`, its wait on PyTorch's autograd
thread) and in loss.item() (`item_s`); for each worker (truth `workers`: pid, tids, comm) the samples it made, its time
in the listing (`glob_s`: glob and sort, wall and CPU clock), in np.load (`load_s`) and in all of __getitem__, its time
on a CPU and waiting for one (schedstat), and its bytes read and those read from storage (/proc/PID/io); before the
run, the same loop with the file list made once in __init__ (the fix), so that what the listing costs the run is
known (`glob_overhead_s`: the run's wall time beyond its steps at that rate); the main thread's and the autograd
thread's time on a CPU and waiting for one over the run (schedstat); the process's minor page faults and the device
allocator's cudaMalloc calls; and a step's GPU time queued (common.gpu_seconds_queued: a batch already on the GPU,
normalised, forward, backward, SGD, nothing read back), so that the GPU's busy share is known. Truth `autograd` names
PyTorch's autograd thread, `workers` the workers, `dataset` the Dataset's class, function and folder."""

import glob
import multiprocessing
import os
import resource
import shutil
import tempfile
import threading
import time

from common import Scenario, comm_of, gpu_seconds_queued, tids_of

sc = Scenario("natural_glob_in_getitem", "natural", "a ResNet-18-style classifier fed by 4 DataLoader workers whose "
              "Dataset.__getitem__ lists its 1,500-file folder with sorted(glob.glob(...)) to load one .npy file, "
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
    torch.backends.cudnn.benchmark = True
NFILES, SIDE, CROP, BATCH, WIDTHS = ((1500, 72, 64, 64, (64, 128, 256, 512)) if sc.cuda
                                     else (600, 40, 32, 32, (16, 32, 64, 64)))
CLASSES, WORKERS = 100, 4
NSTAT = 5  # per worker: samples, glob wall, glob CPU, np.load wall, __getitem__ wall
STATS = multiprocessing.RawArray("d", NSTAT * WORKERS)  # shared with the forked workers
DATA_PARENT = os.environ.get("ZOO_DATA_DIR", "/var/tmp")
KEYS = ("wait_s", "wait_cpu_s", "h2d_s", "step_s", "backward_s", "item_s")
own = {"steps": 0, **dict.fromkeys(KEYS, 0.0), "running_loss": 0.0}


def write_folder(root: str) -> None:
    """The dataset as a folder of one .npy file a sample, named by index and class."""
    rng = np.random.default_rng(0)
    labels = rng.integers(0, CLASSES, NFILES)
    for i in range(NFILES):
        low = rng.integers(0, 256, (3, SIDE // 8, SIDE // 8)).astype(np.float32)
        img = np.repeat(np.repeat(low, 8, 1), 8, 2) + 12 * rng.standard_normal((3, SIDE, SIDE), dtype=np.float32)
        np.save(os.path.join(root, f"{i:06d}_c{labels[i]:03d}.npy"), np.clip(img, 0, 255).astype(np.uint8))


class NpyFolder(torch.utils.data.Dataset):
    """Every *.npy file of a folder, its class in its name. As written: the folder listed in __getitem__; `listed`
    (the fix): the file list made once, in __init__."""

    def __init__(self, root: str, listed: bool = False) -> None:
        self.root = root
        self.files = sorted(glob.glob(os.path.join(root, "*.npy"))) if listed else None
        self.n = len(self.files) if self.files is not None else len(glob.glob(os.path.join(root, "*.npy")))

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        t0, c0 = time.perf_counter(), time.thread_time()
        w = torch.utils.data.get_worker_info()
        wid = w.id if w is not None else 0
        files = self.files if self.files is not None else sorted(glob.glob(os.path.join(self.root, "*.npy")))
        t1, c1 = time.perf_counter(), time.thread_time()
        path = files[i]
        img = np.load(path)
        t2 = time.perf_counter()
        label = int(os.path.basename(path).split("_c")[1].split(".")[0])
        rng = np.random.default_rng()
        y0, x0 = rng.integers(0, SIDE - CROP + 1, 2)
        img = img[:, y0:y0 + CROP, x0:x0 + CROP]
        if rng.random() < 0.5:
            img = img[:, :, ::-1]
        out = torch.from_numpy(np.ascontiguousarray(img))
        base = NSTAT * wid
        STATS[base] += 1
        STATS[base + 1] += t1 - t0
        STATS[base + 2] += c1 - c0
        STATS[base + 3] += t2 - t1
        STATS[base + 4] += time.perf_counter() - t0
        return out, label


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
    layers = [nn.Conv2d(3, WIDTHS[0], 3, 1, 1, bias=False), nn.BatchNorm2d(WIDTHS[0]), nn.ReLU()]
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


def proc_io(pid: int) -> dict | None:
    try:
        with open(f"/proc/{pid}/io") as fh:
            return {k: int(v) for k, v in (line.split(": ") for line in fh.read().splitlines())}
    except (OSError, ValueError):
        return None


def autograd_thread() -> dict | None:
    for tid in tids_of(PID):
        comm = comm_of(PID, tid) or ""
        if comm.startswith("pt_autograd"):
            return {"pid": PID, "tid": tid, "comm": comm}
    return None


state: dict = {"it": None, "loader": None}
root = tempfile.mkdtemp(prefix="zoo_globds_", dir=DATA_PARENT if os.path.isdir(DATA_PARENT) else None)
try:
    folder = os.path.join(root, "train")
    os.mkdir(folder)
    t_write = time.perf_counter()
    write_folder(folder)
    os.sync()  # written back before the run: its writeback is not the run's
    write_s = time.perf_counter() - t_write
    torch.manual_seed(0)
    model = resnet18().to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, nesterov=True, weight_decay=5e-4)
    mean = torch.tensor([0.485, 0.456, 0.406], device=dev).view(1, 3, 1, 1) * 255
    std = torch.tensor([0.229, 0.224, 0.225], device=dev).view(1, 3, 1, 1) * 255

    def make_loader(listed: bool) -> None:
        loader = torch.utils.data.DataLoader(NpyFolder(folder, listed), batch_size=BATCH, shuffle=True,
                                             num_workers=WORKERS, persistent_workers=True, drop_last=True,
                                             generator=torch.Generator().manual_seed(0))
        state["loader"], state["it"] = loader, iter(loader)

    def train(img: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        t0 = time.perf_counter()
        x = (img.float() - mean) / std
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
        except StopIteration:  # a new epoch (the workers stay)
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
            own[k] = 0 if k == "steps" else 0.0

    def timed(seconds: float) -> tuple[int, float]:
        n0, t = own["steps"], time.perf_counter()
        end = t + seconds
        while time.perf_counter() < end:
            step()
        sync()
        return own["steps"] - n0, time.perf_counter() - t

    # The fix first: the file list made once.
    make_loader(listed=True)
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
    state["it"]._shutdown_workers()
    # As the script has it: the folder listed for every sample.
    make_loader(listed=False)
    timed(1.5 * sc.scale)  # the new workers started and primed, the spin kernels well before the run
    wpids = sorted(p.pid for p in multiprocessing.active_children())
    ag = autograd_thread()
    reset()
    s0 = list(STATS)
    w0 = {p: schedstat(p, p) for p in wpids}
    io0 = {p: proc_io(p) for p in wpids}
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
    io1 = {p: proc_io(p) for p in wpids}
    workers = [{"pid": p, "tids": tids_of(p), "comm": comm_of(p)} for p in wpids]
finally:
    if state["it"] is not None:
        state["it"]._shutdown_workers()
    shutil.rmtree(root, ignore_errors=True)
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
    per_worker.append({"worker_id": w_id, "samples": int(d[0]), "glob_s": round(d[1], 4),
                       "glob_cpu_s": round(d[2], 4), "load_s": round(d[3], 4), "getitem_s": round(d[4], 4)})
for row in workers:
    p = row["pid"]
    a, z, ia, iz = w0.get(p), w1.get(p), io0.get(p), io1.get(p)
    row.update({"run_s": delta(a, z, 0), "cpu_wait_s": delta(a, z, 1),
                "rchar": iz["rchar"] - ia["rchar"] if ia and iz else None,
                "disk_read_bytes": iz["read_bytes"] - ia["read_bytes"] if ia and iz else None})
    row["cpu_share"], row["cpu_wait_share"] = share(row["run_s"]), share(row["cpu_wait_s"])
nw = max(len(workers), 1)


def total(key: str, rows: list[dict]) -> float:
    return round(sum(r[key] or 0.0 for r in rows), 4)


glob_s, glob_cpu_s, load_s, getitem_s = (total(k, per_worker) for k in ("glob_s", "glob_cpu_s", "load_s", "getitem_s"))
samples = int(sum(r["samples"] for r in per_worker))
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
sc.extra["dataset"] = {"class": "NpyFolder", "function": "NpyFolder.__getitem__", "file": os.path.basename(__file__),
                       "what": "sorted(glob.glob(os.path.join(self.root, '*.npy'))) for every sample",
                       "folder": folder, "files": NFILES, "write_s": round(write_s, 3)}
sc.extra["self"] = {**{k: round(v, 4) if isinstance(v, float) else v for k, v in own.items()},
                    "wall_s": round(wall, 4), "steps_per_s": round(n / wall, 2),
                    "step_ms_mean": round(wall / max(n, 1) * 1e3, 3),
                    "wait_share": share(own["wait_s"]), "wait_cpu_share": share(own["wait_cpu_s"]),
                    "wait_off_cpu_s": round(wait_off, 4), "wait_off_cpu_share": share(wait_off),
                    "h2d_share": share(own["h2d_s"]), "step_share": share(own["step_s"]),
                    "backward_share": share(own["backward_s"]), "item_share": share(own["item_s"]),
                    "samples": samples, "glob_s": glob_s, "glob_cpu_s": glob_cpu_s, "load_s": load_s,
                    "getitem_s": getitem_s, "glob_ms_per_sample": round(glob_s / max(samples, 1) * 1e3, 3),
                    "load_ms_per_sample": round(load_s / max(samples, 1) * 1e3, 3),
                    # the workers' time listing the folder and in __getitem__, as shares of their time (workers x run)
                    "glob_share_of_workers": round(glob_s / (nw * wall), 4),
                    "workers_busy_share": round(getitem_s / (nw * wall), 4),
                    "workers_run_s": total("run_s", workers),
                    "workers_cpu_share_mean": round(sum(w_shares) / len(w_shares), 4) if w_shares else None,
                    "workers_cpu_share_max": max(w_shares, default=None),
                    "workers_cpu_wait_s": total("cpu_wait_s", workers),
                    "workers_cpu_wait_max_share": max((r["cpu_wait_share"] or 0.0 for r in workers), default=None),
                    "workers_disk_read_bytes": int(sum(r["disk_read_bytes"] or 0 for r in workers)),
                    "workers_rchar": int(sum(r["rchar"] or 0 for r in workers)),
                    "fix_steps": fix_steps, "fix_wall_s": round(fix_wall, 4),
                    "fix_steps_per_s": round(fix_rate, 2) if fix_rate else None,
                    "fix_wait_share": r4(fix_wait_share),
                    "at_fix_rate_s": r4(at_fix), "glob_overhead_s": r4(overhead),
                    "glob_overhead_share": share(overhead),
                    "main_run_s": main_run, "main_cpu_share": share(main_run),
                    "main_cpu_wait_s": main_wait, "main_cpu_wait_share": share(main_wait),
                    "autograd_run_s": ag_run, "autograd_cpu_share": share(ag_run),
                    "autograd_cpu_wait_s": ag_wait, "autograd_cpu_wait_share": share(ag_wait),
                    "minor_faults_per_s": round((f1 - f0) / wall, 1), "cuda_mallocs_per_s": round((m1 - m0) / wall, 3),
                    "gpu_step_ms": round(gpu_step_s * 1e3, 4) if gpu_step_s is not None else None,
                    "gpu_busy_s": r4(gpu_busy), "gpu_busy_share": share(gpu_busy),
                    "batch": BATCH, "files": NFILES, "image": [3, SIDE, SIDE], "crop": CROP,
                    "num_workers": WORKERS}
if not sc.cuda:
    sc.note("on the CPU: no autograd thread (the backward runs on the main thread), no GPU timings, no allocator "
            "counters.")
sc.note(f"natural: measured by the script: {n} steps ({n / wall:.1f}/s) in {wall:.2f} s: {own['wait_s']:.2f} s in "
        f"next() ({wait_off:.2f} s of it off the main thread's CPU); the {len(workers)} workers spent {glob_s:.2f} s "
        f"listing the folder ({glob_s / max(samples, 1) * 1e3:.2f} ms a sample, {glob_cpu_s:.2f} s on a CPU) and "
        f"{load_s:.2f} s in np.load; with the file list made once {fix_rate and round(fix_rate, 1)} steps/s (the "
        f"listing cost {overhead and round(overhead, 2)} s of the run); the main thread ran {main_run} s, waited for a "
        f"CPU {main_wait} s; "
        + (f"a step's kernels take {gpu_step_s * 1e3:.2f} ms of GPU time queued (GPU busy {gpu_busy / wall:.0%} of the "
           "run)." if gpu_busy is not None else "no GPU timings (no CUDA)."))
sc.write_truth(baseline=(b0, b1), window=None, ratio_spans=((b0, mid), (mid, b1)))
