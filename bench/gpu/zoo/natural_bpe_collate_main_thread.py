"""natural_bpe_collate_main_thread (natural, nothing staged): a GPT-2-small language model trained on raw text with a
tokenizer of its own, the way a script built on a widely copied pure-Python BPE writes it (karpathy's minbpe
RegexTokenizer: the GPT-2 split pattern, here its ASCII form since the standard library's `re` has no \\p{L}, then for
each chunk the merge loop `while len(ids) >= 2: stats = get_stats(ids); pair = min(stats, key=lambda p:
self.merges.get(p, float("inf"))); ... ids = merge(ids, pair, idx)`), trained at set-up on a sample of the corpus (256
merges: a vocabulary of 512). The corpus is 2,000 synthetic documents of ~4 KB (sentences of made-up words drawn from a
Zipf law) held in memory as Python strings; a torch.utils.data.DataLoader(batch_size=8, shuffle=True,
collate_fn=collate) with num_workers left at its default, 0, so that the collate function runs on the main thread: each
document encoded whole with tokenizer.encode (no cache: every chunk's merges recomputed), cut to 1,025 tokens (padded
with -1 where shorter, ignored by the loss), stacked into a LongTensor and copied to the GPU. The model: a nanoGPT-style
decoder (12 layers, 12 heads, d 768, block 1024, no biases, flash attention through scaled_dot_product_attention), bf16
autocast, fused AdamW, zero_grad(set_to_none=True), loss.item() each step. Per step the main thread spends of the order
of 100 ms of pure Python (under the GIL) encoding ~9,500 tokens (~10-15 us each) while the GPU's part is a fraction of
that: the GPU waits for the tokenizer. One process on CPUs 2-3, no threads of its own (PyTorch's autograd thread runs
the backward), no workers, no children, no IO, no lock, no sleep; every batch has the same shape. 20 s (smaller with
--device cpu: 2 layers, d 64, block 128, batch 4, 64 merges, documents of ~750 bytes).

The script measures itself: the steps per second; the main thread's time in next(loader) (`load_s`: the sampler and the
collate function), in the tokenizer apart (`encode_s`, wall and its CPU clock `encode_cpu_s`), in the batch's copy to
the GPU (`h2d_s`), queueing the forward (`forward_s`), in loss.backward() (`backward_s`: PyTorch's autograd thread
queues the backward while the main thread waits), in the optimiser and in loss.item(); the tokens encoded a step; before
the run, the same steps from a loader of the same batches over 48 of the documents tokenised once at set-up (the fix, as
nanoGPT's prepare.py does it: `pretokenized_steps_per_s`), so that what tokenising in the loop costs the run is known
(`encode_overhead_s`: the run's wall time beyond its steps at that rate); the main thread's and the autograd thread's
time on a CPU and waiting for one over the run (their schedstat); the process's minor page faults, the device
allocator's cudaMalloc calls and the caching host allocator's cudaHostAlloc calls; and a step's GPU time queued
(common.gpu_seconds_queued, in two parts so that neither fills the launch queue: the forward, then the backward and
AdamW, on a batch already on the GPU, nothing read back), so that the GPU's busy share is known. Truth `autograd` names
PyTorch's autograd thread."""

import math
import os
import re
import resource
import threading
import time

from common import Scenario, gpu_seconds_queued

sc = Scenario("natural_bpe_collate_main_thread", "natural", "a GPT-2-small trained on raw text whose DataLoader "
              "(num_workers=0) collates each batch by encoding it with a pure-Python BPE tokenizer (minbpe's "
              "RegexTokenizer) on the main thread, bf16, loss.item() each step, 20 s, nothing staged",
              job_cpus=[2, 3], control=True)
import numpy as np  # noqa: E402
import torch  # noqa: E402

nn = torch.nn
F = nn.functional
PID, MAIN = os.getpid(), threading.get_native_id()
dev = torch.device(sc.device)
N_LAYER, N_HEAD, N_EMBD, BLOCK, BATCH, MERGES, DOC_WORDS, DOCS = (
    (12, 12, 768, 1024, 8, 256, 640, 2000) if sc.cuda else (2, 4, 64, 128, 4, 64, 120, 400))
VOCAB = 256 + MERGES
KEYS = ("load_s", "encode_s", "encode_cpu_s", "h2d_s", "forward_s", "backward_s", "opt_s", "item_s")
own = {"steps": 0, **dict.fromkeys(KEYS, 0.0), "tokens": 0, "docs": 0, "running_loss": 0.0}

# ---- minbpe's RegexTokenizer (as written there) -----------------------------------------------------------------
GPT2_SPLIT_PATTERN_ASCII = r"""'(?:[sdmt]|ll|ve|re)| ?[A-Za-z]+| ?[0-9]{1,3}| ?[^\sA-Za-z0-9]+|\s+(?!\S)|\s+"""


def get_stats(ids: list[int], counts: dict | None = None) -> dict:
    counts = {} if counts is None else counts
    for pair in zip(ids, ids[1:]):
        counts[pair] = counts.get(pair, 0) + 1
    return counts


def merge(ids: list[int], pair: tuple[int, int], idx: int) -> list[int]:
    newids = []
    i = 0
    while i < len(ids):
        if ids[i] == pair[0] and i < len(ids) - 1 and ids[i + 1] == pair[1]:
            newids.append(idx)
            i += 2
        else:
            newids.append(ids[i])
            i += 1
    return newids


class RegexTokenizer:
    def __init__(self, pattern: str = GPT2_SPLIT_PATTERN_ASCII) -> None:
        self.pattern = pattern
        self.compiled_pattern = re.compile(self.pattern)
        self.merges: dict[tuple[int, int], int] = {}

    def train(self, text: str, vocab_size: int) -> None:
        num_merges = vocab_size - 256
        text_chunks = re.findall(self.compiled_pattern, text)
        ids = [list(ch.encode("utf-8")) for ch in text_chunks]
        for i in range(num_merges):
            stats: dict = {}
            for chunk_ids in ids:
                get_stats(chunk_ids, stats)
            pair = max(stats, key=stats.get)
            idx = 256 + i
            ids = [merge(chunk_ids, pair, idx) for chunk_ids in ids]
            self.merges[pair] = idx

    def _encode_chunk(self, text_bytes: bytes) -> list[int]:
        ids = list(text_bytes)
        while len(ids) >= 2:
            stats = get_stats(ids)
            pair = min(stats, key=lambda p: self.merges.get(p, float("inf")))
            if pair not in self.merges:
                break
            idx = self.merges[pair]
            ids = merge(ids, pair, idx)
        return ids

    def encode(self, text: str) -> list[int]:
        text_chunks = re.findall(self.compiled_pattern, text)
        ids = []
        for chunk in text_chunks:
            ids.extend(self._encode_chunk(chunk.encode("utf-8")))
        return ids


# ---- the corpus: synthetic English-like documents ----------------------------------------------------------------
rng = np.random.default_rng(0)
SYLL = ["ka", "to", "ri", "en", "sa", "mo", "lu", "de", "an", "in", "er", "th", "st", "or", "al", "ne", "ve", "qu",
        "pi", "ro", "ge", "ba", "ti", "co", "la", "me", "us", "ion", "ed", "ing"]
words = sorted({"".join(rng.choice(SYLL, rng.integers(1, 4))) for _ in range(6000)})
zipf_cdf = np.cumsum(1.0 / np.arange(1, len(words) + 1))
zipf_cdf /= zipf_cdf[-1]
ENDS = (".", ".", ".", "?", "!")


def document(r: np.random.Generator) -> str:
    ws = np.searchsorted(zipf_cdf, r.random(DOC_WORDS)).tolist()  # word ids drawn from the Zipf law
    lens, nums, ends = r.integers(6, 20, DOC_WORDS).tolist(), r.integers(1, 2000, DOC_WORDS).tolist(), r.random(
        DOC_WORDS).tolist()
    out, k, j = [], 0, 0
    while k < len(ws):
        n = lens[j]
        sent = [words[i] for i in ws[k:k + n]]
        sent[0] = sent[0].capitalize()
        if ends[j] < 0.3:
            sent.insert(len(sent) // 2, f"{nums[j]},")
        out.append(" ".join(sent) + ENDS[int(ends[j] * 5)])
        k, j = k + n, j + 1
    return " ".join(out)


docs = [document(rng) for _ in range(DOCS)]
tokenizer = RegexTokenizer()
t_train = time.perf_counter()
tokenizer.train(" ".join(docs[:3]), VOCAB)
sc.note(f"set-up: the tokenizer trained ({MERGES} merges) in {time.perf_counter() - t_train:.1f} s.")


class TextDataset(torch.utils.data.Dataset):
    def __init__(self, texts: list[str]) -> None:
        self.texts = texts

    def __len__(self) -> int:
        return len(self.texts)

    def __getitem__(self, i: int) -> str:
        return self.texts[i]


def pad_stack(seqs: list[list[int]]) -> torch.Tensor:
    out = torch.full((len(seqs), BLOCK + 1), -1, dtype=torch.long)
    for r, ids in enumerate(seqs):
        ids = ids[:BLOCK + 1]
        out[r, :len(ids)] = torch.tensor(ids, dtype=torch.long)
    return out


def collate(batch: list[str]) -> torch.Tensor:
    """The script's collate_fn: encode each document whole, cut to block + 1, pad, stack."""
    t0, c0 = time.perf_counter(), time.thread_time()
    seqs = [tokenizer.encode(text) for text in batch]
    t1, c1 = time.perf_counter(), time.thread_time()
    own["encode_s"] += t1 - t0
    own["encode_cpu_s"] += c1 - c0
    own["tokens"] += sum(len(s) for s in seqs)
    own["docs"] += len(seqs)
    return pad_stack(seqs)


# The fix, measured before the run: the documents' ids computed once (as prepare.py does), the loader collating ids.
PRE_DOCS = 48
pretokenized = [tokenizer.encode(d) for d in docs[:PRE_DOCS]]
pre_tokens_per_doc = sum(min(len(s), BLOCK + 1) for s in pretokenized) / PRE_DOCS
short_docs = sum(1 for s in pretokenized if len(s) < BLOCK + 1)


def collate_ids(batch: list[int]) -> torch.Tensor:
    return pad_stack([pretokenized[i] for i in batch])


loader = torch.utils.data.DataLoader(TextDataset(docs), batch_size=BATCH, shuffle=True, collate_fn=collate,
                                     drop_last=True)
fix_loader = torch.utils.data.DataLoader(list(range(PRE_DOCS)), batch_size=BATCH, shuffle=True,
                                         collate_fn=collate_ids, drop_last=True)


# ---- the model: nanoGPT's decoder ---------------------------------------------------------------------------------
class CausalSelfAttention(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.c_attn = nn.Linear(N_EMBD, 3 * N_EMBD, bias=False)
        self.c_proj = nn.Linear(N_EMBD, N_EMBD, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.size()
        q, k, v = self.c_attn(x).split(N_EMBD, dim=2)
        q, k, v = (t.view(B, T, N_HEAD, C // N_HEAD).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.c_proj(y.transpose(1, 2).contiguous().view(B, T, C))


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.ln_1, self.attn = nn.LayerNorm(N_EMBD, bias=False), CausalSelfAttention()
        self.ln_2 = nn.LayerNorm(N_EMBD, bias=False)
        self.mlp = nn.Sequential(nn.Linear(N_EMBD, 4 * N_EMBD, bias=False), nn.GELU(),
                                 nn.Linear(4 * N_EMBD, N_EMBD, bias=False))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.wte, self.wpe = nn.Embedding(VOCAB, N_EMBD), nn.Embedding(BLOCK, N_EMBD)
        self.h = nn.ModuleList([Block() for _ in range(N_LAYER)])
        self.ln_f = nn.LayerNorm(N_EMBD, bias=False)
        self.lm_head = nn.Linear(N_EMBD, VOCAB, bias=False)
        self.wte.weight = self.lm_head.weight
        for pn, p in self.named_parameters():
            if p.dim() >= 2:
                nn.init.normal_(p, 0.0, 0.02 / math.sqrt(2 * N_LAYER) if pn.endswith("2.weight") else 0.02)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(idx.size(1), device=idx.device)
        x = self.wte(idx.clamp_min(0)) + self.wpe(pos)
        for block in self.h:
            x = block(x)
        logits = self.lm_head(self.ln_f(x))
        return F.cross_entropy(logits.view(-1, logits.size(-1)).float(), targets.reshape(-1), ignore_index=-1)


torch.manual_seed(0)
if sc.cuda:
    torch.backends.cuda.matmul.allow_tf32 = True
model = GPT().to(dev)
opt = torch.optim.AdamW(model.parameters(), lr=3e-4, betas=(0.9, 0.95), weight_decay=0.1, fused=sc.cuda or None)
ctx = torch.autocast(device_type=dev.type, dtype=torch.bfloat16, enabled=sc.cuda)
mode = {"it": iter(loader), "fix": False}


def next_batch() -> torch.Tensor:
    src = fix_loader if mode["fix"] else loader
    try:
        return next(mode["it"])
    except StopIteration:
        mode["it"] = iter(src)
        return next(mode["it"])


def set_mode(fix: bool) -> None:
    mode["fix"] = fix
    mode["it"] = iter(fix_loader if fix else loader)


def step() -> None:
    t0 = time.perf_counter()
    batch = next_batch()  # num_workers=0: the collate function (the tokenizer) runs here, on the main thread
    t1 = time.perf_counter()
    batch = batch.to(dev)
    x, y = batch[:, :-1], batch[:, 1:]
    t2 = time.perf_counter()
    with ctx:
        loss = model(x, y)
    t3 = time.perf_counter()
    loss.backward()  # queued by PyTorch's autograd thread; the main thread waits for it
    t4 = time.perf_counter()
    opt.step()
    opt.zero_grad(set_to_none=True)
    t5 = time.perf_counter()
    own["running_loss"] += loss.item()
    t6 = time.perf_counter()
    own["load_s"] += t1 - t0
    own["h2d_s"] += t2 - t1
    own["forward_s"] += t3 - t2
    own["backward_s"] += t4 - t3
    own["opt_s"] += t5 - t4
    own["item_s"] += t6 - t5
    own["steps"] += 1


def sync() -> None:
    if sc.cuda:
        torch.cuda.synchronize()


def reset() -> None:
    for k in own:
        own[k] = 0 if k in ("steps", "tokens", "docs") else 0.0


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


for _ in range(5):  # warm-up: the attention and matmul kernels chosen, the allocator, the autograd thread started
    step()
sync()
fixed = pad_stack(pretokenized[:BATCH]).to(dev)
gpu_step_s = gpu_fwd_s = gpu_bwd_s = None


def median_gpu_s(work, prepare=None) -> float | None:
    runs = sorted(r for r in (gpu_seconds_queued(torch, work, prepare) for _ in range(5)) if r is not None)
    return runs[len(runs) // 2] if runs else None


def fixed_loss() -> torch.Tensor:
    with ctx:
        return model(fixed[:, :-1], fixed[:, 1:])


def backward_opt(loss: torch.Tensor) -> None:
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)


if sc.cuda:
    # A step's GPU work on a batch already on the GPU, measured in two parts so that neither fills the launch queue:
    # the forward, then the backward with AdamW (its forward run first, untimed); nothing read back.
    gpu_fwd_s = median_gpu_s(lambda _: fixed_loss())
    gpu_bwd_s = median_gpu_s(backward_opt, fixed_loss)
    gpu_step_s = gpu_fwd_s + gpu_bwd_s if None not in (gpu_fwd_s, gpu_bwd_s) else None
    opt.zero_grad(set_to_none=True)
# The fix, before the run: the loader collating ids tokenised once.
set_mode(True)
for _ in range(3):
    step()
sync()
reset()
fix_steps, fix_wall = timed(3.0 * sc.scale)
fix = {k: own[k] / max(fix_steps, 1) for k in KEYS}
# As the script has it: the tokenizer in the collate function.
set_mode(False)
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
load_rest = max(0.0, own["load_s"] - own["encode_s"])
main_run = round(main1[0] - main0[0], 4) if main0 and main1 else None
main_wait = round(main1[1] - main0[1], 4) if main0 and main1 else None
ag_run = round(ag1[0] - ag0[0], 4) if ag0 and ag1 else None
ag_wait = round(ag1[1] - ag0[1], 4) if ag0 and ag1 else None
gpu_busy = n * gpu_step_s if gpu_step_s is not None else None
sc.extra["autograd"] = ag
sc.extra["self"] = {**{k: round(v, 4) if isinstance(v, float) else v for k, v in own.items()},
                    "wall_s": round(wall, 4), "steps_per_s": round(n / wall, 2), "step_ms_mean": ms(wall / max(n, 1)),
                    "load_share": share(own["load_s"]), "load_rest_s": round(load_rest, 4),
                    "encode_share": share(own["encode_s"]), "encode_cpu_share": share(own["encode_cpu_s"]),
                    "encode_ms_mean": ms(own["encode_s"] / max(n, 1)),
                    "encode_us_per_token": round(own["encode_s"] / max(own["tokens"], 1) * 1e6, 3),
                    "tokens_per_step": round(own["tokens"] / max(n, 1), 1),
                    "h2d_share": share(own["h2d_s"]), "forward_share": share(own["forward_s"]),
                    "backward_share": share(own["backward_s"]), "opt_share": share(own["opt_s"]),
                    "item_share": share(own["item_s"]),
                    "pretokenized_steps": fix_steps, "pretokenized_wall_s": round(fix_wall, 4),
                    "pretokenized_steps_per_s": round(fix_rate, 2) if fix_rate else None,
                    **{f"pretokenized_{k.removesuffix('_s')}_ms": ms(v) for k, v in fix.items()},
                    "pretokenized_tokens_per_doc": round(pre_tokens_per_doc, 1), "short_docs": short_docs,
                    "at_pretokenized_rate_s": round(at_fix_rate, 4) if at_fix_rate is not None else None,
                    "encode_overhead_s": round(overhead, 4) if overhead is not None else None,
                    "encode_overhead_share": share(overhead),
                    "main_run_s": main_run, "main_cpu_share": share(main_run),
                    "main_cpu_wait_s": main_wait, "main_cpu_wait_share": share(main_wait),
                    "autograd_run_s": ag_run, "autograd_cpu_share": share(ag_run),
                    "autograd_cpu_wait_s": ag_wait, "autograd_cpu_wait_share": share(ag_wait),
                    "minor_faults_per_s": round((f1 - f0) / wall, 1), "cuda_mallocs_per_s": round((m1 - m0) / wall, 3),
                    "host_allocs_per_s": round((h1 - h0) / wall, 3) if h0 is not None and h1 is not None else None,
                    "gpu_forward_ms": ms(gpu_fwd_s) if gpu_fwd_s is not None else None,
                    "gpu_backward_opt_ms": ms(gpu_bwd_s) if gpu_bwd_s is not None else None,
                    "gpu_step_ms": ms(gpu_step_s) if gpu_step_s is not None else None,
                    "gpu_busy_s": round(gpu_busy, 4) if gpu_busy is not None else None,
                    "gpu_busy_share": share(gpu_busy), "batch": BATCH, "block": BLOCK, "vocab": VOCAB,
                    "merges": MERGES, "n_layer": N_LAYER, "n_embd": N_EMBD, "documents": DOCS,
                    "intra_op_threads": torch.get_num_threads()}
if not sc.cuda:
    sc.note("on the CPU: no autograd thread (the backward runs on the main thread), no GPU timings, no allocator "
            "counters.")
sc.note(f"natural: measured by the script: {n} steps ({n / wall:.1f}/s) in {wall:.2f} s: {own['load_s']:.2f} s in "
        f"next(loader), {own['encode_s']:.2f} s of it encoding with the BPE ({own['encode_cpu_s']:.2f} s of CPU; "
        f"{own['tokens'] / max(n, 1):.0f} tokens a step), {own['h2d_s']:.2f} s copying batches to the device, "
        f"{own['forward_s']:.2f} s queueing forwards, {own['backward_s']:.2f} s in backward(), {own['item_s']:.2f} s "
        f"in .item(); from ids tokenised once {fix_rate and round(fix_rate, 1)} steps/s (tokenising in the loop cost "
        f"{overhead and round(overhead, 2)} s of the run); the main thread ran {main_run} s, waited for a CPU "
        f"{main_wait} s; the autograd thread {(ag or {}).get('comm')} ran {ag_run} s; "
        + (f"a step's kernels take {gpu_step_s * 1e3:.2f} ms of GPU time queued (GPU busy {gpu_busy / wall:.0%} of the "
           "run)." if gpu_busy is not None else "no GPU timings (no CUDA)."))
sc.write_truth(baseline=(b0, b1), window=None, ratio_spans=((b0, mid), (mid, b1)))
