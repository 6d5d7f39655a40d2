"""natural_async_checkpoint (natural, nothing staged): the zoo's MLP (512-2048-2048-2048-10, batch 8192, fused AdamW,
loss.item() each step) trained from batches already on the GPU, checkpointed the way a script that does not want to
stall writes it: every 4 s the main thread snapshots the model's and the optimiser's state to the CPU
(`v.detach().to('cpu', copy=True)` for every tensor, ~114 MB) and hands the snapshot to a background thread
(`ckpt_writer`, threading's name only) that torch.save()s it to /var/tmp, fsyncs it and renames it into place; the
main thread waits for the writer only if the previous save has not finished when the next snapshot is due. CPUs 2-3,
20 s. The script measures itself: the main thread's time in the snapshots and in waiting for the writer, the writer
thread's time saving, each save's and snapshot's moments, the training steps' durations during saves and outside them
(what the main thread lost while the writer saved), the steps per second, and a step's GPU time queued
(common.gpu_seconds_queued), so that the GPU's busy share is known."""

import os
import queue
import tempfile
import threading
import time

from common import Scenario, Trainer, gpu_seconds_queued

sc = Scenario("natural_async_checkpoint", "natural", "training with a state snapshot to the CPU every 4 s, saved and "
              "fsynced by a background thread, 20 s, nothing staged", job_cpus=[2, 3], control=True)
tr = Trainer(sc)
torch = tr.torch
model, opt = tr.model, tr.opt
folder = "/var/tmp" if os.access("/var/tmp", os.W_OK) else tempfile.gettempdir()
path = os.path.join(folder, f"zoo_natural_ckpt_{os.getpid()}.pt")
EVERY = 4.0
own = {"snapshot_s": 0.0, "handoff_wait_s": 0.0, "save_s": 0.0, "checkpoints": 0, "snapshots": 0, "bytes": 0}
snapshots_ns: list[list[int]] = []
saves_ns: list[list[int]] = []
saves_pc: list[tuple[float, float]] = []  # the same, perf_counter, for the steps' overlap
steps_pc: list[tuple[float, float]] = []
todo: queue.Queue = queue.Queue()
idle = threading.Event()
idle.set()
writer_out: dict = {}


def to_cpu(obj):
    """A copy on the CPU of every tensor in a state dict (nested dicts and lists), the rest as it is."""
    if isinstance(obj, torch.Tensor):
        return obj.detach().to("cpu", copy=True)
    if isinstance(obj, dict):
        return {k: to_cpu(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(to_cpu(v) for v in obj)
    return obj


def writer() -> None:
    writer_out["tid"] = threading.get_native_id()
    while True:
        snap = todo.get()
        if snap is None:
            return
        t0, n0 = time.perf_counter(), time.time_ns()
        tmp = path + ".tmp"
        torch.save(snap, tmp)
        fd = os.open(tmp, os.O_RDONLY)
        os.fsync(fd)
        os.close(fd)
        os.replace(tmp, path)
        t1 = time.perf_counter()
        if writer_out.get("measure"):
            own["save_s"] += t1 - t0
            own["checkpoints"] += 1
            own["bytes"] = os.path.getsize(path)
            saves_ns.append([n0, time.time_ns()])
            saves_pc.append((t0, t1))
        del snap
        idle.set()


def checkpoint() -> None:
    t0 = time.perf_counter()
    idle.wait()  # the previous save must be done before its memory is given to a new snapshot
    t1, n1 = time.perf_counter(), time.time_ns()
    snap = {"model": to_cpu(model.state_dict()), "opt": to_cpu(opt.state_dict()), "step": tr.i}
    t2 = time.perf_counter()
    idle.clear()
    todo.put(snap)
    own["handoff_wait_s"] += t1 - t0
    own["snapshot_s"] += t2 - t1
    own["snapshots"] += 1
    snapshots_ns.append([n1, time.time_ns()])


def work(_) -> None:
    """A training step's GPU work, nothing read back."""
    x, y = tr.xs[0], tr.ys[0]
    loss = tr.loss_fn(model(x), y)
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)


thread = threading.Thread(target=writer, name="ckpt_writer", daemon=True)
thread.start()
tr.warmup()
checkpoint()  # one before the run: the writer's first save, allocations and imports out of the way
idle.wait()
gpu_step_s = None
if sc.cuda:
    runs = sorted(r for r in (gpu_seconds_queued(torch, work) for _ in range(5)) if r is not None)
    gpu_step_s = runs[len(runs) // 2] if runs else None
warm_end = time.perf_counter() + 2.0 * sc.scale  # the spin kernels well before the baseline
while time.perf_counter() < warm_end:
    tr.step()
tr.sync()
next_ckpt = [EVERY * sc.scale]
start = [0.0]


def step() -> None:
    if time.perf_counter() - start[0] >= next_ckpt[0]:
        checkpoint()
        next_ckpt[0] += EVERY * sc.scale
    t = time.perf_counter()
    tr.step()
    steps_pc.append((t, time.perf_counter()))


own.update(snapshot_s=0.0, handoff_wait_s=0.0, snapshots=0)
snapshots_ns.clear()
writer_out["measure"] = True
b0 = sc.mark("baseline")
start[0] = time.perf_counter()
sc.run_for(10.0 * sc.scale, step)
mid = sc.mark("half")
sc.run_for(10.0 * sc.scale, step)
b1 = sc.mark("end")
wall = time.perf_counter() - start[0]
t_wait = time.perf_counter()
idle.wait(60.0)  # the last save, after the run
todo.put(None)
thread.join(10.0)
tail_wait = time.perf_counter() - t_wait
if os.path.exists(path):
    os.unlink(path)


def during_save(a: float, b: float) -> bool:
    return any(a < s1 and s0 < b for s0, s1 in saves_pc)


inside = [b - a for a, b in steps_pc if during_save(a, b)]
outside = sorted(b - a for a, b in steps_pc if not during_save(a, b))
typical = outside[len(outside) // 2] if outside else 0.0
lost = sum(max(0.0, d - typical) for d in inside)
n = len(steps_pc)
gpu_busy = n * gpu_step_s if gpu_step_s is not None else None
sc.extra["self"] = {**{k: round(v, 4) for k, v in own.items()}, "steps": n, "wall_s": round(wall, 4),
                    "steps_per_s": round(n / wall, 2), "snapshot_share": round(own["snapshot_s"] / wall, 4),
                    "save_share_of_writer": round(own["save_s"] / wall, 4),
                    "steps_during_saves": len(inside),
                    "step_ms_during_saves": round(sum(inside) / len(inside) * 1e3, 4) if inside else None,
                    "step_ms_median_else": round(typical * 1e3, 4),
                    "main_lost_during_saves_s": round(lost, 4),
                    "main_waited_on_writer_s": round(lost + own["handoff_wait_s"], 4),
                    "gpu_step_ms": round(gpu_step_s * 1e3, 4) if gpu_step_s is not None else None,
                    "gpu_busy_share": round(gpu_busy / wall, 4) if gpu_busy is not None else None,
                    "after_run_wait_s": round(tail_wait, 4), "folder": folder}
sc.extra["snapshots_ns"], sc.extra["saves_ns"] = snapshots_ns, saves_ns
sc.extra["writer"] = {"pid": sc.feeder["pid"], "tid": writer_out.get("tid"), "thread": "ckpt_writer"}
sc.note(f"natural: measured by the script: {n} steps ({n / wall:.0f}/s) in {wall:.2f} s; {own['snapshots']} snapshots "
        f"to the CPU in {own['snapshot_s']:.2f} s on the main thread (it waited {own['handoff_wait_s']:.2f} s for the "
        f"writer to be free); the writer thread saved {own['checkpoints']} checkpoints ({own['bytes'] / 1e6:.0f} MB "
        f"each) in {own['save_s']:.2f} s; the {len(inside)} steps during saves lost {lost:.2f} s against the median "
        f"step outside them ({typical * 1e3:.2f} ms); "
        + (f"a step's kernels take {gpu_step_s * 1e3:.2f} ms of GPU time queued (GPU busy {gpu_busy / wall:.0%} of the "
           "run)." if gpu_busy is not None else "no GPU timings (no CUDA)."))
sc.write_truth(baseline=(b0, b1), window=None, ratio_spans=((b0, mid), (mid, b1)))
