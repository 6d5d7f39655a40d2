"""natural_sqlite_unindexed_getitem (natural, nothing staged): an object classifier trained on crops of annotated
scenes whose annotations live in a SQLite database, the way a labelling tool exports them: one table `annotations`
(id INTEGER PRIMARY KEY, ann_key TEXT, scene, x0, y0, label, source, annotator, added) of 120,000 rows, and a manifest
of annotation keys for the training split. The Dataset opens one connection per DataLoader worker (on its first
sample, after the fork, as sqlite3 asks) and looks each sample's annotation up by its key: `SELECT scene, x0, y0,
label FROM annotations WHERE ann_key = ?`. Nothing indexes ann_key (only the integer id is the table's key), so every
sample is a full scan of the table inside libsqlite3 (sqlite3_step: its B-tree pages read from the file through the
page cache, ~10 MB against SQLite's default 2 MB page cache, and every row's key compared). Then a 64x64 crop of the
scene (800 scenes of 3x128x128 uint8, held in memory by the dataset) at the box's corner and a random flip.
DataLoader(batch_size=64, shuffle=True, num_workers=4, persistent_workers=True, drop_last=True), no pin_memory; the main
thread copies each uint8 batch to the GPU (pageable, non_blocking), normalises it there and trains a ResNet-18-style
classifier (stem 3-64 of stride 1, stages 64-128-256-512; fp32 without TF32, cudnn.benchmark, SGD with Nesterov
momentum), loss.item() each step. The four workers are on their CPUs inside SQLite; the main thread waits in next()
and the GPU idles most of each step. At set-up the script writes the database under /var/tmp (ZOO_DATA_DIR; synced,
in the page cache afterwards: no disk reads) and a copy of it with `CREATE INDEX ... ON annotations(ann_key)` (the
fix). The main process and its workers on CPUs 2-7 (each worker a CPU of its own); no threads of the job's own, no
children but the workers (started before the measured run), no lock between them (readers only), no sleep. 20 s
(smaller with --device cpu: 20,000 rows, 300 scenes of 3x64x64, crops of 32, batch 32, a narrower net).

The script measures itself: the steps per second; the main thread's time in next() on the loader (`wait_s`, its CPU
clock in it `wait_cpu_s`, the rest `wait_off_cpu_s`: off its CPU), copying the batch to the GPU (`h2d_s`), queueing
the forward and the optimiser step (`step_s`), in loss.backward() (`backward_s`, its wait on PyTorch's autograd thread)
and in loss.item() (`item_s`); for each worker (truth `workers`: pid, tids, comm) the samples it made, its time in the
query (`query_s`: execute and fetchone, wall and CPU clock) and in all of __getitem__, its time on a CPU and waiting
for one (schedstat), and its bytes read and those read from storage (/proc/PID/io); both databases' query plans
(EXPLAIN QUERY PLAN); before the run, the same loop on the indexed copy (the fix), so that what the scans cost the run
is known (`query_overhead_s`: the run's wall time beyond its steps at that rate); the main thread's and the autograd
thread's time on a CPU and waiting for one over the run (schedstat); the process's minor page faults and the device
allocator's cudaMalloc calls; and a step's GPU time queued (common.gpu_seconds_queued: a batch already on the GPU,
normalised, forward, backward, SGD, nothing read back), so that the GPU's busy share is known. Truth `autograd` names
PyTorch's autograd thread, `workers` the workers, `dataset` the Dataset's class, function, query and database."""

import multiprocessing
import os
import resource
import shutil
import sqlite3
import tempfile
import threading
import time

from common import Scenario, comm_of, gpu_seconds_queued, tids_of

sc = Scenario("natural_sqlite_unindexed_getitem", "natural", "a ResNet-18-style classifier fed by 4 DataLoader "
              "workers whose Dataset.__getitem__ looks each sample's annotation up in a 120,000-row SQLite table by "
              "an unindexed text key (a full table scan per sample), 20 s, nothing staged",
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
    torch.backends.cudnn.benchmark = True
ROWS, SCENES, SIDE, CROP, BATCH, WIDTHS = ((120_000, 800, 128, 64, 64, (64, 128, 256, 512)) if sc.cuda
                                           else (20_000, 300, 64, 32, 32, (16, 32, 64, 64)))
CLASSES, WORKERS = 100, 4
QUERY = "SELECT scene, x0, y0, label FROM annotations WHERE ann_key = ?"
NSTAT = 4  # per worker: samples, query wall, query CPU, __getitem__ wall
STATS = multiprocessing.RawArray("d", NSTAT * WORKERS)  # shared with the forked workers
DATA_PARENT = os.environ.get("ZOO_DATA_DIR", "/var/tmp")
KEYS = ("wait_s", "wait_cpu_s", "h2d_s", "step_s", "backward_s", "item_s")
own = {"steps": 0, **dict.fromkeys(KEYS, 0.0), "running_loss": 0.0}


def make_scenes() -> np.ndarray:
    """The scenes: smooth colours and sensor noise, uint8."""
    rng = np.random.default_rng(0)
    low = rng.integers(0, 256, (SCENES, 3, SIDE // 8, SIDE // 8)).astype(np.float32)
    img = np.repeat(np.repeat(low, 8, 2), 8, 3)
    img += 12 * rng.standard_normal(img.shape, dtype=np.float32)
    return np.clip(img, 0, 255).astype(np.uint8)


def write_db(path: str) -> list[str]:
    """The labelling tool's export: one row an annotation, in the order they were made (not the manifest's); returns
    the manifest (every annotation's key, in the split's order)."""
    rng = np.random.default_rng(1)
    keys = [f"ann/{i:07d}-{h:08x}" for i, h in enumerate(rng.integers(0, 2**32, ROWS).tolist())]
    order = rng.permutation(ROWS).tolist()
    scene = rng.integers(0, SCENES, ROWS).tolist()
    x0, y0 = rng.integers(0, SIDE - CROP + 1, (2, ROWS)).tolist()
    label = rng.integers(0, CLASSES, ROWS).tolist()
    src = rng.integers(0, 12, ROWS).tolist()
    who = rng.integers(0, 40, ROWS).tolist()
    rows = [(keys[i], scene[i], x0[i], y0[i], label[i], f"batch-2024-{src[i] + 1:02d}", f"annotator{who[i]:02d}",
             f"2024-{src[i] + 1:02d}-{1 + i % 28:02d}T{i % 24:02d}:{i % 60:02d}:00Z") for i in order]
    con = sqlite3.connect(path)
    con.execute("CREATE TABLE annotations (id INTEGER PRIMARY KEY, ann_key TEXT NOT NULL, scene INTEGER NOT NULL, "
                "x0 INTEGER NOT NULL, y0 INTEGER NOT NULL, label INTEGER NOT NULL, source TEXT, annotator TEXT, "
                "added TEXT)")
    con.executemany("INSERT INTO annotations (ann_key, scene, x0, y0, label, source, annotator, added) "
                    "VALUES (?, ?, ?, ?, ?, ?, ?, ?)", rows)
    con.commit()
    con.close()
    return keys


def query_plan(path: str) -> str:
    con = sqlite3.connect(path)
    try:
        return "; ".join(str(r[-1]) for r in con.execute("EXPLAIN QUERY PLAN " + QUERY, ("x",)).fetchall())
    finally:
        con.close()


class AnnotatedCrops(torch.utils.data.Dataset):
    """Sample i: the manifest's i-th annotation, looked up in the database by its key; the crop of its scene at the
    box's corner, flipped at random, and its label. One connection per worker, opened on its first sample."""

    def __init__(self, scenes: np.ndarray, keys: list[str], db_path: str) -> None:
        self.scenes, self.keys, self.db_path = scenes, keys, db_path
        self.conn: sqlite3.Connection | None = None

    def __len__(self) -> int:
        return len(self.keys)

    def __getitem__(self, i: int):
        t0 = time.perf_counter()
        w = torch.utils.data.get_worker_info()
        wid = w.id if w is not None else 0
        if self.conn is None:
            self.conn = sqlite3.connect(self.db_path)
        q0, qc0 = time.perf_counter(), time.thread_time()
        scene, x0, y0, label = self.conn.execute(QUERY, (self.keys[i],)).fetchone()
        q1, qc1 = time.perf_counter(), time.thread_time()
        img = self.scenes[scene, :, y0:y0 + CROP, x0:x0 + CROP]
        if np.random.default_rng().random() < 0.5:
            img = img[:, :, ::-1]
        out = torch.from_numpy(np.ascontiguousarray(img))
        base = NSTAT * wid
        STATS[base] += 1
        STATS[base + 1] += q1 - q0
        STATS[base + 2] += qc1 - qc0
        STATS[base + 3] += time.perf_counter() - t0
        return out, label


class Block(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.c1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.b1 = nn.BatchNorm2d(cout)
        self.c2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.b2 = nn.BatchNorm2d(cout)
        self.short = (nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))
                      if stride != 1 or cin != cout else nn.Identity())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.relu(self.b2(self.c2(F.relu(self.b1(self.c1(x))))) + self.short(x))


def resnet18() -> nn.Module:
    layers = [nn.Conv2d(3, WIDTHS[0], 3, 1, 1, bias=False), nn.BatchNorm2d(WIDTHS[0]), nn.ReLU()]
    cin = WIDTHS[0]
    for k, cout in enumerate(WIDTHS):
        layers += [Block(cin, cout, 1 if k == 0 else 2), Block(cout, cout, 1)]
        cin = cout
    return nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(cin, CLASSES))


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
root = tempfile.mkdtemp(prefix="zoo_sqliteds_", dir=DATA_PARENT if os.path.isdir(DATA_PARENT) else None)
try:
    db_path, db_fix = os.path.join(root, "annotations.db"), os.path.join(root, "annotations_indexed.db")
    t_write = time.perf_counter()
    keys = write_db(db_path)
    shutil.copyfile(db_path, db_fix)
    con = sqlite3.connect(db_fix)
    con.execute("CREATE INDEX annotations_ann_key ON annotations(ann_key)")
    con.commit()
    con.close()
    os.sync()  # written back before the run: its writeback is not the run's
    write_s = time.perf_counter() - t_write
    plan, plan_fix = query_plan(db_path), query_plan(db_fix)
    db_bytes, db_fix_bytes = os.path.getsize(db_path), os.path.getsize(db_fix)
    scenes = make_scenes()
    torch.manual_seed(0)
    model = resnet18().to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, nesterov=True, weight_decay=5e-4)
    mean = torch.tensor([0.485, 0.456, 0.406], device=dev).view(1, 3, 1, 1) * 255
    std = torch.tensor([0.229, 0.224, 0.225], device=dev).view(1, 3, 1, 1) * 255

    def make_loader(path: str) -> None:
        loader = torch.utils.data.DataLoader(AnnotatedCrops(scenes, keys, path), batch_size=BATCH, shuffle=True,
                                             num_workers=WORKERS, persistent_workers=True, drop_last=True,
                                             generator=torch.Generator().manual_seed(0))
        state["loader"], state["it"] = loader, iter(loader)

    def train(img: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        t0 = time.perf_counter()
        x = (img.float() - mean) / std
        loss = F.cross_entropy(model(x), y)
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
        img, y = next_batch()
        t1, c1 = time.perf_counter(), time.thread_time()
        img, y = img.to(dev, non_blocking=True), y.to(dev, non_blocking=True)
        t2 = time.perf_counter()
        loss = train(img, y)
        t3 = time.perf_counter()
        own["running_loss"] += loss.item()
        own["item_s"] += time.perf_counter() - t3
        own["wait_s"] += t1 - t0
        own["wait_cpu_s"] += c1 - c0
        own["h2d_s"] += t2 - t1
        own["steps"] += 1

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

    # The fix first: the same lookups on the indexed copy.
    make_loader(db_fix)
    for _ in range(20):  # warm-up: the workers started, cuDNN's algorithms chosen, the allocator, the autograd thread
        step()
    sync()
    gpu_step_s = None
    if sc.cuda:
        fixed = tuple(t.to(dev) for t in next_batch())
        runs = sorted(r for r in (gpu_seconds_queued(torch, lambda _: train(*fixed)) for _ in range(5))
                      if r is not None)
        gpu_step_s = runs[len(runs) // 2] if runs else None
    reset()
    s_fix0 = list(STATS)
    fix_steps, fix_wall = timed(3.0 * sc.scale)
    s_fix1 = list(STATS)
    fix_wait_share = own["wait_s"] / fix_wall if fix_wall > 0 else None
    state["it"]._shutdown_workers()
    # As the script has it: the table scanned for every sample.
    make_loader(db_path)
    timed(1.5 * sc.scale)  # the new workers started and primed, the spin kernels well before the run
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
    per_worker.append({"worker_id": w_id, "samples": int(d[0]), "query_s": round(d[1], 4),
                       "query_cpu_s": round(d[2], 4), "getitem_s": round(d[3], 4)})
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


query_s, query_cpu_s, getitem_s = (total(k, per_worker) for k in ("query_s", "query_cpu_s", "getitem_s"))
samples = int(sum(r["samples"] for r in per_worker))
fix_samples = int(sum(s_fix1[NSTAT * w] - s_fix0[NSTAT * w] for w in range(WORKERS)))
fix_query_s = sum(s_fix1[NSTAT * w + 1] - s_fix0[NSTAT * w + 1] for w in range(WORKERS))
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
sc.extra["dataset"] = {"class": "AnnotatedCrops", "function": "AnnotatedCrops.__getitem__",
                       "file": os.path.basename(__file__), "query": QUERY,
                       "what": "a full scan of the annotations table per sample: ann_key has no index",
                       "database": db_path, "rows": ROWS, "db_bytes": db_bytes, "plan": plan,
                       "fix": "CREATE INDEX annotations_ann_key ON annotations(ann_key)", "plan_fix": plan_fix,
                       "db_fix_bytes": db_fix_bytes, "write_s": round(write_s, 3)}
sc.extra["self"] = {**{k: round(v, 4) if isinstance(v, float) else v for k, v in own.items()},
                    "wall_s": round(wall, 4), "steps_per_s": round(n / wall, 2),
                    "step_ms_mean": round(wall / max(n, 1) * 1e3, 3),
                    "wait_share": share(own["wait_s"]), "wait_cpu_share": share(own["wait_cpu_s"]),
                    "wait_off_cpu_s": round(wait_off, 4), "wait_off_cpu_share": share(wait_off),
                    "h2d_share": share(own["h2d_s"]), "step_share": share(own["step_s"]),
                    "backward_share": share(own["backward_s"]), "item_share": share(own["item_s"]),
                    "samples": samples, "query_s": query_s, "query_cpu_s": query_cpu_s, "getitem_s": getitem_s,
                    "query_ms_per_sample": round(query_s / max(samples, 1) * 1e3, 3),
                    "fix_query_ms_per_sample": round(fix_query_s / max(fix_samples, 1) * 1e3, 4),
                    # the workers' time in the query and in __getitem__, as shares of their time (workers x run)
                    "query_share_of_workers": round(query_s / (nw * wall), 4),
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
                    "at_fix_rate_s": r4(at_fix), "query_overhead_s": r4(overhead),
                    "query_overhead_share": share(overhead),
                    "main_run_s": main_run, "main_cpu_share": share(main_run),
                    "main_cpu_wait_s": main_wait, "main_cpu_wait_share": share(main_wait),
                    "autograd_run_s": ag_run, "autograd_cpu_share": share(ag_run),
                    "autograd_cpu_wait_s": ag_wait, "autograd_cpu_wait_share": share(ag_wait),
                    "minor_faults_per_s": round((f1 - f0) / wall, 1), "cuda_mallocs_per_s": round((m1 - m0) / wall, 3),
                    "gpu_step_ms": round(gpu_step_s * 1e3, 4) if gpu_step_s is not None else None,
                    "gpu_busy_s": r4(gpu_busy), "gpu_busy_share": share(gpu_busy),
                    "batch": BATCH, "rows": ROWS, "scenes": SCENES, "image": [3, SIDE, SIDE], "crop": CROP,
                    "num_workers": WORKERS}
if not sc.cuda:
    sc.note("on the CPU: no autograd thread (the backward runs on the main thread), no GPU timings, no allocator "
            "counters.")
sc.note(f"natural: measured by the script: {n} steps ({n / wall:.1f}/s) in {wall:.2f} s: {own['wait_s']:.2f} s in "
        f"next() ({wait_off:.2f} s of it off the main thread's CPU); the {len(workers)} workers spent {query_s:.2f} s "
        f"in the query ({query_s / max(samples, 1) * 1e3:.2f} ms a sample, {query_cpu_s:.2f} s on a CPU; plan: "
        f"{plan}); with the index {fix_rate and round(fix_rate, 1)} steps/s (the scans cost "
        f"{overhead and round(overhead, 2)} s of the run); the main thread ran {main_run} s, waited for a CPU "
        f"{main_wait} s; "
        + (f"a step's kernels take {gpu_step_s * 1e3:.2f} ms of GPU time queued (GPU busy {gpu_busy / wall:.0%} of the "
           "run)." if gpu_busy is not None else "no GPU timings (no CUDA)."))
sc.write_truth(baseline=(b0, b1), window=None, ratio_spans=((b0, mid), (mid, b1)))
