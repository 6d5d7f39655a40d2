"""workers_quota: the loop is fed by DataLoader(num_workers=2, persistent_workers=True) whose workers
do moderate numpy work per batch (~3 ms: a gather, jitter, dark samples brightened; plus handing
the batch over through shared memory), well within what the GPU takes per step. For 10 s the
WORKERS (not the trainer) are in a fresh cgroup v2 child /sys/fs/cgroup/zoo_wquota whose cpu.max
is "10000 100000" (10 % of one CPU for both): the kernel throttles them, they are runnable but not run while their
CPUs stay idle, and the main thread waits for batches. For the recovery cpu.max is "max 100000" again.

Trainer on CPUs 2-3, workers on 4 and 5 (no CPU is shared). No culprit process: the quota. The
truth's `cgroup` says where, the quotas, the workers' own cgroups, and cpu.stat (nr_throttled,
throttled_usec) read just before the workers moved in and just after the window. At the end the
workers move back to the cgroups they came from and zoo_wquota is removed (and the cpu controller
disabled again in the parent if this script enabled it). Where cgroup v2 or its cpu controller
cannot be written, the notes say why and the phases still run (without a quota)."""

import os
from pathlib import Path

import numpy as np

from common import Scenario, Trainer

sc = Scenario("workers_quota", "cpu_throttled", "the DataLoader workers are moved into a cgroup v2 child with "
              "cpu.max 10 % for 10 s", job_cpus=[2, 3], culprit_cpus=[4, 5])
ROOT = Path("/sys/fs/cgroup")
CG = ROOT / "zoo_wquota"
QUOTA = {"window": "10000 100000", "recovery": "max 100000"}
cg: dict = {"path": str(CG), "parent": str(ROOT), "quota": QUOTA, "applied": False, "moves": "workers only"}
tr = Trainer(sc)
torch = tr.torch
POOL = 16384


class Jittered(torch.utils.data.Dataset):
    """Index b: the b-th batch of uint8 samples from a pool, jittered, dark samples brightened (~3 ms of numpy)."""

    def __init__(self, batch: int, dim: int) -> None:
        self.batch = batch
        rng = np.random.default_rng(0)
        self.pool = rng.integers(0, 256, (POOL, dim), dtype=np.uint8)
        self.jitter = rng.integers(0, 8, (batch, dim), dtype=np.uint8)

    def __len__(self) -> int:
        return 1 << 40

    def __getitem__(self, b: int):
        rows = self.pool[(b * self.batch + np.arange(self.batch)) % POOL]
        rows ^= self.jitter
        dark = rows[:, ::8].mean(axis=1, dtype=np.float32) < 120
        rows[dark] = np.minimum(rows[dark], 250) + 5
        x = torch.from_numpy(rows)
        return x, (x[:, 0] % 10).long()


def pin_worker(k: int) -> None:
    os.sched_setaffinity(0, [sc.culprit_cpus[k % len(sc.culprit_cpus)]])


def cgroup_of(pid: int) -> Path:
    """A process's cgroup v2 directory (the "0::" line of /proc/PID/cgroup)."""
    for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
        if line.startswith("0::"):
            return ROOT / line[3:].strip().lstrip("/")
    raise OSError(f"no cgroup v2 line in /proc/{pid}/cgroup")


def cpu_stat() -> dict[str, int]:
    """cpu.stat of zoo_wquota: usage_usec, nr_periods, nr_throttled, throttled_usec, ..."""
    return {k: int(v) for k, v in (line.split() for line in (CG / "cpu.stat").read_text().splitlines())}


def prepare(workers: list[int]) -> None:
    """Before the baseline: zoo_wquota under the cgroup v2 root (its cpu controller enabled there if needed), no
    limit yet, and where each worker is now."""
    if not (ROOT / "cgroup.controllers").exists():
        raise OSError(f"{ROOT} is not a cgroup v2 mount (no cgroup.controllers: cgroup v1 or hybrid)")
    if "cpu" not in (ROOT / "cgroup.controllers").read_text().split():
        raise OSError(f"the cpu controller is not available in {ROOT}")
    cg["origin"] = {str(pid): str(cgroup_of(pid)) for pid in workers}
    if "cpu" not in (ROOT / "cgroup.subtree_control").read_text().split():
        (ROOT / "cgroup.subtree_control").write_text("+cpu\n")
        cg["cpu_controller_enabled_here"] = True
    CG.mkdir(exist_ok=True)
    (CG / "cpu.max").write_text(QUOTA["recovery"] + "\n")
    cg["applied"] = True


def move_in(workers: list[int]) -> None:
    """At the window: the quota on, then the workers moved in (each with all its threads)."""
    (CG / "cpu.max").write_text(QUOTA["window"] + "\n")
    cg["cpu_stat_before"] = cpu_stat()
    for pid in workers:
        (CG / "cgroup.procs").write_text(f"{pid}\n")
    cg["workers_in"] = {str(pid): str(cgroup_of(pid)) for pid in workers}


def cleanup(workers: list[int]) -> None:
    """The workers back where they came from; zoo_wquota removed; +cpu undone if this script did it."""
    for pid in workers:
        try:
            if cgroup_of(pid) == CG:
                (Path(cg["origin"][str(pid)]) / "cgroup.procs").write_text(f"{pid}\n")
        except OSError:
            pass  # a worker already gone leaves no trace in the cgroup
    if CG.is_dir():
        CG.rmdir()
    if cg.get("cpu_controller_enabled_here"):
        try:
            (ROOT / "cgroup.subtree_control").write_text("-cpu\n")
        except OSError as exc:
            sc.note(f"cgroup: could not disable the cpu controller in {ROOT} again ({exc}).")


loader = torch.utils.data.DataLoader(Jittered(tr.batch, tr.in_dim), batch_size=None, num_workers=2,
                                     pin_memory=sc.cuda, prefetch_factor=2, persistent_workers=True,
                                     worker_init_fn=pin_worker)
it = iter(loader)
workers = [w.pid for w in it._workers]
sc.extra["cgroup"] = cg
try:
    try:
        prepare(workers)
    except OSError as exc:
        cg["error"] = f"{type(exc).__name__}: {exc}"
        sc.note(f"cgroup quota NOT applied ({cg['error']}): the phases ran without a quota.")
        print(f"[workers_quota] LOUD: no quota staged: {cg['error']}", flush=True)

    def fed_step() -> None:
        """A step on the next batch from the workers: uint8 to the GPU, made float there."""
        x, y = next(it)
        x = x.to(tr.dev, non_blocking=True).float().div_(255.0)
        tr.step(x, y.to(tr.dev, non_blocking=True))

    def start() -> None:
        if cg["applied"]:
            move_in(workers)

    def end() -> None:
        if cg["applied"]:
            (CG / "cpu.max").write_text(QUOTA["recovery"] + "\n")
            cg["cpu_stat_after"] = cpu_stat()
            before, after = cg["cpu_stat_before"], cg["cpu_stat_after"]
            cg["window_throttled"] = {k: after[k] - before.get(k, 0) for k in ("nr_periods", "nr_throttled",
                                                                             "throttled_usec") if k in after}

    for _ in range(20):
        fed_step()
    tr.sync()
    sc.extra["workers"] = workers
    sc.note(f"every step (all phases) trains on a {tr.batch}-sample uint8 batch from 2 workers (gather, jitter, dark "
            "samples brightened, in numpy); in the window the workers ran in "
            f"{CG} with cpu.max {QUOTA['window']!r} (the trainer stayed where it was), then {QUOTA['recovery']!r}."
            " Batches already queued when the window began (up to 4) were made without the quota.")
    sc.standard_phases(fed_step, start, end)
finally:
    if cg["applied"]:
        try:
            cleanup(workers)
        except OSError as exc:
            print(f"[workers_quota] LOUD: cleanup failed: {exc}", flush=True)
    it._shutdown_workers()
