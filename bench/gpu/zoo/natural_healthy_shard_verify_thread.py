"""natural_healthy_shard_verify_thread (natural, nothing staged; a control): a GPU-bound training job whose process also
scrubs its dataset's shards for silent corruption in a background thread, as teams on shared storage do. The job: the
zoo's MLP made larger (512-4096, three 4096x4096 layers, 10 classes; fp32 without TF32, fused AdamW: tens of ms of GPU
work a step) trained on precomputed 512-d float16 features held in a .npy file under /var/tmp (65,536 rows, 64 MB,
opened once with np.load(mmap_mode="r") and read once at set-up, so in the page cache), nanoGPT's way: a batch of 8,192
random rows gathered from the memmap, page-locked with .pin_memory() and copied with non_blocking=True, the next
batch gathered while the GPU runs the step, loss.item() after it (the step's one wait for the GPU). The decoy: a thread
of the job's process (threading's name and OS name `shard_verify`), started by the script, that verifies the dataset's
4 record shards (shard_0..3.bin, 128 MB each, written and fsynced at set-up with their crc32 in a manifest) against
the manifest over and over: each shard opened, posix_fadvise(SEQUENTIAL), read in 8 MB chunks into one buffer
(readinto) with zlib.crc32 over each chunk (both release the GIL), then posix_fadvise(DONTNEED) "so that the scrub does
not evict the training data": every pass reads the shards from storage again. It reads flat out the whole run (a
sequential read of the local disk, ~1 GB/s or more, and a CPU's worth of crc32 at most), yet shares nothing with the
loop: no lock, no queue, not the training file (never dropped), and the job has CPUs 2-4 for its three busy threads
(main, autograd, shard_verify). 4 s of the job alone first (the thread not started), then 20 s beside it (smaller
with --device cpu: 64-128-128-128-10, batch 512, shards of 32 MB).

The script measures itself: the steps per second alone and beside the scrub (`with_over_alone`; the run's time beyond
its steps at the rate alone, `verify_overhead_s`); the main thread's time queueing the step (`issue_s`, within it
loss.backward(): `backward_s`), gathering, pinning and queueing the copy of the next batch (`batch_s`) and in
loss.item() (`item_s`); its time on a CPU and waiting for one (schedstat) over the run; every thread's CPU time and
run-queue wait (truth `threads`), PyTorch's autograd thread's apart (truth `autograd`); the process's minor and major
page faults; the device allocator's cudaMalloc calls and the pinned host allocator's cudaHostAlloc calls; a step's
GPU time (queued behind a spin: common.gpu_seconds_queued, the forward, backward and AdamW on a batch already on the
GPU, nothing read back; failing that, CUDA events around 10 steps queued back to back; failing that, the host's clock
around them: truth `gpu_time_method`), so that the GPU's busy share is known; and the scrub's passes and bytes, its
time in readinto() and in crc32, its CPU time and run-queue wait (schedstat) and the bytes it read from storage (its
/proc/self/task/TID/io read_bytes: zero where the folder is not on a disk and the scrub reads the page cache).
Truth `decoys` and `shard_verify` name the thread (pid, tid, comm, span); it is no culprit: the job is GPU-bound and
the scrub takes nothing the loop needs."""

import os
import resource
import shutil
import sys
import tempfile
import threading
import time
import zlib

from common import Scenario, comm_of, gpu_seconds_queued, set_thread_name, tids_of

sc = Scenario("natural_healthy_shard_verify_thread", "natural", "a GPU-bound MLP (batch 8192 gathered from a "
              "page-cached memmap, pinned, loss.item() each step) whose process scrubs its 4 x 128 MB dataset shards "
              "in a thread shard_verify (readinto + crc32, fadvise DONTNEED after each: storage reads flat out) on the "
              "job's CPUs 2-4, 20 s, nothing staged: a control", job_cpus=[2, 3, 4], control=True)
import numpy as np  # noqa: E402
import torch  # noqa: E402

nn = torch.nn
F = nn.functional
PID, MAIN = os.getpid(), threading.get_native_id()
dev = torch.device(sc.device)
if sc.cuda:
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
IN_DIM, ROWS, CLASSES = 512, 65536, 10
WIDTH, DEPTH, BATCH, SHARD_MB = (4096, 3, 8192, 128) if sc.cuda else (128, 3, 512, 32)
NSHARDS, CHUNK = 4, 8 << 20
DATA_DIR = tempfile.mkdtemp(prefix="zoo_scrub_", dir="/var/tmp" if os.path.isdir("/var/tmp") else None)
KEYS = ("issue_s", "backward_s", "batch_s", "item_s")
own = {"steps": 0, **dict.fromkeys(KEYS, 0.0), "running_loss": 0.0}
ver = {"passes": 0, "shards": 0, "bytes": 0, "read_s": 0.0, "crc_s": 0.0, "fadvise_s": 0.0, "mismatches": 0,
       "tid": None}
stop = threading.Event()


def write_data() -> tuple[str, str, list[tuple[str, int]]]:
    """The training features (float16 .npy) and labels, and NSHARDS record shards with their crc32 (the manifest),
    all written and fsynced."""
    rng = np.random.default_rng(0)
    centroids = rng.standard_normal((CLASSES, IN_DIM)).astype(np.float32)
    y = rng.integers(0, CLASSES, ROWS)
    x = (centroids[y] + 1.5 * rng.standard_normal((ROWS, IN_DIM), dtype=np.float32)).astype(np.float16)
    feat, lab = os.path.join(DATA_DIR, "train_features.npy"), os.path.join(DATA_DIR, "train_labels.npy")
    np.save(feat, x)
    np.save(lab, y.astype(np.int64))
    manifest = []
    for k in range(NSHARDS):
        path = os.path.join(DATA_DIR, f"shard_{k}.bin")
        blob = rng.bytes(SHARD_MB << 20)  # records as stored: compressed, random-looking bytes
        with open(path, "wb") as fh:
            fh.write(blob)
            fh.flush()
            os.fsync(fh.fileno())
        manifest.append((path, zlib.crc32(blob)))
    for p in (feat, lab):
        fd = os.open(p, os.O_RDONLY)
        os.fsync(fd)
        os.close(fd)
    return feat, lab, manifest


def verify_loop(manifest: list[tuple[str, int]]) -> None:
    """Scrub the shards against the manifest, over and over: read each in CHUNK pieces with a running crc32, then
    drop it from the page cache."""
    set_thread_name("shard_verify")
    ver["tid"] = threading.get_native_id()
    buf = bytearray(CHUNK)
    mv = memoryview(buf)
    while not stop.is_set():
        for path, want in manifest:
            if stop.is_set():
                break
            fd = os.open(path, os.O_RDONLY)
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_SEQUENTIAL)
                crc = 0
                while True:
                    t0 = time.perf_counter()
                    n = os.readv(fd, [buf])
                    t1 = time.perf_counter()
                    if n <= 0:
                        break
                    crc = zlib.crc32(mv[:n], crc)
                    ver["read_s"] += t1 - t0
                    ver["crc_s"] += time.perf_counter() - t1
                    ver["bytes"] += n
                t0 = time.perf_counter()
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)  # not to evict the training data
                ver["fadvise_s"] += time.perf_counter() - t0
            finally:
                os.close(fd)
            ver["shards"] += 1
            ver["mismatches"] += crc != want
        ver["passes"] += 1


def mlp() -> nn.Module:
    layers = [nn.Linear(IN_DIM, WIDTH), nn.ReLU()]
    for _ in range(DEPTH):
        layers += [nn.Linear(WIDTH, WIDTH), nn.ReLU()]
    return nn.Sequential(*layers, nn.Linear(WIDTH, CLASSES))


def schedstat(pid: int, tid: int) -> tuple[float, float] | None:
    try:
        with open(f"/proc/{pid}/task/{tid}/schedstat") as fh:
            run, wait = fh.read().split()[:2]
        return int(run) / 1e9, int(wait) / 1e9
    except (OSError, ValueError):
        return None


def task_io(tid: int) -> dict | None:
    try:
        with open(f"/proc/{PID}/task/{tid}/io") as fh:
            return {k: int(v) for k, v in (line.split(": ") for line in fh.read().splitlines())}
    except (OSError, ValueError):
        return None


def process_schedstat() -> dict[int, tuple[float, float]]:
    return {t: s for t in tids_of(PID) if (s := schedstat(PID, t))}


def allocs() -> tuple[int, int | None]:
    """(the device allocator's cudaMalloc calls, the pinned host allocator's cudaHostAlloc calls) so far."""
    if not sc.cuda:
        return 0, None
    try:
        host = int(torch.cuda.host_memory_stats().get("num_host_alloc", 0))
    except (RuntimeError, AttributeError):
        host = None
    return int(torch.cuda.memory_stats().get("segment.all.allocated", 0)), host


t_set = time.perf_counter()
feat_path, lab_path, manifest = write_data()
write_s = time.perf_counter() - t_set
features = np.load(feat_path, mmap_mode="r")
labels_all = np.load(lab_path)
warm = int(np.asarray(features).view(np.uint8).sum(dtype=np.uint64))  # read once: in the page cache
torch.manual_seed(0)
model = mlp().to(dev)
opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.01, fused=sc.cuda or None)
NPARAM = sum(p.numel() for p in model.parameters())
sampler = np.random.default_rng(3)


def get_batch() -> tuple[torch.Tensor, torch.Tensor]:
    """BATCH random rows of the memmap (sorted, as a gather reads them best), pinned, copied without waiting."""
    t0 = time.perf_counter()
    idx = np.sort(sampler.integers(0, ROWS, BATCH))
    x = torch.from_numpy(features[idx])
    y = torch.from_numpy(labels_all[idx])
    if sc.cuda:
        x, y = x.pin_memory().to(dev, non_blocking=True), y.pin_memory().to(dev, non_blocking=True)
    own["batch_s"] += time.perf_counter() - t0
    return x, y


def train(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    t0 = time.perf_counter()
    loss = F.cross_entropy(model(x.float()), y)
    opt.zero_grad(set_to_none=True)
    t1 = time.perf_counter()
    loss.backward()
    t2 = time.perf_counter()
    opt.step()
    own["backward_s"] += t2 - t1
    own["issue_s"] += (t1 - t0) + (time.perf_counter() - t2)
    return loss


nxt: dict = {}


def step() -> None:
    x, y = nxt.pop("xy", None) or get_batch()
    loss = train(x, y)
    nxt["xy"] = get_batch()  # the next batch while the GPU runs this step
    t = time.perf_counter()
    own["running_loss"] += loss.item()
    own["item_s"] += time.perf_counter() - t
    own["steps"] += 1
    if own["steps"] % 100 == 0:
        print(f"step {own['steps']}: loss {own['running_loss'] / own['steps']:.4f}", flush=True)


def sync() -> None:
    if sc.cuda:
        torch.cuda.synchronize()


def reset() -> None:
    for k in own:
        own[k] = 0 if k == "steps" else 0.0


def gpu_step_seconds() -> tuple[float | None, str | None]:
    """A step's GPU time (forward, backward, AdamW on a batch already on the GPU; nothing read back): queued behind a
    spin (the median of five), else CUDA events around 10 steps queued back to back, else the host's clock."""
    if not sc.cuda:
        return None, None
    xy = get_batch()
    runs = sorted(r for r in (gpu_seconds_queued(torch, lambda _: train(*xy)) for _ in range(5)) if r is not None)
    if runs:
        return runs[len(runs) // 2], "queued"
    k = 10
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    t = time.perf_counter()
    start.record()
    for _ in range(k):
        train(*xy)
    end.record()
    end.synchronize()
    host = (time.perf_counter() - t) / k
    try:
        ms = start.elapsed_time(end)
    except RuntimeError:
        ms = None
    if ms is not None and ms > 0:
        return ms / 1e3 / k, "events"
    return host, "host_clock"


th = threading.Thread(target=verify_loop, args=(manifest,), name="shard_verify", daemon=True)
try:
    for _ in range(10):  # warm-up: cuBLAS, the allocator, the pinned pool, the autograd thread
        step()
    sync()
    gpu_step_s, gpu_method = gpu_step_seconds()
    warm_end = time.perf_counter() + 1.0 * sc.scale  # the spin kernels well before the job's steps are timed alone
    while time.perf_counter() < warm_end:
        step()
    sync()
    # the job alone
    n0 = own["steps"]
    sc.mark("alone")
    t = time.perf_counter()
    sc.run_for(4.0 * sc.scale, step)
    sync()
    alone_wall = time.perf_counter() - t
    alone_rate = (own["steps"] - n0) / alone_wall
    th.start()
    started = sc.mark("shard_verify")
    settle_end = time.perf_counter() + 1.5 * sc.scale  # the scrub under way (its first reads, the readahead)
    while time.perf_counter() < settle_end:
        step()
    sync()
    reset()
    vtid = ver["tid"]
    v_comm = comm_of(PID, vtid) if vtid else None
    job0 = process_schedstat()
    io0 = task_io(vtid) if vtid else None
    v0 = dict(ver)
    r0, (m0, h0) = resource.getrusage(resource.RUSAGE_SELF), allocs()
    b0 = sc.mark("baseline")
    t = time.perf_counter()
    sc.run_for(10.0 * sc.scale, step)
    mid = sc.mark("half")
    sc.run_for(10.0 * sc.scale, step)
    sync()
    b1 = sc.mark("end")
    wall = time.perf_counter() - t
    job1 = process_schedstat()
    io1 = task_io(vtid) if vtid else None
    v1 = dict(ver)
    r1, (m1, h1) = resource.getrusage(resource.RUSAGE_SELF), allocs()
    alive = th.is_alive()
    setup_s = time.perf_counter() - t_set - wall
finally:
    stop.set()
    if th.is_alive():
        th.join(timeout=10)
    shutil.rmtree(DATA_DIR, ignore_errors=True)
n = own["steps"]


def r4(v: float | None) -> float | None:
    return round(v, 4) if v is not None else None


def share(v: float | None) -> float | None:
    return round(v / wall, 4) if v is not None else None


def delta_s(tid: int | None, k: int) -> float | None:
    if tid is None or tid not in job1:
        return None
    return round(job1[tid][k] - (job0.get(tid) or (0.0, 0.0))[k], 4)


names = {tid: comm_of(PID, tid) for tid in job1}
autograd = next(({"pid": PID, "tid": tid, "comm": c} for tid, c in sorted(names.items())
                 if (c or "").startswith("pt_autograd")), None)
atid = autograd["tid"] if autograd else None
main_run, main_wait = delta_s(MAIN, 0), delta_s(MAIN, 1)
ag_run, ag_wait = delta_s(atid, 0), delta_s(atid, 1)
v_run, v_wait = delta_s(vtid, 0), delta_s(vtid, 1)
others = [tid for tid in job1 if tid not in (MAIN, atid, vtid)]
others_run = round(sum(delta_s(tid, 0) or 0.0 for tid in others), 4)
others_wait = round(sum(delta_s(tid, 1) or 0.0 for tid in others), 4)
main_asleep = max(0.0, wall - main_run - main_wait) if main_run is not None and main_wait is not None else None
gpu_busy = n * gpu_step_s if gpu_step_s is not None else None
at_alone = n / alone_rate if alone_rate else None
overhead = max(0.0, wall - at_alone) if at_alone is not None else None
v_bytes = v1["bytes"] - v0["bytes"]
v_disk = (io1["read_bytes"] - io0["read_bytes"]) if io0 and io1 else None
v_rchar = (io1["rchar"] - io0["rchar"]) if io0 and io1 else None
decoy = {"what": "shard_verify: a thread of the job's process scrubbing the dataset's shards (readinto + crc32, "
                 "posix_fadvise DONTNEED after each: storage reads flat out)",
         "pid": PID, "tid": vtid, "tids": [vtid] if vtid else [], "comm": v_comm, "name": "shard_verify",
         "cpus": sc.host_cpus["job"], "cpus_used_here": sc.job_cpus, "span_ns": [started, b1], "alive_at_end": alive,
         "run_s": v_run, "cpu_wait_s": v_wait, "bytes_read": v_bytes, "disk_read_bytes": v_disk}
sc.extra["decoys"] = [decoy]
sc.extra["shard_verify"] = {**decoy, "shards": [os.path.basename(p) for p, _ in manifest], "shard_mb": SHARD_MB,
                            "chunk_mb": CHUNK >> 20, "folder": DATA_DIR,
                            "calls": ["os.readv", "zlib.crc32", "os.posix_fadvise"], "file": os.path.basename(__file__),
                            "function": "verify_loop"}
sc.extra["autograd"] = autograd
sc.extra["threads"] = [{"tid": tid, "comm": names[tid], "run_s": delta_s(tid, 0), "cpu_wait_s": delta_s(tid, 1)}
                       for tid in sorted(names)]
sc.extra["self"] = {**{k: round(v, 4) if isinstance(v, float) else v for k, v in own.items()},
                    "wall_s": round(wall, 4), "steps_per_s": round(n / wall, 2),
                    "steps_per_s_alone": round(alone_rate, 2),
                    "with_over_alone": round(n / wall / alone_rate, 4) if alone_rate else None,
                    "at_alone_rate_s": r4(at_alone), "verify_overhead_s": r4(overhead),
                    "verify_overhead_share": share(overhead),
                    "step_ms_mean": round(wall / max(n, 1) * 1e3, 4),
                    "issue_share": share(own["issue_s"]), "backward_share": share(own["backward_s"]),
                    "batch_share": share(own["batch_s"]), "item_share": share(own["item_s"]),
                    "main_run_s": main_run, "main_cpu_share": share(main_run),
                    "main_cpu_wait_s": main_wait, "main_cpu_wait_share": share(main_wait),
                    "main_asleep_s": r4(main_asleep), "main_asleep_share": share(main_asleep),
                    "autograd_run_s": ag_run, "autograd_cpu_share": share(ag_run),
                    "autograd_cpu_wait_s": ag_wait, "autograd_cpu_wait_share": share(ag_wait),
                    "other_threads_run_s": others_run, "other_threads_cpu_wait_s": others_wait,
                    "minor_faults_per_s": round((r1.ru_minflt - r0.ru_minflt) / wall, 1),
                    "major_faults": r1.ru_majflt - r0.ru_majflt,
                    "cuda_mallocs_per_s": round((m1 - m0) / wall, 3),
                    "host_allocs_per_s": round((h1 - h0) / wall, 3) if h0 is not None and h1 is not None else None,
                    "gpu_step_ms": round(gpu_step_s * 1e3, 4) if gpu_step_s is not None else None,
                    "gpu_time_method": gpu_method,
                    "gpu_busy_s": r4(gpu_busy), "gpu_busy_share": share(gpu_busy),
                    "verify_run_s": v_run, "verify_cpu_share": share(v_run),
                    "verify_cpu_wait_s": v_wait, "verify_cpu_wait_share": share(v_wait),
                    "verify_passes": v1["passes"] - v0["passes"], "verify_shards": v1["shards"] - v0["shards"],
                    "verify_bytes": v_bytes, "verify_mb_per_s": round(v_bytes / wall / 1e6, 1),
                    "verify_read_s": round(v1["read_s"] - v0["read_s"], 4),
                    "verify_read_share": share(v1["read_s"] - v0["read_s"]),
                    "verify_crc_s": round(v1["crc_s"] - v0["crc_s"], 4),
                    "verify_disk_read_bytes": v_disk, "verify_rchar": v_rchar,
                    "verify_disk_share": round(v_disk / v_rchar, 4) if v_disk is not None and v_rchar else None,
                    "verify_mismatches": v1["mismatches"], "verify_shares_job_cpus": True,
                    "job_cpus": len(sc.job_cpus), "write_s": round(write_s, 3), "setup_s": round(setup_s, 3),
                    "params_m": round(NPARAM / 1e6, 2), "batch": BATCH, "width": WIDTH,
                    "mean_loss": round(own["running_loss"] / max(n, 1), 4), "python": sys.version.split()[0]}
if not sc.cuda:
    sc.note("a tiny model on the CPU: no GPU timings, no allocator counters, no pinning; the job is not GPU-bound "
            "there.")
if gpu_method not in (None, "queued"):
    sc.note(f"the step's GPU time measured by {gpu_method} (the queued measure failed): an upper bound.")
sc.note(f"natural, a control: measured by the script: alone {alone_rate:.2f} steps/s; beside the shard_verify thread "
        f"({v_bytes / 1e6:.0f} MB read in the run, {v_disk if v_disk is None else round(v_disk / 1e6)} MB of it from "
        f"storage; {v_run} s on a CPU) {n} steps ({n / wall:.2f}/s) in {wall:.2f} s (its cost "
        f"{overhead and round(overhead, 2)} s): {own['issue_s']:.2f} s queueing the steps, {own['batch_s']:.2f} s "
        f"making the next batch, {own['item_s']:.2f} s in .item(); the main thread ran {main_run} s, waited for a CPU "
        f"{main_wait} s; "
        + (f"a step's kernels take {gpu_step_s * 1e3:.2f} ms of GPU time ({gpu_method}; GPU busy {gpu_busy / wall:.0%} "
           "of the run)." if gpu_busy is not None else "no GPU timings (no CUDA)."))
sc.write_truth(baseline=(b0, b1), window=None, ratio_spans=((b0, mid), (mid, b1)))
