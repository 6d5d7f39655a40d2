"""train_thread_hogged: the training loop runs in a thread `trainloop`, as in frameworks that keep the main thread for
a UI or a heartbeat: the main thread join()s it with a 1 s timeout and writes a heartbeat file each time. Both on CPU
2. For 10 s three busy loops `hogd` share CPU 2: the trainloop thread waits for the CPU. The thread that feeds the GPU
is not the main thread, and the main thread's own waits are not the job's. Culprits: the hogd processes."""

import os
import tempfile
import threading

from common import BUSY_LOOP, Scenario, Trainer, set_thread_name, spawn_python, stop, tids_of

sc = Scenario("train_thread_hogged", "cpu_contention", "three busy loops share the CPU of a training loop run in a "
              "thread, not the main thread, for 10 s", job_cpus=[2], culprit_cpus=[2])
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
        tr = Trainer(sc)
        tr.warmup()
        sc.note("the training loop (Trainer.step) runs in the thread trainloop; the main thread join()s it with a "
                "1 s timeout and rewrites a heartbeat file each second; in the window three hogd share CPU 2.")
        sc.standard_phases(tr.step, start, end)
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
