"""natural_word2vec_cpu_negatives (natural, nothing staged): word2vec's skip-gram with negative sampling (SGNS) trained
the way a widely copied PyTorch implementation writes it (pytorch-sgns's SGNS module): two embedding tables, the input
and the output vectors (vocabulary 300,000, dimension 300, dense nn.Embedding, Adam), batches of 4,096 centre words with
their 4 context words (a window of 2) drawn from (centre, context) pairs tokenised at set-up and held on the GPU, and
inside the module's forward 5 negatives per context word drawn each step with
torch.multinomial(self.weights, 4096 * 4 * 5, replacement=True), where self.weights, the unigram distribution raised to
the 0.75 and normalised, is an ordinary CPU tensor (the module keeps it as a plain attribute, `FT(wf)`, not a buffer,
so model.to(device) leaves it on the host), then moved to the GPU (`.to(device)`: 81,920 int64 ids, 655 KB of pageable
memory). On the CPU, multinomial with replacement sums the 300,000 weights into a cumulative table and draws each sample
by a binary search in it: milliseconds of one CPU thread each step, while the GPU's part is a few. loss.item() each
step for the progress bar's postfix. One process on CPUs 2-3, no threads of its own (PyTorch's autograd thread runs the
backward), no workers, no children, no IO, no lock, no sleep. 20 s (smaller with --device cpu: vocabulary 20,000,
dimension 32, batch 512; there the fix is the same code, so its rate is the run's).

The script measures itself: the steps per second; the main thread's time in the negatives' sampling (wall and its CPU
clock), in their copy to the GPU (`h2d_s`), in queueing the rest of the step (the embeddings' gathers, the losses,
the optimiser; loss.backward() apart, `backward_s`, where PyTorch's autograd thread queues the backward while the main
thread waits) and in loss.item(); before the run, the same steps with the weights moved to the GPU so that
torch.multinomial draws there (the fix: `gpu_sampling_steps_per_s`), so that what sampling on the CPU costs the run is
known (`sampling_overhead_s`: the run's wall time beyond its steps at that rate); the main thread's and the autograd
thread's time on a CPU and waiting for one over the run (their schedstat); the process's minor page faults, the device
allocator's cudaMalloc calls and the caching host allocator's cudaHostAlloc calls; and a step's GPU time queued
(common.gpu_seconds_queued: the gathers, the losses, the backward and the optimiser with the negatives already on the
GPU, nothing read back), so that the GPU's busy share is known. Truth `autograd` names PyTorch's autograd thread."""

import os
import resource
import threading
import time

from common import Scenario, gpu_seconds_queued

sc = Scenario("natural_word2vec_cpu_negatives", "natural", "word2vec SGNS (vocabulary 300k, dimension 300, batch 4096) "
              "whose negatives are drawn each step with torch.multinomial over a unigram table held as a CPU tensor, "
              "then copied to the GPU, loss.item() each step, 20 s, nothing staged", job_cpus=[2, 3], control=True)
import numpy as np  # noqa: E402
import torch  # noqa: E402

nn = torch.nn
PID, MAIN = os.getpid(), threading.get_native_id()
dev = torch.device(sc.device)
VOCAB, DIM, BATCH, WINDOW, NEGS, POOL = ((300_000, 300, 4096, 2, 5, 8) if sc.cuda else (20_000, 32, 512, 2, 5, 8))
CONTEXT = 2 * WINDOW
KEYS = ("forward_s", "sample_s", "sample_cpu_s", "h2d_s", "backward_s", "opt_s", "item_s")
own = {"steps": 0, **dict.fromkeys(KEYS, 0.0), "running_loss": 0.0}


class SGNS(nn.Module):
    """pytorch-sgns's model: the word2vec tables and the negatives drawn from the unigram^0.75 table in forward."""

    def __init__(self, vocab_size: int, embedding_size: int, n_negs: int, weights: np.ndarray) -> None:
        super().__init__()
        self.vocab_size, self.embedding_size, self.n_negs = vocab_size, embedding_size, n_negs
        self.ivectors = nn.Embedding(vocab_size, embedding_size, padding_idx=0)
        self.ovectors = nn.Embedding(vocab_size, embedding_size, padding_idx=0)
        bound = 0.5 / embedding_size
        self.ivectors.weight = nn.Parameter(torch.cat([torch.zeros(1, embedding_size),
                                                       torch.empty(vocab_size - 1, embedding_size).uniform_(-bound,
                                                                                                             bound)]))
        self.ovectors.weight = nn.Parameter(torch.cat([torch.zeros(1, embedding_size),
                                                       torch.empty(vocab_size - 1, embedding_size).uniform_(-bound,
                                                                                                             bound)]))
        wf = np.power(weights, 0.75)
        wf = wf / wf.sum()
        self.weights = torch.tensor(wf, dtype=torch.float)  # a plain attribute: stays on the CPU through .to(device)

    def forward(self, iword: torch.Tensor, owords: torch.Tensor, nwords: torch.Tensor | None = None) -> torch.Tensor:
        batch_size, context_size = owords.shape
        if nwords is None:
            t0, c0 = time.perf_counter(), time.thread_time()
            nwords = torch.multinomial(self.weights, batch_size * context_size * self.n_negs,
                                       replacement=True).view(batch_size, -1)
            t1, c1 = time.perf_counter(), time.thread_time()
            nwords = nwords.to(iword.device)
            t2 = time.perf_counter()
            own["sample_s"] += t1 - t0
            own["sample_cpu_s"] += c1 - c0
            own["h2d_s"] += t2 - t1
        ivectors = self.ivectors(iword).unsqueeze(2)
        ovectors = self.ovectors(owords)
        nvectors = self.ovectors(nwords).neg()
        oloss = torch.bmm(ovectors, ivectors).squeeze(2).sigmoid().log().mean(1)
        nloss = torch.bmm(nvectors, ivectors).squeeze(2).sigmoid().log().view(-1, context_size, self.n_negs).sum(2)
        return -(oloss + nloss.mean(1)).mean()


# The corpus's word counts (a Zipf law, as text has them; id 0 is the padding) and its (centre, context) pairs, made
# at set-up from the unigram distribution and held on the GPU (the loader's part is not this job's subject).
torch.manual_seed(0)
rank = np.arange(1, VOCAB + 1, dtype=np.float64)
counts = np.floor(5e8 / rank) + 5.0
counts[0] = 0.0
unigram = counts / counts.sum()
sgns = SGNS(VOCAB, DIM, NEGS, unigram).to(dev)
weights_cpu = sgns.weights
weights_dev = weights_cpu.to(dev)
opt = torch.optim.Adam(sgns.parameters())
draw = torch.tensor(unigram, dtype=torch.float, device=dev)
iwords = torch.multinomial(draw, POOL * BATCH, replacement=True).view(POOL, BATCH)
owords = torch.multinomial(draw, POOL * BATCH * CONTEXT, replacement=True).view(POOL, BATCH, CONTEXT)
nwords_dev = torch.multinomial(weights_dev, BATCH * CONTEXT * NEGS, replacement=True).view(BATCH, -1)
pos = {"i": 0}


def step() -> None:
    i = pos["i"]
    pos["i"] += 1
    t0 = time.perf_counter()
    loss = sgns(iwords[i % POOL], owords[i % POOL])
    t1 = time.perf_counter()
    opt.zero_grad()
    loss.backward()  # queued by PyTorch's autograd thread; the main thread waits for it
    t2 = time.perf_counter()
    opt.step()
    t3 = time.perf_counter()
    own["running_loss"] += loss.item()
    t4 = time.perf_counter()
    own["forward_s"] += t1 - t0
    own["backward_s"] += t2 - t1
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


def allocs() -> tuple[int, int | None]:
    """(the device allocator's cudaMalloc calls, the caching host allocator's cudaHostAlloc calls) so far."""
    if not sc.cuda:
        return 0, None
    try:
        host = int(torch.cuda.host_memory_stats().get("num_host_alloc", 0))
    except (RuntimeError, AttributeError):
        host = None
    return int(torch.cuda.memory_stats().get("segment.all.allocated", 0)), host


def timed(seconds: float) -> tuple[int, float]:
    """Steps back to back for `seconds` (then synchronised): (steps, wall)."""
    n0, t = own["steps"], time.perf_counter()
    end = t + seconds
    while time.perf_counter() < end:
        step()
    sync()
    return own["steps"] - n0, time.perf_counter() - t


for _ in range(10):  # warm-up: the allocator, the embedding and Adam kernels, the autograd thread started
    step()
sync()
gpu_step_s = None
if sc.cuda:
    def work(_) -> None:
        """One step's GPU work with the negatives already on the GPU (gathers, losses, backward, Adam), nothing read
        back (the CPU's sampling and its pageable copy, which waits for the stream, left out)."""
        opt.zero_grad()
        sgns(iwords[0], owords[0], nwords_dev).backward()
        opt.step()

    runs = sorted(r for r in (gpu_seconds_queued(torch, work) for _ in range(5)) if r is not None)
    gpu_step_s = runs[len(runs) // 2] if runs else None
# The fix, before the run: the same steps with the unigram table on the GPU, so that torch.multinomial draws there.
sgns.weights = weights_dev
for _ in range(5):
    step()
sync()
reset()
fix_steps, fix_wall = timed(3.0 * sc.scale)
fix = {k: own[k] / max(fix_steps, 1) for k in KEYS}
# As the script has it: the table on the CPU.
sgns.weights = weights_cpu
timed(2.0 * sc.scale)  # the spin kernels well before the run
ag = autograd_thread()
reset()
main0 = schedstat(MAIN)
ag0 = schedstat(ag["tid"]) if ag else None
f0, (m0, h0) = resource.getrusage(resource.RUSAGE_SELF).ru_minflt, allocs()
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
f1, (m1, h1) = resource.getrusage(resource.RUSAGE_SELF).ru_minflt, allocs()
n = own["steps"]


def share(v: float | None) -> float | None:
    return round(v / wall, 4) if v is not None else None


def ms(v: float) -> float:
    return round(v * 1e3, 4)


fix_rate = fix_steps / fix_wall if fix_wall > 0 else None
at_fix_rate = n / fix_rate if fix_rate else None
overhead = max(0.0, wall - at_fix_rate) if at_fix_rate is not None else None
issue = max(0.0, own["forward_s"] - own["sample_s"] - own["h2d_s"]) + own["opt_s"]
main_run = round(main1[0] - main0[0], 4) if main0 and main1 else None
main_wait = round(main1[1] - main0[1], 4) if main0 and main1 else None
ag_run = round(ag1[0] - ag0[0], 4) if ag0 and ag1 else None
ag_wait = round(ag1[1] - ag0[1], 4) if ag0 and ag1 else None
gpu_busy = n * gpu_step_s if gpu_step_s is not None else None
sc.extra["autograd"] = ag
sc.extra["self"] = {**{k: round(v, 4) for k, v in own.items()}, "wall_s": round(wall, 4),
                    "steps_per_s": round(n / wall, 2), "step_ms_mean": ms(wall / max(n, 1)),
                    "sample_share": share(own["sample_s"]), "sample_cpu_share": share(own["sample_cpu_s"]),
                    "sample_ms_mean": ms(own["sample_s"] / max(n, 1)), "h2d_share": share(own["h2d_s"]),
                    "issue_s": round(issue, 4), "issue_share": share(issue),
                    "backward_share": share(own["backward_s"]), "item_share": share(own["item_s"]),
                    "negatives_per_step": BATCH * CONTEXT * NEGS, "negatives_bytes": BATCH * CONTEXT * NEGS * 8,
                    "gpu_sampling_steps": fix_steps, "gpu_sampling_wall_s": round(fix_wall, 4),
                    "gpu_sampling_steps_per_s": round(fix_rate, 2) if fix_rate else None,
                    **{f"gpu_sampling_{k.removesuffix('_s')}_ms": ms(v) for k, v in fix.items()},
                    "at_gpu_sampling_rate_s": round(at_fix_rate, 4) if at_fix_rate is not None else None,
                    "sampling_overhead_s": round(overhead, 4) if overhead is not None else None,
                    "sampling_overhead_share": share(overhead),
                    "main_run_s": main_run, "main_cpu_share": share(main_run),
                    "main_cpu_wait_s": main_wait, "main_cpu_wait_share": share(main_wait),
                    "autograd_run_s": ag_run, "autograd_cpu_share": share(ag_run),
                    "autograd_cpu_wait_s": ag_wait, "autograd_cpu_wait_share": share(ag_wait),
                    "minor_faults_per_s": round((f1 - f0) / wall, 1), "cuda_mallocs_per_s": round((m1 - m0) / wall, 3),
                    "host_allocs_per_s": round((h1 - h0) / wall, 3) if h0 is not None and h1 is not None else None,
                    "gpu_step_ms": ms(gpu_step_s) if gpu_step_s is not None else None,
                    "gpu_busy_s": round(gpu_busy, 4) if gpu_busy is not None else None,
                    "gpu_busy_share": share(gpu_busy), "vocab": VOCAB, "dim": DIM, "batch": BATCH,
                    "context": CONTEXT, "negs": NEGS, "intra_op_threads": torch.get_num_threads()}
if not sc.cuda:
    sc.note("on the CPU: the fix is the same code (no GPU to sample on), no autograd thread (the backward runs on the "
            "main thread), no GPU timings, no allocator counters.")
sc.note(f"natural: measured by the script: {n} steps ({n / wall:.1f}/s) in {wall:.2f} s: {own['sample_s']:.2f} s "
        f"drawing negatives on the CPU ({own['sample_cpu_s']:.2f} s of CPU; {BATCH * CONTEXT * NEGS} a step), "
        f"{own['h2d_s']:.2f} s copying them to the device, {issue:.2f} s queueing the rest, {own['backward_s']:.2f} s "
        f"in backward(), {own['item_s']:.2f} s in .item(); with the table on the device "
        f"{fix_rate and round(fix_rate, 1)} steps/s (sampling on the CPU cost {overhead and round(overhead, 2)} s of "
        f"the run); the main thread ran {main_run} s, waited for a CPU {main_wait} s; the autograd thread "
        f"{(ag or {}).get('comm')} ran {ag_run} s; "
        + (f"a step's kernels take {gpu_step_s * 1e3:.2f} ms of GPU time queued (GPU busy {gpu_busy / wall:.0%} of the "
           "run)." if gpu_busy is not None else "no GPU timings (no CUDA)."))
sc.write_truth(baseline=(b0, b1), window=None, ratio_spans=((b0, mid), (mid, b1)))
