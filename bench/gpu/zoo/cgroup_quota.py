"""cgroup_quota: the trainer moves itself into a fresh cgroup v2 child /sys/fs/cgroup/zoo_quota
whose cpu.max is "max 100000" (no limit) for the baseline, "10000 100000" (10 % of one CPU) for
10 s, and "max 100000" again for the recovery (CPUs 8-9).

In the window every thread of the trainer (the main thread, which also spins in the CUDA driver
while it waits for loss.item(), and PyTorch's own threads) shares 10 ms of CPU per 100 ms: the
kernel throttles the cgroup, the threads are runnable but not run while the CPUs stay idle. No
culprit process: the quota. The truth's `cgroup` says where, the quotas, and cpu.stat
(nr_throttled, throttled_usec) read just before and just after the window. At the end the
process moves back to the cgroup it came from and zoo_quota is removed (and the cpu controller
disabled again in the parent if this script enabled it). Where cgroup v2 or its cpu controller
cannot be written, the notes say why and the phases still run (without a quota)."""

import os
from pathlib import Path

from common import Scenario, Trainer

sc = Scenario("cgroup_quota", "cpu_throttled", "the trainer's own cgroup v2 gets cpu.max 10 % for 10 s",
              job_cpus=[8, 9])
ROOT = Path("/sys/fs/cgroup")
CG = ROOT / "zoo_quota"
QUOTA = {"baseline": "max 100000", "window": "10000 100000", "recovery": "max 100000"}
cg: dict = {"path": str(CG), "parent": str(ROOT), "quota": QUOTA, "applied": False}


def cpu_stat() -> dict[str, int]:
    """cpu.stat of zoo_quota: usage_usec, nr_periods, nr_throttled, throttled_usec, ..."""
    return {k: int(v) for k, v in (line.split() for line in (CG / "cpu.stat").read_text().splitlines())}


def own_cgroup() -> Path:
    """This process's cgroup v2 directory (the "0::" line of /proc/self/cgroup)."""
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        if line.startswith("0::"):
            return ROOT / line[3:].strip().lstrip("/")
    raise OSError("no cgroup v2 line in /proc/self/cgroup")


def enter() -> None:
    """Create zoo_quota under the cgroup v2 root (enabling its cpu controller there if needed) and move in."""
    if not (ROOT / "cgroup.controllers").exists():
        raise OSError(f"{ROOT} is not a cgroup v2 mount (no cgroup.controllers: cgroup v1 or hybrid)")
    if "cpu" not in (ROOT / "cgroup.controllers").read_text().split():
        raise OSError(f"the cpu controller is not available in {ROOT}")
    cg["origin"] = str(own_cgroup())
    if "cpu" not in (ROOT / "cgroup.subtree_control").read_text().split():
        (ROOT / "cgroup.subtree_control").write_text("+cpu\n")
        cg["cpu_controller_enabled_here"] = True
    CG.mkdir(exist_ok=True)
    (CG / "cpu.max").write_text(QUOTA["baseline"] + "\n")
    (CG / "cgroup.procs").write_text(f"{os.getpid()}\n")
    now_in = own_cgroup()
    if now_in != CG:
        raise OSError(f"moved into {CG}, but /proc/self/cgroup says {now_in}")
    cg["applied"] = True


def leave() -> None:
    """Back to the cgroup this process came from; remove zoo_quota; undo +cpu if this script did it."""
    if own_cgroup() == CG:
        (Path(cg.get("origin", ROOT)) / "cgroup.procs").write_text(f"{os.getpid()}\n")
    if CG.is_dir():
        CG.rmdir()
    if cg.get("cpu_controller_enabled_here"):
        try:
            (ROOT / "cgroup.subtree_control").write_text("-cpu\n")
        except OSError as exc:
            sc.note(f"cgroup: could not disable the cpu controller in {ROOT} again ({exc}).")


def set_quota(phase: str) -> None:
    if cg["applied"]:
        (CG / "cpu.max").write_text(QUOTA[phase] + "\n")


try:
    enter()
except OSError as exc:
    cg["error"] = f"{type(exc).__name__}: {exc}"
    sc.note(f"cgroup quota NOT applied ({cg['error']}): the phases ran without a quota.")
    print(f"[cgroup_quota] LOUD: no quota staged: {cg['error']}", flush=True)
sc.extra["cgroup"] = cg
try:
    tr = Trainer(sc)
    tr.warmup()

    def start() -> None:
        if cg["applied"]:
            cg["cpu_stat_before"] = cpu_stat()
        set_quota("window")

    def end() -> None:
        set_quota("recovery")
        if cg["applied"]:
            cg["cpu_stat_after"] = cpu_stat()
            before, after = cg["cpu_stat_before"], cg["cpu_stat_after"]
            cg["window_throttled"] = {k: after[k] - before.get(k, 0) for k in ("nr_periods", "nr_throttled",
                                                                             "throttled_usec") if k in after}

    if cg["applied"]:
        sc.note(f"the trainer ran in {CG} (cpu.max {QUOTA['baseline']!r}, window {QUOTA['window']!r}).")
    sc.standard_phases(tr.step, start, end)
finally:
    if cg["applied"]:
        try:
            leave()
        except OSError as exc:
            print(f"[cgroup_quota] LOUD: cleanup failed: {exc}", flush=True)
