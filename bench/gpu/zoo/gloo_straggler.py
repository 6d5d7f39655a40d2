"""gloo_straggler: the trainer (rank 0) and a CPU peer `peer_rank1` (rank 1, a child process) form a
torch.distributed gloo group over loopback TCP and all_reduce a 1 MiB CPU tensor every step (as data-parallel
training syncs gradients). For 10 s the peer turns straggler: 30 ms more numpy work before each all_reduce. The
trainer's main thread waits for the collective (gloo's own thread, a TCP socket to the peer) and the GPU idles.
Trainer on CPUs 2-3, peer on CPU 4. Culprit: the peer."""

import os
import signal
import socket

from common import Scenario, Trainer, spawn_python, stop, tids_of

sc = Scenario("gloo_straggler", "straggler", "a gloo all_reduce per step with a peer that turns 30 ms slower per "
              "step for 10 s", job_cpus=[2, 3], culprit_cpus=[4])
EXTRA_S = 0.030


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


PORT = free_port()
os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")  # loopback for both ranks (the peer inherits it)
PEER = f"""
import os, signal, time
import numpy as np
import torch
import torch.distributed as dist
slow = [False]
signal.signal(signal.SIGUSR1, lambda *a: slow.__setitem__(0, True))
signal.signal(signal.SIGUSR2, lambda *a: slow.__setitem__(0, False))
torch.set_num_threads(1)
dist.init_process_group('gloo', init_method='tcp://127.0.0.1:{PORT}', rank=1, world_size=2)
t = torch.ones(1 << 18)
a = np.random.default_rng(1).standard_normal(1 << 16)
while True:
    if slow[0]:
        end = time.perf_counter() + {EXTRA_S}
        while time.perf_counter() < end:
            a = np.sort(a)[::-1].copy()
    dist.all_reduce(t)
"""
peer = spawn_python(PEER, "peer_rank1", sc.culprit_cpus, site=True)
import torch.distributed as dist  # noqa: E402  (after the peer is on its way: both join the rendezvous)

dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{PORT}", rank=0, world_size=2)
tr = Trainer(sc)
torch = tr.torch
grad = torch.ones(1 << 18)


def synced_step() -> None:
    tr.step()
    dist.all_reduce(grad)


def start() -> None:
    os.kill(peer.pid, signal.SIGUSR1)


def end() -> None:
    os.kill(peer.pid, signal.SIGUSR2)
    sc.add_culprit(peer.pid, tids_of(peer.pid) or [peer.pid], "peer_rank1", extra_s=EXTRA_S)


try:
    tr.warmup()
    for _ in range(20):
        synced_step()
    sc.note(f"every step (all phases) all_reduces a 1 MiB CPU tensor with the peer over gloo; in the window the peer "
            f"works {EXTRA_S * 1e3:.0f} ms more before each all_reduce.")
    sc.standard_phases(synced_step, start, end)
finally:
    stop([peer])
