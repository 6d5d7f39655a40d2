"""natural_cpu_metrics_omp (natural, nothing staged): a 1000-class classifier trained as a first script writes it, with
its metrics computed every step on the CPU: an MLP (512-2048-2048-2048-1000, batch 8192, fp32 without TF32, fused AdamW)
trained from batches already on the GPU (labels from a fixed random linear teacher); each step moves the logits (8192 x
1000 float32, 32 MB, pageable) and the labels to the CPU with .cpu() and computes with torch CPU ops: softmax, top-1
(max) and top-5 (topk) accuracy, the batch's confusion matrix (bincount) added to a running one (1000 x 1000), per-class
precision, recall and F1, the NLL, the mean entropy, a 15-bin calibration error and a sort-based ROC AUC for the 8
classes with the most support. PyTorch's default intra-op thread count is kept (no torch.set_num_threads: it sizes its
OpenMP pool by the host's CPUs while the job is pinned to CPUs 2-3); 20 s. The script measures itself: the time to queue
a step (forward, backward, optimiser step), the .cpu() calls (they wait for the step's kernels, then copy), the metrics;
the main thread's own schedstat (/proc/.../schedstat: run and run-queue wait) over the run and within the metrics (the
rest of the metrics' wall time it slept: at the OpenMP barriers), the intra-op threads' (the threads the first metrics
pass started; truth `intra_op`) and every other thread's CPU time over the run, the process's minor page faults, a copy
of the logits alone after a synchronise, and a step's GPU time queued (common.gpu_seconds_queued), so that the GPU's
busy share is known. Truth `threads`: every thread's tid and OS name, `intra_op_threads`: torch.get_num_threads()."""

import os
import threading
import time

from common import Scenario, comm_of, gpu_seconds_queued, tids_of

sc = Scenario("natural_cpu_metrics_omp", "natural", "a 1000-class MLP whose metrics (softmax, top-1/top-5, confusion "
              "matrix, F1, calibration, AUC) are computed every step with torch CPU ops and PyTorch's default intra-op "
              "threads on a 2-CPU job, 20 s, nothing staged", job_cpus=[2, 3], control=True)
import torch  # noqa: E402

PID, MAIN = os.getpid(), threading.get_native_id()
AT_IMPORT = set(tids_of(PID))  # the main thread and what importing torch (numpy's BLAS) started
dev = torch.device(sc.device)
NCLASS, IN_DIM, BINS, NAUC = 1000, 512, 15, 8
WIDTH, BATCH = (2048, 8192) if sc.cuda else (64, 1024)
if sc.cuda:
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
torch.manual_seed(0)
nn = torch.nn
model = nn.Sequential(nn.Linear(IN_DIM, WIDTH), nn.ReLU(), nn.Linear(WIDTH, WIDTH), nn.ReLU(),
                      nn.Linear(WIDTH, WIDTH), nn.ReLU(), nn.Linear(WIDTH, NCLASS)).to(dev)
opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=sc.cuda or None)
loss_fn = nn.CrossEntropyLoss()
teacher = torch.randn(IN_DIM, NCLASS, device=dev)
xs = torch.randn(8, BATCH, IN_DIM, device=dev)
ys = (xs @ teacher).argmax(-1)
EDGES = torch.linspace(0, 1, BINS + 1)[1:-1]
running_cm = torch.empty(0, dtype=torch.int64)  # made (zeroed) with the first metrics, after the threads are listed
own = {"steps": 0, "issue_s": 0.0, "copy_s": 0.0, "metrics_s": 0.0, "metrics_run_s": 0.0, "metrics_wait_s": 0.0}
last: dict = {}
_fd = os.open(f"/proc/{PID}/task/{MAIN}/schedstat", os.O_RDONLY)


def my_schedstat() -> tuple[int, int]:
    """The main thread's time on a CPU and waiting on a run queue (ns), as the kernel counts them."""
    run, wait = os.pread(_fd, 128, 0).split()[:2]
    return int(run), int(wait)


def schedstat(tid: int) -> tuple[int, int] | None:
    try:
        run, wait = open(f"/proc/{PID}/task/{tid}/schedstat").read().split()[:2]
        return int(run), int(wait)
    except (OSError, ValueError):
        return None


def minflt() -> int:
    return int(open(f"/proc/{PID}/stat").read().rsplit(")", 1)[1].split()[7])


def cpu_metrics(logits: torch.Tensor, y: torch.Tensor) -> dict:
    """The batch's metrics, all with torch CPU ops (intra-op parallel where large enough)."""
    probs = logits.softmax(dim=1)
    conf, pred = probs.max(dim=1)
    top5 = probs.topk(5, dim=1).indices
    top1_acc = (pred == y).float().mean()
    top5_acc = (top5 == y[:, None]).any(dim=1).float().mean()
    cm = torch.bincount(y * NCLASS + pred, minlength=NCLASS * NCLASS).reshape(NCLASS, NCLASS)
    running_cm.add_(cm)
    tp = cm.diagonal().double()
    precision = tp / cm.sum(0).clamp(min=1)
    recall = tp / cm.sum(1).clamp(min=1)
    f1 = 2 * precision * recall / (precision + recall).clamp(min=1e-12)
    logp = probs.clamp_min(1e-12).log()
    nll = -logp.gather(1, y[:, None]).mean()
    entropy = -(probs * logp).sum(dim=1).mean()
    bins = torch.bucketize(conf, EDGES)
    hits = (pred == y).double()
    count = torch.bincount(bins, minlength=BINS).double()
    ece = (torch.bincount(bins, conf.double(), BINS) - torch.bincount(bins, hits, BINS)).abs().sum() / len(y)
    aucs = []
    support = torch.bincount(y, minlength=NCLASS)
    for c in support.topk(NAUC).indices.tolist():
        scores, positive = probs[:, c], y == c
        ranks = torch.empty(len(y), dtype=torch.float64)
        ranks[scores.argsort()] = torch.arange(1, len(y) + 1, dtype=torch.float64)
        npos = int(positive.sum())
        nneg = len(y) - npos
        aucs.append(((ranks[positive].sum() - npos * (npos + 1) / 2) / (npos * nneg)).item() if npos and nneg
                    else float("nan"))
    return {"top1": top1_acc.item(), "top5": top5_acc.item(), "macro_f1": f1.mean().item(), "nll": nll.item(),
            "entropy": entropy.item(), "ece": ece.item(), "auc": aucs, "bins_used": int((count > 0).sum()),
            "running_acc": (running_cm.diagonal().sum() / running_cm.sum().clamp(min=1)).item()}


def step() -> None:
    t0 = time.perf_counter()
    i = own["steps"] % len(xs)
    x, y = xs[i], ys[i]
    logits = model(x)
    loss = loss_fn(logits, y)
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    t1 = time.perf_counter()
    logits_cpu, y_cpu = logits.detach().cpu(), y.cpu()  # waits for the step's kernels, then copies
    loss_v = loss.item()
    t2 = time.perf_counter()
    r0, w0 = my_schedstat()
    last.update(cpu_metrics(logits_cpu, y_cpu), loss=loss_v)
    r1, w1 = my_schedstat()
    t3 = time.perf_counter()
    own["issue_s"] += t1 - t0
    own["copy_s"] += t2 - t1
    own["metrics_s"] += t3 - t2
    own["metrics_run_s"] += (r1 - r0) / 1e9
    own["metrics_wait_s"] += (w1 - w0) / 1e9
    own["steps"] += 1


def sync() -> None:
    if sc.cuda:
        torch.cuda.synchronize()


def work(_) -> None:
    """A step's GPU work, nothing read back."""
    loss_fn(model(xs[0]), ys[0]).backward()
    opt.step()
    opt.zero_grad(set_to_none=True)


for _ in range(10):  # the training alone first: the autograd thread and the driver's threads are started
    work(None)
sync()
before = set(tids_of(PID))  # no CPU op so far was large enough to run in parallel (on CUDA)
running_cm = torch.zeros(NCLASS, NCLASS, dtype=torch.int64)
step()  # the running confusion matrix and the first metrics pass: OpenMP starts its intra-op threads
intra = sorted(set(tids_of(PID)) - before)
how = "started by the first metrics pass"
if not intra:  # the pool was there already: the threads named as the main thread that importing torch did not start
    intra = [t for t in tids_of(PID) if t != MAIN and t not in AT_IMPORT and comm_of(PID, t) == comm_of(PID, MAIN)]
    how = "named as the main thread, started after importing torch"
for _ in range(20):
    step()
sync()
copies = []
for _ in range(7):  # a copy of the logits alone (the GPU idle): what the pageable 32 MB copy costs by itself
    out = model(xs[0]).detach()
    sync()
    c0 = time.perf_counter()
    out.cpu()
    copies.append(time.perf_counter() - c0)
copy_alone_s = sorted(copies)[len(copies) // 2]
gpu_step_s = None
if sc.cuda:
    runs = sorted(r for r in (gpu_seconds_queued(torch, work) for _ in range(5)) if r is not None)
    gpu_step_s = runs[len(runs) // 2] if runs else None
warm_end = time.perf_counter() + 2.0 * sc.scale  # the spin kernels well before the baseline
while time.perf_counter() < warm_end:
    step()
sync()
for k in own:
    own[k] = 0 if k == "steps" else 0.0
tids0 = tids_of(PID)
stats0 = {t: schedstat(t) for t in tids0}
flt0 = minflt()
b0 = sc.mark("baseline")
t = time.perf_counter()
sc.run_for(10.0 * sc.scale, step)
mid = sc.mark("half")
sc.run_for(10.0 * sc.scale, step)
b1 = sc.mark("end")
wall = time.perf_counter() - t
flt1 = minflt()
stats1 = {t: schedstat(t) for t in tids_of(PID)}
names = {t: comm_of(PID, t) for t in stats1}


def group_s(tids: list[int], k: int) -> float | None:
    """The CPU time (k=0) or run-queue wait (k=1) of these threads over the run (s); None: schedstat unreadable."""
    got = [(stats1[t][k] - (stats0.get(t) or (0, 0))[k]) for t in tids if stats1.get(t)]
    return round(sum(got) / 1e9, 4) if got or not tids else None


n = own["steps"]
intra_now = [t for t in intra if t in stats1]
others = [t for t in stats1 if t != MAIN and t not in intra]
main_run, main_wait = group_s([MAIN], 0), group_s([MAIN], 1)
metrics_sleep = max(0.0, own["metrics_s"] - own["metrics_run_s"] - own["metrics_wait_s"])
gpu_busy = n * gpu_step_s if gpu_step_s is not None else None


def share(v: float | None) -> float | None:
    return round(v / wall, 4) if v is not None else None


sc.extra["intra_op"] = {"pid": PID, "tids": intra, "comms": [names.get(t) or comm_of(PID, t) for t in intra],
                        "how": how}
sc.extra["threads"] = [{"tid": t, "comm": names[t]} for t in sorted(names)]
sc.extra["intra_op_threads"] = torch.get_num_threads()
sc.extra["self"] = {**{k: round(v, 4) for k, v in own.items()}, "wall_s": round(wall, 4),
                    "steps_per_s": round(n / wall, 2), "step_ms_mean": round(wall / max(n, 1) * 1e3, 4),
                    "issue_share": share(own["issue_s"]), "copy_share": share(own["copy_s"]),
                    "metrics_share": share(own["metrics_s"]),
                    "metrics_sleep_s": round(metrics_sleep, 4), "metrics_sleep_share": share(metrics_sleep),
                    "metrics_wait_share": share(own["metrics_wait_s"]),
                    "main_run_s": main_run, "main_cpu_wait_s": main_wait, "main_cpu_wait_share": share(main_wait),
                    "intra_op_run_s": group_s(intra_now, 0), "intra_op_cpu_wait_s": group_s(intra_now, 1),
                    "other_threads_run_s": group_s(others, 0),
                    "intra_op_threads": torch.get_num_threads(), "intra_op_started": len(intra),
                    "job_cpus": len(sc.job_cpus), "host_cpus": os.cpu_count(),
                    "minor_faults_per_s": round((flt1 - flt0) / wall, 1),
                    "copy_alone_ms": round(copy_alone_s * 1e3, 4),
                    "gpu_step_ms": round(gpu_step_s * 1e3, 4) if gpu_step_s is not None else None,
                    "gpu_busy_share": round(gpu_busy / wall, 4) if gpu_busy is not None else None,
                    "batch": BATCH, "classes": NCLASS, "top1": round(last.get("top1", 0.0), 4),
                    "top5": round(last.get("top5", 0.0), 4), "running_acc": round(last.get("running_acc", 0.0), 4),
                    "parallel": torch.__config__.parallel_info().splitlines()[-1].strip()}
sc.note(f"natural: measured by the script: {n} steps ({n / wall:.1f}/s) in {wall:.2f} s: {own['issue_s']:.2f} s "
        f"queueing the steps, {own['copy_s']:.2f} s in .cpu() (the step's kernels, then the 32 MB copy; alone "
        f"{copy_alone_s * 1e3:.2f} ms), {own['metrics_s']:.2f} s of metrics with torch CPU ops on "
        f"{torch.get_num_threads()} intra-op threads ({len(intra)} started) over {len(sc.job_cpus)} CPUs, of which the "
        f"main thread ran {own['metrics_run_s']:.2f} s, waited for a CPU {own['metrics_wait_s']:.2f} s and slept "
        f"{metrics_sleep:.2f} s; the main thread waited for a CPU {main_wait} s of the run; "
        + (f"a step's kernels take {gpu_step_s * 1e3:.2f} ms of GPU time queued (GPU busy {gpu_busy / wall:.0%} of the "
           "run)." if gpu_busy is not None else "no GPU timings (no CUDA)."))
sc.write_truth(baseline=(b0, b1), window=None, ratio_spans=((b0, mid), (mid, b1)))
