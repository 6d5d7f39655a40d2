"""natural_tensor_str_logging (natural, nothing staged): a training loop that logs its per-step metrics through Python's
logging module, as a team's shared training script does: a logger `train` with one logging.FileHandler (a file in a
temporary folder under /tmp, the page cache, no fsync; the handler flushes each record) and the team's own Formatter,
which renders the record's `extra={"metrics": {...}}` as key=value pairs with "%s=%s" % (key, value). The metrics are
handed to it as they come out of the step: the loss (the graph's output tensor itself), the batch accuracy, the total
gradient norm returned by clip_grad_norm_, the learning rate (a float from the scheduler) and the per-class accuracy
(a 10-element tensor made with scatter_add_): four of them GPU tensors, so each log line is rendered with str(tensor),
which on a CUDA tensor reads values back one by one to choose the print format and to print them (torch's
_tensor_str: a masked_select, comparisons read as Python bools and every element formatted through .item()): dozens of
small synchronisations a step, the first of them waiting for the step's queued GPU work, the rest round trips with the
GPU idle between them. Nothing else in the loop synchronises (no .item() of its own, fused AdamW, clip_grad_norm_
without error_if_nonfinite). The model: the zoo's MLP (512-2048-2048-2048-10, batch 4096 from a pool of 8 batches
already on the GPU, fp32 without TF32, fused AdamW with a warm-up-then-cosine LambdaLR). One process on CPUs 2-3, no
threads of its own, no workers, no children, no lock but the handler's own (one thread logs: uncontended). 20 s.

The script measures itself: the steps per second; the main thread's time queueing the step (forward, backward,
clipping, the optimiser, the metrics' kernels; loss.backward() apart, `backward_s`, where PyTorch's autograd thread
queues the backward while the main thread waits) and in the log call (wall and its CPU clock: the rest is its wait for
the GPU), and inside the formatter rendering the metrics (wall and CPU; the first tensor's str apart, which waits for
the step); the synchronisations a log call makes (counted before the run with torch.cuda.set_sync_debug_mode("warn"));
before the run, the same loop with the log call left out and one loss.item() a step instead (what logging the loss as
a float would cost: `item_only_steps_per_s`), so that the logging's cost over such a loop is known
(`log_overhead_s`); the main thread's time on a CPU and waiting for one over the run (/proc/thread-self/schedstat);
the process's minor page faults and the device allocator's cudaMalloc calls; the log's lines and bytes; and a step's
GPU time queued (common.gpu_seconds_queued: forward, backward, clipping, the optimiser and the metrics' kernels, nothing
read back), so that the GPU's busy share is known (str()'s own tiny kernels are not in it)."""

import logging
import math
import os
import resource
import shutil
import tempfile
import time
import warnings

from common import Scenario, gpu_seconds_queued

sc = Scenario("natural_tensor_str_logging", "natural", "an MLP logging per-step metrics through Python's logging to a "
              "file, a custom formatter rendering its GPU tensors with %s (str(tensor): dozens of small "
              "synchronisations a step), 20 s, nothing staged", job_cpus=[2, 3], control=True)
import torch  # noqa: E402

nn = torch.nn
dev = torch.device(sc.device)
IN_DIM, WIDTH, NCLASS, BATCH, POOL = (512, 2048, 10, 4096, 8) if sc.cuda else (512, 64, 10, 256, 8)
if sc.cuda:
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(IN_DIM, WIDTH), nn.ReLU(), nn.Linear(WIDTH, WIDTH), nn.ReLU(),
                      nn.Linear(WIDTH, WIDTH), nn.ReLU(), nn.Linear(WIDTH, NCLASS)).to(dev)
opt = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=sc.cuda or None)
WARMUP_STEPS, TOTAL_STEPS = 200, 100_000


def lr_lambda(k: int) -> float:
    if k < WARMUP_STEPS:
        return (k + 1) / WARMUP_STEPS
    return 0.5 * (1 + math.cos(math.pi * min(1.0, (k - WARMUP_STEPS) / TOTAL_STEPS)))


sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_lambda)
xs = torch.randn(POOL, BATCH, IN_DIM, device=dev)
ys = torch.randint(0, NCLASS, (POOL, BATCH), device=dev)
LOG_DIR = tempfile.mkdtemp(prefix="zoo_tensorlog_")
LOG_PATH = os.path.join(LOG_DIR, "train.log")
fmt = {"records": 0, "s": 0.0, "cpu_s": 0.0, "first_s": 0.0, "rest_s": 0.0}


class MetricsFormatter(logging.Formatter):
    """The team's formatter: the usual line, then the record's metrics as key=value pairs (whatever they are)."""

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        metrics = getattr(record, "metrics", None)
        if metrics:
            t0, c0 = time.perf_counter(), time.thread_time()
            items = list(metrics.items())
            parts = ["%s=%s" % items[0]]  # the loss: its str() waits for the step's GPU work first
            t1 = time.perf_counter()
            parts += ["%s=%s" % kv for kv in items[1:]]
            t2, c2 = time.perf_counter(), time.thread_time()
            line += " " + " ".join(parts)
            fmt["records"] += 1
            fmt["s"] += t2 - t0
            fmt["cpu_s"] += c2 - c0
            fmt["first_s"] += t1 - t0
            fmt["rest_s"] += t2 - t1
        return line


log = logging.getLogger("train")
log.setLevel(logging.INFO)
log.propagate = False
handler = logging.FileHandler(LOG_PATH, mode="w")
handler.setFormatter(MetricsFormatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
log.addHandler(handler)
own = {"steps": 0, "issue_s": 0.0, "backward_s": 0.0, "log_s": 0.0, "log_cpu_s": 0.0, "item_s": 0.0}
pos = {"i": 0, "log": True}


def train_step(x: torch.Tensor, y: torch.Tensor) -> tuple:
    logits = model(x)
    loss = nn.functional.cross_entropy(logits, y)
    tb = time.perf_counter()
    loss.backward()  # queued by PyTorch's autograd thread; the main thread waits for it
    own["backward_s"] += time.perf_counter() - tb
    gnorm = nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    sched.step()
    opt.zero_grad(set_to_none=True)
    with torch.no_grad():
        hit = (logits.argmax(1) == y).float()
        acc = hit.mean()
        seen = torch.zeros(NCLASS, device=dev).scatter_add_(0, y, torch.ones_like(hit))
        class_acc = torch.zeros(NCLASS, device=dev).scatter_add_(0, y, hit) / seen.clamp_min(1)
    return loss, acc, gnorm, class_acc


def step() -> None:
    i = pos["i"]
    pos["i"] += 1
    t0 = time.perf_counter()
    loss, acc, gnorm, class_acc = train_step(xs[i % POOL], ys[i % POOL])
    t1, c1 = time.perf_counter(), time.thread_time()
    if pos["log"]:
        log.info("step %d", i, extra={"metrics": {"loss": loss, "acc": acc, "grad_norm": gnorm,
                                                  "lr": sched.get_last_lr()[0], "class_acc": class_acc}})
        t2, c2 = time.perf_counter(), time.thread_time()
        own["log_s"] += t2 - t1
        own["log_cpu_s"] += c2 - c1
    else:  # the loop without the log call: the loss read once as a float
        loss.item()
        t2 = time.perf_counter()
        own["item_s"] += t2 - t1
    own["issue_s"] += t1 - t0
    own["steps"] += 1


def sync() -> None:
    if sc.cuda:
        torch.cuda.synchronize()


def reset() -> None:
    for k in own:
        own[k] = 0 if k == "steps" else 0.0
    for k in fmt:
        fmt[k] = 0 if k == "records" else 0.0


def schedstat() -> tuple[float, float | None]:
    """The calling thread's time on a CPU and waiting on a run queue (s); where the kernel keeps no schedstat, its CPU
    clock and None."""
    try:
        with open("/proc/thread-self/schedstat") as fh:
            run_ns, wait_ns = fh.read().split()[:2]
        return int(run_ns) / 1e9, int(wait_ns) / 1e9
    except (OSError, ValueError):
        return time.thread_time(), None


def mallocs() -> int:
    return int(torch.cuda.memory_stats().get("segment.all.allocated", 0)) if sc.cuda else 0


def syncs_per_log(n: int = 3) -> float | None:
    """The synchronisations n steps make, per step (all of them the log call's), as CUDA's sync debug mode reports
    them (then off again)."""
    if not sc.cuda:
        return None
    sync()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            for _ in range(n):
                step()
        finally:
            torch.cuda.set_sync_debug_mode("default")
    return sum("synchroniz" in str(w.message) for w in caught) / n


try:
    for _ in range(20):  # warm-up: the allocator, the log file opened
        step()
    sync()
    log_syncs = syncs_per_log()
    gpu_step_s = None
    if sc.cuda:
        def work(_) -> None:
            """One step's GPU work (forward, backward, clipping, the optimiser, the metrics), nothing read back."""
            train_step(xs[0], ys[0])

        runs = sorted(r for r in (gpu_seconds_queued(torch, work) for _ in range(5)) if r is not None)
        gpu_step_s = runs[len(runs) // 2] if runs else None
    # The same loop with the log call left out and loss.item() instead, before the run (what the fix would give).
    pos["log"] = False
    for _ in range(10):
        step()
    sync()
    reset()
    ti = time.perf_counter()
    item_end = ti + 3.0 * sc.scale
    while time.perf_counter() < item_end:
        step()
    sync()
    item_wall = time.perf_counter() - ti
    item_steps, item_issue_s, item_item_s = own["steps"], own["issue_s"], own["item_s"]
    pos["log"] = True
    warm_end = time.perf_counter() + 2.0 * sc.scale  # the spin kernels well before the run
    while time.perf_counter() < warm_end:
        step()
    sync()
    reset()
    size0 = os.path.getsize(LOG_PATH)
    f0, m0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt, mallocs()
    run0, wait0 = schedstat()
    b0 = sc.mark("baseline")
    t = time.perf_counter()
    sc.run_for(10.0 * sc.scale, step)
    mid = sc.mark("half")
    sc.run_for(10.0 * sc.scale, step)
    sync()
    b1 = sc.mark("end")
    wall = time.perf_counter() - t
    run1, wait1 = schedstat()
    f1, m1 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt, mallocs()
    handler.flush()
    log_bytes = os.path.getsize(LOG_PATH) - size0
    with open(LOG_PATH) as fh:
        sample_line = fh.readline().strip()
finally:
    log.removeHandler(handler)
    handler.close()
    shutil.rmtree(LOG_DIR, ignore_errors=True)

n = own["steps"]


def share(v: float | None) -> float | None:
    return round(v / wall, 4) if v is not None else None


item_rate = item_steps / item_wall if item_wall > 0 else None
without_log_s = n / item_rate if item_rate else None
overhead = max(0.0, wall - without_log_s) if without_log_s is not None else None
log_off = max(0.0, own["log_s"] - own["log_cpu_s"])
log_rest = max(0.0, own["log_s"] - fmt["s"])  # the record, the handler's lock, the write and flush
main_run = round(run1 - run0, 4)
main_wait = round(wait1 - wait0, 4) if wait0 is not None else None
gpu_busy = n * gpu_step_s if gpu_step_s is not None else None
sc.extra["self"] = {**{k: round(v, 4) for k, v in own.items()}, "wall_s": round(wall, 4),
                    "steps_per_s": round(n / wall, 2), "step_ms_mean": round(wall / max(n, 1) * 1e3, 4),
                    "issue_share": share(own["issue_s"]), "backward_share": share(own["backward_s"]),
                    "log_share": share(own["log_s"]), "log_cpu_share": share(own["log_cpu_s"]),
                    "log_off_cpu_s": round(log_off, 4), "log_off_cpu_share": share(log_off),
                    "log_ms_mean": round(own["log_s"] / max(n, 1) * 1e3, 4),
                    "format_s": round(fmt["s"], 4), "format_cpu_s": round(fmt["cpu_s"], 4),
                    "format_share": share(fmt["s"]), "format_first_s": round(fmt["first_s"], 4),
                    "format_rest_s": round(fmt["rest_s"], 4), "format_rest_share": share(fmt["rest_s"]),
                    "log_rest_s": round(log_rest, 4), "records": fmt["records"],
                    "syncs_per_log": log_syncs, "tensors_per_log": 4,
                    "item_only_steps": item_steps, "item_only_wall_s": round(item_wall, 4),
                    "item_only_steps_per_s": round(item_rate, 2) if item_rate else None,
                    "item_only_issue_ms": round(item_issue_s / max(item_steps, 1) * 1e3, 4),
                    "item_only_item_ms": round(item_item_s / max(item_steps, 1) * 1e3, 4),
                    "without_log_s": round(without_log_s, 4) if without_log_s is not None else None,
                    "log_overhead_s": round(overhead, 4) if overhead is not None else None,
                    "log_overhead_share": share(overhead),
                    "main_run_s": main_run, "main_cpu_share": share(main_run),
                    "main_cpu_wait_s": main_wait, "main_cpu_wait_share": share(main_wait),
                    "minor_faults_per_s": round((f1 - f0) / wall, 1), "cuda_mallocs_per_s": round((m1 - m0) / wall, 3),
                    "log_bytes": log_bytes, "log_bytes_per_s": round(log_bytes / wall, 1),
                    "sample_line": sample_line[:400],
                    "gpu_step_ms": round(gpu_step_s * 1e3, 4) if gpu_step_s is not None else None,
                    "gpu_busy_s": round(gpu_busy, 4) if gpu_busy is not None else None,
                    "gpu_busy_share": share(gpu_busy), "batch": BATCH}
if not sc.cuda:
    sc.note("on the CPU: str() reads nothing back, no synchronisations, no GPU timings, no allocator counters.")
sc.note(f"natural: measured by the script: {n} steps ({n / wall:.1f}/s) in {wall:.2f} s: {own['issue_s']:.2f} s "
        f"queueing steps, {own['log_s']:.2f} s in the log call ({own['log_cpu_s']:.2f} s of it on a CPU; "
        f"{fmt['s']:.2f} s rendering the metrics), {log_syncs} synchronisations a log call; without the log call "
        f"and with one loss.item() a step: {item_rate and round(item_rate, 1)} steps/s (logging's cost "
        f"{overhead and round(overhead, 2)} s of the run); the main thread ran {main_run} s, waited for a CPU "
        f"{main_wait} s; "
        + (f"a step's kernels take {gpu_step_s * 1e3:.2f} ms of GPU time queued (GPU busy {gpu_busy / wall:.0%} of the "
           "run)." if gpu_busy is not None else "no GPU timings (no CUDA)."))
sc.write_truth(baseline=(b0, b1), window=None, ratio_spans=((b0, mid), (mid, b1)))
