"""slow_pipe_reader: the main thread writes its per-step log (~4 KiB of text a step, a verbose
logger) into a pipe read by a child process `logsink` that appends it to a file. For 10 s the
reader turns slow: it reads 4 KiB, then sleeps 80 ms on a timer. The 64 KiB pipe fills and the
main thread blocks in write() (pipe_write) until logsink reads again; the GPU idles.

Trainer on CPUs 4-5, logsink on CPU 6 (it never competes for a CPU). Culprit: logsink."""

import os
import signal
import time

from common import Scenario, Trainer, spawn_python, stop, tids_of

sc = Scenario("slow_pipe_reader", "slow_consumer", "a log reader process (logsink) drains the trainer's log pipe "
              "4 KiB per 80 ms for 10 s", job_cpus=[4, 5], culprit_cpus=[6])
LOG = "/var/tmp/zoo_logsink.log"
CHUNK, DELAY = 4096, 0.080
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
tr = Trainer(sc)
tr.warmup()
LAYERS = [name for name, _ in tr.model.named_parameters()]


def log_text(loss: float, dt: float) -> str:
    """A step's log: the loss and its time, then a line per parameter and shard (~4 KiB)."""
    lines = [f"{time.time():.6f} step {tr.i} loss {loss:.6f} step_time_ms {dt * 1e3:.3f} lr 1.0e-04"]
    for k in range(4):
        lines += [f"{time.time():.6f} step {tr.i} rank 0 shard {k} param {name:>10s} lr 1.0e-04 wd 1.0e-02 "
                  f"beta1 0.9 beta2 0.999 loss_ema {loss:.6f} status ok" for name in LAYERS]
    return "\n".join(lines) + "\n"


def logged_step() -> None:
    """A training step, then its log into the pipe (a blocking write once the pipe is full)."""
    t0 = time.perf_counter()
    loss = tr.step()
    sink.stdin.write(log_text(loss, time.perf_counter() - t0))
    sink.stdin.flush()


def start() -> None:
    os.kill(sink.pid, signal.SIGUSR1)


def end() -> None:
    sc.add_culprit(sink.pid, tids_of(sink.pid) or [sink.pid], "logsink", read_bytes=CHUNK, sleep_s=DELAY)
    os.kill(sink.pid, signal.SIGUSR2)


try:
    sc.extra.update(bytes_per_step=len(log_text(0.0, 0.0)), sink_read_bytes=CHUNK, sink_sleep_s=DELAY)
    sc.note(f"every step (all phases) writes its log into the pipe; in the window logsink reads {CHUNK} B, then "
            f"sleeps {DELAY * 1e3:.0f} ms.")
    sc.standard_phases(logged_step, start, end)
    sink.stdin.close()
    sink.wait(30)
finally:
    stop([sink])
    try:
        os.unlink(LOG)
    except OSError:
        pass
