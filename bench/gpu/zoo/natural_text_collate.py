"""natural_text_collate (natural, nothing staged): a text classifier as a first script trains one: a Dataset of
synthetic sentences (each sample a random sentence of 20-80 words, drawn from a Zipf law over 20,000 made-up words), a
DataLoader with 2 workers (on CPUs 3-4) whose Python collate_fn tokenises the batch (NFKC, lowercase, a regex split into
words and punctuation, a vocabulary lookup per word, greedy longest-match word pieces for words not in it), pads it and
builds the id, mask and label tensors; a small Transformer encoder classifier (4 layers, d 256, batch 256, bf16
autocast) trained on the GPU, loss.item() each step. Main thread on CPU 2, 20 s. The script measures itself: the main
thread's time in next() on the loader (waiting for batches) and in its steps."""

import os
import re
import time
import unicodedata

import numpy as np

from common import Scenario, map_cpus

sc = Scenario("natural_text_collate", "natural", "a Transformer text classifier fed by a 2-worker DataLoader whose "
              "collate_fn tokenises in Python, 20 s, nothing staged", job_cpus=[2], culprit_cpus=[3, 4], control=True)
import torch  # noqa: E402

dev = torch.device(sc.device)
BATCH, MAXLEN, NCLASS = 256, 128, 4
D, LAYERS = (256, 4) if sc.cuda else (64, 1)
WORKER_CPUS = map_cpus([3, 4])
WORDS_RE = re.compile(r"\w+|[^\w\s]")
SYLLABLES = ["ka", "lo", "mi", "ne", "ru", "ta", "vo", "shi", "pe", "da", "gor", "lin", "ex", "ban", "tri", "os"]


def make_words(n: int, rng: np.random.Generator) -> list[str]:
    words: set[str] = set()
    while len(words) < n:
        words.add("".join(SYLLABLES[k] for k in rng.integers(0, len(SYLLABLES), rng.integers(1, 5))))
    return sorted(words)


class Sentences(torch.utils.data.Dataset):
    """Sample i: (a sentence of 20-80 words, its label); the label is the first of four topic words it holds."""

    def __init__(self) -> None:
        self.words = make_words(20_000, np.random.default_rng(0))
        self.topics = self.words[:NCLASS]

    def __len__(self) -> int:
        return 1 << 30

    def __getitem__(self, i: int) -> tuple[str, int]:
        rng = np.random.default_rng(i)
        picks = (rng.zipf(1.1, rng.integers(20, 81)) - 1) % len(self.words)
        words = [self.words[k] for k in picks]
        label = int(rng.integers(0, NCLASS))
        words[int(rng.integers(0, len(words)))] = self.topics[label]
        text = " ".join(w.capitalize() if rng.random() < 0.1 else w for w in words)
        return text + rng.choice([".", "!", "?"]), label


class Tokenizer:
    """BERT-like, in Python: NFKC, lowercase, words and punctuation apart (a regex), whole words for the 2,000 most
    common, greedy longest-match word pieces (a syllable, '##' + a syllable) for the rest, [UNK] else."""

    def __init__(self, words: list[str]) -> None:
        pieces = ["[PAD]", "[UNK]", ".", "!", "?"] + words[:2000] + SYLLABLES + ["##" + s for s in SYLLABLES]
        self.vocab: dict[str, int] = {}
        for p in pieces:
            self.vocab.setdefault(p, len(self.vocab))

    def encode(self, text: str) -> list[int]:
        ids = []
        for word in WORDS_RE.findall(unicodedata.normalize("NFKC", text).lower()):
            k = self.vocab.get(word)
            if k is not None:
                ids.append(k)
                continue
            start = 0
            while start < len(word):  # greedy longest match, WordPiece style
                for end in range(len(word), start, -1):
                    piece = word[start:end] if start == 0 else "##" + word[start:end]
                    if piece in self.vocab:
                        ids.append(self.vocab[piece])
                        start = end
                        break
                else:
                    ids.append(1)
                    break
        return ids[:MAXLEN]


dataset = Sentences()
tok = Tokenizer(dataset.words)
VOCAB = len(tok.vocab)


def collate(samples: list[tuple[str, int]]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    rows = [tok.encode(text) for text, _ in samples]
    width = max(len(r) for r in rows)
    ids = torch.tensor([r + [0] * (width - len(r)) for r in rows], dtype=torch.long)
    return ids, ids == 0, torch.tensor([label for _, label in samples], dtype=torch.long)


def pin_worker(k: int) -> None:
    os.sched_setaffinity(0, [WORKER_CPUS[k % len(WORKER_CPUS)]])


class Classifier(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = torch.nn.Embedding(VOCAB, D, padding_idx=0)
        self.pos = torch.nn.Embedding(MAXLEN, D)
        layer = torch.nn.TransformerEncoderLayer(D, 4, 4 * D, batch_first=True, dropout=0.1)
        self.body = torch.nn.TransformerEncoder(layer, LAYERS, enable_nested_tensor=False)
        self.head = torch.nn.Linear(D, NCLASS)

    def forward(self, ids: torch.Tensor, pad: torch.Tensor) -> torch.Tensor:
        h = self.emb(ids) + self.pos(torch.arange(ids.shape[1], device=ids.device))
        h = self.body(h, src_key_padding_mask=pad)
        keep = (~pad).unsqueeze(-1).to(h.dtype)
        return self.head((h * keep).sum(1) / keep.sum(1).clamp(min=1.0))


torch.manual_seed(0)
model = Classifier().to(dev)
opt = torch.optim.AdamW(model.parameters(), lr=3e-4, fused=sc.cuda or None)
loader = torch.utils.data.DataLoader(dataset, batch_size=BATCH, num_workers=2, collate_fn=collate,
                                     pin_memory=sc.cuda, persistent_workers=True, worker_init_fn=pin_worker)
it = iter(loader)
own = {"wait_s": 0.0, "step_s": 0.0, "steps": 0}


def step() -> None:
    t0 = time.perf_counter()
    ids, pad, y = next(it)
    t1 = time.perf_counter()
    ids, pad, y = ids.to(dev, non_blocking=True), pad.to(dev, non_blocking=True), y.to(dev, non_blocking=True)
    with torch.autocast(sc.device, dtype=torch.bfloat16, enabled=sc.cuda):
        loss = torch.nn.functional.cross_entropy(model(ids, pad).float(), y)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    opt.zero_grad(set_to_none=True)
    loss.item()
    t2 = time.perf_counter()
    own["wait_s"] += t1 - t0
    own["step_s"] += t2 - t1
    own["steps"] += 1


for _ in range(10):
    step()
own.update(wait_s=0.0, step_s=0.0, steps=0)
b0 = sc.mark("baseline")
t = time.perf_counter()
sc.run_for(10.0 * sc.scale, step)
mid = sc.mark("half")
sc.run_for(10.0 * sc.scale, step)
b1 = sc.mark("end")
wall = time.perf_counter() - t
sc.extra["self"] = {**{k: round(v, 4) for k, v in own.items()}, "wall_s": round(wall, 4),
                    "wait_share": round(own["wait_s"] / wall, 4), "step_share": round(own["step_s"] / wall, 4),
                    "batch": BATCH}
sc.extra["workers"] = [w.pid for w in it._workers]
sc.note(f"natural: measured by the script over the run: {own['steps']} steps, {own['wait_s']:.2f} s in next() on "
        f"the loader, {own['step_s']:.2f} s in steps, of {wall:.2f} s.")
sc.write_truth(baseline=(b0, b1), window=None, ratio_spans=((b0, mid), (mid, b1)))
