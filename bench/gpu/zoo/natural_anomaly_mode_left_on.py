"""natural_anomaly_mode_left_on (natural, nothing staged): a Transformer text classifier trained with autograd's anomaly
detection left on: torch.autograd.set_detect_anomaly(True), added while hunting a NaN and never taken out (PyTorch
warns once that it "will increase the runtime and should only be enabled for debugging"). Anomaly mode costs a
training step twice over: in the forward, every autograd node created stores the Python stack that made it
(traceback.extract_stack and format_list under the GIL, on the main thread: pure Python, a few hundred nodes a step);
in the backward, every gradient a node returns is checked for NaN (isnan, then any, read back as a bool: a
synchronisation each) by the thread that runs the backward (PyTorch's autograd thread for CUDA, pt_autograd_0, while
the main thread waits in loss.backward()). The model: token and position embeddings (vocabulary 8192, d 768), a
4-layer nn.TransformerEncoder (12 heads, feed-forward 3072, GELU, pre-norm, dropout 0.1), a final LayerNorm, a mean
pool and a linear head for 20 classes; batches of 64 x 256 tokens from a pool of 8 held on the GPU; bf16 autocast,
fused AdamW, loss.item() each step for the running loss. Without anomaly mode a step is tens of milliseconds of GPU
work against a few of queueing (the job GPU-bound); with it, the host's two costs come first. One process on CPUs 2-3,
no threads of its own (PyTorch's autograd thread is its own), no workers, no children, no IO, no lock, no sleep. 20 s
(smaller with --device cpu: d 64, 1 layer, 8 x 32 tokens; no autograd thread there: the backward runs on the caller).

The script measures itself: the steps per second; the main thread's time in the forward (and the loss), in
loss.backward() (its wait on the autograd thread), in the optimiser step and in loss.item(), each wall and its CPU
clock; before anomaly mode is turned on, the same steps without it (`plain_*`: the steps per second and each part's
time a step), so that what anomaly mode costs the run is known (`anomaly_overhead_s`: the run's wall time beyond its
steps at the plain rate; `forward_extra_s`: the forward's time beyond the plain forward's); the autograd nodes a step
creates and the gradients the backward checks (counted on one step's graph: nodes reachable from the loss, and their
edges to a next node); the synchronisations a step makes with anomaly mode and without it (counted before the run with
torch.cuda.set_sync_debug_mode("warn"); the autograd thread's warnings reach the main thread at the backward's end);
the main thread's and the autograd thread's time on a CPU and waiting for one over the run (their schedstat); the
process's minor page faults and the device allocator's cudaMalloc calls; and a step's GPU time queued without anomaly
mode (common.gpu_seconds_queued: forward, backward, the optimiser), so that the GPU's busy share is known (the NaN
checks' own small kernels are not in it). Truth `autograd` names PyTorch's autograd thread (pid, tid, comm)."""

import os
import resource
import threading
import time
import warnings

from common import Scenario, gpu_seconds_queued

sc = Scenario("natural_anomaly_mode_left_on", "natural", "a Transformer classifier trained with "
              "torch.autograd.set_detect_anomaly(True) left on: a Python stack stored for every autograd node in the "
              "forward, every gradient checked for NaN (a synchronisation each) in the backward, 20 s, nothing staged",
              job_cpus=[2, 3], control=True)
import torch  # noqa: E402

nn = torch.nn
PID, MAIN = os.getpid(), threading.get_native_id()
dev = torch.device(sc.device)
VOCAB, D, HEADS, FF, LAYERS, SEQ, BATCH, NCLASS, POOL = ((8192, 768, 12, 3072, 4, 256, 64, 20, 8) if sc.cuda
                                                         else (1000, 64, 4, 128, 1, 32, 8, 20, 8))


class TextClassifier(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.tok = nn.Embedding(VOCAB, D)
        self.pos = nn.Parameter(torch.randn(SEQ, D) * 0.02)
        layer = nn.TransformerEncoderLayer(D, HEADS, FF, dropout=0.1, activation="gelu", batch_first=True,
                                           norm_first=True)
        self.encoder = nn.TransformerEncoder(layer, LAYERS, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(D)
        self.head = nn.Linear(D, NCLASS)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        h = self.tok(ids) + self.pos
        h = self.encoder(h)
        return self.head(self.norm(h).mean(dim=1))


torch.manual_seed(0)
model = TextClassifier().to(dev)
opt = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.01, fused=sc.cuda or None)
ids_pool = torch.randint(0, VOCAB, (POOL, BATCH, SEQ), device=dev)
labels_pool = torch.randint(0, NCLASS, (POOL, BATCH), device=dev)
KEYS = ("forward_s", "forward_cpu_s", "backward_s", "backward_cpu_s", "opt_s", "item_s")
own = {"steps": 0, **dict.fromkeys(KEYS, 0.0), "running_loss": 0.0}
pos = {"i": 0}


def forward(ids: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    with torch.autocast(sc.device, dtype=torch.bfloat16, enabled=sc.cuda):
        logits = model(ids)
    return nn.functional.cross_entropy(logits.float(), y)


def step() -> None:
    i = pos["i"]
    pos["i"] += 1
    t0, c0 = time.perf_counter(), time.thread_time()
    loss = forward(ids_pool[i % POOL], labels_pool[i % POOL])
    t1, c1 = time.perf_counter(), time.thread_time()
    loss.backward()
    t2, c2 = time.perf_counter(), time.thread_time()
    opt.step()
    opt.zero_grad(set_to_none=True)
    t3 = time.perf_counter()
    own["running_loss"] += loss.item()
    t4 = time.perf_counter()
    own["forward_s"] += t1 - t0
    own["forward_cpu_s"] += c1 - c0
    own["backward_s"] += t2 - t1
    own["backward_cpu_s"] += c2 - c1
    own["opt_s"] += t3 - t2
    own["item_s"] += t4 - t3
    own["steps"] += 1


def sync() -> None:
    if sc.cuda:
        torch.cuda.synchronize()


def reset() -> None:
    for k in own:
        own[k] = 0 if k == "steps" else 0.0


def schedstat(tid: int) -> tuple[float, float] | None:
    try:
        with open(f"/proc/{PID}/task/{tid}/schedstat") as fh:
            run, wait = fh.read().split()[:2]
        return int(run) / 1e9, int(wait) / 1e9
    except (OSError, ValueError):
        return None


def autograd_thread() -> dict | None:
    """PyTorch's autograd thread for the GPU (pt_autograd_0), started at the first backward on CUDA tensors."""
    for tid in sorted(int(t) for t in os.listdir(f"/proc/{PID}/task")):
        try:
            with open(f"/proc/{PID}/task/{tid}/comm") as fh:
                comm = fh.read().strip()
        except OSError:
            continue
        if comm.startswith("pt_autograd"):
            return {"pid": PID, "tid": tid, "comm": comm}
    return None


def mallocs() -> int:
    return int(torch.cuda.memory_stats().get("segment.all.allocated", 0)) if sc.cuda else 0


def graph_size() -> tuple[int, int]:
    """(autograd nodes reachable from one step's loss, their edges to a next node: the gradients the backward
    returns and anomaly mode checks)."""
    loss = forward(ids_pool[0], labels_pool[0])
    seen, todo, edges = set(), [loss.grad_fn], 0
    while todo:
        fn = todo.pop()
        if fn is None or fn in seen:
            continue
        seen.add(fn)
        for nxt, _ in fn.next_functions:
            if nxt is not None:
                edges += 1
                todo.append(nxt)
    del loss
    return len(seen), edges


def syncs_per_step(n: int = 3) -> float | None:
    """The synchronisations n steps make, per step, as CUDA's sync debug mode reports them (then off again)."""
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


def per_step(part: str, steps: int) -> float:
    return own[part] / max(steps, 1)


# Without anomaly mode first: warm-up (kernels chosen, the allocator), a step's GPU time, the plain steps' rate.
for _ in range(10):
    step()
sync()
nodes, checked = graph_size()
plain_syncs = syncs_per_step()
gpu_step_s = None
if sc.cuda:
    def work(_) -> None:
        """One step's GPU work without anomaly mode (forward, backward, the optimiser), nothing read back."""
        forward(ids_pool[0], labels_pool[0]).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    runs = sorted(r for r in (gpu_seconds_queued(torch, work) for _ in range(5)) if r is not None)
    gpu_step_s = runs[len(runs) // 2] if runs else None
for _ in range(5):
    step()
sync()
reset()
tp = time.perf_counter()
plain_end = tp + 3.0 * sc.scale
while time.perf_counter() < plain_end:
    step()
sync()
plain_wall = time.perf_counter() - tp
plain = {k: per_step(k, own["steps"]) for k in KEYS}
plain_steps = own["steps"]

# Anomaly mode on, as the script has it from its NaN hunt, for the rest of the job.
torch.autograd.set_detect_anomaly(True)
anomaly_on = torch.is_anomaly_enabled()
for _ in range(5):
    step()
sync()
anomaly_syncs = syncs_per_step()
warm_end = time.perf_counter() + 2.0 * sc.scale
while time.perf_counter() < warm_end:
    step()
sync()
ag = autograd_thread()
reset()
main0 = schedstat(MAIN)
ag0 = schedstat(ag["tid"]) if ag else None
f0, m0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt, mallocs()
b0 = sc.mark("baseline")
t = time.perf_counter()
sc.run_for(10.0 * sc.scale, step)
mid = sc.mark("half")
sc.run_for(10.0 * sc.scale, step)
sync()
b1 = sc.mark("end")
wall = time.perf_counter() - t
main1 = schedstat(MAIN)
ag1 = schedstat(ag["tid"]) if ag else None
f1, m1 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt, mallocs()
torch.autograd.set_detect_anomaly(False)
n = own["steps"]


def share(v: float | None) -> float | None:
    return round(v / wall, 4) if v is not None else None


def ms(v: float) -> float:
    return round(v * 1e3, 4)


plain_rate = plain_steps / plain_wall if plain_wall > 0 else None
at_plain_rate = n / plain_rate if plain_rate else None
overhead = max(0.0, wall - at_plain_rate) if at_plain_rate is not None else None
fwd_extra = max(0.0, own["forward_s"] - n * plain["forward_s"])
fwd_extra_cpu = max(0.0, own["forward_cpu_s"] - n * plain["forward_cpu_s"])
rest_extra = max(0.0, overhead - fwd_extra) if overhead is not None else None
main_run = round(main1[0] - main0[0], 4) if main0 and main1 else None
main_wait = round(main1[1] - main0[1], 4) if main0 and main1 else None
ag_run = round(ag1[0] - ag0[0], 4) if ag0 and ag1 else None
ag_wait = round(ag1[1] - ag0[1], 4) if ag0 and ag1 else None
ag_asleep = round(max(0.0, wall - ag_run - ag_wait), 4) if ag_run is not None and ag_wait is not None else None
bwd_off = max(0.0, own["backward_s"] - own["backward_cpu_s"])
gpu_busy = n * gpu_step_s if gpu_step_s is not None else None
sc.extra["autograd"] = ag
sc.extra["self"] = {**{k: round(v, 4) for k, v in own.items()}, "wall_s": round(wall, 4),
                    "steps_per_s": round(n / wall, 2), "step_ms_mean": ms(wall / max(n, 1)),
                    "anomaly_enabled": anomaly_on,
                    "forward_share": share(own["forward_s"]), "forward_cpu_share": share(own["forward_cpu_s"]),
                    "backward_share": share(own["backward_s"]), "backward_off_cpu_s": round(bwd_off, 4),
                    "backward_off_cpu_share": share(bwd_off),
                    "opt_share": share(own["opt_s"]), "item_share": share(own["item_s"]),
                    "plain_steps": plain_steps, "plain_wall_s": round(plain_wall, 4),
                    "plain_steps_per_s": round(plain_rate, 2) if plain_rate else None,
                    **{f"plain_{k.removesuffix('_s')}_ms": ms(v) for k, v in plain.items()},
                    "at_plain_rate_s": round(at_plain_rate, 4) if at_plain_rate is not None else None,
                    "anomaly_overhead_s": round(overhead, 4) if overhead is not None else None,
                    "anomaly_overhead_share": share(overhead),
                    "forward_extra_s": round(fwd_extra, 4), "forward_extra_share": share(fwd_extra),
                    "forward_extra_cpu_s": round(fwd_extra_cpu, 4), "forward_extra_cpu_share": share(fwd_extra_cpu),
                    "rest_extra_s": round(rest_extra, 4) if rest_extra is not None else None,
                    "rest_extra_share": share(rest_extra),
                    "graph_nodes": nodes, "checked_gradients": checked,
                    "syncs_per_step_plain": plain_syncs, "syncs_per_step": anomaly_syncs,
                    "main_run_s": main_run, "main_cpu_share": share(main_run),
                    "main_cpu_wait_s": main_wait, "main_cpu_wait_share": share(main_wait),
                    "autograd_run_s": ag_run, "autograd_cpu_share": share(ag_run),
                    "autograd_cpu_wait_s": ag_wait, "autograd_cpu_wait_share": share(ag_wait),
                    "autograd_asleep_s": ag_asleep, "autograd_asleep_share": share(ag_asleep),
                    "minor_faults_per_s": round((f1 - f0) / wall, 1), "cuda_mallocs_per_s": round((m1 - m0) / wall, 3),
                    "gpu_step_ms": ms(gpu_step_s) if gpu_step_s is not None else None,
                    "gpu_busy_s": round(gpu_busy, 4) if gpu_busy is not None else None,
                    "gpu_busy_share": share(gpu_busy), "batch": BATCH, "seq": SEQ, "layers": LAYERS, "d_model": D}
if not sc.cuda:
    sc.note("on the CPU: no autograd thread (the backward runs on the main thread), no synchronisations, no GPU "
            "timings, no allocator counters.")
sc.note(f"natural: measured by the script: anomaly mode {'on' if anomaly_on else 'OFF'}; {n} steps ({n / wall:.1f}/s) "
        f"in {wall:.2f} s: {own['forward_s']:.2f} s in the forward ({own['forward_cpu_s']:.2f} s of CPU), "
        f"{own['backward_s']:.2f} s in backward(), {own['opt_s']:.2f} s in the optimiser, {own['item_s']:.2f} s in "
        f".item(); without anomaly mode {plain_rate and round(plain_rate, 1)} steps/s (anomaly mode cost "
        f"{overhead and round(overhead, 2)} s of the run, {fwd_extra:.2f} s of it in the forward); {nodes} autograd "
        f"nodes and {checked} checked gradients a step; {anomaly_syncs} synchronisations a step ({plain_syncs} "
        f"without); the main thread ran {main_run} s, waited for a CPU {main_wait} s; the autograd thread "
        f"{(ag or {}).get('comm')} ran {ag_run} s; "
        + (f"a step's kernels take {gpu_step_s * 1e3:.2f} ms of GPU time queued (GPU busy {gpu_busy / wall:.0%} of the "
           "run)." if gpu_busy is not None else "no GPU timings (no CUDA)."))
sc.write_truth(baseline=(b0, b1), window=None, ratio_spans=((b0, mid), (mid, b1)))
