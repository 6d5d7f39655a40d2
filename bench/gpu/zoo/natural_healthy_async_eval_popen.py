"""natural_healthy_async_eval_popen (natural, nothing staged): a control. A CLIP-style dual encoder trained with a
symmetric InfoNCE loss on paired precomputed features (an "image" tower 1024-4096-4096-4096-512 and a "text" tower
768-4096-4096-4096-512 with GELU, a learnable temperature, 8,192 pairs a step drawn from 65,536 held on the GPU; fp32
without TF32, fused AdamW, loss.item() each step: ~100 ms of GPU work a step against a few ms of queueing) whose
retrieval evaluation runs asynchronously in a child process, the way a team keeps "eval off the training loop": every
EVAL_EVERY steps (~3 s by the step rate at start-up) the main thread embeds a held-out set of 4,096 pairs under
no_grad, copies the two embedding matrices to the host (.cpu(), 16 MB), np.save()s them to a folder under /var/tmp
(ZOO_DATA_DIR) and starts `subprocess.Popen([sys.executable, "eval_retrieval.py", emb.npy, out.json])` with
OMP/OpenBLAS threads set to 1, WITHOUT waiting: each step it poll()s the child, and once it has exited reads its JSON
(recall@1/5/10 both ways, median rank) and logs it; while a child still runs, a due evaluation is skipped. The child
(python3) imports numpy, loads the embeddings, computes the 4,096 x 4,096 similarity and ranks every row both ways
with argsort: a second or more of one CPU, every few seconds. The decoys: processes started again and again in the
run, each busy on a CPU of the job, and a file written every few seconds; the training loop never waits for them. The
job (and its children, which inherit them) on CPUs 2-5; no threads of the job's own, no workers, no lock, no sleep.
20 s (smaller with --device cpu: towers of width 256, 1,024 pairs a step, 1,024 held out).

The script measures itself: the steps per second; the main thread's time queueing the steps (`step_s`), in
loss.backward() (`backward_s`, its wait on PyTorch's autograd thread) and in loss.item() (`item_s`: its wait for the
GPU); per evaluation its time embedding and copying (`embed_s`), in np.save (`save_s`), in Popen (`launch_s`), in the
poll() calls (`poll_s`) and reading the result (`read_s`); each child's pid, when it was started and when poll() found
it exited (truth `evals`, `decoys` with their spans), its CPU time (resource.getrusage(RUSAGE_CHILDREN) deltas at
each reaping) and its own clocks (import, load, rank); before the run, the same loop without the evaluations, so
that what they cost the run is known (`eval_overhead_s`: the run's wall time beyond its steps at that rate); the main
thread's and the autograd thread's time on a CPU and waiting for one over the run (schedstat); the process's minor and
major page faults and the device allocator's cudaMalloc calls; and the GPU time queued (common.gpu_seconds_queued) of
a training step and of an evaluation's embedding, so that the GPU's busy share is known. Truth `autograd` names
PyTorch's autograd thread, `children` the evaluation processes."""

import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import threading
import time

from common import Scenario, comm_of, gpu_seconds_queued, now, tids_of

sc = Scenario("natural_healthy_async_eval_popen", "natural", "a GPU-bound CLIP-style dual encoder (two 4096-wide "
              "MLP towers, 8,192 pairs a step) that every ~3 s saves held-out embeddings and starts a numpy retrieval "
              "evaluation in a child process with subprocess.Popen without waiting (polled each step), the children "
              "busy on the job's CPUs as decoys, 20 s, nothing staged", job_cpus=[2, 3, 4, 5], control=True)
import numpy as np  # noqa: E402
import torch  # noqa: E402

nn = torch.nn
F = nn.functional
PID, MAIN = os.getpid(), threading.get_native_id()
dev = torch.device(sc.device)
if sc.cuda:
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
IMG, TXT, WIDTH, EMB, BATCH, POOL, HELD = ((1024, 768, 4096, 512, 8192, 65536, 4096) if sc.cuda
                                           else (1024, 768, 256, 128, 1024, 8192, 1024))
LATENT, EVAL_PERIOD_S = 256, 3.0 * sc.scale
CHILD_COMM = os.path.basename(sys.executable)[:15]  # the kernel names a process by the file it executes
DATA_PARENT = os.environ.get("ZOO_DATA_DIR", "/var/tmp")
EVAL_CODE = '''"""Retrieval evaluation of saved embeddings (numpy only): writes one JSON file."""
import json
import os
import sys
import time

t0 = time.perf_counter()
import numpy as np

t1 = time.perf_counter()
emb_path, out_path = sys.argv[1], sys.argv[2]
emb = np.load(emb_path)
img, txt = emb[0], emb[1]
t2 = time.perf_counter()
sim = img @ txt.T
truth = np.arange(len(sim))
out = {"pid": os.getpid()}
for name, s in (("i2t", sim), ("t2i", sim.T)):
    order = np.argsort(-s, axis=1)
    rank = np.argmax(order == truth[:, None], axis=1)
    for k in (1, 5, 10):
        out[f"{name}_r@{k}"] = float((rank < k).mean())
    out[f"{name}_median_rank"] = float(np.median(rank) + 1)
t3 = time.perf_counter()
out.update({"import_s": t1 - t0, "load_s": t2 - t1, "rank_s": t3 - t2, "cpu_s": time.process_time()})
with open(out_path + ".tmp", "w") as fh:
    json.dump(out, fh)
os.replace(out_path + ".tmp", out_path)
'''
KEYS = ("step_s", "backward_s", "item_s", "embed_s", "save_s", "launch_s", "poll_s", "read_s")
own = {"steps": 0, "evals": 0, "skipped": 0, **dict.fromkeys(KEYS, 0.0), "running_loss": 0.0}
evals: list[dict] = []
state: dict = {"proc": None, "cur": None, "every": None, "on": False, "ru": None}


def tower(d_in: int) -> nn.Module:
    return nn.Sequential(nn.Linear(d_in, WIDTH), nn.GELU(), nn.Linear(WIDTH, WIDTH), nn.GELU(),
                         nn.Linear(WIDTH, WIDTH), nn.GELU(), nn.Linear(WIDTH, EMB))


class DualEncoder(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.img, self.txt = tower(IMG), tower(TXT)
        self.logit_scale = nn.Parameter(torch.tensor(2.659))  # log(1 / 0.07)

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return F.normalize(self.img(a), dim=1), F.normalize(self.txt(b), dim=1)


def make_pairs(n: int, g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Paired features: two noisy views of one latent each, through fixed random projections."""
    z = torch.randn(n, LATENT, generator=g)
    a = z @ proj_a + 0.5 * torch.randn(n, IMG, generator=g)
    b = z @ proj_b + 0.5 * torch.randn(n, TXT, generator=g)
    return a.to(dev), b.to(dev)


def schedstat(pid: int, tid: int) -> tuple[float, float] | None:
    try:
        with open(f"/proc/{pid}/task/{tid}/schedstat") as fh:
            run, wait = fh.read().split()[:2]
        return int(run) / 1e9, int(wait) / 1e9
    except (OSError, ValueError):
        return None


def autograd_thread() -> dict | None:
    for tid in tids_of(PID):
        comm = comm_of(PID, tid) or ""
        if comm.startswith("pt_autograd"):
            return {"pid": PID, "tid": tid, "comm": comm}
    return None


def children_cpu() -> float:
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


g = torch.Generator().manual_seed(0)
proj_a, proj_b = torch.randn(LATENT, IMG, generator=g) / 16, torch.randn(LATENT, TXT, generator=g) / 16
pool_a, pool_b = make_pairs(POOL, g)
held_a, held_b = make_pairs(HELD, g)
torch.manual_seed(0)
model = DualEncoder().to(dev)
opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.1, fused=sc.cuda or None)
labels = torch.arange(BATCH, device=dev)
workdir = tempfile.mkdtemp(prefix="zoo_asyncev_", dir=DATA_PARENT if os.path.isdir(DATA_PARENT) else None)
eval_script = os.path.join(workdir, "eval_retrieval.py")
with open(eval_script, "w") as fh:
    fh.write(EVAL_CODE)
child_env = {**os.environ, "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


def clip_loss(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    za, zb = model(a, b)
    logits = model.logit_scale.exp().clamp(max=100) * za @ zb.T
    return (F.cross_entropy(logits, labels) + F.cross_entropy(logits.T, labels)) / 2


def batch() -> tuple[torch.Tensor, torch.Tensor]:
    idx = torch.randint(0, POOL, (BATCH,), device=dev)
    return pool_a.index_select(0, idx), pool_b.index_select(0, idx)


def train(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    t0 = time.perf_counter()
    loss = clip_loss(a, b)
    opt.zero_grad(set_to_none=True)
    t1 = time.perf_counter()
    loss.backward()
    t2 = time.perf_counter()
    opt.step()
    own["backward_s"] += t2 - t1
    own["step_s"] += (t1 - t0) + (time.perf_counter() - t2)
    return loss


def embed_held() -> tuple[torch.Tensor, torch.Tensor]:
    with torch.no_grad():
        return model(held_a, held_b)


def reap() -> None:
    """The running child, if it has exited: its result read and logged (poll each step, never wait)."""
    proc = state["proc"]
    if proc is None:
        return
    t0 = time.perf_counter()
    done = proc.poll() is not None
    own["poll_s"] += time.perf_counter() - t0
    if not done:
        return
    cur = state["cur"]
    cur["reaped_ns"] = now()
    cur["returncode"] = proc.returncode
    cur["cpu_s"] = round(children_cpu() - state["ru"], 4)
    t1 = time.perf_counter()
    try:
        with open(cur["out"]) as fh:
            cur["result"] = json.load(fh)
    except (OSError, ValueError):
        cur["result"] = None
    own["read_s"] += time.perf_counter() - t1
    state["proc"] = None


def evaluate() -> None:
    """Embed the held-out pairs, save them, start the evaluation and go on (skipped while the last one runs)."""
    if state["proc"] is not None:
        own["skipped"] += 1
        return
    k = own["evals"]
    t0 = time.perf_counter()
    za, zb = embed_held()
    emb = torch.stack([za, zb]).cpu().numpy()
    t1 = time.perf_counter()
    path, out = os.path.join(workdir, f"emb_{k:04d}.npy"), os.path.join(workdir, f"eval_{k:04d}.json")
    np.save(path, emb)
    t2 = time.perf_counter()
    state["ru"] = children_cpu()
    started = now()
    proc = subprocess.Popen([sys.executable, eval_script, path, out], env=child_env, stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    t3 = time.perf_counter()
    own["embed_s"] += t1 - t0
    own["save_s"] += t2 - t1
    own["launch_s"] += t3 - t2
    own["evals"] += 1
    state["proc"] = proc
    state["cur"] = {"k": k, "pid": proc.pid, "started_ns": started, "reaped_ns": None, "out": out}
    evals.append(state["cur"])


def step() -> None:
    loss = train(*batch())
    t0 = time.perf_counter()
    own["running_loss"] += loss.item()
    own["item_s"] += time.perf_counter() - t0
    own["steps"] += 1
    if state["on"]:
        reap()
        if own["steps"] % state["every"] == 0:
            evaluate()


def sync() -> None:
    if sc.cuda:
        torch.cuda.synchronize()


def reset() -> None:
    for k in own:
        own[k] = 0 if k in ("steps", "evals", "skipped") else 0.0


def timed(seconds: float) -> tuple[int, float]:
    n0, t = own["steps"], time.perf_counter()
    end = t + seconds
    while time.perf_counter() < end:
        step()
    sync()
    return own["steps"] - n0, time.perf_counter() - t


try:
    for _ in range(10):  # warm-up: cuBLAS, the allocator, the autograd thread
        step()
    embed_held()[0].sum().item()
    sync()
    gpu_step_s = gpu_embed_s = None
    if sc.cuda:
        def median_gpu_s(work) -> float | None:
            runs = sorted(r for r in (gpu_seconds_queued(torch, work) for _ in range(5)) if r is not None)
            return runs[len(runs) // 2] if runs else None

        gpu_step_s = median_gpu_s(lambda _: train(*batch()))
        gpu_embed_s = median_gpu_s(lambda _: embed_held())
    # Without the evaluations first: what they cost, were it a cost.
    reset()
    fix_steps, fix_wall = timed(3.0 * sc.scale)
    fix_rate = fix_steps / fix_wall if fix_wall > 0 else None
    state["every"] = max(1, round(EVAL_PERIOD_S * fix_rate)) if fix_rate else 10
    state["on"] = True
    timed(1.0 * sc.scale)  # the spin kernels well before the run
    while state["proc"] is not None:  # no child from before the run lives into it
        reap()
        step()
    ag = autograd_thread()
    reset()
    first_eval = len(evals)
    ch0 = children_cpu()
    main0 = schedstat(PID, MAIN)
    ag0 = schedstat(PID, ag["tid"]) if ag else None
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
    r1 = resource.getrusage(resource.RUSAGE_SELF)
    m1 = int(torch.cuda.memory_stats().get("segment.all.allocated", 0)) if sc.cuda else 0
    state["on"] = False
    if state["proc"] is not None:  # the last child, still running at the end: waited for after the run
        state["proc"].wait()
        reap()
    ch1 = children_cpu()
finally:
    if state["proc"] is not None and state["proc"].poll() is None:
        state["proc"].kill()
        state["proc"].wait()
    shutil.rmtree(workdir, ignore_errors=True)
n = own["steps"]


def share(v: float | None) -> float | None:
    return round(v / wall, 4) if v is not None else None


def r4(v: float | None) -> float | None:
    return round(v, 4) if v is not None else None


def delta(a, b, k: int) -> float | None:
    return r4(b[k] - a[k]) if a and b else None


run_evals = evals[first_eval:]
for e in run_evals:
    e.pop("out", None)
    end = e["reaped_ns"] or b1
    e["span_ns"] = [e["started_ns"], end]
    e["life_s"] = round((end - e["started_ns"]) / 1e9, 4)
    e["in_run_s"] = round(max(0, min(end, b1) - max(e["started_ns"], b0)) / 1e9, 4)
res = [e["result"] for e in run_evals if e.get("result")]
children_cpu_s = round(ch1 - ch0, 4)
in_run = sum(e["in_run_s"] for e in run_evals)
at_fix = n / fix_rate if fix_rate else None
overhead = max(0.0, wall - at_fix) if at_fix is not None else None
main_run, main_wait = delta(main0, main1, 0), delta(main0, main1, 1)
ag_run, ag_wait = delta(ag0, ag1, 0), delta(ag0, ag1, 1)
gpu_busy = (n * gpu_step_s + own["evals"] * (gpu_embed_s or 0.0)) if gpu_step_s is not None else None
eval_main_s = sum(own[k] for k in ("embed_s", "save_s", "launch_s", "poll_s", "read_s"))
sc.extra["autograd"] = ag
sc.extra["evals"] = run_evals
sc.extra["children"] = {"comm": CHILD_COMM, "count": len(run_evals), "pids": [e["pid"] for e in run_evals],
                        "what": "python3 eval_retrieval.py: numpy similarity and argsort ranks, one BLAS thread"}
sc.extra["decoys"] = [{"what": "retrieval evaluation child started with subprocess.Popen, not waited for",
                       "pid": e["pid"], "tids": [e["pid"]], "comm": CHILD_COMM, "span_ns": e["span_ns"]}
                      for e in run_evals]
sc.extra["self"] = {**{k: round(v, 4) if isinstance(v, float) else v for k, v in own.items()},
                    "wall_s": round(wall, 4), "steps_per_s": round(n / wall, 2),
                    "step_ms_mean": round(wall / max(n, 1) * 1e3, 3), "eval_every": state["every"],
                    "step_share": share(own["step_s"]), "backward_share": share(own["backward_s"]),
                    "item_share": share(own["item_s"]),
                    "eval_main_s": round(eval_main_s, 4), "eval_main_share": share(eval_main_s),
                    "launch_ms_mean": round(own["launch_s"] / max(own["evals"], 1) * 1e3, 3),
                    "children": len(run_evals), "children_cpu_s": children_cpu_s,
                    "children_cpu_share": share(children_cpu_s), "children_alive_s": round(in_run, 4),
                    "children_alive_share": share(in_run),
                    "child_rank_s_mean": round(sum(r["rank_s"] for r in res) / len(res), 4) if res else None,
                    "child_import_s_mean": round(sum(r["import_s"] for r in res) / len(res), 4) if res else None,
                    "fix_steps": fix_steps, "fix_wall_s": round(fix_wall, 4),
                    "fix_steps_per_s": round(fix_rate, 3) if fix_rate else None,
                    "at_fix_rate_s": r4(at_fix), "eval_overhead_s": r4(overhead),
                    "eval_overhead_share": share(overhead),
                    "main_run_s": main_run, "main_cpu_share": share(main_run),
                    "main_cpu_wait_s": main_wait, "main_cpu_wait_share": share(main_wait),
                    "autograd_run_s": ag_run, "autograd_cpu_share": share(ag_run),
                    "autograd_cpu_wait_s": ag_wait, "autograd_cpu_wait_share": share(ag_wait),
                    "minor_faults_per_s": round((r1.ru_minflt - r0.ru_minflt) / wall, 1),
                    "major_faults": r1.ru_majflt - r0.ru_majflt,
                    "cuda_mallocs_per_s": round((m1 - m0) / wall, 3),
                    "gpu_step_ms": round(gpu_step_s * 1e3, 4) if gpu_step_s is not None else None,
                    "gpu_embed_ms": round(gpu_embed_s * 1e3, 4) if gpu_embed_s is not None else None,
                    "gpu_busy_s": r4(gpu_busy), "gpu_busy_share": share(gpu_busy),
                    "batch": BATCH, "width": WIDTH, "held_out": HELD, "pool": POOL}
if not sc.cuda:
    sc.note("on the CPU: no autograd thread (the backward runs on the main thread), no GPU timings, no allocator "
            "counters; the job is not GPU-bound there.")
sc.note(f"natural: measured by the script: {n} steps ({n / wall:.2f}/s) in {wall:.2f} s: {own['item_s']:.2f} s in "
        f".item() (waiting for the GPU); {own['evals']} evaluations started ({own['skipped']} skipped while one ran), "
        f"the main thread's part {eval_main_s:.3f} s (Popen {own['launch_s'] * 1e3:.1f} ms in all); the "
        f"{len(run_evals)} children alive {in_run:.2f} s of the run, {children_cpu_s:.2f} s of CPU; without the "
        f"evaluations {fix_rate and round(fix_rate, 2)} steps/s (they cost {overhead and round(overhead, 2)} s of the "
        f"run); the main thread ran {main_run} s, waited for a CPU {main_wait} s; "
        + (f"a step's kernels take {gpu_step_s * 1e3:.1f} ms of GPU time queued (GPU busy {gpu_busy / wall:.0%} of the "
           "run)." if gpu_busy is not None else "no GPU timings (no CUDA)."))
sc.write_truth(baseline=(b0, b1), window=None, ratio_spans=((b0, mid), (mid, b1)))
