"""natural_healthy_textfile_exporter (natural, nothing staged; a control): a GPU-bound training loop that exports its
metrics for the node's monitoring from a thread of its own, the way a Prometheus node_exporter "textfile collector"
expects them. The zoo's MLP made larger (512-4096, three 4096x4096 layers, 10 classes; batch 8192 from a pool of 8 on
the GPU, fp32 without TF32, fused AdamW): tens of milliseconds of GPU work a step against a millisecond or two of
queueing, loss.item() each step for the running loss (its one wait for the GPU). After each step the main thread
records the step's duration, its loss and the step count in a small shared state under a threading.Lock (a deque of
the last 2,000 step durations, a few numbers). A thread of the job's process (threading's name and OS name
`metrics_export`) wakes once a second (threading.Event().wait(1.0)), copies that state under the lock, and outside it
computes the step time's percentiles (sorted), the samples per second and an EMA of the loss, reads the process's
/proc/self/status (resident memory, threads) and /proc/self/stat (CPU times) and the device allocator's counters
(torch.cuda.memory_allocated and max_memory_allocated: host-side numbers, no GPU work), writes ~40 metric lines to
train.prom.tmp, flushes it, os.fsync()s it and os.replace()s it onto train.prom (the collector's atomic-update rule),
and appends one JSON line to a heartbeat log: a few milliseconds of work and a small synchronous write to a local
disk (a folder under /var/tmp) each second. Nothing of it is in the main thread's way: the lock is held for a copy of
a few kilobytes, the GPU does the work. One process on CPUs 2-3, no workers, no children. 20 s.

The script measures itself: the steps per second; the main thread's time queueing the step (loss.backward() apart,
`backward_s`: PyTorch's autograd thread queues the backward while the main thread waits) and in loss.item() (its wait
for the GPU), and around the shared state (waiting to take the lock and holding it); each export's span (truth
`exports_ns`), the exporter's wall and CPU time per export, its time in the fsync and waiting for and holding the
lock; the steps that overlapped an export against those that did not (their mean durations; the time the overlapping
steps took beyond the others' median: `lost_in_export_s`); the main thread's and the exporter's time on a CPU and
waiting for one (schedstat); the process's minor page faults and the device allocator's cudaMalloc calls; and a step's
GPU time queued (common.gpu_seconds_queued), so that the GPU's busy share is known. Truth `exporter` names the thread
(pid, tid, comm)."""

import collections
import json
import os
import resource
import shutil
import tempfile
import threading
import time

from common import Scenario, Trainer, gpu_seconds_queued, set_thread_name

sc = Scenario("natural_healthy_textfile_exporter", "natural", "a GPU-bound MLP whose thread exports metrics once a "
              "second as a node_exporter textfile (percentiles, /proc reads, fsync + atomic rename, a heartbeat line), "
              "a lock shared with the loop for the step stats, 20 s, nothing staged: a control",
              job_cpus=[2, 3], control=True)
tr = Trainer(sc, width=4096, batch=8192, depth=3)
torch = tr.torch
model, opt, loss_fn = tr.model, tr.opt, tr.loss_fn
PID, MAIN = os.getpid(), threading.get_native_id()
OUT_DIR = tempfile.mkdtemp(prefix="zoo_exporter_", dir="/var/tmp" if os.path.isdir("/var/tmp") else None)
PROM, HEARTBEAT = os.path.join(OUT_DIR, "train.prom"), os.path.join(OUT_DIR, "heartbeat.jsonl")
EVERY_S = 1.0

state_lock = threading.Lock()
state = {"step": 0, "loss": float("nan"), "loss_ema": None, "samples": 0, "durations": collections.deque(maxlen=2000)}
stop = threading.Event()
exp = {"measure": False, "n": 0, "wall_s": 0.0, "cpu_s": 0.0, "fsync_s": 0.0, "lock_wait_s": 0.0, "lock_held_s": 0.0,
       "bytes": 0}
export_spans: list[tuple[float, float]] = []
exp_info: dict = {}


def read_proc() -> dict:
    out: dict = {}
    with open("/proc/self/status") as fh:
        for line in fh:
            key, _, value = line.partition(":")
            if key in ("VmRSS", "VmHWM", "Threads", "voluntary_ctxt_switches", "nonvoluntary_ctxt_switches"):
                out[key] = int(value.split()[0])
    with open("/proc/self/stat") as fh:
        fields = fh.read().rsplit(")", 1)[1].split()
    tick = os.sysconf("SC_CLK_TCK")
    out["utime_s"], out["stime_s"] = int(fields[11]) / tick, int(fields[12]) / tick
    return out


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    k = min(len(values) - 1, max(0, round(q * (len(values) - 1))))
    return values[k]


def export_once(last: dict) -> None:
    t0, c0 = time.perf_counter(), time.thread_time()
    with_lock = time.perf_counter()
    with state_lock:
        got = time.perf_counter()
        snap = {k: v for k, v in state.items() if k != "durations"}
        durations = list(state["durations"])
        released = time.perf_counter()
    durations.sort()
    now_t = time.perf_counter()
    rate = (snap["samples"] - last["samples"]) / (now_t - last["t"]) if now_t > last["t"] else 0.0
    last.update(samples=snap["samples"], t=now_t)
    proc = read_proc()
    mem = {"allocated": torch.cuda.memory_allocated(0), "max_allocated": torch.cuda.max_memory_allocated(0)} \
        if sc.cuda else {"allocated": 0, "max_allocated": 0}
    lines = ["# HELP train_step_seconds Training step duration.", "# TYPE train_step_seconds summary"]
    for q in (0.5, 0.9, 0.99):
        lines.append(f'train_step_seconds{{quantile="{q}"}} {percentile(durations, q):.6f}')
    lines += [f"train_step_seconds_count {snap['step']}", f"train_step_seconds_sum {sum(durations):.6f}",
              "# TYPE train_loss gauge", f"train_loss {snap['loss']:.6f}",
              "# TYPE train_loss_ema gauge", f"train_loss_ema {snap['loss_ema'] or float('nan'):.6f}",
              "# TYPE train_samples_total counter", f"train_samples_total {snap['samples']}",
              "# TYPE train_samples_per_second gauge", f"train_samples_per_second {rate:.2f}",
              "# TYPE gpu_memory_allocated_bytes gauge", f"gpu_memory_allocated_bytes {mem['allocated']}",
              "# TYPE gpu_memory_max_allocated_bytes gauge", f"gpu_memory_max_allocated_bytes {mem['max_allocated']}"]
    for key, value in sorted(proc.items()):
        lines += [f"# TYPE process_{key.lower()} gauge", f"process_{key.lower()} {value}"]
    text = "\n".join(lines) + "\n"
    with open(PROM + ".tmp", "w") as fh:
        fh.write(text)
        fh.flush()
        t_sync = time.perf_counter()
        os.fsync(fh.fileno())
        synced = time.perf_counter()
    os.replace(PROM + ".tmp", PROM)
    with open(HEARTBEAT, "a") as fh:
        fh.write(json.dumps({"time": time.time(), "step": snap["step"], "loss": snap["loss"],
                             "samples_per_s": round(rate, 2), "rss_kb": proc.get("VmRSS")}) + "\n")
    t1, c1 = time.perf_counter(), time.thread_time()
    if exp["measure"]:
        exp["n"] += 1
        exp["wall_s"] += t1 - t0
        exp["cpu_s"] += c1 - c0
        exp["fsync_s"] += synced - t_sync
        exp["lock_wait_s"] += got - with_lock
        exp["lock_held_s"] += released - got
        exp["bytes"] += len(text)
        export_spans.append((t0, t1))


def exporter() -> None:
    set_thread_name("metrics_export")
    exp_info.update(tid=threading.get_native_id(), comm="metrics_export")
    last = {"samples": 0, "t": time.perf_counter()}
    while not stop.wait(EVERY_S):
        export_once(last)


own = {"steps": 0, "issue_s": 0.0, "backward_s": 0.0, "item_s": 0.0, "lock_wait_s": 0.0, "lock_held_s": 0.0,
       "running_loss": 0.0}
step_spans: list[tuple[float, float]] = []
prev = {"end": None}


def step() -> None:
    t0 = time.perf_counter()
    i = tr.i
    tr.i += 1
    x, y = tr.xs[i % len(tr.xs)], tr.ys[i % len(tr.ys)]
    loss = loss_fn(model(x), y)
    tb = time.perf_counter()
    loss.backward()  # queued by PyTorch's autograd thread; the main thread waits for it
    own["backward_s"] += time.perf_counter() - tb
    opt.step()
    opt.zero_grad(set_to_none=True)
    t1 = time.perf_counter()
    v = loss.item()
    t2 = time.perf_counter()
    start = prev["end"] if prev["end"] is not None else t0
    with state_lock:
        t3 = time.perf_counter()
        state["step"] += 1
        state["samples"] += tr.batch
        state["loss"] = v
        state["loss_ema"] = v if state["loss_ema"] is None else 0.98 * state["loss_ema"] + 0.02 * v
        state["durations"].append(t2 - start)
        t4 = time.perf_counter()
    prev["end"] = t4
    own["issue_s"] += t1 - t0
    own["item_s"] += t2 - t1
    own["lock_wait_s"] += t3 - t2
    own["lock_held_s"] += t4 - t3
    own["running_loss"] += v
    own["steps"] += 1
    step_spans.append((start, t4))


def schedstat(tid: int) -> tuple[float, float] | None:
    try:
        with open(f"/proc/{PID}/task/{tid}/schedstat") as fh:
            run, wait = fh.read().split()[:2]
        return int(run) / 1e9, int(wait) / 1e9
    except (OSError, ValueError):
        return None


def mallocs() -> int:
    return int(torch.cuda.memory_stats().get("segment.all.allocated", 0)) if sc.cuda else 0


thread = threading.Thread(target=exporter, name="metrics_export", daemon=True)
try:
    for _ in range(10):  # warm-up: the allocator, cuBLAS
        step()
    tr.sync()
    gpu_step_s = None
    if sc.cuda:
        def work(_) -> None:
            """One step's GPU work (forward, backward, the optimiser), nothing read back."""
            loss_fn(model(tr.xs[0]), tr.ys[0]).backward()
            opt.step()
            opt.zero_grad(set_to_none=True)

        runs = sorted(r for r in (gpu_seconds_queued(torch, work) for _ in range(5)) if r is not None)
        gpu_step_s = runs[len(runs) // 2] if runs else None
    thread.start()  # the exporter starts with the training proper
    warm_end = time.perf_counter() + 2.5 * sc.scale  # the spin kernels well before the run, two exports or more
    while time.perf_counter() < warm_end:
        step()
    tr.sync()
    for k in own:
        own[k] = 0 if k == "steps" else 0.0
    step_spans.clear()
    prev["end"] = None
    etid = exp_info["tid"]
    main0, exp0 = schedstat(MAIN), schedstat(etid)
    f0, m0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt, mallocs()
    exp["measure"] = True
    b0 = sc.mark("baseline")
    t = time.perf_counter()
    sc.run_for(10.0 * sc.scale, step)
    mid = sc.mark("half")
    sc.run_for(10.0 * sc.scale, step)
    tr.sync()
    b1 = sc.mark("end")
    t_end = time.perf_counter()
    wall = t_end - t
    main1, exp1 = schedstat(MAIN), schedstat(etid)
    f1, m1 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt, mallocs()
    exp["measure"] = False
    stop.set()
    thread.join(10)
    prom_ok = os.path.exists(PROM)
finally:
    stop.set()
    shutil.rmtree(OUT_DIR, ignore_errors=True)

n = own["steps"]
spans = [(a, min(b, t_end)) for a, b in export_spans if t <= a < t_end]
durs = sorted(b - a for a, b in step_spans)
median = durs[len(durs) // 2] if durs else 0.0
over = [(a, b) for a, b in step_spans if any(a < e1 and e0 < b for e0, e1 in spans)]
rest = [(a, b) for a, b in step_spans if not any(a < e1 and e0 < b for e0, e1 in spans)]
over_ms = sum(b - a for a, b in over) / len(over) * 1e3 if over else None
rest_ms = sum(b - a for a, b in rest) / len(rest) * 1e3 if rest else None
lost = sum(max(0.0, (b - a) - median) for a, b in over)


def share(v: float | None) -> float | None:
    return round(v / wall, 4) if v is not None else None


main_run = round(main1[0] - main0[0], 4) if main0 and main1 else None
main_wait = round(main1[1] - main0[1], 4) if main0 and main1 else None
exp_run = round(exp1[0] - exp0[0], 4) if exp0 and exp1 else None
exp_wait = round(exp1[1] - exp0[1], 4) if exp0 and exp1 else None
gpu_busy = n * gpu_step_s if gpu_step_s is not None else None
shift = time.time_ns() - int(time.perf_counter() * 1e9)
sc.extra["exports_ns"] = [[int(a * 1e9) + shift, int(b * 1e9) + shift] for a, b in spans]
sc.extra["exporter"] = {"pid": PID, "tid": exp_info.get("tid"), "comm": exp_info.get("comm")}
sc.extra["self"] = {**{k: round(v, 4) for k, v in own.items()}, "wall_s": round(wall, 4),
                    "steps_per_s": round(n / wall, 2), "step_ms_median": round(median * 1e3, 4),
                    "issue_share": share(own["issue_s"]), "backward_share": share(own["backward_s"]),
                    "item_share": share(own["item_s"]), "main_lock_wait_s": round(own["lock_wait_s"], 6),
                    "main_lock_held_s": round(own["lock_held_s"], 6),
                    "main_run_s": main_run, "main_cpu_share": share(main_run),
                    "main_cpu_wait_s": main_wait, "main_cpu_wait_share": share(main_wait),
                    "exports": len(spans), "export_s": round(sum(b - a for a, b in spans), 4),
                    "export_share": share(sum(b - a for a, b in spans)),
                    "export_wall_s": round(exp["wall_s"], 4), "export_cpu_s": round(exp["cpu_s"], 4),
                    "export_ms_mean": round(exp["wall_s"] / max(exp["n"], 1) * 1e3, 4),
                    "export_fsync_s": round(exp["fsync_s"], 4), "export_lock_wait_s": round(exp["lock_wait_s"], 6),
                    "export_lock_held_s": round(exp["lock_held_s"], 6), "export_bytes": exp["bytes"],
                    "steps_overlapping_exports": len(over), "overlap_step_ms_mean": round(over_ms, 4)
                    if over_ms is not None else None, "other_step_ms_mean": round(rest_ms, 4)
                    if rest_ms is not None else None,
                    "other_over_overlap": round(rest_ms / over_ms, 4) if over_ms and rest_ms else None,
                    "lost_in_export_s": round(lost, 4),
                    "exporter_tid": exp_info.get("tid"), "exporter_run_s": exp_run,
                    "exporter_cpu_share": share(exp_run), "exporter_cpu_wait_s": exp_wait,
                    "exporter_cpu_wait_share": share(exp_wait), "prom_written": prom_ok,
                    "minor_faults_per_s": round((f1 - f0) / wall, 1), "cuda_mallocs_per_s": round((m1 - m0) / wall, 3),
                    "gpu_step_ms": round(gpu_step_s * 1e3, 4) if gpu_step_s is not None else None,
                    "gpu_busy_s": round(gpu_busy, 4) if gpu_busy is not None else None,
                    "gpu_busy_share": share(gpu_busy), "batch": tr.batch, "export_every_s": EVERY_S}
sc.note(f"natural, a control: measured by the script: {n} steps ({n / wall:.1f}/s) in {wall:.2f} s: "
        f"{own['issue_s']:.2f} s queueing steps, {own['item_s']:.2f} s in .item(), {own['lock_wait_s'] * 1e3:.2f} ms "
        f"waiting for the state lock; {len(spans)} exports ({exp['wall_s']:.3f} s, {exp['cpu_s']:.3f} s of CPU, "
        f"{exp['fsync_s']:.3f} s in fsync); steps overlapping an export {over_ms and round(over_ms, 2)} ms on average, "
        f"others {rest_ms and round(rest_ms, 2)} ms; the main thread ran {main_run} s, waited for a CPU {main_wait} s; "
        + (f"a step's kernels take {gpu_step_s * 1e3:.2f} ms of GPU time queued (GPU busy {gpu_busy / wall:.0%} of the "
           "run)." if gpu_busy is not None else "no GPU timings (no CUDA)."))
sc.write_truth(baseline=(b0, b1), window=None, ratio_spans=((b0, mid), (mid, b1)))
