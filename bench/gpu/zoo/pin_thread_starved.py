"""pin_thread_starved: the loop is fed by DataLoader(num_workers=2, pin_memory=True) with 16 MiB uint8 batches
(the pin-memory thread copies each into pinned memory, ~40 % of a CPU). The main thread runs on CPU 2, the
pin-memory thread (pt_data_pin) is moved to CPU 3, the workers to 4-5. For 10 s three busy processes `hogd` run
on CPU 3: the pin-memory thread waits for its CPU behind them and the main thread sleeps waiting for pinned
batches, its own CPU free: a wait two hops from its cause. Culprits: the hogd pids."""

import os
import threading

import numpy as np

from common import BUSY_LOOP, Scenario, Trainer, comm_of, spawn_python, stop, tids_of

sc = Scenario("pin_thread_starved", "cpu_contention", "three busy loops on the pin-memory thread's CPU for 10 s",
              job_cpus=[2, 3], culprit_cpus=[3])
tr = Trainer(sc)
torch = tr.torch
POOL, WIDE = 4096, 4  # samples in the pool; each sample is WIDE x in_dim bytes, the step uses the first in_dim
WORKER_CPUS = [4, 5]


class Wide(torch.utils.data.Dataset):
    """Index b: the b-th batch of wide uint8 samples, cut from a pool."""

    def __init__(self, batch: int, dim: int) -> None:
        self.batch = batch
        self.pool = np.random.default_rng(0).integers(0, 256, (POOL, dim * WIDE), dtype=np.uint8)

    def __len__(self) -> int:
        return 1 << 40

    def __getitem__(self, b: int):
        rows = self.pool[(b * self.batch + np.arange(self.batch)) % POOL]
        return torch.from_numpy(rows)


def pin_worker(k: int) -> None:
    from common import map_cpus

    os.sched_setaffinity(0, map_cpus([WORKER_CPUS[k % len(WORKER_CPUS)]]))


loader = torch.utils.data.DataLoader(Wide(tr.batch, tr.in_dim), batch_size=None, num_workers=2, pin_memory=sc.cuda,
                                     prefetch_factor=2, persistent_workers=True, worker_init_fn=pin_worker)
it = iter(loader)
labels = torch.randint(0, 10, (tr.batch,), device=tr.dev)


def fed_step() -> None:
    x = next(it)
    x = x[:, :tr.in_dim].to(tr.dev, non_blocking=True).float().div_(255.0)
    tr.step(x, labels)


hogs: list = []


def start() -> None:
    for _ in range(3):
        hogs.append(spawn_python(BUSY_LOOP.format(seconds=sc.window_s + 5), "hogd", sc.culprit_cpus))


def end() -> None:
    for p in hogs:
        sc.add_culprit(p.pid, tids_of(p.pid) or [p.pid], "hogd")
    stop(hogs)


try:
    for _ in range(20):
        fed_step()
    tr.sync()
    main_cpu, pin_cpu = sc.job_cpus[0], sc.job_cpus[-1]
    os.sched_setaffinity(0, [main_cpu])  # the calling (main) thread only
    pinners = [t for t in tids_of(os.getpid()) if comm_of(os.getpid(), t) == "pt_data_pin"]
    for tid in pinners:
        os.sched_setaffinity(tid, [pin_cpu])
    sc.extra.update(main_cpu=main_cpu, pin_cpu=pin_cpu, pin_threads=pinners, main_tid=threading.get_native_id())
    if not pinners:
        sc.note("no pt_data_pin thread found (pin_memory off on --device cpu): the hogs share CPU 3 with nothing.")
    sc.note(f"every step trains on the first {tr.in_dim} of {tr.in_dim * WIDE} bytes per sample of a batch from 2 "
            "workers through the pin-memory thread; in the window three hogd share the pin-memory thread's CPU.")
    sc.standard_phases(fed_step, start, end)
finally:
    stop(hogs)
    it._shutdown_workers()
