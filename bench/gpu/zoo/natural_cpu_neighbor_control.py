"""natural_cpu_neighbor_control (natural, nothing staged; a control): a healthy, GPU-bound language-model training job
beside another team's CPU-heavy process on other CPUs of the host. The job: a GPT-style decoder (vocabulary 32,768, d
1024, 8 pre-norm nn.TransformerEncoderLayer blocks of 16 heads and feed-forward 4096 with a causal mask, a final
LayerNorm and a head tied to the token embedding: ~134 M parameters) on batches of 16 x 1024 tokens drawn from a random
corpus held on the GPU, bf16 autocast, fused AdamW, loss.item() each step for the running loss, on CPUs 2-3: tens of
milliseconds of GPU work a step against a few of queueing, so the GPU is busy nearly all along. The neighbour: a
process `pack_logs` (another team's log packer) started before the job's measured run on CPUs 6-7 (common.spawn_python:
its own Python, pinned there, named before its code runs; started by the script to stand for the other team's, so a
child of the job's process, as the zoo's neighbours are): two threads that each build 4 MB chunks of log-like text (a
random pick of lines from a vocabulary, with numbers) and compress them with zlib (level 6) and hash them with
hashlib.sha256, flat out, the whole run (zlib and hashlib release the GIL on large buffers, so both CPUs are busy). It
shares nothing with the job: no file, no pipe, no GPU, no CPU. It stops itself when the job's process is gone or after
a deadline. 4 s of the job alone first (the neighbour not started), then 20 s beside it (smaller with --device cpu:
d 64, 2 blocks, context 64, vocabulary 1000, batch 4; where the machine has too few CPUs the neighbour's CPUs are
folded onto the job's, and the truth says so).

The script measures itself: the steps per second alone and beside the neighbour; the main thread's time queueing the
steps and in loss.item(); its time on a CPU, waiting for one (/proc/thread-self/schedstat) and asleep (the rest) over
the run; every thread's CPU time and run-queue wait (truth `threads`); the process's minor page faults; the device
allocator's cudaMalloc calls; a step's GPU time queued (common.gpu_seconds_queued: forward, backward, the optimiser),
so that the GPU's busy share (its kernels, over the run to the GPU's end of its last step) is known; and the
neighbour's CPU time and run-queue wait over the run (its tasks' schedstat) and the chunks it compressed (its own count,
read from a file it rewrites). Truth `neighbor` names the neighbour (pid, tids, comm, CPUs, span); it is no culprit:
nothing slows the job."""

import os
import resource
import shutil
import sys
import tempfile
import threading
import time

from common import Scenario, comm_of, gpu_seconds_queued, map_cpus, spawn_python, stop, tids_of

sc = Scenario("natural_cpu_neighbor_control", "natural", "a GPU-bound GPT-style LM (~134 M parameters, bf16, "
              "loss.item() each step) on CPUs 2-3 beside another team's process compressing and hashing logs flat out "
              "on CPUs 6-7, 20 s, nothing staged: a control", job_cpus=[2, 3], control=True)
import torch  # noqa: E402

PID, MAIN = os.getpid(), threading.get_native_id()
dev = torch.device(sc.device)
VOCAB, D, LAYERS, HEADS, CTX, BATCH = (32768, 1024, 8, 16, 1024, 16) if sc.cuda else (1000, 64, 2, 4, 64, 4)
NEIGHBOR_CPUS = [c for c in map_cpus([6, 7]) if c not in sc.job_cpus] or map_cpus([6, 7])
if set(NEIGHBOR_CPUS) & set(sc.job_cpus):
    sc.note(f"this machine has too few CPUs to keep the neighbour off the job's CPUs: they share {NEIGHBOR_CPUS}.")
COUNT = os.path.join(tempfile.mkdtemp(prefix="zoo_neighbor_"), "chunks")
NEIGHBOR = f"""
import hashlib, os, random, threading, time, zlib
JOB, DEADLINE, COUNT = {PID}, time.monotonic() + 120, {COUNT!r}
WORDS = ["GET", "POST", "/api/v1/items", "/api/v1/users", "/health", "200", "201", "404", "500", "ms", "user",
         "session", "cache", "miss", "hit", "db", "query", "INFO", "WARN", "ERROR", "worker", "request", "latency"]
done = [0, 0]


def alive():
    try:
        os.kill(JOB, 0)
    except OSError:
        return False
    return time.monotonic() < DEADLINE


def pack(k):
    rng = random.Random(k)
    lines = [" ".join(rng.choice(WORDS) + str(rng.randrange(10000)) for _ in range(12)) for _ in range(4096)]
    while alive():
        chunk = "\\n".join(rng.choice(lines) for _ in range(40000)).encode()
        digest = hashlib.sha256(zlib.compress(chunk, 6)).hexdigest()
        done[k] += 1
    return digest


threads = [threading.Thread(target=pack, args=(k,)) for k in range(2)]
for t in threads:
    t.start()
while alive():
    time.sleep(0.5)
    with open(COUNT + ".tmp", "w") as fh:
        fh.write(str(sum(done)))
    os.replace(COUNT + ".tmp", COUNT)
for t in threads:
    t.join()
"""
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
corpus = torch.randint(0, VOCAB, (32, BATCH, CTX + 1), device=dev)
NPARAM = sum(p.numel() for p in model.parameters())
own = {"steps": 0, "issue_s": 0.0, "item_s": 0.0, "running_loss": 0.0}
state = {"i": 0}


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


def step() -> None:
    i = state["i"]
    state["i"] += 1
    t0 = time.perf_counter()
    loss = train(i)
    t1 = time.perf_counter()
    own["running_loss"] += loss.item()
    t2 = time.perf_counter()
    own["issue_s"] += t1 - t0
    own["item_s"] += t2 - t1
    own["steps"] += 1
    if own["steps"] % 200 == 0:
        print(f"step {state['i']}: loss {own['running_loss'] / own['steps']:.4f}", flush=True)


def schedstat(pid: int, tid: int) -> tuple[int, int] | None:
    try:
        with open(f"/proc/{pid}/task/{tid}/schedstat") as fh:
            run, wait = fh.read().split()[:2]
        return int(run), int(wait)
    except (OSError, ValueError):
        return None


def process_schedstat(pid: int) -> dict[int, tuple[int, int]]:
    return {t: s for t in tids_of(pid) if (s := schedstat(pid, t))}


def delta_s(a: dict, b: dict, k: int) -> float:
    """The CPU time (k=0) or run-queue wait (k=1) of the tasks in `b` since `a` (s)."""
    return round(sum(v[k] - (a.get(t) or (0, 0))[k] for t, v in b.items()) / 1e9, 4)


def chunks() -> int | None:
    try:
        with open(COUNT) as fh:
            return int(fh.read())
    except (OSError, ValueError):
        return None


def mallocs() -> int:
    return int(torch.cuda.memory_stats().get("segment.all.allocated", 0)) if sc.cuda else 0


def sync() -> None:
    if sc.cuda:
        torch.cuda.synchronize()


def gpu_work(_) -> None:
    """A step's GPU work, nothing read back."""
    train(0)


for _ in range(10):  # warm-up: the allocator, cuBLAS and the attention kernels chosen, the autograd thread started
    step()
sync()
gpu_step_s = None
if sc.cuda:
    runs = sorted(r for r in (gpu_seconds_queued(torch, gpu_work) for _ in range(5)) if r is not None)
    gpu_step_s = runs[len(runs) // 2] if runs else None
warm_end = time.perf_counter() + 1.0 * sc.scale  # the spin kernels well before the job's steps are timed alone
while time.perf_counter() < warm_end:
    step()
sync()
# the job alone
n0 = own["steps"]
sc.mark("alone")
t = time.perf_counter()
sc.run_for(4.0 * sc.scale, step)
sync()
alone_wall = time.perf_counter() - t
alone_rate = (own["steps"] - n0) / alone_wall
neighbor = spawn_python(NEIGHBOR, "pack_logs", NEIGHBOR_CPUS)
try:
    started = sc.mark("neighbor")
    settle_end = time.perf_counter() + 1.0 * sc.scale  # the neighbour's threads up and busy
    while time.perf_counter() < settle_end:
        step()
    sync()
    for k in own:
        own[k] = 0 if k == "steps" else 0.0
    n_tids = tids_of(neighbor.pid)
    job0, nb0 = process_schedstat(PID), process_schedstat(neighbor.pid)
    f0, m0, c0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt, mallocs(), chunks()
    b0 = sc.mark("baseline")
    t = time.perf_counter()
    sc.run_for(10.0 * sc.scale, step)
    mid = sc.mark("half")
    sc.run_for(10.0 * sc.scale, step)
    sync()
    b1 = sc.mark("end")
    wall = time.perf_counter() - t
    job1, nb1 = process_schedstat(PID), process_schedstat(neighbor.pid)
    f1, m1, c1 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt, mallocs(), chunks()
    n_alive = neighbor.poll() is None
    n_tids = sorted(set(n_tids) | set(nb1))
finally:
    stop([neighbor])
    shutil.rmtree(os.path.dirname(COUNT), ignore_errors=True)
n = own["steps"]
names = {t: comm_of(PID, t) for t in job1}
main_run = delta_s(job0, {MAIN: job1[MAIN]}, 0) if MAIN in job1 else None
main_wait = delta_s(job0, {MAIN: job1[MAIN]}, 1) if MAIN in job1 else None
others = {t: v for t, v in job1.items() if t != MAIN}
main_asleep = max(0.0, wall - main_run - main_wait) if main_run is not None else None
gpu_busy = n * gpu_step_s if gpu_step_s is not None else None
nb_run, nb_wait = delta_s(nb0, nb1, 0), delta_s(nb0, nb1, 1)


def share(v: float | None) -> float | None:
    return round(v / wall, 4) if v is not None else None


sc.extra["neighbor"] = {"pid": neighbor.pid, "tids": n_tids or [neighbor.pid], "comm": "pack_logs",
                        "cpus": [6, 7], "cpus_used_here": NEIGHBOR_CPUS, "span_ns": [started, b1],
                        "alive_at_end": n_alive}
sc.extra["threads"] = [{"tid": t, "comm": names[t]} for t in sorted(names)]
sc.extra["self"] = {**{k: round(v, 4) for k, v in own.items()}, "wall_s": round(wall, 4),
                    "steps_per_s": round(n / wall, 2), "steps_per_s_alone": round(alone_rate, 2),
                    "with_over_alone": round(n / wall / alone_rate, 4) if alone_rate else None,
                    "step_ms_mean": round(wall / max(n, 1) * 1e3, 4),
                    "issue_share": share(own["issue_s"]), "item_share": share(own["item_s"]),
                    "main_run_s": main_run, "main_cpu_share": share(main_run),
                    "main_cpu_wait_s": main_wait, "main_cpu_wait_share": share(main_wait),
                    "main_asleep_s": round(main_asleep, 4) if main_asleep is not None else None,
                    "main_asleep_share": share(main_asleep),
                    "other_threads_run_s": delta_s(job0, others, 0),
                    "other_threads_cpu_wait_s": delta_s(job0, others, 1),
                    "minor_faults_per_s": round((f1 - f0) / wall, 1), "cuda_mallocs_per_s": round((m1 - m0) / wall, 3),
                    "gpu_step_ms": round(gpu_step_s * 1e3, 4) if gpu_step_s is not None else None,
                    "gpu_busy_s": round(gpu_busy, 4) if gpu_busy is not None else None,
                    "gpu_busy_share": share(gpu_busy),
                    "neighbor_run_s": nb_run, "neighbor_cpu_share": share(nb_run),
                    "neighbor_cpu_wait_s": nb_wait,
                    "neighbor_chunks": (c1 - c0) if c0 is not None and c1 is not None else None,
                    "neighbor_cpus": len(NEIGHBOR_CPUS),
                    "neighbor_shares_job_cpus": bool(set(NEIGHBOR_CPUS) & set(sc.job_cpus)),
                    "params_m": round(NPARAM / 1e6, 2), "batch": BATCH, "context": CTX,
                    "mean_loss": round(own["running_loss"] / max(n, 1), 4), "python": sys.version.split()[0]}
if not sc.cuda:
    sc.note("a tiny model on the CPU: no GPU timings, no allocator counters.")
sc.note(f"natural, a control: measured by the script: alone {alone_rate:.2f} steps/s; beside pack_logs (pid "
        f"{neighbor.pid}, CPUs {NEIGHBOR_CPUS}, {nb_run:.2f} s of CPU in the run) {n} steps ({n / wall:.2f}/s) in "
        f"{wall:.2f} s: {own['issue_s']:.2f} s queueing the steps, {own['item_s']:.2f} s in .item(); the main thread "
        f"ran {main_run} s, waited for a CPU {main_wait} s; "
        + (f"a step's kernels take {gpu_step_s * 1e3:.2f} ms of GPU time queued (GPU busy {gpu_busy / wall:.0%} of the "
           "run)." if gpu_busy is not None else "no GPU timings (no CUDA)."))
sc.write_truth(baseline=(b0, b1), window=None, ratio_spans=((b0, mid), (mid, b1)))
