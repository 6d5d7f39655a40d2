"""The collector's pure userspace pieces: the off-CPU split, syscall names, pinned ranges."""

from __future__ import annotations

import numpy as np

from ingero_mcp.collector import records as R
from ingero_mcp.collector.ops import OP_NAMES
from ingero_mcp.collector.pinned import PinnedRanges
from ingero_mcp.collector.syscalls import syscall_name


def test_split_is_null_only_when_the_wakeup_was_not_seen() -> None:
    state = np.array([1, 2, 2, 3, 4, 5], np.uint8)  # preempted, sleeping, sleeping (no wakeup), D, new, other
    off = np.array([100] * 6, np.int64)
    on = np.array([200] * 6, np.int64)
    wake = np.array([0, 130, 0, 190, 100, 150], np.int64)
    sleep, wait, known = R.sched_split(state, off, on, wake)
    assert known.tolist() == [True, True, False, True, True, True]
    assert sleep[known].tolist() == [0, 30, 90, 0, 50] and wait[known].tolist() == [100, 70, 10, 100, 50]
    assert (sleep + wait)[known].tolist() == [100] * 5


def test_syscall_names() -> None:
    assert [syscall_name(n) for n in (-1, 202, 230, 35, 16, 999)] == [None, "futex", "clock_nanosleep", "nanosleep",
                                                                        "ioctl", "syscall_999"]


def test_pinned_ranges_follow_allocs_registers_and_frees() -> None:
    op = {name: i for i, name in enumerate(OP_NAMES)}
    rows = [  # (op, ts, kind, host_ptr, bytes)
        ("cudaMemcpy", 1, 2, 0x1000, 8),          # before any range: not pinned
        ("cudaHostAlloc", 2, 0, 0x1000, 0x100),
        ("cudaMemcpy", 3, 2, 0x10ff, 8),          # inside [0x1000, 0x1100)
        ("cudaMemcpy", 4, 3, 0x1100, 8),          # just past it
        ("cudaMemcpy", 5, 4, 0x1000, 8),          # D2D: not a host copy -> NULL
        ("cudaFreeHost", 6, 0, 0x1000, 0),
        ("cuMemcpyHtoD_v2", 7, 2, 0x1010, 8),     # freed: not pinned
    ]
    ev = {
        "pid": np.array([7] * len(rows), np.uint32), "op": np.array([op[r[0]] for r in rows], np.uint16),
        "ret": np.zeros(len(rows), np.int32), "ts": np.array([r[1] for r in rows], np.uint64),
        "kind": np.array([r[2] for r in rows], np.uint8), "host_ptr": np.array([r[3] for r in rows], np.uint64),
        "bytes": np.array([r[4] for r in rows], np.uint64),
    }
    for complete, outside in ((True, False), (False, None)):
        got = PinnedRanges().annotate(ev["pid"], ev["op"], ev["ret"], ev["ts"], ev["kind"], ev["host_ptr"],
                                      np.ones(len(rows), bool), ev["bytes"], lambda _pid, c=complete: c).to_pylist()
        assert got == [outside, None, True, outside, None, None, outside], (complete, got)
