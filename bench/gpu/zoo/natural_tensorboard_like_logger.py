"""natural_tensorboard_like_logger (natural, nothing staged): a training loop that logs as a hand-rolled TensorBoard
writer does: the zoo's MLP (512-2048-2048-2048-10, batch 8192, fp32 without TF32, fused AdamW, a cosine lr schedule),
gradient clipping (clip_grad_norm_(1.0), whose total norm is logged), and each step appends a record (step, wall time,
loss via loss.item(), lr, grad norm via .item()) to an in-memory list; every 100 steps the list is handed through a
queue.Queue to a background thread (threading's name and OS name `event_writer`) that serialises the records with
json (one line each) and appends them to a file in /tmp with flush + os.fsync. CPUs 2-3, 20 s. The script measures
itself: the steps per second, the main thread's time in the two .item() calls and in queue.put, the writer's time
per batch of records (json and write+fsync apart; truth `writes_ns`), the steps that overlapped a write against the
median step (what the main thread could have lost to the writer), and a step's GPU time queued
(common.gpu_seconds_queued on a copy of the model with its own optimiser), so that the GPU's busy share is known;
truth `writer` names the thread."""

import copy
import json
import os
import queue
import tempfile
import threading
import time

from common import Scenario, Trainer, gpu_seconds_queued, set_thread_name

sc = Scenario("natural_tensorboard_like_logger", "natural", "the MLP logging loss, lr and grad norm (.item()) each "
              "step, flushed every 100 steps by a writer thread (json, write, fsync), 20 s, nothing staged",
              job_cpus=[2, 3], control=True)
tr = Trainer(sc)
torch = tr.torch
model, opt, loss_fn = tr.model, tr.opt, tr.loss_fn
sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=5000)
FLUSH_EVERY = 100
LOG_DIR = tempfile.mkdtemp(prefix="zoo_tb_")
LOG_PATH = os.path.join(LOG_DIR, "events.jsonl")
q: queue.Queue = queue.Queue()
writer_info: dict = {}
writes = {"n": 0, "records": 0, "json_s": 0.0, "write_s": 0.0, "bytes": 0, "measure": False}
write_spans: list[tuple[float, float]] = []


def writer() -> None:
    set_thread_name("event_writer")
    writer_info.update(tid=threading.get_native_id(), comm="event_writer")
    with open(LOG_PATH, "a") as fh:
        while True:
            records = q.get()
            if records is None:
                return
            t0 = time.perf_counter()
            text = "".join(json.dumps(r) + "\n" for r in records)
            t1 = time.perf_counter()
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
            t2 = time.perf_counter()
            if writes["measure"]:
                writes["n"] += 1
                writes["records"] += len(records)
                writes["json_s"] += t1 - t0
                writes["write_s"] += t2 - t1
                writes["bytes"] += len(text)
                write_spans.append((t0, t2))


thread = threading.Thread(target=writer, name="event_writer", daemon=True)
thread.start()
own = {"steps": 0, "item_s": 0.0, "put_s": 0.0}
records: list[dict] = []
step_spans: list[tuple[float, float]] = []


def step() -> None:
    t0 = time.perf_counter()
    i = tr.i
    tr.i += 1
    x, y = tr.xs[i % len(tr.xs)], tr.ys[i % len(tr.ys)]
    loss = loss_fn(model(x), y)
    loss.backward()
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    sched.step()
    opt.zero_grad(set_to_none=True)
    t1 = time.perf_counter()
    loss_v, norm_v = loss.item(), norm.item()
    t2 = time.perf_counter()
    records.append({"step": i, "wall_time": time.time(), "loss": loss_v, "lr": sched.get_last_lr()[0],
                    "grad_norm": norm_v})
    t3 = t4 = time.perf_counter()
    if len(records) >= FLUSH_EVERY:
        q.put(records.copy())
        records.clear()
        t4 = time.perf_counter()
    own["item_s"] += t2 - t1
    own["put_s"] += t4 - t3
    own["steps"] += 1
    step_spans.append((t0, t4))


for _ in range(3 * FLUSH_EVERY):  # warm-up: the allocator, the writer's first writes
    step()
gpu_step_s = None
if sc.cuda:
    m2 = copy.deepcopy(model)
    opt2 = torch.optim.AdamW(m2.parameters(), lr=1e-4, fused=True)

    def work(_) -> None:
        """One step's GPU work on the copy, nothing read back."""
        loss_fn(m2(tr.xs[0]), tr.ys[0]).backward()
        torch.nn.utils.clip_grad_norm_(m2.parameters(), 1.0)
        opt2.step()
        opt2.zero_grad(set_to_none=True)

    work(None)
    torch.cuda.synchronize()
    runs = sorted(r for r in (gpu_seconds_queued(torch, work) for _ in range(5)) if r is not None)
    gpu_step_s = runs[len(runs) // 2] if runs else None
    del m2, opt2
warm_end = time.perf_counter() + 2.0 * sc.scale  # the spin kernels well before the baseline
while time.perf_counter() < warm_end:
    step()
tr.sync()
own.update(steps=0, item_s=0.0, put_s=0.0)
step_spans.clear()
writes["measure"] = True
b0 = sc.mark("baseline")
t = time.perf_counter()
sc.run_for(10.0 * sc.scale, step)
mid = sc.mark("half")
sc.run_for(10.0 * sc.scale, step)
b1 = sc.mark("end")
wall = time.perf_counter() - t
q.put(None)
thread.join(30)
writes["measure"] = False
n = own["steps"]
durations = sorted(b - a for a, b in step_spans)
median = durations[len(durations) // 2] if durations else 0.0
overlapped = [(a, b) for a, b in step_spans if any(a < e and s < b for s, e in write_spans)]
waited = sum(max(0.0, (b - a) - median) for a, b in overlapped)
gpu_busy = n * gpu_step_s if gpu_step_s is not None else None
# the writes' spans on the truth's clock (time_ns), for reading the trace against them
shift = time.time_ns() - int(time.perf_counter() * 1e9)
sc.extra["writes_ns"] = [[int(s * 1e9) + shift, int(e * 1e9) + shift] for s, e in write_spans]
sc.extra["writer"] = {"pid": sc.feeder["pid"], **writer_info}
sc.extra["self"] = {**{k: round(v, 4) for k, v in own.items()}, "wall_s": round(wall, 4),
                    "steps_per_s": round(n / wall, 2), "step_ms_median": round(median * 1e3, 4),
                    "item_share": round(own["item_s"] / wall, 4), "put_share": round(own["put_s"] / wall, 4),
                    "writes": writes["n"], "records_written": writes["records"], "bytes_written": writes["bytes"],
                    "writer_json_s": round(writes["json_s"], 4), "writer_write_fsync_s": round(writes["write_s"], 4),
                    "writer_busy_share": round((writes["json_s"] + writes["write_s"]) / wall, 4),
                    "steps_during_writes": len(overlapped), "main_waited_on_writer_s": round(waited, 4),
                    "gpu_step_ms": round(gpu_step_s * 1e3, 4) if gpu_step_s is not None else None,
                    "gpu_busy_share": round(gpu_busy / wall, 4) if gpu_busy is not None else None,
                    "flush_every": FLUSH_EVERY, "batch": tr.batch, "log_path": LOG_PATH}
sc.note(f"natural: measured by the script: {n} steps ({n / wall:.0f}/s) in {wall:.2f} s; {own['item_s']:.2f} s in "
        f".item() (loss and grad norm), {own['put_s']:.4f} s in queue.put; the writer wrote {writes['n']} times "
        f"({writes['json_s']:.3f} s in json, {writes['write_s']:.3f} s in write+fsync); the {len(overlapped)} steps "
        f"during writes took {waited:.3f} s more than the median step ({median * 1e3:.2f} ms); "
        + (f"a step's kernels take {gpu_step_s * 1e3:.2f} ms of GPU time queued (GPU busy {gpu_busy / wall:.0%} of the "
           "run)." if gpu_busy is not None else "no GPU timings (no CUDA)."))
sc.write_truth(baseline=(b0, b1), window=None, ratio_spans=((b0, mid), (mid, b1)))
