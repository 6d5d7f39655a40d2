"""sigprof_sampler: an in-process sampling profiler left on. For 10 s a SIGPROF timer fires every 2 ms of the
process's CPU time and a Python handler walks the interrupted stack (traceback.extract_stack) and counts it in a
dict keyed by its formatted frames, on the main thread, between the loop's own bytecodes. The main thread does
the profiler's work instead of feeding the GPU. Trainer on CPUs 5-6; no culprit process: the feeder's own code."""

import signal
import traceback

from common import Scenario, Trainer

sc = Scenario("sigprof_sampler", "host_bound_prep", "a SIGPROF sampling profiler in the trainer's process, every "
              "2 ms of CPU time, for 10 s", job_cpus=[5, 6])
tr = Trainer(sc)
tr.warmup()
seen: dict[str, int] = {}
fired = [0]


def sample(_signum: int, frame: object) -> None:
    """The profiler's handler: the stack as text, counted."""
    fired[0] += 1
    key = "".join(traceback.format_list(traceback.extract_stack(frame)))  # type: ignore[arg-type]
    seen[key] = seen.get(key, 0) + 1


def start() -> None:
    signal.signal(signal.SIGPROF, sample)
    signal.setitimer(signal.ITIMER_PROF, 0.002, 0.002)


def end() -> None:
    signal.setitimer(signal.ITIMER_PROF, 0, 0)
    signal.signal(signal.SIGPROF, signal.SIG_DFL)


sc.note("the handler runs on the main thread (Python runs signal handlers there) between bytecodes.")
sc.standard_phases(tr.step, start, end, before_truth=lambda: sc.extra.update(samples=fired[0], stacks=len(seen)))
