"""Uprobes as BPF links (BPF_TRACE_UPROBE_MULTI, kernel >= 6.6) instead of perf events, where the kernel has them.

BCC 0.26 attaches a uprobe as a perf event (the uprobe PMU); closing one waits out a tracepoint grace period under
the kernel's event_mutex, so detaches run one after another: ~120 ms each on the 2-core VM, ~4 s to stop a
collector with 20 symbols probed, and the calibration's and the governor's detaches pay the same. Closing a
uprobe_multi link waits for the uprobes' own grace period, outside that mutex (16-64 ms each there). A hit costs
the same either way (the trap dominates). Raw bpf(2) calls through ctypes: BCC has no API for either.
"""

from __future__ import annotations

import ctypes as ct
import errno
import os
import tempfile

SYS_BPF = {"x86_64": 321, "aarch64": 280}.get(os.uname().machine)  # elsewhere: not tried, perf events
BPF_PROG_LOAD = 5
BPF_LINK_CREATE = 28
BPF_PROG_TYPE_KPROBE = 2
BPF_TRACE_UPROBE_MULTI = 48  # enum bpf_attach_type, checked against the kernel's BTF
BPF_F_UPROBE_MULTI_RETURN = 1
ATTR_SIZE = 128  # bytes of union bpf_attr passed (the rest zero; the kernel's union is larger)

_libc = ct.CDLL(None, use_errno=True)
_libc.syscall.restype = ct.c_long


def _bpf(cmd: int, attr: ct.Array) -> int:
    if SYS_BPF is None:
        raise OSError(errno.ENOSYS, f"bpf(2) number unknown on {os.uname().machine}")
    fd = _libc.syscall(SYS_BPF, cmd, attr, ATTR_SIZE)
    if fd < 0:
        err = ct.get_errno()
        raise OSError(err, os.strerror(err))
    return int(fd)


def _put(attr: ct.Array, offset: int, ctype: type, value: int) -> None:
    ct.memmove(ct.addressof(attr) + offset, ct.byref(ctype(value)), ct.sizeof(ctype))


def prog_load(name: bytes, insns: bytes, license: bytes, attach_type: int = BPF_TRACE_UPROBE_MULTI) -> int:
    """Load kprobe-type instructions with an expected attach type (what bcc_prog_load cannot pass); the fd."""
    attr = ct.create_string_buffer(ATTR_SIZE)
    code = ct.create_string_buffer(insns, len(insns))
    lic = ct.create_string_buffer(license)
    _put(attr, 0, ct.c_uint32, BPF_PROG_TYPE_KPROBE)
    _put(attr, 4, ct.c_uint32, len(insns) // 8)
    _put(attr, 8, ct.c_uint64, ct.addressof(code))
    _put(attr, 16, ct.c_uint64, ct.addressof(lic))
    ct.memmove(ct.addressof(attr) + 48, name[:15], len(name[:15]))  # prog_name
    _put(attr, 68, ct.c_uint32, attach_type)
    return _bpf(BPF_PROG_LOAD, attr)


def link_uprobe(prog_fd: int, path: bytes, offset: int, *, ret: bool = False, pid: int = -1) -> int:
    """A uprobe (ret: uretprobe) at a file offset as a BPF link, for one process (pid > 0) or all; the link's fd.
    Closing it detaches the probe."""
    attr = ct.create_string_buffer(ATTR_SIZE)
    path_buf = ct.create_string_buffer(path)
    offsets = (ct.c_uint64 * 1)(offset)
    _put(attr, 0, ct.c_uint32, prog_fd)
    _put(attr, 8, ct.c_uint32, BPF_TRACE_UPROBE_MULTI)
    _put(attr, 16, ct.c_uint64, ct.addressof(path_buf))  # uprobe_multi.path
    _put(attr, 24, ct.c_uint64, ct.addressof(offsets))  # .offsets
    _put(attr, 48, ct.c_uint32, 1)  # .cnt
    _put(attr, 52, ct.c_uint32, BPF_F_UPROBE_MULTI_RETURN if ret else 0)  # .flags
    _put(attr, 56, ct.c_uint32, max(pid, 0))  # .pid: 0 is every process
    return _bpf(BPF_LINK_CREATE, attr)


def supported() -> tuple[bool, str]:
    """Whether this kernel attaches uprobe_multi links, tried for real on a file no process maps: (yes, why not)."""
    exit0 = bytes.fromhex("b700000000000000" "9500000000000000")  # r0 = 0; exit
    try:
        prog = prog_load(b"ingero_probe", exit0, b"GPL")
    except OSError as exc:
        return False, f"loading a uprobe_multi program: {exc.strerror}"
    try:
        with tempfile.NamedTemporaryFile(prefix="ingero-uprobe-") as target:
            target.write(b"\x90" * 4096)
            target.flush()
            try:
                os.close(link_uprobe(prog, target.name.encode(), 0))
            except OSError as exc:
                absent = exc.errno in (errno.EINVAL, errno.EOPNOTSUPP, errno.ENOSYS)
                why = "not in this kernel" if absent else exc.strerror
                return False, f"uprobe_multi links: {why}"
    finally:
        os.close(prog)
    return True, ""
