"""socket_server_gil: the main thread (CPUs 2-3) asks a data server process `batchsrv` (CPUs 4-5) for each quarter
batch over a Unix socket; batchsrv cuts the rows from a pool and sends them in 64 KiB pieces (each send releases
its GIL). For 10 s a pure-Python thread `srv_spin` in batchsrv spins: after each send batchsrv's main thread waits
for its GIL back (up to the 5 ms switch interval), so the trainer waits on its socket longer. Two CPUs for the server:
its GIL, not a CPU, is what it waits for. Culprit: srv_spin (a thread of batchsrv)."""

import os
import signal
import socket
import subprocess
import sys

import numpy as np

from common import Scenario, Trainer

sc = Scenario("socket_server_gil", "input_bound", "a pure-Python thread spins in the trainer's data server process "
              "for 10 s, which sends each batch in 64 KiB pieces", job_cpus=[2, 3], culprit_cpus=[4, 5])
tr = Trainer(sc)
torch = tr.torch
BATCH, DIM = max(1, tr.batch // 4), tr.in_dim
SERVER = """
import ctypes, signal, socket, sys, threading
import numpy as np
B, D = {batch}, {dim}
libc = ctypes.CDLL(None)
spin = threading.Event()

def spinner():
    libc.prctl(15, ctypes.c_char_p(b"srv_spin"), 0, 0, 0)
    print(threading.get_native_id(), flush=True)
    x = 0
    while True:
        spin.wait()
        for i in range(2000):
            x = (x + i * i) % 1000003

threading.Thread(target=spinner, daemon=True).start()
signal.signal(signal.SIGUSR1, lambda *a: spin.set())
signal.signal(signal.SIGUSR2, lambda *a: spin.clear())
conn = socket.socket(fileno={fd})
pool = np.random.default_rng(7).integers(0, 256, (16384, D), dtype=np.uint8)
k = 0
try:
    while conn.recv(1):
        rows = pool[(k * 97 + np.arange(B)) % len(pool)]
        view = memoryview(rows).cast('B')
        for off in range(0, len(view), 65536):
            conn.sendall(view[off:off + 65536])
        k += 1
except (BrokenPipeError, ConnectionResetError):
    pass
"""
mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
boot = (f"import os, ctypes\nos.sched_setaffinity(0, {list(sc.culprit_cpus)!r})\n"
        "ctypes.CDLL(None).prctl(15, ctypes.c_char_p(b'batchsrv'), 0, 0, 0)\n")
server = subprocess.Popen([sys.executable, "-c", boot + SERVER.format(batch=BATCH, dim=DIM, fd=theirs.fileno())],
                          pass_fds=[theirs.fileno()], stdout=subprocess.PIPE, text=True)
theirs.close()
spin_tid = int(server.stdout.readline())
buf = np.empty((BATCH, DIM), dtype=np.uint8)
view = memoryview(buf).cast("B")
labels = torch.randint(0, 10, (BATCH * 4,), device=tr.dev)


def fetch() -> np.ndarray:
    mine.sendall(b"n")
    got = 0
    while got < len(view):
        n = mine.recv_into(view[got:])
        if n == 0:
            raise RuntimeError("batchsrv closed its socket")
        got += n
    return buf


def fed_step() -> None:
    x = torch.from_numpy(fetch()).to(tr.dev).float().div_(255.0).repeat(4, 1)
    tr.step(x, labels)


def start() -> None:
    os.kill(server.pid, signal.SIGUSR1)


def end() -> None:
    sc.add_culprit(server.pid, [spin_tid], "srv_spin", cpus=sc.culprit_cpus)
    os.kill(server.pid, signal.SIGUSR2)


try:
    for _ in range(20):
        fed_step()
    tr.sync()
    sc.extra.update(server=server.pid, spinner_tid=spin_tid)
    sc.note("every step asks batchsrv for a quarter batch over a Unix socket (repeated 4x on the GPU), sent in 64 KiB "
            "pieces; in the window batchsrv's thread srv_spin spins in pure Python, holding its GIL 5 ms at a time.")
    sc.standard_phases(fed_step, start, end)
finally:
    mine.close()
    try:
        server.wait(5)
    except subprocess.TimeoutExpired:
        server.kill()
