"""sleep_in_loop: for 10 s every step ends with time.sleep(0.02) (a rate limiter or a debugging
sleep left in the loop), CPU 3. The main thread sleeps on a timer (hrtimer, not waiting for the GPU,
a lock, IO or another thread) for 20 ms of every ~30 ms step; the GPU idles meanwhile. No culprit:
the feeder's own sleep."""

import time

from common import Scenario, Trainer

SLEEP_S = 0.02
sc = Scenario("sleep_in_loop", "timed_sleep", f"every step ends with time.sleep({SLEEP_S}) for 10 s", job_cpus=[3])
tr = Trainer(sc)
tr.warmup()


def throttled_step() -> None:
    """A training step, then the sleep left in the loop."""
    tr.step()
    time.sleep(SLEEP_S)


sc.extra["sleep_s"] = SLEEP_S
sc.note(f"window steps: the usual step, then time.sleep({SLEEP_S}); baseline and recovery: the step alone.")
sc.standard_phases(tr.step, lambda: None, lambda: None, throttled_step)
