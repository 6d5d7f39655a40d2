"""natural_healthy_pde_producer_process (natural, nothing staged): a control. A neural surrogate for a PDE solver, the
way scientific-ML codes train one on data made on the fly: a U-Net (widths 96-192-384-768, two 3x3 convolutions with
BatchNorm and GELU a level, max-pooling down, transposed convolutions up, skip connections; fp32 without TF32,
cudnn.benchmark, fused AdamW, a relative-L2 loss, loss.item() each step) learns to map a source field f to the
solution u of a nonlinear Poisson problem (-lap u / 16 + u + 0.1 u^3 = f, periodic, 128x128), 32 pairs a step: ~100 ms
of GPU work a step against a few ms of queueing. The pairs come from a producer process of its own
(torch.multiprocessing, forked before the measured run) that simulates them with numpy's FFTs: a Gaussian random
field for f (white noise filtered in Fourier space, standardised), the linear solve in Fourier space and a few
fixed-point sweeps for the cubic term (each a forward and an inverse FFT of the batch), then the two tensors put on a
torch.multiprocessing Queue(maxsize=6) (moved to shared memory, their file descriptors handed over on the queue),
blocking when it is full. The number of sweeps (0 to 8) is set at start-up from a timing of the producer's work on
this host's CPU so that a batch costs about half a training step (the script's choice, so that the control stays a
control on any CPU: the producer busy on its CPU about half the time, never behind). The main thread takes each batch
with queue.get() (found ready), copies it to the GPU (pageable, non_blocking) and trains. The decoy: a second process
of the job busy on a CPU of the job a good part of the run, handing the trainer every batch; the trainer never waits
for it. The job (and its producer, which inherits them) on CPUs 2-5; no threads of the job's own, no workers, no IO,
no lock, no sleep. 20 s (smaller with --device cpu: 32x32 fields, 8 pairs a step, a U-Net of widths 8-16-32-64).

The script measures itself: the steps per second; the main thread's time in queue.get() (`get_s`, its CPU clock
`get_cpu_s`; `gets_ready`: the gets that found a batch already there, qsize() > 0), copying the batch to the GPU
(`h2d_s`), queueing the forward and the optimiser step (`step_s`), in loss.backward() (`backward_s`, its wait on
PyTorch's autograd thread) and in loss.item() (`item_s`: its wait for the GPU); the producer's time making each batch
(wall and its thread's CPU clock) and blocked in put() (the queue full), sent with each batch; the producer's
threads' time on a CPU and waiting for one (schedstat) over the run; the producer's work timed before it starts
(`calibration`); before the producer starts, the same loop on one batch kept on the GPU, so that what the producer
costs the run is known (`producer_overhead_s`: the run's wall time beyond its steps at that rate); the main thread's
and the autograd thread's time on a CPU and waiting for one over the run (schedstat); the process's minor and major
page faults and the device allocator's cudaMalloc calls; and a step's GPU time queued (common.gpu_seconds_queued: a
batch already on the GPU, forward, loss, backward, AdamW, nothing read back), so that the GPU's busy share is known.
Truth `autograd` names PyTorch's autograd thread, `producer` and `decoys` the producer process."""

import os
import queue
import resource
import threading
import time

from common import Scenario, comm_of, gpu_seconds_queued, tids_of

sc = Scenario("natural_healthy_pde_producer_process", "natural", "a GPU-bound U-Net PDE surrogate (widths 96-768, 32 "
              "fields of 128x128 a step) fed through a torch.multiprocessing Queue by a producer process that "
              "simulates each batch with numpy FFTs, busy on a CPU of the job about half the time and always ahead "
              "(the decoy), 20 s, nothing staged", job_cpus=[2, 3, 4, 5], control=True)
import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.multiprocessing as torch_mp  # noqa: E402

nn = torch.nn
F = nn.functional
PID, MAIN = os.getpid(), threading.get_native_id()
dev = torch.device(sc.device)
if sc.cuda:
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cudnn.benchmark = True
S, BATCH, WIDTHS = (128, 32, (96, 192, 384, 768)) if sc.cuda else (32, 8, (8, 16, 32, 64))
DEPTH, KAPPA, MAX_SWEEPS = 6, np.float32(0.1), 8
KX, KY = np.fft.fftfreq(S) * S, np.fft.rfftfreq(S) * S
K2 = (KX[:, None] ** 2 + KY[None, :] ** 2).astype(np.float32)
SPEC = ((1 + K2 / 16) ** -2).astype(np.float32)  # the source's spectrum: smooth fields
DENOM = (1 + K2 / 16).astype(np.float32)  # -lap / 16 + 1, in Fourier space
KEYS = ("get_s", "get_cpu_s", "h2d_s", "step_s", "backward_s", "item_s", "make_s", "make_cpu_s", "put_s")
own = {"steps": 0, "gets_ready": 0, "batches": 0, **dict.fromkeys(KEYS, 0.0), "running_loss": 0.0}


def simulate(rng: np.random.Generator, sweeps: int) -> tuple[np.ndarray, np.ndarray]:
    """A batch of (f, u): f a standardised Gaussian random field, u the solution of -lap u / 16 + u + KAPPA u^3 = f
    (periodic): the linear solve, then `sweeps` fixed-point sweeps for the cubic term."""
    fh = np.fft.rfft2(rng.standard_normal((BATCH, S, S), dtype=np.float32)) * SPEC
    f = np.fft.irfft2(fh, s=(S, S)).astype(np.float32)
    scale = (1.0 / f.std(axis=(1, 2), keepdims=True)).astype(np.float32)
    f *= scale
    u = np.fft.irfft2(fh * scale / DENOM, s=(S, S)).astype(np.float32)
    for _ in range(sweeps):
        u = np.fft.irfft2(np.fft.rfft2(f - KAPPA * u ** 3) / DENOM, s=(S, S)).astype(np.float32)
    return f[:, None], u[:, None]


def produce(out, halt, sweeps: int, seed: int) -> None:
    """The producer process: a batch at a time until halted, each sent with what making it took."""
    rng = np.random.default_rng(seed)
    k, put_s = 0, 0.0
    while not halt.is_set():
        w0, c0 = time.perf_counter(), time.thread_time()
        f, u = simulate(rng, sweeps)
        w1, c1 = time.perf_counter(), time.thread_time()
        out.put((torch.from_numpy(f), torch.from_numpy(u),
                 {"k": k, "make_s": w1 - w0, "make_cpu_s": c1 - c0, "prev_put_s": put_s}))
        put_s = time.perf_counter() - w1  # blocked while the queue was full
        k += 1


def block(cin: int, cout: int) -> nn.Sequential:
    return nn.Sequential(nn.Conv2d(cin, cout, 3, 1, 1, bias=False), nn.BatchNorm2d(cout), nn.GELU(),
                         nn.Conv2d(cout, cout, 3, 1, 1, bias=False), nn.BatchNorm2d(cout), nn.GELU())


class UNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.enc = nn.ModuleList()
        c = 1
        for w in WIDTHS[:-1]:
            self.enc.append(block(c, w))
            c = w
        self.mid = block(c, WIDTHS[-1])
        c = WIDTHS[-1]
        self.ups, self.dec = nn.ModuleList(), nn.ModuleList()
        for w in reversed(WIDTHS[:-1]):
            self.ups.append(nn.ConvTranspose2d(c, w, 2, 2))
            self.dec.append(block(2 * w, w))
            c = w
        self.head = nn.Conv2d(c, 1, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        skips = []
        for b in self.enc:
            x = b(x)
            skips.append(x)
            x = F.max_pool2d(x, 2)
        x = self.mid(x)
        for up, b, s in zip(self.ups, self.dec, reversed(skips)):
            x = b(torch.cat([up(x), s], dim=1))
        return self.head(x)


def schedstat(pid: int, tid: int) -> tuple[float, float] | None:
    try:
        with open(f"/proc/{pid}/task/{tid}/schedstat") as fh:
            run, wait = fh.read().split()[:2]
        return int(run) / 1e9, int(wait) / 1e9
    except (OSError, ValueError):
        return None


def proc_schedstat(pid: int) -> dict[int, tuple[float, float]]:
    return {t: s for t in tids_of(pid) if (s := schedstat(pid, t)) is not None}


def autograd_thread() -> dict | None:
    for tid in tids_of(PID):
        comm = comm_of(PID, tid) or ""
        if comm.startswith("pt_autograd"):
            return {"pid": PID, "tid": tid, "comm": comm}
    return None


torch.manual_seed(0)
model = UNet().to(dev)
opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=1e-4, fused=sc.cuda or None)
ctx = torch_mp.get_context("fork")
batches = ctx.Queue(maxsize=DEPTH)
halt = ctx.Event()
state: dict = {"fixed": None, "producer": None}


def rel_l2(pred: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    return ((pred - u) ** 2).mean() / (u ** 2).mean()


def train(f: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    t0 = time.perf_counter()
    loss = rel_l2(model(f), u)
    opt.zero_grad(set_to_none=True)
    t1 = time.perf_counter()
    loss.backward()
    t2 = time.perf_counter()
    opt.step()
    own["backward_s"] += t2 - t1
    own["step_s"] += (t1 - t0) + (time.perf_counter() - t2)
    return loss


def get_batch():
    if state["fixed"] is not None:
        return state["fixed"]
    t0, c0 = time.perf_counter(), time.thread_time()
    ready = batches.qsize() > 0
    f, u, st = batches.get()
    own["get_s"] += time.perf_counter() - t0
    own["get_cpu_s"] += time.thread_time() - c0
    own["gets_ready"] += int(ready)
    own["batches"] += 1
    own["make_s"] += st["make_s"]
    own["make_cpu_s"] += st["make_cpu_s"]
    own["put_s"] += st["prev_put_s"]
    return f, u


def step() -> None:
    f, u = get_batch()
    t1 = time.perf_counter()
    f, u = f.to(dev, non_blocking=True), u.to(dev, non_blocking=True)
    t2 = time.perf_counter()
    loss = train(f, u)
    t3 = time.perf_counter()
    own["running_loss"] += loss.item()
    own["item_s"] += time.perf_counter() - t3
    own["h2d_s"] += t2 - t1
    own["steps"] += 1


def sync() -> None:
    if sc.cuda:
        torch.cuda.synchronize()


def reset() -> None:
    for k in own:
        own[k] = 0 if k in ("steps", "gets_ready", "batches") else 0.0


def timed(seconds: float) -> tuple[int, float]:
    n0, t = own["steps"], time.perf_counter()
    end = t + seconds
    while time.perf_counter() < end:
        step()
    sync()
    return own["steps"] - n0, time.perf_counter() - t


def work_s(sweeps: int) -> float:
    """The producer's work for a batch with `sweeps` sweeps, timed here (the faster of two)."""
    rng, best = np.random.default_rng(99), float("inf")
    for _ in range(2):
        t0 = time.perf_counter()
        simulate(rng, sweeps)
        best = min(best, time.perf_counter() - t0)
    return best


try:
    # Without the producer first: one batch made here, kept on the GPU (what the producer costs, were it a cost).
    f0, u0 = simulate(np.random.default_rng(1), 2)
    state["fixed"] = (torch.from_numpy(f0).to(dev), torch.from_numpy(u0).to(dev))
    for _ in range(10):  # warm-up: cuDNN's algorithms chosen, the allocator, the autograd thread
        step()
    sync()
    gpu_step_s = None
    if sc.cuda:
        runs = sorted(r for r in (gpu_seconds_queued(torch, lambda _: train(*state["fixed"])) for _ in range(5))
                      if r is not None)
        gpu_step_s = runs[len(runs) // 2] if runs else None
    timed(0.5 * sc.scale)
    reset()
    fix_steps, fix_wall = timed(3.0 * sc.scale)
    fix_rate = fix_steps / fix_wall if fix_wall > 0 else None
    # The producer's sweeps: a batch about half a step on this CPU.
    base_s, two_s = work_s(0), work_s(2)
    sweep_s = max((two_s - base_s) / 2, 1e-4)
    step_fix_s = 1 / fix_rate if fix_rate else 0.1
    sweeps = int(min(MAX_SWEEPS, max(0, round((0.5 * step_fix_s - base_s) / sweep_s))))
    calibration = {"base_ms": round(base_s * 1e3, 3), "sweep_ms": round(sweep_s * 1e3, 3), "sweeps": sweeps,
                   "step_fix_ms": round(step_fix_s * 1e3, 3),
                   "batch_ms_expected": round((base_s + sweeps * sweep_s) * 1e3, 3)}
    producer = ctx.Process(target=produce, args=(batches, halt, sweeps, 7), name="pde_producer", daemon=True)
    producer.start()
    state["producer"] = producer
    state["fixed"] = None
    timed(2.0 * sc.scale)  # the producer started and ahead, the queue's sharing warm, the spin kernels well before
    ag = autograd_thread()
    ppid = producer.pid
    reset()
    main0 = schedstat(PID, MAIN)
    ag0 = schedstat(PID, ag["tid"]) if ag else None
    p0 = proc_schedstat(ppid)
    r0 = resource.getrusage(resource.RUSAGE_SELF)
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
    p1 = proc_schedstat(ppid)
    r1 = resource.getrusage(resource.RUSAGE_SELF)
    m1 = int(torch.cuda.memory_stats().get("segment.all.allocated", 0)) if sc.cuda else 0
    producer_row = {"pid": ppid, "tids": tids_of(ppid), "comm": comm_of(ppid)}
    producer_threads = [{"tid": tid, "comm": comm_of(ppid, tid)} for tid in tids_of(ppid)]
finally:
    halt.set()
    p = state["producer"]
    if p is not None:
        end = time.monotonic() + 5
        while p.is_alive() and time.monotonic() < end:  # a put blocked on the full queue returns once drained
            try:
                batches.get(timeout=0.2)
            except (queue.Empty, OSError, EOFError):
                pass
        if p.is_alive():
            p.terminate()
        p.join(2)
n = own["steps"]


def share(v: float | None) -> float | None:
    return round(v / wall, 4) if v is not None else None


def r4(v: float | None) -> float | None:
    return round(v, 4) if v is not None else None


def delta(a, b, k: int) -> float | None:
    return r4(b[k] - a[k]) if a and b else None


at_fix = n / fix_rate if fix_rate else None
overhead = max(0.0, wall - at_fix) if at_fix is not None else None
main_run, main_wait = delta(main0, main1, 0), delta(main0, main1, 1)
ag_run, ag_wait = delta(ag0, ag1, 0), delta(ag0, ag1, 1)
prod_run = r4(sum(p1[t][0] - p0[t][0] for t in p1 if t in p0))
prod_wait = r4(sum(p1[t][1] - p0[t][1] for t in p1 if t in p0))
gpu_busy = n * gpu_step_s if gpu_step_s is not None else None
nb = max(own["batches"], 1)
span = [b0, b1]
sc.extra["autograd"] = ag
sc.extra["producer"] = {**producer_row, "threads": producer_threads,
                        "what": "torch.multiprocessing.Process: numpy FFT simulation of (f, u) batches, put on a "
                                "torch.multiprocessing Queue(maxsize=6)"}
sc.extra["decoys"] = [{"what": "the producer process (numpy FFT simulation), always ahead of the trainer",
                       **producer_row, "span_ns": span}]
sc.extra["calibration"] = calibration
sc.extra["self"] = {**{k: round(v, 4) if isinstance(v, float) else v for k, v in own.items()},
                    "wall_s": round(wall, 4), "steps_per_s": round(n / wall, 2),
                    "step_ms_mean": round(wall / max(n, 1) * 1e3, 3),
                    # the main thread's wait for input: its time in queue.get()
                    "wait_s": round(own["get_s"], 4), "wait_share": share(own["get_s"]),
                    "wait_cpu_s": round(own["get_cpu_s"], 4),
                    "wait_off_cpu_s": round(max(0.0, own["get_s"] - own["get_cpu_s"]), 4),
                    "gets_ready_share": round(own["gets_ready"] / nb, 4),
                    "h2d_share": share(own["h2d_s"]), "step_share": share(own["step_s"]),
                    "backward_share": share(own["backward_s"]), "item_share": share(own["item_s"]),
                    "sweeps": sweeps, "producer_make_ms_mean": round(own["make_s"] / nb * 1e3, 3),
                    "producer_put_ms_mean": round(own["put_s"] / nb * 1e3, 3),
                    # the producer making the run's batches, as a share of the run: busy, and how far ahead
                    "producer_busy_share": share(own["make_s"]),
                    "producer_run_s": prod_run, "producer_cpu_share": share(prod_run),
                    "producer_cpu_wait_s": prod_wait, "producer_cpu_wait_share": share(prod_wait),
                    "fix_steps": fix_steps, "fix_wall_s": round(fix_wall, 4),
                    "fix_steps_per_s": round(fix_rate, 3) if fix_rate else None,
                    "at_fix_rate_s": r4(at_fix), "producer_overhead_s": r4(overhead),
                    "producer_overhead_share": share(overhead),
                    "main_run_s": main_run, "main_cpu_share": share(main_run),
                    "main_cpu_wait_s": main_wait, "main_cpu_wait_share": share(main_wait),
                    "autograd_run_s": ag_run, "autograd_cpu_share": share(ag_run),
                    "autograd_cpu_wait_s": ag_wait, "autograd_cpu_wait_share": share(ag_wait),
                    "minor_faults_per_s": round((r1.ru_minflt - r0.ru_minflt) / wall, 1),
                    "major_faults": r1.ru_majflt - r0.ru_majflt,
                    "cuda_mallocs_per_s": round((m1 - m0) / wall, 3),
                    "gpu_step_ms": round(gpu_step_s * 1e3, 4) if gpu_step_s is not None else None,
                    "gpu_busy_s": r4(gpu_busy), "gpu_busy_share": share(gpu_busy),
                    "batch": BATCH, "grid": S, "widths": list(WIDTHS), "queue_depth": DEPTH}
if not sc.cuda:
    sc.note("on the CPU: no autograd thread (the backward runs on the main thread), no GPU timings, no allocator "
            "counters; the job is not GPU-bound there.")
sc.note(f"natural: measured by the script: {n} steps ({n / wall:.2f}/s) in {wall:.2f} s: {own['item_s']:.2f} s in "
        f".item() (waiting for the GPU), {own['get_s']:.3f} s in queue.get() ({own['gets_ready']} of "
        f"{own['batches']} gets found a batch ready); the producer ({sweeps} sweeps) made a batch in "
        f"{own['make_s'] / nb * 1e3:.1f} ms, ran {prod_run} s of the run; without it "
        f"{fix_rate and round(fix_rate, 2)} steps/s (it cost {overhead and round(overhead, 2)} s of the run); the "
        f"main thread ran {main_run} s, waited for a CPU {main_wait} s; "
        + (f"a step's kernels take {gpu_step_s * 1e3:.1f} ms of GPU time queued (GPU busy {gpu_busy / wall:.0%} of the "
           "run)." if gpu_busy is not None else "no GPU timings (no CUDA)."))
sc.write_truth(baseline=(b0, b1), window=None, ratio_spans=((b0, mid), (mid, b1)))
