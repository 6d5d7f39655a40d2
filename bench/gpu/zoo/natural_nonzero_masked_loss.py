"""natural_nonzero_masked_loss (natural, nothing staged): a token-classification (NER-style) Transformer whose loss is
written with data-dependent shapes, as such losses usually are: an embedding (vocabulary 32,000, d 512), a 4-layer
nn.TransformerEncoder (8 heads, feed-forward 2048, pre-norm, dropout 0.1) with a padding mask, and a tag head (17
BIO tags: O and B-/I- of 8 entity types), bf16 autocast, fused AdamW, loss.item() each step; batches of 32 sequences of
512 token slots (each a random length of 128-512 tokens, the rest padding) gathered from a corpus of 4096 held on the
GPU, their labels -100 on padding and on 15% of word-piece continuations. The loss: the valid tokens' hidden states,
logits and labels selected by boolean mask indexing (x[mask], three times), class-balancing weights from
torch.unique(return_counts=True) of the valid labels, a weighted cross-entropy, the entity tokens and the O tokens
found with torch.nonzero, three hard negatives per entity token (the O tokens least sure to be O, by topk) pulled away
from the entity tokens' mean hidden state (a cosine margin), and a confidence penalty on the O tokens' top
probability taken with masked_select. Each of those seven (the mask indexing, unique, nonzero, masked_select) must know
its output's size on the host: the host waits for the GPU (a synchronisation) before it can queue the next kernel.
No CUDA graph, no torch.compile; CPUs 2-3, 20 s.

The script measures itself: the steps per second; the main thread's time queueing the forward, in the seven
data-dependent selections (the first apart: it waits for the forward pass; the others are round trips, the GPU nearly
idle), in the rest of the loss, in backward() and the optimiser step, in loss.item(); the synchronisations a step makes
(counted once before the run with torch.cuda.set_sync_debug_mode("warn"), then off); the main thread's time on a CPU
and waiting for one over the run (/proc/thread-self/schedstat), the process's minor page faults, the device
allocator's cudaMalloc calls; and a step's GPU time queued (common.gpu_seconds_queued on the same step with the
selections' indices known beforehand: the same gathers by index, without the nonzero and unique passes' own small
kernels), so that the GPU's busy share is known."""

import contextlib
import resource
import time
import warnings

from common import Scenario, gpu_seconds_queued

sc = Scenario("natural_nonzero_masked_loss", "natural", "a token-classification Transformer whose loss selects tokens "
              "by boolean masks, torch.unique, torch.nonzero and masked_select (seven syncs a step), loss.item() each "
              "step, 20 s, nothing staged", job_cpus=[2, 3], control=True)
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

dev = torch.device(sc.device)
VOCAB, NTAGS, O_TAG, IGNORE, CORPUS = 32000, 17, 0, -100, 4096
SEQ, BATCH, D, LAYERS, HEADS = (512, 32, 512, 4, 8) if sc.cuda else (64, 8, 32, 1, 4)
if not sc.cuda:
    CORPUS = 256
torch.manual_seed(0)
gen = torch.Generator(device=dev).manual_seed(0)


def make_corpus() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Token ids (Zipf-like), BIO labels (entity mentions are runs of tokens from each type's id range), padding."""
    u = torch.rand(CORPUS, SEQ, device=dev, generator=gen)
    tokens = (VOCAB * u.pow(3.0)).long().clamp_(3, VOCAB - 1)
    labels = torch.full((CORPUS, SEQ), O_TAG, dtype=torch.long, device=dev)
    start = torch.rand(CORPUS, SEQ, device=dev, generator=gen) < 0.06
    etype = torch.randint(0, 8, (CORPUS, SEQ), device=dev, generator=gen)
    span = torch.randint(1, 4, (CORPUS, SEQ), device=dev, generator=gen)
    for off in range(3):  # a mention: B- at its start, I- on the next span-1 tokens
        hit = torch.roll(start & (span > off), off, dims=1)
        tag = torch.roll(1 + 2 * etype + (1 if off else 0), off, dims=1)
        labels = torch.where(hit, tag, labels)
        tokens = torch.where(hit, 30000 + torch.roll(etype, off, dims=1) * 250 + tokens % 250, tokens)
    lengths = torch.randint(SEQ // 4, SEQ + 1, (CORPUS, 1), device=dev, generator=gen)
    pad = torch.arange(SEQ, device=dev)[None] >= lengths
    tokens[pad] = 0
    labels[pad] = IGNORE
    piece = (torch.rand(CORPUS, SEQ, device=dev, generator=gen) < 0.15) & (labels == O_TAG)
    labels[piece] = IGNORE  # word-piece continuations carry no label
    return tokens, labels, pad


class Tagger(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = torch.nn.Embedding(VOCAB, D, padding_idx=0)
        self.pos = torch.nn.Parameter(torch.randn(SEQ, D) * 0.02)
        layer = torch.nn.TransformerEncoderLayer(D, HEADS, 4 * D, dropout=0.1, batch_first=True, norm_first=True)
        self.body = torch.nn.TransformerEncoder(layer, LAYERS, enable_nested_tensor=False)
        self.head = torch.nn.Linear(D, NTAGS)

    def forward(self, ids: torch.Tensor, pad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = self.body(self.emb(ids) + self.pos, src_key_padding_mask=pad)
        return h, self.head(h)


clock = {"s": 0.0, "n": 0, "first_s": 0.0, "first_end": None}


@contextlib.contextmanager
def selecting():
    """Time one data-dependent selection (its wait for the GPU included); the step's first is kept apart."""
    t0 = time.perf_counter()
    yield
    t1 = time.perf_counter()
    if clock["first_end"] is None:
        clock["first_s"] += t1 - t0
        clock["first_end"] = t1
    clock["s"] += t1 - t0
    clock["n"] += 1


def masked_loss(hidden: torch.Tensor, logits: torch.Tensor, labels: torch.Tensor, known: dict | None = None):
    """Weighted cross-entropy over the valid tokens, a hard-negative margin and a confidence penalty. `known`: the
    selections' indices found beforehand (for timing the GPU's work without the host's waits)."""
    if known is None:
        valid = labels != IGNORE
        with selecting():
            h = hidden[valid]
        with selecting():
            z = logits[valid]
        with selecting():
            y = labels[valid]
        with selecting():
            classes, counts = torch.unique(y, return_counts=True)
        with selecting():
            ent = torch.nonzero(y != O_TAG).squeeze(1)
        with selecting():
            neg = torch.nonzero(y == O_TAG).squeeze(1)
    else:
        flat = known["valid"]
        h, z, y = hidden.flatten(0, 1)[flat], logits.flatten(0, 1)[flat], labels.flatten()[flat]
        classes, counts, ent, neg = known["classes"], known["counts"], known["ent"], known["neg"]
    weight = torch.zeros(NTAGS, device=z.device)
    weight[classes] = len(y) / (len(classes) * counts.float())
    ce = F.cross_entropy(z.float(), y, weight=weight)
    k = min(3 * len(ent), len(neg))
    hard = neg[torch.topk(z[neg, O_TAG].float(), k, largest=False).indices]
    proto = h[ent].float().mean(0, keepdim=True)
    margin = F.relu(0.2 + F.cosine_similarity(h[hard].float(), proto, dim=-1)).mean()
    top = z.float().softmax(-1).amax(-1)
    if known is None:
        with selecting():
            conf = top.masked_select(y == O_TAG)
    else:
        conf = top[neg]
    return ce + 0.1 * margin + 0.01 * conf.mean()


tokens, labels, pads = make_corpus()
model = Tagger().to(dev)
opt = torch.optim.AdamW(model.parameters(), lr=2e-4, fused=sc.cuda or None)
own = {"steps": 0, "forward_s": 0.0, "loss_s": 0.0, "loss_after_first_s": 0.0, "backward_s": 0.0, "item_s": 0.0,
       "running_loss": 0.0}


def batch() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    idx = torch.randint(0, CORPUS, (BATCH,), device=dev, generator=gen)
    return tokens[idx], labels[idx], pads[idx]


def step() -> None:
    ids, y, pad = batch()
    t0 = time.perf_counter()
    with torch.autocast(sc.device, dtype=torch.bfloat16, enabled=sc.cuda):
        hidden, logits = model(ids, pad)
    t1 = time.perf_counter()
    clock["first_end"] = None
    loss = masked_loss(hidden, logits, y)
    t2 = time.perf_counter()
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    t3 = time.perf_counter()
    own["running_loss"] += loss.item()
    t4 = time.perf_counter()
    own["forward_s"] += t1 - t0
    own["loss_s"] += t2 - t1
    own["loss_after_first_s"] += t2 - (clock["first_end"] or t1)
    own["backward_s"] += t3 - t2
    own["item_s"] += t4 - t3
    own["steps"] += 1


def sync() -> None:
    if sc.cuda:
        torch.cuda.synchronize()


def syncs_per_step(n: int = 3) -> float | None:
    """The synchronisations n steps make, per step, as CUDA's sync debug mode reports them (then off again)."""
    if not sc.cuda:
        return None
    sync()
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            for _ in range(n):
                step()
        finally:
            torch.cuda.set_sync_debug_mode("default")
    return sum("synchroniz" in str(w.message) for w in seen) / n


def schedstat() -> tuple[float, float | None]:
    try:
        with open("/proc/thread-self/schedstat") as fh:
            run_ns, wait_ns = fh.read().split()[:2]
        return int(run_ns) / 1e9, int(wait_ns) / 1e9
    except (OSError, ValueError):
        return time.thread_time(), None


def mallocs() -> int:
    return int(torch.cuda.memory_stats().get("segment.all.allocated", 0)) if sc.cuda else 0


for _ in range(15):
    step()
sync_count = syncs_per_step()
gpu_step_s = None
if sc.cuda:
    fixed = batch()
    valid = (fixed[1] != IGNORE).flatten()
    flat_y = fixed[1].flatten()[valid.nonzero().squeeze(1)]
    classes, counts = torch.unique(flat_y, return_counts=True)
    known = {"valid": valid.nonzero().squeeze(1), "classes": classes, "counts": counts,
             "ent": (flat_y != O_TAG).nonzero().squeeze(1), "neg": (flat_y == O_TAG).nonzero().squeeze(1)}

    def work(_) -> None:
        """One step's GPU work on the fixed batch, its selections' indices known: nothing read back."""
        with torch.autocast(sc.device, dtype=torch.bfloat16):
            hidden, logits = model(fixed[0], fixed[2])
        loss = masked_loss(hidden, logits, fixed[1], known)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    work(None)
    sync()
    runs = sorted(r for r in (gpu_seconds_queued(torch, work) for _ in range(5)) if r is not None)
    gpu_step_s = runs[len(runs) // 2] if runs else None
warm_end = time.perf_counter() + 2.0 * sc.scale  # the spin kernels well before the baseline
while time.perf_counter() < warm_end:
    step()
sync()
for k in own:
    own[k] = 0 if k == "steps" else 0.0
clock.update(s=0.0, n=0, first_s=0.0)
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
f1 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
m1 = mallocs()
n = own["steps"]
gpu_busy = n * gpu_step_s if gpu_step_s is not None else None


def share(v: float | None) -> float | None:
    return round(v / wall, 4) if v is not None else None


issue = own["forward_s"] + own["loss_s"] - clock["s"] + own["backward_s"]
sc.extra["self"] = {**{k: round(v, 4) for k, v in own.items()}, "wall_s": round(wall, 4),
                    "steps_per_s": round(n / wall, 2), "step_ms_mean": round(wall / max(n, 1) * 1e3, 4),
                    "select_s": round(clock["s"], 4), "selects": clock["n"],
                    "selects_per_step": round(clock["n"] / max(n, 1), 2),
                    "select_share": share(clock["s"]), "first_select_s": round(clock["first_s"], 4),
                    "first_select_share": share(clock["first_s"]),
                    "other_selects_s": round(clock["s"] - clock["first_s"], 4),
                    "other_selects_share": share(clock["s"] - clock["first_s"]),
                    "loss_share": share(own["loss_s"]), "loss_after_first_share": share(own["loss_after_first_s"]),
                    "forward_share": share(own["forward_s"]), "backward_share": share(own["backward_s"]),
                    "item_share": share(own["item_s"]), "sync_share": share(clock["s"] + own["item_s"]),
                    "issue_s": round(issue, 4), "issue_share": share(issue),
                    "syncs_per_step": sync_count,
                    "main_cpu_share": round((run1 - run0) / wall, 4),
                    "main_cpu_wait_share": round((wait1 - wait0) / wall, 4) if wait0 is not None else None,
                    "minor_faults_per_s": round((f1 - f0) / wall, 1),
                    "cuda_mallocs_per_s": round((m1 - m0) / wall, 3),
                    "gpu_step_ms": round(gpu_step_s * 1e3, 4) if gpu_step_s is not None else None,
                    "gpu_busy_s": round(gpu_busy, 4) if gpu_busy is not None else None,
                    "gpu_busy_share": share(gpu_busy), "batch": BATCH, "seq": SEQ}
sc.note(f"natural: measured by the script: {n} steps ({n / wall:.1f}/s) in {wall:.2f} s: {own['forward_s']:.2f} s "
        f"queueing the forward, {own['loss_s']:.2f} s in the loss, of which {clock['s']:.2f} s in its {clock['n']} "
        f"data-dependent selections ({clock['first_s']:.2f} s in each step's first, which waits for the forward), "
        f"{own['backward_s']:.2f} s in backward and the optimiser, {own['item_s']:.2f} s in loss.item(); "
        f"{sync_count} synchronisations a step (sync debug mode); the main thread ran {run1 - run0:.2f} s; "
        + (f"a step's kernels take {gpu_step_s * 1e3:.2f} ms of GPU time queued (GPU busy {gpu_busy / wall:.0%} of the "
           "run)." if gpu_busy is not None else "no GPU timings (no CUDA)."))
sc.write_truth(baseline=(b0, b1), window=None, ratio_spans=((b0, mid), (mid, b1)))
