"""healthy_gloo_pair (control): the trainer (rank 0, CPUs 2-3) and a CPU peer `peer_rank1` (rank 1, CPU 4)
all_reduce a 1 MiB CPU tensor over gloo every step, the peer keeping up all along: the trainer waits for each
collective a little, every step, and nothing changes. 15 s. Window: none. throughput_ratio: first half over
second half."""

import os
import socket

from common import Scenario, Trainer, spawn_python, stop


sc = Scenario("healthy_gloo_pair", "none", "a gloo all_reduce per step with a peer that keeps up, 15 s, no cause",
              job_cpus=[2, 3], culprit_cpus=[4], control=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


PORT = free_port()
os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")  # loopback for both ranks (the peer inherits it)
PEER = f"""
import torch
import torch.distributed as dist
torch.set_num_threads(1)
dist.init_process_group('gloo', init_method='tcp://127.0.0.1:{PORT}', rank=1, world_size=2)
t = torch.ones(1 << 18)
while True:
    dist.all_reduce(t)
"""
peer = spawn_python(PEER, "peer_rank1", sc.culprit_cpus, site=True)
import torch.distributed as dist  # noqa: E402

dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{PORT}", rank=0, world_size=2)
tr = Trainer(sc)
torch = tr.torch
grad = torch.ones(1 << 18)


def synced_step() -> None:
    tr.step()
    dist.all_reduce(grad)


try:
    tr.warmup()
    for _ in range(20):
        synced_step()
    b0 = sc.mark("baseline")
    sc.run_for(7.5 * sc.scale, synced_step)
    mid = sc.mark("half")
    sc.run_for(7.5 * sc.scale, synced_step)
    b1 = sc.mark("end")
    sc.note("control: every step all_reduces a 1 MiB CPU tensor with a peer that keeps up; baseline_ns is the whole "
            "run; throughput_ratio compares its two halves.")
    sc.write_truth(baseline=(b0, b1), window=None, ratio_spans=((b0, mid), (mid, b1)))
finally:
    stop([peer])
