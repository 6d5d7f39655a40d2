"""natural_jsonl_single_worker (natural, nothing staged): a text classifier trained from a JSON-lines file of documents
through a DataLoader with one worker, as a first text-classification script reads its corpus. At set-up the script
writes the corpus to the local disk (a file under /var/tmp, 250 MB on the GPU run: ~60,000 documents of ~550 words on
average, sentences from a common pool and from their topic's own, over a synthetic 30,000-word vocabulary, with a
title, a topic label of 20 and some metadata, one json.dumps line each; fewer with --device cpu / --scale), then
indexes its lines' byte offsets (one pass); the file stays in the page cache. A map-style Dataset opens the file
in the worker, seeks to the line, parses it with json.loads and tokenises it in pure Python (title and text, lower(),
split(), punctuation stripped, a vocabulary dict lookup per word, unknown words to one id, a [CLS] id first, cut at 256
tokens); a collate_fn pads the batch to its longest document and builds the padding mask. DataLoader(batch_size=128,
shuffle=True, num_workers=1, pin_memory=True, persistent_workers=True, drop_last=True): one worker, on the job's CPUs
2-3 (it inherits them) with the main process; a new epoch's iterator when one ends. The model: an embedding (d 256),
a 2-layer nn.TransformerEncoder (4 heads, feed-forward 1024, dropout 0.1), a masked mean pool and a linear head, bf16
autocast, fused AdamW, loss.item() each step: a few milliseconds of GPU work a batch, so that the GPU waits for the
worker (smaller with --device cpu: sequences of 64, batch 32, d 32, one layer). 20 s. The file is removed at the end.

The script measures itself: the steps per second; the main thread's time in next() on the loader (wall and its CPU
time, thread_time) and in its steps (copy, forward, backward, optimiser, .item()); the worker's time per sample in
reading the line, json.loads and tokenising (its clocks, summed in shared memory: wall and the worker's CPU time); the
worker process's CPU time and run-queue wait over the run (/proc/PID/task/*/schedstat at the run's start and end), its
bytes read from storage (/proc/PID/io read_bytes) and page faults; the main thread's schedstat over the run and the main
process's page faults, the allocators' counters (cudaHostAlloc, cudaMalloc calls); and a step's GPU time queued
(common.gpu_seconds_queued on a batch from the loader, pinned), so that the GPU's busy share is known. Truth `workers`
names the worker (pid, tids, comm), `corpus` the file."""

import json
import multiprocessing
import os
import resource
import tempfile
import time

import numpy as np

from common import Scenario, comm_of, gpu_seconds_queued, tids_of

sc = Scenario("natural_jsonl_single_worker", "natural", "a Transformer text classifier fed by a 1-worker DataLoader "
              "that reads a JSON-lines corpus on the local disk, json.loads and tokenises in Python, 20 s, nothing "
              "staged", job_cpus=[2, 3], control=True)
import torch  # noqa: E402

dev = torch.device(sc.device)
VOCAB, NCLASS = 30000, 20
SEQ, BATCH, D, LAYERS = (256, 128, 256, 2) if sc.cuda else (64, 32, 32, 1)
TARGET_BYTES = (250e6 if sc.cuda else 20e6) * min(1.0, sc.scale)
PAD, UNK, CLS = 0, 1, 2
PUNCT = ".,;:!?\"'()"
ROOT = "/var/tmp" if os.access("/var/tmp", os.W_OK) else None
# per worker: (samples, read wall, json.loads wall, tokenise wall, CPU time) summed, shared with the forked worker
STATS = multiprocessing.RawArray("d", 5)
fd, CORPUS = tempfile.mkstemp(prefix="zoo_jsonl_", suffix=".jsonl", dir=ROOT)
os.close(fd)


def make_words(rng: np.random.Generator) -> list[str]:
    letters = np.array(list("abcdefghijklmnopqrstuvwxyz"))
    words: set[str] = set()
    while len(words) < VOCAB - 3:
        n = int(rng.integers(2, 11))
        words.add("".join(letters[rng.integers(0, 26, n)]))
    return sorted(words)


def sentences(rng: np.random.Generator, words: list[str], ids: np.ndarray, count: int) -> list[str]:
    """`count` sentences of 6-20 words drawn from `ids` (Zipf-ranked), capitalised, a comma inside, a full stop."""
    out = []
    for n in rng.integers(6, 21, count).tolist():
        toks = [words[i] for i in ids[rng.zipf(1.2, n) % len(ids)].tolist()]
        toks[0] = toks[0].capitalize()
        toks[n // 2] += ","
        out.append(" ".join(toks) + ".")
    return out


def write_corpus() -> dict:
    """The corpus: one JSON document a line, until TARGET_BYTES; returns what was written and how long it took. The
    documents are made of sentences from a common pool and from their topic's own pool."""
    t0 = time.perf_counter()
    rng = np.random.default_rng(0)
    words = make_words(rng)
    common = sentences(rng, words, rng.permutation(len(words)), 6000)
    topical = [sentences(rng, words, rng.permutation(len(words))[:400], 300) for _ in range(NCLASS)]
    docs = written = 0
    with open(CORPUS, "w") as fh:
        while written < TARGET_BYTES:
            chunk = []
            lens = np.clip(rng.lognormal(3.6, 0.6, 512).astype(int), 4, 160)  # sentences: ~550 words a document
            labels = rng.integers(0, NCLASS, 512).tolist()
            picks = rng.integers(0, len(common), int(lens.sum())).tolist()
            own = (rng.random(int(lens.sum())) < 0.3).tolist()
            at = 0
            for n, k in zip(lens.tolist(), labels):
                mine = topical[k]
                text = " ".join(mine[p % len(mine)] if o else common[p] for p, o in zip(picks[at:at + n],
                                                                                     own[at:at + n]))
                at += n
                chunk.append(json.dumps({"id": docs, "title": mine[docs % len(mine)][:60].rstrip(",. "),
                                         "text": text, "label": k, "source": f"crawl-{docs % 7}", "lang": "en",
                                         "meta": {"sentences": n, "ts": 1_700_000_000 + docs * 37}}) + "\n")
                docs += 1
            text = "".join(chunk)
            fh.write(text)
            written += len(text)
    t1 = time.perf_counter()
    return {"path": CORPUS, "docs": docs, "bytes": os.path.getsize(CORPUS), "write_s": round(t1 - t0, 3),
            "vocab": words}


def line_offsets(path: str) -> list[int]:
    offsets, pos = [], 0
    with open(path, "rb") as fh:
        for line in fh:
            offsets.append(pos)
            pos += len(line)
    return offsets


class JsonlDocs(torch.utils.data.Dataset):
    """Document i: its line read at its offset, json.loads, tokenised word by word; (ids, label)."""

    def __init__(self, path: str, offsets: list[int], vocab: dict[str, int]) -> None:
        self.path, self.offsets, self.vocab = path, offsets, vocab
        self.fh = None  # opened in the worker

    def __len__(self) -> int:
        return len(self.offsets)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        t0, c0 = time.perf_counter(), time.thread_time()
        if self.fh is None:
            self.fh = open(self.path, "rb")
        self.fh.seek(self.offsets[i])
        line = self.fh.readline()
        t1 = time.perf_counter()
        doc = json.loads(line)
        t2 = time.perf_counter()
        words = (doc["title"] + " " + doc["text"]).lower().split()
        ids = [CLS] + [self.vocab.get(w.strip(PUNCT), UNK) for w in words][: SEQ - 1]
        x = torch.tensor(ids, dtype=torch.long)
        t3 = time.perf_counter()
        STATS[0] += 1
        STATS[1] += t1 - t0
        STATS[2] += t2 - t1
        STATS[3] += t3 - t2
        STATS[4] += time.thread_time() - c0
        return x, doc["label"]


def collate(batch: list) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    longest = max(len(x) for x, _ in batch)
    ids = torch.full((len(batch), longest), PAD, dtype=torch.long)
    for r, (x, _) in enumerate(batch):
        ids[r, : len(x)] = x
    return ids, ids == PAD, torch.tensor([y for _, y in batch])


class Classifier(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = torch.nn.Embedding(VOCAB, D, padding_idx=PAD)
        layer = torch.nn.TransformerEncoderLayer(D, 4, 4 * D, dropout=0.1, batch_first=True)
        self.body = torch.nn.TransformerEncoder(layer, LAYERS, enable_nested_tensor=False)
        self.head = torch.nn.Linear(D, NCLASS)

    def forward(self, ids: torch.Tensor, pad: torch.Tensor) -> torch.Tensor:
        h = self.body(self.emb(ids), src_key_padding_mask=pad)
        keep = (~pad).unsqueeze(-1).to(h.dtype)
        return self.head((h * keep).sum(1) / keep.sum(1).clamp(min=1))


def schedstat(path: str) -> tuple[int, int] | None:
    try:
        with open(path) as fh:
            run, wait = fh.read().split()[:2]
        return int(run), int(wait)
    except (OSError, ValueError):
        return None


def process_schedstat(pid: int) -> dict[int, tuple[int, int] | None]:
    return {t: schedstat(f"/proc/{pid}/task/{t}/schedstat") for t in tids_of(pid)}


def proc_io(pid: int) -> dict[str, int] | None:
    try:
        with open(f"/proc/{pid}/io") as fh:
            return {k: int(v) for k, v in (line.split(":") for line in fh)}
    except (OSError, ValueError):
        return None


def alloc_counters() -> tuple[int, int] | None:
    """cudaHostAlloc calls (the caching host allocator's: pinned batches), cudaMalloc calls (the device allocator's)."""
    if not sc.cuda:
        return None
    try:
        host = int(torch.cuda.host_memory_stats().get("num_host_alloc", 0))
    except (RuntimeError, AttributeError):
        host = 0
    return host, int(torch.cuda.memory_stats().get("segment.all.allocated", 0))


def minflt(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return int(fh.read().rsplit(")", 1)[1].split()[7])
    except (OSError, ValueError, IndexError):
        return None


state: dict = {"it": None, "epochs": 0}
try:
    corpus = write_corpus()
    vocab = {w: k + 3 for k, w in enumerate(corpus.pop("vocab"))}
    t_index = time.perf_counter()
    offsets = line_offsets(CORPUS)
    corpus["index_s"] = round(time.perf_counter() - t_index, 3)
    print(f"[{sc.name}] corpus {corpus}", flush=True)
    torch.manual_seed(0)
    model = Classifier().to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, fused=sc.cuda or None)
    loader = torch.utils.data.DataLoader(JsonlDocs(CORPUS, offsets, vocab), batch_size=BATCH, shuffle=True,
                                         num_workers=1, collate_fn=collate, pin_memory=sc.cuda,
                                         persistent_workers=True, drop_last=True,
                                         generator=torch.Generator().manual_seed(0))
    state["it"] = iter(loader)
    own = {"steps": 0, "wait_s": 0.0, "wait_cpu_s": 0.0, "step_s": 0.0, "running_loss": 0.0}

    def train(ids: torch.Tensor, pad: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        ids, pad, y = (t.to(dev, non_blocking=True) for t in (ids, pad, y))
        with torch.autocast(sc.device, dtype=torch.bfloat16, enabled=sc.cuda):
            loss = torch.nn.functional.cross_entropy(model(ids, pad).float(), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        return loss

    def next_batch() -> tuple:
        try:
            return next(state["it"])
        except StopIteration:  # the epoch is over: the next one's iterator (the worker stays)
            state["it"] = iter(loader)
            state["epochs"] += 1
            return next(state["it"])

    def step() -> None:
        t0, c0 = time.perf_counter(), time.thread_time()
        batch = next_batch()
        t1, c1 = time.perf_counter(), time.thread_time()
        own["running_loss"] += train(*batch).item()
        t2 = time.perf_counter()
        own["wait_s"] += t1 - t0
        own["wait_cpu_s"] += c1 - c0
        own["step_s"] += t2 - t1
        own["steps"] += 1

    for _ in range(10):
        step()
    wpids = [w.pid for w in state["it"]._workers]
    gpu_step_s = None
    if sc.cuda:
        torch.cuda.synchronize()
        fixed = tuple(t.pin_memory() for t in next_batch())
        runs = sorted(r for r in (gpu_seconds_queued(torch, lambda _: train(*fixed)) for _ in range(5))
                      if r is not None)
        gpu_step_s = runs[len(runs) // 2] if runs else None
    warm_end = time.perf_counter() + 2.0 * sc.scale  # the spin kernels well before the baseline
    while time.perf_counter() < warm_end:
        step()
    if sc.cuda:
        torch.cuda.synchronize()
    for k in own:
        own[k] = 0 if k == "steps" else 0.0
    epochs0 = state["epochs"]
    s0 = list(STATS)
    w0 = {p: process_schedstat(p) for p in wpids}
    io0 = {p: proc_io(p) for p in wpids}
    wf0 = {p: minflt(p) for p in wpids}
    main0 = schedstat("/proc/thread-self/schedstat")
    f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    h0 = alloc_counters()
    b0 = sc.mark("baseline")
    t = time.perf_counter()
    sc.run_for(10.0 * sc.scale, step)
    mid = sc.mark("half")
    sc.run_for(10.0 * sc.scale, step)
    b1 = sc.mark("end")
    wall = time.perf_counter() - t
    main1 = schedstat("/proc/thread-self/schedstat")
    f1 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    h1 = alloc_counters()
    s1 = list(STATS)
    w1 = {p: process_schedstat(p) for p in wpids}
    io1 = {p: proc_io(p) for p in wpids}
    wf1 = {p: minflt(p) for p in wpids}
    workers = [{"pid": p, "tids": tids_of(p), "comm": comm_of(p)} for p in wpids]
finally:
    if state["it"] is not None:
        state["it"]._shutdown_workers()
    try:
        os.remove(CORPUS)
    except OSError:
        pass
n = own["steps"]


def share(v: float | None) -> float | None:
    return round(v / wall, 4) if v is not None else None


def worker_sum(p: int, k: int) -> float | None:
    """A worker process's threads' CPU time (k=0) or run-queue wait (k=1) over the run (s)."""
    got = [(z[k] - ((w0[p].get(t) or (0, 0))[k])) for t, z in w1[p].items() if z]
    return round(sum(got) / 1e9, 4) if got else None


samples, read_s, parse_s, tok_s, cpu_s = (b - a for a, b in zip(s0, s1))
per_worker = []
for p in wpids:
    a, z = io0[p], io1[p]
    fa, fz = wf0[p], wf1[p]
    per_worker.append({"pid": p, "run_s": worker_sum(p, 0), "cpu_wait_s": worker_sum(p, 1),
                       "cpu_share": share(worker_sum(p, 0)), "cpu_wait_share": share(worker_sum(p, 1)),
                       "disk_read_bytes": z["read_bytes"] - a["read_bytes"] if a and z else None,
                       "rchar": z["rchar"] - a["rchar"] if a and z else None,
                       "minor_faults_per_s": round((fz - fa) / wall, 1) if fa is not None and fz is not None
                       else None})
gpu_busy = n * gpu_step_s if gpu_step_s is not None else None
w = per_worker[0]
sc.extra["workers"] = workers
sc.extra["corpus"] = corpus
sc.extra["self"] = {**{k: round(v, 4) for k, v in own.items()}, "wall_s": round(wall, 4),
                    "steps_per_s": round(n / wall, 2), "epochs": state["epochs"] - epochs0,
                    "wait_share": share(own["wait_s"]), "wait_cpu_share": share(own["wait_cpu_s"]),
                    "step_share": share(own["step_s"]),
                    "samples": int(samples), "samples_per_s": round(samples / wall, 1),
                    "sample_us_wall": round((read_s + parse_s + tok_s) / max(samples, 1) * 1e6, 2),
                    "sample_us_cpu": round(cpu_s / max(samples, 1) * 1e6, 2),
                    "read_s": round(read_s, 4), "json_s": round(parse_s, 4), "tokenise_s": round(tok_s, 4),
                    "get_cpu_s": round(cpu_s, 4), "get_share": share(read_s + parse_s + tok_s),
                    "per_worker": per_worker, "worker_run_s": w["run_s"], "worker_cpu_share": w["cpu_share"],
                    "worker_cpu_wait_s": w["cpu_wait_s"], "worker_cpu_wait_share": w["cpu_wait_share"],
                    "worker_disk_read_bytes": w["disk_read_bytes"], "worker_rchar": w["rchar"],
                    "worker_minor_faults_per_s": w["minor_faults_per_s"],
                    "main_run_s": round((main1[0] - main0[0]) / 1e9, 4) if main0 and main1 else None,
                    "main_cpu_share": share((main1[0] - main0[0]) / 1e9) if main0 and main1 else None,
                    "main_cpu_wait_s": round((main1[1] - main0[1]) / 1e9, 4) if main0 and main1 else None,
                    "main_cpu_wait_share": share((main1[1] - main0[1]) / 1e9) if main0 and main1 else None,
                    "minor_faults_per_s": round((f1 - f0) / wall, 1),
                    "host_allocs_per_s": round((h1[0] - h0[0]) / wall, 3) if h0 and h1 else None,
                    "cuda_mallocs_per_s": round((h1[1] - h0[1]) / wall, 3) if h0 and h1 else 0.0,
                    "gpu_step_ms": round(gpu_step_s * 1e3, 4) if gpu_step_s is not None else None,
                    "gpu_busy_s": round(gpu_busy, 4) if gpu_busy is not None else None,
                    "gpu_busy_share": share(gpu_busy), "batch": BATCH, "workers": 1, "pin_memory": sc.cuda}
if not sc.cuda:
    sc.note("pin_memory off: no CUDA.")
sc.note(f"natural: measured by the script: {n} steps ({n / wall:.1f}/s) in {wall:.2f} s: {own['wait_s']:.2f} s in "
        f"next() on the loader ({own['wait_cpu_s']:.2f} s of it on the CPU), {own['step_s']:.2f} s in steps; the "
        f"worker made {int(samples)} samples ({samples / wall:.0f}/s): {read_s:.2f} s reading lines, {parse_s:.2f} s "
        f"in json.loads, {tok_s:.2f} s tokenising ({cpu_s:.2f} s of CPU); its process ran {w['run_s']} s and waited "
        f"for a CPU {w['cpu_wait_s']} s, read {w['disk_read_bytes']} bytes from storage; "
        + (f"a step's copy and kernels take {gpu_step_s * 1e3:.2f} ms of GPU time queued (GPU busy "
           f"{gpu_busy / wall:.0%} of the run)." if gpu_busy is not None else "no GPU timings (no CUDA)."))
sc.write_truth(baseline=(b0, b1), window=None, ratio_spans=((b0, mid), (mid, b1)))
