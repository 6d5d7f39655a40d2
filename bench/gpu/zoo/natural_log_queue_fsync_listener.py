"""natural_log_queue_fsync_listener (natural, nothing staged): a training loop that logs its metrics every step through
Python's logging the way the logging cookbook recommends for code that "must not block on slow handlers" (the
QueueHandler / QueueListener pattern: the loop's logger has one QueueHandler, a QueueListener thread owns the real
handler), with two changes teams make: the queue is bounded (queue.Queue(maxsize=512), so that a stalled disk cannot
eat the host's memory) and the handler's enqueue() is overridden to put() with blocking, so that no record is dropped
(the stock QueueHandler uses put_nowait and would raise queue.Full into handleError); the listener's handler is a
"durable" FileHandler that flushes and os.fsync()s after every record so that the log survives a crash (to a file in a
folder under /var/tmp, ZOO_DATA_DIR: the local disk). The loop: the zoo's MLP (512-2048-2048-2048-10, batch 2048 from
a pool of 8 on the GPU, fp32 without TF32, fused AdamW, clip_grad_norm_(1.0), a cosine lr schedule); after each step
one read-back of 8 values (loss, accuracy, the gradient norm, the 4 layers' weight norms, the logits' mean:
torch.stack(...).tolist(), the step's one wait for the GPU), then 12 log records (`for k, v in metrics.items():
log.info("step %d %s=%.6g", step, k, v)`, the 8 values and the lr, the step's time, samples/s and the allocator's
memory). Once the listener falls behind, the queue stays full and each put() waits for the listener's next get(): the
main thread sleeps on the queue's condition, woken by the listener thread (OS name `log_listener`, truth `listener`),
which spends its time in fsync waiting for the disk; the GPU idles meanwhile. One process on CPUs 2-3; no workers, no
children, no timed sleep; the listener is the only thread of the job's own (PyTorch's autograd thread runs the
backward). 20 s (smaller with --device cpu: the MLP shrunk to width 64, batch 256).

The script measures itself: the steps per second; the main thread's time in the step (`step_s`: queueing it, its
clip and optimiser), in loss.backward() (`backward_s`, its wait on PyTorch's autograd thread), in the read-back
(`item_s`), in the log calls (`log_s`) and, within them, in put() on the queue (`put_s`, its CPU clock `put_cpu_s`,
and the puts that found the queue full: `puts_full`); the listener thread's records, its time in fsync (`fsync_s`)
and in the whole emit (`emit_s`), its time on a CPU and waiting for one (schedstat); the bytes the process wrote and
those it sent to storage (/proc/self/io); before the run, the same loop with the handler flushing but not fsyncing
(the fix), so that what the fsyncs cost the run is known (`fsync_overhead_s`: the run's wall time beyond its steps at
that rate); the main thread's and the autograd thread's time on a CPU and waiting for one over the run (schedstat);
the process's minor page faults and the device allocator's cudaMalloc calls; and a step's GPU time queued
(common.gpu_seconds_queued: forward, backward, the clip, AdamW, nothing read back), so that the GPU's busy share is
known. Truth `autograd` names PyTorch's autograd thread."""

import logging
import logging.handlers
import math
import os
import queue
import resource
import shutil
import tempfile
import threading
import time

from common import Scenario, comm_of, gpu_seconds_queued, set_thread_name, tids_of

sc = Scenario("natural_log_queue_fsync_listener", "natural", "the zoo's MLP logging 12 records a step through a "
              "blocking QueueHandler on a bounded queue whose QueueListener thread flushes and fsyncs every record, "
              "20 s, nothing staged", job_cpus=[2, 3], control=True)
import torch  # noqa: E402

nn = torch.nn
F = nn.functional
PID, MAIN = os.getpid(), threading.get_native_id()
dev = torch.device(sc.device)
if sc.cuda:
    torch.backends.cuda.matmul.allow_tf32 = False
WIDTH, BATCH, IN_DIM, CLASSES, POOL = (2048, 2048, 512, 10, 8) if sc.cuda else (64, 256, 512, 10, 8)
QUEUE_MAX = 512
DATA = tempfile.mkdtemp(prefix="zoo_logq_", dir=os.environ.get("ZOO_DATA_DIR", "/var/tmp"))
LOG_PATH = os.path.join(DATA, "train.log")
KEYS = ("step_s", "backward_s", "item_s", "log_s", "put_s", "put_cpu_s")
own = {"steps": 0, **dict.fromkeys(KEYS, 0.0), "puts": 0, "puts_full": 0}
lst = {"records": 0, "fsync_s": 0.0, "emit_s": 0.0, "tid": None, "comm": None}


class DurableFileHandler(logging.FileHandler):
    """A FileHandler that flushes and fsyncs every record (`durable` off: flushes only, the fix)."""

    durable = True

    def emit(self, record: logging.LogRecord) -> None:
        t0 = time.perf_counter()
        super().emit(record)  # format, write, flush
        if self.durable and self.stream is not None:
            t1 = time.perf_counter()
            os.fsync(self.stream.fileno())
            lst["fsync_s"] += time.perf_counter() - t1
        lst["records"] += 1
        lst["emit_s"] += time.perf_counter() - t0


class BlockingQueueHandler(logging.handlers.QueueHandler):
    """A QueueHandler that blocks on a full queue instead of raising queue.Full (no record dropped)."""

    def enqueue(self, record: logging.LogRecord) -> None:
        t0, c0 = time.perf_counter(), time.thread_time()
        full = self.queue.full()
        self.queue.put(record)
        own["put_s"] += time.perf_counter() - t0
        own["put_cpu_s"] += time.thread_time() - c0
        own["puts"] += 1
        own["puts_full"] += int(full)


class NamedListener(logging.handlers.QueueListener):
    """The stock QueueListener; its thread names itself for the OS (`log_listener`)."""

    def _monitor(self) -> None:
        set_thread_name("log_listener")
        lst["tid"], lst["comm"] = threading.get_native_id(), "log_listener"
        super()._monitor()

    def enqueue_sentinel(self) -> None:
        self.queue.put(self._sentinel)  # the queue is bounded: wait for room rather than raise queue.Full


def schedstat(tid: int) -> tuple[float, float] | None:
    try:
        with open(f"/proc/{PID}/task/{tid}/schedstat") as fh:
            run, wait = fh.read().split()[:2]
        return int(run) / 1e9, int(wait) / 1e9
    except (OSError, ValueError):
        return None


def proc_io() -> dict | None:
    try:
        with open(f"/proc/{PID}/io") as fh:
            return {k: int(v) for k, v in (line.split(": ") for line in fh.read().splitlines())}
    except (OSError, ValueError):
        return None


def autograd_thread() -> dict | None:
    for tid in tids_of(PID):
        comm = comm_of(PID, tid) or ""
        if comm.startswith("pt_autograd"):
            return {"pid": PID, "tid": tid, "comm": comm}
    return None


log_q: queue.Queue = queue.Queue(maxsize=QUEUE_MAX)
handler = DurableFileHandler(LOG_PATH)
handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
listener = NamedListener(log_q, handler, respect_handler_level=True)
log = logging.getLogger("train.metrics")
log.setLevel(logging.INFO)
log.propagate = False
log.addHandler(BlockingQueueHandler(log_q))
listener.start()

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(IN_DIM, WIDTH), nn.ReLU(), nn.Linear(WIDTH, WIDTH), nn.ReLU(),
                      nn.Linear(WIDTH, WIDTH), nn.ReLU(), nn.Linear(WIDTH, CLASSES)).to(dev)
linears = [m for m in model if isinstance(m, nn.Linear)]
opt = torch.optim.AdamW(model.parameters(), lr=3e-4, fused=sc.cuda or None)
TOTAL_STEPS = 100_000
sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 0.5 * (1 + math.cos(math.pi * min(s, TOTAL_STEPS) /
                                                                            TOTAL_STEPS)))
xs = torch.randn(POOL, BATCH, IN_DIM, device=dev)
ys = torch.randint(0, CLASSES, (POOL, BATCH), device=dev)
NAMES = ("loss", "acc", "grad_norm", "w0_norm", "w1_norm", "w2_norm", "w3_norm", "logit_mean")


def train(i: int):
    x, y = xs[i % POOL], ys[i % POOL]
    logits = model(x)
    loss = F.cross_entropy(logits, y)
    opt.zero_grad(set_to_none=True)
    t0 = time.perf_counter()
    loss.backward()
    t1 = time.perf_counter()
    gnorm = nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    sched.step()
    with torch.no_grad():
        acc = (logits.argmax(1) == y).float().mean()
        vals = torch.stack([loss.detach(), acc, gnorm] + [torch.linalg.vector_norm(m.weight) for m in linears]
                           + [logits.detach().mean()])
    own["backward_s"] += t1 - t0
    return vals


def step() -> None:
    t0 = time.perf_counter()
    i = own["steps"]
    vals = train(i)
    t1 = time.perf_counter()
    got = vals.tolist()
    t2 = time.perf_counter()
    metrics = dict(zip(NAMES, got))
    metrics["lr"] = sched.get_last_lr()[0]
    metrics["step_ms"] = (t2 - t0) * 1e3
    metrics["samples_per_s"] = BATCH / max(t2 - t0, 1e-9)
    metrics["mem_mb"] = torch.cuda.memory_allocated() / 2 ** 20 if sc.cuda else 0.0
    for k, v in metrics.items():
        log.info("step %d %s=%.6g", i, k, v)
    t3 = time.perf_counter()
    own["step_s"] += t1 - t0
    own["item_s"] += t2 - t1
    own["log_s"] += t3 - t2
    own["steps"] += 1


def sync() -> None:
    if sc.cuda:
        torch.cuda.synchronize()


def drain(limit_s: float = 10.0) -> None:
    """Wait (at most limit_s) for the listener to empty the queue."""
    end = time.monotonic() + limit_s
    while not log_q.empty() and time.monotonic() < end:
        time.sleep(0.01)


def reset() -> None:
    for k in own:
        own[k] = 0 if k in ("steps", "puts", "puts_full") else 0.0
    lst["records"], lst["fsync_s"], lst["emit_s"] = 0, 0.0, 0.0


def timed(seconds: float) -> tuple[int, float]:
    n0, t = own["steps"], time.perf_counter()
    end = t + seconds
    while time.perf_counter() < end:
        step()
    sync()
    return own["steps"] - n0, time.perf_counter() - t


try:
    # The fix first: the handler flushes but does not fsync.
    handler.durable = False
    for _ in range(10):
        step()
    sync()
    gpu_step_s = None
    if sc.cuda:
        runs = sorted(r for r in (gpu_seconds_queued(torch, lambda _: train(0)) for _ in range(5)) if r is not None)
        gpu_step_s = runs[len(runs) // 2] if runs else None
    drain()
    reset()
    fix_steps, fix_wall = timed(3.0 * sc.scale)
    fix_log_s = own["log_s"]
    drain()
    # As the script has it: fsync every record.
    handler.durable = True
    timed(1.5 * sc.scale)  # the queue filled, the spin kernels well before the run
    ag = autograd_thread()
    reset()
    main0, lis0 = schedstat(MAIN), schedstat(lst["tid"]) if lst["tid"] else None
    ag0 = schedstat(ag["tid"]) if ag else None
    io0 = proc_io()
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
    main1, lis1 = schedstat(MAIN), schedstat(lst["tid"]) if lst["tid"] else None
    ag1 = schedstat(ag["tid"]) if ag else None
    io1 = proc_io()
    f1 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    m1 = int(torch.cuda.memory_stats().get("segment.all.allocated", 0)) if sc.cuda else 0
    records, fsync_s, emit_s = lst["records"], lst["fsync_s"], lst["emit_s"]
    listener_row = {"pid": PID, "tid": lst["tid"], "tids": [lst["tid"]] if lst["tid"] else [],
                    "comm": comm_of(PID, lst["tid"]) if lst["tid"] else None,
                    "threading_name": listener._thread.name if listener._thread else None}
finally:
    handler.durable = False  # drain what is left quickly
    drain()
    listener.stop()
    handler.close()
    shutil.rmtree(DATA, ignore_errors=True)
n = own["steps"]


def share(v: float | None) -> float | None:
    return round(v / wall, 4) if v is not None else None


def r4(v: float | None) -> float | None:
    return round(v, 4) if v is not None else None


def delta(a, b, k: int) -> float | None:
    return r4(b[k] - a[k]) if a and b else None


fix_rate = fix_steps / fix_wall if fix_wall > 0 else None
at_fix = n / fix_rate if fix_rate else None
overhead = max(0.0, wall - at_fix) if at_fix is not None else None
main_run, main_wait = delta(main0, main1, 0), delta(main0, main1, 1)
lis_run, lis_wait = delta(lis0, lis1, 0), delta(lis0, lis1, 1)
ag_run, ag_wait = delta(ag0, ag1, 0), delta(ag0, ag1, 1)
put_off = max(0.0, own["put_s"] - own["put_cpu_s"])
gpu_busy = n * gpu_step_s if gpu_step_s is not None else None
sc.extra["listener"] = listener_row
sc.extra["autograd"] = ag
sc.extra["self"] = {**{k: round(v, 4) if isinstance(v, float) else v for k, v in own.items()},
                    "wall_s": round(wall, 4), "steps_per_s": round(n / wall, 2),
                    "step_ms_mean": round(wall / max(n, 1) * 1e3, 3), "records_per_step": 12,
                    "step_share": share(own["step_s"]), "backward_share": share(own["backward_s"]),
                    "item_share": share(own["item_s"]), "log_share": share(own["log_s"]),
                    "put_share": share(own["put_s"]), "put_cpu_share": share(own["put_cpu_s"]),
                    "put_off_cpu_s": round(put_off, 4), "put_off_cpu_share": share(put_off),
                    "puts_full_share": round(own["puts_full"] / max(own["puts"], 1), 4),
                    "queue_max": QUEUE_MAX, "listener_records": records,
                    "listener_fsync_s": round(fsync_s, 4), "listener_fsync_share": share(fsync_s),
                    "listener_emit_s": round(emit_s, 4), "listener_emit_share": share(emit_s),
                    "fsync_ms_mean": round(fsync_s / max(records, 1) * 1e3, 4),
                    "listener_run_s": lis_run, "listener_cpu_share": share(lis_run),
                    "listener_cpu_wait_s": lis_wait, "listener_cpu_wait_share": share(lis_wait),
                    "write_bytes_to_storage": (io1["write_bytes"] - io0["write_bytes"]) if io0 and io1 else None,
                    "wchar": (io1["wchar"] - io0["wchar"]) if io0 and io1 else None,
                    "fix_steps": fix_steps, "fix_wall_s": round(fix_wall, 4),
                    "fix_steps_per_s": round(fix_rate, 2) if fix_rate else None,
                    "fix_log_share": round(fix_log_s / fix_wall, 4) if fix_wall > 0 else None,
                    "at_fix_rate_s": r4(at_fix), "fsync_overhead_s": r4(overhead),
                    "fsync_overhead_share": share(overhead),
                    "main_run_s": main_run, "main_cpu_share": share(main_run),
                    "main_cpu_wait_s": main_wait, "main_cpu_wait_share": share(main_wait),
                    "autograd_run_s": ag_run, "autograd_cpu_share": share(ag_run),
                    "autograd_cpu_wait_s": ag_wait, "autograd_cpu_wait_share": share(ag_wait),
                    "minor_faults_per_s": round((f1 - f0) / wall, 1), "cuda_mallocs_per_s": round((m1 - m0) / wall, 3),
                    "gpu_step_ms": round(gpu_step_s * 1e3, 4) if gpu_step_s is not None else None,
                    "gpu_busy_s": r4(gpu_busy), "gpu_busy_share": share(gpu_busy), "batch": BATCH, "width": WIDTH}
if not sc.cuda:
    sc.note("on the CPU: no autograd thread (the backward runs on the main thread), no GPU timings, no allocator "
            "counters.")
sc.note(f"natural: measured by the script: {n} steps ({n / wall:.1f}/s) in {wall:.2f} s: {own['log_s']:.2f} s in the "
        f"log calls, {own['put_s']:.2f} s of it in put() ({put_off:.2f} s off the main thread's CPU; "
        f"{own['puts_full']} of {own['puts']} puts found the queue full); the listener {lst['comm']} ({lst['tid']}) "
        f"wrote {records} records, {fsync_s:.2f} s in fsync ({fsync_s / max(records, 1) * 1e3:.2f} ms each), ran "
        f"{lis_run} s; without the fsyncs {fix_rate and round(fix_rate, 1)} steps/s (the fsyncs cost "
        f"{overhead and round(overhead, 2)} s of the run); the main thread ran {main_run} s, waited for a CPU "
        f"{main_wait} s; "
        + (f"a step's kernels take {gpu_step_s * 1e3:.2f} ms of GPU time queued (GPU busy {gpu_busy / wall:.0%} of the "
           "run)." if gpu_busy is not None else "no GPU timings (no CUDA)."))
sc.write_truth(baseline=(b0, b1), window=None, ratio_spans=((b0, mid), (mid, b1)))
