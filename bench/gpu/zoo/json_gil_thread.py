"""json_gil_thread: a thread `ckpt_meta` in the trainer serialises a large metadata dict with json.dumps every
~100 ms for 10 s (writing a run's state for a dashboard). json's C encoder holds the GIL for the whole call
(tens of ms) without a release point, so the main thread, which asks for the GIL every 5 ms, waits until the
call returns. CPUs 6-7 (the thread has a CPU of its own: no CPU is short). Culprit: ckpt_meta's tid."""

import json
import os
import threading
import time

from common import Scenario, Trainer, comm_of, now, set_thread_name

sc = Scenario("json_gil_thread", "gil_contention", "a thread json.dumps a large dict every ~100 ms for 10 s",
              job_cpus=[6, 7], culprit_cpus=[6, 7])
ENTRIES = 100_000 if sc.scale >= 0.5 else 20_000
meta = {f"sample_{i:07d}": {"loss": i * 1e-6, "seen": i % 13, "tags": ["train", "aug"], "path": f"s/{i}.jpg"}
        for i in range(ENTRIES)}
tr = Trainer(sc)
tr.warmup()
halt = threading.Event()
started = threading.Event()
info: dict = {"calls": []}


def dump_loop() -> None:
    set_thread_name("ckpt_meta")
    info["tid"] = threading.get_native_id()
    started.set()
    while not halt.is_set():
        t0 = now()
        text = json.dumps(meta)
        info["calls"].append((now() - t0) / 1e6)
        info["bytes"] = len(text)
        time.sleep(0.1)


th = threading.Thread(target=dump_loop, daemon=True)


def start() -> None:
    th.start()
    started.wait()


def end() -> None:
    halt.set()
    th.join()
    sc.add_culprit(os.getpid(), [info["tid"]], comm_of(os.getpid(), info["tid"]) or "ckpt_meta")


def summary() -> None:
    calls = sorted(info["calls"])
    sc.extra.update(dumps=len(calls), dump_ms_median=round(calls[len(calls) // 2], 1) if calls else None,
                    dump_bytes=info.get("bytes"), entries=ENTRIES)


sc.note("in the window ckpt_meta json.dumps the metadata dict, then sleeps 100 ms, again and again.")
sc.standard_phases(tr.step, start, end, before_truth=summary)
