"""natural_spawn_workers_each_epoch (natural, nothing staged): an image classifier trained for short epochs over a
dataset held in memory, fed by DataLoader(batch_size=128, shuffle=True, num_workers=3,
multiprocessing_context="spawn", persistent_workers=False, drop_last=True), as a script written to also run on macOS
(or with CUDA already initialised) is set up. The Dataset holds 16,384 images of 3x36x36 uint8 (64 MB in one numpy
array) and their labels; a sample is a random 32x32 crop, a random horizontal flip (numpy's global generator, seeded
per worker in worker_init_fn), to float32 and normalised. With spawn and workers that are not persistent, every
epoch's iter(loader) starts 3 new Python processes that import the script's modules (torch, numpy) and receive the
pickled Dataset (the 64 MB array) from the main thread, one after the other; the epoch's last next() shuts them
down. The whole process is on CPUs 2-5 (the workers inherit them). The model: a small ResNet for 32x32 inputs (a 3x3
stem, three stages of two basic blocks, 64-128-256 channels, BatchNorm), channels_last, bf16 autocast, SGD with
Nesterov momentum, the batch copied with .to(dev) from the worker's (pageable) memory, loss.item() each step: 128 steps
an epoch (smaller with --device cpu: 512 images, batch 32, 8-16-32 channels). The training's own code is guarded by
`if __name__ == "__main__"` (the spawned workers import the script). 20 s.

The script measures itself: the steps per second and the epochs; per epoch (truth `epochs`) the time from
iter(loader) to its first batch, iter() itself (the spawns and the pickled dataset sent to each), its first next()
and the next() that ends it (the workers' shutdown), each worker's start as its worker_init_fn saw it (pid and the
time since iter(), written to a file in a temporary folder; truth `workers`: pid, comm, epoch) and, at its epoch's last
batch, its threads' time on a CPU and waiting for one since then (/proc/PID/task/*/schedstat; from its start, the
import before it not counted); the share of the run
from iter() to the first batch, in all next() calls (wall and CPU time, thread_time), copying, queueing, .item();
the reaped workers' CPU time (getrusage(RUSAGE_CHILDREN)); the main thread's schedstat and the process's page faults
over the run, cudaMalloc calls, and a step's GPU time queued (common.gpu_seconds_queued on a batch already on the
GPU), so that the GPU's busy share is known."""

import functools
import os
import resource
import shutil
import tempfile
import time

import numpy as np
import torch

from common import Scenario, comm_of, gpu_seconds_queued, tids_of

NCLASS = 10
MEAN = np.array([0.491, 0.482, 0.447], np.float32).reshape(3, 1, 1) * 255
STD = np.array([0.247, 0.243, 0.261], np.float32).reshape(3, 1, 1) * 255


class InMemoryImages(torch.utils.data.Dataset):
    """The training images decoded once and held whole as one uint8 array; a sample is a random crop and flip."""

    def __init__(self, n: int, side: int, crop: int) -> None:
        rng = np.random.default_rng(0)
        self.images = rng.integers(0, 256, (n, 3, side, side), dtype=np.uint8)
        self.labels = rng.integers(0, NCLASS, n)
        self.crop = crop

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        side = self.images.shape[-1]
        top, left = np.random.randint(0, side - self.crop + 1, 2)
        x = self.images[i, :, top:top + self.crop, left:left + self.crop]
        if np.random.rand() < 0.5:
            x = x[:, :, ::-1]
        x = (x.astype(np.float32) - MEAN) / STD
        return torch.from_numpy(x), int(self.labels[i])


def note_worker(folder: str, worker_id: int) -> None:
    """worker_init_fn: seed numpy per worker, and leave the worker's pid and start time in `folder`."""
    np.random.seed(torch.initial_seed() % 2 ** 32)
    with open(os.path.join(folder, f"{os.getpid()}"), "w") as fh:
        fh.write(f"{worker_id} {time.time_ns()}\n")


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


def small_resnet(widths: tuple[int, ...]) -> torch.nn.Module:
    layers: list[torch.nn.Module] = [torch.nn.Conv2d(3, widths[0], 3, 1, 1, bias=False),
                                     torch.nn.BatchNorm2d(widths[0]), torch.nn.ReLU()]
    cin = widths[0]
    for k, w in enumerate(widths):
        layers += [Basic(cin, w, 1 if k == 0 else 2), Basic(w, w, 1)]
        cin = w
    layers += [torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(cin, NCLASS)]
    return torch.nn.Sequential(*layers)


def schedstat(path: str = "/proc/thread-self/schedstat") -> tuple[int, int] | None:
    try:
        with open(path) as fh:
            run, wait = fh.read().split()[:2]
        return int(run), int(wait)
    except (OSError, ValueError):
        return None


def main() -> None:
    sc = Scenario("natural_spawn_workers_each_epoch", "natural", "a small ResNet on 16,384 images held in a 64 MB "
                  "numpy array, fed by DataLoader(num_workers=3, multiprocessing_context='spawn') without "
                  "persistent_workers: 3 Python workers spawned and sent the dataset every short epoch, 20 s, nothing "
                  "staged", job_cpus=[2, 3, 4, 5], control=True)
    dev = torch.device(sc.device)
    nimg, side, crop, batch, widths = ((16384, 36, 32, 128, (64, 128, 256)) if sc.cuda
                                       else (512, 36, 32, 32, (8, 16, 32)))
    folder = tempfile.mkdtemp(prefix="zoo_spawn_")
    dataset = InMemoryImages(nimg, side, crop)
    torch.manual_seed(0)
    model = small_resnet(widths).to(dev).to(memory_format=torch.channels_last)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, nesterov=True, weight_decay=5e-4)
    loader = torch.utils.data.DataLoader(dataset, batch_size=batch, shuffle=True, num_workers=3, drop_last=True,
                                         multiprocessing_context="spawn", persistent_workers=False,
                                         worker_init_fn=functools.partial(note_worker, folder))
    per_epoch = len(loader)
    own = {"steps": 0, "iter_s": 0.0, "iter_cpu_s": 0.0, "first_s": 0.0, "end_s": 0.0, "next_s": 0.0, "next_cpu_s": 0.0,
           "copy_s": 0.0, "launch_s": 0.0, "item_s": 0.0, "running_loss": 0.0}
    st: dict = {"it": None, "k": 0, "epoch": 0, "t_iter_ns": 0, "iter_s": 0.0, "measure": False}
    epochs: list[dict] = []
    workers: list[dict] = []
    seen: set[int] = set()
    lives: list[dict] = []  # each measured worker's time on a CPU and waiting for one since its start
    iters: list[tuple[int, int]] = []  # (epoch, time_ns of its iter(loader))

    def train_step(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        with torch.autocast(sc.device, dtype=torch.bfloat16, enabled=sc.cuda):
            loss = torch.nn.functional.cross_entropy(model(x).float(), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        return loss

    def new_workers() -> None:
        """The workers that have written their pid since the last look, each with the epoch whose iter() came last
        before its start (a worker may start after its epoch's first batch)."""
        for name in os.listdir(folder):
            pid = int(name)
            if pid in seen:
                continue
            with open(os.path.join(folder, name)) as fh:
                ns = int(fh.read().split()[1])
            seen.add(pid)
            epoch, t_iter = max((e, t) for e, t in iters if t <= ns)
            workers.append({"pid": pid, "tids": tids_of(pid), "comm": comm_of(pid), "epoch": epoch,
                            "init_after_iter_s": round((ns - t_iter) / 1e9, 4)})

    def next_batch() -> tuple:
        while True:
            if st["it"] is None:
                t0, c0, ns0 = time.perf_counter(), time.thread_time(), time.time_ns()
                st["it"] = iter(loader)  # spawns the epoch's workers and sends each the dataset
                st.update(k=0, t_iter_ns=ns0, iter_s=time.perf_counter() - t0)
                own["iter_cpu_s"] += time.thread_time() - c0
                iters.append((st["epoch"], ns0))
                own["iter_s"] += st["iter_s"]
            t0, c0, ns0 = time.perf_counter(), time.thread_time(), time.time_ns()
            try:
                b = next(st["it"])
            except StopIteration:  # the epoch is over: this next() shut its workers down
                dt = time.perf_counter() - t0
                own["next_s"] += dt
                own["next_cpu_s"] += time.thread_time() - c0
                own["end_s"] += dt
                if st["measure"] and epochs and epochs[-1]["epoch"] == st["epoch"]:
                    epochs[-1].update(end_ns=[ns0, time.time_ns()], end_s=round(dt, 4))
                st.update(it=None, epoch=st["epoch"] + 1)
                continue
            dt = time.perf_counter() - t0
            own["next_s"] += dt
            own["next_cpu_s"] += time.thread_time() - c0
            if st["k"] == 0:  # the workers' start: their first batch
                own["first_s"] += dt
                if st["measure"]:
                    epochs.append({"epoch": st["epoch"], "start_ns": [st["t_iter_ns"], time.time_ns()],
                                   "iter_s": round(st["iter_s"], 4), "first_s": round(dt, 4),
                                   "to_first_batch_s": round((time.time_ns() - st["t_iter_ns"]) / 1e9, 4)})
            if st["k"] in (0, 3):  # by its 4th batch every worker has started (each hands over a batch in turn)
                new_workers()
            if st["k"] == per_epoch - 1 and st["measure"]:  # the last batch: the workers are all still there
                for w in workers:
                    if w["epoch"] == st["epoch"]:
                        got = [x for x in (schedstat(f"/proc/{w['pid']}/task/{t}/schedstat") for t in tids_of(w["pid"]))
                               if x]
                        life = (time.time_ns() - st["t_iter_ns"]) / 1e9 - w["init_after_iter_s"]
                        if got and life > 0:
                            lives.append({"pid": w["pid"], "life_s": life, "run_s": sum(x[0] for x in got) / 1e9,
                                          "cpu_wait_s": sum(x[1] for x in got) / 1e9})
            st["k"] += 1
            return b

    def step() -> None:
        x, y = next_batch()
        t1 = time.perf_counter()
        x, y = x.to(dev).to(memory_format=torch.channels_last), y.to(dev)
        t2 = time.perf_counter()
        loss = train_step(x, y)
        t3 = time.perf_counter()
        own["running_loss"] += loss.item()
        own["item_s"] += time.perf_counter() - t3
        own["copy_s"] += t2 - t1
        own["launch_s"] += t3 - t2
        own["steps"] += 1

    try:
        for _ in range(10):  # warm-up: a first epoch's workers, cuDNN's choices, the allocator
            step()
        gpu_step_s = None
        if sc.cuda:
            torch.cuda.synchronize()
            xg, yg = (t.to(dev) for t in next_batch())
            xg = xg.to(memory_format=torch.channels_last)
            train_step(xg, yg)
            runs = sorted(r for r in (gpu_seconds_queued(torch, lambda _: train_step(xg, yg)) for _ in range(5))
                          if r is not None)
            gpu_step_s = runs[len(runs) // 2] if runs else None
        warm_end = time.perf_counter() + 2.0 * sc.scale  # the spin kernels well before the baseline
        while time.perf_counter() < warm_end:
            step()
        if sc.cuda:
            torch.cuda.synchronize()
        for k in own:
            own[k] = 0 if k == "steps" else 0.0
        epoch0 = st["epoch"]
        st["measure"] = True
        main0 = schedstat()
        f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        kids0 = resource.getrusage(resource.RUSAGE_CHILDREN)
        m0 = torch.cuda.memory_stats().get("segment.all.allocated", 0) if sc.cuda else 0
        b0 = sc.mark("baseline")
        t = time.perf_counter()
        sc.run_for(10.0 * sc.scale, step)
        mid = sc.mark("half")
        sc.run_for(10.0 * sc.scale, step)
        if sc.cuda:
            torch.cuda.synchronize()
        b1 = sc.mark("end")
        wall = time.perf_counter() - t
        st["measure"] = False
        main1 = schedstat()
        f1 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        kids1 = resource.getrusage(resource.RUSAGE_CHILDREN)
        m1 = torch.cuda.memory_stats().get("segment.all.allocated", 0) if sc.cuda else 0
    finally:
        if st["it"] is not None:
            st["it"]._shutdown_workers()
        new_workers()
        shutil.rmtree(folder, ignore_errors=True)
    n = own["steps"]
    for e in epochs:
        e["pids"] = [w["pid"] for w in workers if w["epoch"] == e["epoch"]]
    in_run = [w for w in workers if w["epoch"] in {e["epoch"] for e in epochs}]  # spawned in the measured run

    def share(v: float | None) -> float | None:
        return round(v / wall, 4) if v is not None else None

    to_first = own["iter_s"] + own["first_s"]
    kids_cpu = (kids1.ru_utime + kids1.ru_stime) - (kids0.ru_utime + kids0.ru_stime)
    gpu_busy = n * gpu_step_s if gpu_step_s is not None else None
    main_run = (main1[0] - main0[0]) / 1e9 if main0 and main1 else None
    main_wait = (main1[1] - main0[1]) / 1e9 if main0 and main1 else None
    inits = [w["init_after_iter_s"] for w in in_run]
    wait_shares = [v["cpu_wait_s"] / v["life_s"] for v in lives]
    run_shares = [v["run_s"] / v["life_s"] for v in lives]
    sc.extra["workers"] = workers
    sc.extra["epochs"] = epochs
    sc.extra["epochs_ns"] = [[e["start_ns"][0], e["end_ns"][1]] for e in epochs if "end_ns" in e]
    sc.extra["self"] = {**{k: round(v, 4) for k, v in own.items()}, "wall_s": round(wall, 4),
                        "steps_per_s": round(n / wall, 2), "epochs": st["epoch"] - epoch0,
                        "epochs_started": len(epochs), "steps_per_epoch": per_epoch,
                        "to_first_batch_s": round(to_first, 4), "to_first_batch_share": share(to_first),
                        "to_first_batch_s_mean": round(to_first / max(len(epochs), 1), 4),
                        "iter_share": share(own["iter_s"]), "first_share": share(own["first_s"]),
                        "end_share": share(own["end_s"]),
                        "restart_s": round(to_first + own["end_s"], 4), "restart_share": share(to_first + own["end_s"]),
                        "wait_s": round(own["next_s"], 4), "wait_share": share(own["next_s"]),
                        "wait_cpu_share": share(own["next_cpu_s"]),
                        "loader_s": round(own["iter_s"] + own["next_s"], 4),
                        "loader_share": share(own["iter_s"] + own["next_s"]),
                        "steady_wait_s": round(own["next_s"] - own["first_s"] - own["end_s"], 4),
                        "copy_share": share(own["copy_s"]), "launch_share": share(own["launch_s"]),
                        "item_share": share(own["item_s"]),
                        "workers_spawned": len(in_run), "workers_pids_seen": len(workers),
                        "worker_init_after_iter_s_mean": round(sum(inits) / len(inits), 4) if inits else None,
                        "worker_init_after_iter_s_max": round(max(inits), 4) if inits else None,
                        "workers_cpu_wait_share_max": round(max(wait_shares), 4) if wait_shares else 0.0,
                        "workers_run_share_mean": round(sum(run_shares) / len(run_shares), 4) if run_shares else None,
                        "workers_cpu_s": round(kids_cpu, 4), "workers_cpu_share": share(kids_cpu),
                        "workers_minor_faults_per_s": round((kids1.ru_minflt - kids0.ru_minflt) / wall, 1),
                        "main_run_s": round(main_run, 4) if main_run is not None else None,
                        "main_cpu_share": share(main_run),
                        "main_cpu_wait_s": round(main_wait, 4) if main_wait is not None else None,
                        "main_cpu_wait_share": share(main_wait),
                        "minor_faults_per_s": round((f1 - f0) / wall, 1),
                        "cuda_mallocs_per_s": round((m1 - m0) / wall, 3),
                        "gpu_step_ms": round(gpu_step_s * 1e3, 4) if gpu_step_s is not None else None,
                        "gpu_busy_s": round(gpu_busy, 4) if gpu_busy is not None else None,
                        "gpu_busy_share": share(gpu_busy), "batch": batch, "num_workers": 3,
                        "dataset_mb": round(dataset.images.nbytes / 2 ** 20, 1), "start_method": "spawn"}
    sc.note(f"natural: measured by the script: {n} steps ({n / wall:.1f}/s) in {wall:.2f} s over "
            f"{st['epoch'] - epoch0} epochs of {per_epoch} batches; {to_first:.2f} s from iter(loader) to the epochs' "
            f"first batches ({own['iter_s']:.2f} s in iter(): the spawns and the pickled dataset), "
            f"{own['end_s']:.2f} s in the next() that ended them, {own['next_s']:.2f} s in next() in all; "
            f"{len(in_run)} workers spawned; "
            + (f"a step's kernels take {gpu_step_s * 1e3:.2f} ms of GPU time queued (GPU busy {gpu_busy / wall:.0%} of "
               "the run)." if gpu_busy is not None else "no GPU timings (no CUDA)."))
    sc.write_truth(baseline=(b0, b1), window=None, ratio_spans=((b0, mid), (mid, b1)))


if __name__ == "__main__":
    main()
