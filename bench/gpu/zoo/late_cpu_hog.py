"""late_cpu_hog: a small fast training loop (a tiny MLP, ~1,000+ steps/s, host-bound) alone on CPU 5;
1.5 s after its first step three busy-looping processes `hogd` start on the same CPU for 10 s, then
5 s of recovery. The cause begins while the job is barely past its start-up (no warm-up before
the baseline: the first steps are the job's own start-up), so it must not be taken for start-up.
Culprits: the hogd processes."""

from common import BUSY_LOOP, Scenario, Trainer, spawn_python, stop, tids_of

sc = Scenario("late_cpu_hog", "cpu_contention", "three busy loops join the tiny trainer's CPU 5 1.5 s after "
              "training began, for 10 s", job_cpus=[5], culprit_cpus=[5], baseline_s=1.5, window_s=10.0,
              recovery_s=5.0)
tr = Trainer(sc, width=256, batch=256, in_dim=64)
hogs = []


def start() -> None:
    for _ in range(3):
        hogs.append(spawn_python(BUSY_LOOP.format(seconds=sc.window_s + 5), "hogd", sc.culprit_cpus))


def end() -> None:
    for p in hogs:
        sc.add_culprit(p.pid, tids_of(p.pid) or [p.pid], "hogd")
    stop(hogs)


sc.note("no warm-up: the baseline starts with the first training step (CUDA and cuBLAS start-up inside it); "
        "tiny MLP 64-256-256-256-10, batch 256, from device-resident batches.")
sc.standard_phases(tr.step, start, end)
