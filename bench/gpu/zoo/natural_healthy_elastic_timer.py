"""natural_healthy_elastic_timer (natural, nothing staged): a control. A GPU-bound training loop guarded against hangs
with torchelastic's timer, the way torch.distributed.elastic.timer documents it: a LocalTimerServer (its watchdog
thread, max_interval 0.1 s) runs in a child process (multiprocessing, forked before CUDA is initialised; OS name
`timer_server`, truth `server`), the trainer calls timer.configure(LocalTimerClient(mp_queue)) and wraps every step in
`with timer.expires(after=60):` (a step that hangs for a minute gets the trainer killed). So every step the client puts
two TimerRequests (acquire, release) on a multiprocessing.Queue: each put hands the request to the queue's feeder
thread in the trainer's process (truth `feeder_thread`: QueueFeederThread), which pickles it and writes it to a pipe;
the server's watchdog wakes ten times a second, drains the requests and checks for expired timers. The decoys: a child
process asleep on its timer most of the time, a second thread in the trainer's process, two small pipe writes and a
scope lookup (inspect) a step. The loop: an MLP made large (512-4096, three 4096x4096 layers, 10 classes; batch 8192
from a pool of 8 on the GPU, fp32 without TF32, fused AdamW): tens of milliseconds of GPU work a step against a
millisecond or two of queueing, loss.item() each step for the running loss (its one wait for the GPU). One process and
its timer server on CPUs 2-3; no workers, no IO of the loop's own, no timed sleep in the loop. 20 s (smaller with
--device cpu: the MLP shrunk to width 64, batch 256).

The script measures itself: the steps per second; the main thread's time in the step (`step_s`: queueing it), in
loss.backward() (`backward_s`, its wait on PyTorch's autograd thread), in loss.item() (`item_s`: its wait for the GPU)
and in the timer's enter and exit (`timer_s`: the scope lookup and the two puts); the feeder thread's and the timer
server's time on a CPU and waiting for one (schedstat: the server's every thread); before the run, the same loop
without the timer, so that what the timer costs the run is known (`timer_overhead_s`: the run's wall time beyond its
steps at that rate); the main thread's and the autograd thread's time on a CPU and waiting for one over the run
(schedstat); the process's minor page faults and the device allocator's cudaMalloc calls; and a step's GPU time queued
(common.gpu_seconds_queued: forward, backward, AdamW, nothing read back), so that the GPU's busy share is known. Truth
`autograd` names PyTorch's autograd thread, `decoys` the server and the feeder thread."""

import multiprocessing
import os
import resource
import threading
import time

from common import Scenario, comm_of, gpu_seconds_queued, set_thread_name, tids_of

sc = Scenario("natural_healthy_elastic_timer", "natural", "a GPU-bound MLP whose every step runs under "
              "torchelastic's timer.expires(after=60), a LocalTimerServer in a child process and the client's "
              "multiprocessing.Queue feeder thread as decoys, 20 s, nothing staged", job_cpus=[2, 3], control=True)
import torch  # noqa: E402
from torch.distributed.elastic import timer  # noqa: E402

nn = torch.nn
F = nn.functional
PID, MAIN = os.getpid(), threading.get_native_id()
dev = torch.device(sc.device)
if sc.cuda:
    torch.backends.cuda.matmul.allow_tf32 = False
WIDTH, BATCH, IN_DIM, CLASSES, POOL = (4096, 8192, 512, 10, 8) if sc.cuda else (64, 256, 512, 10, 8)
ctx = multiprocessing.get_context("fork")


def serve(q, stop) -> None:
    """The timer server's process: torchelastic's LocalTimerServer, its watchdog thread, until told to stop."""
    set_thread_name("timer_server")
    server = timer.LocalTimerServer(q, max_interval=0.1, daemon=True)
    server.start()
    stop.wait()
    server.stop()


# Forked before CUDA is initialised (the model is moved to the GPU after).
mp_queue, stop_evt = ctx.Queue(), ctx.Event()
server_proc = ctx.Process(target=serve, args=(mp_queue, stop_evt), name="timer_server", daemon=True)
server_proc.start()
timer.configure(timer.LocalTimerClient(mp_queue))

KEYS = ("step_s", "backward_s", "item_s", "timer_s")
own = {"steps": 0, **dict.fromkeys(KEYS, 0.0), "running_loss": 0.0}
mode = {"timer": True}
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(IN_DIM, WIDTH), nn.ReLU(), nn.Linear(WIDTH, WIDTH), nn.ReLU(),
                      nn.Linear(WIDTH, WIDTH), nn.ReLU(), nn.Linear(WIDTH, WIDTH), nn.ReLU(),
                      nn.Linear(WIDTH, CLASSES)).to(dev)
opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=sc.cuda or None)
xs = torch.randn(POOL, BATCH, IN_DIM, device=dev)
ys = torch.randint(0, CLASSES, (POOL, BATCH), device=dev)


def train(i: int) -> torch.Tensor:
    loss = F.cross_entropy(model(xs[i % POOL]), ys[i % POOL])
    opt.zero_grad(set_to_none=True)
    t0 = time.perf_counter()
    loss.backward()
    own["backward_s"] += time.perf_counter() - t0
    opt.step()
    return loss


def body() -> None:
    t0 = time.perf_counter()
    loss = train(own["steps"])
    t1 = time.perf_counter()
    own["running_loss"] += loss.item()
    own["item_s"] += time.perf_counter() - t1
    own["step_s"] += t1 - t0


def step() -> None:
    if mode["timer"]:
        t0 = time.perf_counter()
        guard = timer.expires(after=60)
        guard.__enter__()
        t1 = time.perf_counter()
        try:
            body()
        finally:
            t2 = time.perf_counter()
            guard.__exit__(None, None, None)
            own["timer_s"] += (t1 - t0) + (time.perf_counter() - t2)
    else:
        body()
    own["steps"] += 1


def sync() -> None:
    if sc.cuda:
        torch.cuda.synchronize()


def reset() -> None:
    for k in own:
        own[k] = 0 if k == "steps" else 0.0


def timed(seconds: float) -> tuple[int, float]:
    n0, t = own["steps"], time.perf_counter()
    end = t + seconds
    while time.perf_counter() < end:
        step()
    sync()
    return own["steps"] - n0, time.perf_counter() - t


def schedstat(pid: int, tid: int) -> tuple[float, float] | None:
    try:
        with open(f"/proc/{pid}/task/{tid}/schedstat") as fh:
            run, wait = fh.read().split()[:2]
        return int(run) / 1e9, int(wait) / 1e9
    except (OSError, ValueError):
        return None


def process_schedstat(pid: int) -> tuple[float, float] | None:
    """A process's threads' CPU time and run-queue wait, summed (s)."""
    got = [s for s in (schedstat(pid, t) for t in tids_of(pid)) if s]
    return (sum(s[0] for s in got), sum(s[1] for s in got)) if got else None


def autograd_thread() -> dict | None:
    for tid in tids_of(PID):
        comm = comm_of(PID, tid) or ""
        if comm.startswith("pt_autograd"):
            return {"pid": PID, "tid": tid, "comm": comm}
    return None


try:
    for _ in range(10):  # warm-up: the allocator, the autograd thread, the feeder thread started by the first put
        step()
    sync()
    gpu_step_s = None
    if sc.cuda:
        runs = sorted(r for r in (gpu_seconds_queued(torch, lambda _: train(0)) for _ in range(5)) if r is not None)
        gpu_step_s = runs[len(runs) // 2] if runs else None
    # Without the timer first (the fix, were it a cost).
    mode["timer"] = False
    reset()
    fix_steps, fix_wall = timed(3.0 * sc.scale)
    mode["timer"] = True
    timed(1.0 * sc.scale)
    feeder = getattr(mp_queue, "_thread", None)
    ftid = getattr(feeder, "native_id", None)
    ag = autograd_thread()
    spid = server_proc.pid
    server = {"pid": spid, "tids": tids_of(spid), "comm": comm_of(spid)}
    feeder_row = {"pid": PID, "tid": ftid, "tids": [ftid] if ftid else [], "comm": comm_of(PID, ftid) if ftid else None,
                  "threading_name": getattr(feeder, "name", None)}
    reset()
    main0, fd0, sv0 = schedstat(PID, MAIN), schedstat(PID, ftid) if ftid else None, process_schedstat(spid)
    ag0 = schedstat(PID, ag["tid"]) if ag else None
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
    main1, fd1, sv1 = schedstat(PID, MAIN), schedstat(PID, ftid) if ftid else None, process_schedstat(spid)
    ag1 = schedstat(PID, ag["tid"]) if ag else None
    f1 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    m1 = int(torch.cuda.memory_stats().get("segment.all.allocated", 0)) if sc.cuda else 0
    server_alive = server_proc.is_alive()
finally:
    stop_evt.set()
    server_proc.join(5)
    if server_proc.is_alive():
        server_proc.terminate()
        server_proc.join(2)
n = own["steps"]


def share(v: float | None) -> float | None:
    return round(v / wall, 4) if v is not None else None


def delta(a, b, k: int) -> float | None:
    return round(b[k] - a[k], 4) if a and b else None


fix_rate = fix_steps / fix_wall if fix_wall > 0 else None
at_fix = n / fix_rate if fix_rate else None
overhead = max(0.0, wall - at_fix) if at_fix is not None else None
main_run, main_wait = delta(main0, main1, 0), delta(main0, main1, 1)
fd_run, fd_wait = delta(fd0, fd1, 0), delta(fd0, fd1, 1)
sv_run, sv_wait = delta(sv0, sv1, 0), delta(sv0, sv1, 1)
ag_run, ag_wait = delta(ag0, ag1, 0), delta(ag0, ag1, 1)
gpu_busy = n * gpu_step_s if gpu_step_s is not None else None
sc.extra["server"] = server
sc.extra["feeder_thread"] = feeder_row
sc.extra["decoys"] = [{"what": "torchelastic LocalTimerServer (child process)", **server},
                      {"what": "the client's multiprocessing.Queue feeder thread", **feeder_row}]
sc.extra["autograd"] = ag
sc.extra["self"] = {**{k: round(v, 4) if isinstance(v, float) else v for k, v in own.items()},
                    "wall_s": round(wall, 4), "steps_per_s": round(n / wall, 2),
                    "step_ms_mean": round(wall / max(n, 1) * 1e3, 3),
                    "step_share": share(own["step_s"]), "backward_share": share(own["backward_s"]),
                    "item_share": share(own["item_s"]), "timer_share": share(own["timer_s"]),
                    "timer_ms_mean": round(own["timer_s"] / max(n, 1) * 1e3, 4), "timer_puts": 2 * n,
                    "fix_steps": fix_steps, "fix_wall_s": round(fix_wall, 4),
                    "fix_steps_per_s": round(fix_rate, 2) if fix_rate else None,
                    "at_fix_rate_s": round(at_fix, 4) if at_fix is not None else None,
                    "timer_overhead_s": round(overhead, 4) if overhead is not None else None,
                    "timer_overhead_share": share(overhead),
                    "feeder_run_s": fd_run, "feeder_cpu_share": share(fd_run),
                    "feeder_cpu_wait_s": fd_wait, "feeder_cpu_wait_share": share(fd_wait),
                    "server_run_s": sv_run, "server_cpu_share": share(sv_run),
                    "server_cpu_wait_s": sv_wait, "server_cpu_wait_share": share(sv_wait),
                    "server_alive": server_alive,
                    "main_run_s": main_run, "main_cpu_share": share(main_run),
                    "main_cpu_wait_s": main_wait, "main_cpu_wait_share": share(main_wait),
                    "autograd_run_s": ag_run, "autograd_cpu_share": share(ag_run),
                    "autograd_cpu_wait_s": ag_wait, "autograd_cpu_wait_share": share(ag_wait),
                    "minor_faults_per_s": round((f1 - f0) / wall, 1), "cuda_mallocs_per_s": round((m1 - m0) / wall, 3),
                    "gpu_step_ms": round(gpu_step_s * 1e3, 4) if gpu_step_s is not None else None,
                    "gpu_busy_s": round(gpu_busy, 4) if gpu_busy is not None else None,
                    "gpu_busy_share": share(gpu_busy), "batch": BATCH, "width": WIDTH}
if not sc.cuda:
    sc.note("on the CPU: no autograd thread (the backward runs on the main thread), no GPU timings, no allocator "
            "counters; the job is not GPU-bound there.")
sc.note(f"natural: measured by the script: {n} steps ({n / wall:.1f}/s) in {wall:.2f} s: {own['item_s']:.2f} s in "
        f".item() (waiting for the GPU), {own['timer_s']:.3f} s in the timer's enter and exit; without the timer "
        f"{fix_rate and round(fix_rate, 1)} steps/s (the timer cost {overhead and round(overhead, 2)} s of the run); "
        f"the feeder thread ran {fd_run} s, the timer server {sv_run} s; the main thread ran {main_run} s, waited for "
        f"a CPU {main_wait} s; "
        + (f"a step's kernels take {gpu_step_s * 1e3:.2f} ms of GPU time queued (GPU busy {gpu_busy / wall:.0%} of the "
           "run)." if gpu_busy is not None else "no GPU timings (no CUDA)."))
sc.write_truth(baseline=(b0, b1), window=None, ratio_spans=((b0, mid), (mid, b1)))
