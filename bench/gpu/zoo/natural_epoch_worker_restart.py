"""natural_epoch_worker_restart (natural, nothing staged): an image classifier trained for many short epochs over a
small dataset held in memory, through a DataLoader whose workers are not persistent (persistent_workers left at its
default, False), as a first training script on a small dataset is written. At set-up the script builds the dataset
once: 8,192 images of 3x72x72 float32 (already normalised; 509 MB in one numpy array held by the Dataset object, with
the labels), so that each forked worker inherits a large parent (the array, torch, the CUDA context). A sample is a
random 64x64 crop and a random horizontal flip of its image (numpy, Python's random: the workers are seeded by
PyTorch). DataLoader(batch_size=128, shuffle=True, num_workers=4, drop_last=True; pin_memory and persistent_workers
at their defaults, False; the default start method, fork): 64 batches an epoch, and every epoch's iter(loader) forks 4
new workers and its last next() shuts them down. The whole process is on CPUs 2-7 (the workers inherit them: a CPU
each, the main thread its own). The model: a ResNet-18 for 64x64 inputs (a 3x3 stem, four stages of two basic blocks,
64-128-256-512 channels, BatchNorm), fp32 at PyTorch's defaults, SGD with momentum and nesterov, the batch copied with
.to(dev) from the worker's (pageable) memory, loss.item() each step for the running loss: an epoch of about a second on
the H200 (smaller with --device cpu: 1,024 images of 3x40x40, crops of 32, batch 32, 8-16-32-32 channels). 20 s.

The script measures itself: the steps per second and the epochs; the main thread's time in iter(loader) (the 4
forks), in each epoch's first next() (the workers' start and their first batch), in the next() that ends an epoch
(StopIteration: the workers' shutdown) and in all next() calls (wall and its CPU time, thread_time), and in its steps
(copy, queueing, .item()); each epoch's start and end spans (truth `epochs_ns`); the workers' pids seen at each epoch
(multiprocessing.active_children() after its first batch; truth `workers`: pid, tids, comm, epoch); each worker's time
on a CPU and waiting for one over its life (/proc/PID/task/*/schedstat, read when its epoch's last batch arrives), the
reaped workers' CPU time and page faults (getrusage(RUSAGE_CHILDREN)), the main thread's schedstat and the main
process's page faults over the run, cudaMalloc calls, and a step's GPU time queued (common.gpu_seconds_queued on a
batch already on the GPU), so that the GPU's busy share is known."""

import multiprocessing
import random
import resource
import time

import numpy as np

from common import Scenario, comm_of, gpu_seconds_queued, tids_of

sc = Scenario("natural_epoch_worker_restart", "natural", "a ResNet-18 on 8,192 images held in a 509 MB numpy array, "
              "fed by DataLoader(num_workers=4) without persistent_workers: 4 workers forked anew every ~1 s epoch, "
              "20 s, nothing staged", job_cpus=[2, 3, 4, 5, 6, 7], control=True)
import torch  # noqa: E402

dev = torch.device(sc.device)
NCLASS, WORKERS = 100, 4
NIMG, SIDE, CROP, BATCH, WIDTHS = ((8192, 72, 64, 128, (64, 128, 256, 512)) if sc.cuda
                                   else (1024, 40, 32, 32, (8, 16, 32, 32)))


class InMemoryImages(torch.utils.data.Dataset):
    """The training set decoded and normalised once, held whole as one float32 array; a sample is a random crop and
    flip of its image."""

    def __init__(self, n: int, side: int, crop: int) -> None:
        rng = np.random.default_rng(0)
        self.images = rng.standard_normal((n, 3, side, side), dtype=np.float32)
        self.labels = rng.integers(0, NCLASS, n)
        self.crop = crop

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        side = self.images.shape[-1]
        top, left = random.randint(0, side - self.crop), random.randint(0, side - self.crop)
        x = self.images[i, :, top:top + self.crop, left:left + self.crop]
        if random.random() < 0.5:
            x = x[:, :, ::-1]
        return torch.from_numpy(np.ascontiguousarray(x)), int(self.labels[i])


class Basic(torch.nn.Module):
    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.c1 = torch.nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.b1 = torch.nn.BatchNorm2d(cout)
        self.c2 = torch.nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.b2 = torch.nn.BatchNorm2d(cout)
        self.skip = (torch.nn.Sequential(torch.nn.Conv2d(cin, cout, 1, stride, bias=False), torch.nn.BatchNorm2d(cout))
                     if stride != 1 or cin != cout else torch.nn.Identity())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.b1(self.c1(x)))
        return torch.relu(self.b2(self.c2(y)) + self.skip(x))


def resnet18() -> torch.nn.Module:
    layers: list[torch.nn.Module] = [torch.nn.Conv2d(3, WIDTHS[0], 3, 1, 1, bias=False),
                                     torch.nn.BatchNorm2d(WIDTHS[0]), torch.nn.ReLU()]
    cin = WIDTHS[0]
    for k, w in enumerate(WIDTHS):
        layers += [Basic(cin, w, 1 if k == 0 else 2), Basic(w, w, 1)]
        cin = w
    layers += [torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(cin, NCLASS)]
    return torch.nn.Sequential(*layers)


def schedstat(path: str) -> tuple[int, int] | None:
    try:
        with open(path) as fh:
            run, wait = fh.read().split()[:2]
        return int(run), int(wait)
    except (OSError, ValueError):
        return None


def process_schedstat(pid: int) -> tuple[int, int] | None:
    """A process's threads' time on a CPU and waiting for one so far (ns), summed."""
    got = [s for s in (schedstat(f"/proc/{pid}/task/{t}/schedstat") for t in tids_of(pid)) if s]
    return (sum(s[0] for s in got), sum(s[1] for s in got)) if got else None


def cuda_mallocs() -> int:
    return int(torch.cuda.memory_stats().get("segment.all.allocated", 0)) if sc.cuda else 0


t_build = time.perf_counter()
dataset = InMemoryImages(NIMG, SIDE, CROP)
build_s = time.perf_counter() - t_build
torch.manual_seed(0)
random.seed(0)
model = resnet18().to(dev)
opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, nesterov=True, weight_decay=5e-4)
loader = torch.utils.data.DataLoader(dataset, batch_size=BATCH, shuffle=True, num_workers=WORKERS, drop_last=True)
PER_EPOCH = len(loader)
own = {"steps": 0, "iter_s": 0.0, "iter_cpu_s": 0.0, "first_s": 0.0, "first_cpu_s": 0.0, "end_s": 0.0,
       "end_cpu_s": 0.0, "next_s": 0.0, "next_cpu_s": 0.0, "copy_s": 0.0, "launch_s": 0.0, "item_s": 0.0,
       "running_loss": 0.0}
state: dict = {"it": None, "k": 0, "epoch": 0, "t_iter_ns": 0, "pids": [], "born_ns": 0, "measure": False}
epochs: list[dict] = []  # the epochs started in the measured run
workers_seen: list[dict] = []  # every worker seen, warm-up included
lives: list[dict] = []  # the measured run's workers: their time on a CPU and waiting for one over their life


def train_step(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    loss = torch.nn.functional.cross_entropy(model(x), y)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    return loss


def next_batch() -> tuple:
    """The next batch, a new epoch's iterator (4 workers forked) when one is over, each part timed."""
    while True:
        if state["it"] is None:
            t0, c0, ns0 = time.perf_counter(), time.thread_time(), time.time_ns()
            state["it"] = iter(loader)  # forks the epoch's workers
            own["iter_s"] += time.perf_counter() - t0
            own["iter_cpu_s"] += time.thread_time() - c0
            state.update(k=0, t_iter_ns=ns0)
        t0, c0, ns0 = time.perf_counter(), time.thread_time(), time.time_ns()
        try:
            batch = next(state["it"])
        except StopIteration:  # the epoch is over: that next() shut its workers down
            dt, dc = time.perf_counter() - t0, time.thread_time() - c0
            own["next_s"] += dt
            own["next_cpu_s"] += dc
            own["end_s"] += dt
            own["end_cpu_s"] += dc
            if state["measure"] and epochs and epochs[-1]["epoch"] == state["epoch"]:
                epochs[-1].update(end_ns=[ns0, time.time_ns()], end_s=round(dt, 4))
            state.update(it=None, epoch=state["epoch"] + 1)
            continue
        dt, dc = time.perf_counter() - t0, time.thread_time() - c0
        own["next_s"] += dt
        own["next_cpu_s"] += dc
        if state["k"] == 0:  # the workers' start: their first batch
            own["first_s"] += dt
            own["first_cpu_s"] += dc
            pids = sorted(p.pid for p in multiprocessing.active_children())
            state.update(pids=pids, born_ns=state["t_iter_ns"])
            for p in pids:
                workers_seen.append({"pid": p, "tids": tids_of(p), "comm": comm_of(p), "epoch": state["epoch"]})
            if state["measure"]:
                epochs.append({"epoch": state["epoch"], "start_ns": [state["t_iter_ns"], time.time_ns()],
                               "first_s": round(dt, 4), "pids": pids})
        if state["k"] == PER_EPOCH - 1 and state["measure"]:  # the last batch: the workers are all still there
            for p in state["pids"]:
                st = process_schedstat(p)
                if st:
                    lives.append({"pid": p, "life_s": (time.time_ns() - state["born_ns"]) / 1e9,
                                  "run_s": st[0] / 1e9, "cpu_wait_s": st[1] / 1e9})
        state["k"] += 1
        return batch


def step() -> None:
    x, y = next_batch()
    t1 = time.perf_counter()
    x, y = x.to(dev), y.to(dev)
    t2 = time.perf_counter()
    loss = train_step(x, y)
    t3 = time.perf_counter()
    own["running_loss"] += loss.item()
    t4 = time.perf_counter()
    own["copy_s"] += t2 - t1
    own["launch_s"] += t3 - t2
    own["item_s"] += t4 - t3
    own["steps"] += 1


try:
    for _ in range(10):  # warm-up: cuDNN's choices, the allocator
        step()
    gpu_step_s = None
    if sc.cuda:
        torch.cuda.synchronize()
        xg, yg = (t.to(dev) for t in next_batch())

        def work(_) -> None:
            """One step's GPU work on a batch already there, nothing read back."""
            train_step(xg, yg)

        work(None)
        runs = sorted(r for r in (gpu_seconds_queued(torch, work) for _ in range(5)) if r is not None)
        gpu_step_s = runs[len(runs) // 2] if runs else None
    warm_end = time.perf_counter() + 2.0 * sc.scale  # the spin kernels well before the baseline
    while time.perf_counter() < warm_end:
        step()
    if sc.cuda:
        torch.cuda.synchronize()
    for k in own:
        own[k] = 0 if k == "steps" else 0.0
    epoch0 = state["epoch"]
    state["measure"] = True
    main0 = schedstat("/proc/thread-self/schedstat")
    f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    kids0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    m0 = cuda_mallocs()
    b0 = sc.mark("baseline")
    t = time.perf_counter()
    sc.run_for(10.0 * sc.scale, step)
    mid = sc.mark("half")
    sc.run_for(10.0 * sc.scale, step)
    if sc.cuda:
        torch.cuda.synchronize()
    b1 = sc.mark("end")
    wall = time.perf_counter() - t
    state["measure"] = False
    main1 = schedstat("/proc/thread-self/schedstat")
    f1 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    kids1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    m1 = cuda_mallocs()
finally:
    if state["it"] is not None:
        state["it"]._shutdown_workers()
n = own["steps"]
epochs_in_run = state["epoch"] - epoch0  # epochs ended in the run


def share(v: float | None) -> float | None:
    return round(v / wall, 4) if v is not None else None


start_s = own["iter_s"] + own["first_s"]
loader_s = own["iter_s"] + own["next_s"]
loader_cpu_s = own["iter_cpu_s"] + own["next_cpu_s"]
kids_cpu = (kids1.ru_utime + kids1.ru_stime) - (kids0.ru_utime + kids0.ru_stime)
wait_shares = [v["cpu_wait_s"] / v["life_s"] for v in lives if v["life_s"] > 0]
run_shares = [v["run_s"] / v["life_s"] for v in lives if v["life_s"] > 0]
gpu_busy = n * gpu_step_s if gpu_step_s is not None else None
main_run = (main1[0] - main0[0]) / 1e9 if main0 and main1 else None
main_wait = (main1[1] - main0[1]) / 1e9 if main0 and main1 else None
sc.extra["workers"] = workers_seen
sc.extra["epochs_ns"] = [[e["start_ns"][0], e["end_ns"][1]] for e in epochs if "end_ns" in e]
sc.extra["epochs"] = epochs
sc.extra["self"] = {**{k: round(v, 4) for k, v in own.items()}, "wall_s": round(wall, 4),
                    "steps_per_s": round(n / wall, 2), "epochs": epochs_in_run, "epochs_started": len(epochs),
                    "steps_per_epoch": PER_EPOCH, "epoch_s_mean": round(wall / max(epochs_in_run, 1), 4),
                    "loader_s": round(loader_s, 4), "loader_cpu_s": round(loader_cpu_s, 4),
                    "loader_share": share(loader_s), "loader_cpu_share": share(loader_cpu_s),
                    "wait_s": round(own["next_s"], 4), "wait_share": share(own["next_s"]),
                    "wait_cpu_share": share(own["next_cpu_s"]),
                    "iter_share": share(own["iter_s"]), "first_share": share(own["first_s"]),
                    "end_share": share(own["end_s"]), "start_s": round(start_s, 4), "start_share": share(start_s),
                    "restart_s": round(start_s + own["end_s"], 4), "restart_share": share(start_s + own["end_s"]),
                    "steady_wait_s": round(own["next_s"] - own["first_s"] - own["end_s"], 4),
                    "start_ms_mean": round(start_s / max(len(epochs), 1) * 1e3, 2),
                    "copy_share": share(own["copy_s"]), "item_share": share(own["item_s"]),
                    "workers_pids_seen": len({w["pid"] for w in workers_seen}),
                    "workers_run_share_mean": round(sum(run_shares) / len(run_shares), 4) if run_shares else None,
                    "workers_cpu_wait_share_max": round(max(wait_shares), 4) if wait_shares else 0.0,
                    "workers_cpu_s": round(kids_cpu, 4), "workers_cpu_share": share(kids_cpu),
                    "workers_minor_faults_per_s": round((kids1.ru_minflt - kids0.ru_minflt) / wall, 1),
                    "main_run_s": round(main_run, 4) if main_run is not None else None,
                    "main_cpu_share": share(main_run),
                    "main_cpu_wait_s": round(main_wait, 4) if main_wait is not None else None,
                    "main_cpu_wait_share": share(main_wait),
                    "minor_faults_per_s": round((f1 - f0) / wall, 1), "cuda_mallocs_per_s": round((m1 - m0) / wall, 3),
                    "gpu_step_ms": round(gpu_step_s * 1e3, 4) if gpu_step_s is not None else None,
                    "gpu_busy_s": round(gpu_busy, 4) if gpu_busy is not None else None,
                    "gpu_busy_share": share(gpu_busy), "batch": BATCH, "workers": WORKERS,
                    "dataset_mb": round(dataset.images.nbytes / 2 ** 20, 1), "dataset_build_s": round(build_s, 3),
                    "start_method": multiprocessing.get_start_method()}
sc.note(f"natural: measured by the script: {n} steps ({n / wall:.1f}/s) in {wall:.2f} s over {epochs_in_run} epochs "
        f"of {PER_EPOCH} batches; {own['iter_s']:.2f} s in iter(loader) (the forks), {own['first_s']:.2f} s in the "
        f"epochs' first next() (the workers' start), {own['end_s']:.2f} s in the next() that ended them (the workers' "
        f"shutdown), {own['next_s']:.2f} s in next() in all ({own['next_cpu_s']:.2f} s of it on the CPU); "
        f"{own['copy_s']:.2f} s copying, {own['launch_s']:.2f} s queueing, {own['item_s']:.2f} s in .item(); "
        f"{len({w['pid'] for w in workers_seen})} worker pids seen; the reaped workers used {kids_cpu:.2f} s of CPU; "
        + (f"a step's kernels take {gpu_step_s * 1e3:.2f} ms of GPU time queued (GPU busy {gpu_busy / wall:.0%} of the "
           "run)." if gpu_busy is not None else "no GPU timings (no CUDA)."))
sc.write_truth(baseline=(b0, b1), window=None, ratio_spans=((b0, mid), (mid, b1)))
