"""natural_sqlite_metrics_commit (natural, nothing staged): a training loop whose author keeps its metrics in a local
SQLite database, as a home-made experiment tracker does: the zoo's MLP (512-2048-2048-2048-10, batch 8192, fp32
without TF32, fused AdamW, a cosine lr schedule) with gradient clipping (clip_grad_norm_(1.0), its total norm logged);
after each step the main thread reads the loss and the grad norm with .item() and writes one row (run id, step, wall
time, loss, lr, grad norm, the step's time) with one INSERT and one commit() through Python's sqlite3, to a database
file on the local disk (a folder under /var/tmp, the process's own disk, not /dev/shm). journal_mode and synchronous
are left at SQLite's defaults (a rollback journal, DELETE; synchronous FULL), so each commit writes the journal and
the database and syncs them to the disk before it returns. CPUs 2-3, 20 s.

The script measures itself: the steps per second; the main thread's time queueing each step's work, in the two .item()
calls, and in the logging (the INSERT and the commit apart; their share of the run), with its time on a CPU inside the
logging (its thread CPU clock) and waiting for one there (the run delay of /proc/thread-self/schedstat) around each
(the rest of the logging it was asleep: in the syncs); the bytes the process wrote to storage and its write calls
(/proc/self/io); the main thread's time on a CPU and waiting for one over the run (schedstat) and its block-IO delay
where the kernel keeps it (delay accounting, /proc stat field 42); the process's minor page faults; the device
allocator's cudaMalloc calls; and a step's GPU time queued (common.gpu_seconds_queued on a copy of the model with its
own optimiser), so that the GPU's busy share is known. Truth `database` says where the file was, on what filesystem,
and the pragmas it ran under. The folder is removed at the end."""

import copy
import glob
import os
import resource
import shutil
import sqlite3
import tempfile
import time
import uuid

from common import Scenario, Trainer, gpu_seconds_queued

sc = Scenario("natural_sqlite_metrics_commit", "natural", "the MLP logging loss, lr and grad norm (.item()) into a "
              "local SQLite database, one INSERT and one commit() per step on the main thread (default journal and "
              "synchronous), 20 s, nothing staged", job_cpus=[2, 3], control=True)
tr = Trainer(sc)
torch = tr.torch
model, opt, loss_fn = tr.model, tr.opt, tr.loss_fn
sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=20_000)
ROOT = "/var/tmp" if os.access("/var/tmp", os.W_OK) else None
for stale in glob.glob("/var/tmp/zoo_sqlite_*"):  # what a run killed before its cleanup left
    shutil.rmtree(stale, ignore_errors=True)
LOG_DIR = tempfile.mkdtemp(prefix="zoo_sqlite_", dir=ROOT)
DB_PATH = os.path.join(LOG_DIR, "metrics.db")
RUN_ID = uuid.uuid4().hex[:12]


def filesystem(path: str) -> dict:
    """The mount that holds `path`: its mount point, type and device (/proc/self/mounts, the longest prefix)."""
    best = {"mount": None, "fstype": None, "device": None}
    real = os.path.realpath(path)
    try:
        with open("/proc/self/mounts") as fh:
            for line in fh:
                dev, mnt, fstype = line.split()[:3]
                mnt = mnt.replace("\\040", " ")
                if (real == mnt or real.startswith(mnt.rstrip("/") + "/")) and len(mnt) >= len(best["mount"] or ""):
                    best = {"mount": mnt, "fstype": fstype, "device": dev}
    except OSError:
        pass
    return best


def schedstat() -> tuple[float, float | None]:
    """The calling thread's time on a CPU and waiting on a run queue (s), from the kernel's schedstat; where that is
    not kept, the thread's CPU clock and None."""
    try:
        with open("/proc/thread-self/schedstat") as fh:
            run_ns, wait_ns = fh.read().split()[:2]
        return int(run_ns) / 1e9, int(wait_ns) / 1e9
    except (OSError, ValueError):
        return time.thread_time(), None


def blkio_s() -> float | None:
    """The main thread's block-IO delay so far (s): delayacct_blkio_ticks, 0 where delay accounting is off."""
    try:
        with open("/proc/thread-self/stat") as fh:
            return int(fh.read().rsplit(")", 1)[1].split()[39]) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


def proc_io() -> dict[str, int] | None:
    try:
        with open("/proc/self/io") as fh:
            return {k: int(v) for k, v in (line.split(":") for line in fh)}
    except (OSError, ValueError):
        return None


def mallocs() -> int:
    return int(torch.cuda.memory_stats().get("segment.all.allocated", 0)) if sc.cuda else 0


db = sqlite3.connect(DB_PATH)
db.execute("CREATE TABLE IF NOT EXISTS metrics (run_id TEXT, step INTEGER, wall_time REAL, loss REAL, lr REAL, "
           "grad_norm REAL, step_ms REAL)")
db.commit()
pragmas = {p: db.execute(f"PRAGMA {p}").fetchone()[0] for p in ("journal_mode", "synchronous", "page_size")}
own = {"steps": 0, "launch_s": 0.0, "item_s": 0.0, "insert_s": 0.0, "commit_s": 0.0, "log_run_s": 0.0,
       "log_cpu_wait_s": 0.0, "running_loss": 0.0}
every = {"log_s": 0.0, "commits": 0}  # over the whole script (warm-up too), never reset
log_spans: list[float] = []
last = {"t": time.perf_counter()}


def step() -> None:
    t0 = time.perf_counter()
    i = tr.i
    tr.i += 1
    x, y = tr.xs[i % len(tr.xs)], tr.ys[i % len(tr.ys)]
    loss = loss_fn(model(x), y)
    loss.backward()
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    sched.step()
    opt.zero_grad(set_to_none=True)
    t1 = time.perf_counter()
    loss_v, norm_v = loss.item(), norm.item()
    t2 = time.perf_counter()
    step_ms = (t2 - last["t"]) * 1e3
    c0, w0 = time.thread_time(), schedstat()[1]
    t3 = time.perf_counter()
    db.execute("INSERT INTO metrics VALUES (?, ?, ?, ?, ?, ?, ?)",
               (RUN_ID, i, time.time(), loss_v, sched.get_last_lr()[0], norm_v, step_ms))
    t4 = time.perf_counter()
    db.commit()
    t5 = time.perf_counter()
    c1, w1 = time.thread_time(), schedstat()[1]
    last["t"] = t5
    own["launch_s"] += t1 - t0
    own["item_s"] += t2 - t1
    own["insert_s"] += t4 - t3
    own["commit_s"] += t5 - t4
    own["log_run_s"] += c1 - c0
    own["log_cpu_wait_s"] += (w1 - w0) if w0 is not None and w1 is not None else 0.0
    own["running_loss"] += loss_v
    own["steps"] += 1
    every["log_s"] += t5 - t3
    every["commits"] += 1
    log_spans.append(t5 - t3)


def reset() -> None:
    for k in own:
        own[k] = 0 if k == "steps" else 0.0
    log_spans.clear()


try:
    for _ in range(100):  # warm-up: the allocator, cuBLAS, the database's first pages
        step()
    tr.sync()
    gpu_step_s = None
    if sc.cuda:
        m2 = copy.deepcopy(model)
        opt2 = torch.optim.AdamW(m2.parameters(), lr=1e-4, fused=True)

        def work(_) -> None:
            """One step's GPU work on the copy, nothing read back."""
            loss_fn(m2(tr.xs[0]), tr.ys[0]).backward()
            torch.nn.utils.clip_grad_norm_(m2.parameters(), 1.0)
            opt2.step()
            opt2.zero_grad(set_to_none=True)

        work(None)
        torch.cuda.synchronize()
        runs = sorted(r for r in (gpu_seconds_queued(torch, work) for _ in range(5)) if r is not None)
        gpu_step_s = runs[len(runs) // 2] if runs else None
        del m2, opt2
    warm_end = time.perf_counter() + 2.0 * sc.scale  # the spin kernels well before the baseline
    while time.perf_counter() < warm_end:
        step()
    tr.sync()
    reset()
    io0, m0, bio0 = proc_io(), mallocs(), blkio_s()
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
    io1, m1, bio1 = proc_io(), mallocs(), blkio_s()
    rows = db.execute("SELECT count(*) FROM metrics WHERE run_id = ?", (RUN_ID,)).fetchone()[0]
    db_bytes = os.path.getsize(DB_PATH)
finally:
    db.close()
    fs = filesystem(LOG_DIR)
    shutil.rmtree(LOG_DIR, ignore_errors=True)

n = own["steps"]
log_s = own["insert_s"] + own["commit_s"]
log_sleep = max(0.0, log_s - own["log_run_s"] - own["log_cpu_wait_s"])
spans = sorted(log_spans)
gpu_busy = n * gpu_step_s if gpu_step_s is not None else None
other = wall - own["launch_s"] - own["item_s"] - log_s


def share(v: float | None) -> float | None:
    return round(v / wall, 4) if v is not None else None


def delta(key: str) -> int | None:
    return io1[key] - io0[key] if io0 and io1 and key in io0 else None


sc.extra["database"] = {"path": DB_PATH, **fs, **pragmas, "rows_in_run": rows, "bytes_at_end": db_bytes,
                        "sqlite": sqlite3.sqlite_version}
sc.extra["self"] = {**{k: round(v, 4) for k, v in own.items()}, "wall_s": round(wall, 4),
                    "steps_per_s": round(n / wall, 2), "launch_share": share(own["launch_s"]),
                    "item_share": share(own["item_s"]), "insert_share": share(own["insert_s"]),
                    "commit_share": share(own["commit_s"]), "log_s": round(log_s, 4), "log_share": share(log_s),
                    "log_ms_mean": round(log_s / max(n, 1) * 1e3, 4),
                    "log_ms_median": round(spans[len(spans) // 2] * 1e3, 4) if spans else None,
                    "log_ms_p99": round(spans[int(0.99 * (len(spans) - 1))] * 1e3, 4) if spans else None,
                    "log_ms_max": round(spans[-1] * 1e3, 4) if spans else None,
                    "log_run_share": share(own["log_run_s"]), "log_cpu_wait_share": share(own["log_cpu_wait_s"]),
                    "log_sleep_s": round(log_sleep, 4), "log_sleep_share": share(log_sleep),
                    "log_s_whole_script": round(every["log_s"], 4), "commits_whole_script": every["commits"],
                    "other_s": round(other, 4), "other_share": share(other),
                    "write_bytes": delta("write_bytes"), "write_calls": delta("syscw"),
                    "write_bytes_per_commit": round(delta("write_bytes") / max(n, 1)) if delta("write_bytes")
                    is not None else None,
                    "main_run_s": round(run1 - run0, 4), "main_cpu_share": share(run1 - run0),
                    "main_cpu_wait_s": round(wait1 - wait0, 4) if wait0 is not None else None,
                    "main_cpu_wait_share": share(wait1 - wait0) if wait0 is not None else None,
                    "main_blkio_s": round(bio1 - bio0, 4) if bio0 is not None and bio1 is not None else None,
                    "minor_faults_per_s": round((f1 - f0) / wall, 1),
                    "cuda_mallocs_per_s": round((m1 - m0) / wall, 3),
                    "gpu_step_ms": round(gpu_step_s * 1e3, 4) if gpu_step_s is not None else None,
                    "gpu_busy_s": round(gpu_busy, 4) if gpu_busy is not None else None,
                    "gpu_busy_share": share(gpu_busy), "batch": tr.batch}
if fs["fstype"] in ("tmpfs", "ramfs"):
    sc.note(f"the database's folder is on {fs['fstype']} here: its syncs do not reach a disk.")
sc.note(f"natural: measured by the script: {n} steps ({n / wall:.1f}/s) in {wall:.2f} s: {own['launch_s']:.2f} s "
        f"queueing the steps, {own['item_s']:.2f} s in .item(), {log_s:.2f} s logging to SQLite ({own['insert_s']:.3f} "
        f"s in INSERT, {own['commit_s']:.2f} s in commit(); {log_s / max(n, 1) * 1e3:.2f} ms a step; on a CPU "
        f"{own['log_run_s']:.2f} s of it, asleep {log_sleep:.2f} s) on {fs['fstype']} ({fs['mount']}), journal "
        f"{pragmas['journal_mode']}, synchronous {pragmas['synchronous']}; "
        + (f"a step's kernels take {gpu_step_s * 1e3:.2f} ms of GPU time queued (GPU busy {gpu_busy / wall:.0%} of the "
           "run)." if gpu_busy is not None else "no GPU timings (no CUDA)."))
sc.write_truth(baseline=(b0, b1), window=None, ratio_spans=((b0, mid), (mid, b1)))
