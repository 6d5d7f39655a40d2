"""natural_cpu_eval_metrics (natural, nothing staged): the zoo's MLP (512-2048-2048-2048-10, batch 8192, fused AdamW,
loss.item() each step) trained from batches already on the GPU, with an evaluation every 2 s as a script without
scikit-learn writes one: the model's class probabilities for 50,000 held-out samples (forward in chunks on the GPU
under no_grad, softmax), moved to the CPU with .cpu().tolist(), then metrics in pure Python on the main thread: each
prediction's argmax, a confusion matrix, per-class precision, recall and F1, the macro F1, a 15-bin expected
calibration error and a one-vs-rest ROC AUC per class (sort and rank sum): ~0.3-0.5 s of Python each. CPU 2, 20 s. The
script measures itself: the time in training steps, in each evaluation's GPU part (forward and copy back) and in its
Python metrics, each evaluation's moments (evals_ns; eval_cpu_ns, the Python part alone), and a training step's GPU
time queued (common.gpu_seconds_queued), so that the GPU's busy share of the training is known."""

import time

from common import Scenario, Trainer, gpu_seconds_queued

sc = Scenario("natural_cpu_eval_metrics", "natural", "training with an evaluation every 2 s whose metrics (confusion "
              "matrix, F1, calibration, ROC AUC) are computed in pure Python on the main thread, 20 s, nothing staged",
              job_cpus=[2], control=True)
tr = Trainer(sc)
torch = tr.torch
model = tr.model
NEVAL, NCLASS, BINS, CHUNK = (50_000 if sc.cuda else 5_000), 10, 15, 8192
EVERY = 2.0
g = torch.Generator(device=tr.dev).manual_seed(1)
evx = torch.randn(NEVAL, tr.in_dim, device=tr.dev, generator=g)
evy = torch.randint(0, NCLASS, (NEVAL,), device=tr.dev, generator=g)
labels = evy.tolist()
own = {"train_s": 0.0, "eval_gpu_s": 0.0, "eval_cpu_s": 0.0, "steps": 0, "evals": 0}
evals_ns: list[list[int]] = []
eval_cpu_ns: list[list[int]] = []
last: dict = {}


def roc_auc(scores: list[float], positive: list[bool]) -> float:
    """One-vs-rest ROC AUC by the rank sum (Mann-Whitney U), ties given their mean rank."""
    order = sorted(range(len(scores)), key=scores.__getitem__)
    rank_sum, npos, i = 0.0, 0, 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and scores[order[j + 1]] == scores[order[i]]:
            j += 1
        mean_rank = (i + j) / 2 + 1
        for k in range(i, j + 1):
            if positive[order[k]]:
                rank_sum += mean_rank
                npos += 1
        i = j + 1
    nneg = len(scores) - npos
    return (rank_sum - npos * (npos + 1) / 2) / (npos * nneg) if npos and nneg else float("nan")


def metrics(probs: list[list[float]], ys: list[int]) -> dict:
    """Accuracy, confusion matrix, per-class P/R/F1, macro F1, ECE, per-class ROC AUC: pure Python."""
    preds = [max(range(NCLASS), key=row.__getitem__) for row in probs]
    cm = [[0] * NCLASS for _ in range(NCLASS)]
    for p, y in zip(preds, ys):
        cm[y][p] += 1
    f1 = []
    for c in range(NCLASS):
        tp = cm[c][c]
        fp = sum(cm[r][c] for r in range(NCLASS)) - tp
        fn = sum(cm[c]) - tp
        prec = tp / (tp + fp) if tp + fp else 0.0
        rec = tp / (tp + fn) if tp + fn else 0.0
        f1.append(2 * prec * rec / (prec + rec) if prec + rec else 0.0)
    conf_sum, hit, count = [0.0] * BINS, [0] * BINS, [0] * BINS
    for row, p, y in zip(probs, preds, ys):
        b = min(int(row[p] * BINS), BINS - 1)
        conf_sum[b] += row[p]
        hit[b] += p == y
        count[b] += 1
    ece = sum(abs(conf_sum[b] - hit[b]) for b in range(BINS)) / len(ys)
    aucs = [roc_auc([row[c] for row in probs], [y == c for y in ys]) for c in range(NCLASS)]
    return {"accuracy": sum(p == y for p, y in zip(preds, ys)) / len(ys), "macro_f1": sum(f1) / NCLASS,
            "f1": f1, "ece": ece, "auc": aucs}


def evaluate() -> None:
    n0 = time.time_ns()
    t0 = time.perf_counter()
    with torch.no_grad():
        probs = torch.cat([model(evx[k:k + CHUNK]).softmax(-1) for k in range(0, NEVAL, CHUNK)])
        rows = probs.cpu().tolist()
    t1, n1 = time.perf_counter(), time.time_ns()
    last.update(metrics(rows, labels))
    t2, n2 = time.perf_counter(), time.time_ns()
    own["eval_gpu_s"] += t1 - t0
    own["eval_cpu_s"] += t2 - t1
    own["evals"] += 1
    evals_ns.append([n0, n2])
    eval_cpu_ns.append([n1, n2])


def work(_) -> None:
    """A training step's GPU work, nothing read back."""
    loss = tr.loss_fn(model(tr.xs[0]), tr.ys[0])
    loss.backward()
    tr.opt.step()
    tr.opt.zero_grad(set_to_none=True)


tr.warmup()
evaluate()
gpu_step_s = None
if sc.cuda:
    runs = sorted(r for r in (gpu_seconds_queued(torch, work) for _ in range(5)) if r is not None)
    gpu_step_s = runs[len(runs) // 2] if runs else None
warm_end = time.perf_counter() + 2.0 * sc.scale  # the spin kernels well before the baseline
while time.perf_counter() < warm_end:
    tr.step()
tr.sync()
own.update(eval_gpu_s=0.0, eval_cpu_s=0.0, evals=0)
evals_ns.clear()
eval_cpu_ns.clear()
next_eval = [EVERY * sc.scale]
start = [0.0]


def step() -> None:
    if time.perf_counter() - start[0] >= next_eval[0]:
        evaluate()
        next_eval[0] += EVERY * sc.scale
        return
    t = time.perf_counter()
    tr.step()
    own["train_s"] += time.perf_counter() - t
    own["steps"] += 1


b0 = sc.mark("baseline")
start[0] = time.perf_counter()
sc.run_for(10.0 * sc.scale, step)
mid = sc.mark("half")
sc.run_for(10.0 * sc.scale, step)
b1 = sc.mark("end")
wall = time.perf_counter() - start[0]
train_wall = wall - own["eval_gpu_s"] - own["eval_cpu_s"]
gpu_busy = own["steps"] * gpu_step_s if gpu_step_s is not None else None
sc.extra["self"] = {**{k: round(v, 4) for k, v in own.items()}, "wall_s": round(wall, 4),
                    "eval_share": round((own["eval_gpu_s"] + own["eval_cpu_s"]) / wall, 4),
                    "eval_cpu_share": round(own["eval_cpu_s"] / wall, 4),
                    "eval_cpu_s_each": round(own["eval_cpu_s"] / max(own["evals"], 1), 4),
                    "gpu_step_ms": round(gpu_step_s * 1e3, 4) if gpu_step_s is not None else None,
                    "gpu_busy_share_training": round(gpu_busy / train_wall, 4) if gpu_busy is not None else None,
                    "eval_samples": NEVAL, "macro_f1": round(last.get("macro_f1", 0.0), 4)}
sc.extra["evals_ns"], sc.extra["eval_cpu_ns"] = evals_ns, eval_cpu_ns
sc.note(f"natural: measured by the script: {own['steps']} training steps in {own['train_s']:.2f} s, {own['evals']} "
        f"evaluations of {NEVAL} samples: {own['eval_gpu_s']:.2f} s forward and copy back, {own['eval_cpu_s']:.2f} s "
        f"of metrics in Python on the main thread, of {wall:.2f} s; "
        + (f"a training step's kernels take {gpu_step_s * 1e3:.2f} ms of GPU time queued (GPU busy "
           f"{gpu_busy / train_wall:.0%} of the training time)." if gpu_busy is not None
           else "no GPU timings (no CUDA)."))
sc.write_truth(baseline=(b0, b1), window=None, ratio_spans=((b0, mid), (mid, b1)))
