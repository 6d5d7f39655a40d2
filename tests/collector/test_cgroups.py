"""Finding the cgroup hierarchy that carries the cpu controller, and reading a cgroup's quota and throttling."""

from __future__ import annotations

import os
from pathlib import Path

from ingero_mcp.collector.cgroups import CgroupSampler, CpuController, cgroup_of, find_cpu_controller, read_cpu

V1_MOUNTS = """tmpfs /sys/fs/cgroup tmpfs rw,relatime,mode=755 0 0
cgroup /sys/fs/cgroup/cpu,cpuacct cgroup rw,nosuid,nodev,noexec,relatime,cpu,cpuacct 0 0
cgroup2 /sys/fs/cgroup/unified cgroup2 rw,relatime 0 0
"""


def test_the_v1_cpu_hierarchy_is_preferred_where_mounted() -> None:
    ctl = find_cpu_controller(V1_MOUNTS)
    assert ctl == CpuController(root=Path("/sys/fs/cgroup/cpu,cpuacct"), v2=False,
                                cpuacct=Path("/sys/fs/cgroup/cpu,cpuacct"))


def test_no_cpu_controller_means_no_rows() -> None:
    assert find_cpu_controller("proc /proc proc rw 0 0\n") is None
    assert CgroupSampler(None, find=False).sample(1, [os.getpid()])["pid"] == []


def test_a_v2_cgroup_is_read_from_its_files(tmp_path: Path) -> None:
    """cpu.max 'QUOTA PERIOD' or 'max PERIOD'; cpu.stat's counters as they are."""
    ctl = CpuController(root=tmp_path, v2=True)
    job = tmp_path / "job"
    job.mkdir()
    (job / "cpu.max").write_text("10000 100000\n")
    (job / "cpu.stat").write_text("usage_usec 5000\nnr_periods 40\nnr_throttled 36\nthrottled_usec 3200000\n")
    (tmp_path / "cpu.max").write_text("max 100000\n")
    assert read_cpu(ctl, "/job") == {"quota_us": 10000, "period_us": 100000, "usage_usec": 5000, "nr_periods": 40,
                                     "nr_throttled": 36, "throttled_usec": 3200000}
    assert read_cpu(ctl, "/")["quota_us"] is None
    assert read_cpu(ctl, "/gone") is None


def test_this_process_has_a_cgroup_where_the_machine_has_the_controller() -> None:
    ctl = find_cpu_controller()
    if ctl is None:  # the fact under test is then that nothing is read, not that something is
        assert CgroupSampler().sample(1, [os.getpid()])["pid"] == []
        return
    own = cgroup_of(os.getpid(), ctl)
    assert own is not None and own.startswith("/")
    rows = CgroupSampler(ctl).sample(7, [os.getpid()])
    assert (rows["pid"][0] == os.getpid() and rows["own"][0] is True and rows["cgroup"][0] == own
            and rows["ts_ns"] == [7] * len(rows["pid"]))
