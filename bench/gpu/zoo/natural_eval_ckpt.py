"""natural_eval_ckpt (natural, nothing staged): the zoo's MLP trained from GPU-resident batches, with what training
scripts do besides: every 3 s an evaluation pass (60 batches forward under no_grad, loss.item() each) and every 7 s
a checkpoint (torch.save of the model and the optimiser's state to /tmp, then fsync). CPU 2, 22 s. The script
measures itself: the time in training steps, in evaluation and in checkpoints. The report must not blame a host-side
cause for the evaluation (the GPU's own work), and where it names the checkpoints, their time must agree."""

import os
import tempfile
import time

from common import Scenario, Trainer

sc = Scenario("natural_eval_ckpt", "natural", "training with an evaluation pass every 3 s and a checkpoint every 7 s, "
              "22 s, nothing staged", job_cpus=[2], control=True)
tr = Trainer(sc)
torch = tr.torch
tr.warmup()
evx = torch.randn(8, tr.batch, tr.in_dim, device=tr.dev)
evy = torch.randint(0, 10, (8, tr.batch), device=tr.dev)
path = os.path.join(tempfile.gettempdir(), f"natural-ckpt-{os.getpid()}.pt")
own = {"train_s": 0.0, "eval_s": 0.0, "ckpt_s": 0.0, "steps": 0, "evals": [], "ckpts": []}
next_eval, next_ckpt = [3.0], [7.0]
start = [0.0]


def evaluate() -> None:
    t0 = time.time_ns()
    with torch.no_grad():
        for k in range(60):
            tr.loss_fn(tr.model(evx[k % 8]), evy[k % 8]).item()
    own["evals"].append([t0, time.time_ns()])


def checkpoint() -> None:
    t0 = time.time_ns()
    torch.save({"model": tr.model.state_dict(), "opt": tr.opt.state_dict()}, path)
    fd = os.open(path, os.O_RDONLY)
    os.fsync(fd)
    os.close(fd)
    own["ckpts"].append([t0, time.time_ns()])


def step() -> None:
    now = time.perf_counter() - start[0]
    if now >= next_eval[0]:
        t = time.perf_counter()
        evaluate()
        own["eval_s"] += time.perf_counter() - t
        next_eval[0] += 3.0
    elif now >= next_ckpt[0]:
        t = time.perf_counter()
        checkpoint()
        own["ckpt_s"] += time.perf_counter() - t
        next_ckpt[0] += 7.0
    else:
        t = time.perf_counter()
        tr.step()
        own["train_s"] += time.perf_counter() - t
        own["steps"] += 1


b0 = sc.mark("baseline")
start[0] = time.perf_counter()
sc.run_for(11.0 * sc.scale, step)
mid = sc.mark("half")
sc.run_for(11.0 * sc.scale, step)
b1 = sc.mark("end")
wall = time.perf_counter() - start[0]
size = os.path.getsize(path) if os.path.exists(path) else 0
if os.path.exists(path):
    os.unlink(path)
sc.extra["self"] = {"train_s": round(own["train_s"], 4), "eval_s": round(own["eval_s"], 4),
                    "ckpt_s": round(own["ckpt_s"], 4), "steps": own["steps"], "wall_s": round(wall, 4),
                    "checkpoint_bytes": size}
sc.extra["evals_ns"], sc.extra["ckpts_ns"] = own["evals"], own["ckpts"]
sc.note(f"natural: measured by the script: {own['steps']} training steps in {own['train_s']:.2f} s, "
        f"{len(own['evals'])} evaluations in {own['eval_s']:.2f} s, {len(own['ckpts'])} checkpoints "
        f"({size / 1e6:.0f} MB each) in {own['ckpt_s']:.2f} s, of {wall:.2f} s.")
sc.write_truth(baseline=(b0, b1), window=None, ratio_spans=((b0, mid), (mid, b1)))
