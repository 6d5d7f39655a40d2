"""select_rate_limiter: for 10 s every step ends with select.select([], [], [], 0.02), a rate limiter written with
select's timeout instead of time.sleep (as some event-loop and networking code does), CPU 3. The main thread sleeps
in select() on a timer, waiting for no descriptor, for 20 ms of every ~30 ms step; the GPU idles meanwhile. No
culprit: the feeder's own sleep."""

import select

from common import Scenario, Trainer

SLEEP_S = 0.02
sc = Scenario("select_rate_limiter", "timed_sleep", f"every step ends with select() timing out after {SLEEP_S} s for "
              "10 s", job_cpus=[3])
tr = Trainer(sc)
tr.warmup()


def throttled_step() -> None:
    """A training step, then the wait for nothing with a timeout."""
    tr.step()
    select.select([], [], [], SLEEP_S)


sc.extra["sleep_s"] = SLEEP_S
sc.note(f"window steps: the usual step, then select.select([], [], [], {SLEEP_S}); baseline and recovery: the step "
        "alone.")
sc.standard_phases(tr.step, lambda: None, lambda: None, throttled_step)
