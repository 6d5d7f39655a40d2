"""Hardware and software counters for every thread of this process over one timed block (perf_event_open
through ctypes: the GPU host has no `perf`). Cycles over task-clock is the clock the threads ran at, instructions
over cycles their IPC: whether a slow block ran at a lower clock, ran more instructions, or stalled more.
Counters the VM does not expose come back as None."""

from __future__ import annotations

import ctypes
import os
import struct

_SYS_PERF_EVENT_OPEN = 298  # x86_64
_HW, _SW = 0, 1
_EXCLUDE_KERNEL, _EXCLUDE_HV = 1 << 5, 1 << 6
# name: (type, config, flags)
COUNTERS: dict[str, tuple[int, int, int]] = {
    "cycles": (_HW, 0, _EXCLUDE_HV),
    "instructions": (_HW, 1, _EXCLUDE_HV),
    "instructions_user": (_HW, 1, _EXCLUDE_HV | _EXCLUDE_KERNEL),
    "cache_misses": (_HW, 3, _EXCLUDE_HV),
    "branch_misses": (_HW, 5, _EXCLUDE_HV),
    "task_clock_ns": (_SW, 1, 0),
    "context_switches": (_SW, 3, 0),
    "cpu_migrations": (_SW, 4, 0),
}
_libc = ctypes.CDLL(None, use_errno=True)


def _attr(kind: int, config: int, flags: int) -> bytes:
    """perf_event_attr, its first version (64 bytes): type, size, config, period, sample_type, read_format,
    flags, ..."""
    return struct.pack("IIQQQQQIIQ", kind, 64, config, 0, 0, 0, flags, 0, 0, 0)


class Counters:
    """Counting from construction: open one counter of each kind on every thread now in this process."""

    def __init__(self) -> None:
        self.fds: dict[str, list[int]] = {}
        for name, (kind, config, flags) in COUNTERS.items():
            buf = ctypes.create_string_buffer(_attr(kind, config, flags), 64)
            fds = []
            for tid in os.listdir("/proc/self/task"):
                fd = _libc.syscall(_SYS_PERF_EVENT_OPEN, buf, int(tid), -1, -1, 0)
                if fd >= 0:
                    fds.append(fd)
            self.fds[name] = fds

    def read(self) -> dict[str, int | None]:
        """Each counter summed over the threads, then closed (None: not available here)."""
        out: dict[str, int | None] = {}
        for name, fds in self.fds.items():
            out[name] = sum(struct.unpack("Q", os.read(fd, 8))[0] for fd in fds) if fds else None
            for fd in fds:
                os.close(fd)
        self.fds = {}
        return out
