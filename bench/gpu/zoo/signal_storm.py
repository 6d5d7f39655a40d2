"""signal_storm: for 10 s another process `sigstorm` (CPU 6) sends the trainer SIGUSR1 as fast as it can (os.kill
in a loop); the trainer's Python handler counts them, on its main thread, between the loop's bytecodes. Every
signal interrupts the main thread (and the system call it is in). Trainer on CPUs 4-5. Culprit: sigstorm."""

import os
import signal

from common import Scenario, Trainer, spawn_python, stop, tids_of

sc = Scenario("signal_storm", "signal_storm", "another process sends the trainer SIGUSR1 flat out for 10 s",
              job_cpus=[4, 5], culprit_cpus=[6])
got = [0]
signal.signal(signal.SIGUSR1, lambda *_: got.__setitem__(0, got[0] + 1))
SENDER = f"""
import os, signal, sys
sys.stdin.readline()
target, sent = {os.getpid()}, 0
try:
    while True:
        os.kill(target, signal.SIGUSR1)
        sent += 1
except (ProcessLookupError, KeyboardInterrupt):
    pass
"""
sender = spawn_python(SENDER, "sigstorm", sc.culprit_cpus, stdin=True)
tr = Trainer(sc)
tr.warmup()


def start() -> None:
    assert sender.stdin is not None
    sender.stdin.write("go\n")
    sender.stdin.flush()


def end() -> None:
    sc.add_culprit(sender.pid, tids_of(sender.pid) or [sender.pid], "sigstorm")
    sender.terminate()
    sender.wait(5)


try:
    sc.standard_phases(tr.step, start, end, before_truth=lambda: sc.extra.update(signals_handled=got[0]))
finally:
    signal.signal(signal.SIGUSR1, signal.SIG_IGN)
    stop([sender])
