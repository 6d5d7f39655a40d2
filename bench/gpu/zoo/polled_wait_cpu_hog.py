"""polled_wait_cpu_hog: the trainer (CPU 2) waits for each step's end by polling a CUDA event with 0.5 ms sleeps
(gpu_work_grows_polled's loop, its GPU work unchanged). For 10 s three busy loops `hogd` share CPU 2: each sleep's
end and each step's launches wait for the CPU, the GPU idles between steps. A host-side cause behind a loop that
looks like waiting for the GPU: the edge of 'a slow phase the GPU was saturated through has no host-side cause'.
Culprits: the hogd processes."""

import time

from common import BUSY_LOOP, Scenario, Trainer, spawn_python, stop, tids_of

sc = Scenario("polled_wait_cpu_hog", "cpu_contention", "three busy loops share the CPU of a trainer that polls a "
              "CUDA event with 0.5 ms sleeps for each step, for 10 s", job_cpus=[2], culprit_cpus=[2])
tr = Trainer(sc)
torch = tr.torch
tr.warmup()
hogs: list = []
polls = {"sleeps": 0}


def polled_step() -> float:
    """tr.step's work with its wait made a poll: queue it, record an event, sleep 0.5 ms until the event is done."""
    x, y = tr.xs[tr.i % len(tr.xs)], tr.ys[tr.i % len(tr.ys)]
    tr.i += 1
    loss = tr.loss_fn(tr.model(x), y)
    loss.backward()
    tr.opt.step()
    tr.opt.zero_grad(set_to_none=True)
    if sc.cuda:
        done = torch.cuda.Event()
        done.record()
        while not done.query():
            time.sleep(0.0005)
            polls["sleeps"] += 1
    return loss.item()


def start() -> None:
    for _ in range(3):
        hogs.append(spawn_python(BUSY_LOOP.format(seconds=sc.window_s + 5), "hogd", sc.culprit_cpus))


def end() -> None:
    for p in hogs:
        sc.add_culprit(p.pid, tids_of(p.pid) or [p.pid], "hogd")
    stop(hogs)


def before_truth() -> None:
    sc.extra["poll_sleeps"] = polls["sleeps"]


try:
    sc.note("each step's end is waited for by polling a CUDA event with 0.5 ms sleeps; in the window three hogd busy "
            "loops share CPU 2.")
    sc.standard_phases(polled_step, start, end, before_truth=before_truth)
finally:
    stop(hogs)
