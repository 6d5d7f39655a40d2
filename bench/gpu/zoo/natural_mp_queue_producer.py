"""natural_mp_queue_producer (natural, nothing staged): a trainer fed by a producer process of its own, as a script that
skips the DataLoader writes it: a multiprocessing.Process (Python name `batch_producer`; its OS name the parent's, as
forked) makes batches with numpy from a synthetic 8-channel recording held in memory: random windows of 64 steps
gathered, each standardised per channel and given a random gain (for the batch at once), then per sample in a Python
loop a random time shift (np.roll) and, for half of them, a time mask; then a noise and a label (the recording's
segment); 4096 samples of 512 float32 features (8 MB) a batch, put on a multiprocessing.Queue(maxsize=8), pickled
through its pipe by the queue's feeder thread. The trainer's main thread takes each batch with queue.get() (the pipe
read and the unpickle), copies it to the GPU from pageable memory (torch.from_numpy(...).to(device)) and trains the
zoo's MLP (512-2048-2048-2048-10, fp32 without TF32, fused AdamW, loss.item() each step). CPUs 2-4 for the job (the
producer inherits them), 20 s. The script measures itself: the main thread's time in queue.get() (apart: the gets that
found a batch already made, qsize() > 0, and those that waited for one), in the copy, in the training step; the unpickle
of a batch alone; the producer's time making each batch (wall and its thread's CPU time) and blocked in put() (the queue
full), sent with each batch; the main thread's and the producer's threads' schedstat (CPU time and run-queue wait) and
both processes' minor page faults over the run; and a step's GPU time queued (common.gpu_seconds_queued), so that the
GPU's busy share is known. Truth `producer` names the producer process (pid, tids, comm)."""

import multiprocessing
import os
import pickle
import queue
import threading
import time

import numpy as np

from common import Scenario, Trainer, comm_of, gpu_seconds_queued, tids_of

sc = Scenario("natural_mp_queue_producer", "natural", "an MLP fed by a multiprocessing.Process producer making numpy "
              "batches (per-sample windows, standardise, gain, shift, mask) sent through a multiprocessing.Queue, "
              "CPUs 2-4, 20 s, nothing staged", job_cpus=[2, 3, 4], control=True)
CH, WIN, T_REC, NSEG, DEPTH = 8, 64, 400_000, 10, 8
BATCH = 4096 if sc.cuda else 512


def produce(out: multiprocessing.Queue, halt, batch: int, seed: int) -> None:
    """The producer process: a batch at a time, forever, each sent with what making it took."""
    rng = np.random.default_rng(seed)
    t = np.arange(T_REC, dtype=np.float32)
    freq = rng.uniform(0.01, 0.2, (CH, 1)).astype(np.float32)
    recording = np.sin(t * freq) + 0.05 * np.cumsum(rng.standard_normal((CH, T_REC), dtype=np.float32), axis=1)
    recording = recording.astype(np.float32)
    windows = np.lib.stride_tricks.sliding_window_view(recording, WIN, axis=1)  # (CH, T_REC - WIN + 1, WIN), a view
    k, put_s = 0, 0.0
    while not halt.is_set():
        w0, c0 = time.perf_counter(), time.thread_time()
        starts = rng.integers(0, T_REC - WIN, batch)
        x = windows[:, starts].transpose(1, 0, 2)  # (batch, CH, WIN), a copy
        x = (x - x.mean(axis=2, keepdims=True)) / (x.std(axis=2, keepdims=True) + 1e-5)
        x *= rng.uniform(0.8, 1.2, (batch, 1, 1)).astype(np.float32)
        for j in range(batch):  # per sample: a random time shift and, for half of them, a time mask
            x[j] = np.roll(x[j], int(rng.integers(-4, 5)), axis=1)
            if rng.random() < 0.5:
                m = int(rng.integers(0, WIN - 8))
                x[j, :, m:m + int(rng.integers(1, 9))] = 0.0
        x = x.reshape(batch, CH * WIN)
        x += rng.standard_normal(x.shape, dtype=np.float32) * np.float32(0.01)
        y = (starts * NSEG // T_REC).astype(np.int64)
        w1, c1 = time.perf_counter(), time.thread_time()
        out.put((x, y, {"k": k, "make_s": w1 - w0, "make_cpu_s": c1 - c0, "made_ns": time.time_ns(),
                        "prev_put_s": put_s}))  # the previous put's time blocked (the queue full)
        put_s = time.perf_counter() - w1
        k += 1


batches: multiprocessing.Queue = multiprocessing.Queue(maxsize=DEPTH)
halt = multiprocessing.Event()
producer = multiprocessing.Process(target=produce, args=(batches, halt, BATCH, 7), name="batch_producer", daemon=True)
producer.start()
PID, MAIN = os.getpid(), threading.get_native_id()
tr = Trainer(sc, batch=BATCH)
torch = tr.torch
own = {"steps": 0, "get_s": 0.0, "get_ready_s": 0.0, "get_empty_s": 0.0, "gets_empty": 0, "copy_s": 0.0,
       "step_s": 0.0, "make_s": 0.0, "make_cpu_s": 0.0, "put_s": 0.0}
kept: list = []


def schedstat(pid: int, tid: int) -> tuple[int, int] | None:
    try:
        run, wait = open(f"/proc/{pid}/task/{tid}/schedstat").read().split()[:2]
        return int(run), int(wait)
    except (OSError, ValueError):
        return None


def minflt(pid: int) -> int | None:
    try:
        return int(open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[7])
    except (OSError, ValueError, IndexError):
        return None


def step() -> None:
    t0 = time.perf_counter()
    ready = batches.qsize() > 0  # a batch already made (its put done): the get only reads it through the pipe
    x, y, meta = batches.get()
    t1 = time.perf_counter()
    xb, yb = torch.from_numpy(x).to(tr.dev), torch.from_numpy(y).to(tr.dev)
    t2 = time.perf_counter()
    tr.step(xb, yb)
    t3 = time.perf_counter()
    own["get_s"] += t1 - t0
    own["get_ready_s" if ready else "get_empty_s"] += t1 - t0
    own["gets_empty"] += not ready
    own["copy_s"] += t2 - t1
    own["step_s"] += t3 - t2
    own["make_s"] += meta["make_s"]
    own["make_cpu_s"] += meta["make_cpu_s"]
    own["put_s"] += meta["prev_put_s"]
    own["steps"] += 1
    if not kept:
        kept.append((x, y, meta))


def work(_) -> None:
    """A training step's GPU work, nothing read back."""
    tr.loss_fn(tr.model(tr.xs[0]), tr.ys[0]).backward()
    tr.opt.step()
    tr.opt.zero_grad(set_to_none=True)


try:
    for _ in range(15):
        step()
    tr.sync()
    blob = pickle.dumps(kept[0], protocol=pickle.HIGHEST_PROTOCOL)
    loads = []
    for _ in range(5):
        u0 = time.perf_counter()
        pickle.loads(blob)
        loads.append(time.perf_counter() - u0)
    unpickle_s = sorted(loads)[2]
    gpu_step_s = None
    if sc.cuda:
        runs = sorted(r for r in (gpu_seconds_queued(torch, work) for _ in range(5)) if r is not None)
        gpu_step_s = runs[len(runs) // 2] if runs else None
    warm_end = time.perf_counter() + 2.0 * sc.scale  # the spin kernels well before the baseline
    while time.perf_counter() < warm_end:
        step()
    tr.sync()
    for k in own:
        own[k] = 0 if k in ("steps", "gets_empty") else 0.0
    ptids = tids_of(producer.pid)
    pstats0 = {t: schedstat(producer.pid, t) for t in ptids}
    main0 = schedstat(PID, MAIN)
    flt0 = (minflt(PID), minflt(producer.pid))
    b0 = sc.mark("baseline")
    t = time.perf_counter()
    sc.run_for(10.0 * sc.scale, step)
    mid = sc.mark("half")
    sc.run_for(10.0 * sc.scale, step)
    b1 = sc.mark("end")
    wall = time.perf_counter() - t
    main1 = schedstat(PID, MAIN)
    flt1 = (minflt(PID), minflt(producer.pid))
    ptids = tids_of(producer.pid)
    pstats1 = {t: schedstat(producer.pid, t) for t in ptids}
    producer_info = {"pid": producer.pid, "tids": ptids, "comm": comm_of(producer.pid), "name": producer.name,
                     "comms": [comm_of(producer.pid, t) for t in ptids]}
finally:
    halt.set()
    deadline = time.monotonic() + 10
    while producer.is_alive() and time.monotonic() < deadline:
        try:
            batches.get(timeout=0.1)
        except queue.Empty:
            pass
    if producer.is_alive():
        producer.terminate()
    producer.join(5)


def delta(a: dict, b: dict, k: int) -> float | None:
    got = [b[t][k] - (a.get(t) or (0, 0))[k] for t in b if b[t]]
    return round(sum(got) / 1e9, 4) if got else None


n = own["steps"]
p_run, p_wait = delta(pstats0, pstats1, 0), delta(pstats0, pstats1, 1)
m_run = round((main1[0] - main0[0]) / 1e9, 4) if main0 and main1 else None
m_wait = round((main1[1] - main0[1]) / 1e9, 4) if main0 and main1 else None
gpu_busy = n * gpu_step_s if gpu_step_s is not None else None
faults = [round((b - a) / wall, 1) if a is not None and b is not None else None for a, b in zip(flt0, flt1)]


def share(v: float | None) -> float | None:
    return round(v / wall, 4) if v is not None else None


sc.extra["producer"] = producer_info
sc.extra["self"] = {**{k: round(v, 4) for k, v in own.items()}, "wall_s": round(wall, 4),
                    "steps_per_s": round(n / wall, 2), "step_ms_mean": round(wall / max(n, 1) * 1e3, 4),
                    "get_share": share(own["get_s"]), "get_empty_share": share(own["get_empty_s"]),
                    "get_ready_share": share(own["get_ready_s"]), "copy_share": share(own["copy_s"]),
                    "step_share": share(own["step_s"]),
                    "make_ms_mean": round(own["make_s"] / max(n, 1) * 1e3, 4),
                    "make_cpu_ms_mean": round(own["make_cpu_s"] / max(n, 1) * 1e3, 4),
                    "unpickle_ms": round(unpickle_s * 1e3, 4),
                    "main_run_s": m_run, "main_cpu_wait_s": m_wait, "main_cpu_wait_share": share(m_wait),
                    "minor_faults_per_s": faults[0], "producer_minor_faults_per_s": faults[1],
                    "producer_run_s": p_run, "producer_cpu_wait_s": p_wait, "producer_cpu_wait_share": share(p_wait),
                    "gpu_step_ms": round(gpu_step_s * 1e3, 4) if gpu_step_s is not None else None,
                    "gpu_busy_share": round(gpu_busy / wall, 4) if gpu_busy is not None else None,
                    "batch": BATCH, "batch_mb": round(BATCH * CH * WIN * 4 / 2 ** 20, 2), "queue_depth": DEPTH}
sc.note(f"natural: measured by the script: {n} steps ({n / wall:.1f}/s) in {wall:.2f} s: {own['get_s']:.2f} s in "
        f"queue.get() ({own['get_empty_s']:.2f} s in the {own['gets_empty']} gets that found no batch made, "
        f"{own['get_ready_s']:.2f} s in the others; a batch's unpickle alone {unpickle_s * 1e3:.2f} ms), "
        f"{own['copy_s']:.2f} s copying to the device, {own['step_s']:.2f} s in training steps; the producer "
        f"(pid {producer_info['pid']}) took {own['make_s'] / max(n, 1) * 1e3:.1f} ms a batch to make "
        f"({own['make_cpu_s'] / max(n, 1) * 1e3:.1f} ms of CPU); "
        + (f"a step's kernels take {gpu_step_s * 1e3:.2f} ms of GPU time queued (GPU busy {gpu_busy / wall:.0%} of the "
           "run)." if gpu_busy is not None else "no GPU timings (no CUDA)."))
sc.write_truth(baseline=(b0, b1), window=None, ratio_spans=((b0, mid), (mid, b1)))
