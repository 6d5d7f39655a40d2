"""healthy_pipe_producer (control): pipe_producer_child's loop, the child `pipefast` (CPU 4) only cutting uint8 rows
from a pool and writing them into its stdout, a pipe, keeping ahead of the trainer (CPUs 2-3) all along, 15 s: a
main thread that reads its batches from a pipe whose writer keeps up is not a slow job."""

import fcntl
import os

import numpy as np

from common import Scenario, Trainer, spawn_python, stop


def set_pipe_size(fd: int) -> None:
    """The pipe as large as this host allows (a batch in 1-8 MiB writes, not 64 KiB ones): what the writer pays to
    hand a batch over stays small beside its work."""
    try:
        fcntl.fcntl(fd, fcntl.F_SETPIPE_SZ, 8 << 20)  # beyond pipe-max-size where privileged
    except PermissionError:
        fcntl.fcntl(fd, fcntl.F_SETPIPE_SZ, int(open("/proc/sys/fs/pipe-max-size").read()))


sc = Scenario("healthy_pipe_producer", "none", "batches read from a child's pipe that keeps up, 15 s, no cause",
              job_cpus=[2, 3], culprit_cpus=[4], control=True)
tr = Trainer(sc)
torch = tr.torch
# A quarter batch through the pipe (1 MiB on the GPU host), repeated on the GPU: the hand-over stays small
# beside a step however slow this host's pipes are.
BATCH, DIM = max(1, tr.batch // 4), tr.in_dim
PRODUCER = f"""
import signal, sys
import numpy as np
signal.signal(signal.SIGTERM, lambda *a: (_ for _ in ()).throw(SystemExit(0)))
B, D = {BATCH}, {DIM}
pool = np.random.default_rng(7).integers(0, 256, (16384, D), dtype=np.uint8)
out = open(1, 'wb', buffering=0, closefd=False)
k = 0
try:
    while True:
        view = memoryview(pool[(k * 97 + np.arange(B)) % len(pool)]).cast('B')
        while len(view):
            view = view[out.write(view):]
        k += 1
except (BrokenPipeError, SystemExit):
    pass
"""
child = spawn_python(PRODUCER, "pipefast", sc.culprit_cpus, site=True, stdout=True)
fd = child.stdout.fileno()
set_pipe_size(fd)
buf = np.empty(BATCH * DIM, dtype=np.uint8)
view = memoryview(buf)
labels = torch.randint(0, 10, (BATCH * 4,), device=tr.dev)


def read_batch() -> np.ndarray:
    got = 0
    while got < len(view):
        n = os.readv(fd, [view[got:]])
        if n == 0:
            raise RuntimeError("pipefast closed its pipe")
        got += n
    return buf.reshape(BATCH, DIM)


def fed_step() -> None:
    x = torch.from_numpy(read_batch()).to(tr.dev).float().div_(255.0).repeat(4, 1)
    tr.step(x, labels)


try:
    for _ in range(20):
        fed_step()
    tr.sync()
    b0 = sc.mark("baseline")
    sc.run_for(7.5 * sc.scale, fed_step)
    mid = sc.mark("half")
    sc.run_for(7.5 * sc.scale, fed_step)
    b1 = sc.mark("end")
    sc.note("control: baseline_ns is the whole run; throughput_ratio compares its first and second halves.")
    sc.write_truth(baseline=(b0, b1), window=None, ratio_spans=((b0, mid), (mid, b1)))
finally:
    stop([child])
