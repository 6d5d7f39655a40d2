"""natural_profiler_left_on (natural, nothing staged): an engineer's profiling left on in a long training run: the
training loop runs inside torch.profiler.profile(activities=[CPU, CUDA], schedule=schedule(wait=5, warmup=1, active=3,
repeat=0), record_shapes=True, on_trace_ready=tensorboard_trace_handler(folder)), prof.step() called every iteration,
so that every 9 steps the profiler records 3 and then, inside that prof.step(), stops, collects the events and writes a
chrome trace (a .pt.trace.json file) to a local folder under /var/tmp (removed at the end). If CUDA activities cannot
be profiled on the host (not in torch.profiler.supported_activities(), or a short profile before the run records no
GPU event), the profiler runs with the CPU activity only and the truth says so (`self.cuda_activity`, notes). The
model: a GPT-style LM (token and position embeddings, vocabulary 8,192, d 512, context 256, 4 pre-norm
nn.TransformerEncoderLayer blocks, 8 heads, a tied head) on batches of 32 x 256 tokens from a random corpus held on the
GPU, bf16 autocast, fused AdamW, loss.item() each step. CPUs 2-3, 20 s (smaller with --device cpu).

The script measures itself: the steps per second; per step, its time queueing the training step, in loss.item() and
in prof.step() (wall and the main thread's CPU clock), the training's steps per second in profiled steps (active: the
schedule's RECORD and RECORD_AND_SAVE) and in the others (wait and warmup); the time in on_trace_ready (the trace
written; wall and CPU clock; truth `saves_ns`: the prof.step() calls that ran it) as a share of the run; the number and
total size of the trace files written in the run and the bytes the process sent to storage (/proc/self/io); every
thread's time on a CPU and waiting for one over the run (schedstat; truth `threads`), the main thread's among them; the
process's minor page faults; the device allocator's cudaMalloc calls; and a step's GPU time queued before the profiler
starts (common.gpu_seconds_queued), so that the GPU's busy share (its kernels) is known."""

import os
import resource
import shutil
import tempfile
import time

from common import Scenario, comm_of, gpu_seconds_queued, tids_of

sc = Scenario("natural_profiler_left_on", "natural", "a GPT-style LM trained under torch.profiler.profile (CPU and "
              "CUDA activities, schedule wait 5 warmup 1 active 3 repeating, record_shapes, a chrome trace written "
              "by tensorboard_trace_handler every 9 steps), loss.item() each step, 20 s, nothing staged",
              job_cpus=[2, 3], control=True)
import torch  # noqa: E402
from torch.profiler import ProfilerActivity, profile, schedule, tensorboard_trace_handler  # noqa: E402

PID = os.getpid()
MAIN = sc.feeder["tid"]
dev = torch.device(sc.device)
VOCAB, D, LAYERS, HEADS, CTX, BATCH = (8192, 512, 4, 8, 256, 32) if sc.cuda else (1000, 64, 2, 4, 64, 4)
WAIT, WARMUP, ACTIVE = 5, 1, 3
SCHED = schedule(wait=WAIT, warmup=WARMUP, active=ACTIVE, repeat=0)
ROOT = "/var/tmp" if os.access("/var/tmp", os.W_OK) else None
TRACE_DIR = tempfile.mkdtemp(prefix="zoo_prof_", dir=ROOT)
nn = torch.nn
if sc.cuda:
    torch.backends.cuda.matmul.allow_tf32 = True


class GPT(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.tok = nn.Embedding(VOCAB, D)
        self.pos = nn.Embedding(CTX, D)
        layer = nn.TransformerEncoderLayer(D, HEADS, 4 * D, dropout=0.0, activation="gelu", batch_first=True,
                                           norm_first=True)
        self.blocks = nn.TransformerEncoder(layer, LAYERS, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(D)
        self.head = nn.Linear(D, VOCAB, bias=False)
        self.head.weight = self.tok.weight  # tied
        self.register_buffer("mask", nn.Transformer.generate_square_subsequent_mask(CTX), persistent=False)
        nn.init.normal_(self.tok.weight, std=0.02)
        nn.init.normal_(self.pos.weight, std=0.02)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        t = idx.shape[1]
        h = self.tok(idx) + self.pos(torch.arange(t, device=idx.device))
        h = self.blocks(h, mask=self.mask[:t, :t], is_causal=True)
        return self.head(self.norm(h))


torch.manual_seed(0)
model = GPT().to(dev)
opt = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.1, fused=sc.cuda or None)
corpus = torch.randint(0, VOCAB, (64, BATCH, CTX + 1), device=dev)
running = {"loss": 0.0, "i": 0}


def train(i: int) -> torch.Tensor:
    seq = corpus[i % len(corpus)]
    x, y = seq[:, :-1], seq[:, 1:]
    with torch.autocast(sc.device, dtype=torch.bfloat16, enabled=sc.cuda):
        logits = model(x)
    loss = nn.functional.cross_entropy(logits.float().view(-1, VOCAB), y.reshape(-1))
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    return loss


def sync() -> None:
    if sc.cuda:
        torch.cuda.synchronize()


def schedstat(tid: int) -> tuple[int, int] | None:
    try:
        with open(f"/proc/{PID}/task/{tid}/schedstat") as fh:
            run, wait = fh.read().split()[:2]
        return int(run), int(wait)
    except (OSError, ValueError):
        return None


def write_bytes() -> int | None:
    try:
        with open("/proc/self/io") as fh:
            return {k: int(v) for k, v in (line.split(":") for line in fh)}["write_bytes"]
    except (OSError, ValueError, KeyError):
        return None


def mallocs() -> int:
    return int(torch.cuda.memory_stats().get("segment.all.allocated", 0)) if sc.cuda else 0


def traces() -> dict[str, int]:
    out = {}
    for name in os.listdir(TRACE_DIR):
        try:
            out[name] = os.path.getsize(os.path.join(TRACE_DIR, name))
        except OSError:
            pass
    return out


def cuda_activity() -> tuple[bool, str]:
    """Whether CUDA activities can be profiled here: listed as supported, and a short profile records GPU events."""
    if not sc.cuda:
        return False, "no CUDA"
    if ProfilerActivity.CUDA not in torch.profiler.supported_activities():
        return False, "ProfilerActivity.CUDA not in torch.profiler.supported_activities()"
    try:
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as p:
            train(0)
            sync()
        gpu = sum(1 for e in p.events() if e.device_type == torch.autograd.DeviceType.CUDA)
    except Exception as e:  # noqa: BLE001 - any failure means: not here
        return False, f"a short profile with CUDA activities failed: {type(e).__name__}: {e}"
    return (gpu > 0), f"a short profile with CUDA activities recorded {gpu} GPU events"


# ---- set-up: warm the model, the GPU's busy time per step (no profiler yet), whether CUDA activities work ----------
for _ in range(5):
    train(0).item()
sync()
gpu_step_s = None
if sc.cuda:
    runs = sorted(r for r in (gpu_seconds_queued(torch, lambda _: train(0)) for _ in range(5)) if r is not None)
    gpu_step_s = runs[len(runs) // 2] if runs else None
CUDA_ACT, why = cuda_activity()
activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if CUDA_ACT else [])
if sc.cuda and not CUDA_ACT:
    sc.note(f"CUDA activities not profiled ({why}): the profiler runs with the CPU activity only.")
elif not sc.cuda:
    sc.note("no CUDA: the profiler runs with the CPU activity only; a tiny model.")
sync()

own = {"steps": 0, "train_s": 0.0, "issue_s": 0.0, "item_s": 0.0, "prof_s": 0.0, "prof_cpu_s": 0.0, "save_s": 0.0,
       "save_cpu_s": 0.0, "active_steps": 0, "active_train_s": 0.0, "other_steps": 0, "other_train_s": 0.0, "saves": 0}
saves_ns: list[list[int]] = []
measuring = [False]
write_trace = tensorboard_trace_handler(TRACE_DIR)


def on_trace_ready(p) -> None:
    """The trace handler, timed (the timing is the script's; the writing is tensorboard_trace_handler's)."""
    t0, c0 = time.perf_counter(), time.thread_time()
    write_trace(p)
    if measuring[0]:
        own["save_s"] += time.perf_counter() - t0
        own["save_cpu_s"] += time.thread_time() - c0
        own["saves"] += 1


prof = profile(activities=activities, schedule=SCHED, record_shapes=True, on_trace_ready=on_trace_ready)


def step() -> None:
    active = SCHED(prof.step_num).name.startswith("RECORD")  # the schedule's action for this step
    i = running["i"]
    running["i"] += 1
    t0 = time.perf_counter()
    loss = train(i)
    ta = time.perf_counter()
    running["loss"] += loss.item()
    t1, c1 = time.perf_counter(), time.thread_time()
    saves = own["saves"]
    s0 = time.time_ns()
    prof.step()
    t2, c2 = time.perf_counter(), time.thread_time()
    if own["saves"] != saves:
        saves_ns.append([s0, time.time_ns()])
    own["steps"] += 1
    own["train_s"] += t1 - t0
    own["issue_s"] += ta - t0
    own["item_s"] += t1 - ta
    own["prof_s"] += t2 - t1
    own["prof_cpu_s"] += c2 - c1
    kind = "active" if active else "other"
    own[f"{kind}_steps"] += 1
    own[f"{kind}_train_s"] += t1 - t0


try:
    prof.start()
    for _ in range(2 * (WAIT + WARMUP + ACTIVE)):  # two cycles: the profiler's first start and first trace
        step()
    warm_end = time.perf_counter() + 2.0 * sc.scale
    while time.perf_counter() < warm_end:
        step()
    sync()
    own.update({k: 0 if isinstance(v, int) else 0.0 for k, v in own.items()})
    measuring[0] = True
    files0 = traces()
    stats0 = {t: schedstat(t) for t in tids_of(PID)}
    flt0, io0, m0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt, write_bytes(), mallocs()
    b0 = sc.mark("baseline")
    t = time.perf_counter()
    sc.run_for(10.0 * sc.scale, step)
    mid = sc.mark("half")
    sc.run_for(10.0 * sc.scale, step)
    b1 = sc.mark("end")
    wall = time.perf_counter() - t
    measuring[0] = False
    stats1 = {t: schedstat(t) for t in tids_of(PID)}
    flt1, io1, m1 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt, write_bytes(), mallocs()
    files1 = traces()
    names = {t: comm_of(PID, t) for t in stats1}
    prof.stop()
finally:
    shutil.rmtree(TRACE_DIR, ignore_errors=True)

n = own["steps"]
new_files = {k: v for k, v in files1.items() if k not in files0}


def share(v: float | None) -> float | None:
    return round(v / wall, 4) if v is not None else None


def delta(tid: int, k: int) -> float:
    a, z = stats0.get(tid) or (0, 0), stats1[tid]
    return (z[k] - a[k]) / 1e9


threads = [{"tid": tid, "comm": names.get(tid), "run_s": round(delta(tid, 0), 4), "cpu_wait_s": round(delta(tid, 1), 4)}
           for tid in sorted(stats1) if stats1[tid]]
main_t = next((x for x in threads if x["tid"] == MAIN), None)
gpu_busy = n * gpu_step_s if gpu_step_s is not None else None
active_rate = own["active_steps"] / own["active_train_s"] if own["active_train_s"] else None
other_rate = own["other_steps"] / own["other_train_s"] if own["other_train_s"] else None
save_off_cpu = max(0.0, own["save_s"] - own["save_cpu_s"])
sc.extra["saves_ns"] = saves_ns
sc.extra["threads"] = threads
sc.extra["trace_dir"] = TRACE_DIR
sc.extra["self"] = {**{k: (round(v, 4) if isinstance(v, float) else v) for k, v in own.items()},
                    "wall_s": round(wall, 4), "steps_per_s": round(n / wall, 2),
                    "train_share": share(own["train_s"]), "issue_share": share(own["issue_s"]),
                    "item_share": share(own["item_s"]), "prof_share": share(own["prof_s"]),
                    "prof_cpu_share": share(own["prof_cpu_s"]), "save_share": share(own["save_s"]),
                    "save_cpu_share": share(own["save_cpu_s"]), "save_off_cpu_s": round(save_off_cpu, 4),
                    "stop_s": round(own["prof_s"] - own["save_s"], 4),
                    "active_steps_per_s": round(active_rate, 2) if active_rate else None,
                    "other_steps_per_s": round(other_rate, 2) if other_rate else None,
                    "trace_files": len(new_files), "trace_bytes": sum(new_files.values()),
                    "trace_mb_mean": round(sum(new_files.values()) / max(len(new_files), 1) / 1e6, 3),
                    "write_bytes": (io1 - io0) if io0 is not None and io1 is not None else None,
                    "main_run_s": main_t["run_s"] if main_t else None,
                    "main_cpu_share": share(main_t["run_s"]) if main_t else None,
                    "main_cpu_wait_s": main_t["cpu_wait_s"] if main_t else None,
                    "main_cpu_wait_share": share(main_t["cpu_wait_s"]) if main_t else None,
                    "minor_faults_per_s": round((flt1 - flt0) / wall, 1),
                    "cuda_mallocs_per_s": round((m1 - m0) / wall, 3),
                    "cuda_activity": CUDA_ACT, "cuda_activity_why": why,
                    "schedule": {"wait": WAIT, "warmup": WARMUP, "active": ACTIVE, "repeat": 0},
                    "gpu_step_ms": round(gpu_step_s * 1e3, 4) if gpu_step_s is not None else None,
                    "gpu_busy_s": round(gpu_busy, 4) if gpu_busy is not None else None,
                    "gpu_busy_share": share(gpu_busy), "batch": BATCH, "context": CTX,
                    "mean_loss": round(running["loss"] / max(running["i"], 1), 4)}
sc.note(f"natural: measured by the script: {n} steps ({n / wall:.1f}/s) in {wall:.2f} s: {own['train_s']:.2f} s "
        f"training ({own['active_steps']} profiled steps at {active_rate or 0:.1f}/s, {own['other_steps']} others at "
        f"{other_rate or 0:.1f}/s), {own['prof_s']:.2f} s in prof.step() ({own['prof_cpu_s']:.2f} s of CPU), of which "
        f"{own['save_s']:.2f} s in on_trace_ready ({own['saves']} traces written, {len(new_files)} files, "
        f"{sum(new_files.values()) / 1e6:.1f} MB); activities {[a.name for a in activities]}; "
        + (f"a step's kernels take {gpu_step_s * 1e3:.2f} ms of GPU time queued without the profiler (GPU busy "
           f"{gpu_busy / wall:.0%} of the run)." if gpu_busy is not None else "no GPU timings (no CUDA)."))
sc.write_truth(baseline=(b0, b1), window=None, ratio_spans=((b0, mid), (mid, b1)))
