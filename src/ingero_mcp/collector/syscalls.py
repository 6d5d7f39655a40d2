"""x86-64 system call numbers -> names, for the call a thread slept in (sched_intervals.syscall).

Only the calls a thread commonly blocks or waits in are named; any other number is stored as
'syscall_<n>' so nothing is lost, and -1 (not in a system call, or unknown) as NULL.
"""

from __future__ import annotations

import platform

X86_64: dict[int, str] = {
    0: "read", 1: "write", 7: "poll", 9: "mmap", 11: "munmap", 16: "ioctl", 17: "pread64", 19: "readv",
    23: "select", 24: "sched_yield", 26: "msync", 34: "pause", 35: "nanosleep", 42: "connect", 43: "accept",
    44: "sendto", 45: "recvfrom", 46: "sendmsg", 47: "recvmsg", 61: "wait4", 74: "fsync", 75: "fdatasync",
    202: "futex", 230: "clock_nanosleep", 232: "epoll_wait", 247: "waitid", 257: "openat", 270: "pselect6",
    271: "ppoll", 281: "epoll_pwait", 288: "accept4", 426: "io_uring_enter", 441: "epoll_pwait2",
    449: "futex_waitv", 18: "pwrite64", 20: "writev", 3: "close", 10: "mprotect", 28: "madvise", 40: "sendfile",
    56: "clone", 59: "execve", 72: "fcntl", 76: "truncate", 77: "ftruncate", 213: "epoll_create", 228: "clock_gettime",
    73: "flock",  # a file lock taken (DataLoader workers serialised around their reads)
    295: "preadv", 296: "pwritev", 299: "recvmmsg", 307: "sendmmsg", 327: "preadv2", 328: "pwritev2",
    435: "clone3", 319: "memfd_create", 285: "fallocate", 187: "readahead",
    2: "open", 82: "rename", 87: "unlink", 263: "unlinkat", 264: "renameat", 316: "renameat2",  # a file replaced
}


def syscall_name(nr: int) -> str | None:
    """The name of syscall `nr` on this machine's architecture (x86-64 table), None for -1."""
    if nr < 0:
        return None
    if platform.machine() not in ("x86_64", "AMD64"):
        return f"syscall_{nr}"
    return X86_64.get(nr, f"syscall_{nr}")
