"""The CPU controller of each traced process's cgroup, once a second: its quota and how long it was throttled.

A thread held off the CPU by its cgroup's CPU quota looks, to the scheduler records, like one waiting
behind other tasks; cpu.stat's throttling counters tell the two apart. cgroup v2 (`cpu.max`, `cpu.stat`)
and the v1 cpu controller (`cpu.cfs_quota_us`, `cpu.cfs_period_us`, `cpu.stat`, cpuacct's usage) are read
alike, for the process's own cgroup and every ancestor that sets a quota (an ancestor's quota throttles it too).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

COLUMNS = ("ts_ns", "pid", "cgroup", "own", "quota_us", "period_us", "usage_usec", "nr_periods", "nr_throttled",
           "throttled_usec")


@dataclass(frozen=True)
class CpuController:
    """Where a cgroup hierarchy with the cpu controller is mounted, and which version it is."""

    root: Path
    v2: bool
    cpuacct: Path | None = None  # v1: the cpuacct hierarchy, for usage (often the same mount as cpu)


def find_cpu_controller(mounts: str | None = None) -> CpuController | None:
    """The cgroup hierarchy that carries the cpu controller (v1 'cpu' preferred where mounted, else v2 with cpu)."""
    if mounts is None:
        try:
            mounts = Path("/proc/self/mounts").read_text()
        except OSError:
            return None
    v1_cpu = v1_acct = v2 = None
    for line in mounts.splitlines():
        parts = line.split()
        if len(parts) < 4:
            continue
        point, fstype, options = Path(parts[1]), parts[2], set(parts[3].split(","))
        if fstype == "cgroup" and "cpu" in options:
            v1_cpu = point
        if fstype == "cgroup" and "cpuacct" in options:
            v1_acct = point
        if fstype == "cgroup2":
            v2 = point
    if v1_cpu is not None:
        return CpuController(root=v1_cpu, v2=False, cpuacct=v1_acct)
    if v2 is not None and "cpu" in _read(v2 / "cgroup.controllers").split():
        return CpuController(root=v2, v2=True)
    return None


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""


def _stat(text: str) -> dict[str, int]:
    out = {}
    for line in text.splitlines():
        key, _, value = line.partition(" ")
        if value.strip().lstrip("-").isdigit():
            out[key] = int(value)
    return out


def cgroup_of(pid: int, ctl: CpuController) -> str | None:
    """The path of a process's cgroup in the controller's hierarchy ('/...'), from /proc/PID/cgroup."""
    for line in _read(Path(f"/proc/{pid}/cgroup")).splitlines():
        ident, _, rest = line.partition(":")
        names, _, path = rest.partition(":")
        if ctl.v2 and ident == "0" and names == "":
            return path or "/"
        if not ctl.v2 and "cpu" in names.split(","):
            return path or "/"
    return None


def read_cpu(ctl: CpuController, cgroup: str) -> dict[str, Any] | None:
    """quota, period, usage and throttling of one cgroup (None: it is gone or has no cpu files)."""
    folder = ctl.root / cgroup.lstrip("/")
    stat = _stat(_read(folder / "cpu.stat"))
    if ctl.v2:
        max_text = _read(folder / "cpu.max").split()
        if not stat and not max_text:
            return None
        quota = int(max_text[0]) if max_text and max_text[0].isdigit() else None
        period = int(max_text[1]) if len(max_text) > 1 and max_text[1].isdigit() else None
        return {"quota_us": quota, "period_us": period, "usage_usec": stat.get("usage_usec"),
                "nr_periods": stat.get("nr_periods"), "nr_throttled": stat.get("nr_throttled"),
                "throttled_usec": stat.get("throttled_usec")}
    quota_text, period_text = _read(folder / "cpu.cfs_quota_us").strip(), _read(folder / "cpu.cfs_period_us").strip()
    if not stat and not quota_text:
        return None
    quota = int(quota_text) if quota_text.lstrip("-").isdigit() and int(quota_text) > 0 else None
    usage = None
    if ctl.cpuacct is not None:
        raw = _read(ctl.cpuacct / cgroup.lstrip("/") / "cpuacct.usage").strip()
        usage = int(raw) // 1000 if raw.isdigit() else None
    throttled = stat.get("throttled_time")
    return {"quota_us": quota, "period_us": int(period_text) if period_text.isdigit() else None, "usage_usec": usage,
            "nr_periods": stat.get("nr_periods"), "nr_throttled": stat.get("nr_throttled"),
            "throttled_usec": None if throttled is None else throttled // 1000}


def _ancestors(cgroup: str) -> list[str]:
    parts = [p for p in cgroup.split("/") if p]
    return ["/" + "/".join(parts[:i]) for i in range(len(parts) - 1, -1, -1)]


class CgroupSampler:
    """cgroup_samples rows for a set of processes at one moment."""

    def __init__(self, ctl: CpuController | None = None, *, find: bool = True) -> None:
        self.ctl = ctl if ctl is not None or not find else find_cpu_controller()

    def sample(self, ts_ns: int, pids: list[int]) -> dict[str, list[Any]]:
        """One row per (process, cgroup): its own cgroup, and each ancestor with a quota."""
        rows: dict[str, list[Any]] = {c: [] for c in COLUMNS}
        if self.ctl is None:
            return rows
        cache: dict[str, dict[str, Any] | None] = {}

        def cpu(cgroup: str) -> dict[str, Any] | None:
            if cgroup not in cache:
                cache[cgroup] = read_cpu(self.ctl, cgroup)  # type: ignore[arg-type]
            return cache[cgroup]

        for pid in pids:
            own = cgroup_of(pid, self.ctl)
            if own is None:
                continue
            for path, is_own in [(own, True)] + [(a, False) for a in _ancestors(own)]:
                got = cpu(path)
                if got is None or (not is_own and got["quota_us"] is None):
                    continue
                for key, value in (("ts_ns", ts_ns), ("pid", pid), ("cgroup", path), ("own", is_own), *got.items()):
                    rows[key].append(value)
        return rows
