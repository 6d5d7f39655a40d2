"""The layouts of the eBPF records (mirrors of the C structs) and their conversion to store batches.

Conversion is columnar: a numpy array of records becomes one Arrow table per flush, with op names,
memcpy kinds and states looked up by vectorised `take`, never per event.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ingero_mcp.collector.ops import MEMCPY_KINDS, OP_APIS, OP_NAMES

_HDR = [("_len", "<u4"), ("_pgoff", "<u4")]

CUDA_DTYPE = np.dtype(
    _HDR
    + [
        ("ts", "<u8"), ("dur", "<u8"), ("bytes", "<u8"), ("stream", "<u8"), ("handle", "<u8"), ("host_ptr", "<u8"),
        ("wait_ns", "<u8"), ("sleep_ns", "<u8"), ("pg_bytes", "<u8"),
        ("pid", "<u4"), ("tid", "<u4"), ("switches", "<u4"), ("pages", "<u4"),
        ("ret", "<i4"), ("op", "<u2"), ("kind", "u1"), ("flags", "u1"),
    ]
)
SCHED_DTYPE = np.dtype(
    _HDR
    + [
        ("off_ts", "<u8"), ("on_ts", "<u8"), ("wake_ts", "<u8"),
        ("pid", "<u4"), ("tid", "<u4"), ("preemptor_pid", "<u4"), ("preemptor_tid", "<u4"),
        ("cpu", "<u4"), ("on_cpu", "<u4"), ("holder_pid", "<u4"), ("holder_tid", "<u4"),
        ("waker_pid", "<u4"), ("waker_tid", "<u4"), ("syscall", "<i4"),
        ("preemptor_comm", "S16"), ("holder_comm", "S16"), ("waker_comm", "S16"),
        ("state", "u1"), ("waker_ctx", "u1"), ("flags", "u1"), ("_pad", "V1"), ("kstack", "<i4"), ("ustack", "<i4"),
        ("py", "<u8"),
    ]
)
SAMPLE_DTYPE = np.dtype(
    _HDR
    + [
        ("ts", "<u8"), ("py", "<u8"), ("pid", "<u4"), ("tid", "<u4"), ("cpu", "<u4"), ("kstack", "<i4"),
        ("ustack", "<i4"), ("_pad", "V4"),
    ]
)
PROC_DTYPE = np.dtype(
    _HDR
    + [
        ("ts", "<u8"), ("kind", "<u4"), ("pid", "<u4"), ("tid", "<u4"), ("child", "<u4"),
        ("exit_code", "<i4"), ("flags", "<u4"), ("comm", "S16"), ("filename", "S128"),
    ]
)
assert CUDA_DTYPE.itemsize == 104 and SCHED_DTYPE.itemsize == 144 and PROC_DTYPE.itemsize == 184
assert SAMPLE_DTYPE.itemsize == 48

# counters[] indices (C_* in ingero.bpf.c)
C_CUDA_SEEN, C_CUDA_DROP, C_CUDA_DEPTH, C_CUDA_ORPHAN = 0, 1, 2, 3
C_SCHED_SEEN, C_SCHED_DROP, C_PROC_SEEN, C_PROC_DROP = 4, 5, 6, 7
C_AGG_DROP_SWITCH, C_SWITCH_TOTAL, C_PAGE_TOTAL, C_TSTATE_FULL = 8, 9, 10, 11
C_WAKEUP_SEEN, C_AGG_DROP_PAGE, C_WAKE_IRQ, C_KSTACK_LOST = 12, 13, 14, 15
C_USTACK_LOST, C_SAMPLE_SEEN, C_SAMPLE_DROP = 16, 17, 18
N_COUNTERS = 19

F_BYTES, F_STREAM, F_HANDLE, F_HOSTPTR, F_NORET = 1, 2, 8, 16, 64
# P_* in ingero.bpf.c; P_TEXIT (a thread's exit) only ends a threads row, it is not a process event
PROC_KINDS: tuple[str | None, ...] = (None, "fork", "exec", "exit", "oom_kill", "thread", "rename", "thread_exit")
P_FORK, P_EXEC, P_EXIT, P_OOM, P_THREAD, P_RENAME, P_TEXIT = 1, 2, 3, 4, 5, 6, 7
# S_* in ingero.bpf.c
STATES: tuple[str | None, ...] = (None, "preempted", "sleeping", "uninterruptible", "new", "other")
S_PREEMPTED, S_NEW = 1, 4
WAKER_CONTEXTS: tuple[str | None, ...] = (None, "task", "irq", "softirq")
SF_PREEMPTOR_TGID = 1
AGG_NO_CPU = 0xFFFF
AGG_KINDS = {1: ("sched", "sched_switch"), 2: ("mm", "mm_page_alloc")}

_OP_NAMES = pa.array(OP_NAMES, pa.string())
_OP_APIS = pa.array(OP_APIS, pa.string())
_KINDS = pa.array(MEMCPY_KINDS, pa.string())
_STATES = pa.array(STATES, pa.string())
_WAKER_CONTEXTS = pa.array(WAKER_CONTEXTS, pa.string())
_PROC_KINDS = pa.array(PROC_KINDS, pa.string())


def comm_array(raw: np.ndarray) -> pa.Array:
    """Fixed-width C strings -> Arrow strings (invalid UTF-8 replaced)."""
    binary = pa.array(raw)
    try:
        return binary.cast(pa.string())
    except pa.ArrowInvalid:
        return pa.array([b.decode("utf-8", "replace") for b in raw.tolist()], pa.string())


def _names(codes: np.ndarray, names: pa.Array) -> pa.DictionaryArray:
    """Codes -> dictionary-encoded strings (no string copied per row; DuckDB reads them as VARCHAR).

    A code whose name is None (0: "not a copy", "unknown") becomes a null index, not a null in the
    dictionary, which Parquet and DuckDB read the same way everywhere.
    """
    codes = codes.astype(np.int32)
    if names.null_count:
        return pa.DictionaryArray.from_arrays(pa.array(codes, mask=~np.asarray(names.is_valid())[codes]),
                                              names.fill_null(""))
    return pa.DictionaryArray.from_arrays(pa.array(codes), names)


def _masked(values: np.ndarray, valid: np.ndarray, typ: pa.DataType) -> pa.Array:
    # the common batches are all-valid or all-null columns (a launch has a handle and no host
    # pointer): no mask to build and apply then
    if not valid.any():
        return pa.nulls(len(values), typ)
    if valid.all():
        return pa.array(np.ascontiguousarray(values), typ)
    return pa.array(values, typ, mask=~valid)


def cuda_table(ev: np.ndarray, offset_ns: int) -> pa.Table:
    """cuda_calls rows from CUDA call records."""
    op = ev["op"]
    has_bytes = (ev["flags"] & F_BYTES) != 0
    has_stream = (ev["flags"] & F_STREAM) != 0
    pre = ev["wait_ns"].astype(np.int64)
    blk = ev["sleep_ns"].astype(np.int64)
    seen_end = (ev["flags"] & F_NORET) == 0  # entry-only launches: no end, no split (NULL, not 0)
    return pa.table(
        {
            "ts_ns": pa.array(ev["ts"].astype(np.int64) + offset_ns, pa.int64()),
            "duration_ns": _masked(ev["dur"].astype(np.int64), seen_end, pa.int64()),
            "pid": pa.array(ev["pid"].astype(np.int32), pa.int32()),
            "tid": pa.array(ev["tid"].astype(np.int32), pa.int32()),
            "api": _names(op, _OP_APIS),
            "op": _names(op, _OP_NAMES),
            "bytes": _masked(ev["bytes"].astype(np.int64), has_bytes, pa.int64()),
            "memcpy_kind": _names(ev["kind"], _KINDS),
            "stream": _masked(ev["stream"], has_stream, pa.uint64()),
            "return_code": _masked(ev["ret"].astype(np.int32), seen_end, pa.int32()),
            "off_cpu_ns": _masked(pre + blk, seen_end, pa.int64()),
            "cpu_wait_ns": _masked(pre, seen_end, pa.int64()),
            "sleep_ns": _masked(blk, seen_end, pa.int64()),
            "context_switches": _masked(ev["switches"].astype(np.int32), seen_end, pa.int32()),
            "page_allocs": _masked(ev["pages"].astype(np.int32), seen_end, pa.int32()),
            "page_alloc_bytes": _masked(ev["pg_bytes"].astype(np.int64), seen_end, pa.int64()),
            "kernel_handle": _masked(ev["handle"], (ev["flags"] & F_HANDLE) != 0, pa.uint64()),
            "host_ptr": _masked(ev["host_ptr"], (ev["flags"] & F_HOSTPTR) != 0, pa.uint64()),
        }
    )


def sched_split(state: np.ndarray, off: np.ndarray, on: np.ndarray,
                wake: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(sleep_ns, cpu_wait_ns, known) of intervals, as schemas/v2.sql defines them.

    Preempted or new: no sleep, waiting for a CPU from off_ns (new: the creation). Otherwise asleep
    until the wakeup, then waiting; a wakeup not seen leaves both unknown (known False: NULL).
    """
    runnable = (state == S_PREEMPTED) | (state == S_NEW)
    woke = (wake != 0) & ~runnable
    sleep = np.where(runnable, 0, wake - off)
    wait = np.where(runnable, on - off, on - wake)
    return sleep, wait, runnable | woke


def syscall_names(nr: np.ndarray) -> pa.Array:
    """x86-64 syscall numbers -> names ('syscall_<n>' for the rare ones), -1 -> NULL."""
    from ingero_mcp.collector.syscalls import syscall_name

    uniq, inv = np.unique(nr.astype(np.int64), return_inverse=True)
    names = pa.array([syscall_name(int(n)) for n in uniq.tolist()], pa.string())
    return names.take(pa.array(inv.reshape(-1).astype(np.int32)))


def sched_table(ev: np.ndarray, offset_ns: int, kstack_id: pa.Array | None = None,
                ustack_id: pa.Array | None = None) -> pa.Table:
    """sched_intervals rows from switch-out/switch-in records of traced threads (kstack_id, ustack_id: the stacks'
    stable ids, collector/kstacks.py and ustacks.py; NULL without)."""
    off = ev["off_ts"].astype(np.int64)
    on = ev["on_ts"].astype(np.int64)
    wake = ev["wake_ts"].astype(np.int64)
    state = ev["state"]
    sleep, wait, known = sched_split(state, off, on, wake)
    is_new = state == S_NEW
    has_waker = ev["waker_ctx"] != 0
    # first holder: the tid always; preemptor_pid is its tgid when it was seen leaving that CPU
    # before this thread came back (flags), else its tid (as v1 recorded it)
    return pa.table(
        {
            "pid": pa.array(ev["pid"].astype(np.int32), pa.int32()),
            "tid": pa.array(ev["tid"].astype(np.int32), pa.int32()),
            "off_ns": pa.array(off + offset_ns, pa.int64()),
            "on_ns": pa.array(on + offset_ns, pa.int64()),
            "off_cpu_ns": pa.array(on - off, pa.int64()),
            "prev_state": _names(state, _STATES),
            "preemptor_pid": _masked(ev["preemptor_pid"].astype(np.int32), ~is_new, pa.int32()),
            "preemptor_comm": pc.if_else(pa.array(is_new), pa.scalar(None, pa.string()),
                                         comm_array(ev["preemptor_comm"])),
            "cpu": pa.array(ev["cpu"].astype(np.int32), pa.int32()),
            "wakeup_ns": _masked(wake + offset_ns, wake != 0, pa.int64()),
            "sleep_ns": _masked(sleep, known, pa.int64()),
            "cpu_wait_ns": _masked(wait, known, pa.int64()),
            "preemptor_tid": _masked(ev["preemptor_tid"].astype(np.int32), ~is_new, pa.int32()),
            "on_cpu": pa.array(ev["on_cpu"].astype(np.int32), pa.int32()),
            "last_holder_pid": pa.array(ev["holder_pid"].astype(np.int32), pa.int32()),
            "last_holder_tid": pa.array(ev["holder_tid"].astype(np.int32), pa.int32()),
            "last_holder_comm": comm_array(ev["holder_comm"]),
            "waker_pid": _masked(ev["waker_pid"].astype(np.int32), has_waker, pa.int32()),
            "waker_tid": _masked(ev["waker_tid"].astype(np.int32), has_waker, pa.int32()),
            "waker_comm": pc.if_else(pa.array(has_waker), comm_array(ev["waker_comm"]), pa.scalar(None, pa.string())),
            "waker_context": _names(ev["waker_ctx"], _WAKER_CONTEXTS),
            "syscall": syscall_names(ev["syscall"]),
            "kstack_id": kstack_id if kstack_id is not None else pa.nulls(len(ev), pa.int64()),
            "ustack_id": ustack_id if ustack_id is not None else pa.nulls(len(ev), pa.int64()),
        }
    )


def sample_table(ev: np.ndarray, offset_ns: int, kstack_id: pa.Array, ustack_id: pa.Array) -> pa.Table:
    """stack_samples rows from on-CPU sample records (the stacks' stable ids already resolved)."""
    return pa.table(
        {
            "ts_ns": pa.array(ev["ts"].astype(np.int64) + offset_ns, pa.int64()),
            "pid": pa.array(ev["pid"].astype(np.int32), pa.int32()),
            "tid": pa.array(ev["tid"].astype(np.int32), pa.int32()),
            "cpu": pa.array(ev["cpu"].astype(np.int32), pa.int32()),
            "kstack_id": kstack_id,
            "ustack_id": ustack_id,
        }
    )


def proc_table(ev: np.ndarray, offset_ns: int) -> pa.Table:
    """process_events rows from fork/exec/exit/oom records."""
    kind = ev["kind"]
    is_fork = kind == P_FORK
    is_exit = kind == P_EXIT
    exit_valid = is_exit & ((ev["flags"] & 1) != 0)
    filenames = comm_array(ev["filename"])
    return pa.table(
        {
            "ts_ns": pa.array(ev["ts"].astype(np.int64) + offset_ns, pa.int64()),
            "event": pc.take(_PROC_KINDS, pa.array(kind.astype(np.int32))),
            "pid": pa.array(ev["pid"].astype(np.int32), pa.int32()),
            "tid": pa.array(ev["tid"].astype(np.int32), pa.int32()),
            "child_pid": _masked(ev["child"].astype(np.int32), is_fork, pa.int32()),
            "comm": comm_array(ev["comm"]),
            "filename": pc.if_else(pa.array(kind == P_EXEC), filenames, pa.scalar(None, pa.string())),
            "exit_code": _masked(ev["exit_code"], exit_valid, pa.int32()),
            "old_comm": pc.if_else(pa.array(kind == P_RENAME), filenames, pa.scalar(None, pa.string())),
        }
    )
