"""slow_data_server: the loop is fed by DataLoader(num_workers=4) whose workers fetch each batch
from a data server process `datasrv` over loopback TCP, as 16 sequential requests (one per shard
of the batch, uint8 samples as images are stored; the GPU turns them into floats). datasrv
answers each request on a thread per connection. For 10 s it answers every request 25 ms late (a
timer sleep before the answer): a batch then takes a worker 16 x 25 ms, four workers deliver ~10
batches/s, and the main thread waits for batches while the workers wait in recv().

Trainer and workers on CPUs 2-7, datasrv on 8-9: no CPU is short. Culprit: datasrv."""

import os
import signal
import socket
import struct

from common import Scenario, Trainer, comm_of, spawn_python, stop, tids_of

sc = Scenario("slow_data_server", "network_wait", "a data server (datasrv) the DataLoader workers fetch from over "
              "loopback TCP answers each request 25 ms late for 10 s", job_cpus=[2, 3, 4, 5, 6, 7],
              culprit_cpus=[8, 9])
WORKERS, REQUESTS, DELAY = 4, 16, 0.025
SERVER = f"""
import os, signal, socket, struct, sys, threading, time
delay = [0.0]
signal.signal(signal.SIGUSR1, lambda *a: delay.__setitem__(0, {DELAY}))
signal.signal(signal.SIGUSR2, lambda *a: delay.__setitem__(0, 0.0))
blob = memoryview(os.urandom(64 << 20))


def recv_exact(conn, n):
    buf = bytearray(n)
    view, got = memoryview(buf), 0
    while got < n:
        k = conn.recv_into(view[got:])
        if not k:
            return None
        got += k
    return buf


def serve(conn):
    with conn:
        while True:
            head = recv_exact(conn, 12)
            if head is None:
                return
            offset, size = struct.unpack('!QI', head)
            if delay[0]:
                time.sleep(delay[0])
            offset %= len(blob) - size
            conn.sendall(blob[offset:offset + size])


srv = socket.socket()
srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
srv.bind(('127.0.0.1', 0))
srv.listen(64)
print(srv.getsockname()[1], flush=True)
while True:
    conn, _ = srv.accept()
    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    threading.Thread(target=serve, args=(conn,), daemon=True).start()
"""
server = spawn_python(SERVER, "datasrv", sc.culprit_cpus, stdout=True)
port = int(server.stdout.readline())
tr = Trainer(sc)
torch = tr.torch


class RemoteShards(torch.utils.data.Dataset):
    """Batch b: REQUESTS sequential requests to datasrv, each for one shard of the batch's uint8 samples."""

    def __init__(self, batch: int, dim: int) -> None:
        self.batch, self.dim = batch, dim
        self.sock: socket.socket | None = None
        self.pid = 0

    def __len__(self) -> int:
        return 1 << 40

    def connection(self) -> socket.socket:
        if self.sock is None or self.pid != os.getpid():  # one connection per worker process
            self.sock = socket.create_connection(("127.0.0.1", port))
            self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self.pid = os.getpid()
        return self.sock

    def __getitem__(self, b: int):
        conn = self.connection()
        buf = bytearray(self.batch * self.dim)
        view = memoryview(buf)
        shard = len(buf) // REQUESTS
        for k in range(REQUESTS):
            conn.sendall(struct.pack("!QI", (b * REQUESTS + k) * shard, shard))
            got = 0
            while got < shard:
                n = conn.recv_into(view[k * shard + got:(k + 1) * shard])
                if not n:
                    raise ConnectionError("datasrv closed the connection")
                got += n
        x = torch.frombuffer(buf, dtype=torch.uint8).view(self.batch, self.dim)
        return x, (x[:, 0] % 10).long()


loader = torch.utils.data.DataLoader(RemoteShards(tr.batch, tr.in_dim), batch_size=None, num_workers=WORKERS,
                                     pin_memory=sc.cuda, prefetch_factor=2, persistent_workers=True)
it = iter(loader)
workers = [w.pid for w in it._workers]


def fed_step() -> None:
    """A step on the next batch from the workers: uint8 to the GPU, made float there."""
    x, y = next(it)
    x = x.to(tr.dev, non_blocking=True).float().div_(255.0)
    tr.step(x, y.to(tr.dev, non_blocking=True))


def start() -> None:
    os.kill(server.pid, signal.SIGUSR1)


def end() -> None:
    sc.add_culprit(server.pid, tids_of(server.pid), "datasrv", answer_delay_s=DELAY)
    os.kill(server.pid, signal.SIGUSR2)


try:
    for _ in range(20):
        fed_step()
    tr.sync()
    sc.extra.update(loader_workers=[{"pid": p, "comm": comm_of(p)} for p in workers], requests_per_batch=REQUESTS,
                    request_bytes=tr.batch * tr.in_dim // REQUESTS, answer_delay_s=DELAY, port=port)
    sc.note(f"every step (all phases) trains on a batch fetched by {WORKERS} DataLoader workers from datasrv as "
            f"{REQUESTS} requests of {tr.batch * tr.in_dim // REQUESTS} B; in the window each answer waits {DELAY} s.")
    sc.standard_phases(fed_step, start, end)
finally:
    it._shutdown_workers()
    stop([server])
