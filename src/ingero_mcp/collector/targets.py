"""The process registry of one recording: which processes are traced, and their threads.

The kernel's `traced` map decides whose CUDA calls and off-CPU intervals are recorded; this side remembers those
processes and threads for the `processes` and `threads` tables, follows them through forks, execs and exits (the
process events), and says when every process named with --pid has exited.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from ingero_mcp.collector import records as R
from ingero_mcp.collector.discovery import alive, read_cmdline, read_stat
from ingero_mcp.collector.pinned import PinnedRanges

THREAD_COLUMNS = ("pid", "tid", "comm", "first_seen_ns", "last_seen_ns", "exit_ns")
PROC_COLUMNS = ("pid", "ppid", "comm", "cmdline", "first_seen_ns", "last_seen_ns", "exit_ns", "exit_code", "traced")
THREAD_SCHEMA = pa.schema([
    ("pid", pa.int32()), ("tid", pa.int32()), ("comm", pa.string()), ("first_seen_ns", pa.int64()),
    ("last_seen_ns", pa.int64()), ("exit_ns", pa.int64()),
])
PROC_SCHEMA = pa.schema([
    ("pid", pa.int32()), ("ppid", pa.int32()), ("comm", pa.string()), ("cmdline", pa.string()),
    ("first_seen_ns", pa.int64()), ("last_seen_ns", pa.int64()), ("exit_ns", pa.int64()), ("exit_code", pa.int32()),
    ("traced", pa.bool_()),
])


class Targets:
    """Traced processes and their threads: the rows of `processes` and `threads`, kept as they change."""

    def __init__(self, trace_all: bool) -> None:
        self.trace_all = trace_all  # no --pid: every process that uses CUDA is traced
        self.traced_map: Any = None  # the kernel's set of traced pids, once the program is loaded
        self.procs: dict[int, dict[str, Any]] = {}
        self.live_targets: set[int] = set()
        self.threads: dict[int, dict[str, Any]] = {}  # tid -> threads row (threads of traced processes)
        self.threads_dirty = False
        self.pinned = PinnedRanges()
        self.pin_complete: dict[int, bool] = {}  # pid -> every pinned range it made can have been seen
        self.procs_dirty = True
        self.on_traced: Callable[[int], None] | None = None  # told of each process when it is first traced

    def trace(self, pid: int, *, target: bool) -> None:
        """Mark a process traced in the kernel and remember it."""
        self.traced_map[self.traced_map.Key(pid)] = self.traced_map.Leaf(1)
        if target:
            self.live_targets.add(pid)
        self.note_proc(pid, traced=True)

    def note_proc(self, pid: int, **fields: Any) -> dict[str, Any]:
        """A process's row, made from /proc when first seen; `fields` that are not None update it."""
        rec = self.procs.get(pid)
        if rec is None:
            rec = {"pid": pid, "ppid": None, "comm": None, "cmdline": None, "first_seen_ns": time.time_ns(),
                   "last_seen_ns": None, "exit_ns": None, "exit_code": None, "traced": False}
            st = read_stat(pid)
            if st is not None:
                rec["comm"], rec["ppid"] = st
            self.procs[pid] = rec
        for key, value in fields.items():
            if value is not None:
                rec[key] = value
        if rec["traced"] and rec["cmdline"] is None and rec["exit_ns"] is None:
            rec["cmdline"] = read_cmdline(pid)
        if rec["traced"] and pid not in self.pin_complete:
            self.pin_complete[pid] = _no_gpu_context(pid)
            self.seed_threads(pid)
            if self.on_traced is not None:
                self.on_traced(pid)
        self.procs_dirty = True
        return rec

    def seed_threads(self, pid: int) -> None:
        """The threads a traced process has now, with their names (/proc/<pid>/task/*/comm)."""
        now = time.time_ns()
        try:
            tids = [int(t) for t in os.listdir(f"/proc/{pid}/task")]
        except (OSError, ValueError):
            return
        for tid in tids:
            try:
                comm = Path(f"/proc/{pid}/task/{tid}/comm").read_text().rstrip("\n")
            except OSError:
                continue
            self.note_thread(pid, tid, now, comm=comm)

    def note_thread(self, pid: int, tid: int, ts: int, *, comm: str | None = None, exit_ns: int | None = None,
                    until: int | None = None) -> None:
        """A thread's row, seen at `ts` (to `until`): widened to cover it, its name or exit set when given."""
        rec = self.threads.get(tid)
        if rec is None or rec["pid"] != pid:
            rec = {"pid": pid, "tid": tid, "comm": None, "first_seen_ns": ts, "last_seen_ns": ts, "exit_ns": None}
            self.threads[tid] = rec
        rec["first_seen_ns"] = min(rec["first_seen_ns"], ts)
        rec["last_seen_ns"] = max(rec["last_seen_ns"], until or ts)
        if comm is not None:
            rec["comm"] = comm
        if exit_ns is not None:
            rec["exit_ns"] = exit_ns
        self.threads_dirty = True

    def pins_seen(self, pid: int) -> bool:
        """Every pinned range this process made can have been seen (PinnedRanges.annotate asks)."""
        return self.pin_complete.get(pid, False)

    def is_traced(self, pid: int) -> bool:
        """A process known and traced."""
        return bool(self.procs.get(pid, {}).get("traced"))

    def traced_alive(self) -> list[int]:
        """Traced processes not seen to exit (the sampler thread reads this: a copy of the keys first)."""
        return [pid for pid, rec in list(self.procs.items()) if rec["traced"] and rec["exit_ns"] is None]

    def prune_exited(self) -> bool:
        """Forget the --pid targets that have exited; True while one is left."""
        for pid in list(self.live_targets):
            if not alive(pid):
                self.live_targets.discard(pid)
        return bool(self.live_targets)

    def note_cuda_pids(self, pids: list[int]) -> None:
        """Processes whose CUDA calls were just stored are traced (a child the scan has not met yet)."""
        for pid in pids:
            rec = self.procs.get(pid)
            if rec is None or not rec["traced"]:
                self.note_proc(pid, traced=True)

    def on_proc_events(self, ev: np.ndarray, offset_ns: int) -> None:
        """Follow forks, execs, exits, new threads and renames (process_events records) in the registry."""
        for row in ev.tolist():
            ts = row[2] + offset_ns
            kind, pid, tid, child, code, flags = row[3], row[4], row[5], row[6], row[7], row[8]
            comm = row[9].decode("utf-8", "replace").rstrip("\0")
            traced = bool(flags & 2)
            if kind == R.P_THREAD:
                self.note_thread(pid, tid, ts, comm=comm)
            elif kind == R.P_RENAME:
                self.note_thread(pid, tid, ts, comm=comm)
                if tid == pid and pid in self.procs:  # the main thread's name is the process's
                    self.note_proc(pid, comm=comm, last_seen_ns=ts)
            elif kind == R.P_TEXIT:
                self.note_thread(pid, tid, ts, exit_ns=ts)
            elif kind == 1:  # fork
                if traced or pid in self.procs:
                    self.note_proc(child, ppid=pid, comm=comm, first_seen_ns=ts, traced=traced or None)
                if traced:
                    self.note_thread(child, child, ts, comm=comm)
                if traced and (pid in self.live_targets or not self.trace_all):
                    self.live_targets.add(child)
            elif kind == 2:  # exec
                if traced or pid in self.procs:
                    self.note_proc(pid, comm=comm, traced=traced or None, last_seen_ns=ts)
                    self.pinned.forget(pid)  # a new program: no pinned memory yet, all of it seen from here
                    self.pin_complete[pid] = True
                    if traced:
                        self.note_thread(pid, pid, ts, comm=comm)
                    if traced:
                        self.procs[pid]["cmdline"] = read_cmdline(pid) or self.procs[pid]["cmdline"]
            elif kind == 3:  # exit
                if pid in self.procs or traced:
                    self.note_proc(pid, comm=comm if pid not in self.procs else None, exit_ns=ts, last_seen_ns=ts,
                                   exit_code=code if flags & 1 else None)
                if traced:
                    self.note_thread(pid, tid, ts, exit_ns=ts)
                self.pinned.forget(pid)
                self.live_targets.discard(pid)

    def on_intervals(self, ev: np.ndarray, offset_ns: int) -> None:
        """Every traced thread that ran is a threads row, seen from its first switch-out to its last switch-in."""
        tid = ev["tid"].astype(np.int64)
        order = np.argsort(tid, kind="stable")
        tids, first = np.unique(tid[order], return_index=True)
        off = np.minimum.reduceat(ev["off_ts"][order].astype(np.int64), first) + offset_ns
        on = np.maximum.reduceat(ev["on_ts"][order].astype(np.int64), first) + offset_ns
        pids = ev["pid"][order][first]
        for t, p, lo, hi in zip(tids.tolist(), pids.tolist(), off.tolist(), on.tolist(), strict=True):
            rec = self.threads.get(t)
            if rec is not None and rec["pid"] == p:
                if lo < rec["first_seen_ns"] or hi > rec["last_seen_ns"]:
                    rec["first_seen_ns"] = min(rec["first_seen_ns"], lo)
                    rec["last_seen_ns"] = max(rec["last_seen_ns"], hi)
                    self.threads_dirty = True
                continue
            comm = None
            try:
                comm = Path(f"/proc/{p}/task/{t}/comm").read_text().rstrip("\n")
            except OSError:
                pass
            self.note_thread(p, t, lo, comm=comm, until=hi)

    def threads_table(self) -> pa.Table:
        """The `threads` rows as they stand."""
        rows = list(self.threads.values())
        return pa.table({c: [t[c] for t in rows] for c in THREAD_COLUMNS}, schema=THREAD_SCHEMA)

    def procs_table(self) -> pa.Table:
        """The `processes` rows as they stand."""
        procs = list(self.procs.values())
        return pa.table({c: [p[c] for p in procs] for c in PROC_COLUMNS}, schema=PROC_SCHEMA)


def _no_gpu_context(pid: int) -> bool:
    """True when the process has no NVIDIA device open yet (/proc/<pid>/fd), so it cannot have made
    pinned host memory: every pinned range it makes from now on is seen. False when unsure."""
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return False
    for fd in fds:
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith(("/dev/nvidia", "/dev/dxg")):
            return False
    return True
