"""fsync_logging: every step appends a metrics line to a log file in /var/tmp (write + flush: a
write() syscall, all phases); for 10 s each line is also made durable with os.fsync (a logger's
"sync every record" option turned on): the main thread sleeps in D state while the file system
commits every line to the disk. A small fast model (~1 ms steps, 1,000+ steps/s on the H200) so
that a ~0.5-2 ms fsync is a real share of a step (CPU 9). No culprit process. The file is removed
at the end."""

import os
import time

from common import Scenario, Trainer

sc = Scenario("fsync_logging", "disk_io", "an fsync of the metrics log after every step for 10 s", job_cpus=[9])
PATH = os.environ.get("ZOO_FSYNC_LOG", "/var/tmp/zoo_fsync_metrics.log")
tr = Trainer(sc, width=256, batch=256, in_dim=64)
tr.warmup()
log = open(PATH, "a")
durable = [False]


def logged_step() -> None:
    """A step, then its metrics line appended and flushed (and fsync'ed in the window)."""
    t0 = time.perf_counter()
    loss = tr.step()
    log.write(f"{time.time():.6f} step={tr.i} loss={loss:.6f} step_ms={(time.perf_counter() - t0) * 1e3:.3f} "
              f"lr=1.0e-04\n")
    log.flush()
    if durable[0]:
        os.fsync(log.fileno())


def start() -> None:
    durable[0] = True


def end() -> None:
    durable[0] = False


try:
    sc.extra["log_file"] = PATH
    sc.note("tiny MLP 64-256-256-256-10, batch 256, from device-resident batches; every step (all phases) appends "
            "a ~90 B line and flushes it; only the window's steps fsync.")
    sc.standard_phases(logged_step, start, end)
finally:
    log.close()
    try:
        os.unlink(PATH)
    except OSError:
        pass
