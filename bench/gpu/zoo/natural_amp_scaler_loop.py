"""natural_amp_scaler_loop (natural, nothing staged): mixed-precision training as a tutorial shows it and a user copies
it: the zoo's MLP (512-2048-2048-2048-10, batch 8192) under torch.autocast(fp16) with a GradScaler:
scaler.scale(loss).backward(), scaler.unscale_(opt), clip_grad_norm_(1.0), scaler.step(opt) (which reads the inf check
back: a synchronisation), scaler.update(), an lr scheduler step (cosine), AdamW (foreach, not fused), loss.item() each
step, and torch.cuda.empty_cache() every 50 steps "to keep memory down" (the next step's blocks are cudaMalloc'ed
again). CPUs 2-3, 20 s. The script measures itself: the steps per second, its time in loss.item(), in scaler.step and
scaler.update, in the empty_cache() calls and the extra time of the step after each (against the median step), and a
step's GPU time queued (common.gpu_seconds_queued, on a copy of the model, its own optimiser and scaler, so that the
run's state is untouched), so that the GPU's busy share is known. On the CPU (smoke) autocast is bf16 and the scaler
and empty_cache are off."""

import copy
import time

from common import Scenario, Trainer, gpu_seconds_queued

sc = Scenario("natural_amp_scaler_loop", "natural", "fp16 autocast training with a GradScaler, gradient clipping, an "
              "lr scheduler, loss.item() each step and empty_cache() every 50 steps, 20 s, nothing staged",
              job_cpus=[2, 3], control=True)
tr = Trainer(sc)
torch = tr.torch
model, loss_fn = tr.model, tr.loss_fn
AMP_DTYPE = torch.float16 if sc.cuda else torch.bfloat16
EMPTY_EVERY = 50


def make_scaler():
    if hasattr(torch, "amp") and hasattr(torch.amp, "GradScaler"):
        return torch.amp.GradScaler("cuda", enabled=sc.cuda)
    return torch.cuda.amp.GradScaler(enabled=sc.cuda)


opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)
sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=2000)
scaler = make_scaler()
own = {"steps": 0, "item_s": 0.0, "scaler_s": 0.0, "empty_cache_s": 0.0, "empty_cache_calls": 0}
durations: list[float] = []
after_empty: list[bool] = []
state = {"i": 0, "after": False}


def train_step() -> float:
    i = state["i"]
    state["i"] += 1
    x, y = tr.xs[i % len(tr.xs)], tr.ys[i % len(tr.ys)]
    with torch.autocast(device_type=sc.device, dtype=AMP_DTYPE):
        loss = loss_fn(model(x), y)
    scaler.scale(loss).backward()
    scaler.unscale_(opt)
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    t0 = time.perf_counter()
    scaler.step(opt)
    scaler.update()
    t1 = time.perf_counter()
    sched.step()
    opt.zero_grad(set_to_none=True)
    t2 = time.perf_counter()
    value = loss.item()
    t3 = time.perf_counter()
    own["scaler_s"] += t1 - t0
    own["item_s"] += t3 - t2
    return value


def step() -> None:
    t0 = time.perf_counter()
    train_step()
    t1 = time.perf_counter()
    durations.append(t1 - t0)
    after_empty.append(state["after"])
    state["after"] = False
    own["steps"] += 1
    if own["steps"] % EMPTY_EVERY == 0:
        if sc.cuda:
            torch.cuda.empty_cache()
        own["empty_cache_s"] += time.perf_counter() - t1
        own["empty_cache_calls"] += 1
        state["after"] = True


for _ in range(3 * EMPTY_EVERY):  # warm-up: the scaler's first scales, the allocator, empty_cache once or more
    step()
gpu_step_s = None
if sc.cuda:
    m2 = copy.deepcopy(model)
    opt2 = torch.optim.AdamW(m2.parameters(), lr=1e-3, weight_decay=0.01)
    scaler2 = make_scaler()

    def work(_) -> None:
        """One step's GPU work on the copy, nothing read back (the copy's optimiser steps without the inf check's
        read-back that scaler.step makes; the kernels are the same but for that 4-byte copy)."""
        x, y = tr.xs[0], tr.ys[0]
        with torch.autocast(device_type="cuda", dtype=AMP_DTYPE):
            loss = loss_fn(m2(x), y)
        scaler2.scale(loss).backward()
        scaler2.unscale_(opt2)
        torch.nn.utils.clip_grad_norm_(m2.parameters(), 1.0)
        opt2.step()
        scaler2.update()
        opt2.zero_grad(set_to_none=True)

    work(None)
    torch.cuda.synchronize()
    runs = sorted(r for r in (gpu_seconds_queued(torch, work) for _ in range(5)) if r is not None)
    gpu_step_s = runs[len(runs) // 2] if runs else None
    del m2, opt2, scaler2
warm_end = time.perf_counter() + 2.0 * sc.scale  # the spin kernels well before the baseline
while time.perf_counter() < warm_end:
    step()
tr.sync()
own.update(steps=0, item_s=0.0, scaler_s=0.0, empty_cache_s=0.0, empty_cache_calls=0)
durations.clear()
after_empty.clear()
b0 = sc.mark("baseline")
t = time.perf_counter()
sc.run_for(10.0 * sc.scale, step)
mid = sc.mark("half")
sc.run_for(10.0 * sc.scale, step)
b1 = sc.mark("end")
wall = time.perf_counter() - t
n = own["steps"]
others = sorted(d for d, a in zip(durations, after_empty) if not a)
typical = others[len(others) // 2] if others else 0.0
refill = sum(max(0.0, d - typical) for d, a in zip(durations, after_empty) if a)
gpu_busy = n * gpu_step_s if gpu_step_s is not None else None
sc.extra["self"] = {**{k: round(v, 4) for k, v in own.items()}, "wall_s": round(wall, 4),
                    "steps_per_s": round(n / wall, 2), "step_ms_median": round(typical * 1e3, 4),
                    "item_share": round(own["item_s"] / wall, 4), "scaler_share": round(own["scaler_s"] / wall, 4),
                    "empty_cache_share": round(own["empty_cache_s"] / wall, 4),
                    "after_empty_cache_extra_s": round(refill, 4),
                    "gpu_step_ms": round(gpu_step_s * 1e3, 4) if gpu_step_s is not None else None,
                    "gpu_busy_share": round(gpu_busy / wall, 4) if gpu_busy is not None else None,
                    "amp_dtype": str(AMP_DTYPE).removeprefix("torch."), "scaler": sc.cuda,
                    "empty_cache_every": EMPTY_EVERY, "batch": tr.batch,
                    "final_loss_scale": scaler.get_scale() if sc.cuda else None}
if not sc.cuda:
    sc.note("bf16 autocast, no GradScaler, no empty_cache: no CUDA.")
sc.note(f"natural: measured by the script: {n} steps ({n / wall:.0f}/s) in {wall:.2f} s; {own['item_s']:.2f} s in "
        f"loss.item(), {own['scaler_s']:.2f} s in scaler.step/update, {own['empty_cache_s']:.3f} s in "
        f"{own['empty_cache_calls']} empty_cache() calls and {refill:.3f} s more in the steps after them (median step "
        f"{typical * 1e3:.2f} ms); "
        + (f"a step's kernels take {gpu_step_s * 1e3:.2f} ms of GPU time queued (GPU busy {gpu_busy / wall:.0%} of the "
           "run)." if gpu_busy is not None else "no GPU timings (no CUDA)."))
sc.write_truth(baseline=(b0, b1), window=None, ratio_spans=((b0, mid), (mid, b1)))
