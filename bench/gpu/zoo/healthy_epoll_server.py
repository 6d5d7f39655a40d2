"""healthy_epoll_server (control): idle_server's inference server written as an event loop: the main thread waits for
requests in epoll (selectors.DefaultSelector) with a 10 ms timeout (the loop's tick for its timers), again and again,
so between requests most of its waits end on their own timeout (the timer's interrupt) and the rest when a request
arrives (the packet's softirq). A client process `client` sends ~20 requests/s with random gaps (Poisson), each of
1-16 samples; per request a forward pass on the GPU and the logits back. The GPU is mostly idle because there is
little to do: nothing is wrong. An edge of the rule that a poll wait a hard interrupt ended is a chosen sleep: a
server's idle ticks are not a slow job. 15 s; window_ns null; steps are requests served. Server on CPU 3, client on
CPU 4."""

import selectors
import socket
import struct

from common import Scenario, Trainer, map_cpus, spawn_python, stop

sc = Scenario("healthy_epoll_server", "none", "an event-loop inference server (epoll, 10 ms tick) answering "
              "~20 requests/s with random gaps, 15 s, no cause", job_cpus=[3], control=True)
CLIENT_CPUS = map_cpus([4])
RATE, SECONDS = 20.0, 15.0 * sc.scale
CLIENT = f"""
import random, socket, struct, sys, time
port, dim = int(sys.argv[1]), int(sys.argv[2])
rng = random.Random(7)
conn = socket.create_connection(('127.0.0.1', port))
conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
sys.stdin.readline()  # go
end = time.monotonic() + {SECONDS}
sent = 0
while True:
    time.sleep(rng.expovariate({RATE}))
    if time.monotonic() >= end:
        break
    rows = rng.choice((1, 2, 4, 8, 16))
    conn.sendall(struct.pack('!I', rows) + rng.randbytes(rows * dim))
    want, got = rows * 10 * 4, 0
    while got < want:
        chunk = conn.recv(want - got)
        if not chunk:
            raise SystemExit('server closed')
        got += len(chunk)
    sent += 1
conn.sendall(struct.pack('!I', 0))
print('requests', sent, flush=True)
"""
tr = Trainer(sc)
torch = tr.torch
model = tr.model.eval()
srv = socket.socket()
srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
srv.bind(("127.0.0.1", 0))
srv.listen(1)
port = srv.getsockname()[1]
client = spawn_python(f"import sys\nsys.argv[1:] = ['{port}', '{tr.in_dim}']\n" + CLIENT, "client", CLIENT_CPUS,
                      stdin=True, stdout=True)
conn, _ = srv.accept()
conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
loop = selectors.DefaultSelector()
loop.register(conn, selectors.EVENT_READ)
TICK_S = 0.01


def wait_for_request() -> None:
    """The event loop's wait: epoll with the tick's timeout until the connection is readable."""
    while not loop.select(TICK_S):
        pass


def recv_exact(n: int) -> bytearray:
    buf = bytearray(n)
    view, got = memoryview(buf), 0
    while got < n:
        k = conn.recv_into(view[got:])
        if not k:
            raise ConnectionError("client closed the connection")
        got += k
    return buf


def answer(rows: int, data: bytearray) -> bytes:
    """One request: uint8 features to the GPU, made float, a forward pass, the logits back as bytes."""
    x = torch.frombuffer(data, dtype=torch.uint8).view(rows, tr.in_dim).to(tr.dev).float().div_(255.0)
    with torch.inference_mode():
        return model(x).float().cpu().numpy().tobytes()


for _ in range(20):  # warm the forward pass before the client starts
    answer(4, bytearray(4 * tr.in_dim))
tr.sync()
try:
    b0 = sc.mark("baseline")
    client.stdin.write("go\n")
    client.stdin.flush()
    while True:
        wait_for_request()
        (rows,) = struct.unpack("!I", recv_exact(4))
        if rows == 0:
            break
        conn.sendall(answer(rows, recv_exact(rows * tr.in_dim)))
        sc.step()
    b1 = sc.mark("end")
    out = client.stdout.readline().split()
    sc.marks["half"] = b0 + (b1 - b0) // 2
    sc.extra.update(client={"pid": client.pid, "comm": "client", "cpus": [4], "mean_rate_per_s": RATE,
                            "requests": int(out[1]) if out and out[0] == "requests" else None})
    sc.note("control: steps are requests served (1-16 samples each, Poisson arrivals at ~20/s), each awaited in "
            "epoll with a 10 ms tick; baseline_ns is the whole run; throughput_ratio compares its first and second "
            "halves. The client is no culprit.")
    sc.write_truth(baseline=(b0, b1), window=None, ratio_spans=((b0, sc.marks["half"]), (sc.marks["half"], b1)))
finally:
    loop.close()
    conn.close()
    srv.close()
    stop([client])
