"""The socket chain two scenarios share (not a scenario): the trainer asks a data server process `batchsrv` for each
batch over a Unix socket; batchsrv asks its own child `featd` for the batch's features over a pipe pair, adds them to
rows cut from a pool and sends the batch back. featd's numpy work per request is calibrated on its CPU at start."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

import numpy as np

FEATD = """
import os, sys, time
import numpy as np
B, D, WORK_S = {batch}, {dim}, {work_s}
rng = np.random.default_rng(3)
base = rng.standard_normal((B, 16), dtype=np.float32)
w = rng.standard_normal((16, D), dtype=np.float32)

def block(n):
    x = base
    for _ in range(n):
        x = np.tanh(x * 1.01 + 0.1)
    return (x @ w).astype(np.float16)

block(2)
t = time.perf_counter(); block(16); per = (time.perf_counter() - t) / 16
n = max(1, round(WORK_S / max(per, 1e-7)))
sys.stderr.write(f"featd: {{per * 1e3:.3f}} ms a pass, {{n}} passes a request\\n")
inp, out = open(0, 'rb', buffering=0), open(1, 'wb', buffering=0)
while inp.read(1):
    view = memoryview(block(n)).cast('B')
    while len(view):
        view = view[out.write(view):]
"""

SERVER = """
import os, socket, subprocess, sys
import numpy as np
B, D = {batch}, {dim}
FEATD_BOOT = ("import os, ctypes\\nos.sched_setaffinity(0, {featd_cpus!r})\\n"
              "ctypes.CDLL(None).prctl(15, ctypes.c_char_p(b'featd'), 0, 0, 0)\\n")
featd = subprocess.Popen([sys.executable, "-c", FEATD_BOOT + {featd_code!r}], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, bufsize=0)
print(featd.pid, flush=True)
conn = socket.socket(fileno={fd})
pool = np.random.default_rng(7).integers(0, 256, (16384, D), dtype=np.uint8)
feat = np.empty((B, D), dtype=np.float16)
fview = memoryview(feat).cast('B')
k = 0
try:
    while conn.recv(1):
        featd.stdin.write(b"n")
        got = 0
        while got < len(fview):
            n = featd.stdout.readinto(fview[got:])
            if not n:
                raise SystemExit("featd closed its pipe")
            got += n
        rows = pool[(k * 97 + np.arange(B)) % len(pool)]
        batch = (rows.astype(np.int16) + (feat > 0)).clip(0, 255).astype(np.uint8)
        conn.sendall(batch)
        k += 1
except (BrokenPipeError, ConnectionResetError):
    pass
finally:
    featd.kill()
"""


class Chain:
    """batchsrv (on server_cpus) and its child featd (on featd_cpus), both mapped already; `fetch()` is one batch."""

    def __init__(self, batch: int, dim: int, work_s: float, server_cpus: list[int], featd_cpus: list[int]) -> None:
        self.batch, self.dim = batch, dim
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        featd_code = FEATD.format(batch=batch, dim=dim, work_s=work_s)
        code = SERVER.format(batch=batch, dim=dim, featd_cpus=list(featd_cpus), featd_code=featd_code,
                             fd=theirs.fileno())
        boot = (f"import os, ctypes\nos.sched_setaffinity(0, {list(server_cpus)!r})\n"
                "ctypes.CDLL(None).prctl(15, ctypes.c_char_p(b'batchsrv'), 0, 0, 0)\n")
        self.server = subprocess.Popen([sys.executable, "-c", boot + code], pass_fds=[theirs.fileno()],
                                       stdout=subprocess.PIPE, text=True)
        theirs.close()
        self.sock = mine
        self.featd_pid = int(self.server.stdout.readline())
        self.buf = np.empty((batch, dim), dtype=np.uint8)
        self.view = memoryview(self.buf).cast("B")

    def fetch(self) -> np.ndarray:
        """Ask for the next batch and wait for all of it."""
        self.sock.sendall(b"n")
        got = 0
        while got < len(self.view):
            n = self.sock.recv_into(self.view[got:])
            if n == 0:
                raise RuntimeError("batchsrv closed its socket")
            got += n
        return self.buf

    def close(self) -> None:
        self.sock.close()
        try:
            self.server.wait(5)
        except subprocess.TimeoutExpired:
            self.server.kill()
        try:
            os.kill(self.featd_pid, 9)
        except ProcessLookupError:
            pass
