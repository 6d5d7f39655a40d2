"""lock_over_fsync: every step takes the model's lock (a threading.Lock guarding the weights, as an
asynchronous checkpointer's or an EMA thread's code does). For 10 s a thread `ckpt_saver` in the
same process saves a 64 MiB snapshot while holding that lock: write, fsync (asleep in D state on
the disk, the GIL released), then 50 ms without it. The main thread sleeps on the lock until the
saver is done with the disk; the disk is the end of the chain. Trainer on CPUs 8-9. Culprit:
ckpt_saver's tid."""

import os
import threading
import time

from common import Scenario, Trainer, comm_of, now, set_thread_name

sc = Scenario("lock_over_fsync", "lock_held_over_io", "a saver thread holds the model lock while it writes and "
              "fsyncs a 64 MiB snapshot, every ~50 ms for 10 s", job_cpus=[8, 9], culprit_cpus=[8, 9])
PATH = "/var/tmp/zoo_snapshot.bin"
SNAP = (64 if sc.cuda else 8) << 20
tr = Trainer(sc)
tr.warmup()
model_lock = threading.Lock()
halt = threading.Event()
started = threading.Event()
info: dict = {"saves": []}
payload = os.urandom(SNAP)


def save_loop() -> None:
    set_thread_name("ckpt_saver")
    info["tid"] = threading.get_native_id()
    started.set()
    with open(PATH, "wb") as fh:
        while not halt.is_set():
            with model_lock:
                t0 = now()
                fh.seek(0)
                fh.write(payload)
                fh.flush()
                os.fsync(fh.fileno())
                info["saves"].append([t0, now()])
            time.sleep(0.050)


th = threading.Thread(target=save_loop, name="ckpt_saver", daemon=True)


def locked_step() -> None:
    with model_lock:
        pass  # the weights are read under the lock before the step
    tr.step()


def start() -> None:
    th.start()
    started.wait()


def end() -> None:
    halt.set()
    th.join()
    sc.add_culprit(os.getpid(), [info["tid"]], comm_of(os.getpid(), info["tid"]) or "ckpt_saver")


try:
    sc.note(f"every step (all phases) takes the lock; in the window ckpt_saver holds it for each {SNAP >> 20} MiB "
            "write + fsync, then sleeps 50 ms.")
    sc.extra["snapshot_bytes"] = SNAP
    sc.standard_phases(locked_step, start, end,
                       before_truth=lambda: sc.extra.update(save_s=[round((b - a) / 1e9, 3) for a, b in info["saves"]]))
finally:
    try:
        os.unlink(PATH)
    except OSError:
        pass
