"""workers_oversub: the job has 2 CPUs (2-3); for 10 s it is fed by a DataLoader with 8 workers
whose per-sample __getitem__ does CPU-heavy numpy work.

Phase A trains from GPU-resident batches. Phase B trains the same model on batches from
DataLoader(num_workers=8): the workers (forked children, named by PyTorch) and the main thread
compete for the same 2 CPUs, so the main thread waits for a CPU behind its own workers (and for
batches). Culprits: the worker processes."""

import numpy as np

from common import Scenario, Trainer, comm_of, tids_of

sc = Scenario("workers_oversub", "own_workers_cpu",
              "8 DataLoader workers doing numpy work per sample on the job's 2 CPUs",
              job_cpus=[2, 3], culprit_cpus=[2, 3])
tr = Trainer(sc)
tr.warmup()
torch = tr.torch
BATCH = 1024 if sc.cuda else 64


class Heavy(torch.utils.data.Dataset):
    """Each sample: a few small numpy matrix ops on a 64x64 block (~0.1 ms of CPU)."""

    def __len__(self) -> int:
        return 10_000_000

    def __getitem__(self, i: int):
        rng = np.random.default_rng(i)
        m = rng.standard_normal((64, 64), dtype=np.float32)
        for _ in range(3):
            m = np.tanh(m @ m.T * 0.01)
        x = np.resize(m.ravel(), tr.in_dim)
        return torch.from_numpy(x), int(i % 10)


state: dict = {}


def start() -> None:
    loader = torch.utils.data.DataLoader(Heavy(), batch_size=BATCH, num_workers=8, shuffle=False,
                                         persistent_workers=False, prefetch_factor=2)
    state["it"] = iter(loader)
    state["workers"] = [w.pid for w in state["it"]._workers]


def window_step() -> None:
    x, y = next(state["it"])
    tr.step(x, y)


def end() -> None:
    for pid in state.get("workers", []):
        sc.add_culprit(pid, tids_of(pid), comm_of(pid))
    it = state.pop("it", None)
    if it is not None:
        it._shutdown_workers()


sc.note(f"phase B batches: {BATCH} samples built by 8 workers (phase A: {tr.batch}-sample batches on the device); "
        "steps/s compare steps, not samples.")
sc.standard_phases(tr.step, start, end, window_step)
