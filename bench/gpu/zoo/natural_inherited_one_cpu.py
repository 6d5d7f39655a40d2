"""natural_inherited_one_cpu (natural, nothing staged): an image classifier whose launcher left it ONE CPU: the job is
given CPUs 2-3, but a wrapper narrows its CPU affinity to a single CPU before training starts, as a mis-set
`srun --cpu-bind` or a container's cpuset does. The script does that itself at its start, standing in for the wrapper:
os.sched_setaffinity(0, {2}) on the main thread before torch is imported (so every thread and process it makes
inherits it). It then trains as written for a machine with CPUs to spare: DataLoader(batch_size=64, shuffle=True,
num_workers=3, persistent_workers=True, drop_last=True) over a map-style Dataset of a pool of 256 uint8 images
(3x144x144) whose __getitem__ does moderate numpy work (a random 128x128 crop, a random flip, to float32, a gamma and
a per-channel gain, a blur of three 3x3 box passes, sensor noise, back to uint8); the three workers inherit the one
CPU. The uint8 batch is copied to the GPU (non_blocking, from the worker's shared memory) and normalised there; a small
conv net (four strided 3x3 convolutions with BatchNorm, bf16 autocast, SGD with momentum), loss.item() each step. 20 s.

The script measures itself: the CPU affinity in force on the main thread (os.sched_getaffinity) and in each worker
(its worker_init_fn writes its pid and affinity to a file), the steps per second; the main thread's time in next()
(waiting for a batch: wall and its CPU clock), in the copy and in the step; each worker's CPU time and run-queue wait
over the run (the sum over its tasks' schedstat) and its minor page faults, its samples and their time (the worker's
clocks, summed in shared memory); the main thread's time on a CPU and waiting for one over the run (schedstat); the
process's minor page faults and the device allocator's cudaMalloc calls; and a step's GPU time queued from a batch
already on the GPU (common.gpu_seconds_queued), so that the GPU's busy share is known. Truth `workers` names the worker
processes (pid, tids, comm, affinity)."""

import functools
import multiprocessing
import os
import resource
import shutil
import tempfile
import time

import numpy as np

from common import Scenario, comm_of, gpu_seconds_queued, tids_of

NIMG, SIDE, CROP, NCLASS, WORKERS = 256, 144, 128, 100, 3
STATS = multiprocessing.RawArray("d", 3 * WORKERS)  # per worker: samples, __getitem__ wall, __getitem__ CPU


def note_worker(folder: str, worker_id: int) -> None:
    """worker_init_fn: the worker's pid and the CPUs it may run on, in `folder`."""
    cpus = sorted(os.sched_getaffinity(0))
    with open(os.path.join(folder, f"w{worker_id}.tmp"), "w") as fh:
        fh.write(f"{os.getpid()} {','.join(map(str, cpus))}\n")
    os.replace(os.path.join(folder, f"w{worker_id}.tmp"), os.path.join(folder, f"w{worker_id}"))


class AugmentedImages:
    """Map-style: sample i is pool image i % NIMG, cropped, flipped, colour-jittered, blurred and noised, as uint8."""

    def __init__(self) -> None:
        rng = np.random.default_rng(0)
        self.images = rng.integers(0, 256, (NIMG, 3, SIDE, SIDE), dtype=np.uint8)
        self.labels = rng.integers(0, NCLASS, NIMG)
        self.rng = None
        self.stats = STATS  # handed to the workers with the dataset (shared memory)

    def __len__(self) -> int:
        return NIMG * 1000

    def __getitem__(self, i: int):
        import torch

        t0, c0 = time.perf_counter(), time.thread_time()
        info = torch.utils.data.get_worker_info()
        if self.rng is None:
            self.rng = np.random.default_rng(1000 + (info.id if info else 0))
        rng = self.rng
        top, left = rng.integers(0, SIDE - CROP + 1, 2)
        x = self.images[i % NIMG, :, top:top + CROP, left:left + CROP]
        if rng.random() < 0.5:
            x = x[:, :, ::-1]
        x = x.astype(np.float32) * np.float32(1 / 255)
        x **= np.float32(rng.uniform(0.7, 1.4))
        x *= rng.uniform(0.8, 1.2, (3, 1, 1)).astype(np.float32)
        for _ in range(3):
            c = x[:, 1:-1, 1:-1]
            x[:, 1:-1, 1:-1] = (x[:, :-2, 1:-1] + x[:, 2:, 1:-1] + x[:, 1:-1, :-2] + x[:, 1:-1, 2:] + c) * 0.2
        x += rng.standard_normal(x.shape, dtype=np.float32) * np.float32(0.02)
        out = (np.clip(x, 0.0, 1.0) * 255).astype(np.uint8)
        w = info.id if info else 0
        self.stats[3 * w] += 1
        self.stats[3 * w + 1] += time.perf_counter() - t0
        self.stats[3 * w + 2] += time.thread_time() - c0
        return torch.from_numpy(out), int(self.labels[i % NIMG])


def schedstat(path: str) -> tuple[float, float] | None:
    try:
        with open(path) as fh:
            run, wait = fh.read().split()[:2]
        return int(run) / 1e9, int(wait) / 1e9
    except (OSError, ValueError):
        return None


def minflt(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return int(fh.read().rsplit(")", 1)[1].split()[7])
    except (OSError, ValueError, IndexError):
        return None


def process_schedstat(pid: int) -> tuple[float, float]:
    got = [s for s in (schedstat(f"/proc/{pid}/task/{t}/schedstat") for t in tids_of(pid)) if s]
    return sum(s[0] for s in got), sum(s[1] for s in got)


if __name__ == "__main__":
    sc = Scenario("natural_inherited_one_cpu", "natural", "a conv net fed by a 3-worker DataLoader doing numpy "
                  "augmentations, the whole job narrowed at its start to ONE CPU (as a mis-set srun --cpu-bind or "
                  "cpuset does): workers and main thread share it, 20 s, nothing staged", job_cpus=[2, 3],
                  control=True)
    ONE = sc.job_cpus[0]
    os.sched_setaffinity(0, {ONE})  # the launcher wrapper's narrowing (what the job inherits)
    main_cpus = sorted(os.sched_getaffinity(0))
    import torch

    dev = torch.device(sc.device)
    BATCH, WIDTHS = (64, (32, 64, 128, 256)) if sc.cuda else (16, (8, 16, 32, 32))
    MEAN = torch.tensor([0.485, 0.456, 0.406], device=dev).view(1, 3, 1, 1) * 255
    STD = torch.tensor([0.229, 0.224, 0.225], device=dev).view(1, 3, 1, 1) * 255
    folder = tempfile.mkdtemp(prefix="zoo_one_cpu_")
    nn = torch.nn
    layers, cin = [], 3
    for w in WIDTHS:
        layers += [nn.Conv2d(cin, w, 3, 2, 1, bias=False), nn.BatchNorm2d(w), nn.ReLU(inplace=True)]
        cin = w
    torch.manual_seed(0)
    model = nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(cin, NCLASS)).to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    loader = torch.utils.data.DataLoader(AugmentedImages(), batch_size=BATCH, shuffle=True, num_workers=WORKERS,
                                         persistent_workers=True, drop_last=True,
                                         worker_init_fn=functools.partial(note_worker, folder),
                                         generator=torch.Generator().manual_seed(0))

    def train_step(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        x = (x.float() - MEAN) / STD
        with torch.autocast(sc.device, dtype=torch.bfloat16, enabled=sc.cuda):
            loss = nn.functional.cross_entropy(model(x).float(), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        return loss

    own = {"steps": 0, "next_s": 0.0, "next_cpu_s": 0.0, "copy_s": 0.0, "step_s": 0.0}
    it = None
    try:
        it = iter(loader)

        def step() -> None:
            t0, c0 = time.perf_counter(), time.thread_time()
            x, y = next(it)
            t1, c1 = time.perf_counter(), time.thread_time()
            x, y = x.to(dev, non_blocking=True), y.to(dev, non_blocking=True)
            t2 = time.perf_counter()
            train_step(x, y).item()
            t3 = time.perf_counter()
            own["next_s"] += t1 - t0
            own["next_cpu_s"] += c1 - c0
            own["copy_s"] += t2 - t1
            own["step_s"] += t3 - t2
            own["steps"] += 1

        for _ in range(10):  # warm-up: the workers started, cuDNN's choices
            step()
        wpids = [w.pid for w in it._workers]
        gpu_step_s = None
        if sc.cuda:
            bx, by = next(it)
            gx, gy = bx.to(dev), by.to(dev)
            runs = sorted(r for r in (gpu_seconds_queued(torch, lambda _: train_step(gx, gy)) for _ in range(5))
                          if r is not None)
            gpu_step_s = runs[len(runs) // 2] if runs else None
            torch.cuda.synchronize()
        warm_end = time.perf_counter() + 2.0 * sc.scale  # the spin kernels well before the run
        while time.perf_counter() < warm_end:
            step()
        if sc.cuda:
            torch.cuda.synchronize()
        for k in own:
            own[k] = 0 if k == "steps" else 0.0
        s0 = list(STATS)
        main0 = schedstat("/proc/thread-self/schedstat")
        work0 = {p: process_schedstat(p) for p in wpids}
        wf0 = {p: minflt(p) for p in wpids}
        f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        m0 = int(torch.cuda.memory_stats().get("segment.all.allocated", 0)) if sc.cuda else 0
        b0 = sc.mark("baseline")
        t = time.perf_counter()
        sc.run_for(10.0 * sc.scale, step)
        mid = sc.mark("half")
        sc.run_for(10.0 * sc.scale, step)
        b1 = sc.mark("end")
        wall = time.perf_counter() - t
        main1 = schedstat("/proc/thread-self/schedstat")
        work1 = {p: process_schedstat(p) for p in wpids}
        wf1 = {p: minflt(p) for p in wpids}
        f1 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        m1 = int(torch.cuda.memory_stats().get("segment.all.allocated", 0)) if sc.cuda else 0
        s1 = list(STATS)
        seen = {}
        for name in os.listdir(folder):
            if name.startswith("w") and not name.endswith(".tmp"):
                pid, cpus = open(os.path.join(folder, name)).read().split()
                seen[int(pid)] = [int(c) for c in cpus.split(",")]
        workers = [{"pid": p, "tids": tids_of(p), "comm": comm_of(p), "affinity": seen.get(p)} for p in wpids]
    finally:
        if it is not None:
            it._shutdown_workers()
        shutil.rmtree(folder, ignore_errors=True)

    n = own["steps"]

    def share(v: float | None) -> float | None:
        return round(v / wall, 4) if v is not None else None

    ds = [b - a for a, b in zip(s0, s1)]
    per_worker = []
    for k, p in enumerate(wpids):
        run, wait = (b - a for a, b in zip(work0[p], work1[p]))
        samples, get_s, get_cpu_s = ds[3 * k: 3 * k + 3]
        fa, fb = wf0[p], wf1[p]
        per_worker.append({"pid": p, "affinity": seen.get(p), "run_s": round(run, 4), "run_share": share(run),
                           "cpu_wait_s": round(wait, 4), "cpu_wait_share": share(wait), "samples": int(samples),
                           "getitem_s": round(get_s, 4), "getitem_cpu_s": round(get_cpu_s, 4),
                           "minor_faults_per_s": round((fb - fa) / wall, 1) if fa is not None and fb is not None
                           else None})
    gpu_busy = n * gpu_step_s if gpu_step_s is not None else None
    main_run = round(main1[0] - main0[0], 4) if main0 and main1 else None
    main_wait = round(main1[1] - main0[1], 4) if main0 and main1 else None
    next_off = max(0.0, own["next_s"] - own["next_cpu_s"])
    samples = sum(w["samples"] for w in per_worker)
    union = sorted({c for w in per_worker for c in (w["affinity"] or [])} | set(main_cpus))
    sc.extra["workers"] = workers
    sc.extra["self"] = {**{k: round(v, 4) for k, v in own.items()}, "wall_s": round(wall, 4),
                        "steps_per_s": round(n / wall, 2), "samples_per_s": round(samples / wall, 1),
                        "job_cpus_given": sc.job_cpus, "main_affinity": main_cpus, "cpus_in_force": union,
                        "workers_affinity": [w["affinity"] for w in per_worker],
                        "one_cpu": len(union) == 1, "num_workers": WORKERS, "batch": BATCH,
                        "next_share": share(own["next_s"]), "next_cpu_share": share(own["next_cpu_s"]),
                        "next_off_cpu_s": round(next_off, 4), "next_off_cpu_share": share(next_off),
                        "copy_share": share(own["copy_s"]), "step_share": share(own["step_s"]),
                        "per_worker": per_worker,
                        "workers_run_s": round(sum(w["run_s"] for w in per_worker), 4),
                        "workers_run_share": share(sum(w["run_s"] for w in per_worker)),
                        "workers_cpu_wait_s": round(sum(w["cpu_wait_s"] for w in per_worker), 4),
                        "workers_cpu_wait_share_max": max(w["cpu_wait_share"] for w in per_worker),
                        "workers_cpu_wait_share_min": min(w["cpu_wait_share"] for w in per_worker),
                        "workers_cpu_wait_share_mean": round(sum(w["cpu_wait_share"] for w in per_worker)
                                                             / len(per_worker), 4),
                        "workers_minor_faults_per_s_max": max((w["minor_faults_per_s"] or 0.0) for w in per_worker),
                        "getitem_ms_cpu": round(sum(w["getitem_cpu_s"] for w in per_worker) / max(samples, 1) * 1e3,
                                                4),
                        "main_run_s": main_run, "main_cpu_share": share(main_run),
                        "main_cpu_wait_s": main_wait, "main_cpu_wait_share": share(main_wait),
                        "minor_faults_per_s": round((f1 - f0) / wall, 1),
                        "cuda_mallocs_per_s": round((m1 - m0) / wall, 3),
                        "gpu_step_ms": round(gpu_step_s * 1e3, 4) if gpu_step_s is not None else None,
                        "gpu_busy_s": round(gpu_busy, 4) if gpu_busy is not None else None,
                        "gpu_busy_share": share(gpu_busy)}
    if not sc.cuda:
        sc.note("no copies (the batches stay on the CPU), no allocator counters: no CUDA.")
    sc.note(f"natural: measured by the script: the main thread on CPUs {main_cpus} (given {sc.job_cpus}), its "
            f"workers on {[w['affinity'] for w in per_worker]}; {n} steps ({n / wall:.1f}/s) in {wall:.2f} s: "
            f"{own['next_s']:.2f} s in next() ({own['next_cpu_s']:.2f} s of it on a CPU), {own['copy_s']:.2f} s "
            f"copying, {own['step_s']:.2f} s in steps; the main thread ran {main_run} s and waited for a CPU "
            f"{main_wait} s; the workers ran {', '.join(format(w['run_s'], '.2f') for w in per_worker)} s and waited "
            f"for the CPU {', '.join(format(w['cpu_wait_s'], '.2f') for w in per_worker)} s; "
            + (f"a step's kernels take {gpu_step_s * 1e3:.2f} ms of GPU time queued (GPU busy {gpu_busy / wall:.0%} "
               "of the run)." if gpu_busy is not None else "no GPU timings (no CUDA)."))
    sc.write_truth(baseline=(b0, b1), window=None, ratio_spans=((b0, mid), (mid, b1)))
