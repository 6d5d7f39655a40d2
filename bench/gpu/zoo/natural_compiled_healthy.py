"""natural_compiled_healthy (natural, nothing staged; a control): a GPU-bound MLP under torch.compile (default backend,
inductor; default options) whose shapes never change: 512-4096, three 4096x4096 layers with ReLU, 10 classes, batch
8192, fp32 without TF32 (tens of ms of GPU work a step), fused AdamW (not compiled), the loss read with .item() each
step for the log (its one wait for the GPU); every 100 steps an evaluation of one held-out batch of the same size under
model.eval() and torch.no_grad() (a second graph). Before the measured run the job is warmed up on everything it will
run: training steps (the compile of the forward and, at the first backward(), of the backward) and an evaluation (the
eval graph), so no compile is left for the run. Batches from a pool of 8 already on the GPU. One process on CPUs 2-3
(the inductor compile workers, child processes, inherit them), ~20 s measured. If torch.compile's inductor cannot run
here (no Triton, no compiler), the model is compiled with backend="aot_eager" instead, and the truth says so
(`backend`).

The script measures itself: the steps per second; the main thread's time in the steps (queueing them; in loss.backward()
apart, `backward_s`, where PyTorch's autograd thread queues the backward) and in .item() (its wait for the GPU) and in
the evaluations; the graphs Dynamo compiled and its time compiling during the measured run
(its unique_graphs counter and compilation_time_metrics: expected none) and the warm-up's compile time; the main
thread's time on a CPU and waiting for one (schedstat); the process's minor page faults and the device allocator's
cudaMalloc calls; and a training step's and an evaluation's GPU time queued (common.gpu_seconds_queued), so that the
GPU's busy share is known."""

import resource
import time

from common import Scenario, gpu_seconds_queued

sc = Scenario("natural_compiled_healthy", "natural", "a GPU-bound MLP under torch.compile, warmed up on its one shape "
              "(training and eval graphs) before the run, loss.item() each step, 20 s, nothing staged (a control)",
              job_cpus=[2, 3], control=True)
import torch  # noqa: E402
import torch._dynamo  # noqa: E402
import torch._dynamo.utils as dynamo_utils  # noqa: E402

dev = torch.device(sc.device)
WIDTH, BATCH, IN_DIM, NCLASS, POOL, EVAL_EVERY = (4096, 8192, 512, 10, 8, 100) if sc.cuda else (64, 256, 512, 10, 8,
                                                                                                  100)
if sc.cuda:
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
nn = torch.nn
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(IN_DIM, WIDTH), nn.ReLU(), nn.Linear(WIDTH, WIDTH), nn.ReLU(),
                      nn.Linear(WIDTH, WIDTH), nn.ReLU(), nn.Linear(WIDTH, WIDTH), nn.ReLU(),
                      nn.Linear(WIDTH, NCLASS)).to(dev)
opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=sc.cuda or None)
loss_fn = nn.CrossEntropyLoss()
xs = torch.randn(POOL, BATCH, IN_DIM, device=dev)
ys = torch.randint(0, NCLASS, (POOL, BATCH), device=dev)
x_val, y_val = torch.randn(BATCH, IN_DIM, device=dev), torch.randint(0, NCLASS, (BATCH,), device=dev)
backend = "inductor"
compiled = torch.compile(model)
own = {"steps": 0, "backward_s": 0.0, "queue_s": 0.0, "item_s": 0.0, "evals": 0, "eval_s": 0.0, "running_loss": 0.0,
       "val_loss": 0.0}
pos = {"i": 0}


def graphs() -> int:
    return int(dynamo_utils.counters["stats"]["unique_graphs"])


def compile_s() -> float:
    """Dynamo's own time compiling so far (its compilation_time_metrics; 0 where this torch keeps none)."""
    metrics = getattr(dynamo_utils, "compilation_time_metrics", {})
    return float(sum(metrics.get("_compile.compile_inner", [])))


def train_step(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    loss = loss_fn(compiled(x), y)
    t_b = time.perf_counter()
    loss.backward()  # queued by PyTorch's autograd thread; the main thread waits for it
    own["backward_s"] += time.perf_counter() - t_b
    opt.step()
    opt.zero_grad(set_to_none=True)
    return loss


def evaluate() -> float:
    model.eval()
    with torch.no_grad():
        v = loss_fn(compiled(x_val), y_val).item()
    model.train()
    return v


def step() -> None:
    i = pos["i"]
    pos["i"] += 1
    t0 = time.perf_counter()
    loss = train_step(xs[i % POOL], ys[i % POOL])
    t1 = time.perf_counter()
    own["running_loss"] += loss.item()
    t2 = time.perf_counter()
    own["queue_s"] += t1 - t0
    own["item_s"] += t2 - t1
    own["steps"] += 1
    if own["steps"] % EVAL_EVERY == 0:
        own["val_loss"] = evaluate()
        own["eval_s"] += time.perf_counter() - t2
        own["evals"] += 1


def sync() -> None:
    if sc.cuda:
        torch.cuda.synchronize()


def schedstat() -> tuple[float, float | None]:
    """The calling thread's time on a CPU and waiting on a run queue (s), from the kernel's schedstat; where that is
    not kept, the thread's CPU clock and None."""
    try:
        with open("/proc/thread-self/schedstat") as fh:
            run_ns, wait_ns = fh.read().split()[:2]
        return int(run_ns) / 1e9, int(wait_ns) / 1e9
    except (OSError, ValueError):
        return time.thread_time(), None


def mallocs() -> int:
    return int(torch.cuda.memory_stats().get("segment.all.allocated", 0)) if sc.cuda else 0


# Warm-up on everything the run will do: training steps (forward and backward compiled) and an evaluation.
t_warm = time.perf_counter()
try:
    step()
except Exception as exc:  # noqa: BLE001 - no Triton or no C++ compiler here: the documented fallback backend
    sc.note(f"inductor failed ({type(exc).__name__}: {str(exc)[:200]}); compiled with backend='aot_eager' instead.")
    torch._dynamo.reset()
    model.train()
    backend = "aot_eager"
    compiled = torch.compile(model, backend=backend)
    step()
evaluate()
for _ in range(10):
    step()
sync()
warm_compile_s = time.perf_counter() - t_warm
gpu_step_s = gpu_eval_s = None
if sc.cuda:
    def measure(work) -> float | None:
        runs = sorted(r for r in (gpu_seconds_queued(torch, work) for _ in range(5)) if r is not None)
        return runs[len(runs) // 2] if runs else None

    def eval_work(_) -> None:
        model.eval()
        with torch.no_grad():
            loss_fn(compiled(x_val), y_val)
        model.train()

    gpu_step_s = measure(lambda _: train_step(xs[0], ys[0]))
    gpu_eval_s = measure(eval_work)
warm_end = time.perf_counter() + 2.0 * sc.scale  # the spin kernels well before the baseline
while time.perf_counter() < warm_end:
    step()
sync()
for k in own:
    own[k] = 0 if k in ("steps", "evals") else 0.0
g0, c0, m0 = graphs(), compile_s(), mallocs()
f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
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
f1 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
g1, c1, m1 = graphs(), compile_s(), mallocs()
n = own["steps"]
gpu_busy = (n * gpu_step_s + own["evals"] * (gpu_eval_s or 0.0)) if gpu_step_s is not None else None


def share(v: float | None) -> float | None:
    return round(v / wall, 4) if v is not None else None


limit = getattr(torch._dynamo.config, "recompile_limit", None) or getattr(torch._dynamo.config, "cache_size_limit")
sc.extra["self"] = {**{k: round(v, 4) for k, v in own.items()}, "wall_s": round(wall, 4),
                    "steps_per_s": round(n / wall, 2), "backend": backend,
                    "warmup_s": round(warm_compile_s, 3), "recompiles": g1 - g0, "graphs_total": g1,
                    "recompile_limit": limit, "compile_s": round(c1 - c0, 4), "compile_share": share(c1 - c0),
                    "queue_share": share(own["queue_s"]), "item_share": share(own["item_s"]),
                    "eval_share": share(own["eval_s"]),
                    "main_run_s": round(run1 - run0, 4), "main_cpu_share": share(run1 - run0),
                    "main_cpu_wait_s": round(wait1 - wait0, 4) if wait0 is not None else None,
                    "main_cpu_wait_share": share(wait1 - wait0) if wait0 is not None else None,
                    "minor_faults_per_s": round((f1 - f0) / wall, 1),
                    "cuda_mallocs_per_s": round((m1 - m0) / wall, 3),
                    "gpu_step_ms": round(gpu_step_s * 1e3, 4) if gpu_step_s is not None else None,
                    "gpu_eval_ms": round(gpu_eval_s * 1e3, 4) if gpu_eval_s is not None else None,
                    "gpu_busy_s": round(gpu_busy, 4) if gpu_busy is not None else None,
                    "gpu_busy_share": share(gpu_busy), "batch": BATCH}
sc.note(f"natural: measured by the script: backend {backend}, warm-up with its compiles {warm_compile_s:.1f} s; "
        f"{n} steps ({n / wall:.1f}/s) in {wall:.2f} s: {own['queue_s']:.2f} s queueing steps, {own['item_s']:.2f} s "
        f"in .item(), {own['evals']} evaluations ({own['eval_s']:.2f} s); {g1 - g0} graphs compiled in the run "
        f"({c1 - c0:.3f} s); "
        + (f"a step's kernels take {gpu_step_s * 1e3:.2f} ms of GPU time queued (GPU busy {gpu_busy / wall:.0%} of the "
           "run)." if gpu_busy is not None else "no GPU timings (no CUDA)."))
sc.write_truth(baseline=(b0, b1), window=None, ratio_spans=((b0, mid), (mid, b1)))
