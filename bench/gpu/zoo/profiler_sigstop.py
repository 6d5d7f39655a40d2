"""profiler_sigstop: for 10 s a sampling profiler `pyspyd` attached the blocking way (as py-spy does
without --nonblocking) stops the whole trainer process 100 times a second to read its stacks:
SIGSTOP, 5 ms, SIGCONT, 5 ms. Every thread of the trainer is stopped (state T) half the time; the
GPU idles. Trainer on CPUs 6-7, pyspyd on CPU 8. Culprit: pyspyd."""

import os
import signal

from common import Scenario, Trainer, spawn_python, stop, tids_of

sc = Scenario("profiler_sigstop", "stopped_by_signal", "a profiler stops the process 5 ms of every 10 ms for 10 s",
              job_cpus=[6, 7], culprit_cpus=[8])
TARGET = os.getpid()
STOP_S, RUN_S = 0.005, 0.005
PROFILER = f"""
import os, signal, time
on = [False]
signal.signal(signal.SIGUSR1, lambda *a: on.__setitem__(0, True))
signal.signal(signal.SIGUSR2, lambda *a: on.__setitem__(0, False))
stops = 0
while True:
    if not on[0]:
        signal.pause()
        continue
    try:
        os.kill({TARGET}, signal.SIGSTOP)
        time.sleep({STOP_S})
    finally:
        os.kill({TARGET}, signal.SIGCONT)  # never leave the trainer stopped
    stops += 1
    time.sleep({RUN_S})
"""
profiler = spawn_python(PROFILER, "pyspyd", sc.culprit_cpus)
tr = Trainer(sc)
tr.warmup()


def start() -> None:
    os.kill(profiler.pid, signal.SIGUSR1)


def end() -> None:
    os.kill(profiler.pid, signal.SIGUSR2)
    sc.add_culprit(profiler.pid, tids_of(profiler.pid) or [profiler.pid], "pyspyd", stop_s=STOP_S, run_s=RUN_S)


try:
    sc.note(f"in the window pyspyd sends SIGSTOP, sleeps {STOP_S * 1e3:.0f} ms, sends SIGCONT, sleeps "
            f"{RUN_S * 1e3:.0f} ms.")
    sc.standard_phases(tr.step, start, end)
finally:
    stop([profiler])
    os.kill(TARGET, signal.SIGCONT)
