"""natural_numpy_features_main (natural, nothing staged): a tabular classifier whose features are made per batch with
numpy on the main thread, in float64, as a feature pipeline written for a CPU box is reused in front of a GPU model:
from a table of 32,768 x 256 raw float64 columns (a low-rank correlated part; labels from a fixed random non-linear
teacher) each step gathers 1024 random rows, standardises them, maps them to 512 random Fourier features (cos(x @ W +
b): a 1024x256x512 matrix product), adds them to a running second moment (z.T @ z: 512x512 from 1024 rows, kept for a
later refit), projects them at random down to 256 (z @ R) and adds the rows' squared distances to 64 centroids (x @
C.T): matrix products (BLAS level 3) and elementwise numpy, no np.linalg routine in the loop (oversubscribed, each
takes seconds here). The standardisation and the centroids are fitted on a sample of the table before torch is
imported. The 320 features go to the GPU as float32 (torch.from_numpy(...).to(dev): a 1.3 MB pageable copy) for an MLP
(320-1024-1024-10, fp32 without TF32, fused AdamW), loss.item() each step. numpy's BLAS (the OpenBLAS its wheels
bundle) keeps its default thread count: it sized its pool by the CPUs it saw when numpy was imported, at the script's
top (the GPU host's 16: no OPENBLAS_NUM_THREADS, no threadpoolctl); then the whole process, its BLAS pool with it, is
pinned to CPUs 2-3 (as `taskset -a -p -c 2,3 PID`, or a cpuset applied to a running container, pins every thread), so
that the BLAS threads outnumber the CPUs. 20 s.

The script measures itself: the steps per second; the main thread's time in the feature step (wall and its CPU time,
thread_time), in the copy and in the training step with .item(); the feature step's time before the run with the
BLAS threads at their default and at the job's CPU count (openblas_set_num_threads through ctypes, restored
after); every thread's CPU time and run-queue wait over the run (/proc/self/task/*/schedstat, read with each thread's
name at the run's start and end; the main thread's apart, the BLAS pool's summed), the process's minor page faults, the
device allocator's cudaMalloc calls and a step's GPU time queued (common.gpu_seconds_queued: the copy and the training
from a feature batch in pinned memory), so that the GPU's busy share is known; which BLAS numpy uses and with how many
threads (np.show_config, threadpoolctl where installed, OpenBLAS's own get_num_threads). Truth `blas`: the library and
the BLAS pool's threads (tids, names: the threads importing numpy started, and any its first calls started); `threads`:
every thread with its CPU time and wait over the run."""

import os

_BEFORE_NUMPY = {int(t) for t in os.listdir("/proc/self/task")}
import numpy as np  # noqa: E402  (OpenBLAS starts its pool here, sized by the CPUs this process may use now)

_NUMPY_TIDS = sorted({int(t) for t in os.listdir("/proc/self/task")} - _BEFORE_NUMPY)

import contextlib  # noqa: E402
import ctypes  # noqa: E402
import glob  # noqa: E402
import io  # noqa: E402
import resource  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402

from common import Scenario, comm_of, gpu_seconds_queued, tids_of  # noqa: E402

sc = Scenario("natural_numpy_features_main", "natural", "an MLP fed float64 features made per batch with numpy on the "
              "main thread (random Fourier features, a running second moment, a random projection, distances to "
              "centroids), numpy's BLAS at its default thread count on a 2-CPU job, 20 s, nothing staged",
              job_cpus=[2, 3], control=True)
PID, MAIN = os.getpid(), threading.get_native_id()
for _tid in tids_of(PID):  # the whole process on the job's CPUs (Scenario pinned the main thread): the BLAS pool too
    if _tid != MAIN:
        with contextlib.suppress(OSError):
            os.sched_setaffinity(_tid, sc.job_cpus)

ROWS, RAW, RFF, PROJ, CENTROIDS, BATCH = 32768, 256, 512, 256, 64, 1024
if not sc.cuda:
    ROWS, BATCH = 8192, 256


def openblas() -> tuple[ctypes.CDLL | None, str | None]:
    """numpy's bundled OpenBLAS (numpy.libs), loaded already: the library and its symbols' suffix."""
    base = os.path.join(os.path.dirname(np.__file__), "..", "numpy.libs")
    libs = sorted(glob.glob(os.path.join(base, "libscipy_openblas*"))) + sorted(glob.glob(os.path.join(base,
                                                                                                      "libopenblas*")))
    for lib in libs:
        try:
            so = ctypes.CDLL(lib)
        except OSError:
            continue
        for prefix, suffix in (("scipy_openblas", "64_"), ("scipy_openblas", ""), ("openblas", "64_"),
                               ("openblas", "")):
            if hasattr(so, f"{prefix}_get_num_threads{suffix}"):
                return so, f"{prefix}|{suffix}"
    return None, None


BLAS_SO, BLAS_SYM = openblas()


def blas_call(name: str, *args: int) -> int | None:
    if BLAS_SO is None or BLAS_SYM is None:
        return None
    prefix, suffix = BLAS_SYM.split("|")
    return getattr(BLAS_SO, f"{prefix}_{name}{suffix}")(*(ctypes.c_int(a) for a in args))


def blas_info() -> dict:
    """Which BLAS numpy uses and how many threads it runs, by whatever this numpy and this host can say."""
    info: dict = {"numpy": np.__version__, "openblas_threads": blas_call("get_num_threads")}
    try:
        deps = np.show_config(mode="dicts")["Build Dependencies"]["blas"]
        info.update(name=deps.get("name"), version=deps.get("version"), config=deps.get("openblas configuration"))
    except (TypeError, KeyError, AttributeError):  # an older numpy: the text
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            np.show_config()
        info["show_config"] = out.getvalue()[-2000:]
    try:
        from threadpoolctl import threadpool_info

        info["threadpoolctl"] = [{k: p.get(k) for k in ("internal_api", "num_threads", "version", "filepath")}
                                 for p in threadpool_info()]
    except ImportError:
        info["threadpoolctl"] = None
    return info


# ---- the table and the feature pipeline, fitted on a sample (numpy only: torch is not imported yet) ------------------
rng = np.random.default_rng(0)
table = rng.standard_normal((ROWS, RAW)) * rng.uniform(0.5, 3.0, RAW) + rng.standard_normal(RAW)
table += rng.standard_normal((ROWS, 16)) @ rng.standard_normal((16, RAW))  # correlated columns (a low-rank part)
teacher = rng.standard_normal((RAW, 10))
labels = (np.tanh(table @ teacher * 0.05) + 0.1 * rng.standard_normal((ROWS, 10))).argmax(1)
sample = table[rng.choice(ROWS, 4096, replace=False)]
mu, sd = sample.mean(0), sample.std(0) + 1e-8
centroids = (sample[rng.choice(len(sample), CENTROIDS, replace=False)] - mu) / sd
c2 = (centroids ** 2).sum(1)
W = rng.standard_normal((RAW, RFF)) / np.sqrt(RAW)
b = rng.uniform(0, 2 * np.pi, RFF)
R = rng.standard_normal((RFF, PROJ)) / np.sqrt(PROJ)
SCALE = np.sqrt(2.0 / RFF)
moment = {"sum": np.zeros(RFF), "outer": np.zeros((RFF, RFF)), "n": 0}
own = {"steps": 0, "features_s": 0.0, "features_cpu_s": 0.0, "copy_s": 0.0, "train_s": 0.0}


def features(idx: np.ndarray) -> np.ndarray:
    """A batch's PROJ + CENTROIDS features (float32) from its raw rows."""
    x = (table[idx] - mu) / sd
    z = np.cos(x @ W + b) * SCALE  # random Fourier features
    moment["sum"] += z.sum(0)  # the running moments, kept for the next refit of the pipeline
    moment["outer"] += z.T @ z
    moment["n"] += len(z)
    dist = ((x * x).sum(1, keepdims=True) - 2 * (x @ centroids.T) + c2) / RAW  # to the centroids, squared
    return np.hstack([z @ R, dist]).astype(np.float32)


for _ in range(2):  # any thread the BLAS starts lazily starts here
    features(rng.integers(0, ROWS, BATCH))
BLAS_TIDS = sorted(set(_NUMPY_TIDS) | (set(tids_of(PID)) - _BEFORE_NUMPY - {MAIN}))
for _tid in BLAS_TIDS:  # started after the pinning (lazily): on the job's CPUs like the rest
    with contextlib.suppress(OSError):
        os.sched_setaffinity(_tid, sc.job_cpus)
BLAS = {"pid": PID, "tids": BLAS_TIDS, "comms": [comm_of(PID, t) for t in BLAS_TIDS], **blas_info()}
print(f"[{sc.name}] BLAS: {BLAS.get('name')} {BLAS.get('version')}, {BLAS['openblas_threads']} threads, pool tids "
      f"{len(BLAS_TIDS)}", flush=True)

import torch  # noqa: E402

dev = torch.device(sc.device)
if sc.cuda:
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
torch.manual_seed(0)
nn = torch.nn
model = nn.Sequential(nn.Linear(PROJ + CENTROIDS, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.ReLU(),
                      nn.Linear(1024, 10)).to(dev)
opt = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=sc.cuda or None)
loss_fn = nn.CrossEntropyLoss()
last = {"loss": 0.0}


def train(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    loss = loss_fn(model(x), y)
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    return loss


def step() -> None:
    idx = rng.integers(0, ROWS, BATCH)
    t0, c0 = time.perf_counter(), time.thread_time()
    feats = features(idx)
    t1, c1 = time.perf_counter(), time.thread_time()
    x = torch.from_numpy(feats).to(dev)
    y = torch.from_numpy(labels[idx]).to(dev)
    t2 = time.perf_counter()
    last["loss"] = train(x, y).item()
    t3 = time.perf_counter()
    own["features_s"] += t1 - t0
    own["features_cpu_s"] += c1 - c0
    own["copy_s"] += t2 - t1
    own["train_s"] += t3 - t2
    own["steps"] += 1


def sync() -> None:
    if sc.cuda:
        torch.cuda.synchronize()


def features_ms(n: int = 15, budget_s: float = 1.5) -> float:
    """The feature step's median wall time (ms) over n batches (fewer if they take over budget_s), the GPU idle."""
    times: list[float] = []
    end = time.perf_counter() + budget_s
    while len(times) < n and (len(times) < 3 or time.perf_counter() < end):
        idx = rng.integers(0, ROWS, BATCH)
        t0 = time.perf_counter()
        features(idx)
        times.append(time.perf_counter() - t0)
    return sorted(times)[len(times) // 2] * 1e3


def schedstat(tid: int) -> tuple[int, int] | None:
    try:
        with open(f"/proc/{PID}/task/{tid}/schedstat") as fh:
            run, wait = fh.read().split()[:2]
        return int(run), int(wait)
    except (OSError, ValueError):
        return None


def mallocs() -> int:
    return int(torch.cuda.memory_stats().get("segment.all.allocated", 0)) if sc.cuda else 0


for _ in range(3):
    step()
sync()
default_threads = blas_call("get_num_threads")
features_default_ms = features_ms()
features_job_cpus_ms = None
if default_threads is not None:  # the same step with the BLAS at the job's CPU count, then back to its default
    blas_call("set_num_threads", len(sc.job_cpus))
    features_job_cpus_ms = features_ms()
    blas_call("set_num_threads", default_threads)
gpu_step_s = None
if sc.cuda:
    fixed_idx = rng.integers(0, ROWS, BATCH)  # a feature batch in pinned memory: its copy queues without a sync
    fx, fy = torch.from_numpy(features(fixed_idx)).pin_memory(), torch.from_numpy(labels[fixed_idx]).pin_memory()

    def work(_) -> None:
        train(fx.to(dev, non_blocking=True), fy.to(dev, non_blocking=True))

    runs = sorted(r for r in (gpu_seconds_queued(torch, work) for _ in range(5)) if r is not None)
    gpu_step_s = runs[len(runs) // 2] if runs else None
warm_end = time.perf_counter() + 2.0 * sc.scale  # the spin kernels well before the baseline
while time.perf_counter() < warm_end:
    step()
sync()
for k in own:
    own[k] = 0 if k == "steps" else 0.0
stats0 = {t: schedstat(t) for t in tids_of(PID)}
names0 = {t: comm_of(PID, t) for t in stats0}
f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
m0 = mallocs()
b0 = sc.mark("baseline")
t = time.perf_counter()
sc.run_for(10.0 * sc.scale, step)
mid = sc.mark("half")
sc.run_for(10.0 * sc.scale, step)
b1 = sc.mark("end")
wall = time.perf_counter() - t
stats1 = {t: schedstat(t) for t in tids_of(PID)}
f1 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
m1 = mallocs()
names1 = {t: comm_of(PID, t) for t in stats1}
n = own["steps"]


def delta(tid: int, k: int) -> float | None:
    """A thread's CPU time (k=0) or run-queue wait (k=1) over the run (s); started during it: since it started."""
    a, z = stats0.get(tid) or (0, 0), stats1.get(tid)
    return round((z[k] - a[k]) / 1e9, 4) if z else None


def group(tids: list[int], k: int) -> float | None:
    got = [v for v in (delta(t, k) for t in tids) if v is not None]
    return round(sum(got), 4) if got or not tids else None


def share(v: float | None) -> float | None:
    return round(v / wall, 4) if v is not None else None


threads = [{"tid": t, "comm": names1.get(t) or names0.get(t), "blas": t in BLAS_TIDS, "run_s": delta(t, 0),
            "cpu_wait_s": delta(t, 1)} for t in sorted(set(stats0) | set(stats1))]
blas_alive = [t for t in BLAS_TIDS if t in stats1]
others = [t for t in stats1 if t != MAIN and t not in BLAS_TIDS]
main_run, main_wait = delta(MAIN, 0), delta(MAIN, 1)
gpu_busy = n * gpu_step_s if gpu_step_s is not None else None
saved = (own["features_s"] - n * features_job_cpus_ms / 1e3) if features_job_cpus_ms is not None else None
sc.extra["blas"] = BLAS
sc.extra["threads"] = threads
sc.extra["self"] = {**{k: round(v, 4) for k, v in own.items()}, "wall_s": round(wall, 4),
                    "steps_per_s": round(n / wall, 2), "step_ms_mean": round(wall / max(n, 1) * 1e3, 4),
                    "features_share": share(own["features_s"]), "features_cpu_share": share(own["features_cpu_s"]),
                    "copy_share": share(own["copy_s"]), "train_share": share(own["train_s"]),
                    "features_ms_mean": round(own["features_s"] / max(n, 1) * 1e3, 4),
                    "features_default_ms": round(features_default_ms, 4),
                    "features_job_cpus_ms": round(features_job_cpus_ms, 4) if features_job_cpus_ms else None,
                    "job_cpus_would_save_s": round(saved, 4) if saved is not None else None,
                    "main_run_s": main_run, "main_cpu_share": share(main_run),
                    "main_cpu_wait_s": main_wait, "main_cpu_wait_share": share(main_wait),
                    "blas_threads": BLAS["openblas_threads"], "blas_pool_tids": len(BLAS_TIDS),
                    "blas_run_s": group(blas_alive, 0), "blas_cpu_wait_s": group(blas_alive, 1),
                    "blas_cpu_share": share(group(blas_alive, 0)),
                    "other_threads_run_s": group(others, 0), "other_threads_cpu_wait_s": group(others, 1),
                    "job_cpus": len(sc.job_cpus), "host_cpus": os.cpu_count(),
                    "minor_faults_per_s": round((f1 - f0) / wall, 1),
                    "cuda_mallocs_per_s": round((m1 - m0) / wall, 3),
                    "gpu_step_ms": round(gpu_step_s * 1e3, 4) if gpu_step_s is not None else None,
                    "gpu_busy_s": round(gpu_busy, 4) if gpu_busy is not None else None,
                    "gpu_busy_share": share(gpu_busy), "batch": BATCH, "loss": round(last["loss"], 4)}
sc.note(f"natural: measured by the script: {n} steps ({n / wall:.1f}/s) in {wall:.2f} s: {own['features_s']:.2f} s "
        f"making features with numpy ({own['features_cpu_s']:.2f} s of the main thread's CPU), {own['copy_s']:.2f} s "
        f"copying, {own['train_s']:.2f} s training with .item(); the main thread ran "
        f"{main_run} s and waited for a CPU {main_wait} s; the BLAS ({BLAS.get('name')} {BLAS.get('version')}, "
        f"{BLAS['openblas_threads']} threads, {len(BLAS_TIDS)} of its own on {len(sc.job_cpus)} CPUs) ran "
        f"{group(blas_alive, 0)} s and waited {group(blas_alive, 1)} s; a feature step takes {features_default_ms:.2f} "
        f"ms at the default, {features_job_cpus_ms or float('nan'):.2f} ms at {len(sc.job_cpus)} BLAS threads; "
        + (f"a step's copy and kernels take {gpu_step_s * 1e3:.2f} ms of GPU time queued (GPU busy "
           f"{gpu_busy / wall:.0%} of the run)." if gpu_busy is not None else "no GPU timings (no CUDA)."))
sc.write_truth(baseline=(b0, b1), window=None, ratio_spans=((b0, mid), (mid, b1)))
