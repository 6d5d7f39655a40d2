"""natural_gc_token_corpus (natural, nothing staged): a byte-level language model trained from a corpus tokenised at
set-up into Python objects, as a first script keeps it: 2.5 million short synthetic documents (lines of 1-20 words from
a 20,000-word Zipf vocabulary, ~45 bytes each) each tokenised into a Python list of its byte values (list(line), ids
0-255), all held in one list (~2.5 million lists, ~1.2 GB), built with the garbage collector on as always; each step the
main thread packs 64 rows of 257 tokens by concatenating consecutive documents from a random one (a newline between
them) in Python, makes a tensor of them (torch.tensor), copies it to the GPU (.to(dev), pageable, 131 KB) and trains a
GPT-style decoder on it (6 blocks, d_model 512, 8 heads, causal scaled_dot_product_attention, a 4x GELU MLP, context
256, vocabulary 256, bf16 autocast, fused AdamW, a cosine lr); then it reads the loss (loss.item()) and appends the
step's record to a list kept for the run: a dict of the step, the time, the loss, the lr, the tokens and which
documents each row was packed from (a list of 64 lists of ids, for replaying a bad batch). Nothing disables, freezes or
tunes the garbage collector: its collections walk the objects of the generation they collect, the oldest holding the
corpus (CPython 3.12 collects the oldest only once the objects moved there since its last collection number a quarter
of those it kept then; how many fall in the run is what the script measures). CPUs 2-3, 20 s.

The script measures itself: every collection of the garbage collector (gc.callbacks: its generation, its wall time and
the main thread's CPU time in it, its span on the truth's clock; truth `gc_pauses_ns`: those of 10 ms or more) in the
measured run and, apart, while the corpus was built; the steps per second; the main thread's time packing and making
the batch (wall and CPU clock), copying it, queueing the step, in loss.item() and appending the record; a step's GPU
time queued (common.gpu_seconds_queued on a copy of the model with its own optimiser), so that the GPU's busy share is
known; the main thread's time on a CPU and waiting for one (/proc/thread-self/schedstat), the process's minor page
faults and peak resident memory (getrusage), the objects the collector tracks after the run, and cudaMalloc calls
(segment.all.allocated)."""

import copy
import gc
import math
import random
import resource
import threading
import time

import numpy as np
from common import Scenario, gpu_seconds_queued

sc = Scenario("natural_gc_token_corpus", "natural", "a byte-level GPT trained from 2.5 million documents tokenised "
              "into Python lists at set-up, batches packed in Python, a record per step kept in a list, the garbage "
              "collector left as it is, 20 s, nothing staged", job_cpus=[2, 3], control=True)
MAIN = threading.get_native_id()
collections: list[dict] = []
gc_state = {"phase": "import", "t": 0.0, "c": 0.0, "ns": 0}


def on_gc(phase: str, info: dict) -> None:
    """gc.callbacks: every collection's generation, wall time and the thread's CPU time in it."""
    if phase == "start":
        gc_state.update(t=time.perf_counter(), c=time.thread_time(), ns=time.time_ns())
        return
    collections.append({"phase": gc_state["phase"], "gen": info["generation"],
                        "s": time.perf_counter() - gc_state["t"], "cpu_s": time.thread_time() - gc_state["c"],
                        "start_ns": gc_state["ns"], "end_ns": time.time_ns(), "collected": info["collected"],
                        "main": threading.get_native_id() == MAIN})


gc.callbacks.append(on_gc)
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

dev = torch.device(sc.device)
NDOCS = 2_500_000 if sc.cuda else 50_000
WORDS, BATCH, CTX, D, HEADS, LAYERS, VOCAB, NL = 20_000, 64, 256, 512, 8, 6, 256, 10
if not sc.cuda:
    BATCH, D, HEADS, LAYERS = 8, 64, 4, 2
STEPS_PLANNED, LR = 20_000, 6e-4


def build_corpus(n: int) -> list[list[int]]:
    """n synthetic lines (1 + Poisson(6) Zipf-drawn words), each tokenised into a list of its bytes."""
    rng = np.random.default_rng(0)
    wl = rng.integers(1, 10, WORDS)  # a vocabulary of pseudo-words, each followed by a space
    letters = rng.integers(97, 123, int((wl + 1).sum()), dtype=np.uint8)
    starts = np.concatenate([[0], np.cumsum(wl + 1)[:-1]])
    letters[starts + wl] = 32
    p = 1.0 / np.arange(1, WORDS + 1) ** 1.1
    p /= p.sum()
    docs: list[list[int]] = []
    for c0 in range(0, n, 200_000):
        nw = np.minimum(1 + rng.poisson(6, min(200_000, n - c0)), 20)
        ids = rng.choice(WORDS, int(nw.sum()), p=p)
        lens = wl[ids] + 1
        out_starts = np.cumsum(lens) - lens
        text = letters[np.repeat(starts[ids] - out_starts, lens) + np.arange(int(lens.sum()))]
        last = np.cumsum(nw) - 1
        text[out_starts[last] + lens[last] - 1] = NL  # each line's last space becomes its newline
        docs.extend(map(list, text.tobytes().split(b"\n")[:-1]))  # the byte-level tokeniser
    return docs


gc_state["phase"] = "build"
t_build = time.perf_counter()
corpus = build_corpus(NDOCS)
build_s = time.perf_counter() - t_build
gc_state["phase"] = "setup"
n_docs = len(corpus)


class Block(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.ln1, self.ln2 = torch.nn.LayerNorm(D), torch.nn.LayerNorm(D)
        self.qkv, self.proj = torch.nn.Linear(D, 3 * D), torch.nn.Linear(D, D)
        self.fc, self.out = torch.nn.Linear(D, 4 * D), torch.nn.Linear(4 * D, D)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, HEADS, D // HEADS).permute(2, 0, 3, 1, 4)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(a.transpose(1, 2).reshape(b, t, D))
        return x + self.out(F.gelu(self.fc(self.ln2(x))))


class ByteGPT(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.tok, self.pos = torch.nn.Embedding(VOCAB, D), torch.nn.Embedding(CTX, D)
        self.blocks = torch.nn.ModuleList(Block() for _ in range(LAYERS))
        self.ln, self.head = torch.nn.LayerNorm(D), torch.nn.Linear(D, VOCAB, bias=False)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.tok(idx) + self.pos(torch.arange(idx.shape[1], device=idx.device))
        for blk in self.blocks:
            x = blk(x)
        return self.head(self.ln(x))


torch.manual_seed(0)
model = ByteGPT().to(dev)
opt = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.1, fused=sc.cuda or None)
rng = random.Random(0)
records: list[dict] = []
own = {"steps": 0, "make_s": 0.0, "make_cpu_s": 0.0, "copy_s": 0.0, "issue_s": 0.0, "item_s": 0.0, "record_s": 0.0}


def pack() -> tuple[list[list[int]], list[list[int]]]:
    """BATCH rows of CTX + 1 tokens, each consecutive documents from a random one; and the documents of each row."""
    rows, prov = [], []
    for _ in range(BATCH):
        j = rng.randrange(n_docs)
        row: list[int] = []
        ids: list[int] = []
        while len(row) <= CTX:
            row += corpus[j]
            row.append(NL)
            ids.append(j)
            j = (j + 1) % n_docs
        rows.append(row[:CTX + 1])
        prov.append(ids)
    return rows, prov


def lr_at(i: int) -> float:
    return LR * 0.5 * (1 + math.cos(math.pi * min(i, STEPS_PLANNED) / STEPS_PLANNED))


def train(m: torch.nn.Module, o: torch.optim.Optimizer, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    with torch.autocast(sc.device, dtype=torch.bfloat16, enabled=sc.cuda):
        logits = m(x)
    loss = F.cross_entropy(logits.float().view(-1, VOCAB), y.reshape(-1))
    loss.backward()
    o.step()
    o.zero_grad(set_to_none=True)
    return loss


def step() -> None:
    i = len(records)
    t0, c0 = time.perf_counter(), time.thread_time()
    rows, prov = pack()
    batch = torch.tensor(rows, dtype=torch.long)
    t1, c1 = time.perf_counter(), time.thread_time()
    tokens = batch.to(dev)
    x, y = tokens[:, :-1], tokens[:, 1:]
    t2 = time.perf_counter()
    lr = lr_at(i)
    for g in opt.param_groups:
        g["lr"] = lr
    loss = train(model, opt, x, y)
    t3 = time.perf_counter()
    value = loss.item()
    t4 = time.perf_counter()
    records.append({"step": i, "time": time.time(), "loss": value, "lr": lr, "tokens": BATCH * CTX, "docs": prov})
    t5 = time.perf_counter()
    own["make_s"] += t1 - t0
    own["make_cpu_s"] += c1 - c0
    own["copy_s"] += t2 - t1
    own["issue_s"] += t3 - t2
    own["item_s"] += t4 - t3
    own["record_s"] += t5 - t4
    own["steps"] += 1


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


model.train()
for _ in range(30):  # warm-up: cuBLAS, SDPA, the allocator
    step()
sync()
gpu_step_s = None
if sc.cuda:
    m2 = copy.deepcopy(model)
    o2 = torch.optim.AdamW(m2.parameters(), lr=LR, weight_decay=0.1, fused=True)
    fixed = torch.tensor(pack()[0], dtype=torch.long).to(dev)
    x2, y2 = fixed[:, :-1], fixed[:, 1:]
    train(m2, o2, x2, y2)
    sync()
    runs = sorted(r for r in (gpu_seconds_queued(torch, lambda _: train(m2, o2, x2, y2)) for _ in range(5))
                  if r is not None)
    gpu_step_s = runs[len(runs) // 2] if runs else None
    del m2, o2, fixed, x2, y2
warm_end = time.perf_counter() + 2.0 * sc.scale  # the spin kernels well before the baseline
while time.perf_counter() < warm_end:
    step()
sync()
for k in own:
    own[k] = 0 if k == "steps" else 0.0
gc_state["phase"] = "run"
count0, stats0 = gc.get_count(), gc.get_stats()
m0 = mallocs()
f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
run0, wait0 = schedstat()
b0 = sc.mark("baseline")
t = time.perf_counter()
sc.run_for(10.0 * sc.scale, step)
mid = sc.mark("half")
sc.run_for(10.0 * sc.scale, step)
b1 = sc.mark("end")
wall = time.perf_counter() - t
run1, wait1 = schedstat()
gc_state["phase"] = "after"
f1 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
m1 = mallocs()
count1, stats1 = gc.get_count(), gc.get_stats()
tracked = len(gc.get_objects())
n = own["steps"]
in_run = [c for c in collections if c["phase"] == "run" and b0 <= c["start_ns"] and c["end_ns"] <= b1]
on_main = [c for c in in_run if c["main"]]
built = [c for c in collections if c["phase"] == "build"]
gc_s, gc_cpu_s = sum(c["s"] for c in on_main), sum(c["cpu_s"] for c in on_main)
by_gen = {str(g): {"n": sum(c["gen"] == g for c in in_run), "s": round(sum(c["s"] for c in in_run if c["gen"] == g), 4),
                   "max_ms": round(max((c["s"] for c in in_run if c["gen"] == g), default=0.0) * 1e3, 3)}
          for g in (0, 1, 2)}
full_s = sum(c["s"] for c in on_main if c["gen"] == 2)
gpu_busy = n * gpu_step_s if gpu_step_s is not None else None


def share(v: float | None) -> float | None:
    return round(v / wall, 4) if v is not None else None


sc.extra["gc_pauses_ns"] = [[c["start_ns"], c["end_ns"]] for c in on_main if c["s"] >= 0.010]
sc.extra["self"] = {**{k: round(v, 4) for k, v in own.items()}, "wall_s": round(wall, 4),
                    "steps_per_s": round(n / wall, 2), "step_ms_mean": round(wall / max(n, 1) * 1e3, 4),
                    "make_share": share(own["make_s"]), "make_cpu_share": share(own["make_cpu_s"]),
                    "copy_share": share(own["copy_s"]), "issue_share": share(own["issue_s"]),
                    "item_share": share(own["item_s"]), "record_share": share(own["record_s"]),
                    "gc_collections": len(in_run), "gc_collections_main": len(on_main), "gc_by_generation": by_gen,
                    "gc_s": round(gc_s, 4), "gc_cpu_s": round(gc_cpu_s, 4), "gc_share": share(gc_s),
                    "gc_cpu_share": share(gc_cpu_s), "gc_full": by_gen["2"]["n"], "gc_full_s": round(full_s, 4),
                    "gc_full_share": share(full_s), "gc_max_ms": round(max((c["s"] for c in in_run), default=0.0)
                                                                       * 1e3, 3),
                    "gc_pauses_10ms": len(sc.extra["gc_pauses_ns"]),
                    "gc_count_before": list(count0), "gc_count_after": list(count1),
                    "gc_stats_before": stats0, "gc_stats_after": stats1, "gc_threshold": list(gc.get_threshold()),
                    "gc_enabled": gc.isenabled(), "gc_tracked_after": tracked,
                    "build_s": round(build_s, 4), "build_gc_collections": len(built),
                    "build_gc_s": round(sum(c["s"] for c in built), 4),
                    "build_gc_full": sum(c["gen"] == 2 for c in built),
                    "build_gc_max_ms": round(max((c["s"] for c in built), default=0.0) * 1e3, 3),
                    "docs": n_docs, "records": len(records), "max_rss_gb": round(
                        resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2 ** 20, 3),
                    "main_cpu_share": round((run1 - run0) / wall, 4),
                    "main_cpu_wait_share": round((wait1 - wait0) / wall, 4) if wait0 is not None else None,
                    "minor_faults_per_s": round((f1 - f0) / wall, 1),
                    "cuda_mallocs": m1 - m0, "cuda_mallocs_per_s": round((m1 - m0) / wall, 3),
                    "gpu_step_ms": round(gpu_step_s * 1e3, 4) if gpu_step_s is not None else None,
                    "gpu_busy_s": round(gpu_busy, 4) if gpu_busy is not None else None,
                    "gpu_busy_share": share(gpu_busy), "batch": BATCH, "context": CTX, "d_model": D,
                    "layers": LAYERS, "final_loss": round(records[-1]["loss"], 4) if records else None}
if not sc.cuda:
    sc.note(f"{NDOCS} documents, a smaller model (d_model 64, 2 blocks, batch 8), fp32: no CUDA.")
sc.note(f"natural: measured by the script: the corpus ({n_docs} lists) built in {build_s:.1f} s, "
        f"{sum(c['s'] for c in built):.1f} s of it in {len(built)} collections; in the run, {n} steps "
        f"({n / wall:.1f}/s) in {wall:.2f} s: {own['make_s']:.2f} s packing and making batches, {own['copy_s']:.2f} s "
        f"copying them, {own['issue_s']:.2f} s queueing the steps, {own['item_s']:.2f} s in loss.item(), "
        f"{own['record_s']:.3f} s appending records; {len(in_run)} collections ({by_gen}) took {gc_s:.3f} s of the "
        f"main thread; "
        + (f"a step's kernels take {gpu_step_s * 1e3:.2f} ms of GPU time queued (GPU busy {gpu_busy / wall:.0%} of the "
           "run)." if gpu_busy is not None else "no GPU timings (no CUDA)."))
sc.write_truth(baseline=(b0, b1), window=None, ratio_spans=((b0, mid), (mid, b1)))
