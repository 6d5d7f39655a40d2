"""cpu_hog: three busy-looping processes `hogd` pinned on the trainer's only CPU (1) for 10 s.

The trainer (MLP step from GPU-resident batches, loss.item() each step) runs alone on CPU 1 for
8 s, then shares it with three hogs: its thread waits for the CPU (runnable, preempted by hogd)
between and inside its CUDA calls, and the GPU idles. Culprits: the hogd processes."""

from common import BUSY_LOOP, Scenario, Trainer, spawn_python, stop, tids_of

sc = Scenario("cpu_hog", "cpu_contention", "three busy loops pinned on the trainer's CPU 1 for 10 s",
              job_cpus=[1], culprit_cpus=[1])
tr = Trainer(sc)
tr.warmup()
hogs = []


def start() -> None:
    for _ in range(3):
        hogs.append(spawn_python(BUSY_LOOP.format(seconds=sc.window_s + 5), "hogd", sc.culprit_cpus))


def end() -> None:
    for p in hogs:
        sc.add_culprit(p.pid, tids_of(p.pid) or [p.pid], "hogd")
    stop(hogs)


sc.standard_phases(tr.step, start, end)
