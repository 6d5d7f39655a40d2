"""healthy_socket_chain (control): socket_chain_backend's chain (trainer on CPUs 2-3 -> Unix socket -> batchsrv on
CPU 4 -> pipe -> featd on CPU 5) with featd's work ~1 ms a request and nothing else on its CPU, 15 s: the trainer waits
a little for every batch, the same all along. A steady hand-over is not a slow phase: nothing may be blamed."""

from chain import Chain
from common import Scenario, Trainer, map_cpus

sc = Scenario("healthy_socket_chain", "none", "batches from a data server and its feature process over a socket "
              "and a pipe, steady, 15 s, no cause", job_cpus=[2, 3], culprit_cpus=[5], control=True)
tr = Trainer(sc)
torch = tr.torch
BATCH = max(1, tr.batch // 4)
chain = Chain(BATCH, tr.in_dim, 0.001, map_cpus([4]), sc.culprit_cpus)
labels = torch.randint(0, 10, (BATCH * 4,), device=tr.dev)


def fed_step() -> None:
    x = torch.from_numpy(chain.fetch()).to(tr.dev).float().div_(255.0).repeat(4, 1)
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
    sc.extra.update(server=chain.server.pid, featd=chain.featd_pid)
    sc.note("control: every step asks batchsrv for a quarter batch over a Unix socket (repeated 4x on the GPU); "
            "batchsrv asks featd for features over a pipe (~1 ms numpy a request); baseline_ns is the whole run; "
            "throughput_ratio is the first half's steps/s over the second's.")
    sc.write_truth(baseline=(b0, b1), window=None, ratio_spans=((b0, mid), (mid, b1)))
finally:
    chain.close()
