"""affinity_narrowed: every step builds its batch with torch CPU ops on 4 intra-op threads
(torch.set_num_threads(4)) over the job's CPUs 2-5, then trains on it. For 10 s a node agent (a child
`cpuset_mgr`) narrows the CPU mask of every thread of the trainer to CPU 2 alone (as a cpuset change or
`taskset -a -p` does), then restores it: the main thread and its intra-op threads queue for one CPU while three
of the job's CPUs sit idle. Culprits: the process's own intra-op threads (they take the one CPU)."""

import os
import subprocess
import sys
import threading
from collections import defaultdict

from common import Scenario, Trainer, comm_of, tids_of

sc = Scenario("affinity_narrowed", "own_threads_cpu", "the trainer's CPU mask narrowed from 4 CPUs to 1 for 10 s, "
              "with 4 intra-op threads", job_cpus=[2, 3, 4, 5])
tr = Trainer(sc, batch=2048)
torch = tr.torch
torch.set_num_threads(4)
src = torch.randn(tr.batch, tr.in_dim)
labels = torch.randint(0, 10, (tr.batch,))


def cpu_batch():
    """The CPU augmentation: intra-op parallel torch ops over the batch."""
    x = src.mul(1.01).add_(0.01)
    x = (x - x.mean(dim=0)) / (x.std(dim=0) + 1e-6)
    return x.clamp_(-3.0, 3.0).tanh_()


def aug_step() -> None:
    x = cpu_batch()
    tr.step(x.to(tr.dev), labels.to(tr.dev))


AGENT = """
import os, sys
pid, cpus = int(sys.argv[1]), [int(c) for c in sys.argv[2].split(',')]
for tid in os.listdir(f'/proc/{pid}/task'):
    try:
        os.sched_setaffinity(int(tid), cpus)
    except OSError:
        pass
"""


def set_mask(cpus: list[int]) -> None:
    """The agent: a short-lived child that sets every thread's mask (its name as an orchestrator's)."""
    boot = "import ctypes\nctypes.CDLL(None).prctl(15, ctypes.c_char_p(b'cpuset_mgr'), 0, 0, 0)\n"
    subprocess.run([sys.executable, "-S", "-c", boot + AGENT, str(os.getpid()), ",".join(map(str, cpus))], check=True)


tr.warmup()
aug_step()


def intra_op_threads() -> list[int]:
    """The process's threads but the main one and those torch names (pt_autograd_*, cuda-EvtHandlr, ...): the
    intra-op (OpenMP) pool."""
    me = threading.get_native_id()
    return [t for t in tids_of(os.getpid())
            if t != me and not (comm_of(os.getpid(), t) or "").startswith(("pt_", "cuda"))]


def start() -> None:
    set_mask(sc.job_cpus[:1])
    by_comm = defaultdict(list)
    for tid in intra_op_threads():
        by_comm[comm_of(os.getpid(), tid) or "?"].append(tid)
    for comm, tids in by_comm.items():
        sc.add_culprit(os.getpid(), tids, comm, role="intra-op threads")


def end() -> None:
    set_mask(sc.job_cpus)


sc.extra.update(intra_op_threads=4, narrowed_to=sc.job_cpus[:1],
                parallel_backend=torch.__config__.parallel_info().splitlines()[-1].strip())
sc.note(f"every step (all phases) builds a {tr.batch}x{tr.in_dim} float batch with torch CPU ops on 4 intra-op "
        f"threads, copies it and trains on it; in the window every thread's mask is CPU {sc.job_cpus[0]} alone.")
sc.standard_phases(aug_step, start, end)
