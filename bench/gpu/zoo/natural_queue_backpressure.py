"""natural_queue_backpressure (natural, nothing staged; a control): "a background thread keeps batches ready". A wide
MLP classifier over tabular features, fed by a threading.Thread producer (threading's name and OS name
`batch_producer`) that makes each batch with numpy from a table held in memory (131,072 rows of 256 standardised
float32 features, 134 MB, with their labels): 4096 random rows gathered by fancy indexing, a random tenth of the
feature columns zeroed (feature dropout), torch.from_numpy, put on a queue.Queue(maxsize=4) with a plain blocking put():
a millisecond or two of work a batch, well under the GPU's step. The main thread takes each batch with q.get(),
copies it to the GPU (.to(dev, non_blocking=True) from the producer's pageable memory, as written) and trains the MLP
(256-4096-4096-4096-4096-1000, fp32 at PyTorch's defaults, fused AdamW, loss.item() each step for the running loss):
tens of milliseconds of GPU work a step, so that the trainer (the GPU) is the bottleneck, the queue stays full and the
producer spends most of its time blocked in put(). One process on CPUs 2-3, 20 s. (With --device cpu: 16,384 rows,
batch 256, width 64.)

The script measures itself: the steps per second; the main thread's time in q.get() (wall and its CPU time; apart: the
gets that found the queue empty), copying, queueing the step and in .item(); the producer's time making each batch
(wall and its thread's CPU time) and blocked in put() (the queue full); the main thread's and the producer's time on a
CPU and waiting for one over the run (schedstat); the process's minor page faults and cudaMalloc calls; and a step's
GPU time queued (common.gpu_seconds_queued, on a batch already on the GPU), so that the GPU's busy share is known.
Truth `producer` names the thread (pid, tid, comm)."""

import queue
import resource
import threading
import time

import numpy as np

from common import Scenario, gpu_seconds_queued, set_thread_name

sc = Scenario("natural_queue_backpressure", "natural", "a wide MLP fed by a producer thread through a "
              "queue.Queue(maxsize=4), numpy batches made in a millisecond or two against tens of milliseconds of GPU "
              "work a step: the queue full, the producer blocked in put(), 20 s, nothing staged (a control)",
              job_cpus=[2, 3], control=True)
import torch  # noqa: E402

dev = torch.device(sc.device)
FEATURES, NCLASS, DEPTH, DROP = 256, 1000, 4, 0.1
ROWS, BATCH, WIDTH, HIDDEN = (131_072, 4096, 4096, 4) if sc.cuda else (16_384, 256, 64, 4)

rng0 = np.random.default_rng(0)
table = rng0.standard_normal((ROWS, FEATURES), dtype=np.float32)
labels = rng0.integers(0, NCLASS, ROWS)
q: queue.Queue = queue.Queue(maxsize=DEPTH)
halt = threading.Event()
producer_info: dict = {}
made = {"batches": 0, "make_s": 0.0, "make_cpu_s": 0.0, "put_s": 0.0}
made_lock = threading.Lock()


def schedstat(tid: int | None = None) -> tuple[float, float | None]:
    """A thread's time on a CPU and waiting on a run queue (s), from the kernel's schedstat (the caller's by default);
    where that is not kept, the caller's CPU clock and None."""
    try:
        with open(f"/proc/self/task/{tid}/schedstat" if tid else "/proc/thread-self/schedstat") as fh:
            run_ns, wait_ns = fh.read().split()[:2]
        return int(run_ns) / 1e9, int(wait_ns) / 1e9
    except (OSError, ValueError):
        return time.thread_time(), None


def produce() -> None:
    set_thread_name("batch_producer")
    producer_info.update(tid=threading.get_native_id(), comm="batch_producer")
    rng = np.random.default_rng(1)
    while not halt.is_set():
        w0, c0 = time.perf_counter(), time.thread_time()
        idx = rng.integers(0, ROWS, BATCH)
        x = table[idx]
        x[:, rng.random(FEATURES) < DROP] = 0.0  # feature dropout
        xb, yb = torch.from_numpy(x), torch.from_numpy(labels[idx])
        w1, c1 = time.perf_counter(), time.thread_time()
        q.put((xb, yb))
        w2 = time.perf_counter()
        with made_lock:
            made["batches"] += 1
            made["make_s"] += w1 - w0
            made["make_cpu_s"] += c1 - c0
            made["put_s"] += w2 - w1


def mlp() -> torch.nn.Module:
    layers: list[torch.nn.Module] = [torch.nn.Linear(FEATURES, WIDTH), torch.nn.ReLU()]
    for _ in range(HIDDEN - 1):
        layers += [torch.nn.Linear(WIDTH, WIDTH), torch.nn.ReLU()]
    return torch.nn.Sequential(*layers, torch.nn.Linear(WIDTH, NCLASS))


torch.manual_seed(0)
model = mlp().to(dev)
opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=sc.cuda or None)
own = {"steps": 0, "get_s": 0.0, "get_cpu_s": 0.0, "get_empty_s": 0.0, "gets_empty": 0, "copy_s": 0.0,
       "launch_s": 0.0, "item_s": 0.0, "running_loss": 0.0}


def train_step(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    loss = torch.nn.functional.cross_entropy(model(x), y)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    return loss


def step() -> None:
    t0, c0 = time.perf_counter(), time.thread_time()
    empty = q.empty()
    xb, yb = q.get()
    t1, c1 = time.perf_counter(), time.thread_time()
    x, y = xb.to(dev, non_blocking=True), yb.to(dev, non_blocking=True)
    t2 = time.perf_counter()
    loss = train_step(x, y)
    t3 = time.perf_counter()
    own["running_loss"] += loss.item()
    t4 = time.perf_counter()
    own["get_s"] += t1 - t0
    own["get_cpu_s"] += c1 - c0
    if empty:
        own["get_empty_s"] += t1 - t0
        own["gets_empty"] += 1
    own["copy_s"] += t2 - t1
    own["launch_s"] += t3 - t2
    own["item_s"] += t4 - t3
    own["steps"] += 1


def cuda_mallocs() -> int:
    return int(torch.cuda.memory_stats().get("segment.all.allocated", 0)) if sc.cuda else 0


thread = threading.Thread(target=produce, name="batch_producer", daemon=True)
thread.start()
try:
    for _ in range(20):  # warm-up: the allocator, cuBLAS's choices
        step()
    gpu_step_s = None
    if sc.cuda:
        torch.cuda.synchronize()
        xg, yg = (t.to(dev) for t in q.get())

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
        own[k] = 0 if k in ("steps", "gets_empty") else 0.0
    with made_lock:
        made.update(batches=0, make_s=0.0, make_cpu_s=0.0, put_s=0.0)
    ptid = producer_info["tid"]
    p_run0, p_wait0 = schedstat(ptid)
    run0, wait0 = schedstat()
    f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
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
    run1, wait1 = schedstat()
    p_run1, p_wait1 = schedstat(ptid)
    f1 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    m1 = cuda_mallocs()
    with made_lock:
        produced = dict(made)
finally:
    halt.set()
    end = time.monotonic() + 10
    while thread.is_alive() and time.monotonic() < end:  # a put() blocked on the full queue returns once one is taken
        try:
            q.get(timeout=0.1)
        except queue.Empty:
            pass
    thread.join(1)

n, nb = own["steps"], max(produced["batches"], 1)
gpu_busy = n * gpu_step_s if gpu_step_s is not None else None


def share(v: float | None) -> float | None:
    return round(v / wall, 4) if v is not None else None


def delta(a: float | None, b: float | None) -> float | None:
    return round(b - a, 4) if a is not None and b is not None else None


main_wait, prod_wait = delta(wait0, wait1), delta(p_wait0, p_wait1)
sc.extra["producer"] = {"pid": sc.feeder["pid"], **producer_info}
sc.extra["self"] = {**{k: round(v, 4) for k, v in own.items()}, "wall_s": round(wall, 4),
                    "steps_per_s": round(n / wall, 2), "get_share": share(own["get_s"]),
                    "get_cpu_share": share(own["get_cpu_s"]), "get_empty_share": share(own["get_empty_s"]),
                    "copy_share": share(own["copy_s"]), "launch_share": share(own["launch_s"]),
                    "item_share": share(own["item_s"]),
                    "producer_batches": produced["batches"], "producer_make_s": round(produced["make_s"], 4),
                    "producer_make_cpu_s": round(produced["make_cpu_s"], 4),
                    "producer_put_s": round(produced["put_s"], 4),
                    "producer_make_share": share(produced["make_s"]), "producer_put_share": share(produced["put_s"]),
                    "producer_make_ms_mean": round(produced["make_s"] / nb * 1e3, 3),
                    "producer_run_s": delta(p_run0, p_run1), "producer_cpu_wait_s": prod_wait,
                    "producer_cpu_wait_share": share(prod_wait),
                    "main_run_s": round(run1 - run0, 4), "main_cpu_share": share(run1 - run0),
                    "main_cpu_wait_s": main_wait, "main_cpu_wait_share": share(main_wait),
                    "minor_faults_per_s": round((f1 - f0) / wall, 1), "cuda_mallocs_per_s": round((m1 - m0) / wall, 3),
                    "gpu_step_ms": round(gpu_step_s * 1e3, 4) if gpu_step_s is not None else None,
                    "gpu_busy_s": round(gpu_busy, 4) if gpu_busy is not None else None,
                    "gpu_busy_share": share(gpu_busy), "batch": BATCH, "queue_depth": DEPTH,
                    "batch_mb": round(BATCH * FEATURES * 4 / 2 ** 20, 2)}
sc.note(f"natural: measured by the script: {n} steps ({n / wall:.1f}/s) in {wall:.2f} s: {own['get_s']:.2f} s in "
        f"q.get() ({own['get_empty_s']:.2f} s in the {own['gets_empty']} gets that found the queue empty), "
        f"{own['copy_s']:.2f} s copying, {own['launch_s']:.2f} s queueing the steps, {own['item_s']:.2f} s in .item(); "
        f"the producer (tid {producer_info.get('tid')}) made {produced['batches']} batches, "
        f"{produced['make_s'] / nb * 1e3:.2f} ms each ({produced['make_cpu_s'] / nb * 1e3:.2f} ms of its CPU), "
        f"{produced['put_s']:.2f} s blocked in put(); "
        + (f"a step's kernels take {gpu_step_s * 1e3:.2f} ms of GPU time queued (GPU busy {gpu_busy / wall:.0%} of the "
           "run)." if gpu_busy is not None else "no GPU timings (no CUDA)."))
sc.write_truth(baseline=(b0, b1), window=None, ratio_spans=((b0, mid), (mid, b1)))
