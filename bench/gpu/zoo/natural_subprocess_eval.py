"""natural_subprocess_eval (natural, nothing staged): a classifier's training loop that evaluates in a child process,
as a team whose metrics live in a separate script (numpy only, shared with their offline tooling) writes it: an MLP
(512-2048-2048-2048-100, batch 8192, fp32 without TF32, fused AdamW, loss.item() each step for the running loss) on
synthetic data whose labels a fixed random "teacher" projection gives (so that it learns and the metrics mean
something), batches held on the GPU. Every EVAL_EVERY steps (chosen at start-up from the measured step rate, so that an
evaluation comes every ~2.5 s) the main thread predicts a held-out set of 65,536 samples on the GPU (inference_mode,
batches of 8192), copies the logits to the host (.cpu(), 26 MB float32), np.save()s them to a local .npy file in a
temporary folder, and runs the evaluation script there (eval_metrics.py, written to the folder at start-up) with
subprocess.run([sys.executable, eval_metrics.py, preds.npy, labels.npy], capture_output=True, text=True, check=True),
waiting for it: the child starts Python, imports numpy, loads both files and computes softmax, top-1/top-5 accuracy,
NLL, a Brier score, a confusion matrix (bincount), per-class precision/recall/F1, a 15-bin calibration error and the
one-vs-rest ROC AUC of every class by ranks (argsort), and prints one JSON line (its metrics, its pid, its own clocks
and /proc/self/schedstat) that the parent parses and logs. The children inherit the job's CPUs 2-3. 20 s (smaller with
--device cpu: a 64-wide MLP, 16,384 held-out samples).

The script measures itself: the steps per second; the main thread's time queueing the steps and in loss.item(); per
evaluation its time predicting (the forward passes and .cpu()), in np.save (wall, and its CPU time and run-queue wait by
/proc/thread-self/schedstat: the rest off a CPU) and in subprocess.run (likewise), the number of evaluations, each
child's pid, its start-up (from the call to the child's first line, its interpreter started), numpy import, load,
metrics and exit (from its last line to the call's return) by its own clock, its CPU time and minor page faults
(resource.getrusage(RUSAGE_CHILDREN) deltas around the call) and its run-queue wait (its schedstat); over the run the
main thread's time on a CPU and waiting for one (schedstat), the process's minor page faults, the device allocator's
cudaMalloc calls; and the GPU time queued (common.gpu_seconds_queued) of a training step and of an evaluation's forward
passes, so that the GPU's busy share is known. Truth `evals_ns` and `subprocess_ns` are the evaluations' and the
subprocess.run calls' spans on the truth's clock; `children` names the children (comm, pids, how many)."""

import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np

from common import Scenario, gpu_seconds_queued

sc = Scenario("natural_subprocess_eval", "natural", "an MLP classifier that every ~2.5 s predicts a held-out set, "
              "saves the logits to a .npy file and runs a numpy metrics script in a child process with subprocess.run, "
              "waiting for it; loss.item() each step, 20 s, nothing staged", job_cpus=[2, 3], control=True)
import torch  # noqa: E402

dev = torch.device(sc.device)
IN, WIDTH, NCLASS, BATCH, NEVAL, EVAL_BATCH = ((512, 2048, 100, 8192, 65536, 8192) if sc.cuda else
                                               (512, 64, 100, 256, 16384, 4096))
EVAL_PERIOD_S = 2.5 * sc.scale
CHILD_COMM = os.path.basename(sys.executable)[:15]  # the kernel names a process by the file it executes
if sc.cuda:
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
WORKDIR = tempfile.mkdtemp(prefix="zoo_subeval_")
EVAL_SCRIPT = os.path.join(WORKDIR, "eval_metrics.py")
PREDS, LABELS = os.path.join(WORKDIR, "preds.npy"), os.path.join(WORKDIR, "labels.npy")
EVAL_CODE = '''"""Offline evaluation of a classifier's logits against its labels (numpy only): prints one JSON line."""
import json
import os
import sys
import time

t_start = time.time()
import numpy as np  # noqa: E402

t_imported = time.time()


def auc_ovr(scores, positive):
    """One-vs-rest ROC AUC by ranks (the Mann-Whitney U statistic)."""
    n_pos = int(positive.sum())
    n_neg = len(scores) - n_pos
    if n_pos == 0 or n_neg == 0:
        return float("nan")
    ranks = np.empty(len(scores))
    ranks[np.argsort(scores, kind="stable")] = np.arange(1, len(scores) + 1)
    return float((ranks[positive].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg))


def main():
    logits, labels = np.load(sys.argv[1]), np.load(sys.argv[2])
    t_loaded = time.time()
    n, k = logits.shape
    probs = logits - logits.max(axis=1, keepdims=True)
    np.exp(probs, out=probs)
    probs /= probs.sum(axis=1, keepdims=True)
    pred = probs.argmax(axis=1)
    top5 = np.argpartition(probs, -5, axis=1)[:, -5:]
    p_true = probs[np.arange(n), labels]
    onehot = np.zeros_like(probs)
    onehot[np.arange(n), labels] = 1.0
    cm = np.bincount(labels * k + pred, minlength=k * k).reshape(k, k)
    tp = np.diag(cm).astype(np.float64)
    precision = tp / np.maximum(cm.sum(axis=0), 1)
    recall = tp / np.maximum(cm.sum(axis=1), 1)
    f1 = 2 * precision * recall / np.maximum(precision + recall, 1e-12)
    conf = probs.max(axis=1)
    correct = pred == labels
    bins = np.minimum((conf * 15).astype(np.int64), 14)
    ece = 0.0
    for b in range(15):
        m = bins == b
        if m.any():
            ece += m.mean() * abs(correct[m].mean() - conf[m].mean())
    columns = np.ascontiguousarray(probs.T)
    aucs = np.array([auc_ovr(columns[c], labels == c) for c in range(k)])
    t_done = time.time()
    with open("/proc/self/schedstat") as fh:
        run_ns, wait_ns = (int(v) for v in fh.read().split()[:2])
    print(json.dumps({
        "n": int(n), "classes": int(k), "top1": float(correct.mean()),
        "top5": float((top5 == labels[:, None]).any(axis=1).mean()),
        "nll": float(-np.log(np.clip(p_true, 1e-12, None)).mean()),
        "brier": float(((probs - onehot) ** 2).sum(axis=1).mean()),
        "macro_f1": float(f1.mean()), "ece": float(ece), "macro_auc": float(np.nanmean(aucs)),
        "pid": os.getpid(), "t_start": t_start, "t_imported": t_imported, "t_loaded": t_loaded, "t_done": t_done,
        "cpu_s": time.process_time(), "run_ns": run_ns, "wait_ns": wait_ns}))


if __name__ == "__main__":
    main()
'''
with open(EVAL_SCRIPT, "w") as fh:
    fh.write(EVAL_CODE)

# ---- data and model ------------------------------------------------------------------------
torch.manual_seed(0)
teacher = torch.randn(IN, NCLASS, device=dev) / IN ** 0.5


def make(n: int) -> tuple[torch.Tensor, torch.Tensor]:
    x = torch.randn(n, IN, device=dev)
    return x, (x @ teacher + 0.5 * torch.randn(n, NCLASS, device=dev)).argmax(dim=1)


train_xs, train_ys = zip(*(make(BATCH) for _ in range(16)))
x_eval, y_eval = make(NEVAL)
np.save(LABELS, y_eval.cpu().numpy())
nn = torch.nn
model = nn.Sequential(nn.Linear(IN, WIDTH), nn.ReLU(), nn.Linear(WIDTH, WIDTH), nn.ReLU(), nn.Linear(WIDTH, WIDTH),
                      nn.ReLU(), nn.Linear(WIDTH, NCLASS)).to(dev)
opt = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=sc.cuda or None)
loss_fn = nn.CrossEntropyLoss()
own = {"steps": 0, "issue_s": 0.0, "item_s": 0.0, "evals": 0, "predict_s": 0.0, "save_s": 0.0, "save_run_s": 0.0,
       "save_cpu_wait_s": 0.0, "sub_s": 0.0, "sub_run_s": 0.0, "sub_cpu_wait_s": 0.0, "parse_s": 0.0,
       "child_startup_s": 0.0, "child_import_s": 0.0, "child_load_s": 0.0, "child_metrics_s": 0.0,
       "child_exit_s": 0.0, "children_cpu_s": 0.0, "children_minflt": 0, "children_run_s": 0.0,
       "children_cpu_wait_s": 0.0, "running_loss": 0.0}
children: list[dict] = []
evals: list[tuple[float, float]] = []
calls: list[tuple[float, float]] = []
history: list[dict] = []
state = {"i": 0, "eval_every": 10 ** 9}


def schedstat() -> tuple[float, float | None]:
    """The calling thread's time on a CPU and waiting on a run queue (s), by the kernel's schedstat; where that is not
    kept, its CPU clock and None."""
    try:
        with open("/proc/thread-self/schedstat") as fh:
            run_ns, wait_ns = fh.read().split()[:2]
        return int(run_ns) / 1e9, int(wait_ns) / 1e9
    except (OSError, ValueError):
        return time.thread_time(), None


def mallocs() -> int:
    return int(torch.cuda.memory_stats().get("segment.all.allocated", 0)) if sc.cuda else 0


def train_step() -> torch.Tensor:
    i = state["i"]
    state["i"] += 1
    loss = loss_fn(model(train_xs[i % 16]), train_ys[i % 16])
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    return loss


@torch.inference_mode()
def forward_eval() -> torch.Tensor:
    model.eval()
    out = torch.cat([model(x_eval[a:a + EVAL_BATCH]) for a in range(0, NEVAL, EVAL_BATCH)])
    model.train()
    return out


def evaluate() -> None:
    """Predict the held-out set, save the logits, run the metrics script in a child and wait for it."""
    t0 = time.perf_counter()
    logits = forward_eval().float().cpu().numpy()
    t1 = time.perf_counter()
    r1, w1 = schedstat()
    np.save(PREDS, logits)
    r2, w2 = schedstat()
    t2 = time.perf_counter()
    ch0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    wall0 = time.time()
    out = subprocess.run([sys.executable, EVAL_SCRIPT, PREDS, LABELS], capture_output=True, text=True, check=True)
    wall1 = time.time()
    ch1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    r3, w3 = schedstat()
    t3 = time.perf_counter()
    metrics = json.loads(out.stdout.strip().splitlines()[-1])
    history.append({"step": own["steps"], **{k: metrics[k] for k in ("top1", "top5", "nll", "macro_f1", "ece",
                                                                      "macro_auc")}})
    t4 = time.perf_counter()
    if own["evals"] % 4 == 0:
        print(f"step {own['steps']}: loss {own['running_loss'] / max(own['steps'], 1):.4f} top1 {metrics['top1']:.4f} "
              f"top5 {metrics['top5']:.4f} auc {metrics['macro_auc']:.4f} (eval {t4 - t0:.2f} s)", flush=True)
    cpu = (ch1.ru_utime + ch1.ru_stime) - (ch0.ru_utime + ch0.ru_stime)
    child = {"pid": metrics["pid"], "cpu_s": round(cpu, 4), "minflt": ch1.ru_minflt - ch0.ru_minflt,
             "startup_s": round(metrics["t_start"] - wall0, 4),
             "import_s": round(metrics["t_imported"] - metrics["t_start"], 4),
             "load_s": round(metrics["t_loaded"] - metrics["t_imported"], 4),
             "metrics_s": round(metrics["t_done"] - metrics["t_loaded"], 4),
             "exit_s": round(wall1 - metrics["t_done"], 4), "wall_s": round(t3 - t2, 4),
             "run_s": round(metrics["run_ns"] / 1e9, 4), "cpu_wait_s": round(metrics["wait_ns"] / 1e9, 4)}
    own["evals"] += 1
    own["predict_s"] += t1 - t0
    own["save_s"] += t2 - t1
    own["save_run_s"] += r2 - r1
    own["save_cpu_wait_s"] += (w2 - w1) if w1 is not None and w2 is not None else 0.0
    own["sub_s"] += t3 - t2
    own["sub_run_s"] += r3 - r2
    own["sub_cpu_wait_s"] += (w3 - w2) if w2 is not None and w3 is not None else 0.0
    own["parse_s"] += t4 - t3
    for key in ("startup", "import", "load", "metrics", "exit"):
        own[f"child_{key}_s"] += child[f"{key}_s"]
    own["children_cpu_s"] += cpu
    own["children_minflt"] += child["minflt"]
    own["children_run_s"] += child["run_s"]
    own["children_cpu_wait_s"] += child["cpu_wait_s"]
    children.append(child)
    evals.append((t0, t4))
    calls.append((t2, t3))


def step() -> None:
    t0 = time.perf_counter()
    loss = train_step()
    t1 = time.perf_counter()
    own["running_loss"] += loss.item()
    t2 = time.perf_counter()
    own["issue_s"] += t1 - t0
    own["item_s"] += t2 - t1
    own["steps"] += 1
    if own["steps"] % state["eval_every"] == 0:
        evaluate()


def reset() -> None:
    for k in own:
        own[k] = 0 if k in ("steps", "evals", "children_minflt") else 0.0
    for got in (children, evals, calls, history):
        got.clear()


def sync() -> None:
    if sc.cuda:
        torch.cuda.synchronize()


# ---- warm-up: the allocator, cuBLAS, the first evaluations; the evaluation period from the step rate ---------------
for _ in range(20):
    step()
sync()
t = time.perf_counter()
n0 = own["steps"]
while time.perf_counter() - t < max(1.0 * sc.scale, 0.3):
    step()
sync()
rate = (own["steps"] - n0) / (time.perf_counter() - t)
state["eval_every"] = max(10, round(rate * EVAL_PERIOD_S / 10.0) * 10)
evaluate()
evaluate()
gpu_step_s = gpu_eval_s = None
if sc.cuda:
    def work_step(_) -> None:
        train_step()

    def work_eval(_) -> None:
        forward_eval()

    runs = sorted(r for r in (gpu_seconds_queued(torch, work_step) for _ in range(5)) if r is not None)
    gpu_step_s = runs[len(runs) // 2] if runs else None
    runs = sorted(r for r in (gpu_seconds_queued(torch, work_eval) for _ in range(3)) if r is not None)
    gpu_eval_s = runs[len(runs) // 2] if runs else None
warm_end = time.perf_counter() + 2.0 * sc.scale  # the spin kernels well before the baseline
while time.perf_counter() < warm_end:
    step()
sync()
reset()
ch_run0 = resource.getrusage(resource.RUSAGE_CHILDREN)
f0, m0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt, mallocs()
run0, wait0 = schedstat()
try:
    b0 = sc.mark("baseline")
    t = time.perf_counter()
    sc.run_for(10.0 * sc.scale, step)
    mid = sc.mark("half")
    sc.run_for(10.0 * sc.scale, step)
    sync()
    b1 = sc.mark("end")
    wall = time.perf_counter() - t
    run1, wait1 = schedstat()
    f1, m1 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt, mallocs()
    ch_run1 = resource.getrusage(resource.RUSAGE_CHILDREN)
finally:
    shutil.rmtree(WORKDIR, ignore_errors=True)
n, k = own["steps"], own["evals"]
sub_sleep = max(0.0, own["sub_s"] - own["sub_run_s"] - own["sub_cpu_wait_s"])
save_off_cpu = max(0.0, own["save_s"] - own["save_run_s"] - own["save_cpu_wait_s"])
# the children's time off a CPU, at most: the calls' wall less the children's own CPU time and wait for one (what
# is left holds the spawn before the child's first instruction and the reaping after its last, the main thread's)
children_off_cpu = max(0.0, own["sub_s"] - own["children_run_s"] - own["children_cpu_wait_s"])
gpu_train = n * gpu_step_s if gpu_step_s is not None else None
gpu_evals = k * gpu_eval_s if gpu_eval_s is not None else None
gpu_busy = gpu_train + gpu_evals if gpu_train is not None and gpu_evals is not None else None
train_wall = wall - sum(b - a for a, b in evals)
shift = time.time_ns() - int(time.perf_counter() * 1e9)  # perf_counter spans on the truth's clock (time_ns)
sc.extra["evals_ns"] = [[int(a * 1e9) + shift, int(b * 1e9) + shift] for a, b in evals]
sc.extra["subprocess_ns"] = [[int(a * 1e9) + shift, int(b * 1e9) + shift] for a, b in calls]
sc.extra["children"] = {"comm": CHILD_COMM, "count": k, "pids": [c["pid"] for c in children],
                        "executable": sys.executable}
sc.extra["command"] = [sys.executable, "eval_metrics.py", "preds.npy", "labels.npy"]


def share(v: float | None) -> float | None:
    return round(v / wall, 4) if v is not None else None


def ms(v: float | None) -> float | None:
    return round(v * 1e3, 4) if v is not None else None


sc.extra["self"] = {**{key: round(v, 4) for key, v in own.items()}, "wall_s": round(wall, 4),
                    "steps_per_s": round(n / wall, 2), "train_steps_per_s": round(n / max(train_wall, 1e-9), 2),
                    "eval_every": state["eval_every"], "evals_per_s": round(k / wall, 4),
                    **{f"{key.removesuffix('_s')}_share": share(own[key]) for key in own if key.endswith("_s")},
                    "sub_ms_mean": round(own["sub_s"] / max(k, 1) * 1e3, 3),
                    "eval_ms_mean": round(sum(b - a for a, b in evals) / max(k, 1) * 1e3, 3),
                    "eval_s": round(sum(b - a for a, b in evals), 4),
                    "eval_share": share(sum(b - a for a, b in evals)),
                    "sub_sleep_s": round(sub_sleep, 4), "sub_sleep_share": share(sub_sleep),
                    "save_off_cpu_s": round(save_off_cpu, 4), "children_off_cpu_s": round(children_off_cpu, 4),
                    "children_minor_faults_per_s": round(own["children_minflt"] / wall, 1),
                    "children_cpu_wait_share_of_life": round(own["children_cpu_wait_s"] / own["sub_s"], 4)
                    if own["sub_s"] else None,
                    "children_cpu_s_run": round((ch_run1.ru_utime + ch_run1.ru_stime)
                                                - (ch_run0.ru_utime + ch_run0.ru_stime), 4),
                    "main_run_s": round(run1 - run0, 4), "main_cpu_share": share(run1 - run0),
                    "main_cpu_wait_s": round(wait1 - wait0, 4) if wait0 is not None else None,
                    "main_cpu_wait_share": share(wait1 - wait0) if wait0 is not None else None,
                    "minor_faults_per_s": round((f1 - f0) / wall, 1),
                    "cuda_mallocs_per_s": round((m1 - m0) / wall, 3),
                    "gpu_step_ms": ms(gpu_step_s), "gpu_eval_ms": ms(gpu_eval_s),
                    "gpu_busy_s": round(gpu_busy, 4) if gpu_busy is not None else None,
                    "gpu_busy_share": share(gpu_busy),
                    "gpu_busy_share_training": round(gpu_train / train_wall, 4) if gpu_train is not None else None,
                    "per_child": children, "batch": BATCH, "eval_samples": NEVAL, "classes": NCLASS,
                    "logits_mb": round(NEVAL * NCLASS * 4 / 1e6, 2), "last_metrics": history[-1] if history else None}
if not sc.cuda:
    sc.note("no GPU timings, no allocator counters: no CUDA.")
sc.note(f"natural: measured by the script: {n} steps ({n / wall:.1f}/s) in {wall:.2f} s, {k} evaluations (every "
        f"{state['eval_every']} steps): {own['issue_s']:.2f} s queueing the steps, {own['item_s']:.2f} s in .item(), "
        f"{own['predict_s']:.2f} s predicting, {own['save_s']:.2f} s in np.save, {own['sub_s']:.2f} s in "
        f"subprocess.run ({own['sub_s'] / max(k, 1) * 1e3:.0f} ms each; the main thread on a CPU "
        f"{own['sub_run_s']:.2f} s of it, asleep {sub_sleep:.2f} s); the children ({CHILD_COMM}) "
        f"{own['children_cpu_s']:.2f} s of CPU: start-up {own['child_startup_s']:.2f} s, numpy import "
        f"{own['child_import_s']:.2f} s, load {own['child_load_s']:.2f} s, metrics {own['child_metrics_s']:.2f} s, "
        f"exit {own['child_exit_s']:.2f} s in all; "
        + (f"a step's kernels take {gpu_step_s * 1e3:.2f} ms and an evaluation's {gpu_eval_s * 1e3:.1f} ms of GPU time "
           f"queued (GPU busy {gpu_busy / wall:.0%} of the run)." if gpu_busy is not None else "no GPU timings."))
sc.write_truth(baseline=(b0, b1), window=None, ratio_spans=((b0, mid), (mid, b1)))
