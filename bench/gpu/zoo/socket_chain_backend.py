"""socket_chain_backend: the main thread (CPUs 2-3) asks a data server process `batchsrv` (CPU 4) for each quarter
batch over a Unix socket; batchsrv asks its child `featd` (CPU 5) for the batch's features over a pipe, ~5 ms of
numpy a request (timed on its CPU at start). For 10 s three busy loops `hogd` share featd's CPU: featd waits for its
CPU, batchsrv waits on featd, the main thread waits on batchsrv. Three hops between the trainer and the cause, through
a socket and a pipe. Culprits: the hogd processes."""

from chain import Chain
from common import BUSY_LOOP, Scenario, Trainer, map_cpus, spawn_python, stop, tids_of

sc = Scenario("socket_chain_backend", "cpu_contention", "three busy loops share the CPU of featd, the feature "
              "process behind the trainer's data server, for 10 s", job_cpus=[2, 3], culprit_cpus=[5])
tr = Trainer(sc)
torch = tr.torch
BATCH = max(1, tr.batch // 4)
chain = Chain(BATCH, tr.in_dim, 0.005, map_cpus([4]), sc.culprit_cpus)
labels = torch.randint(0, 10, (BATCH * 4,), device=tr.dev)
hogs: list = []


def fed_step() -> None:
    x = torch.from_numpy(chain.fetch()).to(tr.dev).float().div_(255.0).repeat(4, 1)
    tr.step(x, labels)


def start() -> None:
    for _ in range(3):
        hogs.append(spawn_python(BUSY_LOOP.format(seconds=sc.window_s + 5), "hogd", sc.culprit_cpus))


def end() -> None:
    for p in hogs:
        sc.add_culprit(p.pid, tids_of(p.pid) or [p.pid], "hogd", cpus=sc.culprit_cpus)
    stop(hogs)


try:
    for _ in range(20):
        fed_step()
    tr.sync()
    sc.extra.update(server=chain.server.pid, featd=chain.featd_pid)
    sc.note("every step asks batchsrv for a quarter batch over a Unix socket (repeated 4x on the GPU); batchsrv asks "
            "featd for its features over a pipe (~5 ms numpy a request); in the window three hogd busy loops share "
            "featd's CPU.")
    sc.standard_phases(fed_step, start, end)
finally:
    stop(hogs)
    chain.close()
