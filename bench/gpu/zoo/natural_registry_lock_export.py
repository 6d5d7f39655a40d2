"""natural_registry_lock_export (natural, nothing staged): a 1000-class classifier whose training script keeps its
metrics in a thread-safe registry of its own, the way a team's "metrics.py" is often written: one MetricsRegistry
object with ONE threading.Lock over every series (per-step gauges, counters, and three histograms per image source and
class: each sample's loss, its top-1 confidence and its top-1/top-2 margin, 30 buckets each, for 4 sources x 1,000
classes: 360,000 bucket counts, plus per source and class hits and samples), which the training loop updates after
every step (registry.record(), under the lock), and a background thread (threading's name and OS name
`metrics_export`) that exports it for a dashboard every `interval` seconds: to get a consistent snapshot it holds the
lock while it renders the registry into a dict (cumulative buckets per series, quantiles of the step time), json.dumps()
it (~5 MB), gzip-compresses it at level 9 and writes it to metrics.json.gz.tmp and os.replace()s it onto
metrics.json.gz (a folder under /var/tmp, the page cache, no fsync). Each step's record() therefore waits, asleep on
the lock, for whatever is left of an export in progress, and the GPU idles meanwhile (the step's read-back came before
it: nothing is queued). The export's time is measured on this host before the run (from the main thread, then beside
the loop) and the interval set so that the lock is held about 40% of the time (interval = 1.5 x the export's time,
0.2-3 s): the main thread's wait on the lock a third of the run or so. The model: an MLP on 1024-d embeddings held on
the GPU (1024-4096-4096-1000, GELU, fp32 without TF32), batch 4096 drawn on the GPU, fused AdamW, per-sample
cross-entropy; the batch's histograms made on the GPU (topk, bucketize, index_add_) and read back with one .cpu()
(1.5 MB), then loss.item(); a step of ~15 ms of GPU work. One process on CPUs 2-3; no workers, no children, no IO but
the exporter's page-cache write, no sleep in the loop (the exporter waits on an Event's timeout between exports).
20 s (smaller with --device cpu: 64-d inputs, width 128, batch 256; the registry as big).

The script measures itself: the steps per second; the main thread's time drawing the batch and queueing the step
(`issue_s`, within it loss.backward(): `backward_s`, its wait on PyTorch's autograd thread), reading the histograms
and the loss back (`read_s`: the wait for the step's kernels), waiting to acquire the registry's lock in record()
(`lock_wait_s`, and the waits of 5 ms or more: `lock_waits_long`) and updating it under the lock (`record_s`); the
exporter's exports (truth `exports_ns`: each span the lock was held), its time holding the lock (`export_hold_s`), in
its parts (rendering the dict `render_s`, json.dumps `dumps_s`, gzip `gzip_s`, the write and rename `write_s`), its
CPU clock while holding it (`export_hold_cpu_s`), its own wait for the lock, the bytes it made; before the run, the
same loop with no exporter (`alone`, so that what the exporter costs the run is known: `export_overhead_s`, the run's
time beyond its steps at that rate) and with the exporter fixed (the registry copied under the lock, rendered,
serialised, compressed and written outside it: `fix`, so that what holding the lock costs is known:
`lock_overhead_s`); the main, autograd and exporter threads' time on a CPU and waiting for one over the run
(schedstat); the process's minor page faults and the device allocator's cudaMalloc calls; and a step's GPU time
(queued behind a spin: common.gpu_seconds_queued, the forward, backward, AdamW and the histograms, nothing read back;
failing that, CUDA events around 20 steps queued back to back; failing that, the host's clock around them: truth
`gpu_time_method`), so that the GPU's busy share is known. Truth `exporter` names the thread (pid, tid, comm),
`autograd` PyTorch's autograd thread, `registry` the class, its lock and what the export does under it."""

import collections
import gzip
import json
import os
import resource
import shutil
import tempfile
import threading
import time

from common import Scenario, comm_of, gpu_seconds_queued, now, set_thread_name, tids_of

sc = Scenario("natural_registry_lock_export", "natural", "a 1000-class MLP whose metrics registry (one threading.Lock "
              "over every series) is exported by a thread that holds the lock while it renders, json.dumps and "
              "gzip-9s ~5 MB of JSON and writes it, ~40% of the time; the loop's record() after every step waits on "
              "the lock, 20 s, nothing staged", job_cpus=[2, 3], control=True)
import numpy as np  # noqa: E402
import torch  # noqa: E402

nn = torch.nn
F = nn.functional
PID, MAIN = os.getpid(), threading.get_native_id()
dev = torch.device(sc.device)
if sc.cuda:
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
IN_DIM, WIDTH, BATCH, POOL = (1024, 4096, 4096, 65536) if sc.cuda else (64, 128, 256, 4096)
CLASSES, NB = 1000, 30
HISTS = ("loss", "confidence", "margin")
SOURCES = ("crawl", "licensed", "user", "synthetic")  # where each image came from: a label of every series
NS = len(SOURCES)
NCOUNTS = NS * len(HISTS) * CLASSES * NB
TARGET_HOLD_SHARE = 0.40  # the share of the time the exporter holds the lock (the interval set from its time)
INTERVAL_RANGE = (0.2, 3.0)
LONG_WAIT_S = 0.005
OUT_DIR = tempfile.mkdtemp(prefix="zoo_registry_", dir="/var/tmp" if os.path.isdir("/var/tmp") else None)
EXPORT_PATH = os.path.join(OUT_DIR, "metrics.json.gz")
KEYS = ("issue_s", "backward_s", "read_s", "lock_wait_s", "record_s")
own = {"steps": 0, "lock_waits_long": 0, **dict.fromkeys(KEYS, 0.0), "running_loss": 0.0}
EXP_KEYS = ("hold_s", "hold_cpu_s", "render_s", "dumps_s", "gzip_s", "write_s", "acquire_wait_s", "outside_s")
exp = {"exports": 0, "json_bytes": 0, "gz_bytes": 0, **dict.fromkeys(EXP_KEYS, 0.0)}
export_spans: list[list[int]] = []

# bucket edges: the loss on a log scale, confidence and margin on [0, 1]
LOSS_EDGES = np.geomspace(0.001, 20.0, NB - 1)
UNIT_EDGES = np.linspace(1.0 / NB, 1.0, NB - 1, endpoint=False)
EDGES = {"loss": LOSS_EDGES, "confidence": UNIT_EDGES, "margin": UNIT_EDGES}
LE = {h: [f"{e:.6g}" for e in EDGES[h]] + ["+Inf"] for h in HISTS}


class MetricsRegistry:
    """The process's metrics, safe to use from any thread: one lock over every series. The loop calls record() after
    each step; the exporter thread calls export(). As written, export() holds the lock over the whole export (a
    consistent snapshot); `copy_first` (the fix) copies the series under the lock and does the rest outside it."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.class_names = [f"n{1440764 + 7919 * c:08d}" for c in range(CLASSES)]  # WordNet-id-like labels
        self.hist = {h: np.zeros((NS, CLASSES, NB), np.int64) for h in HISTS}
        self.hist_sum = {h: np.zeros((NS, CLASSES)) for h in HISTS}
        self.hits = np.zeros((NS, CLASSES), np.int64)
        self.seen = np.zeros((NS, CLASSES), np.int64)
        self.gauges = {"train_loss": float("nan"), "train_lr": 0.0, "train_step_seconds": 0.0}
        self.counters = {"train_steps_total": 0, "train_samples_total": 0}
        self.step_times: collections.deque = collections.deque(maxlen=2000)
        self.copy_first = False

    def record(self, counts: np.ndarray, extra: np.ndarray, loss: float, lr: float, step_s: float) -> None:
        """The step's histograms (counts: 3 x SOURCES x CLASSES x NB; extra: hits and the three sums, 4 x SOURCES x
        CLASSES) and its scalars."""
        t0 = time.perf_counter()
        self._lock.acquire()
        t1 = time.perf_counter()
        try:
            for i, h in enumerate(HISTS):
                self.hist[h] += counts[i]
                self.hist_sum[h] += extra[1 + i]
            self.hits += extra[0].astype(np.int64)
            self.seen += counts[0].sum(axis=2)
            self.gauges["train_loss"] = loss
            self.gauges["train_lr"] = lr
            self.gauges["train_step_seconds"] = step_s
            self.counters["train_steps_total"] += 1
            self.counters["train_samples_total"] += BATCH
            self.step_times.append(step_s)
        finally:
            self._lock.release()
        waited = t1 - t0
        own["lock_wait_s"] += waited
        own["lock_waits_long"] += waited >= LONG_WAIT_S
        own["record_s"] += time.perf_counter() - t1

    def _snapshot(self) -> dict:
        return {"hist": {h: a.copy() for h, a in self.hist.items()},
                "hist_sum": {h: a.copy() for h, a in self.hist_sum.items()},
                "hits": self.hits.copy(), "seen": self.seen.copy(), "gauges": dict(self.gauges),
                "counters": dict(self.counters), "step_times": list(self.step_times)}

    def _render(self, s: dict) -> dict:
        """The export's document: per source and class, each histogram's cumulative buckets by their upper edge, its
        count and sum; per source and class, hits, samples and accuracy; the gauges, the counters and the step time's
        quantiles."""
        times = sorted(s["step_times"])
        q = {f"p{int(p * 100)}": times[min(len(times) - 1, int(p * len(times)))] for p in (0.5, 0.9, 0.99)} \
            if times else {}
        doc = {"ts": time.time(), "gauges": s["gauges"], "counters": s["counters"],
               "train_step_seconds_quantiles": q, "histograms": {}, "classes": {}}
        for h in HISTS:
            le = LE[h]
            by_source = {}
            for k, source in enumerate(SOURCES):
                cum = np.cumsum(s["hist"][h][k], axis=1).tolist()
                sums = s["hist_sum"][h][k].tolist()
                by_source[source] = {
                    name: {"buckets": dict(zip(le, cum[c])), "count": cum[c][-1], "sum": round(sums[c], 6)}
                    for c, name in enumerate(self.class_names)}
            doc["histograms"][f"train_{h}"] = by_source
        for k, source in enumerate(SOURCES):
            hits, seen = s["hits"][k].tolist(), s["seen"][k].tolist()
            doc["classes"][source] = {name: {"hits": hits[c], "samples": seen[c],
                                             "accuracy": round(hits[c] / seen[c], 6) if seen[c] else None}
                                      for c, name in enumerate(self.class_names)}
        return doc

    def _export(self, s: dict, path: str, part: dict) -> tuple[int, int]:
        t0 = time.perf_counter()
        doc = self._render(s)
        t1 = time.perf_counter()
        text = json.dumps(doc, separators=(",", ":"))
        t2 = time.perf_counter()
        blob = gzip.compress(text.encode(), compresslevel=9, mtime=0)
        t3 = time.perf_counter()
        tmp = path + ".tmp"
        with open(tmp, "wb") as fh:
            fh.write(blob)
        os.replace(tmp, path)
        t4 = time.perf_counter()
        part["render_s"] += t1 - t0
        part["dumps_s"] += t2 - t1
        part["gzip_s"] += t3 - t2
        part["write_s"] += t4 - t3
        return len(text), len(blob)

    def export(self, path: str, part: dict, spans: list | None = None) -> None:
        t0 = time.perf_counter()
        self._lock.acquire()
        a, c1 = now(), time.thread_time()
        t1 = time.perf_counter()
        try:
            if self.copy_first:
                s = self._snapshot()
            else:
                sizes = self._export(self._snapshot(), path, part)  # everything under the lock
        finally:
            self._lock.release()
        t2 = time.perf_counter()
        part["hold_s"] += t2 - t1
        part["hold_cpu_s"] += time.thread_time() - c1
        part["acquire_wait_s"] += t1 - t0
        if spans is not None:
            spans.append([a, now()])
        if self.copy_first:
            sizes = self._export(s, path, part)
            part["outside_s"] += time.perf_counter() - t2
        part["exports"] += 1
        part["json_bytes"] += sizes[0]
        part["gz_bytes"] += sizes[1]


REG = MetricsRegistry()
stop = threading.Event()
exporter: dict = {"thread": None, "tid": None, "interval": 1.0, "measure": False}


def export_loop() -> None:
    set_thread_name("metrics_export")
    exporter["tid"] = threading.get_native_id()
    while not stop.wait(exporter["interval"]):
        measuring = exporter["measure"]
        REG.export(EXPORT_PATH, exp if measuring else dict.fromkeys(exp, 0),
                   export_spans if measuring else None)


class Head(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(IN_DIM, WIDTH), nn.GELU(), nn.Linear(WIDTH, WIDTH), nn.GELU(),
                                 nn.Linear(WIDTH, CLASSES))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


def make_pool() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """POOL embeddings (class centroids and noise, L2-normalised), their labels and sources, made on the device."""
    g = torch.Generator(device=dev).manual_seed(0)
    centroids = torch.randn(CLASSES, IN_DIM, generator=g, device=dev)
    y = torch.randint(0, CLASSES, (POOL,), generator=g, device=dev)
    src = torch.randint(0, NS, (POOL,), generator=g, device=dev)
    x = centroids[y] + 2.0 * torch.randn(POOL, IN_DIM, generator=g, device=dev)
    return F.normalize(x, dim=1), y, src


def schedstat(pid: int, tid: int) -> tuple[float, float] | None:
    try:
        with open(f"/proc/{pid}/task/{tid}/schedstat") as fh:
            run, wait = fh.read().split()[:2]
        return int(run) / 1e9, int(wait) / 1e9
    except (OSError, ValueError):
        return None


def autograd_thread() -> dict | None:
    for tid in tids_of(PID):
        comm = comm_of(PID, tid) or ""
        if comm.startswith("pt_autograd"):
            return {"pid": PID, "tid": tid, "comm": comm}
    return None


pool_x, pool_y, pool_src = make_pool()
torch.manual_seed(0)
model = Head().to(dev)
opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.05, fused=sc.cuda or None)
NPARAM = sum(p.numel() for p in model.parameters())
loss_edges = torch.tensor(LOSS_EDGES, dtype=torch.float32, device=dev)
unit_edges = torch.tensor(UNIT_EDGES, dtype=torch.float32, device=dev)
counts_buf = torch.zeros(NCOUNTS, device=dev)
extra_buf = torch.zeros(4 * NS * CLASSES, device=dev)


def draw() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    idx = torch.randint(0, POOL, (BATCH,), device=dev)
    return pool_x[idx], pool_y[idx], pool_src[idx]


def train(x: torch.Tensor, y: torch.Tensor, src: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Forward, backward, AdamW, and the batch's histograms made on the device (nothing read back)."""
    logits = model(x)
    loss_vec = F.cross_entropy(logits, y, reduction="none")
    loss = loss_vec.mean()
    opt.zero_grad(set_to_none=True)
    t1 = time.perf_counter()
    loss.backward()
    t2 = time.perf_counter()
    opt.step()
    with torch.no_grad():
        p = logits.detach().softmax(1)
        top2, pred = p.topk(2, dim=1)
        conf, margin = top2[:, 0].contiguous(), (top2[:, 0] - top2[:, 1]).contiguous()
        lv = loss_vec.detach()
        sy = src * CLASSES + y  # the series of each sample: (source, class)
        keys = torch.cat([sy * NB + torch.bucketize(lv, loss_edges),
                          (NS * CLASSES + sy) * NB + torch.bucketize(conf, unit_edges),
                          (2 * NS * CLASSES + sy) * NB + torch.bucketize(margin, unit_edges)])
        counts = counts_buf.zero_().index_add_(0, keys, torch.ones_like(keys, dtype=torch.float32))
        vals = torch.stack([(pred[:, 0] == y).float(), lv, conf, margin])  # hits and the three sums, per sample
        extra = extra_buf.zero_().view(4, NS * CLASSES).index_add_(1, sy, vals)
    own["backward_s"] += t2 - t1
    return loss, counts, extra


def step() -> None:
    t0 = time.perf_counter()
    x, y, src = draw()
    loss, counts, extra = train(x, y, src)
    t1 = time.perf_counter()
    got = torch.cat([counts, extra.flatten()]).cpu().numpy()  # waits for the step's kernels
    lv = loss.item()
    t2 = time.perf_counter()
    REG.record(got[:NCOUNTS].reshape(len(HISTS), NS, CLASSES, NB).astype(np.int64),
               got[NCOUNTS:].reshape(4, NS, CLASSES), lv, opt.param_groups[0]["lr"], t2 - t0)
    own["issue_s"] += t1 - t0
    own["read_s"] += t2 - t1
    own["running_loss"] += lv
    own["steps"] += 1
    if own["steps"] % 200 == 0:
        print(f"step {own['steps']}: loss {own['running_loss'] / own['steps']:.4f}", flush=True)


def sync() -> None:
    if sc.cuda:
        torch.cuda.synchronize()


def reset() -> None:
    for k in own:
        own[k] = 0 if k in ("steps", "lock_waits_long") else 0.0


def reset_exp() -> None:
    for k in exp:
        exp[k] = 0 if k in ("exports", "json_bytes", "gz_bytes") else 0.0
    export_spans.clear()


def timed(seconds: float) -> tuple[int, float]:
    n0, t = own["steps"], time.perf_counter()
    end = t + seconds
    while time.perf_counter() < end:
        step()
    sync()
    return own["steps"] - n0, time.perf_counter() - t


def gpu_step_seconds() -> tuple[float | None, str | None]:
    """A step's GPU time (forward, backward, AdamW, the histograms; nothing read back): queued behind a spin (the
    median of five), else CUDA events around 20 steps queued back to back, else the host's clock around them."""
    if not sc.cuda:
        return None, None
    fixed = draw()
    runs = sorted(r for r in (gpu_seconds_queued(torch, lambda _: train(*fixed)) for _ in range(5)) if r is not None)
    if runs:
        return runs[len(runs) // 2], "queued"
    k = 20
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    t = time.perf_counter()
    start.record()
    for _ in range(k):
        train(*fixed)
    end.record()
    end.synchronize()
    host = (time.perf_counter() - t) / k
    try:
        ms = start.elapsed_time(end)
    except RuntimeError:
        ms = None
    if ms is not None and ms > 0:
        return ms / 1e3 / k, "events"
    return host, "host_clock"


t_set = time.perf_counter()
for _ in range(20):  # warm-up: cuBLAS, the allocator, the autograd thread
    step()
sync()
gpu_step_s, gpu_method = gpu_step_seconds()
# The loop alone (no exporter).
reset()
timed(1.0 * sc.scale)  # the spin kernels well before the timed stretch
reset()
alone_steps, alone_wall = timed(3.0 * sc.scale)
# The export's time as written (the lock held over all of it), on this host: the median of three, from the main thread.
calib = dict.fromkeys(exp, 0)
holds = []
for _ in range(3):
    h0 = calib["hold_s"]
    REG.export(EXPORT_PATH, calib)
    holds.append(calib["hold_s"] - h0)
hold_est = sorted(holds)[1]


def interval_for(hold_s: float) -> float:
    """The wait between exports that makes the lock held TARGET_HOLD_SHARE of the time, within INTERVAL_RANGE."""
    return min(max(hold_s * (1 - TARGET_HOLD_SHARE) / TARGET_HOLD_SHARE, INTERVAL_RANGE[0]), INTERVAL_RANGE[1])


exporter["interval"] = interval_for(hold_est)
calib_parts = {k: round(calib[k] / 3, 4) for k in ("render_s", "dumps_s", "gzip_s", "write_s")}
# The exporter fixed: the registry copied under the lock, the rest outside it.
REG.copy_first = True
th = threading.Thread(target=export_loop, name="metrics_export", daemon=True)
exporter["thread"] = th
th.start()
reset()
reset_exp()
exporter["measure"] = True
fix_steps, fix_wall = timed(4.0 * sc.scale)
exporter["measure"] = False
fix_lock_wait_s = own["lock_wait_s"]
fix_exp = {k: (round(v, 4) if isinstance(v, float) else v) for k, v in exp.items()}
# The export's time beside the loop (the fix's exports, the work it does outside the lock): the interval of the run.
if fix_exp["exports"]:
    hold_est = (fix_exp["hold_s"] + fix_exp["outside_s"]) / fix_exp["exports"]
interval = exporter["interval"] = interval_for(hold_est)
# As the script has it: the lock held over the whole export.
REG.copy_first = False
timed(1.0 * sc.scale)
ag = autograd_thread()
etid = exporter["tid"]
reset()
reset_exp()
main0 = schedstat(PID, MAIN)
ag0 = schedstat(PID, ag["tid"]) if ag else None
ex0 = schedstat(PID, etid) if etid else None
f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
m0 = int(torch.cuda.memory_stats().get("segment.all.allocated", 0)) if sc.cuda else 0
exporter["measure"] = True
b0 = sc.mark("baseline")
t = time.perf_counter()
sc.run_for(10.0 * sc.scale, step)
mid = sc.mark("half")
sc.run_for(10.0 * sc.scale, step)
sync()
b1 = sc.mark("end")
wall = time.perf_counter() - t
exporter["measure"] = False
main1 = schedstat(PID, MAIN)
ag1 = schedstat(PID, ag["tid"]) if ag else None
ex1 = schedstat(PID, etid) if etid else None
f1 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
m1 = int(torch.cuda.memory_stats().get("segment.all.allocated", 0)) if sc.cuda else 0
exporter_comm = comm_of(PID, etid) if etid else None
stop.set()
th.join(timeout=10)
shutil.rmtree(OUT_DIR, ignore_errors=True)
n = own["steps"]


def share(v: float | None) -> float | None:
    return round(v / wall, 4) if v is not None else None


def r4(v: float | None) -> float | None:
    return round(v, 4) if v is not None else None


def delta(a, b, k: int) -> float | None:
    return r4(b[k] - a[k]) if a and b else None


alone_rate = alone_steps / alone_wall if alone_wall > 0 else None
fix_rate = fix_steps / fix_wall if fix_wall > 0 else None
at_alone = n / alone_rate if alone_rate else None
at_fix = n / fix_rate if fix_rate else None
export_overhead = max(0.0, wall - at_alone) if at_alone is not None else None
lock_overhead = max(0.0, wall - at_fix) if at_fix is not None else None
main_run, main_wait = delta(main0, main1, 0), delta(main0, main1, 1)
ag_run, ag_wait = delta(ag0, ag1, 0), delta(ag0, ag1, 1)
ex_run, ex_wait = delta(ex0, ex1, 0), delta(ex0, ex1, 1)
gpu_busy = n * gpu_step_s if gpu_step_s is not None else None
nexp = max(exp["exports"], 1)
sc.extra["exporter"] = {"pid": PID, "tid": etid, "tids": [etid] if etid else [],
                        "comm": exporter_comm, "name": "metrics_export",
                        "interval_s": round(interval, 4), "what": "holds MetricsRegistry._lock while it renders the "
                        "registry, json.dumps() it, gzip-compresses it (level 9) and writes and renames the file"}
sc.extra["autograd"] = ag
sc.extra["exports_ns"] = export_spans
sc.extra["registry"] = {"class": "MetricsRegistry", "lock": "MetricsRegistry._lock (threading.Lock)",
                        "record": "MetricsRegistry.record", "export": "MetricsRegistry.export",
                        "under_the_lock": ["MetricsRegistry._snapshot", "MetricsRegistry._render", "json.dumps",
                                           "gzip.compress", "open/write", "os.replace"],
                        "file": os.path.basename(__file__), "classes": CLASSES, "buckets": NB,
                        "histograms": [f"train_{h}" for h in HISTS], "bucket_counts": 3 * CLASSES * NB,
                        "export_path": EXPORT_PATH, "calibration_hold_s": [round(h, 4) for h in holds],
                        "calibration_parts_s": calib_parts}
sc.extra["self"] = {**{k: round(v, 4) if isinstance(v, float) else v for k, v in own.items()},
                    "wall_s": round(wall, 4), "steps_per_s": round(n / wall, 2),
                    "step_ms_mean": round(wall / max(n, 1) * 1e3, 3),
                    "issue_share": share(own["issue_s"]), "backward_share": share(own["backward_s"]),
                    "read_share": share(own["read_s"]), "lock_wait_share": share(own["lock_wait_s"]),
                    "record_share": share(own["record_s"]),
                    "lock_wait_ms_per_step": round(own["lock_wait_s"] / max(n, 1) * 1e3, 3),
                    "exports": exp["exports"], "export_hold_s": round(exp["hold_s"], 4),
                    "export_hold_share": share(exp["hold_s"]), "export_hold_cpu_s": round(exp["hold_cpu_s"], 4),
                    "export_hold_ms_mean": round(exp["hold_s"] / nexp * 1e3, 3),
                    "export_render_s": round(exp["render_s"], 4), "export_dumps_s": round(exp["dumps_s"], 4),
                    "export_gzip_s": round(exp["gzip_s"], 4), "export_write_s": round(exp["write_s"], 4),
                    "export_acquire_wait_s": round(exp["acquire_wait_s"], 4),
                    "export_json_mb": round(exp["json_bytes"] / nexp / 1e6, 3),
                    "export_gz_mb": round(exp["gz_bytes"] / nexp / 1e6, 3),
                    "export_interval_s": round(interval, 4), "calibration_hold_s": round(hold_est, 4),
                    "alone_steps": alone_steps, "alone_wall_s": round(alone_wall, 4),
                    "alone_steps_per_s": round(alone_rate, 2) if alone_rate else None,
                    "at_alone_rate_s": r4(at_alone), "export_overhead_s": r4(export_overhead),
                    "export_overhead_share": share(export_overhead),
                    "fix_steps": fix_steps, "fix_wall_s": round(fix_wall, 4),
                    "fix_steps_per_s": round(fix_rate, 2) if fix_rate else None,
                    "fix_lock_wait_share": round(fix_lock_wait_s / fix_wall, 4) if fix_wall > 0 else None,
                    "fix_exports": fix_exp["exports"], "fix_export_hold_s": fix_exp["hold_s"],
                    "fix_export_outside_s": fix_exp["outside_s"],
                    "at_fix_rate_s": r4(at_fix), "lock_overhead_s": r4(lock_overhead),
                    "lock_overhead_share": share(lock_overhead),
                    "main_run_s": main_run, "main_cpu_share": share(main_run),
                    "main_cpu_wait_s": main_wait, "main_cpu_wait_share": share(main_wait),
                    "autograd_run_s": ag_run, "autograd_cpu_share": share(ag_run),
                    "autograd_cpu_wait_s": ag_wait, "autograd_cpu_wait_share": share(ag_wait),
                    "exporter_run_s": ex_run, "exporter_cpu_share": share(ex_run),
                    "exporter_cpu_wait_s": ex_wait, "exporter_cpu_wait_share": share(ex_wait),
                    "minor_faults_per_s": round((f1 - f0) / wall, 1), "cuda_mallocs_per_s": round((m1 - m0) / wall, 3),
                    "gpu_step_ms": round(gpu_step_s * 1e3, 4) if gpu_step_s is not None else None,
                    "gpu_time_method": gpu_method,
                    "gpu_busy_s": r4(gpu_busy), "gpu_busy_share": share(gpu_busy),
                    "batch": BATCH, "classes": CLASSES, "params_m": round(NPARAM / 1e6, 2),
                    "setup_s": round(time.perf_counter() - t_set - wall, 3)}
if not sc.cuda:
    sc.note("on the CPU: no autograd thread (the backward runs on the main thread), no GPU timings, no allocator "
            "counters; the steps are the CPU's, so the shares differ from the GPU host's.")
if gpu_method not in (None, "queued"):
    sc.note(f"the step's GPU time measured by {gpu_method} (the queued measure failed): an upper bound.")
sc.note(f"natural: measured by the script: {n} steps ({n / wall:.1f}/s) in {wall:.2f} s: {own['lock_wait_s']:.2f} s "
        f"waiting for the registry's lock in record() ({own['lock_waits_long']} waits of 5 ms or more), "
        f"{own['read_s']:.2f} s reading the step back; the exporter held the lock {exp['hold_s']:.2f} s in "
        f"{exp['exports']} exports every {interval:.2f} s (render {exp['render_s']:.2f} s, json.dumps "
        f"{exp['dumps_s']:.2f} s, gzip {exp['gzip_s']:.2f} s, write {exp['write_s']:.2f} s); alone "
        f"{alone_rate and round(alone_rate, 1)} steps/s (the exporter cost "
        f"{export_overhead and round(export_overhead, 2)} s of the run), with the export outside the lock "
        f"{fix_rate and round(fix_rate, 1)} steps/s (holding it cost "
        f"{lock_overhead and round(lock_overhead, 2)} s); the main thread ran {main_run} s, waited for a CPU "
        f"{main_wait} s; "
        + (f"a step's kernels take {gpu_step_s * 1e3:.2f} ms of GPU time ({gpu_method}; GPU busy {gpu_busy / wall:.0%} "
           "of the run)." if gpu_busy is not None else "no GPU timings (no CUDA)."))
sc.write_truth(baseline=(b0, b1), window=None, ratio_spans=((b0, mid), (mid, b1)))
