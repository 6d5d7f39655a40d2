"""pipe_producer_child: the main thread (CPUs 2-3) reads each uint8 batch from a child process `pipeprod` (CPU 4)
through the child's stdout, a plain pipe (a preprocessing tool started with subprocess, as some pipelines feed a
trainer). The child cuts rows from a pool, fast; for 10 s it also makes float numpy passes over each batch (~60 ms,
timed on its CPU at start) before writing it: the main thread sleeps in read() on the pipe, woken by the child's
writes, while the child runs. Culprit: the pipeprod pid."""

import fcntl
import os
import signal

import numpy as np

from common import Scenario, Trainer, spawn_python, stop, tids_of


def set_pipe_size(fd: int) -> None:
    """The pipe as large as this host allows (a batch in 1-8 MiB writes, not 64 KiB ones): what the writer pays to
    hand a batch over stays small beside its work."""
    try:
        fcntl.fcntl(fd, fcntl.F_SETPIPE_SZ, 8 << 20)  # beyond pipe-max-size where privileged
    except PermissionError:
        fcntl.fcntl(fd, fcntl.F_SETPIPE_SZ, int(open("/proc/sys/fs/pipe-max-size").read()))


sc = Scenario("pipe_producer_child", "input_bound", "a child writing batches into a pipe does ~60 ms of numpy more "
              "per batch for 10 s", job_cpus=[2, 3], culprit_cpus=[4])
tr = Trainer(sc)
torch = tr.torch
# A quarter batch through the pipe (1 MiB on the GPU host), repeated on the GPU: the hand-over stays small
# beside a step however slow this host's pipes are.
BATCH, DIM = max(1, tr.batch // 4), tr.in_dim
PRODUCER = f"""
import signal, sys, time
import numpy as np
slow = [False]
signal.signal(signal.SIGUSR1, lambda *a: slow.__setitem__(0, True))
signal.signal(signal.SIGUSR2, lambda *a: slow.__setitem__(0, False))
signal.signal(signal.SIGTERM, lambda *a: (_ for _ in ()).throw(SystemExit(0)))
B, D = {BATCH}, {DIM}
pool = np.random.default_rng(7).integers(0, 256, (16384, D), dtype=np.uint8)

def passes(rows, n):
    x = rows.astype(np.float32)
    for _ in range(n):
        x = np.sqrt(x * 1.001 + 1.0)
    return np.clip(x, 0, 255).astype(np.uint8)

passes(pool[:B], 2)  # warm: the first pass allocates
t = time.perf_counter(); passes(pool[:B], 8); per_pass = (time.perf_counter() - t) / 8
n = max(1, round(0.060 / max(per_pass, 1e-6)))
sys.stderr.write(f"pipeprod: {{per_pass * 1e3:.2f}} ms a pass, {{n}} passes a batch in the window\\n")
out = open(1, 'wb', buffering=0, closefd=False)
k = 0
try:
    while True:
        rows = pool[(k * 97 + np.arange(B)) % len(pool)]
        if slow[0]:
            rows = passes(rows, n)
        view = memoryview(rows).cast('B')
        while len(view):
            view = view[out.write(view):]
        k += 1
except (BrokenPipeError, SystemExit):
    pass
"""
child = spawn_python(PRODUCER, "pipeprod", sc.culprit_cpus, site=True, stdout=True)
fd = child.stdout.fileno()  # read raw: the text wrapper spawn_python made is never used
set_pipe_size(fd)
buf = np.empty(BATCH * DIM, dtype=np.uint8)
view = memoryview(buf)
labels = torch.randint(0, 10, (BATCH * 4,), device=tr.dev)


def read_batch() -> np.ndarray:
    got = 0
    while got < len(view):
        n = os.readv(fd, [view[got:]])
        if n == 0:
            raise RuntimeError("pipeprod closed its pipe")
        got += n
    return buf.reshape(BATCH, DIM)


def fed_step() -> None:
    x = torch.from_numpy(read_batch()).to(tr.dev).float().div_(255.0).repeat(4, 1)
    tr.step(x, labels)


def start() -> None:
    os.kill(child.pid, signal.SIGUSR1)


def end() -> None:
    sc.add_culprit(child.pid, tids_of(child.pid) or [child.pid], "pipeprod")
    os.kill(child.pid, signal.SIGUSR2)


try:
    for _ in range(20):
        fed_step()
    tr.sync()
    sc.extra["producer"] = child.pid
    sc.note("every step reads its batch from pipeprod's stdout (a pipe); in the window pipeprod makes ~60 ms of float "
            "numpy passes over each batch before writing it.")
    sc.standard_phases(fed_step, start, end)
finally:
    stop([child])
