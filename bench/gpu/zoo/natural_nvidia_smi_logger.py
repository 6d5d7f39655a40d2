"""natural_nvidia_smi_logger (natural, nothing staged): the zoo's MLP training loop (512-2048-2048-2048-10, batch 8192,
fp32 without TF32, fused AdamW, loss.item() each step for the running loss) whose author logs the GPU's utilisation and
memory every 10 steps the way many scripts do: subprocess.run(["nvidia-smi", "--query-gpu=utilization.gpu,memory.used",
"--format=csv,noheader"], capture_output=True, text=True) on the main thread, the output parsed and kept in a history
(printed every 500 steps). Where nvidia-smi is missing (the CPU smoke run) an equivalent small external command runs
instead (`sys.executable -c "print('0 %, 0 MiB')"`), and the truth says so. The children inherit the job's CPUs 2-3.
20 s.

The script measures itself: the steps per second; the main thread's time queueing each step's work, in .item(), and in
the subprocess.run calls (each call's wall time, truth `calls_ns` their spans on the truth's clock; over the run their
main-thread CPU time and run-queue wait from /proc/thread-self/schedstat around each call, the rest being asleep
while the child starts, runs and exits); the children's CPU time (getrusage RUSAGE_CHILDREN); the process's minor page
faults; the main thread's time on a CPU and waiting for one over the run (schedstat); and a step's GPU time queued
(common.gpu_seconds_queued), so that the GPU's busy share is known. Truth `command` names the command, `children`
their comm and how many ran."""

import os
import resource
import shutil
import subprocess
import sys
import time

from common import Scenario, Trainer, gpu_seconds_queued

sc = Scenario("natural_nvidia_smi_logger", "natural", "the MLP (loss.item() each step) logging the GPU's utilisation "
              "and memory every 10 steps with subprocess.run(nvidia-smi --query-gpu=...) on the main thread, 20 s, "
              "nothing staged", job_cpus=[2, 3], control=True)
tr = Trainer(sc)
torch = tr.torch
model, opt, loss_fn = tr.model, tr.opt, tr.loss_fn
LOG_EVERY = 10
SMI = shutil.which("nvidia-smi")
CMD = ([SMI, "--query-gpu=utilization.gpu,memory.used", "--format=csv,noheader"] if SMI else
       [sys.executable, "-c", "print('0 %, 0 MiB')"])
CHILD_COMM = os.path.basename(CMD[0])[:15]  # the kernel names a process by the file it executes
history: list[tuple[int, float, float]] = []  # (step, utilisation %, memory MiB): what the author logs
own = {"steps": 0, "launch_s": 0.0, "item_s": 0.0, "smi_s": 0.0, "smi_run_s": 0.0, "smi_cpu_wait_s": 0.0,
       "calls": 0, "failed": 0, "running_loss": 0.0}
calls: list[tuple[float, float]] = []


def schedstat() -> tuple[float, float | None]:
    """The calling thread's time on a CPU and waiting on a run queue (s), from the kernel's schedstat; where that is
    not kept, the thread's CPU clock and None."""
    try:
        with open("/proc/thread-self/schedstat") as fh:
            run_ns, wait_ns = fh.read().split()[:2]
        return int(run_ns) / 1e9, int(wait_ns) / 1e9
    except (OSError, ValueError):
        return time.thread_time(), None


def gpu_stats() -> tuple[float, float] | None:
    """The GPU's utilisation (%) and memory used (MiB), as nvidia-smi reports them."""
    out = subprocess.run(CMD, capture_output=True, text=True)
    if out.returncode != 0 or not out.stdout.strip():
        return None
    try:
        util, mem = out.stdout.strip().splitlines()[0].split(",")[:2]
        return float(util.strip().split()[0]), float(mem.strip().split()[0])
    except (ValueError, IndexError):
        return None


def log_gpu(step: int) -> None:
    r0, w0 = schedstat()
    t0 = time.perf_counter()
    got = gpu_stats()
    t1 = time.perf_counter()
    r1, w1 = schedstat()
    own["smi_s"] += t1 - t0
    own["smi_run_s"] += r1 - r0
    own["smi_cpu_wait_s"] += (w1 - w0) if w0 is not None and w1 is not None else 0.0
    own["calls"] += 1
    calls.append((t0, t1))
    if got is None:
        own["failed"] += 1
        return
    history.append((step, *got))
    if step % 500 == 0:
        print(f"step {step}: loss {own['running_loss'] / max(own['steps'], 1):.4f}, GPU {got[0]:.0f}% "
              f"{got[1]:.0f} MiB", flush=True)


def step() -> None:
    t0 = time.perf_counter()
    i = tr.i
    tr.i += 1
    x, y = tr.xs[i % len(tr.xs)], tr.ys[i % len(tr.ys)]
    loss = loss_fn(model(x), y)
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    t1 = time.perf_counter()
    own["running_loss"] += loss.item()
    t2 = time.perf_counter()
    own["launch_s"] += t1 - t0
    own["item_s"] += t2 - t1
    own["steps"] += 1
    if own["steps"] % LOG_EVERY == 0:
        log_gpu(own["steps"])


def work(_) -> None:
    """One step's GPU work, nothing read back."""
    loss_fn(model(tr.xs[0]), tr.ys[0]).backward()
    opt.step()
    opt.zero_grad(set_to_none=True)


def reset() -> None:
    for k in own:
        own[k] = 0 if k in ("steps", "calls", "failed") else 0.0
    calls.clear()


for _ in range(3 * LOG_EVERY):  # warm-up: the allocator, cuBLAS, the first nvidia-smi
    step()
tr.sync()
gpu_step_s = None
if sc.cuda:
    runs = sorted(r for r in (gpu_seconds_queued(torch, work) for _ in range(5)) if r is not None)
    gpu_step_s = runs[len(runs) // 2] if runs else None
warm_end = time.perf_counter() + 2.0 * sc.scale  # the spin kernels well before the baseline
while time.perf_counter() < warm_end:
    step()
tr.sync()
reset()
ch0 = resource.getrusage(resource.RUSAGE_CHILDREN)
f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
run0, wait0 = schedstat()
b0 = sc.mark("baseline")
t = time.perf_counter()
sc.run_for(10.0 * sc.scale, step)
mid = sc.mark("half")
sc.run_for(10.0 * sc.scale, step)
tr.sync()
b1 = sc.mark("end")
wall = time.perf_counter() - t
run1, wait1 = schedstat()
f1 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
ch1 = resource.getrusage(resource.RUSAGE_CHILDREN)
n, k = own["steps"], own["calls"]
child_cpu = (ch1.ru_utime + ch1.ru_stime) - (ch0.ru_utime + ch0.ru_stime)
durations = sorted(b - a for a, b in calls)
smi_sleep = own["smi_s"] - own["smi_run_s"] - own["smi_cpu_wait_s"]
gpu_busy = n * gpu_step_s if gpu_step_s is not None else None
other = wall - own["launch_s"] - own["item_s"] - own["smi_s"]
shift = time.time_ns() - int(time.perf_counter() * 1e9)  # the calls' spans on the truth's clock (time_ns)
sc.extra["calls_ns"] = [[int(a * 1e9) + shift, int(b * 1e9) + shift] for a, b in calls]
sc.extra["command"] = CMD
sc.extra["children"] = {"comm": CHILD_COMM, "count": k, "nvidia_smi": SMI is not None}


def share(v: float) -> float:
    return round(v / wall, 4)


sc.extra["self"] = {**{key: round(v, 4) for key, v in own.items()}, "wall_s": round(wall, 4),
                    "steps_per_s": round(n / wall, 2), "launch_share": share(own["launch_s"]),
                    "item_share": share(own["item_s"]), "smi_share": share(own["smi_s"]),
                    "smi_ms_mean": round(own["smi_s"] / max(k, 1) * 1e3, 3),
                    "smi_ms_median": round(durations[len(durations) // 2] * 1e3, 3) if durations else None,
                    "smi_ms_max": round(durations[-1] * 1e3, 3) if durations else None,
                    "smi_run_share": share(own["smi_run_s"]), "smi_cpu_wait_share": share(own["smi_cpu_wait_s"]),
                    "smi_sleep_s": round(smi_sleep, 4), "smi_sleep_share": share(smi_sleep),
                    "other_s": round(other, 4), "other_share": share(other),
                    "children_cpu_s": round(child_cpu, 4), "children_cpu_share": share(child_cpu),
                    "calls_per_s": round(k / wall, 3),
                    "main_run_s": round(run1 - run0, 4), "main_cpu_share": share(run1 - run0),
                    "main_cpu_wait_s": round(wait1 - wait0, 4) if wait0 is not None else None,
                    "main_cpu_wait_share": share(wait1 - wait0) if wait0 is not None else None,
                    "minor_faults_per_s": round((f1 - f0) / wall, 1),
                    "gpu_step_ms": round(gpu_step_s * 1e3, 4) if gpu_step_s is not None else None,
                    "gpu_busy_s": round(gpu_busy, 4) if gpu_busy is not None else None,
                    "gpu_busy_share": round(gpu_busy / wall, 4) if gpu_busy is not None else None,
                    "log_every": LOG_EVERY, "batch": tr.batch,
                    "last_logged": list(history[-1]) if history else None}
if SMI is None:
    sc.note(f"no nvidia-smi here: each log ran {CHILD_COMM} -c \"print('0 %, 0 MiB')\" instead (the same "
            "subprocess.run, a child of the same kind).")
sc.note(f"natural: measured by the script: {n} steps ({n / wall:.1f}/s) in {wall:.2f} s: {own['launch_s']:.2f} s "
        f"queueing the steps, {own['item_s']:.2f} s in .item(), {own['smi_s']:.2f} s in {k} subprocess.run calls of "
        f"{CHILD_COMM} ({own['smi_s'] / max(k, 1) * 1e3:.1f} ms each on average; the main thread on a CPU "
        f"{own['smi_run_s']:.2f} s of it, asleep {smi_sleep:.2f} s), the children {child_cpu:.2f} s of CPU; "
        + (f"a step's kernels take {gpu_step_s * 1e3:.2f} ms of GPU time queued (GPU busy {gpu_busy / wall:.0%} of the "
           "run)." if gpu_busy is not None else "no GPU timings (no CUDA)."))
sc.write_truth(baseline=(b0, b1), window=None, ratio_spans=((b0, mid), (mid, b1)))
