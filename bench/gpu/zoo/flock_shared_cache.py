"""flock_shared_cache: every step takes an exclusive flock() on a shared cache index file (as
dataset caches shared by several jobs do) to read its header. For 10 s another process
`cachelockd` (a cache janitor) holds that lock 20 ms of every 25 ms, sleeping while it holds it:
the main thread sleeps in flock() until cachelockd lets go; no CPU is short. Trainer on CPUs 4-5,
cachelockd on CPU 6. Culprit: cachelockd."""

import fcntl
import os
import signal

from common import Scenario, Trainer, spawn_python, stop, tids_of

sc = Scenario("flock_shared_cache", "file_lock", "another process holds the cache index's flock 80% of the time "
              "for 10 s", job_cpus=[4, 5], culprit_cpus=[6])
PATH = "/var/tmp/zoo_cache.idx"
with open(PATH, "wb") as fh:
    fh.write(os.urandom(4096))
JANITOR = f"""
import fcntl, signal, time
busy = [False]
signal.signal(signal.SIGUSR1, lambda *a: busy.__setitem__(0, True))
signal.signal(signal.SIGUSR2, lambda *a: busy.__setitem__(0, False))
signal.signal(signal.SIGTERM, lambda *a: (_ for _ in ()).throw(SystemExit(0)))
with open({PATH!r}, 'rb') as fh:
    while True:
        if not busy[0]:
            signal.pause()
            continue
        fcntl.flock(fh, fcntl.LOCK_EX)
        time.sleep(0.020)
        fcntl.flock(fh, fcntl.LOCK_UN)
        time.sleep(0.005)
"""
janitor = spawn_python(JANITOR, "cachelockd", sc.culprit_cpus)
tr = Trainer(sc)
tr.warmup()
index = open(PATH, "rb")


def locked_step() -> None:
    """Read the cache index's header under its lock, then train."""
    fcntl.flock(index, fcntl.LOCK_EX)
    index.seek(0)
    index.read(64)
    fcntl.flock(index, fcntl.LOCK_UN)
    tr.step()


def start() -> None:
    os.kill(janitor.pid, signal.SIGUSR1)


def end() -> None:
    sc.add_culprit(janitor.pid, tids_of(janitor.pid) or [janitor.pid], "cachelockd", hold_s=0.020, period_s=0.025)
    os.kill(janitor.pid, signal.SIGUSR2)


try:
    sc.note("every step (all phases) takes the flock; only in the window does cachelockd hold it 20 ms of every 25.")
    sc.standard_phases(locked_step, start, end)
finally:
    stop([janitor])
    index.close()
    try:
        os.unlink(PATH)
    except OSError:
        pass
