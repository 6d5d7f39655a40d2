"""rt_neighbor: a real-time process `rtmon` (SCHED_FIFO, priority 10: a monitoring or telemetry
daemon given RT priority) pinned on the trainer's only CPU (1). It starts before the baseline and
sleeps; for 10 s it runs ~15 ms then sleeps ~5 ms in a loop. A SCHED_FIFO task preempts the
trainer whenever it is runnable: the trainer's main thread waits for the CPU (runnable, preempted
by rtmon) ~75 % of the time. Culprit: rtmon."""

from common import Scenario, Trainer, spawn_python, stop, tids_of

sc = Scenario("rt_neighbor", "cpu_contention", "a SCHED_FIFO process (rtmon) on the trainer's CPU runs 15 ms of "
              "every 20 ms for 10 s", job_cpus=[1], culprit_cpus=[1])
RUN_S, SLEEP_S, PRIORITY = 0.015, 0.005, 10
RT = f"""
import os, sys, time
try:
    os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param({PRIORITY}))
    policy = 'SCHED_FIFO'
except OSError as exc:
    policy = 'SCHED_OTHER (' + str(exc).replace(' ', '_') + ')'
print('ready', policy, flush=True)
for line in sys.stdin:
    end = time.monotonic() + float(line.split()[1])
    cycles = 0
    while time.monotonic() < end:
        busy = time.monotonic() + {RUN_S}
        while time.monotonic() < busy:
            pass
        time.sleep({SLEEP_S})
        cycles += 1
    print('cycles', cycles, flush=True)
"""
rt = spawn_python(RT, "rtmon", sc.culprit_cpus, stdin=True, stdout=True)
tr = Trainer(sc)
tr.warmup()
ready = rt.stdout.readline().split(maxsplit=1)
assert ready and ready[0] == "ready", f"rtmon did not start: {ready!r}"
policy = ready[1].strip()
if policy != "SCHED_FIFO":
    sc.note(f"rtmon could not take SCHED_FIFO: it ran as {policy}.")


def start() -> None:
    rt.stdin.write(f"go {sc.window_s}\n")
    rt.stdin.flush()


def end() -> None:
    out = rt.stdout.readline().split()  # rtmon ends its loop at the same deadline
    sc.add_culprit(rt.pid, tids_of(rt.pid), "rtmon", policy=policy, priority=PRIORITY, run_s=RUN_S, sleep_s=SLEEP_S,
                   cycles=int(out[1]) if out and out[0] == "cycles" else None)


try:
    sc.standard_phases(tr.step, start, end)
finally:
    stop([rt])
