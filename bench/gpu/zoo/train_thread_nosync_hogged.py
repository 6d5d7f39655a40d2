"""train_thread_nosync_hogged: train_thread_hogged's loop in a thread `trainloop` (the main thread join()s it with a
1 s heartbeat), with a small MLP (width 256, batch 512: the host's launches are the step) and no wait per step: the
loss is read every 20 steps. No call marks each iteration from trainloop alone; PyTorch's autograd thread launches
the backward kernels. For 10 s three busy loops `hogd` share CPU 2 (both threads' CPU). Culprits: the hogd
processes."""

import os
import tempfile
import threading

from common import BUSY_LOOP, Scenario, Trainer, set_thread_name, spawn_python, stop, tids_of

sc = Scenario("train_thread_nosync_hogged", "cpu_contention", "three busy loops share the CPU of a small training "
              "loop run in a thread, reading its loss every 20 steps, for 10 s", job_cpus=[2], culprit_cpus=[2])
hogs: list = []
failed: list = []


def start() -> None:
    for _ in range(3):
        hogs.append(spawn_python(BUSY_LOOP.format(seconds=sc.window_s + 5), "hogd", sc.culprit_cpus))


def end() -> None:
    for p in hogs:
        sc.add_culprit(p.pid, tids_of(p.pid) or [p.pid], "hogd")
    stop(hogs)


def train() -> None:
    """The whole run, on this thread: the model made here, warmed, then the phases."""
    set_thread_name("trainloop")
    sc.feeder = {"pid": os.getpid(), "tid": threading.get_native_id(), "comm": "trainloop"}
    try:
        tr = Trainer(sc, width=256, batch=512)
        tr.warmup()
        n = [0]

        def step() -> None:
            x, y = tr.xs[tr.i % len(tr.xs)], tr.ys[tr.i % len(tr.ys)]
            tr.i += 1
            loss = tr.loss_fn(tr.model(x), y)
            loss.backward()
            tr.opt.step()
            tr.opt.zero_grad(set_to_none=True)
            n[0] += 1
            if n[0] % 20 == 0:
                loss.item()

        sc.note("a small MLP (width 256, batch 512) trained in the thread trainloop, its loss read every 20 steps (no "
                "wait per step); the main thread join()s it with a 1 s timeout and rewrites a heartbeat file; in the "
                "window three hogd share CPU 2.")
        sc.standard_phases(step, start, end)
    except BaseException as e:  # noqa: BLE001 - raised again on the main thread
        failed.append(e)
    finally:
        stop(hogs)


loop = threading.Thread(target=train, name="trainloop")
loop.start()
beat = os.path.join(tempfile.gettempdir(), f"heartbeat-{os.getpid()}")
beats = 0
while loop.is_alive():
    loop.join(1.0)
    beats += 1
    with open(beat, "w") as f:
        f.write(f"{beats}\n")
os.unlink(beat)
if failed:
    raise failed[0]
