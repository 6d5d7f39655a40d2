"""natural_gzip_seek_getitem (natural, nothing staged): a GPT-style language model trained from a tokenised corpus kept
as gzip-compressed shards, read by a map-style Dataset the way a first "random access into my .bin.gz shards" is
often written: each of the 16 shards `shard_NN.bin.gz` (8,388,608 uint16 tokens, 16 MB uncompressed, written at set-up
under /var/tmp with gzip level 1: four distinct token streams, each written to four shards) is opened once per worker
with gzip.open() and kept open, and `__getitem__(i)` finds window i's shard and token offset (windows of 1,025 tokens
laid end to end, no overlap), then `f.seek(2 * offset)` and `f.read(2 * 1025)`. A gzip stream cannot seek: Python's
GzipFile decompresses from where it is to the target, 8 KB at a time, and a backward seek rewinds to the start of the
file and decompresses from there. With shuffle=True every window is a random jump: on average a third of a shard
(~5.6 MB) is inflated to read 2 KB. DataLoader(batch_size=16, shuffle=True, num_workers=4, persistent_workers=True,
drop_last=True), no pin_memory; the main thread copies each (16, 1025) int64 batch to the GPU (pageable, non_blocking)
and trains: a decoder of 6 pre-norm nn.TransformerEncoderLayer blocks (d 512, 8 heads, feed-forward 2048, causal
mask), vocabulary 16,384, a head tied to the embedding, bf16 autocast, fused AdamW, loss.item() each step. The four
workers are on their CPUs inflating gzip streams in zlib and gzip.py's loop; the main thread waits in next() and the
GPU idles most of each step. The main process and its workers on CPUs 2-7 (each worker can have a CPU to itself); no
threads of the job's own, no children but the workers (started before the measured run), no IO but the page cache's
(the shards were written and synced at set-up), no lock, no sleep. 20 s (smaller with --device cpu: 4 shards of
524,288 tokens, windows of 129, batch 8, a d-64 2-block model of vocabulary 1,000).

The script measures itself: the steps per second; the main thread's time in next() on the loader (`wait_s`, its CPU
clock in it `wait_cpu_s`, the rest `wait_off_cpu_s`: off its CPU), copying the batch to the GPU (`h2d_s`), queueing
the forward and the optimiser step (`step_s`), in loss.backward() (`backward_s`, its wait on PyTorch's autograd
thread) and in loss.item() (`item_s`); for each worker (truth `workers`: pid, tids, comm) the samples it made, its time
in the seek and read (`seek_s`, wall and CPU clock), the bytes it inflated to reach its windows (from GzipFile.tell()
before each seek: the distance forward, or from the start after a rewind) and its rewinds, its time in all of
__getitem__, its time on a CPU and waiting for one (schedstat), and its bytes read and those read from storage
(/proc/PID/io); before the run, the same loop with every shard decompressed once into one numpy array before the
workers start (the fix), so that what the seeks cost the run is known (`gzip_overhead_s`: the run's wall time beyond
its steps at that rate); the main thread's and the autograd thread's time on a CPU and waiting for one over the run
(schedstat); the process's minor page faults and the device allocator's cudaMalloc calls; and a step's GPU time queued
(common.gpu_seconds_queued: a batch already on the GPU, forward, loss, backward, AdamW, nothing read back), so that the
GPU's busy share is known. Truth `autograd` names PyTorch's autograd thread, `workers` the workers, `dataset` the
Dataset's class, function, the shards and what the seek does."""

import gzip
import multiprocessing
import os
import resource
import shutil
import tempfile
import threading
import time

from common import Scenario, comm_of, gpu_seconds_queued, tids_of

sc = Scenario("natural_gzip_seek_getitem", "natural", "a GPT-style LM fed by 4 DataLoader workers whose "
              "Dataset.__getitem__ seeks in gzip-compressed token shards (GzipFile.seek: inflate from the start or "
              "the current position to the window, ~5.6 MB per 2 KB read), 20 s, nothing staged",
              job_cpus=[2, 3, 4, 5, 6, 7], control=True)
import numpy as np  # noqa: E402
import torch  # noqa: E402

nn = torch.nn
F = nn.functional
PID, MAIN = os.getpid(), threading.get_native_id()
dev = torch.device(sc.device)
if sc.cuda:
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
SHARDS, SHARD_TOKENS, DISTINCT, CTX, BATCH, VOCAB, D, LAYERS, HEADS = (
    (16, 8_388_608, 4, 1024, 16, 16384, 512, 6, 8) if sc.cuda else (4, 524_288, 2, 128, 8, 1000, 64, 2, 4))
WORKERS, LEVEL = 4, 1
WIN = CTX + 1  # tokens a window: inputs and their next-token targets
PER_SHARD = SHARD_TOKENS // WIN
NSTAT = 6  # per worker: samples, seek+read wall and CPU, bytes inflated to reach the windows, rewinds, getitem wall
STATS = multiprocessing.RawArray("d", NSTAT * WORKERS)  # shared with the forked workers
DATA_PARENT = os.environ.get("ZOO_DATA_DIR", "/var/tmp")
KEYS = ("wait_s", "wait_cpu_s", "h2d_s", "step_s", "backward_s", "item_s")
own = {"steps": 0, **dict.fromkeys(KEYS, 0.0), "running_loss": 0.0}


def write_shards(root: str) -> list[str]:
    """SHARDS gzip files of SHARD_TOKENS uint16 tokens each (a Zipf-like unigram stream with short repeats, as text's
    tokens are), DISTINCT distinct streams written round-robin."""
    rng = np.random.default_rng(0)
    ranks = np.arange(1, VOCAB + 1, dtype=np.float64)
    p = 1.0 / ranks ** 1.1
    p /= p.sum()
    blobs = []
    for _ in range(DISTINCT):
        toks = rng.choice(VOCAB, size=SHARD_TOKENS, p=p).astype(np.uint16)
        # phrases repeat in text: a fifth of the stream copied, 64 tokens at a time, from up to 8 KB before it (within
        # gzip's window: its matches find them)
        for a in rng.integers(4096, SHARD_TOKENS - 64, size=SHARD_TOKENS // 320).tolist():
            src = a - int(rng.integers(64, 4096))
            toks[a:a + 64] = toks[src:src + 64]
        blobs.append(gzip.compress(toks.tobytes(), compresslevel=LEVEL, mtime=0))
    paths = []
    for s in range(SHARDS):
        path = os.path.join(root, f"shard_{s:02d}.bin.gz")
        with open(path, "wb") as fh:
            fh.write(blobs[s % DISTINCT])
        paths.append(path)
    return paths


class GzipTokenWindows(torch.utils.data.Dataset):
    """Window i: WIN tokens of shard i // PER_SHARD at token offset (i % PER_SHARD) * WIN. As written: each shard a
    gzip.open() file, opened once per worker and kept, read with seek() and read(); `tokens` (the fix): every shard
    decompressed once into one array before the workers start, a window a slice of it."""

    def __init__(self, paths: list[str], tokens: np.ndarray | None = None) -> None:
        self.paths, self.tokens = paths, tokens
        self.files: dict[int, gzip.GzipFile] = {}

    def __len__(self) -> int:
        return len(self.paths) * PER_SHARD

    def shard(self, s: int) -> gzip.GzipFile:
        f = self.files.get(s)
        if f is None:
            f = self.files[s] = gzip.open(self.paths[s], "rb")  # noqa: SIM115 (kept open, per worker)
        return f

    def __getitem__(self, i: int):
        t0, c0 = time.perf_counter(), time.thread_time()
        w = torch.utils.data.get_worker_info()
        wid = w.id if w is not None else 0
        s, k = divmod(i, PER_SHARD)
        off = k * WIN
        base = NSTAT * wid
        if self.tokens is not None:
            buf = self.tokens[s * SHARD_TOKENS + off:s * SHARD_TOKENS + off + WIN]
            t1, c1 = time.perf_counter(), time.thread_time()
        else:
            f = self.shard(s)
            pos = f.tell()
            f.seek(2 * off)
            raw = f.read(2 * WIN)
            t1, c1 = time.perf_counter(), time.thread_time()
            STATS[base + 3] += 2 * off - pos if 2 * off >= pos else 2 * off
            STATS[base + 4] += 2 * off < pos
            buf = np.frombuffer(raw, np.uint16)
        out = torch.from_numpy(buf.astype(np.int64))
        STATS[base] += 1
        STATS[base + 1] += t1 - t0
        STATS[base + 2] += c1 - c0
        STATS[base + 5] += time.perf_counter() - t0
        return out


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


def schedstat(pid: int, tid: int) -> tuple[float, float] | None:
    try:
        with open(f"/proc/{pid}/task/{tid}/schedstat") as fh:
            run, wait = fh.read().split()[:2]
        return int(run) / 1e9, int(wait) / 1e9
    except (OSError, ValueError):
        return None


def proc_io(pid: int) -> dict | None:
    try:
        with open(f"/proc/{pid}/io") as fh:
            return {k: int(v) for k, v in (line.split(": ") for line in fh.read().splitlines())}
    except (OSError, ValueError):
        return None


def autograd_thread() -> dict | None:
    for tid in tids_of(PID):
        comm = comm_of(PID, tid) or ""
        if comm.startswith("pt_autograd"):
            return {"pid": PID, "tid": tid, "comm": comm}
    return None


state: dict = {"it": None, "loader": None}
root = tempfile.mkdtemp(prefix="zoo_gzshards_", dir=DATA_PARENT if os.path.isdir(DATA_PARENT) else None)
try:
    t_write = time.perf_counter()
    paths = write_shards(root)
    os.sync()  # written back before the run: its writeback is not the run's
    write_s = time.perf_counter() - t_write
    shard_bytes = [os.path.getsize(p) for p in paths]
    torch.manual_seed(0)
    model = GPT().to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.1, fused=sc.cuda or None)

    def make_loader(tokens: np.ndarray | None) -> None:
        loader = torch.utils.data.DataLoader(GzipTokenWindows(paths, tokens), batch_size=BATCH, shuffle=True,
                                             num_workers=WORKERS, persistent_workers=True, drop_last=True,
                                             generator=torch.Generator().manual_seed(0))
        state["loader"], state["it"] = loader, iter(loader)

    def loss_of(seq: torch.Tensor) -> torch.Tensor:
        x, y = seq[:, :-1], seq[:, 1:]
        with torch.autocast(sc.device, dtype=torch.bfloat16, enabled=sc.cuda):
            logits = model(x)
        return F.cross_entropy(logits.float().reshape(-1, VOCAB), y.reshape(-1))

    def train(seq: torch.Tensor) -> torch.Tensor:
        t0 = time.perf_counter()
        loss = loss_of(seq)
        opt.zero_grad(set_to_none=True)
        t1 = time.perf_counter()
        loss.backward()
        t2 = time.perf_counter()
        opt.step()
        own["backward_s"] += t2 - t1
        own["step_s"] += (t1 - t0) + (time.perf_counter() - t2)
        return loss

    def next_batch():
        try:
            return next(state["it"])
        except StopIteration:  # a new epoch (the workers stay)
            state["it"] = iter(state["loader"])
            return next(state["it"])

    def step() -> None:
        t0, c0 = time.perf_counter(), time.thread_time()
        seq = next_batch()
        t1, c1 = time.perf_counter(), time.thread_time()
        seq = seq.to(dev, non_blocking=True)
        t2 = time.perf_counter()
        loss = train(seq)
        t3 = time.perf_counter()
        own["running_loss"] += loss.item()
        own["item_s"] += time.perf_counter() - t3
        own["wait_s"] += t1 - t0
        own["wait_cpu_s"] += c1 - c0
        own["h2d_s"] += t2 - t1
        own["steps"] += 1
        if own["steps"] % 50 == 0:
            print(f"step {own['steps']}: loss {own['running_loss'] / own['steps']:.4f}", flush=True)

    def sync() -> None:
        if sc.cuda:
            torch.cuda.synchronize()

    def reset() -> None:
        for k in own:
            own[k] = 0 if k == "steps" else 0.0

    def timed(seconds: float) -> tuple[int, float]:
        n0, t = own["steps"], time.perf_counter()
        end = t + seconds
        while time.perf_counter() < end:
            step()
        sync()
        return own["steps"] - n0, time.perf_counter() - t

    # The fix first: every shard decompressed once, before the workers start; a window a slice.
    t_dec = time.perf_counter()
    streams = []
    for p in paths[:DISTINCT]:  # the other shards repeat these streams: each decompressed once
        with open(p, "rb") as fh:
            streams.append(np.frombuffer(gzip.decompress(fh.read()), np.uint16))
    tokens = np.concatenate([streams[s % DISTINCT] for s in range(SHARDS)])
    del streams
    decompress_all_s = time.perf_counter() - t_dec
    make_loader(tokens)
    for _ in range(10):  # warm-up: the workers started, attention kernels chosen, the allocator, the autograd thread
        step()
    sync()
    gpu_step_s = None
    if sc.cuda:
        fixed = next_batch().to(dev)
        runs = sorted(r for r in (gpu_seconds_queued(torch, lambda _: train(fixed)) for _ in range(5))
                      if r is not None)
        gpu_step_s = runs[len(runs) // 2] if runs else None
    reset()
    fix_steps, fix_wall = timed(3.0 * sc.scale)
    fix_wait_share = own["wait_s"] / fix_wall if fix_wall > 0 else None
    state["it"]._shutdown_workers()
    del tokens
    # As the script has it: a gzip seek for every window.
    make_loader(None)
    timed(2.0 * sc.scale)  # the new workers started and primed, the spin kernels well before the run
    wpids = sorted(p.pid for p in multiprocessing.active_children())
    ag = autograd_thread()
    reset()
    s0 = list(STATS)
    w0 = {p: schedstat(p, p) for p in wpids}
    io0 = {p: proc_io(p) for p in wpids}
    main0 = schedstat(PID, MAIN)
    ag0 = schedstat(PID, ag["tid"]) if ag else None
    f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    m0 = int(torch.cuda.memory_stats().get("segment.all.allocated", 0)) if sc.cuda else 0
    b0 = sc.mark("baseline")
    t = time.perf_counter()
    sc.run_for(10.0 * sc.scale, step)
    mid = sc.mark("half")
    sc.run_for(10.0 * sc.scale, step)
    sync()
    b1 = sc.mark("end")
    wall = time.perf_counter() - t
    main1 = schedstat(PID, MAIN)
    ag1 = schedstat(PID, ag["tid"]) if ag else None
    f1 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    m1 = int(torch.cuda.memory_stats().get("segment.all.allocated", 0)) if sc.cuda else 0
    s1 = list(STATS)
    w1 = {p: schedstat(p, p) for p in wpids}
    io1 = {p: proc_io(p) for p in wpids}
    workers = [{"pid": p, "tids": tids_of(p), "comm": comm_of(p)} for p in wpids]
finally:
    if state["it"] is not None:
        state["it"]._shutdown_workers()
    shutil.rmtree(root, ignore_errors=True)
n = own["steps"]


def share(v: float | None) -> float | None:
    return round(v / wall, 4) if v is not None else None


def r4(v: float | None) -> float | None:
    return round(v, 4) if v is not None else None


def delta(a, b, k: int) -> float | None:
    return r4(b[k] - a[k]) if a and b else None


per_worker = []
for w_id in range(WORKERS):
    d = [b - a for a, b in zip(s0[NSTAT * w_id:NSTAT * (w_id + 1)], s1[NSTAT * w_id:NSTAT * (w_id + 1)])]
    per_worker.append({"worker_id": w_id, "samples": int(d[0]), "seek_s": round(d[1], 4), "seek_cpu_s": round(d[2], 4),
                       "inflated_bytes": int(d[3]), "rewinds": int(d[4]), "getitem_s": round(d[5], 4)})
for row in workers:
    p = row["pid"]
    a, z, ia, iz = w0.get(p), w1.get(p), io0.get(p), io1.get(p)
    row.update({"run_s": delta(a, z, 0), "cpu_wait_s": delta(a, z, 1),
                "rchar": iz["rchar"] - ia["rchar"] if ia and iz else None,
                "disk_read_bytes": iz["read_bytes"] - ia["read_bytes"] if ia and iz else None})
    row["cpu_share"], row["cpu_wait_share"] = share(row["run_s"]), share(row["cpu_wait_s"])
nw = max(len(workers), 1)


def total(key: str, rows: list[dict]) -> float:
    return round(sum(r[key] or 0.0 for r in rows), 4)


seek_s, seek_cpu_s, getitem_s = (total(k, per_worker) for k in ("seek_s", "seek_cpu_s", "getitem_s"))
samples = int(sum(r["samples"] for r in per_worker))
inflated = int(sum(r["inflated_bytes"] for r in per_worker))
rewinds = int(sum(r["rewinds"] for r in per_worker))
w_shares = [r["cpu_share"] for r in workers if r["cpu_share"] is not None]
fix_rate = fix_steps / fix_wall if fix_wall > 0 else None
at_fix = n / fix_rate if fix_rate else None
overhead = max(0.0, wall - at_fix) if at_fix is not None else None
main_run, main_wait = delta(main0, main1, 0), delta(main0, main1, 1)
ag_run, ag_wait = delta(ag0, ag1, 0), delta(ag0, ag1, 1)
gpu_busy = n * gpu_step_s if gpu_step_s is not None else None
wait_off = max(0.0, own["wait_s"] - own["wait_cpu_s"])
sc.extra["workers"] = workers
sc.extra["per_worker"] = per_worker
sc.extra["autograd"] = ag
sc.extra["dataset"] = {"class": "GzipTokenWindows", "function": "GzipTokenWindows.__getitem__",
                       "file": os.path.basename(__file__),
                       "what": "f.seek(2 * offset); f.read(2 * window) on a gzip.open() file kept per worker: "
                               "GzipFile.seek decompresses to the target (from the start after a backward seek)",
                       "folder": root, "shards": SHARDS, "shard_tokens": SHARD_TOKENS, "distinct_streams": DISTINCT,
                       "compresslevel": LEVEL, "shard_bytes_compressed": shard_bytes,
                       "compression_ratio": round(2 * SHARD_TOKENS * SHARDS / max(sum(shard_bytes), 1), 3),
                       "write_s": round(write_s, 3), "decompress_all_s": round(decompress_all_s, 3)}
sc.extra["self"] = {**{k: round(v, 4) if isinstance(v, float) else v for k, v in own.items()},
                    "wall_s": round(wall, 4), "steps_per_s": round(n / wall, 2),
                    "step_ms_mean": round(wall / max(n, 1) * 1e3, 3),
                    "wait_share": share(own["wait_s"]), "wait_cpu_share": share(own["wait_cpu_s"]),
                    "wait_off_cpu_s": round(wait_off, 4), "wait_off_cpu_share": share(wait_off),
                    "h2d_share": share(own["h2d_s"]), "step_share": share(own["step_s"]),
                    "backward_share": share(own["backward_s"]), "item_share": share(own["item_s"]),
                    "samples": samples, "seek_s": seek_s, "seek_cpu_s": seek_cpu_s, "getitem_s": getitem_s,
                    "seek_ms_per_sample": round(seek_s / max(samples, 1) * 1e3, 3),
                    "inflated_bytes": inflated, "inflated_mb_per_sample": round(inflated / max(samples, 1) / 1e6, 3),
                    "inflate_mb_per_cpu_s": round(inflated / 1e6 / seek_cpu_s, 1) if seek_cpu_s > 0 else None,
                    "rewinds": rewinds, "rewind_share": round(rewinds / max(samples, 1), 4),
                    # the workers' time seeking and in __getitem__, as shares of their time (workers x run)
                    "seek_share_of_workers": round(seek_s / (nw * wall), 4),
                    "workers_busy_share": round(getitem_s / (nw * wall), 4),
                    "workers_run_s": total("run_s", workers),
                    "workers_cpu_share_mean": round(sum(w_shares) / len(w_shares), 4) if w_shares else None,
                    "workers_cpu_share_max": max(w_shares, default=None),
                    "workers_cpu_wait_s": total("cpu_wait_s", workers),
                    "workers_cpu_wait_max_share": max((r["cpu_wait_share"] or 0.0 for r in workers), default=None),
                    "workers_disk_read_bytes": int(sum(r["disk_read_bytes"] or 0 for r in workers)),
                    "workers_rchar": int(sum(r["rchar"] or 0 for r in workers)),
                    "fix_steps": fix_steps, "fix_wall_s": round(fix_wall, 4),
                    "fix_steps_per_s": round(fix_rate, 2) if fix_rate else None,
                    "fix_wait_share": r4(fix_wait_share),
                    "at_fix_rate_s": r4(at_fix), "gzip_overhead_s": r4(overhead),
                    "gzip_overhead_share": share(overhead),
                    "main_run_s": main_run, "main_cpu_share": share(main_run),
                    "main_cpu_wait_s": main_wait, "main_cpu_wait_share": share(main_wait),
                    "autograd_run_s": ag_run, "autograd_cpu_share": share(ag_run),
                    "autograd_cpu_wait_s": ag_wait, "autograd_cpu_wait_share": share(ag_wait),
                    "minor_faults_per_s": round((f1 - f0) / wall, 1), "cuda_mallocs_per_s": round((m1 - m0) / wall, 3),
                    "gpu_step_ms": round(gpu_step_s * 1e3, 4) if gpu_step_s is not None else None,
                    "gpu_busy_s": r4(gpu_busy), "gpu_busy_share": share(gpu_busy),
                    "batch": BATCH, "context": CTX, "shards": SHARDS, "shard_tokens": SHARD_TOKENS,
                    "num_workers": WORKERS}
if not sc.cuda:
    sc.note("on the CPU: no autograd thread (the backward runs on the main thread), no GPU timings, no allocator "
            "counters.")
sc.note(f"natural: measured by the script: {n} steps ({n / wall:.1f}/s) in {wall:.2f} s: {own['wait_s']:.2f} s in "
        f"next() ({wait_off:.2f} s of it off the main thread's CPU); the {len(workers)} workers spent {seek_s:.2f} s "
        f"seeking in the gzip shards ({seek_s / max(samples, 1) * 1e3:.2f} ms a sample, {seek_cpu_s:.2f} s on a CPU, "
        f"{inflated / max(samples, 1) / 1e6:.2f} MB inflated a sample, {rewinds} rewinds of {samples}); with the "
        f"shards decompressed once {fix_rate and round(fix_rate, 1)} steps/s (the seeks cost "
        f"{overhead and round(overhead, 2)} s of the run); the main thread ran {main_run} s, waited for a CPU "
        f"{main_wait} s; "
        + (f"a step's kernels take {gpu_step_s * 1e3:.2f} ms of GPU time queued (GPU busy {gpu_busy / wall:.0%} of the "
           "run)." if gpu_busy is not None else "no GPU timings (no CUDA)."))
sc.write_truth(baseline=(b0, b1), window=None, ratio_spans=((b0, mid), (mid, b1)))
