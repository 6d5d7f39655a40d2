"""tcp_metrics_sink: every step the main thread sends its metrics (~3 KiB of JSON: loss, step time,
a record per parameter and shard) over a loopback TCP connection to a server process `metricsd`,
which reads and counts them. The socket buffers are small and fixed (SO_SNDBUF 32 KiB, SO_RCVBUF
64 KiB: no autotuning to MiBs). For 10 s metricsd reads slowly: a 4 KiB recv, then a 40 ms timer
sleep; the buffers fill and the main thread blocks in send() (sk_stream_wait_memory) until
metricsd reads again; the GPU idles.

Trainer on CPUs 4-5, metricsd on CPU 6 (it never competes for a CPU). Culprit: metricsd."""

import json
import os
import signal
import socket
import time

from common import Scenario, Trainer, spawn_python, stop, tids_of

sc = Scenario("tcp_metrics_sink", "slow_consumer", "a metrics server (metricsd) reads the trainer's per-step metrics "
              "from a loopback TCP socket 4 KiB per 40 ms for 10 s", job_cpus=[4, 5], culprit_cpus=[6])
RECV, DELAY = 4096, 0.040
SNDBUF, RCVBUF = 32 << 10, 64 << 10  # the kernel doubles both
SERVER = f"""
import signal, socket, time
delay = [0.0]
signal.signal(signal.SIGUSR1, lambda *a: delay.__setitem__(0, {DELAY}))
signal.signal(signal.SIGUSR2, lambda *a: delay.__setitem__(0, 0.0))
srv = socket.socket()
srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
srv.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, {RCVBUF})
srv.bind(('127.0.0.1', 0))
srv.listen(1)
print(srv.getsockname()[1], flush=True)
conn, _ = srv.accept()
total = lines = 0
while True:
    data = conn.recv({RECV} if delay[0] else 1 << 16)
    if not data:
        break
    total += len(data)
    lines += data.count(b'\\n')
    if delay[0]:
        time.sleep(delay[0])
print(total, lines, flush=True)
"""
server = spawn_python(SERVER, "metricsd", sc.culprit_cpus, stdout=True)
port = int(server.stdout.readline())
sock = socket.socket()
sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SNDBUF)
sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
sock.connect(("127.0.0.1", port))
tr = Trainer(sc)
tr.warmup()
PARAMS = [name for name, _ in tr.model.named_parameters()]


def metrics(loss: float, dt: float) -> bytes:
    """A step's metrics as one JSON line: loss and step time, then a record per parameter and shard (~3 KiB)."""
    record = {"ts": time.time(), "step": tr.i, "loss": loss, "step_time_ms": dt * 1e3, "lr": 1e-4,
              "params": [{"name": name, "shard": k, "lr": 1e-4, "wd": 1e-2, "beta1": 0.9, "beta2": 0.999,
                          "loss_ema": loss, "status": "ok"} for k in range(4) for name in PARAMS]}
    return (json.dumps(record) + "\n").encode()


def reported_step() -> None:
    """A training step, then its metrics over the socket (a blocking send once the buffers are full)."""
    t0 = time.perf_counter()
    loss = tr.step()
    sock.sendall(metrics(loss, time.perf_counter() - t0))


def start() -> None:
    os.kill(server.pid, signal.SIGUSR1)


def end() -> None:
    sc.add_culprit(server.pid, tids_of(server.pid) or [server.pid], "metricsd", recv_bytes=RECV, sleep_s=DELAY)
    os.kill(server.pid, signal.SIGUSR2)


def summary() -> None:
    """What metricsd received (it prints it at EOF)."""
    sock.close()
    try:
        got = server.stdout.readline().split()
        sc.extra["metricsd_received"] = {"bytes": int(got[0]), "lines": int(got[1])}
    except (IndexError, ValueError):
        sc.note("metricsd did not report what it received.")


try:
    sc.extra.update(bytes_per_step=len(metrics(0.0, 0.0)), sndbuf=sock.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF),
                    rcvbuf_asked=RCVBUF, sink_recv_bytes=RECV, sink_sleep_s=DELAY)
    sc.note(f"every step (all phases) sends its ~{sc.extra['bytes_per_step']} B of metrics to metricsd over loopback "
            f"TCP (SO_SNDBUF {SNDBUF >> 10} KiB, SO_RCVBUF {RCVBUF >> 10} KiB, both doubled by the kernel); in the "
            f"window metricsd reads {RECV} B, then sleeps {DELAY * 1e3:.0f} ms.")
    sc.standard_phases(reported_step, start, end, before_truth=summary)
    server.wait(30)
finally:
    sock.close()
    stop([server])
