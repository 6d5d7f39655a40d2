"""natural_flock_hdf5_workers (natural, nothing staged): an image classifier fed by DataLoader workers that read one
packed, compressed dataset file under an exclusive file lock taken for every sample, the way loaders over an HDF5 file
are often guarded once h5py's caveat bites (a file handle opened before fork must not be shared by worker processes,
HDF5's own HDF5_USE_FILE_LOCKING errors): `with open(path + ".lock") ... fcntl.flock(fd, LOCK_EX)` around "open the
file, read the sample's chunk, let the library inflate it" in Dataset.__getitem__, released after it (the blocking
fcntl.flock guard of many research loaders; not py-filelock, which polls with sleeps). At set-up the script writes the
file to a folder under /var/tmp (ZOO_DATA_DIR): 1,024 images of 3x192x192 uint8 (smooth content and sensor noise), each
zlib-compressed (level 4) as HDF5's gzip filter stores a chunk, one chunk per sample, and an index of their offsets
(~105 MB on the GPU run, in the page cache afterwards: no disk reads). A sample is: the lock taken, os.open, os.pread of
the chunk, os.close, zlib.decompress and the array made (all under the lock, as h5py's read holds it), the lock
released, then a random 160x160 crop and a random flip with numpy (outside it). DataLoader(batch_size=128, shuffle=True,
num_workers=4, persistent_workers=True, drop_last=True), no pin_memory; the main thread copies each uint8 batch to the
GPU, normalises it there and trains a small ResNet (a stride-2 stem 3-32 and a max pool, residual stages 32-64-128, 100
classes; fp32 without TF32, cudnn.benchmark, SGD with momentum), loss.item() each step. The four workers take turns at
the lock: the loader runs about as fast as one worker, while the main thread waits in next() and the GPU idles. The main
process and its workers share CPUs 2-3; no threads of the job's own, no children but the workers (started before the
measured run), no IO but the page cache's, no sleep. 20 s (smaller with --device cpu: 256 images of 3x64x64, crops of
56, batch 32, a narrower net).

The script measures itself: the steps per second; the main thread's time in next() on the loader (`wait_s`, and its
CPU clock in it: `wait_cpu_s`; the rest, `wait_off_cpu_s`, off its CPU), copying the batch to the GPU (`h2d_s`), in
loss.backward() (`backward_s`, its wait on PyTorch's autograd thread) and in loss.item() (`item_s`); for each worker
(truth `workers`: pid, tids, comm) its time waiting for the lock (`lock_wait_s`, wall in flock(LOCK_EX)), holding it
(`lock_hold_s`), the samples it made, its time on a CPU and waiting for one (schedstat), its bytes read and those read
from storage (/proc/PID/io); before the run, the same loop with the lock left out (each worker opens the file once
and reads with pread: the fix), so that what the lock costs the run is known (`lock_overhead_s`: the run's wall time
beyond its steps at that rate); the main thread's and the autograd thread's time on a CPU and waiting for one over
the run (schedstat); the process's minor page faults and the device allocator's cudaMalloc calls; and a step's GPU
time queued (common.gpu_seconds_queued: a batch already on the GPU, normalised, forward, backward, SGD, nothing read
back), so that the GPU's busy share is known. Truth `autograd` names PyTorch's autograd thread."""

import fcntl
import multiprocessing
import os
import resource
import shutil
import tempfile
import threading
import time
import zlib

from common import Scenario, comm_of, gpu_seconds_queued, tids_of

sc = Scenario("natural_flock_hdf5_workers", "natural", "a small ResNet fed by 4 DataLoader workers that read each "
              "sample of one packed zlib-compressed file under an exclusive fcntl.flock taken per sample (the guard "
              "put around HDF5 reads in workers), 20 s, nothing staged", job_cpus=[2, 3], control=True)
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
N, SIDE, CROP, BATCH, WIDTHS, CLASSES = ((1024, 192, 160, 128, (32, 64, 128), 100) if sc.cuda
                                         else (256, 64, 56, 32, (16, 32, 64), 100))
WORKERS = 4
NSTAT = 4  # per worker: samples, lock wait, lock hold, item wall
STATS = multiprocessing.RawArray("d", NSTAT * WORKERS)  # shared with the forked workers
DATA = tempfile.mkdtemp(prefix="zoo_flock_h5_", dir=os.environ.get("ZOO_DATA_DIR", "/var/tmp"))
PATH = os.path.join(DATA, "train.h5")
LOCK = PATH + ".lock"


def write_file() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The packed file: every image's zlib chunk back to back; (offsets, lengths, labels)."""
    rng = np.random.default_rng(0)
    offsets, lengths = np.zeros(N, np.int64), np.zeros(N, np.int64)
    labels = rng.integers(0, CLASSES, N)
    pos = 0
    with open(PATH, "wb") as fh:
        for i in range(N):
            low = rng.integers(0, 256, (3, SIDE // 16, SIDE // 16)).astype(np.float32)
            img = np.repeat(np.repeat(low, 16, 1), 16, 2) + 12 * rng.standard_normal((3, SIDE, SIDE), dtype=np.float32)
            chunk = zlib.compress(np.clip(img, 0, 255).astype(np.uint8).tobytes(), 4)  # h5py's gzip default, 4
            fh.write(chunk)
            offsets[i], lengths[i] = pos, len(chunk)
            pos += len(chunk)
    open(LOCK, "w").close()
    return offsets, lengths, labels


class PackedH5(torch.utils.data.Dataset):
    """One packed file of compressed chunks; each read under an exclusive flock on PATH.lock when `locked`."""

    def __init__(self, offsets: np.ndarray, lengths: np.ndarray, labels: np.ndarray, locked: bool) -> None:
        self.offsets, self.lengths, self.labels, self.locked = offsets, lengths, labels, locked
        self.lock_fd = self.fd = None

    def __len__(self) -> int:
        return N

    def _read(self, i: int, fd: int) -> np.ndarray:
        raw = zlib.decompress(os.pread(fd, int(self.lengths[i]), int(self.offsets[i])))
        return np.frombuffer(raw, np.uint8).reshape(3, SIDE, SIDE)

    def __getitem__(self, i: int):
        t0 = time.perf_counter()
        w = torch.utils.data.get_worker_info()
        wid = w.id if w is not None else 0
        if self.locked:
            if self.lock_fd is None:
                self.lock_fd = os.open(LOCK, os.O_RDWR)
            fcntl.flock(self.lock_fd, fcntl.LOCK_EX)
            t1 = time.perf_counter()
            try:
                fd = os.open(PATH, os.O_RDONLY)  # the file opened for the read, as `with h5py.File(...)` does
                try:
                    img = self._read(i, fd)
                finally:
                    os.close(fd)
            finally:
                fcntl.flock(self.lock_fd, fcntl.LOCK_UN)
            t2 = time.perf_counter()
        else:  # the fix: the file opened once in each worker, no lock
            if self.fd is None:
                self.fd = os.open(PATH, os.O_RDONLY)
            t1 = time.perf_counter()
            img = self._read(i, self.fd)
            t2 = time.perf_counter()
        rng = np.random.default_rng()
        y0, x0 = rng.integers(0, SIDE - CROP + 1, 2)
        img = img[:, y0:y0 + CROP, x0:x0 + CROP]
        if rng.random() < 0.5:
            img = img[:, :, ::-1]
        out = torch.from_numpy(np.ascontiguousarray(img))
        base = NSTAT * wid
        STATS[base] += 1
        STATS[base + 1] += t1 - t0
        STATS[base + 2] += t2 - t1
        STATS[base + 3] += time.perf_counter() - t0
        return out, int(self.labels[i])


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


def resnet() -> nn.Module:
    layers = [nn.Conv2d(3, WIDTHS[0], 3, 2, 1, bias=False), nn.BatchNorm2d(WIDTHS[0]), nn.ReLU(), nn.MaxPool2d(3, 2, 1)]
    cin = WIDTHS[0]
    for k, cout in enumerate(WIDTHS):
        layers += [Block(cin, cout, 1 if k == 0 else 2), Block(cout, cout, 1)]
        cin = cout
    return nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(cin, CLASSES))


def schedstat(path: str) -> tuple[float, float] | None:
    try:
        with open(path) as fh:
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


KEYS = ("wait_s", "wait_cpu_s", "h2d_s", "forward_s", "backward_s", "opt_s", "item_s")
own = {"steps": 0, **dict.fromkeys(KEYS, 0.0), "running_loss": 0.0}
state: dict = {"it": None, "loader": None}


def reset() -> None:
    for k in own:
        own[k] = 0 if k == "steps" else 0.0


try:
    offsets, lengths, labels = write_file()
    size_mb = os.path.getsize(PATH) / 2 ** 20
    torch.manual_seed(0)
    model = resnet().to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, weight_decay=5e-5)
    mean = torch.tensor([0.485, 0.456, 0.406], device=dev).view(1, 3, 1, 1) * 255
    std = torch.tensor([0.229, 0.224, 0.225], device=dev).view(1, 3, 1, 1) * 255

    def make_loader(locked: bool):
        loader = torch.utils.data.DataLoader(PackedH5(offsets, lengths, labels, locked), batch_size=BATCH,
                                             shuffle=True, num_workers=WORKERS, persistent_workers=True,
                                             drop_last=True, generator=torch.Generator().manual_seed(0))
        state["loader"], state["it"] = loader, iter(loader)

    def train(img: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        x = (img.float() - mean) / std
        t1 = time.perf_counter()
        loss = F.cross_entropy(model(x), y)
        opt.zero_grad(set_to_none=True)
        t2 = time.perf_counter()
        loss.backward()
        t3 = time.perf_counter()
        opt.step()
        own["forward_s"] += t2 - t1
        own["backward_s"] += t3 - t2
        own["opt_s"] += time.perf_counter() - t3
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
        img, y = img.to(dev), y.to(dev)
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

    def timed(seconds: float) -> tuple[int, float]:
        n0, t = own["steps"], time.perf_counter()
        end = t + seconds
        while time.perf_counter() < end:
            step()
        sync()
        return own["steps"] - n0, time.perf_counter() - t

    # The fix first: no lock, each worker's own handle.
    make_loader(False)
    for _ in range(5):
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
    # As the script has it: the lock per sample.
    make_loader(True)
    timed(1.5 * sc.scale)  # the workers started and warm, the spin kernels well before the run
    wpids = sorted(p.pid for p in multiprocessing.active_children())
    ag = autograd_thread()
    reset()
    s0 = list(STATS)
    w0 = {p: schedstat(f"/proc/{p}/task/{p}/schedstat") for p in wpids}
    io0 = {p: proc_io(p) for p in wpids}
    main0 = schedstat(f"/proc/{PID}/task/{MAIN}/schedstat")
    ag0 = schedstat(f"/proc/{PID}/task/{ag['tid']}/schedstat") if ag else None
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
    main1 = schedstat(f"/proc/{PID}/task/{MAIN}/schedstat")
    ag1 = schedstat(f"/proc/{PID}/task/{ag['tid']}/schedstat") if ag else None
    f1 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    m1 = int(torch.cuda.memory_stats().get("segment.all.allocated", 0)) if sc.cuda else 0
    s1 = list(STATS)
    w1 = {p: schedstat(f"/proc/{p}/task/{p}/schedstat") for p in wpids}
    io1 = {p: proc_io(p) for p in wpids}
    workers = [{"pid": p, "tids": tids_of(p), "comm": comm_of(p)} for p in wpids]
finally:
    if state["it"] is not None:
        state["it"]._shutdown_workers()
    shutil.rmtree(DATA, ignore_errors=True)
n = own["steps"]


def share(v: float | None) -> float | None:
    return round(v / wall, 4) if v is not None else None


def r4(v: float | None) -> float | None:
    return round(v, 4) if v is not None else None


per_worker = []
for w_id in range(WORKERS):
    d = [b - a for a, b in zip(s0[NSTAT * w_id:NSTAT * (w_id + 1)], s1[NSTAT * w_id:NSTAT * (w_id + 1)])]
    per_worker.append({"worker_id": w_id, "samples": int(d[0]), "lock_wait_s": round(d[1], 4),
                       "lock_hold_s": round(d[2], 4), "item_s": round(d[3], 4)})
for row in workers:
    p = row["pid"]
    a, z, ia, iz = w0.get(p), w1.get(p), io0.get(p), io1.get(p)
    row.update({"run_s": r4(z[0] - a[0]) if a and z else None, "cpu_wait_s": r4(z[1] - a[1]) if a and z else None,
                "rchar": iz["rchar"] - ia["rchar"] if ia and iz else None,
                "disk_read_bytes": iz["read_bytes"] - ia["read_bytes"] if ia and iz else None})
    row["cpu_share"], row["cpu_wait_share"] = share(row["run_s"]), share(row["cpu_wait_s"])


def total(key: str, rows: list[dict]) -> float | None:
    got = [r[key] for r in rows if r.get(key) is not None]
    return round(sum(got), 4) if got else None


lock_wait, lock_hold = total("lock_wait_s", per_worker) or 0.0, total("lock_hold_s", per_worker) or 0.0
w_run, w_cpu_wait = total("run_s", workers), total("cpu_wait_s", workers)
fix_rate = fix_steps / fix_wall if fix_wall > 0 else None
at_fix = n / fix_rate if fix_rate else None
overhead = max(0.0, wall - at_fix) if at_fix is not None else None
main_run = r4(main1[0] - main0[0]) if main0 and main1 else None
main_wait = r4(main1[1] - main0[1]) if main0 and main1 else None
ag_run = r4(ag1[0] - ag0[0]) if ag0 and ag1 else None
ag_wait = r4(ag1[1] - ag0[1]) if ag0 and ag1 else None
gpu_busy = n * gpu_step_s if gpu_step_s is not None else None
wait_off = max(0.0, own["wait_s"] - own["wait_cpu_s"])
nw = max(len(workers), 1)
sc.extra["workers"] = workers
sc.extra["per_worker"] = per_worker
sc.extra["autograd"] = ag
sc.extra["self"] = {**{k: round(v, 4) if isinstance(v, float) else v for k, v in own.items()},
                    "wall_s": round(wall, 4), "steps_per_s": round(n / wall, 2), "step_ms_mean": round(
                        wall / max(n, 1) * 1e3, 3),
                    "wait_share": share(own["wait_s"]), "wait_cpu_share": share(own["wait_cpu_s"]),
                    "wait_off_cpu_s": round(wait_off, 4), "wait_off_cpu_share": share(wait_off),
                    "h2d_share": share(own["h2d_s"]), "backward_share": share(own["backward_s"]),
                    "item_share": share(own["item_s"]),
                    "samples": int(sum(r["samples"] for r in per_worker)),
                    "lock_wait_s": round(lock_wait, 4), "lock_hold_s": round(lock_hold, 4),
                    # the workers' time waiting for the lock and holding it, as a share of their time (workers x run)
                    "lock_wait_share_of_workers": round(lock_wait / (nw * wall), 4),
                    "lock_hold_share": share(lock_hold),
                    "workers_run_s": w_run, "workers_cpu_share": round(w_run / (nw * wall), 4) if w_run else None,
                    "workers_cpu_wait_s": w_cpu_wait,
                    "workers_cpu_wait_max_share": max((r["cpu_wait_share"] or 0.0 for r in workers), default=None),
                    "workers_disk_read_bytes": int(sum(r["disk_read_bytes"] or 0 for r in workers)),
                    "workers_rchar": int(sum(r["rchar"] or 0 for r in workers)),
                    "fix_steps": fix_steps, "fix_wall_s": round(fix_wall, 4),
                    "fix_steps_per_s": round(fix_rate, 2) if fix_rate else None,
                    "fix_wait_share": r4(fix_wait_share),
                    "at_fix_rate_s": r4(at_fix), "lock_overhead_s": r4(overhead),
                    "lock_overhead_share": share(overhead),
                    "main_run_s": main_run, "main_cpu_share": share(main_run),
                    "main_cpu_wait_s": main_wait, "main_cpu_wait_share": share(main_wait),
                    "autograd_run_s": ag_run, "autograd_cpu_share": share(ag_run),
                    "autograd_cpu_wait_s": ag_wait, "autograd_cpu_wait_share": share(ag_wait),
                    "minor_faults_per_s": round((f1 - f0) / wall, 1), "cuda_mallocs_per_s": round((m1 - m0) / wall, 3),
                    "gpu_step_ms": round(gpu_step_s * 1e3, 4) if gpu_step_s is not None else None,
                    "gpu_busy_s": r4(gpu_busy), "gpu_busy_share": share(gpu_busy),
                    "batch": BATCH, "image": [3, SIDE, SIDE], "crop": CROP, "num_workers": WORKERS,
                    "file_mb": round(size_mb, 2)}
if not sc.cuda:
    sc.note("on the CPU: no autograd thread (the backward runs on the main thread), no GPU timings, no allocator "
            "counters.")
sc.note(f"natural: measured by the script: {n} steps ({n / wall:.1f}/s) in {wall:.2f} s: {own['wait_s']:.2f} s in "
        f"next() ({wait_off:.2f} s of it off the main thread's CPU); the {len(workers)} workers waited "
        f"{lock_wait:.2f} s for the file lock and held it {lock_hold:.2f} s; without the lock "
        f"{fix_rate and round(fix_rate, 1)} steps/s (the lock cost {overhead and round(overhead, 2)} s of the run); "
        f"the main thread ran {main_run} s, "
        f"waited for a CPU {main_wait} s; "
        + (f"a step's kernels take {gpu_step_s * 1e3:.2f} ms of GPU time queued (GPU busy {gpu_busy / wall:.0%} of the "
           "run)." if gpu_busy is not None else "no GPU timings (no CUDA)."))
sc.write_truth(baseline=(b0, b1), window=None, ratio_spans=((b0, mid), (mid, b1)))
