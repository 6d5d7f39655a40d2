"""memcg_high_throttle: the trainer moves itself into a fresh cgroup v2 child /sys/fs/cgroup/zoo_mem; for 10 s its
memory.high is set 24 MiB above what the cgroup uses when the window starts, and the window steps keep fresh 16 MiB
numpy buffers (written, so their pages are real), as many as slow a step to 3-10x the baseline's: the cgroup stays
over memory.high, and the kernel reclaims from it and throttles its tasks (mem_cgroup_handle_over_high: a penalty
sleep on the way back to user space) instead of the job running. memory.high is "max" before and after; the buffers
are dropped at the window's end. Trainer on CPUs 10-11; no culprit process: the limit. The truth's `cgroup` holds
the limit and memory.events' `high` count before and after the window. Where cgroup v2 or its memory controller
cannot be written, the notes say why and the phases still run (without a limit)."""

import os
import time
from pathlib import Path

import numpy as np

from common import Scenario, Trainer

sc = Scenario("memcg_high_throttle", "memory_throttled", "the trainer's own cgroup v2 gets memory.high just above "
              "its use for 10 s while each step keeps a fresh 32 MiB buffer", job_cpus=[10, 11])
ROOT = Path("/sys/fs/cgroup")
CG = ROOT / "zoo_mem"
cg: dict = {"path": str(CG), "parent": str(ROOT), "applied": False}
ring: list = []


def own_cgroup() -> Path:
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        if line.startswith("0::"):
            return ROOT / line[3:].strip().lstrip("/")
    raise OSError("no cgroup v2 line in /proc/self/cgroup")


def events() -> dict[str, int]:
    return {k: int(v) for k, v in (line.split() for line in (CG / "memory.events").read_text().splitlines())}


def enter() -> None:
    if "memory" not in (ROOT / "cgroup.controllers").read_text().split():
        raise OSError(f"the memory controller is not available in {ROOT}")
    cg["origin"] = str(own_cgroup())
    if "memory" not in (ROOT / "cgroup.subtree_control").read_text().split():
        (ROOT / "cgroup.subtree_control").write_text("+memory\n")
        cg["memory_controller_enabled_here"] = True
    CG.mkdir(exist_ok=True)
    (CG / "memory.high").write_text("max\n")
    (CG / "cgroup.procs").write_text(f"{os.getpid()}\n")
    if own_cgroup() != CG:
        raise OSError(f"moved into {CG}, but /proc/self/cgroup says {own_cgroup()}")
    cg["applied"] = True


def leave() -> None:
    if own_cgroup() == CG:
        (Path(cg.get("origin", ROOT)) / "cgroup.procs").write_text(f"{os.getpid()}\n")
    if CG.is_dir():
        CG.rmdir()
    if cg.get("memory_controller_enabled_here"):
        try:
            (ROOT / "cgroup.subtree_control").write_text("-memory\n")
        except OSError as exc:
            sc.note(f"cgroup: could not disable the memory controller in {ROOT} again ({exc}).")


try:
    enter()
except OSError as exc:
    cg["error"] = f"{type(exc).__name__}: {exc}"
    sc.note(f"no memory limit: {cg['error']}")
tr = Trainer(sc)
tr.warmup()


last = [0.0, 0.0]  # the previous window step's start, and the baseline's step time


def window_step() -> None:
    """Keep fresh 16 MiB buffers (every page written) above memory.high: one more while a step is still under 3x
    the baseline's, two fewer when one took over 10x (the kernel's throttle grows with the overage, steeply)."""
    t = time.monotonic()
    took = t - last[0] if last[0] else 0.0
    last[0] = t
    if took > 10 * last[1] and len(ring) > 2:
        del ring[:2]
    elif took < 3 * last[1] and len(ring) < 64:
        buf = np.empty(16 << 20, np.uint8)
        buf[::4096] = 1
        ring.append(buf)
    cg["max_kept_mib"] = max(cg.get("max_kept_mib", 0), 16 * len(ring))
    tr.step()


def start() -> None:
    last[1] = (sc.steps[-1] - sc.steps[-101]) / 1e9 / 100  # the baseline's step time, its last 100 steps
    if cg["applied"]:
        current = int((CG / "memory.current").read_text())
        cg["high_bytes"] = current + (24 << 20)  # a first try 64 MiB above, with 512 MiB kept, stalled the loop
        cg["current_at_start"] = current
        cg["events_before"] = events()
        (CG / "memory.high").write_text(f"{cg['high_bytes']}\n")
        print(f"[memcg_high_throttle] memory.current {current}, memory.high {cg['high_bytes']}", flush=True)


def end() -> None:
    if cg["applied"]:
        (CG / "memory.high").write_text("max\n")
        cg["events_after"] = events()
        cg["window_high_events"] = cg["events_after"].get("high", 0) - cg["events_before"].get("high", 0)
    ring.clear()


try:
    sc.extra["cgroup"] = cg
    sc.standard_phases(tr.step, start, end, window_step=window_step)
finally:
    try:
        leave()
    except OSError as exc:
        sc.note(f"cgroup: could not leave {CG} ({exc}).")
