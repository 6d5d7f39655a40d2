"""natural_healthy_log_rotation (natural, nothing staged; a control): a GPU-bound training loop whose verbose log is
rotated and compressed in the background. The zoo's MLP made larger (512-4096, three 4096x4096 layers, 10 classes; batch
8192 on the GPU, fp32 without TF32, fused AdamW): each step computes the per-sample losses
(cross_entropy(reduction="none")), trains on their mean, copies them to the host (.cpu(): the host waits for the GPU
once a step) and appends a line to the training log (step, mean loss, and the first 4,096 per-sample losses as text, a
data-debugging dump: ~40 KB a step) with an ordinary buffered file write. Every ~3 s of steps the main thread rotates
the log (closes it, renames it to train.log.N, opens a new one) and hands the rotated file's path over a queue.Queue to
a thread of its own process (threading's name and OS name `log_rotate`) that reads it and gzips it at level 9
(gzip.compress: zlib's deflate releases the GIL while it works), writes train.log.N.gz and removes the plain file:
~0.5-1 s of CPU each time. The thread blocks in get() between rotations (no timeout) and pins itself to the job's second
CPU (os.sched_setaffinity(0, ...) is the calling thread's on Linux; the main thread keeps both job CPUs, so the kernel
can keep it off the rotator's CPU). One process on CPUs 2-3, no workers, no children. 20 s. The script measures itself:
the steps per second overall, during the gzip windows and outside them (truth `gzips_ns`: each compression's span); the
main thread's time queueing the step, in .cpu() (waiting for the GPU), formatting and writing the log and rotating; its
time on a CPU and waiting for one (schedstat); the rotation thread's tid, name, CPU time (schedstat and thread_time) and
run-queue wait, the bytes it compressed; the process's minor page faults and cudaMalloc calls; and a step's GPU time
queued (common.gpu_seconds_queued on a copy of the model with its own optimiser), so that the GPU's busy share is known.
Truth `rotator` names the thread."""

import copy
import gzip
import os
import queue
import resource
import tempfile
import threading
import time

from common import Scenario, Trainer, gpu_seconds_queued, set_thread_name

sc = Scenario("natural_healthy_log_rotation", "natural", "a GPU-bound MLP writing a verbose log, rotated every ~3 s "
              "and gzipped at level 9 by a thread of its own on its other CPU, 20 s, nothing staged: a control",
              job_cpus=[2, 3], control=True)
tr = Trainer(sc, width=4096, batch=8192, depth=3)
torch = tr.torch
model, opt = tr.model, tr.opt
PID, MAIN = os.getpid(), threading.get_native_id()
ROTATE_S, DUMP = 3.0 * (sc.scale if sc.smoke else 1.0), (4096 if sc.cuda else 256)
LOG_DIR = tempfile.mkdtemp(prefix="zoo_logrot_")
q: queue.Queue = queue.Queue()
rot = {"n": 0, "bytes_in": 0, "bytes_out": 0, "cpu_s": 0.0, "wall_s": 0.0, "measure": False}
gzip_spans: list[tuple[float, float]] = []
rot_info: dict = {}


def rotator() -> None:
    set_thread_name("log_rotate")
    rot_info.update(tid=threading.get_native_id(), comm="log_rotate")
    try:
        os.sched_setaffinity(0, [sc.job_cpus[-1]])  # this thread only
        rot_info["cpus"] = sorted(os.sched_getaffinity(0))
    except OSError as e:
        rot_info["cpus_error"] = str(e)
    while True:
        path = q.get()
        if path is None:
            return
        t0, c0 = time.perf_counter(), time.thread_time()
        with open(path, "rb") as fh:
            data = fh.read()
        packed = gzip.compress(data, compresslevel=9)
        with open(path + ".gz", "wb") as fh:
            fh.write(packed)
        os.remove(path)
        t1, c1 = time.perf_counter(), time.thread_time()
        if rot["measure"]:
            rot["n"] += 1
            rot["bytes_in"] += len(data)
            rot["bytes_out"] += len(packed)
            rot["cpu_s"] += c1 - c0
            rot["wall_s"] += t1 - t0
            gzip_spans.append((t0, t1))


thread = threading.Thread(target=rotator, name="log_rotate", daemon=True)
thread.start()
log = {"k": 0, "fh": None, "opened": 0.0}
own = {"steps": 0, "issue_s": 0.0, "fetch_s": 0.0, "log_s": 0.0, "rotate_s": 0.0, "bytes": 0}
step_ends: list[float] = []


def open_log() -> None:
    log["fh"] = open(os.path.join(LOG_DIR, "train.log"), "w")
    log["opened"] = time.perf_counter()


def rotate() -> None:
    log["fh"].close()
    log["k"] += 1
    rotated = os.path.join(LOG_DIR, f"train.log.{log['k']}")
    os.rename(os.path.join(LOG_DIR, "train.log"), rotated)
    open_log()
    q.put(rotated)


def step() -> None:
    t0 = time.perf_counter()
    i = tr.i
    tr.i += 1
    x, y = tr.xs[i % len(tr.xs)], tr.ys[i % len(tr.ys)]
    per_sample = torch.nn.functional.cross_entropy(model(x), y, reduction="none")
    loss = per_sample.mean()
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    t1 = time.perf_counter()
    losses = per_sample.detach()[:DUMP].cpu()
    t2 = time.perf_counter()
    vals = losses.tolist()
    line = f"step {i} loss {sum(vals) / len(vals):.6f} per_sample " + " ".join(f"{v:.5f}" for v in vals) + "\n"
    log["fh"].write(line)
    t3 = t4 = time.perf_counter()
    if t3 - log["opened"] >= ROTATE_S:
        rotate()
        t4 = time.perf_counter()
    own["steps"] += 1
    own["issue_s"] += t1 - t0
    own["fetch_s"] += t2 - t1
    own["log_s"] += t3 - t2
    own["rotate_s"] += t4 - t3
    own["bytes"] += len(line)
    step_ends.append(t4)


def schedstat(tid: int) -> tuple[float, float] | None:
    try:
        with open(f"/proc/{PID}/task/{tid}/schedstat") as fh:
            run, wait = fh.read().split()[:2]
        return int(run) / 1e9, int(wait) / 1e9
    except (OSError, ValueError):
        return None


def mallocs() -> int:
    return int(torch.cuda.memory_stats().get("segment.all.allocated", 0)) if sc.cuda else 0


open_log()
for _ in range(10):
    step()
gpu_step_s = None
if sc.cuda:
    m2 = copy.deepcopy(model)
    opt2 = torch.optim.AdamW(m2.parameters(), lr=1e-4, fused=True)

    def work(_) -> None:
        """One step's GPU work on the copy, nothing read back."""
        torch.nn.functional.cross_entropy(m2(tr.xs[0]), tr.ys[0], reduction="none").mean().backward()
        opt2.step()
        opt2.zero_grad(set_to_none=True)

    work(None)
    torch.cuda.synchronize()
    runs = sorted(r for r in (gpu_seconds_queued(torch, work) for _ in range(5)) if r is not None)
    gpu_step_s = runs[len(runs) // 2] if runs else None
    del m2, opt2
    torch.cuda.empty_cache()
warm_end = time.perf_counter() + 2.0 * sc.scale  # the spin kernels well before the run
while time.perf_counter() < warm_end:
    step()
tr.sync()
for k in own:
    own[k] = 0 if k in ("steps", "bytes") else 0.0
step_ends.clear()
rtid = rot_info["tid"]
main0, rot0 = schedstat(MAIN), schedstat(rtid)
f0, m0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt, mallocs()
rot["measure"] = True
b0 = sc.mark("baseline")
t = time.perf_counter()
sc.run_for(10.0 * sc.scale, step)
mid = sc.mark("half")
sc.run_for(10.0 * sc.scale, step)
tr.sync()
b1 = sc.mark("end")
t_end = time.perf_counter()
wall = t_end - t
main1, rot1 = schedstat(MAIN), schedstat(rtid)
f1, m1 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt, mallocs()
rot["measure"] = False
spans = [(a, min(b, t_end)) for a, b in gzip_spans if a < t_end]  # a compression still running is not counted
n = own["steps"]
in_gzip = sum(1 for e in step_ends if any(a <= e < b for a, b in spans))
gzip_s = sum(b - a for a, b in spans)
rate_in = in_gzip / gzip_s if gzip_s > 0 else None
rate_out = (n - in_gzip) / (wall - gzip_s) if wall > gzip_s else None
lost = max(0.0, (gzip_s * rate_out - in_gzip) / rate_out) if rate_out and gzip_s else 0.0


def share(v: float | None) -> float | None:
    return round(v / wall, 4) if v is not None else None


main_run = round(main1[0] - main0[0], 4) if main0 and main1 else None
main_wait = round(main1[1] - main0[1], 4) if main0 and main1 else None
rot_run = round(rot1[0] - rot0[0], 4) if rot0 and rot1 else None
rot_wait = round(rot1[1] - rot0[1], 4) if rot0 and rot1 else None
gpu_busy = n * gpu_step_s if gpu_step_s is not None else None
shift = time.time_ns() - int(time.perf_counter() * 1e9)
sc.extra["gzips_ns"] = [[int(a * 1e9) + shift, int(b * 1e9) + shift] for a, b in spans]
sc.extra["rotator"] = {"pid": PID, "tid": rtid, "comm": rot_info.get("comm"), "cpus": rot_info.get("cpus")}
sc.extra["self"] = {**{k: round(v, 4) for k, v in own.items()}, "wall_s": round(wall, 4),
                    "steps_per_s": round(n / wall, 2), "issue_share": share(own["issue_s"]),
                    "fetch_share": share(own["fetch_s"]), "log_share": share(own["log_s"]),
                    "rotate_share": share(own["rotate_s"]),
                    "main_run_s": main_run, "main_cpu_share": share(main_run),
                    "main_cpu_wait_s": main_wait, "main_cpu_wait_share": share(main_wait),
                    "rotations": len(spans), "gzip_s": round(gzip_s, 4), "gzip_share": share(gzip_s),
                    "steps_in_gzip": in_gzip, "steps_per_s_in_gzip": round(rate_in, 2) if rate_in else None,
                    "steps_per_s_outside_gzip": round(rate_out, 2) if rate_out else None,
                    "in_over_outside": round(rate_in / rate_out, 4) if rate_in and rate_out else None,
                    "lost_in_gzip_s": round(lost, 4),
                    "rotator_tid": rtid, "rotator_comm": rot_info.get("comm"), "rotator_cpus": rot_info.get("cpus"),
                    "rotator_run_s": rot_run, "rotator_cpu_share": share(rot_run),
                    "rotator_cpu_wait_s": rot_wait, "rotator_cpu_wait_share": share(rot_wait),
                    "rotator_gzip_cpu_s": round(rot["cpu_s"], 4), "rotator_gzip_wall_s": round(rot["wall_s"], 4),
                    "rotator_bytes_in": rot["bytes_in"], "rotator_bytes_out": rot["bytes_out"],
                    "minor_faults_per_s": round((f1 - f0) / wall, 1), "cuda_mallocs_per_s": round((m1 - m0) / wall, 3),
                    "gpu_step_ms": round(gpu_step_s * 1e3, 4) if gpu_step_s is not None else None,
                    "gpu_busy_s": round(gpu_busy, 4) if gpu_busy is not None else None,
                    "gpu_busy_share": share(gpu_busy), "batch": tr.batch, "dump": DUMP, "rotate_every_s": ROTATE_S}
q.put(None)
thread.join(30)
sc.note(f"natural, a control: measured by the script: {n} steps ({n / wall:.1f}/s) in {wall:.2f} s; {len(spans)} "
        f"rotations gzipped {rot['bytes_in'] / 1e6:.1f} MB in {gzip_s:.2f} s ({rot['cpu_s']:.2f} s of CPU, on CPUs "
        f"{rot_info.get('cpus')}); steps/s during them {rate_in and round(rate_in, 1)}, outside "
        f"{rate_out and round(rate_out, 1)}; the main thread ran {main_run} s, waited for a CPU {main_wait} s; "
        + (f"a step's kernels take {gpu_step_s * 1e3:.2f} ms of GPU time queued (GPU busy {gpu_busy / wall:.0%} of the "
           "run)." if gpu_busy is not None else "no GPU timings (no CUDA)."))
sc.write_truth(baseline=(b0, b1), window=None, ratio_spans=((b0, mid), (mid, b1)))
