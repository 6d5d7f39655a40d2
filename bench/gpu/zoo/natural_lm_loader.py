"""natural_lm_loader (natural, nothing staged): a small Transformer language model (4 layers, d 512, sequences of 256
tokens, batch 32) trained from a DataLoader with 2 workers whose Dataset tokenises text in Python (split, a vocabulary
lookup per word), as a first LM script does. Main thread on CPU 2, workers on CPUs 3-4, 20 s. The script measures
itself: the time the main thread spent in next() on the loader (waiting for batches) and in its steps (forward,
backward, optimiser, loss.item()). The report's accounting of the main thread must agree with those."""

import os
import time

import numpy as np

from common import Scenario, map_cpus

sc = Scenario("natural_lm_loader", "natural", "a small Transformer LM trained from a 2-worker DataLoader that "
              "tokenises in Python, 20 s, nothing staged", job_cpus=[2], culprit_cpus=[3, 4], control=True)
import torch  # noqa: E402

dev = torch.device(sc.device)
VOCAB, SEQ, BATCH = 5000, 256, 32
D, LAYERS = (512, 4) if sc.cuda else (64, 1)
WORKER_CPUS = map_cpus([3, 4])


class Corpus(torch.utils.data.Dataset):
    """Sample i: SEQ + 1 token ids from text, tokenised here word by word (split, a dict lookup, unknown -> 0)."""

    def __init__(self) -> None:
        rng = np.random.default_rng(0)
        words = [f"w{k}" for k in range(VOCAB - 1)]
        self.vocab = {w: k + 1 for k, w in enumerate(words)}
        self.docs = [" ".join(words[j] for j in rng.zipf(1.3, 400) % (VOCAB - 1)) for _ in range(512)]

    def __len__(self) -> int:
        return 1 << 30

    def __getitem__(self, i: int) -> torch.Tensor:
        text = self.docs[i % len(self.docs)] + " " + self.docs[(i * 7 + 1) % len(self.docs)]
        ids = [self.vocab.get(w.lower().strip(".,"), 0) for w in text.split()][: SEQ + 1]
        ids += [0] * (SEQ + 1 - len(ids))
        return torch.tensor(ids, dtype=torch.long)


def pin_worker(k: int) -> None:
    os.sched_setaffinity(0, [WORKER_CPUS[k % len(WORKER_CPUS)]])


class LM(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = torch.nn.Embedding(VOCAB, D)
        layer = torch.nn.TransformerEncoderLayer(D, 8, 4 * D, batch_first=True, dropout=0.0)
        self.body = torch.nn.TransformerEncoder(layer, LAYERS)
        self.head = torch.nn.Linear(D, VOCAB)
        self.register_buffer("mask", torch.nn.Transformer.generate_square_subsequent_mask(SEQ))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(self.emb(x), mask=self.mask, is_causal=True))


torch.manual_seed(0)
model = LM().to(dev)
opt = torch.optim.AdamW(model.parameters(), lr=3e-4, fused=sc.cuda or None)
loader = torch.utils.data.DataLoader(Corpus(), batch_size=BATCH, num_workers=2, pin_memory=sc.cuda,
                                     persistent_workers=True, worker_init_fn=pin_worker)
it = iter(loader)
own = {"wait_s": 0.0, "step_s": 0.0, "steps": 0}


def step() -> None:
    t0 = time.perf_counter()
    batch = next(it)
    t1 = time.perf_counter()
    batch = batch.to(dev, non_blocking=True)
    with torch.autocast(sc.device, dtype=torch.bfloat16, enabled=sc.cuda):
        logits = model(batch[:, :-1])
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, VOCAB).float(), batch[:, 1:].reshape(-1))
    loss.backward()
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
                    "wait_share": round(own["wait_s"] / wall, 4), "step_share": round(own["step_s"] / wall, 4)}
sc.extra["workers"] = [w.pid for w in it._workers]
sc.note(f"natural: measured by the script over the run: {own['steps']} steps, {own['wait_s']:.2f} s in next() on "
        f"the loader, {own['step_s']:.2f} s in steps, of {wall:.2f} s.")
sc.write_truth(baseline=(b0, b1), window=None, ratio_spans=((b0, mid), (mid, b1)))
