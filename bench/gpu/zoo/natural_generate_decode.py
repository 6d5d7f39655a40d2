"""natural_generate_decode (natural, nothing staged): text generation as a first script writes it: a small decoder-only
Transformer (6 layers, d 512, 8 heads, vocabulary 8192, bf16 weights, torch.nn modules and scaled_dot_product_attention
with a preallocated KV cache) under torch.inference_mode; requests back to back, each a batch of 4 prompts of 32
tokens, a prefill, then up to 128 new tokens by greedy argmax, each read back with .tolist() to check for the end token
(a synchronisation per token) and append it to each row's text. CPU 2, 20 s. The script measures itself: the wall time
per token, the time in the per-token .tolist(), and the GPU's own time for one token's forward and one prefill,
measured with their kernels queued behind a spin kernel (common.gpu_seconds_queued), so that the GPU's busy share of
the run is known. Steps are tokens generated (the prefill's first token included)."""

import time

from common import Scenario, gpu_seconds_queued

sc = Scenario("natural_generate_decode", "natural", "greedy text generation with a 6-layer decoder and a KV cache, "
              "batch 4, a .tolist() per token, 20 s, nothing staged", job_cpus=[2], control=True)
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

dev = torch.device(sc.device)
VOCAB, PROMPT, NEW, BATCH, EOS = 8192, 32, 128, 4, 2
D, HEADS, LAYERS = (512, 8, 6) if sc.cuda else (128, 4, 2)
DH, MAXPOS = D // HEADS, PROMPT + NEW
DTYPE = torch.bfloat16 if sc.cuda else torch.float32


class Block(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.ln1, self.ln2 = torch.nn.LayerNorm(D), torch.nn.LayerNorm(D)
        self.qkv = torch.nn.Linear(D, 3 * D, bias=False)
        self.proj = torch.nn.Linear(D, D, bias=False)
        self.fc, self.out = torch.nn.Linear(D, 4 * D), torch.nn.Linear(4 * D, D)
        self.register_buffer("k", torch.zeros(BATCH, HEADS, MAXPOS, DH), persistent=False)
        self.register_buffer("v", torch.zeros(BATCH, HEADS, MAXPOS, DH), persistent=False)

    def forward(self, x: torch.Tensor, pos: int) -> torch.Tensor:
        b, t, _ = x.shape
        q, k, v = (z.view(b, t, HEADS, DH).transpose(1, 2) for z in self.qkv(self.ln1(x)).split(D, -1))
        self.k[:, :, pos:pos + t] = k
        self.v[:, :, pos:pos + t] = v
        a = F.scaled_dot_product_attention(q, self.k[:, :, :pos + t], self.v[:, :, :pos + t], is_causal=t > 1)
        x = x + self.proj(a.transpose(1, 2).reshape(b, t, D))
        return x + self.out(F.gelu(self.fc(self.ln2(x))))


class Decoder(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb, self.pos = torch.nn.Embedding(VOCAB, D), torch.nn.Embedding(MAXPOS, D)
        self.blocks = torch.nn.ModuleList(Block() for _ in range(LAYERS))
        self.ln, self.head = torch.nn.LayerNorm(D), torch.nn.Linear(D, VOCAB, bias=False)

    def forward(self, ids: torch.Tensor, pos: int) -> torch.Tensor:
        x = self.emb(ids) + self.pos(torch.arange(pos, pos + ids.shape[1], device=ids.device))
        for block in self.blocks:
            x = block(x, pos)
        return self.head(self.ln(x[:, -1]))  # the last position's logits: all greedy decoding needs


torch.manual_seed(0)
model = Decoder().to(dev, DTYPE).eval()
own = {"tokens": 0, "requests": 0, "finished_early": 0, "sync_s": 0.0, "prefill_s": 0.0, "decode_s": 0.0}
texts: list[list[list[int]]] = []


def prompts(r: int) -> list[list[int]]:
    """What a tokenizer would hand over: BATCH lists of PROMPT ids (made up, the same for the same request number)."""
    g = torch.Generator().manual_seed(r)
    return torch.randint(3, VOCAB, (BATCH, PROMPT), generator=g).tolist()


def read(nxt: torch.Tensor) -> list[int]:
    s = time.perf_counter()
    ids = nxt.tolist()
    own["sync_s"] += time.perf_counter() - s
    return ids


@torch.inference_mode()
def next_ids(ids: torch.Tensor, pos: int) -> torch.Tensor:
    """The greedy next token of each row, on the GPU (nothing read back)."""
    return model(ids.view(BATCH, -1), pos).argmax(-1)


def generate():
    """Requests back to back; yields after each token (a step)."""
    r = 0
    while True:
        r += 1
        t0 = time.perf_counter()
        nxt = next_ids(torch.tensor(prompts(r), device=dev), 0)
        out, done = [[] for _ in range(BATCH)], [False] * BATCH
        for k, tok in enumerate(read(nxt)):
            out[k].append(tok)
            done[k] = tok == EOS
        own["prefill_s"] += time.perf_counter() - t0
        own["tokens"] += 1
        yield
        for i in range(1, NEW):
            if all(done):
                own["finished_early"] += 1
                break
            t0 = time.perf_counter()
            nxt = next_ids(nxt, PROMPT + i - 1)
            for k, tok in enumerate(read(nxt)):
                if not done[k]:
                    out[k].append(tok)
                    done[k] = tok == EOS
            own["decode_s"] += time.perf_counter() - t0
            own["tokens"] += 1
            yield
        texts.append(out)
        del texts[:-4]
        own["requests"] += 1


gen = generate()


def step() -> None:
    next(gen)


for _ in range(3 * NEW):  # warm-up: three requests, every KV-cache length once
    step()
gpu_token_s = gpu_prefill_s = None
if sc.cuda:
    one = torch.full((BATCH, 1), 5, device=dev)
    many = torch.full((BATCH, PROMPT), 5, device=dev)
    runs = sorted(r for r in (gpu_seconds_queued(torch, lambda _: next_ids(one, PROMPT + NEW // 2))
                              for _ in range(5)) if r is not None)
    gpu_token_s = runs[len(runs) // 2] if runs else None
    runs = sorted(r for r in (gpu_seconds_queued(torch, lambda _: next_ids(many, 0)) for _ in range(5))
                  if r is not None)
    gpu_prefill_s = runs[len(runs) // 2] if runs else None
gen = generate()  # a fresh request: the KV cache was written by the timings
warm_end = time.perf_counter() + 2.0 * sc.scale  # the spin kernels well before the baseline
while time.perf_counter() < warm_end:
    step()
if sc.cuda:
    torch.cuda.synchronize()
own.update(tokens=0, requests=0, finished_early=0, sync_s=0.0, prefill_s=0.0, decode_s=0.0)
b0 = sc.mark("baseline")
t = time.perf_counter()
sc.run_for(10.0 * sc.scale, step)
mid = sc.mark("half")
sc.run_for(10.0 * sc.scale, step)
b1 = sc.mark("end")
wall = time.perf_counter() - t
n, prefills = own["tokens"], own["requests"] + 1  # the request under way at the end had its prefill
gpu_busy = ((n - prefills) * gpu_token_s + prefills * gpu_prefill_s
            if gpu_token_s is not None and gpu_prefill_s is not None else None)
sc.extra["self"] = {**{k: round(v, 4) for k, v in own.items()}, "wall_s": round(wall, 4),
                    "tokens_per_s": round(n / wall, 2), "wall_per_token_ms": round(wall / n * 1e3, 4),
                    "sync_share": round(own["sync_s"] / wall, 4),
                    "sync_per_token_ms": round(own["sync_s"] / n * 1e3, 4),
                    "gpu_token_ms": round(gpu_token_s * 1e3, 4) if gpu_token_s is not None else None,
                    "gpu_prefill_ms": round(gpu_prefill_s * 1e3, 4) if gpu_prefill_s is not None else None,
                    "gpu_busy_share": round(gpu_busy / wall, 4) if gpu_busy is not None else None,
                    "batch": BATCH, "prompt": PROMPT, "new_tokens": NEW, "layers": LAYERS, "d_model": D}
sc.note(f"natural: measured by the script: {n} tokens ({own['requests']} requests of {BATCH} prompts) in {wall:.2f} s "
        f"({wall / n * 1e3:.3f} ms a token), {own['sync_s']:.2f} s in the per-token .tolist(); "
        + (f"a token's forward takes {gpu_token_s * 1e3:.3f} ms of GPU time queued, a prefill "
           f"{gpu_prefill_s * 1e3:.3f} ms (GPU busy {gpu_busy / wall:.0%} of the run)." if gpu_busy is not None
           else "no GPU timings (no CUDA)."))
sc.write_truth(baseline=(b0, b1), window=None, ratio_spans=((b0, mid), (mid, b1)))
