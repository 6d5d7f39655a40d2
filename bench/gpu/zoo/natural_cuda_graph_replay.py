"""natural_cuda_graph_replay (natural, nothing staged): a training step captured once in a CUDA graph and replayed, as
PyTorch's documentation shows for whole-network capture: the zoo's MLP (512-2048-2048-2048-10, batch 8192, fp32
without TF32) with AdamW(capturable=True); static input and label tensors on the GPU; three warm-up steps on a side
stream, then forward, loss, backward and the optimiser's step captured in a torch.cuda.CUDAGraph (torch.cuda.graph).
Each step copies the next batch of a pool of 8 held in pinned host memory into the static tensors
(copy_(non_blocking=True), input and labels) and replays the graph (g.replay()); every 10 steps the loss is read with
.item() for the running loss, so the host runs at most 10 steps ahead of the GPU. A few CUDA calls a step (two copies,
one graph launch) where the same step run eagerly makes dozens. CPUs 2-3, 20 s. Without CUDA (the smoke run) the same
loop runs the step eagerly, and the truth says so.

The script measures itself: the steps per second; the main thread's time in the copies, in g.replay() and in .item()
(where it waits for the GPU: a stream synchronise); a step's GPU time queued (the copies and a replay:
common.gpu_seconds_queued), so that the GPU's busy share is known; the main thread's time on a CPU and waiting for one
over the run (schedstat); the process's minor page faults and the device allocator's cudaMalloc calls; and, after the
run (the truth written first, then again with them), the CUDA runtime and driver calls a step makes, counted with
torch.profiler over 20 replayed steps and over 20 eager steps of a copy of the model with its own optimiser."""

import copy
import resource
import time

from common import Scenario, gpu_seconds_queued

sc = Scenario("natural_cuda_graph_replay", "natural", "the MLP's training step captured once in a CUDA graph and "
              "replayed each step after copying the next pinned batch into its static inputs, loss.item() every 10 "
              "steps, 20 s, nothing staged", job_cpus=[2, 3], control=True)
import torch  # noqa: E402

dev = torch.device(sc.device)
WIDTH, BATCH, IN_DIM, NCLASS, POOL, LOG_EVERY = (2048, 8192, 512, 10, 8, 10) if sc.cuda else (64, 256, 512, 10, 8, 10)
if sc.cuda:
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
nn = torch.nn


def mlp() -> nn.Module:
    return nn.Sequential(nn.Linear(IN_DIM, WIDTH), nn.ReLU(), nn.Linear(WIDTH, WIDTH), nn.ReLU(),
                         nn.Linear(WIDTH, WIDTH), nn.ReLU(), nn.Linear(WIDTH, NCLASS))


torch.manual_seed(0)
model = mlp().to(dev)
opt = torch.optim.AdamW(model.parameters(), lr=1e-4, capturable=sc.cuda)
loss_fn = nn.CrossEntropyLoss()
gen = torch.Generator().manual_seed(0)
host_x = [torch.randn(BATCH, IN_DIM, generator=gen) for _ in range(POOL)]
host_y = [torch.randint(0, NCLASS, (BATCH,), generator=gen) for _ in range(POOL)]
if sc.cuda:
    host_x = [x.pin_memory() for x in host_x]
    host_y = [y.pin_memory() for y in host_y]
static_x = torch.empty(BATCH, IN_DIM, device=dev)
static_y = torch.empty(BATCH, dtype=torch.long, device=dev)
static_x.copy_(host_x[0])
static_y.copy_(host_y[0])


def eager_step(m: nn.Module, o: torch.optim.Optimizer) -> torch.Tensor:
    o.zero_grad(set_to_none=True)
    loss = loss_fn(m(static_x), static_y)
    loss.backward()
    o.step()
    return loss


graph = None
if sc.cuda:
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up on a side stream before the capture, as the documentation shows
        for _ in range(3):
            eager_step(model, opt)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    opt.zero_grad(set_to_none=True)
    with torch.cuda.graph(graph):
        static_loss = loss_fn(model(static_x), static_y)
        static_loss.backward()
        opt.step()
else:
    static_loss = eager_step(model, opt)
    sc.note("no CUDA: the step runs eagerly (no graph), the same loop otherwise.")

own = {"steps": 0, "copy_s": 0.0, "replay_s": 0.0, "item_s": 0.0, "items": 0, "running_loss": 0.0}
pos = {"i": 0}


def step() -> None:
    i = pos["i"]
    pos["i"] += 1
    t0 = time.perf_counter()
    static_x.copy_(host_x[i % POOL], non_blocking=True)
    static_y.copy_(host_y[i % POOL], non_blocking=True)
    t1 = time.perf_counter()
    if graph is not None:
        graph.replay()
        loss = static_loss
    else:
        loss = eager_step(model, opt)
    t2 = time.perf_counter()
    own["copy_s"] += t1 - t0
    own["replay_s"] += t2 - t1
    own["steps"] += 1
    if own["steps"] % LOG_EVERY == 0:
        own["running_loss"] += loss.item()
        own["item_s"] += time.perf_counter() - t2
        own["items"] += 1


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


def calls_per_step(fn, steps: int = 20) -> float | None:
    """The CUDA runtime and driver calls `fn` makes a call, counted by torch.profiler (None where it cannot)."""
    if not sc.cuda:
        return None
    try:
        from torch.profiler import ProfilerActivity, profile

        sync()
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for _ in range(steps):
                fn()
        sync()
        cpu = torch.autograd.DeviceType.CPU
        n = sum(e.count for e in prof.key_averages() if e.device_type == cpu and e.key.startswith("cu"))
        if n == 0:
            sc.note("CUDA calls not counted (the profiler listed none).")
            return None
        return round(n / steps, 2)
    except Exception as exc:  # noqa: BLE001 - a measure we can go without
        sc.note(f"CUDA calls not counted ({type(exc).__name__}: {exc}).")
        return None


for _ in range(5 * LOG_EVERY):  # warm-up: the replays, the copies, the first .item()
    step()
sync()
gpu_step_s = None
if sc.cuda:
    def work(_) -> None:
        """One step's GPU work: the copies and a replay, nothing read back."""
        static_x.copy_(host_x[0], non_blocking=True)
        static_y.copy_(host_y[0], non_blocking=True)
        graph.replay()

    runs = sorted(r for r in (gpu_seconds_queued(torch, work) for _ in range(5)) if r is not None)
    gpu_step_s = runs[len(runs) // 2] if runs else None
warm_end = time.perf_counter() + 2.0 * sc.scale  # the spin kernels well before the baseline
while time.perf_counter() < warm_end:
    step()
sync()
for k in own:
    own[k] = 0 if k in ("steps", "items") else 0.0
m0 = mallocs()
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
m1 = mallocs()
n = own["steps"]
gpu_busy = n * gpu_step_s if gpu_step_s is not None else None
other = wall - own["copy_s"] - own["replay_s"] - own["item_s"]


def share(v: float | None) -> float | None:
    return round(v / wall, 4) if v is not None else None


sc.extra["self"] = {**{k: round(v, 4) for k, v in own.items()}, "wall_s": round(wall, 4),
                    "steps_per_s": round(n / wall, 2), "graph": graph is not None,
                    "copy_share": share(own["copy_s"]), "replay_share": share(own["replay_s"]),
                    "item_share": share(own["item_s"]), "other_s": round(other, 4), "other_share": share(other),
                    "host_us_per_step": round((own["copy_s"] + own["replay_s"]) / max(n, 1) * 1e6, 2),
                    "main_run_s": round(run1 - run0, 4), "main_cpu_share": share(run1 - run0),
                    "main_cpu_wait_s": round(wait1 - wait0, 4) if wait0 is not None else None,
                    "main_cpu_wait_share": share(wait1 - wait0) if wait0 is not None else None,
                    "minor_faults_per_s": round((f1 - f0) / wall, 1),
                    "cuda_mallocs_per_s": round((m1 - m0) / wall, 3),
                    "gpu_step_ms": round(gpu_step_s * 1e3, 4) if gpu_step_s is not None else None,
                    "gpu_busy_s": round(gpu_busy, 4) if gpu_busy is not None else None,
                    "gpu_busy_share": share(gpu_busy), "cuda_calls_per_step": None,
                    "cuda_calls_per_step_eager": None, "batch": BATCH, "log_every": LOG_EVERY}
sc.note(f"natural: measured by the script: {n} steps ({n / wall:.1f}/s) in {wall:.2f} s: {own['copy_s']:.3f} s in the "
        f"copies, {own['replay_s']:.3f} s in {'g.replay()' if graph is not None else 'eager steps'}, "
        f"{own['item_s']:.2f} s in {own['items']} .item() calls; "
        + (f"a step's copies and replay take {gpu_step_s * 1e3:.2f} ms of GPU time queued (GPU busy "
           f"{gpu_busy / wall:.0%} of the run)." if gpu_busy is not None else "no GPU timings (no CUDA)."))
sc.write_truth(baseline=(b0, b1), window=None, ratio_spans=((b0, mid), (mid, b1)))
# After the run and its truth: the calls a step makes, replayed and eager (the truth written again with them).
if sc.cuda:
    replayed = calls_per_step(step)
    m2 = copy.deepcopy(model)
    o2 = torch.optim.AdamW(m2.parameters(), lr=1e-4)
    eager_step(m2, o2)
    eager_n = [0]

    def eager() -> None:
        loss = eager_step(m2, o2)
        eager_n[0] += 1
        if eager_n[0] % LOG_EVERY == 0:
            loss.item()

    eager_calls = calls_per_step(eager)
    sc.extra["self"].update(cuda_calls_per_step=replayed, cuda_calls_per_step_eager=eager_calls)
    sc.note(f"CUDA calls a step (torch.profiler, after the run): {replayed} replayed, {eager_calls} eager.")
    sc.write_truth(baseline=(b0, b1), window=None, ratio_spans=((b0, mid), (mid, b1)))
