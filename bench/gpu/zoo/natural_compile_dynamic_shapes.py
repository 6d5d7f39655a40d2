"""natural_compile_dynamic_shapes (natural, nothing staged): a small text classifier wrapped in torch.compile (default
backend, inductor; dynamic=False, as many people set it to get static-shape kernels) and trained on batches padded to
their longest sample, as a text collate does (rounded up to a multiple of 32, pad_to_multiple_of=32): the sequence
length of a batch takes many distinct values (32 to 384), and each new one makes Dynamo recompile the model (forward
and backward: a new graph, new Triton kernels for the new static shape) until its recompile limit
(torch._dynamo.config.recompile_limit, 8 by default), after which a new shape runs eagerly. The model: token and
position embeddings (vocabulary 8192, width 256), two pre-LayerNorm MLP blocks (256-1024-256, GELU, residual), a masked
mean over the tokens and a linear head (16 classes); batch 32, fp32 without TF32, fused AdamW (not compiled), the
loss read with .item() every 10 steps for the running loss. Sample lengths are log-normal (median ~74 tokens, clipped
to 8-384), so a batch's longest sample, rounded up, lands on one of about ten lengths, most of them seen in the first
seconds. Why these sizes: a recompile of this model costs seconds of CPU (more under tracing), so a small model and
lengths rounded to 32 keep the number of distinct shapes near the recompile limit and the whole run within a minute:
the first compile (one batch, before the measured run), then ~20 s of measured training, shortened where the first
compile was slow so that the job ends within ~50 s of its start (the truth says the length it ran). Batches come from
a pool of 256 made once on the host (pinned where CUDA), copied with .to(non_blocking=True). CPUs 2-3 (the inductor
compile workers, child processes, inherit them). If torch.compile's inductor cannot run here (no Triton, no compiler),
the model is compiled with backend="aot_eager" instead, and the truth says so (`backend`).

The script measures itself: the steps per second; each step's wall time with its batch's length, whether the length was
new and whether a graph was compiled for it (Dynamo's unique_graphs counter); its time in loss.backward() (`backward_s`:
PyTorch's autograd thread runs the backward, and compiles it at a new length's first backward, while the main thread
waits); the time Dynamo spent compiling during the measured run (its compilation_time_metrics, `_compile.compile_inner`:
the forward's compile; the backward's is compiled at its first backward()) and the wall time of the steps whose length
was new (`new_shape_s`, the compiles with their first run) against the others; the recompiles and the new lengths that
ran eagerly past the limit; the main thread's time on a CPU and waiting for one (schedstat); the compile workers' and
other child processes' CPU time over the run (`children_cpu_s`: those alive at the end, truth `compile_workers`, and
those that ended, a compiler run by Triton or inductor); the process's minor page faults and the device allocator's
cudaMalloc calls; and, after the run, each length's step GPU time queued (common.gpu_seconds_queued), summed over the
steps run, so that the GPU's busy share is known."""

import math
import os
import resource
import time

from common import Scenario, gpu_seconds_queued

sc = Scenario("natural_compile_dynamic_shapes", "natural", "a small text model under torch.compile(dynamic=False) "
              "fed batches padded to their longest sample (multiple of 32): each new length recompiles, up to "
              "Dynamo's limit; ~20 s, nothing staged", job_cpus=[2, 3], control=True)
import torch  # noqa: E402
import torch._dynamo  # noqa: E402
import torch._dynamo.utils as dynamo_utils  # noqa: E402

T_BUDGET_S = 50.0  # the whole job within this much of its start (the device's limit is 60 s a job)
VOCAB, WIDTH, HIDDEN, NCLASS, BATCH, MULTIPLE, MAX_LEN, POOL, LOG_EVERY = 8192, 256, 1024, 16, 32, 32, 384, 256, 10
dev = torch.device(sc.device)
if sc.cuda:
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
nn = torch.nn


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(WIDTH)
        self.up, self.down = nn.Linear(WIDTH, HIDDEN), nn.Linear(HIDDEN, WIDTH)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return h + self.down(nn.functional.gelu(self.up(self.norm(h))))


class TextClassifier(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.tok, self.pos = nn.Embedding(VOCAB, WIDTH), nn.Embedding(MAX_LEN, WIDTH)
        self.blocks = nn.Sequential(Block(), Block())
        self.norm, self.head = nn.LayerNorm(WIDTH), nn.Linear(WIDTH, NCLASS)

    def forward(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(ids.shape[1], device=ids.device)
        h = self.norm(self.blocks(self.tok(ids) + self.pos(pos)))
        m = mask.unsqueeze(-1).to(h.dtype)
        return self.head((h * m).sum(1) / m.sum(1).clamp(min=1.0))


torch.manual_seed(0)
model = TextClassifier().to(dev)
opt = torch.optim.AdamW(model.parameters(), lr=3e-4, fused=sc.cuda or None)
loss_fn = nn.CrossEntropyLoss()


def collate(lengths: list[int], gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Pad to the longest sample, rounded up to a multiple of MULTIPLE (a tokenizer's pad_to_multiple_of)."""
    width = min(MAX_LEN, MULTIPLE * math.ceil(max(lengths) / MULTIPLE))
    ids = torch.zeros(len(lengths), width, dtype=torch.long)
    mask = torch.zeros(len(lengths), width, dtype=torch.bool)
    for i, n in enumerate(lengths):
        ids[i, :n] = torch.randint(1, VOCAB, (n,), generator=gen)
        mask[i, :n] = True
    return ids, mask, torch.randint(0, NCLASS, (len(lengths),), generator=gen)


gen = torch.Generator().manual_seed(0)
pool = []
for _ in range(POOL):
    lens = torch.randn(BATCH, generator=gen).mul(0.6).add(4.3).exp().clamp(8, MAX_LEN).int().tolist()
    batch = collate(lens, gen)
    pool.append(tuple(t.pin_memory() for t in batch) if sc.cuda else batch)
backend = "inductor"
compiled = torch.compile(model, dynamic=False)
own = {"steps": 0, "backward_s": 0.0, "new_shape_s": 0.0, "seen_shape_s": 0.0, "new_shape_steps": 0,
       "item_s": 0.0, "running_loss": 0.0}
steps_log: list[tuple[int, float, bool, bool]] = []  # (length, wall s, new length, a graph compiled)
seen: set[int] = set()
pos = {"i": 0}


def graphs() -> int:
    return int(dynamo_utils.counters["stats"]["unique_graphs"])


def compile_s() -> float:
    """Dynamo's own time compiling so far (its compilation_time_metrics; 0 where this torch keeps none)."""
    metrics = getattr(dynamo_utils, "compilation_time_metrics", {})
    return float(sum(metrics.get("_compile.compile_inner", [])))


def train_step(ids: torch.Tensor, mask: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    loss = loss_fn(compiled(ids, mask), y)
    t_b = time.perf_counter()
    loss.backward()  # queued by PyTorch's autograd thread; the main thread waits for it
    own["backward_s"] += time.perf_counter() - t_b
    opt.step()
    opt.zero_grad(set_to_none=True)
    return loss


def step() -> None:
    i = pos["i"]
    pos["i"] += 1
    ids, mask, y = (t.to(dev, non_blocking=True) for t in pool[i % POOL])
    length = ids.shape[1]
    new = length not in seen
    seen.add(length)
    g0 = graphs()
    t0 = time.perf_counter()
    loss = train_step(ids, mask, y)
    t1 = time.perf_counter()
    own["steps"] += 1
    if new:
        own["new_shape_s"] += t1 - t0
        own["new_shape_steps"] += 1
    else:
        own["seen_shape_s"] += t1 - t0
    steps_log.append((length, t1 - t0, new, graphs() > g0))
    if own["steps"] % LOG_EVERY == 0:
        own["running_loss"] += loss.item()
        own["item_s"] += time.perf_counter() - t1


def sync() -> None:
    if sc.cuda:
        torch.cuda.synchronize()


def schedstat(path: str = "/proc/thread-self/schedstat") -> tuple[float, float | None]:
    """A thread's time on a CPU and waiting on a run queue (s), from the kernel's schedstat; where that is not kept,
    the calling thread's CPU clock and None."""
    try:
        with open(path) as fh:
            run_ns, wait_ns = fh.read().split()[:2]
        return int(run_ns) / 1e9, int(wait_ns) / 1e9
    except (OSError, ValueError):
        return time.thread_time(), None


def descendants(pid: int) -> list[int]:
    """The process's child processes and theirs (the inductor compile workers)."""
    out: list[int] = []
    try:
        kids = [int(c) for t in os.listdir(f"/proc/{pid}/task")
                for c in open(f"/proc/{pid}/task/{t}/children").read().split()]
    except OSError:
        return out
    for k in kids:
        out += [k] + descendants(k)
    return out


def cpu_s(pid: int) -> float:
    """A process's CPU time so far (utime + stime), 0 where it is gone."""
    try:
        fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return 0.0


def mallocs() -> int:
    return int(torch.cuda.memory_stats().get("segment.all.allocated", 0)) if sc.cuda else 0


# The first compile: the first batch, before the measured run (inductor, or aot_eager where inductor cannot run).
t_first = time.perf_counter()
try:
    step()
except Exception as exc:  # noqa: BLE001 - no Triton or no C++ compiler here: the documented fallback backend
    sc.note(f"inductor failed ({type(exc).__name__}: {str(exc)[:200]}); compiled with backend='aot_eager' instead.")
    torch._dynamo.reset()
    backend = "aot_eager"
    compiled = torch.compile(model, dynamic=False, backend=backend)
    seen.clear()
    step()
sync()
first_compile_s = time.perf_counter() - t_first
for k in own:
    own[k] = 0 if k in ("steps", "new_shape_steps") else 0.0
steps_log.clear()
elapsed = (time.time_ns() - sc.t_start) / 1e9
run_s = max(4.0, min(20.0, T_BUDGET_S - elapsed - 12.0)) * sc.scale  # room for a compile past each half
if run_s < 20.0 * sc.scale:
    sc.note(f"the first compile ended {elapsed:.1f} s after the start: the measured run shortened to {run_s:.1f} s.")
workers = descendants(os.getpid())
w_cpu0 = {w: cpu_s(w) for w in workers}
kids0 = resource.getrusage(resource.RUSAGE_CHILDREN)
g0, c0, m0 = graphs(), compile_s(), mallocs()
f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
run0, wait0 = schedstat()
b0 = sc.mark("baseline")
t = time.perf_counter()
sc.run_for(run_s / 2, step)
mid = sc.mark("half")
sc.run_for(run_s / 2, step)
sync()
b1 = sc.mark("end")
wall = time.perf_counter() - t
run1, wait1 = schedstat()
f1 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
g1, c1, m1 = graphs(), compile_s(), mallocs()
workers = sorted(set(workers) | set(descendants(os.getpid())))
kids1 = resource.getrusage(resource.RUSAGE_CHILDREN)
reaped_cpu = (kids1.ru_utime + kids1.ru_stime) - (kids0.ru_utime + kids0.ru_stime)  # children that ended (a compiler)
workers_cpu = sum(cpu_s(w) - w_cpu0.get(w, 0.0) for w in workers) + reaped_cpu
ran = dict(own)  # the run's measures: the GPU timings below run steps too
n = ran["steps"]
new_lengths = [ln for ln, _, new, _ in steps_log if new]
fell_back = [ln for ln, _, new, made in steps_log if new and not made]
seen_times = sorted(s for _, s, new, _ in steps_log if not new)
median_seen = seen_times[len(seen_times) // 2] if seen_times else None
# After the run: each length's step GPU time queued (its compiled graph, or eager past the limit), over the steps run.
gpu_by_len: dict[int, float] = {}
if sc.cuda:
    for length in sorted({ln for ln, *_ in steps_log}):
        j = next(k for k in range(POOL) if pool[k][0].shape[1] == length)
        ids, mask, y = (x.to(dev) for x in pool[j])
        runs = sorted(r for r in (gpu_seconds_queued(torch, lambda _: train_step(ids, mask, y)) for _ in range(3))
                      if r is not None)
        if runs:
            gpu_by_len[length] = runs[len(runs) // 2]
gpu_busy = (sum(gpu_by_len[ln] for ln, *_ in steps_log) if sc.cuda and all(ln in gpu_by_len for ln, *_ in steps_log)
            else None)


def share(v: float | None) -> float | None:
    return round(v / wall, 4) if v is not None else None


limit = getattr(torch._dynamo.config, "recompile_limit", None) or getattr(torch._dynamo.config, "cache_size_limit")
sc.extra["compile_workers"] = [{"pid": w, "cpu_s": round(cpu_s(w) - w_cpu0.get(w, 0.0), 4)} for w in workers]
sc.extra["self"] = {**{k: round(v, 4) for k, v in ran.items()}, "wall_s": round(wall, 4), "run_s_planned": run_s,
                    "steps_per_s": round(n / wall, 2), "backend": backend, "dynamic": False,
                    "first_compile_s": round(first_compile_s, 3), "recompiles": g1 - g0,
                    "graphs_total": g1, "recompile_limit": limit, "compile_s": round(c1 - c0, 4),
                    "compile_share": share(c1 - c0), "new_shape_share": share(ran["new_shape_s"]),
                    "seen_shape_share": share(ran["seen_shape_s"]), "item_share": share(ran["item_s"]),
                    "new_lengths": new_lengths, "new_lengths_eager": fell_back,
                    "lengths_seen": sorted(seen), "seen_step_ms_median":
                        round(median_seen * 1e3, 4) if median_seen is not None else None,
                    "main_run_s": round(run1 - run0, 4), "main_cpu_share": share(run1 - run0),
                    "main_cpu_wait_s": round(wait1 - wait0, 4) if wait0 is not None else None,
                    "main_cpu_wait_share": share(wait1 - wait0) if wait0 is not None else None,
                    "children_cpu_s": round(workers_cpu, 4), "children_cpu_share": share(workers_cpu),
                    "children_reaped_cpu_s": round(reaped_cpu, 4),
                    "minor_faults_per_s": round((f1 - f0) / wall, 1),
                    "cuda_mallocs_per_s": round((m1 - m0) / wall, 3),
                    "gpu_step_ms_by_length": {str(k): round(v * 1e3, 4) for k, v in gpu_by_len.items()},
                    "gpu_busy_s": round(gpu_busy, 4) if gpu_busy is not None else None,
                    "gpu_busy_share": share(gpu_busy), "batch": BATCH, "pad_multiple": MULTIPLE}
sc.note(f"natural: measured by the script: backend {backend}, first compile {first_compile_s:.1f} s before the run; "
        f"{n} steps ({n / wall:.1f}/s) in {wall:.2f} s; {g1 - g0} graphs compiled in the run ({c1 - c0:.2f} s in "
        f"Dynamo's compile), {len(new_lengths)} new lengths ({ran['new_shape_s']:.2f} s in their steps, "
        f"{len(fell_back)} run eagerly past the limit of {limit}); its child processes ran {workers_cpu:.2f} s; "
        + (f"GPU busy {gpu_busy / wall:.0%} of the run (each length's step queued)." if gpu_busy is not None
           else "no GPU timings (no CUDA)."))
sc.write_truth(baseline=(b0, b1), window=None, ratio_spans=((b0, mid), (mid, b1)))
