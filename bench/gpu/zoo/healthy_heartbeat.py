"""healthy_heartbeat (control): the training loop with the busy-looking company real jobs keep, none
of it in the way: a heartbeat thread waking every 2 ms (a watchdog tick), a logger thread
appending a line to a file every 100 ms, and a monitor process reading the trainer's
/proc/PID/status every 50 ms. Trainer on CPUs 3-4, monitor on CPU 5. 15 s, nothing staged.
Window: none. throughput_ratio: first half over second half."""

import os
import threading
import time

from common import Scenario, Trainer, set_thread_name, spawn_python, stop

sc = Scenario("healthy_heartbeat", "none", "a training loop with a heartbeat thread, a logger thread and a /proc "
              "monitor process, 15 s, no cause", job_cpus=[3, 4], culprit_cpus=[5], control=True)
LOG = "/var/tmp/zoo_heartbeat.log"
MONITOR = f"""
import time
while True:
    with open('/proc/{os.getpid()}/status') as fh:
        fh.read()
    time.sleep(0.05)
"""
halt = threading.Event()
beats = [0]


def heartbeat() -> None:
    set_thread_name("heartbeat")
    while not halt.is_set():
        beats[0] += 1
        time.sleep(0.002)


def logger() -> None:
    set_thread_name("metrics_log")
    with open(LOG, "a") as fh:
        while not halt.is_set():
            fh.write(f"{time.time():.6f} beats {beats[0]}\n")
            fh.flush()
            time.sleep(0.1)


tr = Trainer(sc)
tr.warmup()
monitor = spawn_python(MONITOR, "procmon", sc.culprit_cpus)
threads = [threading.Thread(target=f, daemon=True) for f in (heartbeat, logger)]
for th in threads:
    th.start()
try:
    b0 = sc.mark("baseline")
    sc.run_for(7.5 * sc.scale, tr.step)
    mid = sc.mark("half")
    sc.run_for(7.5 * sc.scale, tr.step)
    b1 = sc.mark("end")
    sc.extra["beats"] = beats[0]
    sc.note("control: the loop alone on its CPUs with a 2 ms heartbeat thread, a 100 ms logger thread and a /proc "
            "monitor process; baseline_ns is the whole run; throughput_ratio compares its two halves.")
    sc.write_truth(baseline=(b0, b1), window=None, ratio_spans=((b0, mid), (mid, b1)))
finally:
    halt.set()
    for th in threads:
        th.join()
    stop([monitor])
    try:
        os.unlink(LOG)
    except OSError:
        pass
