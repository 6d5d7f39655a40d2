"""logging_lock_pipe: the trainer logs through Python's logging into a StreamHandler on a pipe read by a child
process `logsink`; besides the main thread's line per step, a thread `telemetry` logs 4 KiB every 5 ms. For 10 s
logsink turns slow (reads 4 KiB, then sleeps 50 ms): the pipe fills, whichever thread holds the handler's lock
blocks in write() while it holds it, and the main thread waits on that lock before it can log its step - mostly a
wait two hops from its cause. Trainer on CPUs 4-5, logsink on CPU 6. Culprit: logsink."""

import logging
import os
import signal
import threading
import time

from common import Scenario, Trainer, set_thread_name, spawn_python, stop, tids_of

sc = Scenario("logging_lock_pipe", "slow_consumer", "a log reader drains the trainer's logging pipe 4 KiB per 50 ms "
              "while two threads log into it, for 10 s", job_cpus=[4, 5], culprit_cpus=[6])
LOG = "/var/tmp/zoo_logging_sink.log"
CHUNK, DELAY = 4096, 0.050
SINK = f"""
import os, signal, time
delay = [0.0]
signal.signal(signal.SIGUSR1, lambda *a: delay.__setitem__(0, {DELAY}))
signal.signal(signal.SIGUSR2, lambda *a: delay.__setitem__(0, 0.0))
with open({LOG!r}, 'ab') as out:
    while True:
        chunk = os.read(0, {CHUNK} if delay[0] else 1 << 16)
        if not chunk:
            break
        out.write(chunk)
        if delay[0]:
            time.sleep(delay[0])
"""
sink = spawn_python(SINK, "logsink", sc.culprit_cpus, stdin=True)
log = logging.getLogger("zoo.train")
log.setLevel(logging.INFO)
log.propagate = False
log.addHandler(logging.StreamHandler(sink.stdin))
tr = Trainer(sc)
tr.warmup()
halt = threading.Event()
RECORD = "x" * 4000


def telemetry() -> None:
    set_thread_name("telemetry")
    while not halt.is_set():
        log.info("telemetry %s", RECORD)
        time.sleep(0.005)


th = threading.Thread(target=telemetry, daemon=True)


def logged_step() -> None:
    loss = tr.step()
    log.info("step %d loss %.6f", tr.i, loss)


def start() -> None:
    os.kill(sink.pid, signal.SIGUSR1)


def end() -> None:
    sc.add_culprit(sink.pid, tids_of(sink.pid) or [sink.pid], "logsink", read_bytes=CHUNK, sleep_s=DELAY)
    os.kill(sink.pid, signal.SIGUSR2)


try:
    th.start()
    sc.note(f"every step logs a line; a telemetry thread logs 4 KB every 5 ms (all phases); in the window logsink "
            f"reads {CHUNK} B, then sleeps {DELAY * 1e3:.0f} ms.")
    sc.standard_phases(logged_step, start, end)
    halt.set()
    th.join(5)
finally:
    halt.set()
    stop([sink])
    try:
        os.unlink(LOG)
    except OSError:
        pass
