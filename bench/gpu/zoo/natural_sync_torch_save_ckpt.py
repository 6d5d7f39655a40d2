"""natural_sync_torch_save_ckpt (natural, nothing staged): a training loop that checkpoints the way a first trainer
does: every 4 s of training (the step count from the rate at start-up) the main thread copies the model's and the
optimiser's state to the host (a recursive .cpu() of every tensor of {"model": model.state_dict(), "optimizer":
opt.state_dict(), "step": i}: pageable device-to-host copies) and torch.save()s it to `last.pt.tmp` in a folder on
local disk (ZOO_CKPT_DIR, default /var/tmp; not /dev/shm), then os.replace()s it over `last.pt` (one checkpoint kept:
the disk use stays bounded); no fsync, the training waits for all of it. The model: the zoo's MLP (common.Trainer) made
larger: 1024 inputs, a layer to 4096, four 4096x4096 layers and 10 classes (~71M parameters, 286 MB in fp32; with
AdamW's two moments ~0.86 GB of state), batches of 4096 already on the GPU, fp32 without TF32, fused AdamW,
loss.item() each step (Trainer's smaller MLP with --device cpu). CPUs 2-3, 20 s.

The script measures itself: the steps per second; each checkpoint's span (truth `saves_ns`), its time in the copies to
the host and in torch.save (the pickling and write) and os.replace, their CPU time (thread_time) and the main thread's
schedstat in them and in the write alone (on a CPU, waiting for one: the rest asleep, in the copies' waits or the
writes); the checkpoints
written, the bytes written (the file's size) and the filesystem the folder is on; the main thread's schedstat, the
process's page faults over the run, cudaMalloc calls, and a step's GPU time queued (common.gpu_seconds_queued), so
that the GPU's busy share is known."""

import os
import resource
import shutil
import tempfile
import time

from common import Scenario, Trainer, gpu_seconds_queued

sc = Scenario("natural_sync_torch_save_ckpt", "natural", "a 71M-parameter MLP (0.86 GB with AdamW's state) copied to "
              "the host and torch.save()d to local disk by the main thread every 4 s, 20 s, nothing staged",
              job_cpus=[2, 3], control=True)
tr = Trainer(sc, width=4096, batch=4096, in_dim=1024, depth=4)
torch = tr.torch
EVERY_S = 4.0
CKPT_DIR = tempfile.mkdtemp(prefix="zoo_ckpt_", dir=os.environ.get("ZOO_CKPT_DIR", "/var/tmp"))
PATH = os.path.join(CKPT_DIR, "last.pt")


def fs_of(path: str) -> str:
    """The filesystem type of the mount that holds `path` (the longest mount point that is a prefix of it)."""
    best, kind = "", "?"
    try:
        with open("/proc/mounts") as fh:
            for line in fh:
                parts = line.split()
                mnt = parts[1]
                if (path == mnt or path.startswith(mnt.rstrip("/") + "/")) and len(mnt) >= len(best):
                    best, kind = mnt, parts[2]
    except OSError:
        pass
    return kind


def schedstat() -> tuple[int, int]:
    try:
        with open("/proc/thread-self/schedstat") as fh:
            run, wait = fh.read().split()[:2]
        return int(run), int(wait)
    except (OSError, ValueError):
        return (0, 0)


def cuda_mallocs() -> int:
    return int(torch.cuda.memory_stats().get("segment.all.allocated", 0)) if sc.cuda else 0


def to_cpu(obj):
    """The state with every tensor copied to the host (dicts and lists walked)."""
    if isinstance(obj, torch.Tensor):
        return obj.detach().cpu()
    if isinstance(obj, dict):
        return {k: to_cpu(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(to_cpu(v) for v in obj)
    return obj


saves = {"n": 0, "copy_s": 0.0, "save_s": 0.0, "replace_s": 0.0, "cpu_s": 0.0, "run_s": 0.0, "wait_s": 0.0,
         "write_run_s": 0.0, "write_wait_s": 0.0, "bytes": 0, "measure": False}
spans: list[list[int]] = []


def save_checkpoint(step_i: int) -> None:
    t0, c0, s0, ns0 = time.perf_counter(), time.thread_time(), schedstat(), time.time_ns()
    state = to_cpu({"model": tr.model.state_dict(), "optimizer": tr.opt.state_dict(), "step": step_i})
    t1, s1 = time.perf_counter(), schedstat()
    torch.save(state, PATH + ".tmp")
    t2 = time.perf_counter()
    os.replace(PATH + ".tmp", PATH)
    t3, c3, s3 = time.perf_counter(), time.thread_time(), schedstat()
    if saves["measure"]:
        saves["n"] += 1
        saves["copy_s"] += t1 - t0
        saves["save_s"] += t2 - t1
        saves["replace_s"] += t3 - t2
        saves["cpu_s"] += c3 - c0
        saves["run_s"] += (s3[0] - s0[0]) / 1e9
        saves["wait_s"] += (s3[1] - s0[1]) / 1e9
        saves["write_run_s"] += (s3[0] - s1[0]) / 1e9  # torch.save and os.replace
        saves["write_wait_s"] += (s3[1] - s1[1]) / 1e9
        saves["bytes"] += os.path.getsize(PATH)
        spans.append([ns0, time.time_ns()])


tr.warmup(20)
t_rate = time.perf_counter()
for _ in range(30):
    tr.step()
rate = 30 / (time.perf_counter() - t_rate)
every = max(int(rate * EVERY_S * (1.0 if sc.cuda else sc.scale)), 5)
save_checkpoint(tr.i)  # the first save: the file's pages, the host allocator's first buffers
gpu_step_s = None
if sc.cuda:
    tr.sync()

    def work(_) -> None:
        """One step's GPU work, nothing read back."""
        x, y = tr.xs[0], tr.ys[0]
        tr.loss_fn(tr.model(x), y).backward()
        tr.opt.step()
        tr.opt.zero_grad(set_to_none=True)

    runs = sorted(r for r in (gpu_seconds_queued(torch, work) for _ in range(5)) if r is not None)
    gpu_step_s = runs[len(runs) // 2] if runs else None
own = {"steps": 0, "step_s": 0.0}


def step() -> None:
    t0 = time.perf_counter()
    tr.step()
    own["step_s"] += time.perf_counter() - t0
    own["steps"] += 1
    if tr.i % every == 0:
        save_checkpoint(tr.i)


warm_end = time.perf_counter() + 2.0 * sc.scale  # the spin kernels well before the baseline
while time.perf_counter() < warm_end:
    tr.step()
tr.sync()
try:
    saves["measure"] = True
    main0 = schedstat()
    f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    m0 = cuda_mallocs()
    b0 = sc.mark("baseline")
    t = time.perf_counter()
    sc.run_for(10.0 * sc.scale, step)
    mid = sc.mark("half")
    sc.run_for(10.0 * sc.scale, step)
    tr.sync()
    b1 = sc.mark("end")
    wall = time.perf_counter() - t
    saves["measure"] = False
    main1 = schedstat()
    f1 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    m1 = cuda_mallocs()
    fs = fs_of(CKPT_DIR)
finally:
    shutil.rmtree(CKPT_DIR, ignore_errors=True)
n = own["steps"]
ns = max(saves["n"], 1)
total_s = saves["copy_s"] + saves["save_s"] + saves["replace_s"]
gpu_busy = n * gpu_step_s if gpu_step_s is not None else None
main_run, main_wait = (main1[0] - main0[0]) / 1e9, (main1[1] - main0[1]) / 1e9
state_mb = sum(p.numel() * p.element_size() for p in tr.model.parameters()) * 3 / 2 ** 20


def share(v: float | None) -> float | None:
    return round(v / wall, 4) if v is not None else None


sc.extra["saves_ns"] = spans
sc.extra["self"] = {**{k: round(v, 4) for k, v in own.items()}, "wall_s": round(wall, 4),
                    "steps_per_s": round(n / wall, 2), "checkpoints": saves["n"], "save_every_steps": every,
                    "ckpt_copy_s": round(saves["copy_s"], 4), "ckpt_torch_save_s": round(saves["save_s"], 4),
                    "ckpt_replace_s": round(saves["replace_s"], 4), "ckpt_s": round(total_s, 4),
                    "ckpt_share": share(total_s), "ckpt_copy_share": share(saves["copy_s"]),
                    "ckpt_torch_save_share": share(saves["save_s"]),
                    "ckpt_cpu_s": round(saves["cpu_s"], 4), "ckpt_run_s": round(saves["run_s"], 4),
                    "ckpt_cpu_wait_s": round(saves["wait_s"], 4),
                    "ckpt_off_cpu_s": round(max(total_s - saves["run_s"] - saves["wait_s"], 0.0), 4),
                    "write_run_s": round(saves["write_run_s"], 4), "write_cpu_wait_s": round(saves["write_wait_s"], 4),
                    "write_off_cpu_s": round(max(saves["save_s"] + saves["replace_s"] - saves["write_run_s"]
                                                 - saves["write_wait_s"], 0.0), 4),
                    "ckpt_ms_mean": round(total_s / ns * 1e3, 2), "bytes_written": saves["bytes"],
                    "ckpt_mb": round(saves["bytes"] / ns / 2 ** 20, 1), "state_mb": round(state_mb, 1),
                    "write_mb_per_s": round(saves["bytes"] / 2 ** 20 / saves["save_s"], 1) if saves["save_s"] else None,
                    "ckpt_dir": CKPT_DIR, "ckpt_fs": fs,
                    "main_run_s": round(main_run, 4), "main_cpu_share": share(main_run),
                    "main_cpu_wait_s": round(main_wait, 4), "main_cpu_wait_share": share(main_wait),
                    "minor_faults_per_s": round((f1 - f0) / wall, 1), "cuda_mallocs_per_s": round((m1 - m0) / wall, 3),
                    "gpu_step_ms": round(gpu_step_s * 1e3, 4) if gpu_step_s is not None else None,
                    "gpu_busy_s": round(gpu_busy, 4) if gpu_busy is not None else None,
                    "gpu_busy_share": share(gpu_busy), "batch": tr.batch}
sc.note(f"natural: measured by the script: {n} steps ({n / wall:.1f}/s) in {wall:.2f} s; {saves['n']} checkpoints "
        f"every {every} steps ({saves['bytes'] / 2 ** 20:.0f} MB written to {CKPT_DIR}, {fs}): {saves['copy_s']:.2f} s "
        f"copying the state to the host, {saves['save_s']:.2f} s in torch.save, {saves['replace_s']:.3f} s in "
        f"os.replace ({saves['run_s']:.2f} s of it on a CPU); "
        + (f"a step's kernels take {gpu_step_s * 1e3:.2f} ms of GPU time queued (GPU busy {gpu_busy / wall:.0%} of the "
           "run)." if gpu_busy is not None else "no GPU timings (no CUDA)."))
sc.write_truth(baseline=(b0, b1), window=None, ratio_spans=((b0, mid), (mid, b1)))
